//! What one tenant may do in a while: a budget of writes per second and a
//! bound on its leases waiting for a placement, both answered with 429 and
//! `Retry-After`; another tenant is not held back.

use lh_test_stack::{Stack, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

async fn post(
    stack: &Stack,
    key: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Option<String>, Value) {
    let mut request = stack
        .http
        .request(Method::POST, format!("{}{path}", stack.gateway_url))
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let body = response.json().await.unwrap_or(Value::Null);
    (status, retry_after, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_over_its_limits_gets_429_with_retry_after() {
    let stack = Stack::start_configured(FLEET, |s| {
        s.gateway_limits = lh_gateway::TenantLimits {
            writes_per_s: 0.5,
            write_burst: 6,
            max_pending_leases: 2,
        };
    })
    .await;
    let (_, busy) = stack.create_tenant("busy", 16).await;
    let (_, calm) = stack.create_tenant("calm", 16).await;

    // Every A10G taken, then two waiting: the pending limit.
    stack
        .running(&busy, json!({"gpus": 4, "gpu_model": "A10G-24GB"}))
        .await;
    let one = json!({"gpus": 1, "gpu_model": "A10G-24GB"});
    for _ in 0..2 {
        let (status, _, body) = post(&stack, &busy, "/v1/leases", Some(one.clone())).await;
        assert_eq!(status, 202, "{body}");
    }
    let (status, retry_after, body) = post(&stack, &busy, "/v1/leases", Some(one.clone())).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(retry_after.as_deref(), Some("10"));
    assert_eq!(body["field"], "tenant");
    assert_eq!(
        body["type"],
        "https://leasehold.dev/problems/too-many-requests"
    );
    // Another tenant is not held back by it.
    let (status, _, body) = post(&stack, &calm, "/v1/leases", Some(one.clone())).await;
    assert_eq!(status, 202, "{body}");

    // Four writes of six are spent (the refused request counts too); the
    // next two pass (stops of leases that do not exist: 404), then the
    // budget is gone until it refills at half a write a second.
    let nowhere = "/v1/leases/00000000-0000-0000-0000-000000000000/stop";
    for _ in 0..2 {
        let (status, _, body) = post(&stack, &busy, nowhere, None).await;
        assert_eq!(status, 404, "{body}");
    }
    let (status, retry_after, body) = post(&stack, &busy, nowhere, None).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(retry_after.as_deref(), Some("2"));
    // Reads are not writes.
    let (status, body) = stack.call(Method::GET, "/v1/leases", &busy, None).await;
    assert_eq!(status, 200, "{body}");
}
