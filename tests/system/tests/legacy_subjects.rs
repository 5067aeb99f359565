//! A log written before subjects named the event's type and publisher:
//! events on the bare aggregate subject (`lh.evt.lease.<id>`) are read as
//! they always were, and a service's guarded writes to such an aggregate
//! go through (the server's guard counts only `<aggregate>.>`).

use std::time::Duration;

use lh_bus::async_nats;
use lh_events::{fixtures, subject, Actor, Envelope, EventData, NodeUncordoned};
use lh_test_stack::{of_type, Stack};
use uuid::Uuid;

const FLEET: &str = r#"
[[node]]
id = "node-a"
zone = "z1"
hostname = "a.sim"
gpu_model = "A100-40GB"
gpu_count = 8
vram_gb = 40
"#;

/// Stores `envelope` as code before the change did: on its aggregate's
/// subject, with its type in a header only.
async fn publish_legacy(js: &async_nats::jetstream::Context, envelope: &Envelope) -> u64 {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", envelope.id.to_string().as_str());
    headers.insert("Lh-Event-Type", envelope.event_type.as_str());
    js.publish_with_headers(
        envelope.data.aggregate_subject(),
        headers,
        envelope.to_json().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap()
    .sequence
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_writes_on_aggregates_whose_newest_events_are_legacy() {
    let mut stack = Stack::bare(FLEET).await;
    stack.start_service("gateway").await;
    stack.start_service("node-agent:node-a").await;
    stack.wait_ready().await;
    let (tenant_id, key) = stack.create_tenant("acme", 8).await;
    stack
        .wait_log(10, |log| {
            (!of_type(log, "node.registered").is_empty()).then_some(())
        })
        .await;

    let client = async_nats::connect(stack.nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    // The node's newest event and the lease's only one are legacy.
    let uncordoned = Envelope::new(
        Actor::Admin,
        chrono::Utc::now(),
        EventData::NodeUncordoned(NodeUncordoned {
            node_id: "node-a".into(),
        }),
    );
    let node_legacy = publish_legacy(&js, &uncordoned).await;
    let lease = Uuid::now_v7();
    let request = fixtures::whole_request(lease, tenant_id.parse().unwrap(), 2, fixtures::MODEL);
    let requested = Envelope::new(
        Actor::Tenant(tenant_id.parse().unwrap()),
        chrono::Utc::now(),
        EventData::LeaseRequested(request),
    );
    let lease_legacy = publish_legacy(&js, &requested).await;
    let bus = stack.bus().await;
    assert_eq!(
        bus.subject_last_sequence(&subject::lease(lease))
            .await
            .unwrap(),
        0,
        "a guard does not count a legacy event"
    );

    // The scheduler guards its placement with the sequences it read, legacy
    // ones: the writes go through, and the node agent starts the lease.
    stack.start_service("scheduler").await;
    let running = stack
        .wait_lease(&key, &lease.to_string(), |l| l["state"] == "running")
        .await;
    assert_eq!(running["node_id"], "node-a", "{running}");

    let placed = stack
        .wait_log(10, |log| {
            of_type(log, "lease.placed")
                .into_iter()
                .find(|e| e.envelope.data.lease_id() == Some(lease))
                .cloned()
        })
        .await;
    assert!(placed.sequence > lease_legacy.max(node_legacy));
    assert_eq!(
        placed.subject,
        format!("{}.placed.scheduler", subject::lease(lease))
    );
    let allocated = stack
        .wait_log(10, |log| {
            of_type(log, "node.gpus_allocated")
                .into_iter()
                .find(|e| e.sequence > node_legacy)
                .cloned()
        })
        .await;
    assert_eq!(
        allocated.subject,
        format!("{}.gpus_allocated.scheduler", subject::node("node-a"))
    );
    // Both events of the lease, the legacy request first, are its history.
    let history = bus
        .subject_history(&subject::lease(lease), 1, 100)
        .await
        .unwrap();
    assert_eq!(history[0].sequence, lease_legacy);
    assert_eq!(history[0].subject, subject::lease(lease));
    assert!(history.iter().any(|e| e.sequence == placed.sequence));
    tokio::time::sleep(Duration::from_millis(100)).await;
    stack.assert_none_stopped();
}
