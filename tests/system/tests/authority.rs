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
use lh_events::{fixtures, Actor, Envelope, EventData};
use lh_test_stack::{expected_charge, read_log, Stack, ADMIN_TOKEN, TWO_NODES};
use reqwest::Method;
use serde_json::json;
use uuid::Uuid;

/// `lh_events_skipped_total{reason="not_authorized"}` by reader (the
/// `service` label), as the stack's one metrics recorder has them.
async fn refused_by_reader(stack: &Stack) -> BTreeMap<String, u64> {
    skipped_by_reader(stack, "not_authorized").await
}

/// `lh_events_skipped_total{reason}` by reader.
async fn skipped_by_reader(stack: &Stack, reason: &str) -> BTreeMap<String, u64> {
    stack
        .metrics_text()
        .await
        .lines()
        .filter(|l| {
            l.starts_with("lh_events_skipped_total{") && l.contains(&format!("reason=\"{reason}\""))
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
    // Whichever node runs it, the other is the attacker, and the one free
    // GPU is the attacker's own.
    let attacker = if victim_node == "node-a" {
        "node-b"
    } else {
        "node-a"
    };

    let bus = stack.bus().await;
    let attacks = lh_test_stack::red_team::forged_reports(lease, attacker, &victim_node);
    for envelope in &attacks {
        bus.publish(envelope, Expect::Any).await.unwrap();
    }
    // Every reader of leases has met and refused every one of them: each
    // decider (the writer of the nodes' views among them), the gateway's
    // projection and the audit copy. The node agents never meet them: they
    // read only their views, which carry what the writer admitted.
    let n = attacks.len() as u64;
    let expected: BTreeMap<String, u64> = [
        ("audit", n),
        ("gateway", n),
        ("lh-pricing", n),
        ("lh-pricing-ledger", n),
        ("lh-scheduler", n),
        ("lh-scheduler-node-views", n),
        ("lh-spot-broker", n),
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
    // The operator is told on the log: one summary of the attacker's
    // refused events, by type, with where to find them.
    let attacker_origin = lh_events::subject::node_origin(attacker);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let summary = loop {
        let log = read_log(&bus).await;
        let summed: Vec<lh_events::SecurityEventsRefused> = log
            .iter()
            .filter_map(|e| match &e.envelope.data {
                EventData::SecurityEventsRefused(s)
                    if s.publisher == attacker_origin && s.reason == "not_authorized" =>
                {
                    Some(s.clone())
                }
                _ => None,
            })
            .collect();
        if summed.iter().map(|s| s.refused).sum::<u64>() >= n {
            break summed;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no security.events_refused for {attacker_origin}: {summed:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        summary.iter().map(|s| s.refused).sum::<u64>(),
        n,
        "{summary:?}"
    );
    assert!(
        summary
            .iter()
            .all(|s| s.by_event_type.keys().all(|t| t.starts_with("lease."))),
        "{summary:?}"
    );
    stack.assert_none_stopped();
    // A replay judges the same events alike: the view rebuilt from the log
    // is the view kept live.
    stack.assert_gateway_rebuilds_identically().await;
}

/// A node's registration counts only within what an admin enrolled it for:
/// an agent that started before its enrollment is in no fleet until the
/// enrollment, then registers again by itself; a registration beyond it
/// (more GPUs) and one of a node never enrolled are refused; the API
/// refuses a bad enrollment by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_registers_only_what_it_was_enrolled_for() {
    let stack = Stack::start_configured(TWO_NODES, |stack| stack.auto_enroll = false).await;
    let (_, key) = stack.create_tenant("acme", 8).await;
    let one = json!({"gpus": 1, "gpu_model": "A100-40GB"});
    let waiting = stack.lease(&key, one.clone()).await;
    let queued = stack
        .wait_lease(&key, &waiting, |l| {
            l["state"] == "queued" || l["state"] == "rejected"
        })
        .await;
    assert!(queued["node_id"].is_null(), "no node is enrolled: {queued}");

    let enroll = |node: &str, body: serde_json::Value, token: &'static str| {
        let path = format!("/v1/nodes/{node}/enroll");
        let stack = &stack;
        async move { stack.call(Method::POST, &path, token, Some(body)).await }
    };
    let good = json!({"zone": "cn-north-1a", "max_gpus": 1, "gpu_models": ["A100-40GB"],
                      "max_isolation": "container", "gpu_sharing": ["hami-core"]});
    for (node, body, field) in [
        ("node.a", good.clone(), "id"),
        (
            "node-a",
            json!({"zone": "cn-north-1a", "max_gpus": 1, "gpu_models": ["B200-9TB"]}),
            "gpu_models[0]",
        ),
        (
            "node-a",
            json!({"zone": "cn-north-1a", "max_gpus": 0, "gpu_models": ["A100-40GB"]}),
            "max_gpus",
        ),
        (
            "node-a",
            json!({"zone": "", "max_gpus": 1, "gpu_models": ["A100-40GB"]}),
            "zone",
        ),
    ] {
        let (status, problem) = enroll(node, body, ADMIN_TOKEN).await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (422, Some(field)),
            "{problem}"
        );
    }
    let (status, refused) = enroll("node-a", good.clone(), lh_test_stack::AUDITOR_TOKEN).await;
    assert_eq!(status, 403, "{refused}");

    // Enrolled now: node-a's agent registers again by itself, and the
    // waiting lease is placed on it.
    let (status, enrolled) = enroll("node-a", good.clone(), ADMIN_TOKEN).await;
    assert_eq!(status, 201, "{enrolled}");
    assert_eq!(enrolled["max_gpus"], 1, "{enrolled}");
    let running = stack
        .wait_lease(&key, &waiting, |l| l["state"] == "running")
        .await;
    assert_eq!(running["node_id"], "node-a", "{running}");

    // node-a's credential claims sixteen GPUs; a node never enrolled
    // claims eight. Neither is obeyed: a two-GPU lease finds no node.
    let bus = stack.bus().await;
    let scheduler_refused =
        |refused: BTreeMap<String, u64>| refused.get("lh-scheduler").copied().unwrap_or(0);
    let before = scheduler_refused(refused_by_reader(&stack).await);
    // The agents registered before their enrollment: counted apart.
    let unenrolled_before = scheduler_refused(skipped_by_reader(&stack, "not_enrolled").await);
    assert!(
        unenrolled_before >= 1,
        "no registration before the enrollment was refused"
    );
    let mut greedy = fixtures::node("node-a", "cn-north-1a", 16, "A100-40GB", 40);
    greedy.isolation = lh_events::Isolation::Container;
    let stranger = fixtures::node("node-z", "cn-north-1a", 8, "A100-40GB", 40);
    for registration in [greedy, stranger] {
        let actor = Actor::Node(registration.node_id.clone());
        let envelope = Envelope::new(
            actor,
            chrono::Utc::now(),
            EventData::NodeRegistered(registration),
        );
        bus.publish(&envelope, Expect::Any).await.unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while scheduler_refused(refused_by_reader(&stack).await) < before + 1
        || scheduler_refused(skipped_by_reader(&stack, "not_enrolled").await)
            < unenrolled_before + 1
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the scheduler never refused both"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let two = stack
        .lease(&key, json!({"gpus": 2, "gpu_model": "A100-40GB"}))
        .await;
    let two = stack
        .wait_lease(&key, &two, |l| {
            l["state"] == "queued" || l["state"] == "rejected"
        })
        .await;
    assert!(two["node_id"].is_null(), "{two}");
    stack.assert_none_stopped();
}
