//! How a feed reads the stream: which consumer it opens (through the
//! filters, the whole stream filtered here, or one per filter merged), and
//! the pump that hands messages over in order, reopening after a lost
//! connection or a new leader and switching consumers at the head as the
//! filters match more or less often.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{
    self,
    consumer::{pull::OrderedConfig, DeliverPolicy},
};
use futures::StreamExt;
use lh_events::subject;

use super::merged;
use super::message::FeedMessage;
use crate::error::{js_err, BusError, Result};
use crate::streams::last_sequence_on_filter;

/// What a feed's consumer delivers: a message, with how many of the
/// feed's filters follow it where a merged read counts them for it (its own
/// metadata counts those of one filter), or why the consumer is lost.
type MessageStream = std::pin::Pin<
    Box<
        dyn futures::Stream<Item = std::result::Result<(jetstream::Message, Option<u64>), String>>
            + Send,
    >,
>;

/// A consumer's messages as a feed reads them.
fn delivered(messages: async_nats::jetstream::consumer::pull::Ordered) -> MessageStream {
    Box::pin(messages.map(|m| m.map(|m| (m, None)).map_err(|e| e.to_string())))
}

/// Where a feed's consumer starts: the stream's first message for 1 (or 0).
fn deliver_from(from_sequence: u64) -> DeliverPolicy {
    if from_sequence <= 1 {
        DeliverPolicy::All
    } else {
        DeliverPolicy::ByStartSequence {
            start_sequence: from_sequence,
        }
    }
}

/// An ordered consumer of `filters`. It is named, so that its create
/// request goes to the API subject that names the filter where there is
/// one, which the server's permissions can scope to a user's own
/// (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`); the name is
/// random, so no other user can guess it to read from it.
pub(crate) fn ordered(filters: Vec<String>, deliver_policy: DeliverPolicy) -> OrderedConfig {
    let mut config = OrderedConfig {
        name: Some(crate::streams::consumer_name()),
        deliver_policy,
        ..Default::default()
    };
    match <[String; 1]>::try_from(filters) {
        Ok([filter]) => config.filter_subject = filter,
        Err(filters) => config.filter_subjects = filters,
    }
    config
}

/// How a feed's consumer reads the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// One consumer of the filters: the server steps over the rest.
    Filtered,
    /// One consumer of the whole stream, filtered here.
    Whole,
    /// One consumer per filter, merged here in stream order up to this
    /// sequence, the stream's last when the backlog was opened.
    Merged { through: u64 },
}

/// Subject prefix of JetStream's advisory that a stream has a new leader
/// (followed by the stream's name).
const STREAM_LEADER_ELECTED_PREFIX: &str = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED";

/// The next leader election announced, or never when nobody listens.
async fn next_election(
    elections: &mut Option<async_nats::Subscriber>,
) -> Option<async_nats::Message> {
    match elections {
        Some(subscriber) => subscriber.next().await,
        None => std::future::pending().await,
    }
}

/// Fewest messages of the stream a feed reads whole: a backlog or a
/// stream shorter than this is read through the filters.
const WIDE_READ_MIN_BACKLOG_MESSAGES: u64 = 4096;
/// Fewest messages of backlog that a feed of several filters reads as one
/// consumer per filter, merged (see the `merged` module): under this,
/// opening the consumers costs more than it saves.
const MERGED_READ_MIN_BACKLOG_MESSAGES: u64 = 4096;
/// Longest one filter's consumer may keep a merged read waiting for a
/// message it has still to deliver before the feed gives the merge up and
/// reads on through a single consumer. Long: a filter whose next message
/// is far ahead has the server go through the blocks in between.
const MERGED_READ_IDLE: Duration = Duration::from_secs(30);
/// Messages over which a feed at the head counts how often its filters
/// match, to choose how it reads on: the newest this many when it opens,
/// then each this many it reads past. Long enough that a burst of one kind
/// (a second of lease requests before their first charge) does not make a
/// feed change its consumer back and forth.
const WIDE_READ_HEAD_WINDOW_MESSAGES: u64 = 32_768;
/// The stream is read whole when at least one message in this many matches
/// the feed's filters, at the head as in a backlog. nats-server finds a
/// filtered consumer's next message by going through the per-subject state
/// of the message block, every subject in it, once per message delivered;
/// with a subject per lease that is thousands of entries for each message
/// (about 5,000 messages/s on a long log, and most of the server's time
/// for the projections following the log at 1,400 leases/s). A consumer of
/// the whole stream walks the blocks in order, and a subject compared here
/// costs far less than one looked up there.
const WIDE_READ_MAX_MESSAGES_PER_MATCH: u64 = 32;
/// Longest a message read whole waits to be handed over while the messages
/// after it do not match: how it learns whether it was the last one.
const WIDE_READ_HOLD: Duration = Duration::from_millis(20);
/// First wait before a lost consumer is opened again; it doubles on each
/// failed attempt up to [`FEED_REOPEN_MAX_WAIT`].
const FEED_REOPEN_MIN_WAIT: Duration = Duration::from_millis(100);
const FEED_REOPEN_MAX_WAIT: Duration = Duration::from_secs(5);
/// How long one attempt to open a consumer may take before it is given up
/// and tried again. A request that reached a cluster while it elects a
/// leader is never answered; waiting for the client's whole request
/// timeout (10 s) would keep a feed stopped long after the election.
const FEED_OPEN_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// What a feed reads and how it opens a consumer for it.
pub(super) struct FeedSource {
    pub(super) js: jetstream::Context,
    /// The stream read: the business log or the telemetry stream.
    pub(super) stream: &'static str,
    pub(super) filters: Vec<String>,
    /// The stream's whole subject space, when the filters are narrower: what
    /// a stream its filters match often is read as.
    pub(super) wide: Option<String>,
    pub(super) service: Arc<str>,
    /// Count and log each skipped message (false on a second reading).
    pub(super) report_skips: bool,
    pub(super) connects: tokio::sync::watch::Receiver<u64>,
    /// Whether a long backlog of several filters may be read merged; off
    /// from a merged read that failed until the feed is at the head, so
    /// that a consumer which never delivers what it counted cannot hold
    /// the feed in a loop of merges.
    pub(super) merge_backlogs: bool,
}

impl FeedSource {
    /// Opens the feed's first consumer, so that a caller learns at once of
    /// a server that refuses it, and sets the pump going, which opens the
    /// later ones and runs until the reader is gone.
    pub(super) async fn start<T: FeedMessage>(
        self,
        from_sequence: u64,
        items: tokio::sync::mpsc::Sender<Result<T>>,
    ) -> Result<tokio::task::JoinHandle<()>> {
        let mut elections = self.subscribe_elections().await;
        // A node's view may not be made yet when the node starts: it holds
        // nothing yet, and the feed opens once it is there. The log itself
        // missing is an error.
        let missing = self.stream != subject::EVENTS_STREAM
            && matches!(self.js.get_stream(self.stream).await, Err(ref e) if crate::streams::is_missing(e));
        let messages = if missing {
            tracing::info!(service = %self.service, stream = self.stream,
                "the stream is not there yet; the feed opens once it is");
            None
        } else {
            Some(self.open(from_sequence).await?)
        };
        Ok(tokio::spawn(async move {
            let messages = match messages {
                Some(messages) => messages,
                None => self.reopen(from_sequence, &mut elections).await,
            };
            self.pump(messages, elections, from_sequence, items).await
        }))
    }

    /// The server's announcements of a new leader of the business log. A
    /// feed's consumer lives on one member, which may be the leader that
    /// went away; without this the feed would learn of it only from missed
    /// heartbeats (the client's ordered consumer waits for two of 15 s).
    /// `None` when the subscription fails: heartbeats still work.
    async fn subscribe_elections(&self) -> Option<async_nats::Subscriber> {
        let subject = format!("{STREAM_LEADER_ELECTED_PREFIX}.{}", self.stream);
        match self.js.client().subscribe(subject).await {
            Ok(subscriber) => Some(subscriber),
            Err(e) => {
                tracing::warn!(service = %self.service, error = %e,
                    "cannot follow leader elections; a lost consumer is found by heartbeats only");
                None
            }
        }
    }

    /// An ordered consumer from `from_sequence` on: of the filters, or of
    /// the whole stream when its filters match often enough (see
    /// [`WIDE_READ_MAX_MESSAGES_PER_MATCH`]) in the backlog, or near the
    /// head in the newest [`WIDE_READ_MIN_BACKLOG_MESSAGES`]; then `true`,
    /// and the reader drops what the filters do not match.
    async fn open(&self, from_sequence: u64) -> Result<(MessageStream, Reading)> {
        let stream = self.js.get_stream(self.stream).await.map_err(js_err)?;
        let state = &stream.cached_info().state;
        let end = state.last_sequence + 1;
        let from = from_sequence.max(state.first_sequence).max(1);
        if self.merge_backlogs
            && self.filters.len() > 1
            && self.wide.is_some()
            && end.saturating_sub(from) >= MERGED_READ_MIN_BACKLOG_MESSAGES
        {
            if let Some(merged) = self.open_merged(&stream, from, state.last_sequence).await? {
                return Ok(merged);
            }
        }
        // Near the head the newest messages tell how often the filters
        // match what is coming.
        let count_from = from
            .min(end.saturating_sub(WIDE_READ_HEAD_WINDOW_MESSAGES))
            .max(state.first_sequence)
            .max(1);
        let counted = end.saturating_sub(count_from);
        let counter = stream
            .create_consumer(self.config(count_from, false))
            .await
            .map_err(js_err)?;
        let matching = counter.cached_info().num_pending;
        let whole = self.wide.is_some()
            && counted >= WIDE_READ_MIN_BACKLOG_MESSAGES
            && matching.saturating_mul(WIDE_READ_MAX_MESSAGES_PER_MATCH) >= counted;
        tracing::debug!(service = %self.service, filters = ?self.filters, from_sequence,
            counted, matching, whole, "event feed opened");
        if !whole && count_from == from {
            return Ok((
                delivered(counter.messages().await.map_err(js_err)?),
                Reading::Filtered,
            ));
        }
        // The counter only counted; the server forgets it when idle, this
        // saves it the wait.
        let _ = stream.delete_consumer(&counter.cached_info().name).await;
        self.open_as(&stream, from_sequence, whole).await
    }

    /// An ordered consumer from `from_sequence` on, of the whole stream or
    /// of the filters.
    async fn open_as(
        &self,
        stream: &jetstream::stream::Stream,
        from_sequence: u64,
        whole: bool,
    ) -> Result<(MessageStream, Reading)> {
        let consumer = stream
            .create_consumer(self.config(from_sequence, whole))
            .await
            .map_err(js_err)?;
        let reading = if whole {
            Reading::Whole
        } else {
            Reading::Filtered
        };
        Ok((
            delivered(consumer.messages().await.map_err(js_err)?),
            reading,
        ))
    }

    /// One ordered consumer of each filter from `from_sequence` on, merged
    /// in stream order up to `through`; none when a consumer that counts
    /// nothing to deliver has a message there all the same (the merge
    /// would step over what it cannot see).
    async fn open_merged(
        &self,
        stream: &jetstream::stream::Stream,
        from_sequence: u64,
        through: u64,
    ) -> Result<Option<(MessageStream, Reading)>> {
        let mut lanes = Vec::with_capacity(self.filters.len());
        for filter in &self.filters {
            let consumer = stream
                .create_consumer(ordered(vec![filter.clone()], deliver_from(from_sequence)))
                .await
                .map_err(js_err)?;
            let remaining = consumer.cached_info().num_pending;
            let messages = match remaining {
                0 => {
                    let last = last_sequence_on_filter(stream, filter).await?;
                    if (from_sequence..=through).contains(&last) {
                        tracing::warn!(service = %self.service, filter, from_sequence, last,
                            "a consumer counted nothing where the log holds a message; reading the backlog through one consumer");
                        return Ok(None);
                    }
                    None
                }
                _ => Some(consumer.messages().await.map_err(js_err)?),
            };
            lanes.push((messages, remaining));
        }
        tracing::debug!(service = %self.service, filters = ?self.filters, from_sequence,
            through, "event feed reads its backlog merged");
        let merged = merged::merge(
            lanes,
            through,
            |message: &jetstream::Message| {
                message
                    .info()
                    .ok()
                    .map(|info| (info.stream_sequence, info.pending))
            },
            MERGED_READ_IDLE,
        );
        Ok(Some((
            Box::pin(merged.map(|m| m.map(|(message, after)| (message, Some(after))))),
            Reading::Merged { through },
        )))
    }

    fn config(&self, from_sequence: u64, whole: bool) -> OrderedConfig {
        let filter_subjects = match (&self.wide, whole) {
            (Some(wide), true) => vec![wide.clone()],
            _ => self.filters.clone(),
        };
        ordered(filter_subjects, deliver_from(from_sequence))
    }

    /// [`FeedSource::open_as`] on the feed's stream.
    async fn switch(&self, from_sequence: u64, whole: bool) -> Result<(MessageStream, Reading)> {
        let stream = self.js.get_stream(self.stream).await.map_err(js_err)?;
        tracing::debug!(service = %self.service, filters = ?self.filters, from_sequence,
            whole, "event feed switched at the head");
        self.open_as(&stream, from_sequence, whole).await
    }

    /// Whether the feed's filters match `subject`.
    fn wants(&self, subject: &str) -> bool {
        self.filters
            .iter()
            .any(|filter| subject::matches(filter, subject))
    }

    /// Opens a consumer from `from_sequence`, waiting and retrying for as
    /// long as it takes: a server that is down now will be back. While a
    /// cluster elects a leader, requests for the stream go unanswered until
    /// they time out; the announcement of the new leader ends the attempt
    /// in flight (or the wait) and the next one starts at once.
    async fn reopen(
        &self,
        from_sequence: u64,
        elections: &mut Option<async_nats::Subscriber>,
    ) -> (MessageStream, Reading) {
        let mut wait = FEED_REOPEN_MIN_WAIT;
        loop {
            let attempt = async {
                tokio::time::sleep(wait).await;
                tokio::time::timeout(FEED_OPEN_ATTEMPT_TIMEOUT, self.open(from_sequence))
                    .await
                    .unwrap_or_else(|_| {
                        Err(BusError::JetStream(format!(
                            "no consumer within {FEED_OPEN_ATTEMPT_TIMEOUT:?}"
                        )))
                    })
            };
            let opened = tokio::select! {
                opened = attempt => opened,
                election = next_election(elections) => {
                    if election.is_none() {
                        *elections = None;
                    }
                    wait = Duration::ZERO;
                    continue;
                }
            };
            match opened {
                Ok(opened) => {
                    tracing::info!(service = %self.service, filters = ?self.filters, from_sequence,
                        "event feed resumed");
                    return opened;
                }
                Err(e) => {
                    wait = (wait * 2).clamp(FEED_REOPEN_MIN_WAIT, FEED_REOPEN_MAX_WAIT);
                    tracing::warn!(service = %self.service, filters = ?self.filters, from_sequence,
                        error = %e, retry_in_ms = wait.as_millis() as u64, "cannot reopen the event feed");
                }
            }
        }
    }

    /// Reads messages into `items` in stream order until the reader is
    /// gone, opening a new consumer after the last delivered message
    /// whenever the current one fails or ends, and at the head one that
    /// reads the other way when its filters matched the last
    /// [`WIDE_READ_HEAD_WINDOW_MESSAGES`] more often, or less often, than
    /// [`WIDE_READ_MAX_MESSAGES_PER_MATCH`] allows.
    async fn pump<T: FeedMessage>(
        mut self,
        opened: (MessageStream, Reading),
        mut elections: Option<async_nats::Subscriber>,
        mut next_sequence: u64,
        items: tokio::sync::mpsc::Sender<Result<T>>,
    ) {
        let (mut messages, mut reading) = opened;
        let mut last_match = LastMatch::default();
        let mut density = Density::default();
        loop {
            let hold_over = last_match.deadline();
            let next = tokio::select! {
                next = messages.next() => next,
                // A new connection may be to a restarted server that lost
                // the consumer: reopen now, not heartbeats later.
                Ok(()) = self.connects.changed() => {
                    tracing::info!(service = %self.service, filters = ?self.filters,
                        next_sequence, "reconnected to NATS; reopening the event feed");
                    if !last_match.hand_over(&items).await {
                        return;
                    }
                    (messages, reading) = self.reopen(next_sequence, &mut elections).await;
                    continue;
                }
                // The same for a new leader in a cluster: the consumer may
                // have been on the member that is gone.
                election = next_election(&mut elections) => {
                    if election.is_none() {
                        elections = None;
                        continue;
                    }
                    tracing::info!(service = %self.service, filters = ?self.filters,
                        next_sequence, "the event log has a new leader; reopening the event feed");
                    if !last_match.hand_over(&items).await {
                        return;
                    }
                    (messages, reading) = self.reopen(next_sequence, &mut elections).await;
                    continue;
                }
                // Messages the filters do not match keep coming: the held
                // one may not wait for the head.
                _ = hold_over => {
                    if !last_match.hand_over(&items).await {
                        return;
                    }
                    continue;
                }
            };
            let error = match (next, reading) {
                (Some(Ok(delivery)), _) => {
                    match self
                        .deliver(
                            delivery,
                            &mut next_sequence,
                            reading == Reading::Whole,
                            &mut last_match,
                            &mut density,
                            &items,
                        )
                        .await
                    {
                        Delivered::More => continue,
                        Delivered::ReaderGone => return,
                        // A merged backlog ends by itself.
                        Delivered::AtHead if matches!(reading, Reading::Merged { .. }) => continue,
                        Delivered::AtHead => {
                            self.merge_backlogs = true;
                            let Some(dense) = density.verdict() else {
                                continue;
                            };
                            let wide = self.wide.is_some() && dense;
                            if wide == (reading == Reading::Whole) {
                                continue;
                            }
                            // Filters that match seldom save sending every
                            // message; ones that match often cost the
                            // server a lookup per match.
                            (messages, reading) = match self.switch(next_sequence, wide).await {
                                Ok(opened) => opened,
                                Err(_) => self.reopen(next_sequence, &mut elections).await,
                            };
                            continue;
                        }
                    }
                }
                (None, Reading::Merged { through }) => {
                    // Everything the filters match up to `through` is
                    // handed over: on from there, one consumer as at the
                    // head (never merged again from the same place).
                    next_sequence = next_sequence.max(through + 1);
                    tracing::debug!(service = %self.service, filters = ?self.filters,
                        next_sequence, "event feed read its backlog merged");
                    (messages, reading) = match self.open(next_sequence).await {
                        Ok(opened) => opened,
                        Err(_) => self.reopen(next_sequence, &mut elections).await,
                    };
                    continue;
                }
                (Some(Err(e)), _) => e,
                (None, _) => "the consumer ended".to_string(),
            };
            if matches!(reading, Reading::Merged { .. }) {
                self.merge_backlogs = false;
            }
            tracing::warn!(service = %self.service, filters = ?self.filters,
                next_sequence, %error, "event feed lost its consumer; reopening");
            if !last_match.hand_over(&items).await {
                return;
            }
            (messages, reading) = self.reopen(next_sequence, &mut elections).await;
        }
    }

    /// Hands `message` to the reader unless it repeats one already handed
    /// over (or, read `whole`, the filters do not match it); `after`, where
    /// given, is how many messages of the filters follow it.
    async fn deliver<T: FeedMessage>(
        &self,
        (message, after): (jetstream::Message, Option<u64>),
        next_sequence: &mut u64,
        whole: bool,
        last_match: &mut LastMatch<T>,
        density: &mut Density,
        items: &tokio::sync::mpsc::Sender<Result<T>>,
    ) -> Delivered {
        let mut info = match message.info() {
            Ok(info) => info,
            Err(e) => {
                // Not a JetStream message at all: no retry gives it a
                // sequence, and without one the order is lost. What was
                // read before it is handed over first, in order.
                if last_match.hand_over(items).await {
                    let _ = items.send(Err(js_err(e))).await;
                }
                return Delivered::ReaderGone;
            }
        };
        // A new consumer starts where the last delivery ended; anything
        // older is a repeat.
        if info.stream_sequence < *next_sequence {
            return Delivered::More;
        }
        if let Some(after) = after {
            info.pending = after;
        }
        let passed = info.stream_sequence + 1 - *next_sequence;
        *next_sequence = info.stream_sequence + 1;
        let at_head = info.pending == 0;
        if !whole {
            // The server stepped over the messages in between.
            density.count(passed, true);
            let item = T::from_message(&self.service, self.report_skips, &message, &info);
            return match items.send(Ok(item)).await {
                Ok(()) if at_head => Delivered::AtHead,
                Ok(()) => Delivered::More,
                Err(_) => Delivered::ReaderGone,
            };
        }
        // Read whole, a message's pending counts every subject: the last
        // one the filters match is known only from what follows it, so it
        // is held until then.
        let wanted = self.wants(&message.subject);
        density.count(1, wanted);
        if wanted {
            let item = T::from_message(&self.service, self.report_skips, &message, &info);
            if !last_match.hand_over(items).await {
                return Delivered::ReaderGone;
            }
            last_match.keep(item);
        }
        if at_head {
            last_match.mark_last();
            if !last_match.hand_over(items).await {
                return Delivered::ReaderGone;
            }
            return Delivered::AtHead;
        }
        Delivered::More
    }
}

/// What became of a message the pump read.
enum Delivered {
    /// Handed over or stepped over; more may follow.
    More,
    /// The last message of the stream, for now: the feed may read on the
    /// other way.
    AtHead,
    /// The reader is gone, or the feed cannot go on.
    ReaderGone,
}

/// How often the filters matched the messages of the stream the feed went
/// past, since the last [`WIDE_READ_HEAD_WINDOW_MESSAGES`].
#[derive(Default)]
struct Density {
    passed: u64,
    matched: u64,
    /// Whether the last full window was worth reading whole, until asked.
    dense: Option<bool>,
}

impl Density {
    fn count(&mut self, passed: u64, matched: bool) {
        self.passed += passed;
        self.matched += u64::from(matched);
        if self.passed >= WIDE_READ_HEAD_WINDOW_MESSAGES {
            self.dense = Some(
                self.matched
                    .saturating_mul(WIDE_READ_MAX_MESSAGES_PER_MATCH)
                    >= self.passed,
            );
            self.passed = 0;
            self.matched = 0;
        }
    }

    /// Whether the stream is worth reading whole, by the window completed
    /// since last asked; none: the way the feed reads stands.
    fn verdict(&mut self) -> Option<bool> {
        self.dense.take()
    }
}

/// The message read whole that the filters matched last, not yet handed
/// over: whether it is the last one is told by the messages after it.
struct LastMatch<T> {
    item: Option<T>,
    since: tokio::time::Instant,
}

impl<T> Default for LastMatch<T> {
    fn default() -> Self {
        LastMatch {
            item: None,
            since: tokio::time::Instant::now(),
        }
    }
}

impl<T: FeedMessage> LastMatch<T> {
    fn keep(&mut self, item: T) {
        self.item = Some(item);
        self.since = tokio::time::Instant::now();
    }

    /// Nothing of the stream follows the held message.
    fn mark_last(&mut self) {
        if let Some(item) = &mut self.item {
            item.mark_last();
        }
    }

    /// When the held message is handed over even though it may not be the
    /// last (never while none is held).
    fn deadline(&self) -> impl std::future::Future<Output = ()> {
        let at = self.item.as_ref().map(|_| self.since + WIDE_READ_HOLD);
        async move {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        }
    }

    /// Hands the held message over, if one is; false once the reader is gone.
    async fn hand_over(&mut self, items: &tokio::sync::mpsc::Sender<Result<T>>) -> bool {
        match self.item.take() {
            Some(item) => items.send(Ok(item)).await.is_ok(),
            None => true,
        }
    }
}
