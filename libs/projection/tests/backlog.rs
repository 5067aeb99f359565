//! The projection loop over a backlog of several transactions, on a real
//! nats-server and a real PostgreSQL: a replay stopped part way and started
//! again reads on from what it committed and leaves the rows of one whole
//! replay; a live runner catching up, stopped and started again, applies
//! each event once, in large transactions, and at the head commits each
//! event as it comes; one slower than the log takes what its feed read
//! ahead in one transaction, each event still traced on its own.

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{cordon, log_and_database, schema, spawn_run, Recorder};
use lh_bus::{Bus, Expect};
use lh_projection::MAX_EVENTS_PER_TRANSACTION;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// Events on the log: three full transactions and part of a fourth.
const BACKLOG_EVENTS: usize = 3 * MAX_EVENTS_PER_TRANSACTION + 100;
/// Acknowledgements a writer leaves outstanding: the client refuses more.
const MAX_ACKS_IN_FLIGHT: usize = 256;
const WAIT: Duration = Duration::from_secs(60);

/// Appends `n` events with many acknowledgements outstanding; the head.
async fn append_backlog(bus: &Bus, n: usize) -> u64 {
    let mut acks = VecDeque::new();
    let mut head = 0;
    for i in 0..n {
        let e = cordon(i);
        acks.push_back(
            bus.jetstream()
                .publish(e.subject(), e.to_json().into())
                .await
                .unwrap(),
        );
        if acks.len() == MAX_ACKS_IN_FLIGHT {
            head = acks.pop_front().unwrap().await.unwrap().sequence;
        }
    }
    for ack in acks {
        head = ack.await.unwrap().sequence;
    }
    head
}

/// The sequences applied, in order, and how many rows there are.
async fn applied(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT sequence FROM applied ORDER BY sequence")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_stopped_part_way_reads_on_to_the_rows_of_a_whole_one() {
    let (_nats, bus, url) = log_and_database().await;
    let head = append_backlog(&bus, BACKLOG_EVENTS).await;
    let recorder = Recorder::new();

    let whole = schema(&url, "whole").await;
    let reached = lh_projection::replay(&bus, &whole, &recorder, |_, _| {})
        .await
        .unwrap();
    assert_eq!(reached, head);

    // Stopped (its future dropped) once its first transaction committed.
    let parted = schema(&url, "parted").await;
    let (first_done, first_committed) = tokio::sync::oneshot::channel();
    let mut first_done = Some(first_done);
    let mut told = 0;
    tokio::select! {
        _ = lh_projection::replay(&bus, &parted, &recorder, |_, _| {
            told += 1;
            if told == MAX_EVENTS_PER_TRANSACTION {
                let _ = first_done.take().expect("told once").send(());
            }
        }) => panic!("the replay ended before it was stopped"),
        _ = first_committed => {}
    }
    let committed = lh_projection::committed_sequence(&parted, "recorder")
        .await
        .unwrap();
    assert!(committed > 0 && committed < head, "stopped at {committed}");
    assert_eq!(applied(&parted).await.len() as u64, committed);

    let mut rest = 0;
    let reached = lh_projection::replay(&bus, &parted, &recorder, |_, _| rest += 1)
        .await
        .unwrap();
    assert_eq!(reached, head);
    assert_eq!(
        rest,
        head - committed,
        "it reads on after what it committed"
    );
    let rows = applied(&parted).await;
    assert_eq!(rows, applied(&whole).await);
    assert_eq!(
        rows,
        (1..=head as i64).collect::<Vec<_>>(),
        "each event once"
    );
}

/// Events each transaction applied, by the sequence of its first event.
async fn transactions(pool: &PgPool) -> Vec<(i64, i64)> {
    sqlx::query_as("SELECT min(sequence), count(*) FROM applied GROUP BY transaction_id ORDER BY 1")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_runner_catches_up_in_large_transactions_each_event_once() {
    let (_nats, bus, url) = log_and_database().await;
    let head = append_backlog(&bus, BACKLOG_EVENTS).await;
    let pool = schema(&url, "live").await;

    // Stalled part way through the backlog and stopped, then started again.
    let stop = CancellationToken::new();
    let failing = Recorder {
        fails_from: MAX_EVENTS_PER_TRANSACTION as u64 + 1,
        ..Recorder::new()
    };
    let (mut progress, task) = spawn_run(&bus, &pool, failing, &stop).await;
    tokio::time::timeout(WAIT, async {
        while !progress.stalled() {
            progress.stalled_changed().await;
        }
    })
    .await
    .expect("it stalls where events fail");
    stop.cancel();
    task.await.unwrap().unwrap();
    let stopped_at = progress.applied();
    assert!(
        stopped_at > 0 && stopped_at < head,
        "stopped at {stopped_at} of {head}"
    );

    let stop = CancellationToken::new();
    let (progress, task) = spawn_run(&bus, &pool, Recorder::new(), &stop).await;
    assert!(progress.wait_for(head, WAIT).await, "caught up");
    assert!(progress.wait_caught_up(WAIT).await);
    let rows = applied(&pool).await;
    assert_eq!(
        rows,
        (1..=head as i64).collect::<Vec<_>>(),
        "each event once"
    );
    let largest = transactions(&pool).await.iter().map(|t| t.1).max();
    // A live runner used to commit a backlog 256 events at a time.
    assert!(largest > Some(256), "largest transaction: {largest:?}");

    // At the head each event is committed as it comes.
    for i in 0..3 {
        let sequence = bus.publish(&cordon(i), Expect::Any).await.unwrap().sequence;
        assert!(progress.wait_for(sequence, WAIT).await);
    }
    let newest = transactions(&pool).await;
    assert!(
        newest[newest.len() - 3..].iter().all(|t| t.1 == 1),
        "{newest:?}"
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// How long a slow recorder takes per transaction: slower than
/// the log is written.
const SLOW_TRANSACTION: Duration = Duration::from_millis(100);
/// Events written one at a time, this far apart, to a slow projection.
const TRICKLE_EVENTS: usize = 40;
const TRICKLE_EVERY: Duration = Duration::from_millis(10);

/// A recorder slower than the log is written.
fn slow() -> Recorder {
    Recorder {
        delay_per_call: SLOW_TRANSACTION,
        ..Recorder::new()
    }
}

/// The sequences of the `lh.project` spans opened: each event applied in
/// the trace of the request that wrote it.
#[derive(Clone, Default)]
struct ProjectSpans(Arc<Mutex<Vec<u64>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ProjectSpans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Sequence(Option<u64>);
        impl tracing::field::Visit for Sequence {
            fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
                if field.name() == "sequence" {
                    self.0 = Some(value);
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        if attrs.metadata().name() != "lh.project" {
            return;
        }
        let mut sequence = Sequence(None);
        attrs.record(&mut sequence);
        self.0.lock().unwrap().extend(sequence.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_slower_than_the_log_takes_what_its_feed_read_ahead() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let spans = ProjectSpans::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(spans.clone()))
        .expect("the only subscriber");
    let (_nats, bus, url) = log_and_database().await;
    let pool = schema(&url, "slow").await;
    let stop = CancellationToken::new();
    let (progress, task) = spawn_run(&bus, &pool, slow(), &stop).await;
    // Each event is the log's last when the feed reads it: nothing is
    // pending after it, yet the runner is still busy with an earlier one.
    let mut last = 0;
    for i in 0..TRICKLE_EVENTS {
        last = bus.publish(&cordon(i), Expect::Any).await.unwrap().sequence;
        tokio::time::sleep(TRICKLE_EVERY).await;
    }
    assert!(progress.wait_for(last, WAIT).await);
    assert_eq!(applied(&pool).await.len(), TRICKLE_EVENTS);
    let taken = transactions(&pool).await.len();
    assert!(
        taken <= TRICKLE_EVENTS / 4,
        "{TRICKLE_EVENTS} events in {taken} transactions"
    );
    // A transaction of a few events still reads as each one's own trace.
    let mut traced = spans.0.lock().unwrap().clone();
    traced.sort();
    traced.dedup();
    let applied: Vec<u64> = applied(&pool).await.iter().map(|s| *s as u64).collect();
    assert_eq!(traced, applied, "an lh.project span for each event");
    stop.cancel();
    task.await.unwrap().unwrap();
}
