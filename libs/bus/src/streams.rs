//! The two streams a Leasehold bus reads and writes: `LH_EVENTS`, the
//! business log, held to the retention and guards the architecture demands
//! (checked against what the server reports, not what was asked for), and
//! `LH_TELEMETRY`; and where each stands (first and last sequences, per
//! filter too), which every reader and writer asks.

use std::time::Duration;

use async_nats::jetstream::{
    self,
    stream::{Config as StreamConfig, DiscardPolicy, RetentionPolicy, StorageType},
};
use lh_events::subject;

use crate::config::{BusConfig, EVENTS_MAX_AGE};
use crate::error::{js_err, BusError, Result};
use crate::Bus;

/// Retention of heartbeats and usage samples.
pub const TELEMETRY_MAX_AGE: Duration = Duration::from_secs(48 * 3600);
/// Most bytes the telemetry stream holds; past it the oldest samples go
/// (`discard: old`): one node flooding it costs history, never the disk
/// the business log shares.
pub const TELEMETRY_MAX_BYTES: i64 = 1024 * 1024 * 1024;
/// Largest heartbeat or usage sample the telemetry stream stores (one
/// sample of 64 GPUs is about 13 KiB).
pub const TELEMETRY_MAX_MESSAGE_BYTES: i32 = 64 * 1024;
/// Most samples kept per subject (one node's heartbeats, one lease's usage
/// on one node): a lease's 48 hours of usage at one sample each 5 s is
/// 34,560.
pub const TELEMETRY_MAX_MESSAGES_PER_SUBJECT: i64 = 40_000;
/// Largest event the business log stores: a restatement of a long-lived
/// lease is the largest legitimate one.
pub const EVENTS_MAX_MESSAGE_BYTES: i32 = 1024 * 1024;
/// Longest a consumer of either stream may sit unread before the server
/// removes it. Every reader here reads on or goes within seconds; the limit
/// is for a consumer made and left behind, by a crash or by a node that
/// makes them on purpose (a node's consumers of its view are in the log's
/// account, not its own: docs/adr/028).
pub const CONSUMER_MAX_IDLE: Duration = Duration::from_secs(5 * 60);
/// Most consumers the business log holds at once: every service's few,
/// and one per node's view (the mirror's). Set, because a stream without
/// its own limit holds at most 1,000 (nats-server 2.15, measured).
pub const EVENTS_MAX_CONSUMERS: i32 = 65_536;
/// Most consumers of one node's view at once: what the node holds there
/// (a feed, a look at its head, one left behind by a restart) with room.
/// A node that makes more is refused there, and nothing else notices.
pub const NODE_VIEW_MAX_CONSUMERS: i32 = 16;
/// JetStream's duplicate window for `Nats-Msg-Id`.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(2 * 60);

/// Share of the business log's size limit at which operators are warned:
/// past it the log refuses appends (`discard: new`) before long.
pub const EVENTS_FILL_WARNING: f64 = 0.8;

/// The share of its limit the log fills, when it is at or past
/// [`EVENTS_FILL_WARNING`] of it.
pub fn events_fill_warning(bytes: u64, max_bytes: u64) -> Option<f64> {
    if max_bytes == 0 {
        return None;
    }
    let filled = bytes as f64 / max_bytes as f64;
    (filled >= EVENTS_FILL_WARNING).then_some(filled)
}

/// What one stream holds, for the dashboards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamFigures {
    pub messages: u64,
    pub bytes: u64,
    /// Bytes the stream may hold (0: no limit).
    pub max_bytes: u64,
    pub consumers: usize,
    /// Followers that are up to date with the stream's leader.
    pub replicas_current: usize,
    /// Followers behind the leader or offline: a copy that would lose
    /// writes if the leader failed now. 0 on a single server.
    pub replicas_lagging: usize,
}

impl StreamFigures {
    pub fn of(info: &jetstream::stream::Info) -> Self {
        let followers = info
            .cluster
            .as_ref()
            .map(|c| c.replicas.as_slice())
            .unwrap_or_default();
        let current = followers.iter().filter(|p| p.current && !p.offline).count();
        Self {
            messages: info.state.messages,
            bytes: info.state.bytes,
            max_bytes: info.config.max_bytes.max(0) as u64,
            consumers: info.state.consumer_count,
            replicas_current: current,
            replicas_lagging: followers.len() - current,
        }
    }
}

/// The stream config the brief requires for the business log.
pub fn events_stream_config(max_bytes: i64, replicas: usize, max_age: Duration) -> StreamConfig {
    StreamConfig {
        name: subject::EVENTS_STREAM.to_string(),
        subjects: vec![subject::EVENTS_ALL.to_string()],
        storage: StorageType::File,
        retention: RetentionPolicy::Limits,
        max_age,
        max_bytes,
        discard: DiscardPolicy::New,
        max_message_size: EVENTS_MAX_MESSAGE_BYTES,
        deny_delete: true,
        deny_purge: true,
        allow_rollup: false,
        allow_atomic_publish: true,
        // The server refuses a window longer than the age limit (only a
        // test's log is that short).
        duplicate_window: DUPLICATE_WINDOW.min(max_age),
        num_replicas: replicas,
        max_consumers: EVENTS_MAX_CONSUMERS,
        consumer_limits: Some(consumer_limits()),
        ..Default::default()
    }
}

/// The mirror of node `node_id`'s view of the business log: only its
/// relays, at the sequences the log stored them at (a mirror keeps them),
/// kept as long as the log keeps them.
pub fn node_view_stream_config(node_id: &str, replicas: usize, max_age: Duration) -> StreamConfig {
    StreamConfig {
        name: subject::node_view_stream(node_id),
        storage: StorageType::File,
        retention: RetentionPolicy::Limits,
        max_age,
        max_consumers: NODE_VIEW_MAX_CONSUMERS,
        consumer_limits: Some(consumer_limits()),
        num_replicas: replicas,
        mirror: Some(async_nats::jetstream::stream::Source {
            name: subject::EVENTS_STREAM.to_string(),
            filter_subject: Some(subject::guarded(&subject::node_view(node_id))),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn consumer_limits() -> async_nats::jetstream::stream::ConsumerLimits {
    async_nats::jetstream::stream::ConsumerLimits {
        inactive_threshold: CONSUMER_MAX_IDLE,
        max_ack_pending: 0,
    }
}

fn telemetry_stream_config(replicas: usize) -> StreamConfig {
    StreamConfig {
        name: subject::TELEMETRY_STREAM.to_string(),
        subjects: vec![subject::TELEMETRY_ALL.to_string()],
        storage: StorageType::File,
        retention: RetentionPolicy::Limits,
        max_age: TELEMETRY_MAX_AGE,
        max_bytes: TELEMETRY_MAX_BYTES,
        max_message_size: TELEMETRY_MAX_MESSAGE_BYTES,
        max_messages_per_subject: TELEMETRY_MAX_MESSAGES_PER_SUBJECT,
        discard: DiscardPolicy::Old,
        num_replicas: replicas,
        consumer_limits: Some(consumer_limits()),
        ..Default::default()
    }
}

/// Lists every way `actual` falls short of the business-log requirements,
/// keeping events for at least `least_max_age`.
pub fn events_stream_problems(actual: &StreamConfig, least_max_age: Duration) -> Vec<String> {
    let mut problems = Vec::new();
    if actual.max_age != Duration::ZERO && actual.max_age < least_max_age {
        problems.push(format!(
            "max_age {:?} < {:?} (365 days outside tests)",
            actual.max_age, least_max_age
        ));
    }
    if actual.storage != StorageType::File {
        problems.push("storage is not file".into());
    }
    if actual.retention != RetentionPolicy::Limits {
        problems.push("retention is not limits".into());
    }
    if actual.discard != DiscardPolicy::New {
        problems.push("discard is not new".into());
    }
    if actual.max_bytes <= 0 {
        problems.push("max_bytes is not set".into());
    }
    if !actual.deny_delete {
        problems.push("deny_delete is off".into());
    }
    if !actual.deny_purge {
        problems.push("deny_purge is off".into());
    }
    if actual.allow_rollup {
        problems.push("allow_rollup_hdrs is on".into());
    }
    if !actual.allow_atomic_publish {
        problems.push("allow_atomic is off".into());
    }
    if !actual.subjects.iter().any(|s| s == subject::EVENTS_ALL) {
        problems.push(format!(
            "subjects {:?} lack {}",
            actual.subjects,
            subject::EVENTS_ALL
        ));
    }
    problems
}

impl Bus {
    pub(crate) async fn ensure_streams(&self, config: &BusConfig) -> Result<()> {
        if config.events_max_age < EVENTS_MAX_AGE && !config.allow_short_retention {
            return Err(BusError::WeakStream {
                stream: subject::EVENTS_STREAM.to_string(),
                problems: format!(
                    "configured max_age {:?} < 365 days; only tests may keep events for less",
                    config.events_max_age
                ),
            });
        }
        let wanted = events_stream_config(
            config.events_max_bytes,
            config.replicas,
            config.events_max_age,
        );
        let mut stream = self.js.get_or_create_stream(wanted).await.map_err(js_err)?;
        // Read back what the server actually applied, not what we asked for.
        let mut info = stream.info().await.map_err(js_err)?.clone();
        // A log that grew out of its size is given the larger size it is now
        // configured with; it is never shrunk (that would refuse appends, or
        // lose nothing but put the platform at the limit at once).
        let have = info.config.max_bytes;
        if have > 0 && config.events_max_bytes > have {
            let mut grown = info.config.clone();
            grown.max_bytes = config.events_max_bytes;
            // A size the server cannot give (its storage, an account limit)
            // leaves the log as it is rather than keep a service from
            // starting.
            match self.js.update_stream(grown).await {
                Ok(updated) => {
                    info = updated;
                    tracing::info!(
                        from = have,
                        to = info.config.max_bytes,
                        "the event log's size limit was raised"
                    );
                }
                Err(e) => tracing::warn!(have, wanted = config.events_max_bytes, error = %e,
                    "the event log's size limit cannot be raised; it is kept"),
            }
        } else if config.events_max_bytes > 0 && config.events_max_bytes < have {
            tracing::info!(
                configured = config.events_max_bytes,
                kept = have,
                "the event log is larger than configured; it is not shrunk"
            );
        }
        // A log created with fewer replicas (a single server that became a
        // cluster) is given the replicas now configured; never fewer.
        if info.config.num_replicas < config.replicas {
            let mut replicated = info.config.clone();
            replicated.num_replicas = config.replicas;
            match self.js.update_stream(replicated).await {
                Ok(updated) => {
                    tracing::info!(
                        from = info.config.num_replicas,
                        to = updated.config.num_replicas,
                        "the event log's replicas were raised"
                    );
                    info = updated;
                }
                Err(e) => tracing::warn!(have = info.config.num_replicas, wanted = config.replicas,
                    error = %e, "the event log's replicas cannot be raised; it is kept as it is"),
            }
        }
        let problems = events_stream_problems(&info.config, config.least_events_max_age());
        if !problems.is_empty() {
            return Err(BusError::WeakStream {
                stream: info.config.name.clone(),
                problems: problems.join("; "),
            });
        }
        let wanted = telemetry_stream_config(config.replicas);
        let mut telemetry = self
            .js
            .get_or_create_stream(wanted.clone())
            .await
            .map_err(js_err)?;
        let have = telemetry.info().await.map_err(js_err)?.config.clone();
        // A stream made before the limits were set gets them: unbounded, one
        // node could fill the disk the business log is on.
        let unbounded =
            have.max_bytes <= 0 || have.max_message_size <= 0 || have.max_messages_per_subject <= 0;
        if unbounded {
            let bounded = StreamConfig {
                max_bytes: wanted.max_bytes,
                max_message_size: wanted.max_message_size,
                max_messages_per_subject: wanted.max_messages_per_subject,
                ..have
            };
            if let Err(e) = self.js.update_stream(bounded).await {
                tracing::warn!(error = %e, "the telemetry stream's limits cannot be set; it is kept as it is");
            }
        }
        Ok(())
    }

    /// Makes the mirror of node `node_id`'s view when it is missing (see
    /// [`node_view_stream_config`]), keeping events as long as the log.
    pub async fn ensure_node_view_stream(&self, node_id: &str) -> Result<()> {
        let name = subject::node_view_stream(node_id);
        let log = self.events_stream_config().await?;
        // As many replicas as the log, whatever this service was told: a
        // mirror on one member of a cluster goes down with that member, and
        // its node sees nothing new until the member is back, while the
        // log itself goes on.
        let replicas = self.replicas.max(log.num_replicas);
        if let Ok(mut stream) = self.js.get_stream(&name).await {
            let config = stream.info().await.map_err(js_err)?.config.clone();
            if config.num_replicas < replicas {
                let num_replicas = config.num_replicas;
                self.js
                    .update_stream(StreamConfig {
                        num_replicas: replicas,
                        ..config
                    })
                    .await
                    .map_err(js_err)?;
                tracing::info!(
                    node_id,
                    from = num_replicas,
                    to = replicas,
                    "a node's view mirror now has the log's replicas"
                );
            }
            return Ok(());
        }
        self.js
            .get_or_create_stream(node_view_stream_config(node_id, replicas, log.max_age))
            .await
            .map_err(js_err)?;
        Ok(())
    }

    /// How long node `node_id`'s view mirror has not heard from the log
    /// (`None` when it has no mirror or the server does not say).
    pub async fn node_view_silence(&self, node_id: &str) -> Result<Option<Duration>> {
        let mut stream = match self.js.get_stream(subject::node_view_stream(node_id)).await {
            Ok(stream) => stream,
            Err(e) if is_missing(&e) => return Ok(None),
            Err(e) => return Err(js_err(e)),
        };
        let info = stream.info().await.map_err(js_err)?;
        Ok(info.mirror.as_ref().and_then(|mirror| mirror.active))
    }

    /// The server that leads the log now (`None` on a single server, or
    /// while the log has no leader).
    pub async fn log_leader(&self) -> Result<Option<String>> {
        let mut stream = self
            .js
            .get_stream(subject::EVENTS_STREAM)
            .await
            .map_err(js_err)?;
        let info = stream.info().await.map_err(js_err)?;
        Ok(info.cluster.as_ref().and_then(|c| c.leader.clone()))
    }

    /// Has the members of node `node_id`'s view mirror elect a new leader,
    /// which sets the mirror up on the log afresh: nats-server retries a
    /// mirror that lost the log's leader after a growing wait (measured
    /// past 30 s on a loaded machine). A single server's refusal is Ok.
    pub async fn renew_node_view(&self, node_id: &str) -> Result<()> {
        let subject = format!(
            "STREAM.LEADER.STEPDOWN.{}",
            subject::node_view_stream(node_id)
        );
        let answer: serde_json::Value = self
            .js
            .request(subject, &serde_json::json!({}))
            .await
            .map_err(js_err)?;
        tracing::info!(node_id, %answer, "asked a node's view mirror for a new leader");
        Ok(())
    }

    /// Every node the log holds relays to (the subjects of its views).
    pub async fn nodes_with_views(&self) -> Result<Vec<String>> {
        use futures::TryStreamExt as _;
        let stream = self
            .js
            .get_stream(subject::EVENTS_STREAM)
            .await
            .map_err(js_err)?;
        let subjects: std::collections::HashMap<String, usize> = stream
            .info_with_subjects(subject::NODE_VIEW_RELAYS_ALL)
            .await
            .map_err(js_err)?
            .try_collect()
            .await
            .map_err(js_err)?;
        let mut nodes: Vec<String> = subjects
            .keys()
            .filter_map(|s| subject::node_of_view(s).map(str::to_string))
            .collect();
        nodes.sort();
        Ok(nodes)
    }

    /// What a stream holds and how its replicas keep up, as the server
    /// reports it.
    pub async fn stream_figures(&self, name: &str) -> Result<StreamFigures> {
        let mut stream = self.js.get_stream(name).await.map_err(js_err)?;
        Ok(StreamFigures::of(stream.info().await.map_err(js_err)?))
    }

    /// The business log's config as the server reports it.
    pub async fn events_stream_config(&self) -> Result<StreamConfig> {
        let mut stream = self
            .js
            .get_stream(subject::EVENTS_STREAM)
            .await
            .map_err(js_err)?;
        Ok(stream.info().await.map_err(js_err)?.config.clone())
    }

    async fn events_stream_state(&self) -> Result<jetstream::stream::State> {
        let mut stream = self
            .js
            .get_stream(subject::EVENTS_STREAM)
            .await
            .map_err(js_err)?;
        Ok(stream.info().await.map_err(js_err)?.state.clone())
    }

    /// The oldest sequence the business log still holds (the one after its
    /// last when it is empty).
    pub async fn first_sequence(&self) -> Result<u64> {
        Ok(self.events_stream_state().await?.first_sequence)
    }

    /// Sequence of the newest event in the business log (0 when empty).
    pub async fn last_sequence(&self) -> Result<u64> {
        Ok(self.events_stream_state().await?.last_sequence)
    }

    /// Stream sequence of the last event a guard on `aggregate_subject`
    /// counts: the last under `<aggregate>.>` (0 when there is none).
    pub async fn subject_last_sequence(&self, aggregate_subject: &str) -> Result<u64> {
        self.last_sequence_on(&subject::guarded(aggregate_subject))
            .await
    }

    /// Sequence of the newest event any of `filters` matches (0 when there
    /// is none): the head a feed of those filters has to read up to. A
    /// reader asks when its feed went quiet before it saw the head, since a
    /// slow server can pause a long replay for longer than any quiet spell.
    pub async fn last_sequence_matching(&self, filters: &[&str]) -> Result<u64> {
        let mut head = 0;
        for filter in filters {
            head = head.max(self.last_sequence_in(self.log_stream, filter).await?);
        }
        Ok(head)
    }

    /// Stream sequence of the last event on any subject `filter` matches
    /// (0 when there is none).
    async fn last_sequence_on(&self, filter: &str) -> Result<u64> {
        self.last_sequence_in(self.log_stream, filter).await
    }

    /// Sequence of the last message of `stream` on any subject `filter`
    /// matches (0 when there is none).
    pub(crate) async fn last_sequence_in(&self, stream: &str, filter: &str) -> Result<u64> {
        let stream = match self.js.get_stream(stream).await {
            Ok(stream) => stream,
            // A node's view not made yet holds nothing yet.
            Err(e) if stream != subject::EVENTS_STREAM && is_missing(&e) => return Ok(0),
            Err(e) => return Err(js_err(e)),
        };
        last_sequence_on_filter(&stream, filter).await
    }
}

/// A consumer name no other user can guess: 32 hex digits.
pub(crate) fn consumer_name() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Whether the server said the stream asked for does not exist.
pub(crate) fn is_missing(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), async_nats::jetstream::context::GetStreamErrorKind::JetStream(e)
        if e.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND)
}

/// Sequence of the last message of `stream` on any subject `filter`
/// matches (0 when there is none).
pub(crate) async fn last_sequence_on_filter(
    stream: &jetstream::stream::Stream,
    filter: &str,
) -> Result<u64> {
    match stream.get_last_raw_message_by_subject(filter).await {
        Ok(msg) => Ok(msg.sequence),
        Err(e)
            if e.kind()
                == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
        {
            Ok(0)
        }
        Err(e) => Err(js_err(e)),
    }
}
