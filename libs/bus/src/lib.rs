//! The only place that knows how Leasehold events are published,
//! deduplicated, batched and consumed on NATS JetStream.
//!
//! * [`Bus::connect`] creates (or finds) the `LH_EVENTS` and `LH_TELEMETRY`
//!   streams, reads their config back and refuses to run on a weaker stream
//!   than the architecture brief demands (365 days, deny delete/purge, discard
//!   new, atomic batches). It waits for a server that does not answer yet.
//!   The NATS URL may list several servers, the members of a cluster
//!   ([`server_addrs`]): the client connects to any of them and moves to
//!   another when its server goes away.
//! * [`Bus::publish`] appends one event with its id as `Nats-Msg-Id` and an
//!   optional expected-last-subject-sequence on its aggregate (every
//!   subject under `<aggregate>.>`).
//! * [`Bus::publish_atomic`] appends several events as one ADR-50 atomic
//!   batch, each with its own expectation: all are stored or none.
//! * [`Bus::feed`] replays a subject filter from a sequence with an ordered
//!   consumer and then follows live (a stream that the filter matches often
//!   is read whole and filtered here, backlog and head alike: nats-server is
//!   slow to filter a log with a subject per lease; a backlog that several
//!   filters match is read as one consumer per filter, merged here in stream
//!   order), opening a new consumer after the last
//!   delivered message when the connection comes back or a cluster elects
//!   a new leader of the log. A stored message the reader cannot use
//!   (junk, an unknown type, a newer version) is counted, logged and handed
//!   over as a [`Skipped`] item, never as an error: it cannot be removed
//!   from the log, so failing on it would fail every restart too. So is an
//!   event stored on a subject its envelope does not compute, or by a
//!   publisher its type's owners do not include: it is checked here, once
//!   for every reader.
//! * [`Bus::telemetry_feed`] is the same feed on `LH_TELEMETRY`: samples are
//!   handed over undecoded ([`Sample`]), each reader knowing its subjects'
//!   type.
//!
//! One room a job: `config` says how to reach the server, `streams` what
//! the two streams must be and where they stand, `publish` how an event is
//! appended, `feed` how the log is read in order, `telemetry` the samples'
//! stream, [`rpc`] request/reply, `snapshots` the object store of folded
//! state, and `trace` the trace context an event carries. This file holds
//! the connection they share; every name a service uses is re-exported
//! here, so that callers see one flat crate.

pub mod auth;
mod config;
mod error;
mod feed;
mod publish;
pub mod rpc;
mod snapshots;
mod streams;
mod telemetry;
mod trace;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;

pub use async_nats;
pub use config::{
    server_addrs, BusConfig, Credentials, TlsFiles, ENV_NATS_CA_FILE, ENV_NATS_CLIENT_CERT_FILE,
    ENV_NATS_CLIENT_KEY_FILE, ENV_NATS_NKEY_SEED_FILE, ENV_NATS_PASSWORD_FILE, ENV_NATS_USER,
    EVENTS_DEFAULT_MAX_BYTES, EVENTS_MAX_AGE, MAX_SECRET_FILE_BYTES, MAX_SERVER_ADDRS,
};
pub use error::{BusError, Result};
pub use feed::{Feed, FeedItem, Sample, Skipped, Stored, SUBJECT_HISTORY_READ_TIMEOUT};
/// The write guard is a domain idea and lives with the events; it is
/// re-exported here because every append takes one.
pub use lh_events::Expect;
pub use publish::{
    Appended, EVENT_TYPE_HEADER, EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT, MAX_BATCH_MESSAGES,
};
pub use snapshots::{
    snapshots_bucket, MAX_SNAPSHOT_BYTES, SNAPSHOTS_BUCKET_PREFIX, SNAPSHOTS_MAX_BYTES,
};
pub use streams::{
    events_fill_warning, events_stream_config, events_stream_problems, node_view_stream_config,
    StreamFigures, CONSUMER_MAX_IDLE, DUPLICATE_WINDOW, EVENTS_FILL_WARNING,
    NODE_VIEW_MAX_CONSUMERS, TELEMETRY_MAX_AGE,
};
pub use trace::{continue_trace, TRACE_PARENT_HEADER};

/// Metrics this library records, with their `# HELP` text (a service hands
/// them to `lh_telemetry::describe_metrics`; this crate records only).
pub const METRICS: &[(&str, &str)] = &[
    (
        "lh_events_skipped_total",
        "Stored messages a service read but could not use, by service and reason.",
    ),
    (
        "lh_snapshots_refused_total",
        "Stored snapshots a service would not restore (not signed by its own key, or not in its format), by service.",
    ),
    (
        "lh_nats_connected",
        "Whether the service's NATS connection is up (1) or down (0), by service.",
    ),
    (
        "lh_nats_connection_events_total",
        "Events of the service's NATS connection (connected, reconnected, disconnected, lame_duck, slow_consumer, server_error, client_error, closed...), by service and event.",
    ),
];

/// The `event` label of `lh_nats_connection_events_total` for what the
/// client reports; the first connect is told apart from a reconnect
/// (async-nats reports both as `Connected`), since only the latter means
/// the connection was lost.
pub fn connection_event_label(event: &async_nats::Event, connects_before: u64) -> &'static str {
    match event {
        async_nats::Event::Connected if connects_before == 0 => "connected",
        async_nats::Event::Connected => "reconnected",
        async_nats::Event::Disconnected => "disconnected",
        async_nats::Event::LameDuckMode => "lame_duck",
        async_nats::Event::Draining => "draining",
        async_nats::Event::Closed => "closed",
        async_nats::Event::SlowConsumer(_) => "slow_consumer",
        async_nats::Event::ServerError(_) => "server_error",
        async_nats::Event::ClientError(_) => "client_error",
    }
}

/// What the connection is after `event`: up, down, or as it was.
fn connected_after(event: &async_nats::Event) -> Option<bool> {
    match event {
        async_nats::Event::Connected => Some(true),
        async_nats::Event::Disconnected | async_nats::Event::Closed => Some(false),
        _ => None,
    }
}

const PUBLISH_ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// First wait before the streams are checked again at connect while the
/// server does not answer; it doubles up to the max.
const CONNECT_RETRY_MIN_WAIT: Duration = Duration::from_millis(100);
const CONNECT_RETRY_MAX_WAIT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Bus {
    client: async_nats::Client,
    /// The log's JetStream: the account's own, or for a node the log's
    /// account's as exported to it (see [`BusConfig::log_api_prefix`]).
    js: jetstream::Context,
    /// The JetStream of the connection's own account, where its snapshots
    /// are.
    own_js: jetstream::Context,
    /// The connection's client name: the `service` label of its metrics.
    service: Arc<str>,
    /// Counts the times the client (re)connected; feeds reopen their
    /// consumers on a change rather than wait for heartbeats to go missing.
    connects: tokio::sync::watch::Receiver<u64>,
    /// Replicas of what this connection creates (the snapshot store).
    replicas: usize,
    /// Its user's snapshot bucket, and the key it signs snapshots with.
    snapshots: snapshots::SnapshotKeeper,
    /// The stream it reads the log in: the log itself, or a node's mirror
    /// of its own view (docs/adr/027, 028).
    log_stream: &'static str,
    /// Whether the connection to the server is TLS.
    encrypted: bool,
}

impl Bus {
    /// Connects, creates the streams when missing and checks what the server holds.
    pub async fn connect(config: &BusConfig) -> Result<Self> {
        let servers = server_addrs(&config.nats_url)?;
        let (connected, connects) = tokio::sync::watch::channel(0u64);
        let service = config.client_name.clone();
        // Down until the client says otherwise: a service that never
        // reaches NATS shows 0, not nothing, so an alert sees it.
        metrics::gauge!("lh_nats_connected", "service" => service.clone()).set(0.0);
        let client = config
            .connect_options()
            .name(&config.client_name)
            .event_callback(move |event| {
                let label = connection_event_label(&event, *connected.borrow());
                metrics::counter!("lh_nats_connection_events_total",
                    "service" => service.clone(), "event" => label)
                .increment(1);
                if let Some(up) = connected_after(&event) {
                    metrics::gauge!("lh_nats_connected", "service" => service.clone())
                        .set(if up { 1.0 } else { 0.0 });
                }
                match event {
                    async_nats::Event::Connected => connected.send_modify(|n| *n += 1),
                    async_nats::Event::Disconnected => {
                        tracing::warn!(service = %service, "lost the connection to NATS; reconnecting")
                    }
                    _ => {}
                }
                std::future::ready(())
            })
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            .connect(servers)
            .await
            .map_err(|source| BusError::Connect {
                url: config.nats_url.clone(),
                source,
            })?;
        let mut own_js = jetstream::new(client.clone());
        own_js.set_timeout(PUBLISH_ACK_TIMEOUT);
        let js = match config.log_api_prefix() {
            Some(prefix) => {
                let mut js = jetstream::with_prefix(client.clone(), prefix);
                js.set_timeout(PUBLISH_ACK_TIMEOUT);
                js
            }
            None => own_js.clone(),
        };
        let bus = Self {
            client,
            js,
            own_js,
            service: config.client_name.as_str().into(),
            connects,
            replicas: config.replicas,
            snapshots: config.snapshot_keeper()?,
            log_stream: lh_events::subject::EVENTS_STREAM,
            encrypted: config.tls.is_some(),
        };
        // The client connects in the background (and reconnects for ever);
        // until the server answers, checking the streams fails, so it is
        // retried: a service started before NATS waits for it.
        let mut wait = CONNECT_RETRY_MIN_WAIT;
        loop {
            match bus.ensure_streams(config).await {
                Ok(()) => return Ok(bus),
                Err(e @ BusError::WeakStream { .. }) => return Err(e),
                Err(e) => {
                    tracing::warn!(url = %config.nats_url, error = %e, retry_in_ms = wait.as_millis() as u64,
                        "the event log does not answer yet");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(CONNECT_RETRY_MAX_WAIT);
                }
            }
        }
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Whether what travels on this connection is encrypted (TLS to the
    /// server): what else carries the same bytes must not be weaker.
    pub fn is_encrypted(&self) -> bool {
        self.encrypted
    }

    /// This connection reads the log only in node `node_id`'s view of it,
    /// the mirror the scheduler keeps ([`Bus::ensure_node_view_stream`]):
    /// every feed and head of the business log is of that mirror, at the
    /// log's own sequences.
    pub fn reading_view_of(mut self, node_id: &str) -> Self {
        // One per process: the name lives as long as the connection's
        // feeds, which outlive any one borrow.
        self.log_stream = Box::leak(lh_events::subject::node_view_stream(node_id).into_boxed_str());
        self
    }

    /// Whether the connection to NATS is up right now (the client
    /// reconnects by itself; a service is not ready while it is down).
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }
}
