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
