//! Erasure inside an immutable log: destroying a tenant's data key leaves
//! its name, e-mail and suspension reason as ciphertext nobody can open,
//! while the audit chain still verifies, its charges keep their amounts and
//! a rebuild of the gateway's read model gives the same rows.

use std::time::Duration;

use lh_events::EventData;
use lh_test_stack::{of_type, read_log, Stack, ADMIN_TOKEN, AUDITOR_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

const NAME: &str = "Erika Mustermann";
const EMAIL: &str = "erika@mustermann.example";
const ERASED: &str = "[erased]";
/// An operator's reason that names the person: it must not enter the log
/// in clear either.
const REASON: &str = "leaving; the contract ends, per erika@mustermann.example";

/// The tenant's charges of `period` as an admin reads them, once they have
/// held still for a while (pricing may still be accruing the last run).
async fn settled_charges(stack: &Stack, tenant_id: &str, period: &str) -> Value {
    let path = format!("/v1/charges?period={period}&tenant_id={tenant_id}");
    let mut last = Value::Null;
    for _ in 0..100 {
        let (status, body) = stack.call(Method::GET, &path, ADMIN_TOKEN, None).await;
        assert_eq!(status, 200, "{body}");
        let billed = body["lines"].as_array().is_some_and(|l| !l.is_empty());
        if billed && body == last {
            return body;
        }
        last = body;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("the charges never held still: {last}");
}

async fn tenant_view(stack: &Stack, tenant_id: &str, key: &str) -> Value {
    let (status, body) = stack
        .call(Method::GET, &format!("/v1/tenants/{tenant_id}"), key, None)
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_erased_tenant_reads_as_erased_everywhere_while_its_log_still_verifies_and_bills() {
    let stack = Stack::start(FLEET).await;
    let created = stack
        .create_tenant_from(json!({"name": NAME, "email": EMAIL, "quota": {"max_gpus": 4}}))
        .await;
    let tenant_id = created["id"].as_str().unwrap().to_string();
    let key = created["api_key"].as_str().unwrap().to_string();
    let view = tenant_view(&stack, &tenant_id, ADMIN_TOKEN).await;
    assert_eq!(
        (&view["name"], &view["email"], &view["erased"]),
        (&json!(NAME), &json!(EMAIL), &json!(false)),
        "{view}"
    );

    let lease = stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    let lease_id = lease["id"].as_str().unwrap().to_string();
    let erase = format!("/v1/tenants/{tenant_id}/erase");
    // Not while it may still request leases, and not while one runs: it
    // would go on accruing for a tenant that is gone.
    let (status, refused) = stack.call(Method::POST, &erase, ADMIN_TOKEN, None).await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused.to_string().contains("not suspended"), "{refused}");
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant_id}/suspend"),
            ADMIN_TOKEN,
            Some(json!({"reason": REASON})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["tenant"]["suspended_reason"], REASON, "{body}");
    let view = tenant_view(&stack, &tenant_id, ADMIN_TOKEN).await;
    assert_eq!(view["suspended_reason"], REASON, "{view}");
    let log = read_log(&stack.bus().await).await;
    let suspended = of_type(&log, "tenant.suspended");
    let [suspended] = &suspended[..] else {
        panic!("one suspension: {suspended:?}")
    };
    let EventData::TenantSuspended(e) = &suspended.envelope.data else {
        panic!()
    };
    assert!(!e.reason_sealed.is_empty(), "{e:?}");
    let (status, refused) = stack.call(Method::POST, &erase, ADMIN_TOKEN, None).await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused.to_string().contains("not ended"), "{refused}");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // A suspended tenant may not stop its own lease; the admin does.
    let (status, stopped) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{lease_id}/stop"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 202, "{stopped}");
    stack
        .wait_lease(&key, &lease_id, |l| l["state"] == "ended")
        .await;
    let period = chrono::Utc::now().format("%Y-%m").to_string();
    let charges_before = settled_charges(&stack, &tenant_id, &period).await;

    // Only an admin erases.
    for who in [key.as_str(), AUDITOR_TOKEN] {
        let (status, body) = stack.call(Method::POST, &erase, who, None).await;
        assert_eq!(status, 403, "{body}");
    }
    let (status, erased) = stack.call(Method::POST, &erase, ADMIN_TOKEN, None).await;
    assert_eq!(status, 200, "{erased}");
    assert_eq!(
        (
            &erased["name"],
            &erased["email"],
            &erased["suspended_reason"],
            &erased["erased"]
        ),
        (&json!(ERASED), &json!(ERASED), &json!(ERASED), &json!(true)),
        "{erased}"
    );
    // A second call finds it erased and says so the same way.
    let (status, again) = stack.call(Method::POST, &erase, ADMIN_TOKEN, None).await;
    assert_eq!((status, &again["erased"]), (200, &json!(true)), "{again}");
    let log = read_log(&stack.bus().await).await;
    assert_eq!(
        of_type(&log, "tenant.erased").len(),
        1,
        "one erasure recorded"
    );

    // The tenant reads itself as erased and may change nothing any more.
    let own = tenant_view(&stack, &tenant_id, &key).await;
    assert_eq!(
        (&own["name"], &own["email"], &own["suspended_reason"]),
        (&json!(ERASED), &json!(ERASED), &json!(ERASED))
    );
    let (status, body) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB"})),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    for (method, path) in [
        (Method::POST, format!("/v1/tenants/{tenant_id}/resume")),
        (Method::POST, format!("/v1/tenants/{tenant_id}/keys")),
    ] {
        let body = (path.ends_with("/keys")).then(|| json!({}));
        let (status, answer) = stack.call(method, &path, ADMIN_TOKEN, body).await;
        assert_eq!(status, 409, "{path}: {answer}");
    }

    // No wrapped key is left in the database, and no stored event holds the
    // name, the e-mail or the suspension reason in clear.
    let pool = sqlx::PgPool::connect(&stack.database_url).await.unwrap();
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM gateway_keys.tenant_keys WHERE tenant_id = $1")
            .bind(tenant_id.parse::<uuid::Uuid>().unwrap())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(rows, 0, "the tenant's data key is gone");
    let log = read_log(&stack.bus().await).await;
    assert!(of_type(&log, "tenant.created")
        .iter()
        .any(|e| !e.payload.is_empty()));
    for event in &log {
        let raw = String::from_utf8_lossy(&event.payload).to_lowercase();
        for secret in ["erika", "mustermann", "contract ends"] {
            assert!(
                !raw.contains(secret),
                "{} holds {secret:?} in clear",
                event.envelope.event_type
            );
        }
    }

    // Nor does the audit trail's answer about the tenant, in any form.
    let (status, trail) = stack
        .call(
            Method::GET,
            &format!("/v1/audit/events?tenant_id={tenant_id}"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 200, "{trail}");
    assert!(
        trail.to_string().contains("tenant.created"),
        "the trail shows the tenant's creation: {trail}"
    );
    let trail = trail.to_string().to_lowercase();
    assert!(
        !trail.contains("erika") && !trail.contains("mustermann") && !trail.contains("contract"),
        "{trail}"
    );

    // The chain over the whole log still verifies.
    let head = stack.bus().await.last_sequence().await.unwrap();
    let mut verified = Value::Null;
    for _ in 0..100 {
        let (status, body) = stack
            .call(Method::GET, "/v1/audit/verify", ADMIN_TOKEN, None)
            .await;
        assert_eq!(status, 200, "{body}");
        verified = body;
        if verified["events"].as_u64().unwrap_or(0) >= head {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(verified["ok"], true, "{verified}");

    // Billing is untouched: the same lines, total and content hash.
    let charges_after = settled_charges(&stack, &tenant_id, &period).await;
    assert_eq!(charges_after["total"], charges_before["total"]);
    assert_eq!(
        charges_after["content_hash"],
        charges_before["content_hash"]
    );

    // A rebuild from the log gives the same rows, and the view over them
    // still reads as erased rather than failing.
    stack.assert_gateway_rebuilds_identically().await;
    let view = tenant_view(&stack, &tenant_id, ADMIN_TOKEN).await;
    assert_eq!(
        (&view["name"], &view["suspended_reason"], &view["erased"]),
        (&json!(ERASED), &json!(ERASED), &json!(true))
    );
}

/// The key table is not rebuilt from the log: a tenant may lack its key
/// row (a restore of an older database). Suspending it still seals the
/// reason, under a new key, and an erasure destroys that key too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_without_a_data_key_is_suspended_with_a_new_one_that_erasure_destroys() {
    let stack = Stack::start(FLEET).await;
    let created = stack
        .create_tenant_from(json!({"name": NAME, "email": EMAIL, "quota": {"max_gpus": 1}}))
        .await;
    let tenant_id = created["id"].as_str().unwrap().to_string();
    let id: uuid::Uuid = tenant_id.parse().unwrap();
    let pool = sqlx::PgPool::connect(&stack.database_url).await.unwrap();
    let key_rows = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM gateway_keys.tenant_keys WHERE tenant_id = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    sqlx::query("DELETE FROM gateway_keys.tenant_keys WHERE tenant_id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();

    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant_id}/suspend"),
            ADMIN_TOKEN,
            Some(json!({"reason": REASON})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(key_rows().await, 1, "a new key was stored");
    let view = tenant_view(&stack, &tenant_id, ADMIN_TOKEN).await;
    // The old key is lost with its row: the name it sealed stays unreadable.
    assert_eq!(
        (&view["name"], &view["suspended_reason"]),
        (&json!(ERASED), &json!(REASON)),
        "{view}"
    );
    let log = read_log(&stack.bus().await).await;
    for event in &log {
        let raw = String::from_utf8_lossy(&event.payload);
        assert!(!raw.contains("contract ends"), "{raw}");
    }

    let (status, erased) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant_id}/erase"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 200, "{erased}");
    assert_eq!(erased["suspended_reason"], ERASED, "{erased}");
    assert_eq!(key_rows().await, 0);
    stack.assert_gateway_rebuilds_identically().await;
}
