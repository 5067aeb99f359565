//! Services stopped mid-flow and started again rebuild the same state from
//! the log; projections rebuilt from sequence 1 equal the live tables.

use std::collections::HashMap;
use std::time::Duration;

use lh_events::EventData;
use lh_test_stack::{of_type, read_log, Stack, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

async fn lease(stack: &Stack, key: &str, gpus: u32, model: &str) -> String {
    let (s, body) = stack
        .call(
            Method::POST,
            "/v1/leases",
            key,
            Some(json!({"gpus": gpus, "gpu_model": model})),
        )
        .await;
    assert_eq!(s, 202, "{body}");
    body["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scheduler_pricing_and_gateway_restart_mid_flow_without_loss_or_doubling() {
    let mut stack = Stack::start(FLEET).await;
    let (_, key) = stack.create_tenant("acme", 16).await;
    let a = lease(&stack, &key, 4, "A10G-24GB").await;
    stack
        .wait_lease(&key, &a, |l| l["state"] == "running")
        .await;
    let b = lease(&stack, &key, 2, "A10G-24GB").await;
    stack.wait_lease(&key, &b, |l| l["state"] == "queued").await;
    let c = lease(&stack, &key, 1, "H100-80GB").await;
    stack
        .wait_lease(&key, &c, |l| l["state"] == "running")
        .await;

    // Stop A, then take the three services down before they can react.
    let (s, _) = stack
        .call(Method::POST, &format!("/v1/leases/{a}/stop"), &key, None)
        .await;
    assert_eq!(s, 202);
    for name in ["scheduler", "pricing", "gateway"] {
        stack.stop_service(name).await;
    }
    // Meanwhile the node-agent ends A; nothing places B or bills A yet.
    tokio::time::sleep(Duration::from_millis(800)).await;
    for name in ["scheduler", "pricing", "gateway"] {
        stack.start_service(name).await;
    }
    stack.wait_ready().await;

    stack.wait_lease(&key, &a, |l| l["state"] == "ended").await;
    stack
        .wait_lease(&key, &b, |l| l["state"] == "running")
        .await;
    let running = stack
        .wait_lease(&key, &c, |l| l["state"] == "running")
        .await;
    assert_eq!(running["node_id"], "node-c");

    let bus = stack.bus().await;
    for _ in 0..200 {
        if of_type(&read_log(&bus).await, "charge.accrued").len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Give a doubled charge time to show up, then count.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let log = read_log(&bus).await;
    assert_eq!(
        of_type(&log, "charge.accrued").len(),
        1,
        "A is billed exactly once"
    );
    let mut placed: HashMap<String, usize> = HashMap::new();
    for e in of_type(&log, "lease.placed") {
        if let EventData::LeasePlaced(p) = &e.envelope.data {
            *placed.entry(p.lease_id.to_string()).or_default() += 1;
        }
    }
    assert!(placed.values().all(|n| *n == 1), "{placed:?}");
    assert_eq!(placed.len(), 3);
    assert_eq!(of_type(&log, "lease.started").len(), 3);

    let period = chrono::Utc::now().format("%Y-%m").to_string();
    let (s, invoice) = stack
        .call(
            Method::GET,
            &format!("/v1/charges?period={period}"),
            &key,
            None,
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(invoice["lines"].as_array().unwrap().len(), 1, "{invoice}");
    assert_eq!(invoice["lines"][0]["lease_id"], a.as_str());

    // The gateway's view after the restart equals a rebuild from sequence 1.
    let config = stack.gateway_config();
    let report = lh_gateway::rebuild(&config, "gateway_rebuild", false, |_, _| {})
        .await
        .unwrap();
    for c in report.tables {
        assert_eq!(c.live, c.rebuilt, "table {} differs after restart", c.table);
    }
    // Still the same lease list through the API.
    let (_, page) = stack.call(Method::GET, "/v1/leases", &key, None).await;
    let states: Vec<&Value> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| &l["state"])
        .collect();
    assert_eq!(states.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn projections_rebuilt_from_sequence_one_are_identical() {
    let stack = Stack::start(FLEET).await;
    let (_, key) = stack.create_tenant("acme", 16).await;
    let (_, key2) = stack.create_tenant("beta", 16).await;
    let mut ids = Vec::new();
    for (k, gpus, model) in [
        (&key, 2, "A100-40GB"),
        (&key2, 1, "H100-80GB"),
        (&key, 1, "A10G-24GB"),
    ] {
        let id = lease(&stack, k, gpus, model).await;
        stack.wait_lease(k, &id, |l| l["state"] == "running").await;
        ids.push((k.clone(), id));
    }
    for (k, id) in &ids[..2] {
        let (s, _) = stack
            .call(Method::POST, &format!("/v1/leases/{id}/stop"), k, None)
            .await;
        assert_eq!(s, 202);
        stack.wait_lease(k, id, |l| l["state"] == "ended").await;
    }
    // An SSH key, so that every table of the gateway holds a row.
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/ssh-keys",
            &key,
            Some(serde_json::json!({"name": "laptop", "public_key":
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOkuEjNhUpt3vuoYzvfnmANEkkY4syvbUMN+hQ6Tppjz"})),
        )
        .await;
    assert_eq!(s, 201, "{b}");
    let bus = stack.bus().await;
    for _ in 0..200 {
        if of_type(&read_log(&bus).await, "charge.accrued").len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let both projections reach the head.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let report = lh_gateway::rebuild(&stack.gateway_config(), "gateway_rebuild", false, |_, _| {})
        .await
        .unwrap();
    assert_eq!(
        report.tables.len(),
        7,
        "tenants, tenant_keys, leases, ssh_keys, datasets, storage_usage and skipped_events"
    );
    // This stack keeps no tenant data: its tables stay empty here, and
    // `rebuild_batched` rebuilds them from a log that fills them.
    let empty_here = ["skipped_events", "datasets", "storage_usage"];
    for c in &report.tables {
        assert!(
            c.live.0 > 0 || empty_here.contains(&c.table),
            "{} is empty",
            c.table
        );
        assert_eq!(c.live, c.rebuilt, "gateway table {} differs", c.table);
    }

    let pricing = lh_pricing::Config::for_test(&stack.nats.url(), &stack.database_url);
    let report = lh_pricing::rebuild(&pricing, "pricing_rebuild", false, |_, _| {})
        .await
        .unwrap();
    assert_eq!(report.tables[0].live.0, 2, "two invoice lines");
    assert!(report.identical(), "pricing invoice_lines differ");
}
