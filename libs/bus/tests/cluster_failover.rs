//! A stream leader killed on a three-node cluster loses no acknowledged
//! event: one task appends continuously (retrying a failed append with the
//! same event id, so that JetStream's duplicate window drops a second copy),
//! the member leading `LH_EVENTS`, which is also the member the appending
//! client is connected to, is killed with SIGKILL mid-way and started
//! again. A reader connected to another member keeps its connection, so
//! its feeds must find the new leader from the server's advisory; each
//! feed's consumer lives on one member, so with several of them one is
//! likely to have lived on the killed member. Afterwards every acknowledged event is in the stream exactly once,
//! and feeds that followed live delivered the whole stream in order, with
//! no gap and no repeat.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lh_bus::{Bus, BusConfig, Expect, Feed};
use lh_events::{fixtures, subject};
use lh_testkit::NatsCluster;
use uuid::Uuid;

/// Acknowledged appends before the leader is killed, and again after the
/// kill and after the restart.
const APPENDS_PER_PHASE: usize = 100;
/// How long one phase may take (a leader election is a few seconds).
const PHASE_TIMEOUT: Duration = Duration::from_secs(90);
/// Pause before an append that failed is tried again.
const APPEND_RETRY_WAIT: Duration = Duration::from_millis(100);
/// Tries of one append before the test gives up on the cluster.
const APPEND_TRIES_MAX: u32 = 600;
/// Connections tried before one lands on the wanted member (each picks
/// one of the listed servers at random).
const CONNECT_TRIES_MAX: usize = 50;
/// Feeds following the log live through the failover.
const LIVE_FEEDS: usize = 3;
/// How long a feed may take to hand over one message through a failover:
/// less than the two missed 15 s heartbeats by which the client alone
/// would find a consumer lost with its member.
const FEED_ITEM_TIMEOUT: Duration = Duration::from_secs(10);

/// What the appending task saw acknowledged: event id → stream sequence,
/// and how many appends failed and were tried again.
struct Appends {
    acked: BTreeMap<Uuid, u64>,
    retries: u32,
}

/// Appends stop requests until `stop` is set, each until it is acknowledged.
async fn append_until(bus: Bus, acked_count: Arc<AtomicUsize>, stop: Arc<AtomicBool>) -> Appends {
    let mut appends = Appends {
        acked: BTreeMap::new(),
        retries: 0,
    };
    while !stop.load(Ordering::Relaxed) {
        let envelope = fixtures::stop_request();
        let mut tries = 0;
        let appended = loop {
            tries += 1;
            match bus.publish(&envelope, Expect::Any).await {
                Ok(appended) => break appended,
                Err(e) if tries < APPEND_TRIES_MAX => {
                    appends.retries += 1;
                    tracing::info!(error = %e, tries, "append failed; trying again with the same id");
                    tokio::time::sleep(APPEND_RETRY_WAIT).await;
                }
                Err(e) => panic!("append still failing after {tries} tries: {e}"),
            }
        };
        let before = appends.acked.insert(envelope.id, appended.sequence);
        assert!(before.is_none(), "an event id was acknowledged twice");
        acked_count.store(appends.acked.len(), Ordering::Relaxed);
    }
    appends
}

/// A bus on the cluster whose connection is to the member named `server`.
async fn connect_to(config: &BusConfig, server: &str) -> Bus {
    for _ in 0..CONNECT_TRIES_MAX {
        let bus = Bus::connect(config).await.unwrap();
        if bus.client().server_info().server_name == server {
            return bus;
        }
    }
    panic!("no connection to {server} in {CONNECT_TRIES_MAX} tries");
}

async fn wait_for_acks(acked: &AtomicUsize, at_least: usize) {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while acked.load(Ordering::Relaxed) < at_least {
        assert!(
            Instant::now() < deadline,
            "only {} of {at_least} appends acknowledged within {PHASE_TIMEOUT:?}",
            acked.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads `feed` up to and including `last_sequence` into `read`:
/// (sequence, event id).
async fn read_through(feed: &mut Feed, last_sequence: u64, read: &mut Vec<(u64, Uuid)>) {
    while read
        .last()
        .is_none_or(|(sequence, _)| *sequence < last_sequence)
    {
        let event = feed
            .next_within(FEED_ITEM_TIMEOUT)
            .await
            .unwrap_or_else(|| panic!("the feed stopped after {:?}", read.last()))
            .expect("the feed never fails for a leader change");
        read.push((event.sequence, event.envelope.id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_stream_leader_loses_no_acknowledged_event() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("info")
        .try_init();
    let mut cluster = NatsCluster::start().await.unwrap();
    let mut config = BusConfig::new(cluster.urls(), "cluster-writer");
    config.replicas = 3;
    let setup = Bus::connect(&config).await.unwrap();
    assert_eq!(
        setup.events_stream_config().await.unwrap().num_replicas,
        3,
        "the business log is R3 on a cluster"
    );
    let leader = cluster.stream_leader("LH_EVENTS").await.unwrap();
    let leader_name = cluster.member(leader).server_name().to_string();
    // The worst case: the client loses its server as the stream its leader.
    let writer = connect_to(&config, &leader_name).await;
    // The reader stays connected: its feed must learn of the new leader
    // from the server, not from a reconnect.
    config.client_name = "cluster-reader".to_string();
    let survivor = cluster
        .member((leader + 1) % cluster.member_count())
        .server_name()
        .to_string();
    let reader = connect_to(&config, &survivor).await;
    let mut live = Vec::with_capacity(LIVE_FEEDS);
    for _ in 0..LIVE_FEEDS {
        live.push(reader.feed(&[subject::EVENTS_ALL], 1).await.unwrap());
    }

    let acked = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let appending = tokio::spawn(append_until(writer.clone(), acked.clone(), stop.clone()));

    wait_for_acks(&acked, APPENDS_PER_PHASE).await;
    assert_eq!(
        cluster.stream_leader("LH_EVENTS").await.unwrap(),
        leader,
        "the leader stayed put until the kill"
    );
    cluster.kill(leader);
    let killed_at = acked.load(Ordering::Relaxed);
    let new_leader = cluster.stream_leader("LH_EVENTS").await.unwrap();
    assert_ne!(new_leader, leader, "a running member leads after the kill");
    wait_for_acks(&acked, killed_at + APPENDS_PER_PHASE).await;
    // The live feeds follow the new leader promptly.
    let mut followed = vec![Vec::new(); LIVE_FEEDS];
    let since_kill = reader.last_sequence().await.unwrap();
    for (feed, read) in live.iter_mut().zip(&mut followed) {
        read_through(feed, since_kill, read).await;
    }

    cluster.restart(leader).await.unwrap();
    let restarted_at = acked.load(Ordering::Relaxed);
    wait_for_acks(&acked, restarted_at + APPENDS_PER_PHASE).await;
    stop.store(true, Ordering::Relaxed);
    let appends = appending.await.unwrap();
    assert_ne!(
        writer.client().server_info().server_name,
        leader_name,
        "the writer moved to another member"
    );
    tracing::info!(
        acked = appends.acked.len(),
        retries = appends.retries,
        leader,
        new_leader,
        "appending done"
    );

    let last_sequence = writer.last_sequence().await.unwrap();
    let mut replay = reader.feed(&[subject::EVENTS_ALL], 1).await.unwrap();
    let mut stored = Vec::new();
    read_through(&mut replay, last_sequence, &mut stored).await;

    // The stream is exactly the acknowledged events, each once.
    let sequences: Vec<u64> = stored.iter().map(|(sequence, _)| *sequence).collect();
    assert_eq!(
        sequences,
        (1..=last_sequence).collect::<Vec<_>>(),
        "the stream has no holes"
    );
    let ids: HashSet<Uuid> = stored.iter().map(|(_, id)| *id).collect();
    assert_eq!(ids.len(), stored.len(), "an event is stored twice");
    for (id, sequence) in &appends.acked {
        assert!(
            stored.contains(&(*sequence, *id)),
            "acknowledged event {id} at sequence {sequence} is not in the stream"
        );
    }
    assert_eq!(
        stored.len(),
        appends.acked.len(),
        "the stream holds an event that was never acknowledged"
    );

    // The live feeds rode through the failover without a gap or a repeat.
    for (feed, read) in live.iter_mut().zip(&mut followed) {
        read_through(feed, last_sequence, read).await;
        assert_eq!(*read, stored, "a live feed delivered the stream in order");
        assert!(
            feed.next_within(Duration::from_secs(1)).await.is_none(),
            "nothing after the last event"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_created_with_one_replica_is_given_the_replicas_configured() {
    let cluster = lh_testkit::NatsCluster::start().await.unwrap();
    let single = BusConfig::new(cluster.urls(), "test");
    let bus = Bus::connect(&single).await.unwrap();
    assert_eq!(bus.events_stream_config().await.unwrap().num_replicas, 1);
    let mut replicated = single.clone();
    replicated.replicas = 3;
    let bus = Bus::connect(&replicated).await.unwrap();
    assert_eq!(bus.events_stream_config().await.unwrap().num_replicas, 3);
    // A service still configured with one replica does not lower it.
    let bus = Bus::connect(&single).await.unwrap();
    assert_eq!(bus.events_stream_config().await.unwrap().num_replicas, 3);
}
