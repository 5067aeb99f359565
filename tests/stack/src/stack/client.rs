//! A stack's gateway as a tenant and an operator see it: calls over HTTP,
//! tenants, leases, and polling a lease until it reaches a state.

use std::time::Duration;

use serde_json::{json, Value};

use super::{Stack, ADMIN_TOKEN};

/// How long a lease is waited on by default.
const LEASE_WAIT: Duration = Duration::from_secs(10);
/// How often a waited-on lease is read.
const LEASE_POLL: Duration = Duration::from_millis(50);

impl Stack {
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.gateway_url, path))
            .bearer_auth(key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("gateway answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn create_tenant(&self, name: &str, max_gpus: u32) -> (String, String) {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                "/v1/tenants",
                ADMIN_TOKEN,
                Some(json!({"name": name, "email": format!("ops@{name}.example"), "quota": {"max_gpus": max_gpus}})),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        (
            body["id"].as_str().unwrap().to_string(),
            body["api_key"].as_str().unwrap().to_string(),
        )
    }

    /// Asks for a lease; its id once the gateway accepted it (202).
    pub async fn lease(&self, key: &str, body: Value) -> String {
        let (status, lease) = self
            .call(reqwest::Method::POST, "/v1/leases", key, Some(body))
            .await;
        assert_eq!(status, 202, "{lease}");
        lease["id"].as_str().unwrap().to_string()
    }

    /// Asks for a lease and waits until it runs; the running lease.
    pub async fn running(&self, key: &str, body: Value) -> Value {
        self.running_within(key, body, LEASE_WAIT).await
    }

    /// [`Self::running`], waiting up to `within`.
    pub async fn running_within(&self, key: &str, body: Value, within: Duration) -> Value {
        let id = self.lease(key, body).await;
        self.wait_lease_within(key, &id, |l| l["state"] == "running", within)
            .await
    }

    /// Polls a lease until `pred` holds (10 s at most).
    pub async fn wait_lease(&self, key: &str, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_lease_within(key, id, pred, LEASE_WAIT).await
    }

    /// [`Self::wait_lease`], up to `within`.
    pub async fn wait_lease_within(
        &self,
        key: &str,
        id: &str,
        pred: impl Fn(&Value) -> bool,
        within: Duration,
    ) -> Value {
        let mut last = Value::Null;
        let polls = (within.as_millis() / LEASE_POLL.as_millis()).max(1);
        for _ in 0..polls {
            let (status, body) = self
                .call(reqwest::Method::GET, &format!("/v1/leases/{id}"), key, None)
                .await;
            // A lease written to the log directly is not in the gateway's
            // read model until its projection catches up: the gateway waits
            // for it a while, then says 503 with a Retry-After, as a
            // client would be told on a loaded machine.
            if status == 404 || status == 503 {
                last = body;
                tokio::time::sleep(LEASE_POLL).await;
                continue;
            }
            assert_eq!(status, 200, "{body}");
            if pred(&body) {
                return body;
            }
            last = body;
            tokio::time::sleep(LEASE_POLL).await;
        }
        panic!("lease {id} never reached the expected state within {within:?}; last: {last}");
    }

    /// Creates a tenant from a whole request body; the 201 answer.
    pub async fn create_tenant_from(&self, body: Value) -> Value {
        let (status, tenant) = self
            .call(
                reqwest::Method::POST,
                "/v1/tenants",
                ADMIN_TOKEN,
                Some(body),
            )
            .await;
        assert_eq!(status, 201, "{tenant}");
        tenant
    }

    /// Creates a tenant an operator vouches for (`"trusted": true`, so its
    /// leases may run as processes) with a quota of `max_gpus`; its API key.
    pub async fn create_trusted_tenant(&self, name: &str, max_gpus: u32) -> String {
        let tenant = self
            .create_tenant_from(serde_json::json!({
                "name": name,
                "email": format!("ops@{name}.example"),
                "quota": {"max_gpus": max_gpus},
                "trusted": true,
            }))
            .await;
        tenant["api_key"].as_str().unwrap().to_string()
    }
}
