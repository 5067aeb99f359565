//! The holds of a lease across nodes, kept in `lease_holds` between a
//! projection's transactions: after the gang moves, a late report of a
//! member it left is stepped over as stale (a node that had not heard of
//! the move yet), not as an attack, though the hold was read back from
//! PostgreSQL in between. Real nats-server and PostgreSQL.

mod common;

use std::time::Duration;

use chrono::Utc;
use lh_bus::Expect;
use lh_events::{fixtures, Actor, Envelope, EventData, LeaseMember, LeaseMigrated};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use common::Nothing;

#[tokio::test]
async fn a_former_members_late_report_is_stale_after_the_hold_was_read_back() {
    let (_nats, bus, database_url) = common::log_and_database().await;
    let pool = common::schema(&database_url, "live").await;
    let stop = CancellationToken::new();
    let (progress, run) = common::spawn_run(&bus, &pool, Nothing, &stop).await;
    // Each event in a transaction of its own: the holds go through the
    // table between them.
    let publish = |envelope: Envelope| {
        let (bus, progress) = (bus.clone(), &progress);
        async move {
            let sequence = bus.publish(&envelope, Expect::Any).await.unwrap().sequence;
            assert!(progress.wait_for(sequence, Duration::from_secs(10)).await);
        }
    };
    let (lease, tenant) = (Uuid::now_v7(), Uuid::now_v7());
    let scheduler = || Actor::Service("lh-scheduler".into());
    publish(Envelope::new(
        Actor::Tenant(tenant),
        Utc::now(),
        EventData::LeaseRequested(fixtures::whole_request(lease, tenant, 16, fixtures::MODEL)),
    ))
    .await;
    let mut placed = fixtures::placed(lease, "node-c", "z", fixtures::MODEL, 40, &[0]);
    placed.members = ["node-c", "node-d"]
        .map(|n| LeaseMember {
            node_id: n.into(),
            zone: "z".into(),
            address: n.into(),
            gpus: placed.gpus.clone(),
        })
        .into();
    publish(Envelope::new(
        scheduler(),
        Utc::now(),
        EventData::LeasePlaced(placed),
    ))
    .await;
    publish(Envelope::new(
        scheduler(),
        Utc::now(),
        EventData::LeaseMigrated(LeaseMigrated {
            lease_id: lease,
            reason: "node node-c lost".into(),
            from_node_id: "node-c".into(),
            from_gpu_indices: vec![0],
            billing_ends_at: Utc::now(),
            to: None,
        }),
    ))
    .await;
    let stored: Option<sqlx::types::Json<Vec<String>>> = sqlx::query_scalar(
        "SELECT previous_members FROM lease_holds WHERE projection = 'nothing' AND lease_id = $1",
    )
    .bind(lease)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored.map(|m| m.0), Some(vec!["node-d".to_string()]));
    // node-d's start, sent before it heard of the move, and a start of a
    // node that never held the lease.
    for node in ["node-d", "node-x"] {
        publish(Envelope::new(
            Actor::Node(node.into()),
            Utc::now(),
            EventData::LeaseStarted(fixtures::started(lease, node, Utc::now())),
        ))
        .await;
    }
    let reasons: Vec<String> = sqlx::query_scalar(
        "SELECT reason FROM skipped_events WHERE projection = 'nothing' ORDER BY sequence",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(reasons, ["stale_report", "not_authorized"]);
    stop.cancel();
    run.await.unwrap().unwrap();
}
