//! A feed over a long backlog that its filters match in part, on a real
//! nats-server: it hands over exactly the matching messages, in order, the
//! last of them with nothing pending even when the log goes on with
//! messages it does not match, and then follows the log live; at the head
//! it reads the log whole while its filters match often, and through its
//! filters once they match seldom. A backlog that several filters match is
//! read one consumer a filter, merged in stream order.

use std::time::Duration;

use chrono::Utc;
use lh_bus::{Bus, BusConfig, FeedItem, MAX_BATCH_MESSAGES};
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

/// The backlog: one lease event in [`MESSAGES_PER_LEASE_EVENT`], the
/// rest tenants, ending on messages the feed's filter does not match.
fn backlog() -> Vec<Envelope> {
    (0..BACKLOG_MESSAGES)
        .map(|i| {
            if i % MESSAGES_PER_LEASE_EVENT == 1 {
                fixtures::stop_request()
            } else {
                tenant_created()
            }
        })
        .collect()
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

/// Appends a lease's event between two tenants' at the head: the feed
/// (of leases, and of what no tenant's event is on) hands over the lease's
/// alone, with nothing pending after it.
async fn hands_over_the_lease_alone(bus: &Bus, feed: &mut lh_bus::Feed) {
    let live = [tenant_created(), fixtures::stop_request(), tenant_created()];
    let stored = append_all(bus, &live).await;
    let item = next(feed).await;
    assert_eq!(item.sequence(), stored[1]);
    assert_eq!(item.pending(), 0);
    assert!(
        feed.next_item_within(Duration::from_millis(300))
            .await
            .is_none(),
        "nothing else is on what the feed reads"
    );
}

#[tokio::test]
async fn a_partly_matching_backlog_reads_as_its_filters_and_then_live() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "feed-backlog-test"))
        .await
        .unwrap();
    // The log ends on messages the filter does not match: only what
    // follows the last lease event tells that it was the last.
    let envelopes = backlog();
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
    hands_over_the_lease_alone(&bus, &mut feed).await;

    // A second reading from the middle of the backlog starts there.
    let middle = expected[expected.len() / 2];
    let mut reread = bus.reread(&[subject::LEASES_ALL], middle).await.unwrap();
    assert_eq!(next(&mut reread).await.sequence(), middle);
}

/// Messages the filter does not match, more than a feed at the head counts
/// before it reconsiders how it reads.
const SPARSE_MESSAGES: usize = 34_000;

/// Appends `n` events of tenants, in atomic batches: the server makes each
/// batch durable at once rather than each event.
async fn append_others(bus: &Bus, n: usize) {
    let mut left = n;
    while left > 0 {
        let batch: Vec<(Envelope, lh_bus::Expect)> = (0..left.min(MAX_BATCH_MESSAGES))
            .map(|_| (tenant_created(), lh_bus::Expect::Any))
            .collect();
        bus.publish_atomic(&batch).await.unwrap();
        left -= batch.len();
    }
}

/// The subjects the feeds' consumers on the log filter, each sorted: what
/// the server is asked to do for each feed.
async fn consumer_filters(bus: &Bus) -> Vec<Vec<String>> {
    use futures::StreamExt as _;
    let stream = bus
        .jetstream()
        .get_stream(subject::EVENTS_STREAM)
        .await
        .unwrap();
    let mut consumers = stream.consumers();
    let mut filters = Vec::new();
    while let Some(info) = consumers.next().await {
        let config = info.unwrap().config;
        let mut subjects = config.filter_subjects;
        if !config.filter_subject.is_empty() {
            subjects.push(config.filter_subject);
        }
        subjects.sort();
        filters.push(subjects);
    }
    filters
}

/// Waits until a consumer on the log filters `subjects` (one the feed left
/// lingers until the server finds it idle).
async fn wait_for_consumer(bus: &Bus, subjects: &[&str]) {
    let wanted: Vec<String> = subjects.iter().map(|s| s.to_string()).collect();
    let deadline = tokio::time::Instant::now() + READ_TIMEOUT;
    loop {
        let filters = consumer_filters(bus).await;
        if filters.contains(&wanted) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "consumers filter {filters:?}, not {wanted:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_head_a_feed_reads_whole_while_its_filters_match_often() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "feed-head-test"))
        .await
        .unwrap();
    let envelopes = backlog();
    append_all(&bus, &envelopes).await;
    let head = bus.last_sequence().await.unwrap();

    // Opened at the head: the newest messages match often, so the server
    // is not asked to filter (it would look through every subject of the
    // block for each match).
    let mut feed = bus.feed(&[subject::LEASES_ALL], head + 1).await.unwrap();
    assert_eq!(
        consumer_filters(&bus).await,
        [[subject::EVENTS_ALL.to_string()]]
    );
    let live = append_all(&bus, &[fixtures::stop_request(), tenant_created()]).await;
    let item = next(&mut feed).await;
    assert_eq!(item.sequence(), live[0]);
    assert_eq!(item.pending(), 0, "nothing on a lease follows it");

    // The log goes on with messages the filter seldom matches: once it
    // has read enough of them to tell, the feed asks the server to filter.
    append_others(&bus, SPARSE_MESSAGES).await;
    let last = append_all(&bus, &[fixtures::stop_request()]).await;
    let item = next(&mut feed).await;
    assert_eq!(
        item.sequence(),
        last[0],
        "the tenants' events are not handed over"
    );
    assert_eq!(item.pending(), 0);
    wait_for_consumer(&bus, &[subject::LEASES_ALL]).await;
    let again = append_all(&bus, &[tenant_created(), fixtures::stop_request()]).await;
    assert_eq!(next(&mut feed).await.sequence(), again[1]);
}

/// A node's registration: on a node's subject.
fn node_registered(i: usize) -> Envelope {
    fixtures::by_owner(EventData::NodeRegistered(fixtures::node(
        &format!("node-{}", i % 50),
        "cn-north-1a",
        8,
        "A100-40GB",
        40,
    )))
}

/// Each of the feed's filters matches one message in this many.
const MESSAGES_PER_MATCH_OF_EACH: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_several_filters_is_read_one_consumer_each_merged_in_order() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "feed-merged-test"))
        .await
        .unwrap();
    // Leases and nodes interleaved with tenants, ending on a tenant.
    let envelopes: Vec<Envelope> = (0..BACKLOG_MESSAGES + 3_000)
        .map(|i| match i % MESSAGES_PER_MATCH_OF_EACH {
            0 => fixtures::stop_request(),
            3 => node_registered(i),
            _ => tenant_created(),
        })
        .collect();
    let filters = [subject::LEASES_ALL, subject::NODES_ALL];
    let wanted = |e: &Envelope| filters.iter().any(|f| subject::matches(f, &e.subject()));
    let sequences = append_all(&bus, &envelopes).await;
    let mut expected: Vec<u64> = envelopes
        .iter()
        .zip(&sequences)
        .filter(|(e, _)| wanted(e))
        .map(|(_, s)| *s)
        .collect();
    assert_eq!(expected.len(), 3_000);

    let mut feed = bus.feed(&filters, 1).await.unwrap();
    // One consumer a filter: nats-server walks its blocks for one filter
    // fast, for several slowly.
    let mut lanes = consumer_filters(&bus).await;
    lanes.sort();
    assert_eq!(
        lanes,
        [
            [subject::LEASES_ALL.to_string()],
            [subject::NODES_ALL.to_string()]
        ]
    );

    let mut read = Vec::new();
    let in_backlog = expected.len();
    for i in 0..in_backlog {
        if i == in_backlog / 2 {
            // Stored while the backlog is read: past where the merge
            // stops, handed over after it by the feed's next consumer.
            // The first of them, right after where the merge stops,
            // matches: a read on from the wrong place would miss it.
            let more = [
                node_registered(7),
                tenant_created(),
                fixtures::stop_request(),
                tenant_created(),
            ];
            let stored = append_all(&bus, &more).await;
            assert_eq!(stored[0], sequences.last().unwrap() + 1);
            expected.extend([stored[0], stored[2]]);
        }
        let item = next(&mut feed).await;
        assert!(
            filters.iter().any(|f| subject::matches(f, item.subject())),
            "{} is not on a lease or a node",
            item.subject()
        );
        // The last of the backlog may say nothing follows: its consumer
        // read it, with what was pending then, before the messages stored
        // during the merge.
        if i + 1 < in_backlog {
            assert!(item.pending() > 0, "more follow {}", item.sequence());
        }
        read.push(item.sequence());
    }
    for _ in 0..2 {
        let item = next(&mut feed).await;
        read.push(item.sequence());
        if read.len() == expected.len() {
            assert_eq!(item.pending(), 0, "nothing follows the last one");
        }
    }
    let first_difference = read.iter().zip(&expected).position(|(r, e)| r != e);
    assert!(
        read == expected,
        "the matching messages, in order, once each: {} read, {} expected, first differing at {first_difference:?}: {:?} against {:?}",
        read.len(),
        expected.len(),
        first_difference.map(|i| &read[i.saturating_sub(2)..(i + 3).min(read.len())]),
        first_difference.map(|i| &expected[i.saturating_sub(2)..(i + 3).min(expected.len())]),
    );

    // Then live, through one consumer.
    hands_over_the_lease_alone(&bus, &mut feed).await;

    // A second reading from the middle starts there.
    let middle = expected[expected.len() / 3];
    let mut reread = bus.reread(&filters, middle).await.unwrap();
    assert_eq!(next(&mut reread).await.sequence(), middle);
    assert_eq!(
        next(&mut reread).await.sequence(),
        expected[expected.len() / 3 + 1]
    );
}

#[tokio::test]
async fn a_feed_of_overlapping_filters_is_refused() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "feed-overlap-test"))
        .await
        .unwrap();
    let refused = bus
        .feed(&[subject::LEASES_ALL, "lh.evt.lease.*.ended.>"], 1)
        .await
        .err()
        .expect("overlapping filters are refused");
    assert!(refused.to_string().contains("may not overlap"), "{refused}");
}
