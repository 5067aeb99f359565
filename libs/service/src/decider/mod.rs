//! The write side's one loop: follow the log, decide once caught up, append
//! with expectations, and on a conflict read what the other writer did and
//! decide again.
//!
//! A service implements a small [`Decider`]: a pure fold (`apply`) and a pure
//! `decide(now)` that returns decisions, each a list of events that must be
//! stored together or not at all, each guarded by an [`Expect`]. [`run`] owns
//! everything else, once for every service: the feed, the quiet window that
//! tells it has caught up, packing decisions into atomic batches, chaining
//! expectations across the batches of one pass, re-reading on a conflict,
//! and backing off when the log refuses a write for another reason. It is
//! the write-side twin of `lh_projection::run`.
//!
//! The loop is also where a node's clock stops being taken at its word:
//! each stored event reaches the fold with the times its node reported held
//! to when the log stored it ([`fold_stored`], by the rule of
//! `lh_events::node_time`), so every decider reads the same times.
//!
//! A stored message the service cannot decode is read all the same: it
//! counts towards catching up, and where it is the newest message on a
//! subject, a guard the decider sets on that subject (which only knows the
//! events it applied) is moved up to it, or every write there would
//! conflict forever.

use serde_json::value::RawValue;

mod snapshot;

use snapshot::{restore, store_snapshot, Snapshot};
pub use snapshot::{restored, snapshot_of, SNAPSHOT_FORMAT};
use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};
use lh_bus::{Bus, BusError, Expect, FeedItem, MAX_BATCH_MESSAGES};
use lh_domain::authority::Authority;
use lh_events::node_time::DEFAULT_NODE_CLOCK_SKEW_SECS;
use lh_events::Envelope;
use lh_telemetry::Readiness;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::clock::Clock;

/// Events that must be stored together, each with its guard.
pub type Batch = Vec<(Envelope, Expect)>;

/// Most subjects whose newest message is a skipped one that the loop keeps
/// track of; past it, writes to further such subjects conflict until an
/// event the service can decode lands there.
pub const MAX_SKIPPED_TAILS: usize = 10_000;

/// Most requests (correlation ids) whose newest trace context the loop
/// keeps, so that the events it decides for them continue their trace.
pub const MAX_TRACED_CORRELATIONS: usize = 4_096;

/// The newest `traceparent` read for each correlation id (the request an
/// event belongs to), the oldest forgotten first past
/// [`MAX_TRACED_CORRELATIONS`].
#[derive(Debug, Default)]
struct TraceParents {
    by_correlation: HashMap<uuid::Uuid, String>,
    order: std::collections::VecDeque<uuid::Uuid>,
}

impl TraceParents {
    fn read(&mut self, item: &FeedItem) {
        let FeedItem::Event(event) = item else {
            return;
        };
        let Some(trace_parent) = &event.trace_parent else {
            return;
        };
        let correlation = event.envelope.correlation_id;
        if self
            .by_correlation
            .insert(correlation, trace_parent.clone())
            .is_none()
        {
            self.order.push_back(correlation);
            if self.order.len() > MAX_TRACED_CORRELATIONS {
                if let Some(oldest) = self.order.pop_front() {
                    self.by_correlation.remove(&oldest);
                }
            }
        }
    }

    /// A span for appending `batch`, continuing the trace of the request
    /// its first event belongs to.
    fn span(&self, decider: &str, batch: &Batch) -> tracing::Span {
        let events: Vec<&str> = batch.iter().map(|(e, _)| e.event_type.as_str()).collect();
        let span = tracing::info_span!("lh.decide", decider, events = %events.join(","));
        let parent = batch
            .first()
            .and_then(|(e, _)| self.by_correlation.get(&e.correlation_id));
        lh_bus::continue_trace(&span, parent.map(String::as_str));
        span
    }
}

/// Aggregates whose newest message (as far as the fold has read) is one the
/// service skipped, with that message's sequence.
#[derive(Debug, Default)]
struct SkippedTails {
    sequences: HashMap<String, u64>,
}

impl SkippedTails {
    fn read(&mut self, item: &FeedItem) {
        // Keyed by aggregate: a guard covers everything stored below it.
        let Some(aggregate) = item.aggregate_subject() else {
            return;
        };
        match item {
            FeedItem::Skipped(skipped) => {
                if self.sequences.len() < MAX_SKIPPED_TAILS
                    || self.sequences.contains_key(aggregate)
                {
                    self.sequences
                        .insert(aggregate.to_string(), skipped.sequence);
                } else {
                    tracing::warn!(
                        subject = skipped.subject,
                        sequence = skipped.sequence,
                        limit = MAX_SKIPPED_TAILS,
                        "too many subjects end in a skipped message; not guarding past this one"
                    );
                }
            }
            FeedItem::Event(_) => {
                if !self.sequences.is_empty() {
                    self.sequences.remove(aggregate);
                }
            }
        }
    }

    /// The guard a write to `subject` needs, given the one its decider set.
    fn guard(&self, subject: &str, expect: Expect) -> Expect {
        match (expect, self.sequences.get(subject)) {
            (Expect::LastSubjectSequence(seen), Some(&skipped)) if skipped > seen => {
                Expect::LastSubjectSequence(skipped)
            }
            _ => expect,
        }
    }
}

/// Events read between snapshots, at most.
pub const SNAPSHOT_EVERY_EVENTS: u64 = 100_000;
/// Time between snapshots, at most, while events come.
pub const SNAPSHOT_EVERY: Duration = Duration::from_secs(3600);

/// How a decider's loop is paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// A feed silent this long has delivered everything there is.
    pub quiet: Duration,
    /// Decide at least this often once caught up, even when nothing new
    /// arrived (deadlines pass, prices are due).
    pub tick: Duration,
    /// First wait after a write the log refused for a reason other than a
    /// conflict; it doubles on each further refusal, up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// A snapshot is written once caught up when this many events were read
    /// since the last one, or `snapshot_every` has passed and any was.
    pub snapshot_every_events: u64,
    pub snapshot_every: Duration,
}

impl Default for Pace {
    fn default() -> Self {
        Self {
            quiet: Duration::from_millis(100),
            tick: Duration::from_secs(1),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
            snapshot_every_events: SNAPSHOT_EVERY_EVENTS,
            snapshot_every: SNAPSHOT_EVERY,
        }
    }
}

/// A service's write-side logic, without I/O.
pub trait Decider: Send {
    /// What else than the log a decider hears (heartbeats, a workload's
    /// exit, a GPU's sample); `std::convert::Infallible` when nothing.
    type Signal: Send;

    /// Names the decider in logs and metrics (the service's name).
    fn name(&self) -> &'static str;

    /// Subjects the fold follows.
    fn filters(&self) -> &[&'static str];

    fn pace(&self) -> Pace {
        Pace::default()
    }

    /// Folds one stored event. The decider's own events are applied as soon
    /// as they are stored and the feed delivers them again later, so
    /// applying an event twice must change nothing.
    fn apply(&mut self, sequence: u64, envelope: &Envelope);

    /// Folds one stored event with the time the server stored it (by the
    /// server's clock), its node's times already held to that
    /// ([`fold_stored`]); by default [`Decider::apply`].
    fn apply_stored(&mut self, sequence: u64, _stored_at: DateTime<Utc>, envelope: &Envelope) {
        self.apply(sequence, envelope);
    }

    /// How far a node's clock may be from the log server's: the times a
    /// node reports in a stored event reach [`Decider::apply_stored`] held
    /// to within this of when the log stored it
    /// ([`Envelope::held_to_the_log`]). `None` for a decider that reads no
    /// node's times: it gets events as stored, and says nothing of a node
    /// whose clock is off.
    fn node_clock_skew(&self) -> Option<chrono::Duration> {
        Some(chrono::Duration::seconds(DEFAULT_NODE_CLOCK_SKEW_SECS))
    }

    /// Folds one signal; true when it calls for deciding again. Signals are
    /// read only once the fold has first caught up with the log, so that
    /// they are judged against what the log says (until then they wait in
    /// their source).
    fn signal(&mut self, _signal: Self::Signal, _now: DateTime<Utc>) -> bool {
        false
    }

    /// What to append now: decisions in order, each stored atomically. An
    /// [`Expect::LastSubjectSequence`] on a subject that an earlier batch of
    /// the same pass wrote is replaced by the sequence that write got.
    fn decide(&mut self, now: DateTime<Utc>) -> Vec<Batch>;

    /// Whether `more` can be folded into `first`, two events of one batch on
    /// the same subject (one subject is written at most once per atomic
    /// batch). False keeps them in separate batches.
    fn can_merge(&self, _first: &Envelope, _more: &Envelope) -> bool {
        false
    }

    /// Folds `more` into `first`; called only where [`Decider::can_merge`]
    /// said yes.
    fn merge(&self, _first: &mut Envelope, _more: &Envelope) {}

    /// Told of every batch once it is stored (for metrics and logs).
    fn appended(&mut self, _batch: &Batch) {}

    /// The folded state to keep in a snapshot, so that a start replays only
    /// the log after it (docs/adr/011); `None` (the default): this decider
    /// replays the log at every start. Only what the log says belongs in
    /// it, not what this process heard or when it started. Written as
    /// JSON text ([`snapshot_of`]), not a `serde_json::Value`: a tree of
    /// values costs several times the state's own memory, and a large
    /// state's snapshot would set the service's high-water mark.
    fn snapshot(&self) -> Option<Box<RawValue>> {
        None
    }

    /// Takes back the state of [`Decider::snapshot`]; false when it cannot
    /// (written by code of another shape), and the log is replayed.
    fn restore(&mut self, _state: &RawValue) -> bool {
        false
    }

    /// The object its snapshots are stored under: one per decider whose
    /// state is the same in every replica.
    fn snapshot_key(&self) -> String {
        self.name().to_string()
    }
}

/// Folds one stored event into `decider` as the loop does: the times its
/// node reported held to when the log stored it, by the decider's
/// [`Decider::node_clock_skew`], so that no decider takes a node's clock
/// at its word nor holds it by a rule of its own.
pub fn fold_stored<D: Decider + ?Sized>(
    decider: &mut D,
    sequence: u64,
    stored_at: DateTime<Utc>,
    envelope: &Envelope,
) {
    let Some(skew) = decider.node_clock_skew() else {
        return decider.apply_stored(sequence, stored_at, envelope);
    };
    let held = envelope.held_to_the_log(stored_at, skew);
    if let Cow::Owned(_) = held {
        tracing::warn!(decider = decider.name(), event = envelope.data.event_type(),
            subject = envelope.data.aggregate_subject(), %stored_at,
            "a node's timestamp is off the log's clock by more than the skew allowed; held to it");
    }
    decider.apply_stored(sequence, stored_at, &held);
}

/// `item` as the decider must take it: an event's node times held to the
/// log (by [`Decider::node_clock_skew`]) and judged by the one authority
/// rule (`lh_domain::authority`), which steps over what its publisher may
/// not write now as it steps over what does not decode.
fn judged<D: Decider + ?Sized>(authority: &mut Authority, decider: &D, item: FeedItem) -> FeedItem {
    let FeedItem::Event(mut event) = item else {
        return item;
    };
    let skew = decider.node_clock_skew();
    match authority.admit_stored(&event.envelope, event.stored_at, skew) {
        Ok(Cow::Borrowed(_)) => FeedItem::Event(event),
        Ok(Cow::Owned(taken)) => {
            if taken.data != event.envelope.data || taken.occurred_at != event.envelope.occurred_at
            {
                tracing::warn!(decider = decider.name(), event = event.envelope.data.event_type(),
                    subject = event.subject, stored_at = %event.stored_at,
                    "a node's timestamp is off the log's clock by more than the skew allowed, or out of order; held to it");
            }
            event.envelope = taken;
            FeedItem::Event(event)
        }
        Err(why) => FeedItem::Skipped(event.refused(decider.name(), why.reason, why.detail)),
    }
}

/// Runs `decider` until `shutdown`: see the module's documentation.
/// `readiness` turns true once the fold first reaches the head of the log.
pub async fn run<D: Decider>(
    bus: &Bus,
    decider: &mut D,
    clock: &dyn Clock,
    shutdown: CancellationToken,
    readiness: Readiness,
) -> anyhow::Result<()> {
    run_with_signals(
        bus,
        decider,
        clock,
        shutdown,
        readiness,
        futures::stream::pending(),
    )
    .await
}

/// [`run`], with a stream of signals besides the log.
pub async fn run_with_signals<D: Decider>(
    bus: &Bus,
    decider: &mut D,
    clock: &dyn Clock,
    shutdown: CancellationToken,
    readiness: Readiness,
    signals: impl Stream<Item = D::Signal>,
) -> anyhow::Result<()> {
    let mut signals = std::pin::pin!(signals);
    let mut caught_up_once = false;
    let pace = decider.pace();
    let (from, mut skipped_tails, mut authority) = restore(bus, decider).await;
    let mut trace_parents = TraceParents::default();
    let mut feed = bus.feed(decider.filters(), from).await?;
    let mut read_sequence = from - 1;
    let mut unsnapshotted_events = 0u64;
    let mut snapshot_at = tokio::time::Instant::now();
    let mut storing: Option<tokio::task::JoinHandle<()>> = None;
    let mut tick = tokio::time::interval(pace.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut caught_up = false;
    let mut dirty = true;
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut backoff = pace.backoff_min;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            next = feed.next_item_within(pace.quiet) => match next {
                Some(item) => {
                    let item = judged(&mut authority, decider, item?);
                    skipped_tails.read(&item);
                    trace_parents.read(&item);
                    read_sequence = read_sequence.max(item.sequence());
                    unsnapshotted_events += 1;
                    // A skipped message changes no state but is read all
                    // the same: being last, it leaves the fold caught up.
                    if let FeedItem::Event(event) = &item {
                        // Held to the log and judged already.
                        decider.apply_stored(event.sequence, event.stored_at, &event.envelope);
                        dirty = true;
                    }
                    caught_up = item.pending() == 0;
                }
                // A quiet spell is not the head by itself: a slow server
                // can pause a long replay for longer than that. Ask the log.
                None => {
                    if !caught_up {
                        caught_up = bus
                            .last_sequence_matching(decider.filters())
                            .await
                            .is_ok_and(|head| head <= read_sequence);
                    }
                }
            },
            _ = tick.tick() => dirty = true,
            Some(signal) = signals.next(), if caught_up_once => {
                if decider.signal(signal, clock.now()) {
                    dirty = true;
                }
            }
        }
        caught_up_once |= caught_up;
        // Without a connection nothing can be appended: not ready until it
        // is back (the feed and the client resume by themselves).
        let connected = bus.is_connected();
        if !connected && readiness.is_ready() {
            tracing::warn!(decider = decider.name(), "lost the event log; not ready");
            readiness.set(false);
        }
        if !caught_up || !dirty || retry_at.is_some_and(|t| tokio::time::Instant::now() < t) {
            continue;
        }
        if connected && !readiness.is_ready() {
            tracing::info!(decider = decider.name(), "caught up with the log");
            readiness.set(true);
        }
        dirty = false;
        match append_pass(bus, decider, &skipped_tails, &trace_parents, clock.now()).await {
            Pass::Done => {
                retry_at = None;
                backoff = pace.backoff_min;
                let due = unsnapshotted_events >= pace.snapshot_every_events
                    || (unsnapshotted_events > 0 && snapshot_at.elapsed() >= pace.snapshot_every);
                if due && storing.as_ref().is_none_or(|s| s.is_finished()) {
                    if let Some(state) = decider.snapshot() {
                        storing = Some(store_snapshot(
                            bus,
                            decider,
                            Snapshot {
                                format: SNAPSHOT_FORMAT,
                                sequence: read_sequence,
                                filters: decider.filters().iter().map(|f| f.to_string()).collect(),
                                skipped_tails: skipped_tails.sequences.clone(),
                                authority: authority.clone(),
                                state,
                            },
                        ));
                    }
                    unsnapshotted_events = 0;
                    snapshot_at = tokio::time::Instant::now();
                }
            }
            Pass::Conflict(why) => {
                metrics::counter!("lh_decision_conflicts_total", "decider" => decider.name())
                    .increment(1);
                tracing::debug!(decider = decider.name(), %why, "lost a race; re-reading the log");
                caught_up = false;
                dirty = true;
            }
            Pass::Refused(e) => {
                tracing::warn!(decider = decider.name(), error = %e, retry_in_ms = backoff.as_millis() as u64,
                    "cannot append decisions; will retry");
                retry_at = Some(tokio::time::Instant::now() + backoff);
                backoff = (backoff * 2).min(pace.backoff_max);
                dirty = true;
            }
        }
    }
}

enum Pass {
    Done,
    /// Another writer got there first (or already wrote the same events):
    /// what it wrote must be read before deciding again.
    Conflict(String),
    Refused(BusError),
}

async fn append_pass<D: Decider>(
    bus: &Bus,
    decider: &mut D,
    skipped_tails: &SkippedTails,
    trace_parents: &TraceParents,
    now: DateTime<Utc>,
) -> Pass {
    let decisions = decider.decide(now);
    let batches = pack(
        decisions,
        |first, more| decider.can_merge(first, more),
        |first, more| decider.merge(first, more),
    );
    // subject -> the sequence this pass's last write to it got
    let mut written: HashMap<String, u64> = HashMap::new();
    for mut batch in batches {
        for (envelope, expect) in batch.iter_mut() {
            if let Expect::LastSubjectSequence(_) = expect {
                let subject = envelope.data.aggregate_subject();
                *expect = match written.get(&subject) {
                    Some(&sequence) => Expect::LastSubjectSequence(sequence),
                    None => skipped_tails.guard(&subject, *expect),
                };
            }
        }
        // Where nothing in a batch is guarded, no decision depends on where
        // its events landed: one the log holds already is as good as stored.
        let no_guard = unguarded(&batch);
        let span = trace_parents.span(decider.name(), &batch);
        match bus.publish_atomic(&batch).instrument(span.clone()).await {
            Ok(appended) if appended.duplicate && no_guard => decider.appended(&batch),
            Ok(appended) if appended.duplicate => {
                return Pass::Conflict("the log already holds these events".into())
            }
            Ok(appended) => {
                // Apply our own events at once so the rest of the pass and
                // the next one see them; the feed repeats them harmlessly.
                let first = appended.sequence + 1 - batch.len() as u64;
                for (i, (envelope, _)) in batch.iter().enumerate() {
                    let sequence = first + i as u64;
                    written.insert(envelope.data.aggregate_subject(), sequence);
                    decider.apply(sequence, envelope);
                }
                decider.appended(&batch);
            }
            Err(BusError::DuplicateBatch(_)) if no_guard => {
                // Some of its events are stored already (an observation made
                // twice, or a stop that another writer asked for first): the
                // batch as a whole never will be, so the rest go one by one.
                for (envelope, expect) in &batch {
                    match bus
                        .publish(envelope, *expect)
                        .instrument(span.clone())
                        .await
                    {
                        Ok(appended) if !appended.duplicate => {
                            written.insert(envelope.data.aggregate_subject(), appended.sequence);
                            decider.apply(appended.sequence, envelope);
                        }
                        Ok(_) => {}
                        Err(e) => return Pass::Refused(e),
                    }
                }
                decider.appended(&batch);
            }
            Err(BusError::Conflict(why)) | Err(BusError::DuplicateBatch(why)) => {
                return Pass::Conflict(why)
            }
            Err(e) => return Pass::Refused(e),
        }
    }
    Pass::Done
}

/// Whether no message of `batch` carries a guard.
fn unguarded(batch: &Batch) -> bool {
    batch.iter().all(|(_, expect)| *expect == Expect::Any)
}

/// Packs decisions, in order, into as few atomic batches as the rules allow:
/// at most [`MAX_BATCH_MESSAGES`] messages, each subject written once per
/// batch (a second write expects the sequence of the first, known only once
/// that is stored), except where `merge` folds a message into the one
/// already there (where `can_merge` allows). A decision is never split
/// across batches, and decisions without any guard are never packed with
/// guarded ones: the log may already hold an unguarded event (a repeat),
/// and its refusal must not hold a guarded decision back.
pub fn pack(
    decisions: Vec<Batch>,
    can_merge: impl Fn(&Envelope, &Envelope) -> bool,
    merge: impl Fn(&mut Envelope, &Envelope),
) -> Vec<Batch> {
    let mut out: Vec<Batch> = Vec::new();
    // subject -> index of its message in the current batch
    let mut subjects: HashMap<String, usize> = HashMap::new();
    for decision in decisions {
        let fits = out.last().is_some_and(|batch| {
            unguarded(batch) == unguarded(&decision)
                && batch.len() + decision.len() <= MAX_BATCH_MESSAGES
                && decision.iter().all(|(envelope, _)| {
                    match subjects.get(&envelope.data.aggregate_subject()) {
                        None => true,
                        Some(&at) => can_merge(&batch[at].0, envelope),
                    }
                })
        });
        if !fits {
            out.push(Vec::new());
            subjects.clear();
        }
        let batch = out.last_mut().expect("a batch");
        for (envelope, expect) in decision {
            let subject = envelope.data.aggregate_subject();
            match subjects.get(&subject) {
                Some(&at) if can_merge(&batch[at].0, &envelope) => {
                    merge(&mut batch[at].0, &envelope)
                }
                _ => {
                    subjects.insert(subject, batch.len());
                    batch.push((envelope, expect));
                }
            }
        }
    }
    out
}

/// A whole service made of one decider: its health server on `http_addr`
/// (ready once the fold has caught up) and [`run_with_signals`] on the
/// system clock until `shutdown`.
pub async fn serve<D>(
    http_addr: &str,
    bus: Bus,
    decider: D,
    signals: impl Stream<Item = D::Signal> + Send + 'static,
    shutdown: CancellationToken,
) -> anyhow::Result<crate::Running>
where
    D: Decider + 'static,
{
    let readiness = Readiness::default();
    let ready = readiness.clone();
    let stop = shutdown.clone();
    // A decider's state and its loop's future can be large (the scheduler's
    // fleet); on the heap they stay off the stacks of the caller's tasks.
    let mut decider = Box::new(decider);
    let work = Box::pin(async move {
        let clock = crate::clock::SystemClock;
        run_with_signals(&bus, decider.as_mut(), &clock, stop, ready, signals).await
    });
    crate::Running::spawn(http_addr, axum::Router::new(), readiness, shutdown, work).await
}
