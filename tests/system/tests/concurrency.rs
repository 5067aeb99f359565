//! Three scheduler replicas at once under 1,000 concurrent requests on a
//! fleet too small for all of them: no GPU is ever held by two leases
//! (checked from the log), and every lease ends up placed or queued.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use lh_events::EventData;
use lh_test_stack::{read_log, Stack};
use serde_json::json;

const SMALL_FLEET: &str = r#"
[[node]]
id = "node-a"
zone = "z1"
hostname = "a.sim"
gpu_model = "A100-40GB"
gpu_count = 8
vram_gb = 40

[[node]]
id = "node-b"
zone = "z2"
hostname = "b.sim"
gpu_model = "A100-40GB"
gpu_count = 4
vram_gb = 40
"#;

const REQUESTS: usize = 1000;
const REPLICAS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_schedulers_never_give_one_gpu_to_two_leases() {
    let mut stack = Stack::bare(SMALL_FLEET).await;
    // Four tenants write as fast as they can: beyond the default budget.
    stack.gateway_limits.writes_per_s = 10_000.0;
    stack.gateway_limits.write_burst = 10_000;
    stack.start_service("gateway").await;
    stack.start_service("node-agent:node-a").await;
    stack.start_service("node-agent:node-b").await;
    stack.wait_ready().await;
    // Nodes registered before the schedulers race.
    let bus = stack.bus().await;
    for _ in 0..100 {
        let log = read_log(&bus).await;
        if lh_test_stack::of_type(&log, "node.registered").len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut keys = Vec::new();
    for t in 0..4 {
        keys.push(stack.create_tenant(&format!("t{t}"), 1000).await.1);
    }
    for r in 0..REPLICAS {
        stack.start_service(&format!("scheduler:{r}")).await;
    }

    const MAX_TRIES: usize = 20;
    let mut tasks = Vec::new();
    for i in 0..REQUESTS {
        let url = format!("{}/v1/leases", stack.gateway_url);
        let key = keys[i % keys.len()].clone();
        let http = stack.http.clone();
        let gpus = 1 + (i % 2) as u32;
        tasks.push(tokio::spawn(async move {
            // As a client would: a 503 (the database pool is exhausted on a
            // loaded machine) is retried after its Retry-After, with the same
            // Idempotency-Key, so a retry never makes a second lease.
            let idempotency_key = format!("race-{i}");
            for _ in 0..MAX_TRIES {
                let resp = http
                    .post(&url)
                    .bearer_auth(&key)
                    .header("Idempotency-Key", &idempotency_key)
                    .json(&json!({"gpus": gpus, "gpu_model": "A100-40GB"}))
                    .send()
                    .await
                    .unwrap();
                match resp.status().as_u16() {
                    202 => {
                        return resp.json::<serde_json::Value>().await.unwrap()["id"]
                            .as_str()
                            .unwrap()
                            .to_string()
                    }
                    503 => {
                        assert!(resp.headers().contains_key("retry-after"));
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    other => panic!("{other}: {}", resp.text().await.unwrap()),
                }
            }
            panic!("still 503 after {MAX_TRIES} tries")
        }));
    }
    let mut ids = HashSet::new();
    for t in tasks {
        ids.insert(t.await.unwrap());
    }
    assert_eq!(ids.len(), REQUESTS);

    // Every lease gets a decision.
    let mut log = Vec::new();
    for _ in 0..600 {
        log = read_log(&bus).await;
        let decided: HashSet<_> = log
            .iter()
            .filter_map(|e| match &e.envelope.data {
                EventData::LeasePlaced(p) => Some(p.lease_id.to_string()),
                EventData::LeaseQueued(q) => Some(q.lease_id.to_string()),
                _ => None,
            })
            .collect();
        if ids.iter().all(|id| decided.contains(id)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Replay the log: a GPU is held from its lease's placement to its end,
    // its suspension or its move (a move holds the GPUs it moves to).
    let mut held: HashMap<(String, u32), String> = HashMap::new();
    let mut placed_once: HashSet<String> = HashSet::new();
    let mut decided: HashSet<String> = HashSet::new();
    let hold = |held: &mut HashMap<(String, u32), String>,
                node: &str,
                gpus: &[lh_events::AssignedGpu],
                lease: &str| {
        for g in gpus {
            if let Some(other) = held.insert((node.to_string(), g.index), lease.to_string()) {
                let story: Vec<String> = log
                    .iter()
                    .filter(|e| e.subject.contains(lease) || e.subject.contains(&other))
                    .map(|e| format!("{} {}", e.sequence, e.subject))
                    .collect();
                panic!(
                    "GPU {node}/{} given to {lease} while {other} holds it:\n{}",
                    g.index,
                    story.join("\n")
                );
            }
        }
    };
    for e in &log {
        match &e.envelope.data {
            EventData::LeasePlaced(p) => {
                let lease = p.lease_id.to_string();
                if !placed_once.insert(lease.clone()) {
                    // Its story, and the nodes' fates, to tell why.
                    let story: Vec<String> = log
                        .iter()
                        .filter(|e| {
                            e.subject.contains(&lease)
                                || matches!(
                                    e.envelope.data,
                                    EventData::NodeLost(_) | EventData::NodeRejoined(_)
                                )
                        })
                        .map(|e| {
                            format!(
                                "{} {} {} by {:?}",
                                e.sequence,
                                e.subject,
                                e.envelope.data.event_type(),
                                e.envelope.actor
                            )
                        })
                        .collect();
                    panic!("lease {lease} placed twice:\n{}", story.join("\n"));
                }
                decided.insert(lease.clone());
                hold(&mut held, &p.node_id, &p.gpus, &lease);
            }
            EventData::LeaseMigrated(m) => {
                let lease = m.lease_id.to_string();
                held.retain(|_, l| *l != lease);
                if let Some(to) = &m.to {
                    hold(&mut held, &to.node_id, &to.gpus, &lease);
                }
            }
            EventData::LeaseSuspended(s) => {
                held.retain(|_, l| *l != s.lease_id.to_string());
            }
            EventData::LeaseQueued(q) => {
                decided.insert(q.lease_id.to_string());
            }
            EventData::LeaseEnded(end) => {
                held.retain(|_, l| *l != end.lease_id.to_string());
            }
            _ => {}
        }
    }
    for id in &ids {
        assert!(
            decided.contains(id),
            "lease {id} was neither placed nor queued"
        );
    }
    // The fleet (12 GPUs) is full but for at most one GPU: waiting leases of
    // one model are served first come, first served, so a 2-GPU request at
    // the head of the queue may wait while a single GPU stays free.
    assert!(held.len() >= 11, "only {} of 12 GPUs in use", held.len());
    assert!(placed_once.len() < REQUESTS);
    // Both replicas did work or lost races: conflicts are expected, but each
    // allocation on a node subject is unique.
    let allocations: usize = lh_test_stack::of_type(&log, "node.gpus_allocated")
        .iter()
        .map(|e| match &e.envelope.data {
            EventData::NodeGpusAllocated(a) => a.allocations.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(allocations, placed_once.len());
}
