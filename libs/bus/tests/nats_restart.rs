//! A feed outlives its server: nats-server killed with SIGKILL and started
//! again on the same port and store, the feed goes on from the message
//! after the last one it delivered, with no gap and no repeat.

use std::time::Duration;

use lh_bus::{Bus, BusConfig, Expect, Feed};
use lh_events::{fixtures, subject};
use lh_testkit::Nats;

async fn publish_stops(bus: &Bus, n: usize) -> Vec<u64> {
    let mut sequences = Vec::new();
    for _ in 0..n {
        let envelope = fixtures::stop_request();
        sequences.push(bus.publish(&envelope, Expect::Any).await.unwrap().sequence);
    }
    sequences
}

async fn read(feed: &mut Feed, n: usize, within: Duration) -> Vec<u64> {
    let mut sequences = Vec::new();
    while sequences.len() < n {
        let item = feed
            .next_item_within(within)
            .await
            .unwrap_or_else(|| panic!("only {sequences:?} within {within:?}"))
            .expect("the feed never fails for a lost server");
        sequences.push(item.sequence());
    }
    sequences
}

#[tokio::test]
async fn a_feed_resumes_after_the_server_is_killed_and_restarted() {
    let mut nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "restart-test"))
        .await
        .unwrap();
    let before = publish_stops(&bus, 5).await;
    let mut feed = bus.feed(&[subject::EVENTS_ALL], 1).await.unwrap();
    assert_eq!(read(&mut feed, 5, Duration::from_secs(5)).await, before);

    nats.kill();
    // Long enough for the client to notice and its consumer to be lost.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(feed
        .next_item_within(Duration::from_millis(200))
        .await
        .is_none());
    nats.restart().await.unwrap();

    // Connecting again waits for the server's JetStream to answer.
    let again = Bus::connect(&BusConfig::new(nats.url(), "restart-test"))
        .await
        .unwrap();
    let after = publish_stops(&again, 5).await;
    assert_eq!(after[0], before[4] + 1, "the store survived");
    assert_eq!(
        read(&mut feed, 5, Duration::from_secs(30)).await,
        after,
        "no gap, no repeat"
    );
    assert!(
        feed.next_item_within(Duration::from_secs(1))
            .await
            .is_none(),
        "nothing twice"
    );
}

/// Messages of a backlog long enough that a feed of several filters reads
/// it one consumer a filter, merged, and what is left of it after half
/// may be merged again.
const MERGED_BACKLOG_MESSAGES: usize = 15_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merged_backlog_read_resumes_after_the_server_is_killed_and_restarted() {
    use chrono::Utc;
    use lh_events::{Actor, Envelope, EventData};

    let mut nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "restart-merged-test"))
        .await
        .unwrap();
    // Leases, nodes and tenants in turn; the feed reads leases and nodes.
    let envelopes: Vec<Envelope> = (0..MERGED_BACKLOG_MESSAGES)
        .map(|i| match i % 3 {
            0 => fixtures::stop_request(),
            1 => fixtures::by_owner(EventData::NodeRegistered(fixtures::node(
                &format!("node-{}", i % 40),
                "cn-north-1a",
                8,
                "A100-40GB",
                40,
            ))),
            _ => Envelope::new(
                Actor::Admin,
                Utc::now(),
                EventData::TenantCreated(fixtures::tenant(uuid::Uuid::now_v7(), 8)),
            ),
        })
        .collect();
    let mut expected = Vec::new();
    for batch in envelopes.chunks(lh_bus::MAX_BATCH_MESSAGES) {
        let batch: Vec<(Envelope, Expect)> =
            batch.iter().map(|e| (e.clone(), Expect::Any)).collect();
        let last = bus.publish_atomic(&batch).await.unwrap().sequence;
        let first = last + 1 - batch.len() as u64;
        expected.extend((first..=last).filter(|s| (s - 1) % 3 != 2));
    }

    let filters = [subject::LEASES_ALL, subject::NODES_ALL];
    let mut feed = bus.feed(&filters, 1).await.unwrap();
    let half = expected.len() / 2;
    let mut read_all = read(&mut feed, half, Duration::from_secs(10)).await;
    assert_eq!(read_all, expected[..half], "the first half, in order");

    nats.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    nats.restart().await.unwrap();
    let again = Bus::connect(&BusConfig::new(nats.url(), "restart-merged-test"))
        .await
        .unwrap();
    let after = publish_stops(&again, 3).await;
    expected.extend(&after);

    // What the feed had read ahead before the kill, then the rest of the
    // backlog from a new consumer, then what came after.
    read_all.extend(read(&mut feed, expected.len() - half, Duration::from_secs(30)).await);
    assert_eq!(read_all, expected, "no gap, no repeat");
    assert!(
        feed.next_item_within(Duration::from_secs(1))
            .await
            .is_none(),
        "nothing twice"
    );
}
