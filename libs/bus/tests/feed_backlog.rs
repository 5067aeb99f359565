//! A feed over a long backlog that its filters match in part, on a real
//! nats-server: it hands over exactly the matching messages, in order, the
//! last of them with nothing pending even when the log goes on with
//! messages it does not match, and then follows the log live.

use std::time::Duration;

use chrono::Utc;
use lh_bus::{Bus, BusConfig, FeedItem};
use lh_events::{fixtures, subject, Actor, Envelope, EventData};
use lh_testkit::Nats;
use uuid::Uuid;

/// Messages written before the feed opens: past the length from which a
/// feed may read a backlog whole.
const BACKLOG_MESSAGES: usize = 6_000;
/// One message in this many is on a lease (the feed's filter).
const MESSAGES_PER_LEASE_EVENT: usize = 4;
const READ_TIMEOUT: Duration = Duration::from_secs(10);

fn tenant_created() -> Envelope {
    Envelope::new(
        Actor::Admin,
        Utc::now(),
        EventData::TenantCreated(fixtures::tenant(Uuid::now_v7(), 8)),
    )
}

/// Acknowledgements a writer leaves outstanding: the client refuses more.
const MAX_ACKS_IN_FLIGHT: usize = 256;

/// Appends with many acknowledgements outstanding; the sequences stored.
async fn append_all(bus: &Bus, envelopes: &[Envelope]) -> Vec<u64> {
    let mut acks = std::collections::VecDeque::new();
    let mut sequences = Vec::new();
    for envelope in envelopes {
        acks.push_back(
            bus.jetstream()
                .publish(envelope.subject(), envelope.to_json().into())
                .await
                .unwrap(),
        );
        if acks.len() == MAX_ACKS_IN_FLIGHT {
            let ack = acks.pop_front().expect("one is outstanding");
            sequences.push(ack.await.unwrap().sequence);
        }
    }
    for ack in acks {
        sequences.push(ack.await.unwrap().sequence);
    }
    sequences
}

async fn next(feed: &mut lh_bus::Feed) -> FeedItem {
    feed.next_item_within(READ_TIMEOUT)
        .await
        .expect("the feed hands over a message in time")
        .expect("a stored message")
}

#[tokio::test]
async fn a_partly_matching_backlog_reads_as_its_filters_and_then_live() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "feed-backlog-test"))
        .await
        .unwrap();
    // The log ends on messages the filter does not match: only what
    // follows the last lease event tells that it was the last.
    let envelopes: Vec<Envelope> = (0..BACKLOG_MESSAGES)
        .map(|i| {
            if i % MESSAGES_PER_LEASE_EVENT == 1 {
                fixtures::stop_request()
            } else {
                tenant_created()
            }
        })
        .collect();
    let sequences = append_all(&bus, &envelopes).await;
    let expected: Vec<u64> = envelopes
        .iter()
        .zip(&sequences)
        .filter(|(e, _)| subject::matches(subject::LEASES_ALL, &e.subject()))
        .map(|(_, s)| *s)
        .collect();
    assert_eq!(expected.len(), BACKLOG_MESSAGES / MESSAGES_PER_LEASE_EVENT);

    let mut feed = bus.feed(&[subject::LEASES_ALL], 1).await.unwrap();
    let mut read = Vec::new();
    for (i, _) in expected.iter().enumerate() {
        let item = next(&mut feed).await;
        assert!(
            subject::matches(subject::LEASES_ALL, item.subject()),
            "{} is not on a lease",
            item.subject()
        );
        let last = i + 1 == expected.len();
        assert_eq!(
            item.pending() == 0,
            last,
            "pending {} at {} of {}",
            item.pending(),
            i + 1,
            expected.len()
        );
        read.push(item.sequence());
    }
    assert_eq!(read, expected, "the matching messages, in order, once each");

    // Live: a tenant's event is not handed over, the lease's is.
    let live = [tenant_created(), fixtures::stop_request(), tenant_created()];
    let live_sequences = append_all(&bus, &live).await;
    let item = next(&mut feed).await;
    assert_eq!(item.sequence(), live_sequences[1]);
    assert_eq!(item.pending(), 0);
    assert!(
        feed.next_item_within(Duration::from_millis(300))
            .await
            .is_none(),
        "nothing else is on a lease"
    );

    // A second reading from the middle of the backlog starts there.
    let middle = expected[expected.len() / 2];
    let mut reread = bus.reread(&[subject::LEASES_ALL], middle).await.unwrap();
    assert_eq!(next(&mut reread).await.sequence(), middle);
}
