//! A log run past its age limit: what lives on is restated on its own
//! subject before its first events expire, so services that start after
//! the expiry know the tenants, nodes, price books and leases that the
//! expired events told of (docs/adr/011-a-year-of-history.md).

use std::time::Duration;

use chrono::SubsecRound;

use lh_events::EventData;
use lh_test_stack::{of_type, read_log, Stack, ADMIN_TOKEN};
use reqwest::Method;
use serde_json::json;

const FLEET: &str = r#"
[[node]]
id = "node-a"
zone = "cn-north-1a"
hostname = "gpu-a.sim"
gpu_model = "A100-40GB"
gpu_count = 2
vram_gb = 40
"#;

/// Seconds the log keeps an event in this test.
const MAX_AGE_SECS: u64 = 8;
/// Seconds after which a live aggregate is restated.
const RESTATE_AFTER_SECS: u64 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenants_nodes_books_and_leases_outlive_their_expired_events() {
    let mut stack = Stack::start_configured(FLEET, |s| {
        s.short_retention = Some((MAX_AGE_SECS, RESTATE_AFTER_SECS))
    })
    .await;
    let bus = stack.bus().await;
    let (tenant_id, key) = stack.create_tenant("old", 2).await;
    // Keys issued and revoked before the tenant's creation expires.
    let keys = format!("/v1/tenants/{tenant_id}/keys");
    let (status, spare) = stack
        .call(Method::POST, &keys, ADMIN_TOKEN, Some(json!({})))
        .await;
    assert_eq!(status, 201, "{spare}");
    let spare_key = spare["api_key"].as_str().unwrap().to_string();
    let (status, lost) = stack
        .call(Method::POST, &keys, ADMIN_TOKEN, Some(json!({})))
        .await;
    assert_eq!(status, 201, "{lost}");
    let lost_key = lost["api_key"].as_str().unwrap().to_string();
    let (status, _) = stack
        .call(
            Method::DELETE,
            &format!("{keys}/{}", lost["key_id"]),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 200);
    let old = stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    let old_id = old["id"].as_str().unwrap().to_string();
    let old_gpu = old["gpu_indices"].clone();

    // Past the age limit twice over: the tenant's creation, the node's
    // registration, the price book and the lease's request are gone.
    tokio::time::sleep(Duration::from_secs(2 * MAX_AGE_SECS + 2)).await;
    let log = read_log(&bus).await;
    for gone in [
        "tenant.created",
        "node.registered",
        "price_book.published",
        "lease.requested",
    ] {
        assert!(
            of_type(&log, gone).is_empty(),
            "{gone} is still in the log: the test did not run past expiry"
        );
    }
    for restated in [
        "tenant.restated",
        "node.restated",
        "price_book.restated",
        "lease.restated",
    ] {
        assert!(!of_type(&log, restated).is_empty(), "no {restated}");
    }

    // Every service that folds the log in memory starts again from what it
    // holds now (the node-agent keeps running, so the node is not
    // registered again: the scheduler learns it from its restatement).
    for name in ["scheduler", "pricing", "spot-broker", "gateway"] {
        stack.stop_service(name).await;
        stack.start_service(name).await;
    }
    stack.wait_ready().await;

    // The restarted gateway knows the tenant's keys as they stood.
    for (key, status) in [(&key, 200), (&spare_key, 200), (&lost_key, 401)] {
        let (got, body) = stack.call(Method::GET, "/v1/leases", key, None).await;
        assert_eq!(got, status, "{body}");
    }

    // The tenant still leases; the GPU the old lease holds is not given to
    // anyone else, so the node's other GPU is used and a third lease waits.
    let second = stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    assert_ne!(second["gpu_indices"], old_gpu, "{second}");
    let (_, other_key) = stack.create_tenant("new", 2).await;
    let third = stack
        .lease(&other_key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    stack
        .wait_lease(&other_key, &third, |l| l["state"] == "queued")
        .await;

    // The old lease is stopped and billed, from its restated start.
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{old_id}/stop"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let charge = stack
        .wait_log(20, |log| {
            of_type(log, "charge.accrued")
                .into_iter()
                .find_map(|e| match &e.envelope.data {
                    EventData::ChargeAccrued(c) if c.lease_id.to_string() == old_id => {
                        Some(c.clone())
                    }
                    _ => None,
                })
        })
        .await;
    let started: chrono::DateTime<chrono::Utc> =
        old["started_at"].as_str().unwrap().parse().unwrap();
    // The read model keeps microseconds.
    assert_eq!(
        charge.from.trunc_subsecs(6),
        started,
        "billed from the restated start"
    );
    assert!(
        charge.to - charge.from >= chrono::Duration::seconds(2 * MAX_AGE_SECS as i64),
        "billed for its whole run: {charge:?}"
    );
    // The queued lease takes the freed GPU.
    stack
        .wait_lease(&other_key, &third, |l| l["state"] == "running")
        .await;
    // Audit verifies from the newest signed checkpoint before the log's
    // first sequence, and its copy was pruned in step by an audited event.
    let mut verified = serde_json::Value::Null;
    for _ in 0..100 {
        let (status, body) = stack
            .call(Method::GET, "/v1/audit/verify", ADMIN_TOKEN, None)
            .await;
        assert_eq!(status, 200, "{body}");
        verified = body;
        if verified["ok"] == true && !verified["anchor"].is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(verified["ok"], true, "{verified}");
    assert!(
        verified["anchor"]["sequence"].as_u64().unwrap() > 1,
        "{verified}"
    );
    assert!(!of_type(&read_log(&bus).await, "audit.pruned").is_empty());

    // A rebuild of the gateway's tables from what the log holds now gives
    // the live ones: the tenant and the old lease from their restatements.
    stack.assert_gateway_rebuilds_identically().await;
    stack.assert_none_stopped();
}
