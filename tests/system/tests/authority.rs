//! A node's credential reaches only what is placed on it: one node reports
//! the end, suspension, start, stop, idleness and a GPU fault of a lease
//! that runs on another node, each as itself, on its own subject (as the
//! server's permissions let it), and with the victim's node named in the
//! payload or none. No reader obeys any of it: the lease keeps running in
//! every view, its GPU is not handed to anyone else, it is billed exactly
//! its real run, and every service counts what it refused.

use std::collections::BTreeMap;
use std::time::Duration;

use lh_bus::Expect;
use lh_events::{
    fixtures, Actor, EndReason, Envelope, EventData, IdleAction, LeaseGpuFault, LeaseIdleDetected,
    LeaseStopRequested, LeaseSuspended,
};
use lh_test_stack::{expected_charge, read_log, Stack, ADMIN_TOKEN};
use reqwest::Method;
use serde_json::json;
use uuid::Uuid;

/// Two nodes of one A100 each: whichever runs the victim's lease, the
/// other is the attacker, and the one free GPU is the attacker's own.
const TWO_NODES: &str = r#"
[[node]]
id = "node-a"
zone = "cn-north-1a"
hostname = "gpu-a.sim"
gpu_model = "A100-40GB"
gpu_count = 1
vram_gb = 40

[[node]]
id = "node-c"
zone = "cn-north-1a"
hostname = "gpu-c.sim"
gpu_model = "A100-40GB"
gpu_count = 1
vram_gb = 40
"#;

/// The reports a compromised `attacker` sends about `lease`, each on its
/// own subject: with itself named in the payload, with the lease's node
/// named, and with none.
fn forged(lease: Uuid, attacker: &str, victim_node: &str) -> Vec<Envelope> {
    let now = chrono::Utc::now();
    let as_attacker = |data| Envelope::new(Actor::Node(attacker.into()), now, data);
    let mut events = Vec::new();
    for named in [attacker, victim_node] {
        events.push(as_attacker(EventData::LeaseEnded(fixtures::ended(
            lease,
            named,
            now - chrono::Duration::days(400),
            EndReason::Completed,
        ))));
        events.push(as_attacker(EventData::LeaseSuspended(LeaseSuspended {
            lease_id: lease,
            node_id: named.into(),
            gpu_indices: vec![0],
            suspended_at: now,
            reason: "forged".into(),
        })));
        events.push(as_attacker(EventData::LeaseStarted(fixtures::started(
            lease, named, now,
        ))));
        events.push(as_attacker(EventData::LeaseIdleDetected(
            LeaseIdleDetected {
                lease_id: lease,
                node_id: named.into(),
                idle_since: now,
                window_seconds: 60,
                action: IdleAction::Suspend,
                at: now,
            },
        )));
        events.push(as_attacker(EventData::LeaseGpuFault(LeaseGpuFault {
            lease_id: lease,
            node_id: named.into(),
            gpu_index: 0,
            xid: 43,
            at: now,
        })));
    }
    let mut century = fixtures::ended(
        lease,
        attacker,
        now + chrono::Duration::days(36_500),
        EndReason::Cancelled,
    );
    century.node_id = None;
    events.push(as_attacker(EventData::LeaseEnded(century)));
    events.push(as_attacker(EventData::LeaseStopRequested(
        LeaseStopRequested { lease_id: lease },
    )));
    events
}

/// `lh_events_skipped_total{reason="not_authorized"}` by reader (the
/// `service` label), as the stack's one metrics recorder has them.
async fn refused_by_reader(stack: &Stack) -> BTreeMap<String, u64> {
    let metrics = stack
        .http
        .get(format!("http://{}/metrics", stack.metrics_addr("gateway")))
        .send()
        .await
        .and_then(|r| r.error_for_status());
    let Ok(metrics) = metrics else {
        return BTreeMap::new();
    };
    let text = metrics.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| {
            l.starts_with("lh_events_skipped_total{") && l.contains("reason=\"not_authorized\"")
        })
        .filter_map(|l| {
            let service = l.split("service=\"").nth(1)?.split('"').next()?;
            let count = l.rsplit(' ').next()?.parse::<f64>().ok()?;
            Some((service.to_string(), count as u64))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_cannot_end_suspend_start_or_stop_a_lease_on_another_node() {
    let stack = Stack::start(TWO_NODES).await;
    let (_, key) = stack.create_tenant("victim", 4).await;
    let body = json!({"gpus": 1, "gpu_model": "A100-40GB"});
    let running = stack.running(&key, body.clone()).await;
    let id = running["id"].as_str().unwrap().to_string();
    let lease: Uuid = id.parse().unwrap();
    let victim_node = running["node_id"].as_str().unwrap().to_string();
    let attacker = if victim_node == "node-a" {
        "node-c"
    } else {
        "node-a"
    };

    let bus = stack.bus().await;
    let attacks = forged(lease, attacker, &victim_node);
    for envelope in &attacks {
        bus.publish(envelope, Expect::Any).await.unwrap();
    }
    // Every reader of leases has met and refused every one of them: each
    // decider, the gateway's projection, the audit copy, and each of the
    // two node agents.
    let n = attacks.len() as u64;
    let expected: BTreeMap<String, u64> = [
        ("audit", n),
        ("gateway", n),
        ("lh-pricing", n),
        ("lh-pricing-ledger", n),
        ("lh-scheduler", n),
        ("lh-spot-broker", n),
        ("node-agent", 2 * n),
        ("restater", n),
    ]
    .into_iter()
    .map(|(reader, count)| (reader.to_string(), count))
    .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let refused = refused_by_reader(&stack).await;
        if refused == expected {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "refused {refused:?}, not {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Still running where it was, in the tenant's view.
    let (status, view) = stack
        .call(Method::GET, &format!("/v1/leases/{id}"), &key, None)
        .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["state"], "running", "{view}");
    assert_eq!(view["node_id"], victim_node.as_str(), "{view}");
    assert!(view["ended_at"].is_null(), "{view}");
    assert_eq!(view["stop_requested"], false, "{view}");

    // Its GPU was not freed: one lease more takes the attacker's GPU, and
    // a third finds none.
    let second = stack.running(&key, body.clone()).await;
    assert_eq!(second["node_id"], attacker, "{second}");
    let third = stack.lease(&key, body.clone()).await;
    let waiting = stack
        .wait_lease(&key, &third, |l| l["state"] == "queued")
        .await;
    assert!(waiting["node_id"].is_null(), "{waiting}");

    // The tenant stops it: it ends once, by its own node, and the third
    // lease gets its GPU.
    let (status, body) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(status, 202, "{body}");
    let ended = stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    assert_eq!(ended["end_reason"], "stopped", "{ended}");
    stack
        .wait_lease(&key, &third, |l| l["state"] == "running")
        .await;
    let log = read_log(&bus).await;
    let ends: Vec<&Actor> = log
        .iter()
        .filter(|e| {
            e.envelope.data.lease_id() == Some(lease) && e.envelope.event_type == "lease.ended"
        })
        .map(|e| &e.envelope.actor)
        .collect();
    assert_eq!(ends, [&Actor::Node(victim_node.clone())]);

    // Billed its one real run, to the second, and nothing for a century.
    let (seconds, amount, started) = expected_charge(&log, &id, 40);
    let period = started.format("%Y-%m").to_string();
    let mut line = serde_json::Value::Null;
    for _ in 0..200 {
        let (status, invoice) = stack
            .call(
                Method::GET,
                &format!("/v1/charges?period={period}"),
                &key,
                None,
            )
            .await;
        assert_eq!(status, 200, "{invoice}");
        if let Some(found) = invoice["lines"]
            .as_array()
            .and_then(|lines| lines.iter().find(|l| l["lease_id"] == id.as_str()))
        {
            line = found.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(line["billed_seconds"], seconds, "{line}");
    assert_eq!(
        line["amount"]
            .as_str()
            .unwrap()
            .parse::<rust_decimal::Decimal>()
            .unwrap(),
        amount
    );
    // The trail keeps what was refused, as refused, in no tenant's trail;
    // the tenant's own trail holds its lease's real events only.
    let attacker_actor = format!("node:{attacker}");
    let mut refused_rows = Vec::new();
    for _ in 0..200 {
        let (status, page) = stack
            .call(
                Method::GET,
                &format!("/v1/audit/events?actor={attacker_actor}&limit=100"),
                ADMIN_TOKEN,
                None,
            )
            .await;
        assert_eq!(status, 200, "{page}");
        refused_rows = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["object"].as_str().is_some_and(|o| o.contains(&id)))
            .cloned()
            .collect();
        if refused_rows.len() == attacks.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refused_rows.len(), attacks.len(), "{refused_rows:#?}");
    for row in &refused_rows {
        assert_eq!(row["skip_reason"], "not_authorized", "{row}");
        assert!(row["tenant_id"].is_null(), "{row}");
    }
    let (status, own) = stack
        .call(
            Method::GET,
            &format!("/v1/audit/events?actor={attacker_actor}&limit=100"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 200, "{own}");
    let on_victim: Vec<&serde_json::Value> = own["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["object"].as_str().is_some_and(|o| o.contains(&id)))
        .collect();
    assert!(on_victim.is_empty(), "{on_victim:#?}");
    stack.assert_none_stopped();
    // A replay judges the same events alike: the view rebuilt from the log
    // is the view kept live.
    stack.assert_gateway_rebuilds_identically().await;
}
