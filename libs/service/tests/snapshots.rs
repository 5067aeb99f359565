//! Snapshots against a real nats-server: a decider that keeps one starts
//! from it and reads only the log after it, with the state a full replay
//! gives; a snapshot that cannot be used costs a replay, never state.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::{Bus, BusConfig, Expect};
use lh_events::{subject, Actor, Envelope, EventData, NodeCordoned};
use lh_service::clock::SystemClock;
use lh_service::decider::{self, restored, snapshot_of, Batch, Decider, Pace};
use lh_service::{CancellationToken, Readiness};
use lh_testkit::Nats;
use serde_json::value::RawValue;

/// Counts the cordons of each node; snapshots after every `every` events.
#[derive(Default)]
struct Counter {
    cordons: std::collections::BTreeMap<String, u64>,
    last_sequence: u64,
    /// Events this instance applied (shared with the test).
    applied: Arc<AtomicU64>,
    every: u64,
}

impl Decider for Counter {
    type Signal = std::convert::Infallible;

    fn name(&self) -> &'static str {
        "counter"
    }

    fn filters(&self) -> &[&'static str] {
        &[subject::NODES_ALL]
    }

    fn pace(&self) -> Pace {
        Pace {
            quiet: Duration::from_millis(20),
            tick: Duration::from_millis(50),
            snapshot_every_events: self.every,
            ..Pace::default()
        }
    }

    fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        if sequence <= self.last_sequence {
            return;
        }
        self.last_sequence = sequence;
        self.applied.fetch_add(1, Ordering::Relaxed);
        if let EventData::NodeCordoned(c) = &envelope.data {
            *self.cordons.entry(c.node_id.clone()).or_default() += 1;
        }
    }

    fn decide(&mut self, _now: DateTime<Utc>) -> Vec<Batch> {
        Vec::new()
    }

    fn snapshot(&self) -> Option<Box<RawValue>> {
        snapshot_of(
            &serde_json::json!({"cordons": self.cordons, "last_sequence": self.last_sequence}),
        )
    }

    fn restore(&mut self, state: &RawValue) -> bool {
        let Some(state) = restored::<serde_json::Value>(state) else {
            return false;
        };
        let (Ok(cordons), Some(last)) = (
            serde_json::from_value(state["cordons"].clone()),
            state["last_sequence"].as_u64(),
        ) else {
            return false;
        };
        self.cordons = cordons;
        self.last_sequence = last;
        true
    }
}

async fn cordon(bus: &Bus, node: &str) {
    let envelope = Envelope::new(
        Actor::Admin,
        Utc::now(),
        EventData::NodeCordoned(NodeCordoned {
            node_id: node.into(),
            drain: None,
            reason: "test".into(),
        }),
    );
    bus.publish(&envelope, Expect::Any).await.unwrap();
}

/// Runs a counter until it has applied the log's `head`; its cordons and
/// how many events it applied.
async fn run_to(
    bus: &Bus,
    every: u64,
    head: u64,
) -> (std::collections::BTreeMap<String, u64>, u64) {
    let applied = Arc::new(AtomicU64::new(0));
    let mut counter = Counter {
        applied: applied.clone(),
        every,
        ..Counter::default()
    };
    let shutdown = CancellationToken::new();
    let run = {
        let (bus, stop) = (bus.clone(), shutdown.clone());
        tokio::spawn(async move {
            decider::run(&bus, &mut counter, &SystemClock, stop, Readiness::default())
                .await
                .unwrap();
            counter
        })
    };
    let mut counter = None;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if run.is_finished() {
            break;
        }
        // Wait for the last event, and for a snapshot written on the way.
        if applied.load(Ordering::Relaxed) > 0 && last_applied(bus, head).await {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.cancel();
    counter.get_or_insert(run.await.unwrap());
    let counter = counter.unwrap();
    assert_eq!(counter.last_sequence, head, "caught up");
    (counter.cordons, applied.load(Ordering::Relaxed))
}

async fn last_applied(bus: &Bus, head: u64) -> bool {
    bus.last_sequence().await.unwrap() == head
}

#[tokio::test]
async fn a_decider_starts_from_its_snapshot_and_reads_only_the_tail() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    for i in 0..40 {
        cordon(&bus, &format!("n{}", i % 3)).await;
    }
    // The first run replays everything and snapshots every 10 events.
    let (first, applied) = run_to(&bus, 10, 40).await;
    assert_eq!(applied, 40);
    assert_eq!(first.values().sum::<u64>(), 40);
    let stored = bus.get_snapshot("counter").await.unwrap();
    assert!(stored.is_some(), "a snapshot was stored");

    for i in 0..5 {
        cordon(&bus, &format!("n{}", i % 3)).await;
    }
    let (second, applied) = run_to(&bus, 1_000, 45).await;
    assert!(
        applied <= 5 + 10,
        "read {applied} events: from its snapshot, not from the start"
    );
    let (replayed, _) = {
        // A snapshot that does not decode is ignored: the log is replayed.
        bus.put_snapshot("counter", b"not json").await.unwrap();
        run_to(&bus, 1_000, 45).await
    };
    assert_eq!(second, replayed, "the snapshot's state is the replay's");
    assert_eq!(second.values().sum::<u64>(), 45);
}
