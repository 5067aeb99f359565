//! Failover end to end: a node-agent that goes silent while it runs a lease
//! is declared lost after the liveness window, the lease is placed on
//! another node and runs there, the lost node coming back does not resurrect
//! it, and the lease is billed as two runs that neither overlap nor include
//! the outage.

use std::time::{Duration, Instant};

use lh_events::EventData;
use lh_test_stack::{of_type, read_log, Stack, TWO_NODES};
use reqwest::Method;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_node_s_lease_runs_elsewhere_and_is_billed_per_run() {
    let mut stack = Stack::start(TWO_NODES).await;
    let (_, key) = stack.create_tenant("failover", 2).await;
    let running = stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    let id = running["id"].as_str().unwrap().to_string();
    let lost = running["node_id"].as_str().unwrap().to_string();
    let other = if lost == "node-a" { "node-b" } else { "node-a" };
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // The agent stops heartbeating, as if its host died.
    let silenced = Instant::now();
    stack.stop_service(&format!("node-agent:{lost}")).await;
    let moved = stack
        .wait_lease(&key, &id, |l| {
            l["state"] == "running" && l["node_id"] == other && l["migrations"] == 1
        })
        .await;
    let failover = silenced.elapsed();
    assert!(moved["last_migration_reason"]
        .as_str()
        .unwrap()
        .contains(&lost));
    assert_eq!(
        moved["started_at"], running["started_at"],
        "first start kept"
    );
    eprintln!("failover took {:.2} s", failover.as_secs_f64());

    let log = read_log(&stack.bus().await).await;
    let node_lost = of_type(&log, "node.lost");
    assert_eq!(node_lost.len(), 1, "one replica, one loss");
    let EventData::NodeLost(node_lost) = &node_lost[0].envelope.data else {
        unreachable!()
    };
    assert_eq!(node_lost.node_id, lost);
    assert!(node_lost.silence_ms >= 3000, "{node_lost:?}");
    let EventData::LeaseMigrated(migrated) = &of_type(&log, "lease.migrated")[0].envelope.data
    else {
        unreachable!()
    };
    assert_eq!(migrated.from_node_id, lost);
    assert_eq!(migrated.billing_ends_at, node_lost.last_heard_at);
    assert_eq!(migrated.to.as_ref().unwrap().node_id, other);

    // The lost node comes back: it rejoins, and the lease stays where it went.
    stack.start_service(&format!("node-agent:{lost}")).await;
    let bus = stack.bus().await;
    let mut rejoined = false;
    for _ in 0..100 {
        let log = read_log(&bus).await;
        if !of_type(&log, "node.rejoined").is_empty() {
            rejoined = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(rejoined, "the returning node rejoins");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (s, body) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(s, 202, "{body}");
    let ended = stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    assert_eq!(ended["node_id"], other);

    let log = read_log(&bus).await;
    let starts = lh_test_stack::starts(&log);
    assert_eq!(
        starts.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
        vec![lost.as_str(), other],
        "started once on each node; the returning node did not restart it"
    );
    let ends: Vec<_> = of_type(&log, "lease.ended")
        .into_iter()
        .filter_map(|e| match &e.envelope.data {
            EventData::LeaseEnded(x) => Some(x.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].node_id.as_deref(), Some(other));

    // Billed: the first run until the lost node was last heard from, the
    // second from the new start; the outage is not billed.
    let runs = [
        (starts[0].1, migrated.billing_ends_at),
        (starts[1].1, ends[0].ended_at),
    ];
    stack.assert_runs_billed(&key, 40, &runs).await;

    stack.assert_gateway_rebuilds_identically().await;
}
