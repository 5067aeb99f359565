//! Each node's view mirror, as the scheduler keeps it, on a three-member
//! cluster: made when the node's first relay or heartbeat appears, holding
//! the log's sequences, and following the log through a kill of its leader.

use std::time::{Duration, Instant};

use lh_bus::{Bus, BusConfig, Expect};
use lh_events::{subject, Actor, Envelope, EventData, NodeViewRelayed};
use lh_service::CancellationToken;
use lh_testkit::NatsCluster;

/// Longest a relay may take to reach its node's mirror after the log's
/// leader was killed: the election, then the keeper's renewal of a mirror
/// silent for 3 s, looked at every 2 s, with room for a loaded machine.
const MIRROR_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(45);
/// Tries of one append while the cluster elects.
const APPEND_TRIES_MAX: u32 = 600;
const APPEND_RETRY_WAIT: Duration = Duration::from_millis(100);

fn relay_to(node: &str) -> Envelope {
    Envelope::new(
        Actor::Service("lh-scheduler".into()),
        chrono::Utc::now(),
        EventData::NodeViewRelayed(NodeViewRelayed {
            node_id: node.into(),
            events: Vec::new(),
            idle_policies: Vec::new(),
        }),
    )
}

async fn append(bus: &Bus, envelope: &Envelope) -> u64 {
    for _ in 0..APPEND_TRIES_MAX {
        match bus.publish(envelope, Expect::Any).await {
            Ok(appended) => return appended.sequence,
            Err(_) => tokio::time::sleep(APPEND_RETRY_WAIT).await,
        }
    }
    panic!("the relay was never appended");
}

/// Waits until node `node`'s mirror holds `sequence`; how long it took.
async fn in_mirror(view: &Bus, node: &str, sequence: u64) -> Duration {
    let filter = subject::guarded(&subject::node_view(node));
    let started = Instant::now();
    tokio::time::timeout(MIRROR_CATCH_UP_TIMEOUT, async {
        while view.last_sequence_matching(&[&filter]).await.unwrap_or(0) < sequence {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!("relay {sequence} not in {node}'s mirror within {MIRROR_CATCH_UP_TIMEOUT:?}")
    });
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_view_mirror_is_made_and_follows_the_log_through_a_leader_kill() {
    let mut cluster = NatsCluster::start().await.unwrap();
    let mut config = BusConfig::new(cluster.urls(), "scheduler");
    config.replicas = 3;
    let bus = Bus::connect(&config).await.unwrap();
    let shutdown = CancellationToken::new();
    let _keeper = lh_service::AbortOnDrop(tokio::spawn(lh_scheduler::node_view::keep_mirrors(
        bus.clone(),
        shutdown.clone(),
    )));

    // A relay to a node makes its mirror; a heartbeat alone does too.
    let first = append(&bus, &relay_to("n1")).await;
    let view = bus.clone().reading_view_of("n1");
    in_mirror(&view, "n1", first).await;
    bus.client()
        .publish(subject::heartbeat("n2"), "{}".into())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while bus
        .jetstream()
        .get_stream(subject::node_view_stream("n2"))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "a heartbeat made no mirror");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let leader = cluster.stream_leader(subject::EVENTS_STREAM).await.unwrap();
    cluster.kill(leader);
    let second = append(&bus, &relay_to("n1")).await;
    let took = in_mirror(&view, "n1", second).await;
    eprintln!("the mirror followed the log's new leader in {took:?}");
    let mut feed = view
        .feed(&[&subject::guarded(&subject::node_view("n1"))], 1)
        .await
        .unwrap();
    for expected in [first, second] {
        let read = feed
            .next_within(Duration::from_secs(10))
            .await
            .expect("the relay is read from the mirror")
            .unwrap();
        assert_eq!(
            read.sequence, expected,
            "the mirror keeps the log's sequences"
        );
    }
    shutdown.cancel();
}

/// The replicas of node `node`'s mirror.
async fn mirror_replicas(bus: &Bus, node: &str) -> usize {
    let mut stream = bus
        .jetstream()
        .get_stream(subject::node_view_stream(node))
        .await
        .unwrap();
    stream.info().await.unwrap().config.num_replicas
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_has_as_many_replicas_as_the_log_whatever_its_maker_was_told() {
    let cluster = NatsCluster::start().await.unwrap();
    let mut config = BusConfig::new(cluster.urls(), "scheduler");
    config.replicas = 3;
    Bus::connect(&config).await.unwrap();
    // A scheduler told nothing of the cluster (one replica, the default):
    // a mirror on one member would go down with it while the log goes on.
    config.replicas = 1;
    let told_one = Bus::connect(&config).await.unwrap();
    told_one.ensure_node_view_stream("n1").await.unwrap();
    assert_eq!(mirror_replicas(&told_one, "n1").await, 3);
    // One made on one member before is given the log's replicas.
    told_one
        .jetstream()
        .create_stream(lh_bus::node_view_stream_config(
            "n2",
            1,
            Duration::from_secs(3600),
        ))
        .await
        .unwrap();
    assert_eq!(mirror_replicas(&told_one, "n2").await, 1);
    told_one.ensure_node_view_stream("n2").await.unwrap();
    assert_eq!(mirror_replicas(&told_one, "n2").await, 3);
}
