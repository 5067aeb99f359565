//! The event log on a real nats-server: the stream config read back meets
//! the architecture brief, a weaker stream is refused, and atomic batches
//! store all or nothing under per-subject expectations.

use std::time::Duration;

use async_nats::jetstream::stream::{DiscardPolicy, StorageType};
use chrono::Utc;
use lh_bus::{Bus, BusConfig, BusError, Expect, EVENTS_MAX_AGE};
use lh_events::{subject, Actor, Envelope, EventData, LeaseStopRequested, NodeGpusAllocated};
use lh_testkit::Nats;
use uuid::Uuid;

fn stop(lease: Uuid) -> Envelope {
    Envelope::new(
        Actor::Admin,
        Utc::now(),
        EventData::LeaseStopRequested(LeaseStopRequested { lease_id: lease }),
    )
}

fn alloc(node: &str, lease: Uuid) -> Envelope {
    Envelope::new(
        Actor::Service("lh-scheduler".into()),
        Utc::now(),
        EventData::NodeGpusAllocated(NodeGpusAllocated::one(node, lease, vec![0])),
    )
}

#[tokio::test]
async fn the_events_stream_read_back_from_the_server_meets_the_brief() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    let config = bus.events_stream_config().await.unwrap();
    assert_eq!(config.name, "LH_EVENTS");
    assert_eq!(config.subjects, vec![subject::EVENTS_ALL.to_string()]);
    assert_eq!(config.storage, StorageType::File);
    assert!(config.max_age >= EVENTS_MAX_AGE);
    assert_eq!(config.max_age, Duration::from_secs(365 * 24 * 3600));
    assert_eq!(config.discard, DiscardPolicy::New);
    assert!(config.max_bytes > 0);
    assert!(config.deny_delete && config.deny_purge);
    assert!(!config.allow_rollup);
    assert!(config.allow_atomic_publish);
    assert!(lh_bus::events_stream_problems(&config, EVENTS_MAX_AGE).is_empty());

    // The server itself refuses to delete or purge.
    let js = bus.jetstream();
    let appended = bus
        .publish(&stop(Uuid::now_v7()), Expect::Any)
        .await
        .unwrap();
    let stream = js.get_stream(subject::EVENTS_STREAM).await.unwrap();
    assert!(stream.delete_message(appended.sequence).await.is_err());
    assert!(stream.purge().await.is_err());
    // A second connect finds the stream and accepts it.
    Bus::connect(&BusConfig::new(nats.url(), "again"))
        .await
        .unwrap();
    // The server runs with sync_interval: always (from its config file).
    let conf = std::fs::read_to_string(nats.config_file()).unwrap();
    assert!(conf.contains("sync_interval: always"), "{conf}");
}

#[tokio::test]
async fn a_weaker_stream_is_refused() {
    let nats = Nats::start().await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "LH_EVENTS".into(),
        subjects: vec![subject::EVENTS_ALL.into()],
        max_age: Duration::from_secs(30 * 24 * 3600),
        ..Default::default()
    })
    .await
    .unwrap();
    match Bus::connect(&BusConfig::new(nats.url(), "test")).await {
        Err(BusError::WeakStream { problems, .. }) => {
            for expected in [
                "max_age",
                "discard",
                "deny_delete",
                "deny_purge",
                "allow_atomic",
            ] {
                assert!(problems.contains(expected), "{problems} lacks {expected}");
            }
        }
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a 30-day stream without deny_delete was accepted"),
    }
}

#[tokio::test]
async fn atomic_batches_store_all_or_nothing_and_ids_deduplicate() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    let lease = Uuid::now_v7();
    let first = bus
        .publish_atomic(&[
            (stop(lease), Expect::LastSubjectSequence(0)),
            (alloc("n1", lease), Expect::LastSubjectSequence(0)),
        ])
        .await
        .unwrap();
    assert_eq!(first.sequence, 2);

    // A stale expectation on the second message rejects the whole batch.
    let other = Uuid::now_v7();
    let err = bus
        .publish_atomic(&[
            (stop(other), Expect::LastSubjectSequence(0)),
            (alloc("n1", other), Expect::LastSubjectSequence(0)),
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, BusError::Conflict(_)), "{err}");
    assert_eq!(
        bus.last_sequence().await.unwrap(),
        2,
        "nothing of the failed batch was stored"
    );
    assert_eq!(
        bus.subject_last_sequence(&subject::lease(other))
            .await
            .unwrap(),
        0
    );

    // The same event id twice is stored once.
    let e = stop(lease);
    let a = bus.publish(&e, Expect::Any).await.unwrap();
    let b = bus.publish(&e, Expect::Any).await.unwrap();
    assert!(!a.duplicate && b.duplicate);
    assert_eq!(a.sequence, b.sequence);

    // Feeds replay in order from any sequence.
    let mut feed = bus.feed(&[subject::EVENTS_ALL], 2).await.unwrap();
    let ev = feed
        .next_within(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev.sequence, 2);
    assert_eq!(ev.envelope.event_type, "node.gpus_allocated");
}

#[tokio::test]
async fn acknowledged_events_survive_a_server_kill() {
    let mut nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    for _ in 0..20 {
        bus.publish(&stop(Uuid::now_v7()), Expect::Any)
            .await
            .unwrap();
    }
    nats.kill();
    nats.restart().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "after"))
        .await
        .unwrap();
    assert_eq!(bus.last_sequence().await.unwrap(), 20);
}

#[tokio::test]
async fn the_last_telemetry_sample_of_each_subject() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    assert!(bus
        .last_telemetry_each(subject::HEARTBEATS_ALL, 10)
        .await
        .unwrap()
        .is_empty());
    for round in 0..2 {
        for node in ["a", "b", "c"] {
            bus.publish_telemetry(
                subject::heartbeat(node),
                format!("{node}{round}").into_bytes(),
            )
            .await
            .unwrap();
        }
    }
    let mut last = Vec::new();
    for _ in 0..50 {
        last = bus
            .last_telemetry_each(subject::HEARTBEATS_ALL, 10)
            .await
            .unwrap();
        if last.contains(&(subject::heartbeat("c"), b"c1".to_vec())) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    last.sort();
    let expected: Vec<(String, Vec<u8>)> = ["a", "b", "c"]
        .iter()
        .map(|n| (subject::heartbeat(n), format!("{n}1").into_bytes()))
        .collect();
    assert_eq!(last, expected);
    let capped = bus
        .last_telemetry_each(subject::HEARTBEATS_ALL, 2)
        .await
        .unwrap();
    assert_eq!(capped.len(), 2);
}

#[tokio::test]
async fn a_larger_configured_size_grows_the_log_and_a_smaller_one_never_shrinks_it() {
    let nats = Nats::start().await.unwrap();
    let sized = |bytes: i64| {
        let mut config = BusConfig::new(nats.url(), "test");
        config.events_max_bytes = bytes;
        config
    };
    const MIB: i64 = 1024 * 1024;
    let bus = Bus::connect(&sized(64 * MIB)).await.unwrap();
    assert_eq!(
        bus.events_stream_config().await.unwrap().max_bytes,
        64 * MIB
    );
    let bus = Bus::connect(&sized(256 * MIB)).await.unwrap();
    assert_eq!(
        bus.events_stream_config().await.unwrap().max_bytes,
        256 * MIB
    );
    let bus = Bus::connect(&sized(128 * MIB)).await.unwrap();
    assert_eq!(
        bus.events_stream_config().await.unwrap().max_bytes,
        256 * MIB
    );
    let figures = bus.stream_figures(subject::EVENTS_STREAM).await.unwrap();
    assert_eq!((figures.bytes, figures.max_bytes), (0, 256 * MIB as u64));
}

#[test]
fn operators_are_warned_from_four_fifths_full() {
    assert_eq!(lh_bus::events_fill_warning(79, 100), None);
    assert_eq!(lh_bus::events_fill_warning(80, 100), Some(0.8));
    assert_eq!(lh_bus::events_fill_warning(10, 0), None, "no limit");
}

#[tokio::test]
async fn a_short_retention_needs_the_test_flag() {
    let nats = Nats::start().await.unwrap();
    let mut config = BusConfig::new(nats.url(), "test");
    config.events_max_age = Duration::from_secs(5);
    match Bus::connect(&config).await {
        Err(BusError::WeakStream { problems, .. }) => {
            assert!(problems.contains("365 days"), "{problems}")
        }
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a 5-second log was accepted outside tests"),
    }
    config.allow_short_retention = true;
    let bus = Bus::connect(&config).await.unwrap();
    assert_eq!(
        bus.events_stream_config().await.unwrap().max_age,
        Duration::from_secs(5)
    );
    // A service started later with the same flags accepts that log; one
    // without them does not.
    Bus::connect(&config).await.unwrap();
    assert!(matches!(
        Bus::connect(&BusConfig::new(nats.url(), "test")).await,
        Err(BusError::WeakStream { .. })
    ));
}

#[tokio::test]
async fn the_head_of_a_set_of_filters_is_the_newest_event_any_of_them_matches() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    let nodes = subject::guarded(&subject::node("n1"));
    let leases = subject::LEASES_ALL;
    assert_eq!(bus.last_sequence_matching(&[&nodes]).await.unwrap(), 0);
    let on_node = bus
        .publish(&alloc("n1", Uuid::now_v7()), Expect::Any)
        .await
        .unwrap();
    let on_lease = bus
        .publish(&stop(Uuid::now_v7()), Expect::Any)
        .await
        .unwrap();
    let on_other_node = bus
        .publish(&alloc("n2", Uuid::now_v7()), Expect::Any)
        .await
        .unwrap();
    assert!(on_node.sequence < on_lease.sequence && on_lease.sequence < on_other_node.sequence);
    assert_eq!(
        bus.last_sequence_matching(&[&nodes]).await.unwrap(),
        on_node.sequence
    );
    assert_eq!(
        bus.last_sequence_matching(&[&nodes, leases]).await.unwrap(),
        on_lease.sequence
    );
    assert_eq!(
        bus.last_sequence_matching(&[subject::EVENTS_ALL])
            .await
            .unwrap(),
        on_other_node.sequence
    );
    assert_eq!(bus.last_sequence_matching(&[]).await.unwrap(), 0);
}
