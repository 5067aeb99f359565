//! A feed over messages its reader cannot use, on a real nats-server: each
//! is handed over as skipped with its reason, in order, never as an error,
//! and counted under the connection's service name. So is an event stored
//! where its envelope says it does not belong, or by a publisher its type's
//! owners do not include.

use std::sync::OnceLock;
use std::time::Duration;

use chrono::Utc;
use lh_bus::{Bus, BusConfig, Expect, FeedItem};
use lh_events::{fixtures, subject, Actor, Envelope, EventData, SkipReason};
use lh_testkit::Nats;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use uuid::Uuid;

fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
}

async fn publish_raw(bus: &Bus, subject: String, bytes: Vec<u8>) -> u64 {
    bus.jetstream()
        .publish(subject, bytes.into())
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence
}

async fn publish_stop(bus: &Bus) -> u64 {
    let envelope = fixtures::stop_request();
    bus.publish(&envelope, Expect::Any).await.unwrap().sequence
}

#[tokio::test]
async fn undecodable_messages_are_skipped_in_order_with_their_reason() {
    let metrics = metrics();
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "bad-messages-test"))
        .await
        .unwrap();
    let first = publish_stop(&bus).await;
    let bad = fixtures::undecodable();
    let mut expected = Vec::new();
    for (reason, bytes) in &bad {
        let subject = subject::lease(Uuid::now_v7());
        let sequence = publish_raw(&bus, subject.clone(), bytes.clone()).await;
        expected.push((sequence, subject, *reason, bytes.clone()));
    }
    // Events that decode but are not on the subject their envelope
    // computes, or not by an owner of their type.
    let stop = fixtures::stop_request();
    let misplaced = format!("{}.started.node-n1", stop.data.aggregate_subject());
    let placed = fixtures::placed(Uuid::now_v7(), "n1", "z", fixtures::MODEL, 40, &[0]);
    let forged = Envelope::new(
        Actor::Node("n1".into()),
        Utc::now(),
        EventData::LeasePlaced(placed),
    );
    for (reason, subject, bytes) in [
        (SkipReason::WrongSubject, misplaced, stop.to_json()),
        (SkipReason::NotOwner, forged.subject(), forged.to_json()),
    ] {
        let sequence = publish_raw(&bus, subject.clone(), bytes.clone()).await;
        expected.push((sequence, subject, reason, bytes));
    }
    let last = publish_stop(&bus).await;

    let mut feed = bus.feed(&[subject::EVENTS_ALL], 1).await.unwrap();
    let mut items = Vec::new();
    while let Some(item) = feed.next_item_within(Duration::from_secs(5)).await {
        let item = item.expect("a bad message is never an error");
        let done = item.pending() == 0;
        items.push(item);
        if done {
            break;
        }
    }
    let sequences: Vec<u64> = items.iter().map(FeedItem::sequence).collect();
    assert_eq!(sequences, (first..=last).collect::<Vec<_>>(), "no gap");
    assert!(matches!(&items[0], FeedItem::Event(e) if e.sequence == first));
    assert!(matches!(items.last(), Some(FeedItem::Event(e)) if e.sequence == last));
    for (item, (sequence, subject, reason, bytes)) in items[1..].iter().zip(&expected) {
        let FeedItem::Skipped(skipped) = item else {
            panic!("{sequence} was decoded");
        };
        assert_eq!(skipped.sequence, *sequence);
        assert_eq!(&skipped.subject, subject);
        assert_eq!(skipped.reason(), *reason, "{sequence}");
        assert_eq!(&skipped.payload[..], &bytes[..], "the raw bytes as stored");
        assert!(skipped.stored_at <= Utc::now());
    }

    // Readers that only act on events get the two events, nothing else.
    let mut feed = bus.feed(&[subject::EVENTS_ALL], 1).await.unwrap();
    let a = feed
        .next_within(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let b = feed
        .next_within(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((a.sequence, b.sequence), (first, last));

    // A second reading hands them over again but does not count them.
    let mut reread = bus.reread(&[subject::EVENTS_ALL], 1).await.unwrap();
    let mut skipped = 0;
    while let Some(item) = reread.next_item_within(Duration::from_secs(1)).await {
        if let FeedItem::Skipped(_) = item.unwrap() {
            skipped += 1;
        }
    }
    assert_eq!(skipped, expected.len());

    let text = metrics.render();
    for (_, _, reason, _) in &expected {
        // Two feeds read each of them.
        let line = format!(
            "lh_events_skipped_total{{service=\"bad-messages-test\",reason=\"{}\"}} 2",
            reason.as_str()
        );
        assert!(text.contains(&line), "{line} missing from\n{text}");
    }
}
