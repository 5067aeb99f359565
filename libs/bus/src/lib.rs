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

pub mod auth;
mod merged;

use std::sync::Arc;
use std::time::Duration;

use async_nats::header::{self, HeaderMap};
use async_nats::jetstream::{
    self,
    consumer::{pull::OrderedConfig, DeliverPolicy},
    context::PublishErrorKind,
    stream::{Config as StreamConfig, DiscardPolicy, RetentionPolicy, StorageType},
};
use bytes::Bytes;
use futures::StreamExt;
use lh_events::{subject, Envelope, SkipReason, Undecodable};

pub use async_nats;
/// The write guard is a domain idea and lives with the events; it is
/// re-exported here because every append takes one.
pub use lh_events::Expect;

/// The object store of services' snapshots (docs/adr/011).
pub const SNAPSHOTS_BUCKET: &str = "lh-snapshots";
/// Size limit of the snapshot store, in bytes.
pub const SNAPSHOTS_MAX_BYTES: i64 = 1024 * 1024 * 1024;

/// Metrics this library records, with their `# HELP` text (a service hands
/// them to `lh_telemetry::describe_metrics`; this crate records only).
pub const METRICS: &[(&str, &str)] = &[
    (
        "lh_events_skipped_total",
        "Stored messages a service read but could not use, by service and reason.",
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

/// Largest snapshot stored or read, in bytes.
pub const MAX_SNAPSHOT_BYTES: usize = 256 * 1024 * 1024;
/// Longest wait for the next message while reading a subject's history.
pub const SUBJECT_HISTORY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Header naming the subjects an expected-last-subject-sequence counts
/// (nats-server 2.11 on): an event's aggregate, below which it is stored.
pub const EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: &str =
    "Nats-Expected-Last-Subject-Sequence-Subject";
/// Header carrying the event type, so that tools can filter without parsing.
pub const EVENT_TYPE_HEADER: &str = "Lh-Event-Type";
/// Retention of the business log: the audit trail must outlive a year.
/// A longer age may be configured; a shorter one only where
/// [`BusConfig::allow_short_retention`] says so (tests that run past expiry).
pub const EVENTS_MAX_AGE: Duration = Duration::from_secs(365 * 24 * 3600);
/// Default byte cap of the business log; `discard: new` means the stream
/// refuses writes at the cap instead of evicting audit data.
pub const EVENTS_DEFAULT_MAX_BYTES: i64 = 1024 * 1024 * 1024;
/// Retention of heartbeats and usage samples.
pub const TELEMETRY_MAX_AGE: Duration = Duration::from_secs(48 * 3600);
/// JetStream's duplicate window for `Nats-Msg-Id`.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(2 * 60);
/// Most messages one atomic batch may hold (the server's own cap is 1,000).
pub const MAX_BATCH_MESSAGES: usize = 64;
const PUBLISH_ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// First wait before the streams are checked again at connect while the
/// server does not answer; it doubles up to the max.
const CONNECT_RETRY_MIN_WAIT: Duration = Duration::from_millis(100);
const CONNECT_RETRY_MAX_WAIT: Duration = Duration::from_secs(5);
/// Most servers one NATS URL setting may list; a cluster has 3 or 5.
pub const MAX_SERVER_ADDRS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        url: String,
        source: async_nats::ConnectError,
    },
    #[error("bad NATS credentials: {0}")]
    BadCredentials(String),
    #[error("bad NATS server address {addr:?}: {reason}")]
    BadServerAddr { addr: String, reason: String },
    #[error("stream {stream} is weaker than required: {problems}")]
    WeakStream { stream: String, problems: String },
    /// Someone else appended to an aggregate this write expected to be at a
    /// given sequence: reload and decide again.
    #[error("optimistic concurrency conflict: {0}")]
    Conflict(String),
    /// An atomic batch repeated an event id JetStream already holds: the
    /// batch was stored before (a retry of a decision that went through).
    #[error("duplicate atomic batch: {0}")]
    DuplicateBatch(String),
    #[error("JetStream error: {0}")]
    JetStream(String),
}

pub type Result<T, E = BusError> = std::result::Result<T, E>;

fn js_err(e: impl std::fmt::Display) -> BusError {
    BusError::JetStream(e.to_string())
}

/// Result of a successful append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Stream sequence of the (last) stored message.
    pub sequence: u64,
    /// JetStream already held an event with this id; nothing new was stored.
    pub duplicate: bool,
}

/// The servers a NATS URL setting names: one address, or the members of a
/// cluster separated by commas (`nats://a:4222,nats://b:4222`). Blanks
/// around each address are ignored; an address without a scheme is
/// `nats://`, without a port 4222.
pub fn server_addrs(nats_url: &str) -> Result<Vec<async_nats::ServerAddr>> {
    let addrs: Vec<&str> = nats_url.split(',').map(str::trim).collect();
    if addrs.len() > MAX_SERVER_ADDRS {
        return Err(BusError::BadServerAddr {
            addr: nats_url.to_string(),
            reason: format!("more than {MAX_SERVER_ADDRS} servers"),
        });
    }
    addrs
        .into_iter()
        .map(|addr| {
            if addr.is_empty() {
                return Err(BusError::BadServerAddr {
                    addr: nats_url.to_string(),
                    reason: "an empty entry in the list".to_string(),
                });
            }
            addr.parse()
                .map_err(|e: std::io::Error| BusError::BadServerAddr {
                    addr: addr.to_string(),
                    reason: e.to_string(),
                })
        })
        .collect()
}

/// Connection settings and stream sizing.
#[derive(Debug, Clone)]
pub struct BusConfig {
    /// One server or a comma-separated list of a cluster's members (see
    /// [`server_addrs`]).
    pub nats_url: String,
    /// Name the connection shows in the server's monitoring.
    pub client_name: String,
    pub events_max_bytes: i64,
    /// R1 locally, R3 in production.
    pub replicas: usize,
    /// How long the business log keeps an event.
    pub events_max_age: Duration,
    /// Accept an `events_max_age` under [`EVENTS_MAX_AGE`]: only tests
    /// that run a log past expiry set it.
    pub allow_short_retention: bool,
    /// Who this connection is to the server.
    pub credentials: Credentials,
    /// TLS to the server, when it has a certificate.
    pub tls: Option<TlsFiles>,
}

/// How a connection proves who it is. Secrets come from files named in
/// the environment, never from the command line (see
/// [`Credentials::from_env`]).
#[derive(Clone, Default)]
pub enum Credentials {
    /// No credentials: only a server without authorization accepts it
    /// (tests, and `make up` before it had users).
    #[default]
    Anonymous,
    /// An nkey seed and the user it belongs to (the user names the inbox
    /// prefix the server lets it read).
    Nkey { user: String, seed: String },
    /// A user and password (a server configured with bcrypt'd passwords).
    Password { user: String, password: String },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The seed and the password never reach a log.
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Nkey { user, .. } => write!(f, "Nkey {{ user: {user:?}, .. }}"),
            Credentials::Password { user, .. } => write!(f, "Password {{ user: {user:?}, .. }}"),
        }
    }
}

/// Environment variable naming the NATS user.
pub const ENV_NATS_USER: &str = "LH_NATS_USER";
/// Environment variable naming the file that holds the user's nkey seed.
pub const ENV_NATS_NKEY_SEED_FILE: &str = "LH_NATS_NKEY_SEED_FILE";
/// Environment variable naming the file that holds the user's password.
pub const ENV_NATS_PASSWORD_FILE: &str = "LH_NATS_PASSWORD_FILE";
/// Environment variable naming the CA file that turns TLS on.
pub const ENV_NATS_CA_FILE: &str = "LH_NATS_CA_FILE";
/// Environment variables naming a client certificate and its key.
pub const ENV_NATS_CLIENT_CERT_FILE: &str = "LH_NATS_CLIENT_CERT_FILE";
pub const ENV_NATS_CLIENT_KEY_FILE: &str = "LH_NATS_CLIENT_KEY_FILE";
/// Largest credentials file read, in bytes (a seed is 58).
pub const MAX_SECRET_FILE_BYTES: u64 = 4096;

/// Command-line options that would carry a NATS secret: refused, because
/// argv is visible to every user of the host (`ps`, /proc).
const SECRET_OPTIONS: &[&str] = &[
    "--nats-password",
    "--nats-seed",
    "--nats-nkey",
    "--nats-creds",
    "--nats-token",
    "--nats-user",
];

/// The files of a TLS connection to NATS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA that signed the server's certificate.
    pub ca_file: std::path::PathBuf,
    /// A client certificate and its key, for a server that verifies clients.
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

fn read_secret(variable: &str, path: &str) -> Result<String> {
    let bad = |reason: String| BusError::BadCredentials(format!("{variable}={path}: {reason}"));
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if meta.len() > MAX_SECRET_FILE_BYTES {
        return Err(bad(format!("over {MAX_SECRET_FILE_BYTES} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(bad("empty".into()));
    }
    Ok(secret.to_string())
}

impl Credentials {
    /// The credentials the environment names: `LH_NATS_USER` with
    /// `LH_NATS_NKEY_SEED_FILE` or `LH_NATS_PASSWORD_FILE`; none when
    /// neither file is named. `args` is the command line, refused when
    /// it carries a secret.
    pub fn from_env(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        for arg in args {
            let option = SECRET_OPTIONS
                .iter()
                .find(|o| arg == **o || arg.starts_with(&format!("{o}=")));
            // The refusal names the option, never the value.
            let what = match option {
                Some(option) => option.to_string(),
                None if arg.starts_with("LH_NATS_PASSWORD=") => "LH_NATS_PASSWORD=".into(),
                None if looks_like_a_seed(&arg) => "a value shaped like an nkey seed".into(),
                None => continue,
            };
            return Err(BusError::BadCredentials(format!(
                "a NATS secret on the command line ({what}); name a file in {ENV_NATS_NKEY_SEED_FILE} or {ENV_NATS_PASSWORD_FILE}"
            )));
        }
        let user = env(ENV_NATS_USER).filter(|u| !u.is_empty());
        let seed_file = env(ENV_NATS_NKEY_SEED_FILE).filter(|p| !p.is_empty());
        let password_file = env(ENV_NATS_PASSWORD_FILE).filter(|p| !p.is_empty());
        let user = match (&user, &seed_file, &password_file) {
            (_, Some(_), Some(_)) => {
                return Err(BusError::BadCredentials(format!(
                    "{ENV_NATS_NKEY_SEED_FILE} and {ENV_NATS_PASSWORD_FILE} are both set; name one"
                )))
            }
            (None, None, None) => return Ok(Credentials::Anonymous),
            (None, _, _) => {
                return Err(BusError::BadCredentials(format!(
                    "{ENV_NATS_USER} is not set; it names the user whose secret is given"
                )))
            }
            (Some(user), _, _) => {
                auth::check_user_name(user).map_err(BusError::BadCredentials)?;
                user.clone()
            }
        };
        if let Some(path) = seed_file {
            let seed = read_secret(ENV_NATS_NKEY_SEED_FILE, &path)?;
            if nkeys::KeyPair::from_seed(&seed).is_err() {
                return Err(BusError::BadCredentials(format!(
                    "{ENV_NATS_NKEY_SEED_FILE}={path}: not an nkey seed"
                )));
            }
            return Ok(Credentials::Nkey { user, seed });
        }
        if let Some(path) = password_file {
            let password = read_secret(ENV_NATS_PASSWORD_FILE, &path)?;
            return Ok(Credentials::Password { user, password });
        }
        Err(BusError::BadCredentials(format!(
            "{ENV_NATS_USER} is set without {ENV_NATS_NKEY_SEED_FILE} or {ENV_NATS_PASSWORD_FILE}"
        )))
    }

    /// The user whose inbox replies arrive in, if there is one.
    pub fn user(&self) -> Option<&str> {
        match self {
            Credentials::Anonymous => None,
            Credentials::Nkey { user, .. } | Credentials::Password { user, .. } => Some(user),
        }
    }
}

/// An nkey user or account seed (`SU…`, `SA…`), 58 base32 characters.
fn looks_like_a_seed(arg: &str) -> bool {
    arg.split(['=', ' ', ':']).any(|word| {
        word.len() == 58
            && word.starts_with('S')
            && word
                .chars()
                .all(|c| c.is_ascii_uppercase() || ('2'..='7').contains(&c))
    })
}

impl TlsFiles {
    /// TLS as the environment names it: on when `LH_NATS_CA_FILE` is set,
    /// with a client certificate when both its variables are.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let set = |name: &str| env(name).filter(|v| !v.is_empty());
        let Some(ca_file) = set(ENV_NATS_CA_FILE) else {
            if set(ENV_NATS_CLIENT_CERT_FILE).is_some() || set(ENV_NATS_CLIENT_KEY_FILE).is_some() {
                return Err(BusError::BadCredentials(format!(
                    "a client certificate without {ENV_NATS_CA_FILE}"
                )));
            }
            return Ok(None);
        };
        let client_cert = match (
            set(ENV_NATS_CLIENT_CERT_FILE),
            set(ENV_NATS_CLIENT_KEY_FILE),
        ) {
            (Some(cert), Some(key)) => Some((cert.into(), key.into())),
            (None, None) => None,
            _ => {
                return Err(BusError::BadCredentials(format!(
                    "{ENV_NATS_CLIENT_CERT_FILE} and {ENV_NATS_CLIENT_KEY_FILE} go together"
                )))
            }
        };
        Ok(Some(TlsFiles {
            ca_file: ca_file.into(),
            client_cert,
        }))
    }
}

impl BusConfig {
    pub fn new(nats_url: impl Into<String>, client_name: impl Into<String>) -> Self {
        Self {
            nats_url: nats_url.into(),
            client_name: client_name.into(),
            events_max_bytes: EVENTS_DEFAULT_MAX_BYTES,
            replicas: 1,
            events_max_age: EVENTS_MAX_AGE,
            allow_short_retention: false,
            credentials: Credentials::Anonymous,
            tls: None,
        }
    }

    /// The shortest age the business log may keep events for under this
    /// configuration.
    pub fn least_events_max_age(&self) -> Duration {
        if self.allow_short_retention {
            self.events_max_age.min(EVENTS_MAX_AGE)
        } else {
            EVENTS_MAX_AGE
        }
    }
}

/// One event read from the log.
#[derive(Debug, Clone)]
pub struct Stored {
    pub sequence: u64,
    pub subject: String,
    pub envelope: Envelope,
    /// The raw bytes as stored: the audit chain hashes these.
    pub payload: Bytes,
    /// Messages left in the stream after this one: of this feed's filters,
    /// or, while the feed reads the stream whole, of every subject. 0
    /// exactly when nothing the feed reads follows it.
    pub pending: u64,
    /// When the server stored it, by the server's clock: what a writer's
    /// own timestamps are held against.
    pub stored_at: chrono::DateTime<chrono::Utc>,
    /// The W3C `traceparent` its writer sent with it, when it was traced:
    /// a reader continues that trace ([`continue_trace`]).
    pub trace_parent: Option<String>,
}

/// A stored message the reader cannot use, stepped over. It still counts
/// as read: it has a sequence, the audit chain covers its bytes, and
/// projections record it so that a rebuild steps over the same messages.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub sequence: u64,
    pub subject: String,
    /// The raw bytes as stored.
    pub payload: Bytes,
    /// Messages left in the stream after this one: of this feed's filters,
    /// or, while the feed reads the stream whole, of every subject. 0
    /// exactly when nothing the feed reads follows it.
    pub pending: u64,
    /// When JetStream stored it (the same on every replay).
    pub stored_at: chrono::DateTime<chrono::Utc>,
    pub why: Undecodable,
}

impl Skipped {
    pub fn reason(&self) -> SkipReason {
        self.why.reason
    }
}

/// One telemetry message as `LH_TELEMETRY` stored it, undecoded: samples
/// are not business events, and each reader knows its subjects' type.
#[derive(Debug, Clone)]
pub struct Sample {
    pub sequence: u64,
    pub subject: String,
    pub payload: Bytes,
    /// Messages left in the stream after this one: of this feed's filters,
    /// or, while the feed reads the stream whole, of every subject. 0
    /// exactly when nothing the feed reads follows it.
    pub pending: u64,
    /// When the server stored it, by the server's clock (the same on every
    /// replay): what a node's own clock is held against.
    pub stored_at: chrono::DateTime<chrono::Utc>,
}

/// What a feed delivers: every stored message of its filter, in order,
/// decoded or skipped.
// Events are nearly every item: boxing them would cost an allocation each
// to save space only on the rare skip.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum FeedItem {
    Event(Stored),
    Skipped(Skipped),
}

impl FeedItem {
    pub fn sequence(&self) -> u64 {
        match self {
            FeedItem::Event(e) => e.sequence,
            FeedItem::Skipped(s) => s.sequence,
        }
    }

    pub fn subject(&self) -> &str {
        match self {
            FeedItem::Event(e) => &e.subject,
            FeedItem::Skipped(s) => &s.subject,
        }
    }

    /// The aggregate subject the message is stored on or below, whether
    /// it decoded or not (`None` outside `lh.evt.>`).
    pub fn aggregate_subject(&self) -> Option<&str> {
        subject::aggregate_of(self.subject())
    }

    /// The raw bytes as stored.
    pub fn payload(&self) -> &Bytes {
        match self {
            FeedItem::Event(e) => &e.payload,
            FeedItem::Skipped(s) => &s.payload,
        }
    }

    /// Messages left in the stream after this one (see [`Stored::pending`]).
    pub fn pending(&self) -> u64 {
        match self {
            FeedItem::Event(e) => e.pending,
            FeedItem::Skipped(s) => s.pending,
        }
    }
}

#[derive(Clone)]
pub struct Bus {
    client: async_nats::Client,
    js: jetstream::Context,
    /// The connection's client name: the `service` label of its metrics.
    service: Arc<str>,
    /// Counts the times the client (re)connected; feeds reopen their
    /// consumers on a change rather than wait for heartbeats to go missing.
    connects: tokio::sync::watch::Receiver<u64>,
    /// Replicas of what this connection creates (the snapshot store).
    replicas: usize,
}

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
        deny_delete: true,
        deny_purge: true,
        allow_rollup: false,
        allow_atomic_publish: true,
        // The server refuses a window longer than the age limit (only a
        // test's log is that short).
        duplicate_window: DUPLICATE_WINDOW.min(max_age),
        num_replicas: replicas,
        ..Default::default()
    }
}

fn telemetry_stream_config(replicas: usize) -> StreamConfig {
    StreamConfig {
        name: subject::TELEMETRY_STREAM.to_string(),
        subjects: vec![subject::TELEMETRY_ALL.to_string()],
        storage: StorageType::File,
        retention: RetentionPolicy::Limits,
        max_age: TELEMETRY_MAX_AGE,
        discard: DiscardPolicy::Old,
        num_replicas: replicas,
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
    /// Connects, creates the streams when missing and checks what the server holds.
    pub async fn connect(config: &BusConfig) -> Result<Self> {
        let servers = server_addrs(&config.nats_url)?;
        let (connected, connects) = tokio::sync::watch::channel(0u64);
        let service = config.client_name.clone();
        // Down until the client says otherwise: a service that never
        // reaches NATS shows 0, not nothing, so an alert sees it.
        metrics::gauge!("lh_nats_connected", "service" => service.clone()).set(0.0);
        let mut options = async_nats::ConnectOptions::new();
        match &config.credentials {
            Credentials::Anonymous => {}
            Credentials::Nkey { seed, .. } => options = options.nkey(seed.clone()),
            Credentials::Password { user, password } => {
                options = options.user_and_password(user.clone(), password.clone())
            }
        }
        if let Some(user) = config.credentials.user() {
            // The server lets each user read replies on its own prefix only.
            options = options.custom_inbox_prefix(auth::inbox_prefix(user));
        }
        if let Some(tls) = &config.tls {
            options = options
                .require_tls(true)
                .add_root_certificates(tls.ca_file.clone());
            if let Some((cert, key)) = &tls.client_cert {
                options = options.add_client_certificate(cert.clone(), key.clone());
            }
        }
        let client = options
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
        let mut js = jetstream::new(client.clone());
        js.set_timeout(PUBLISH_ACK_TIMEOUT);
        let bus = Self {
            client,
            js,
            service: config.client_name.as_str().into(),
            connects,
            replicas: config.replicas,
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

    async fn ensure_streams(&self, config: &BusConfig) -> Result<()> {
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
        self.js
            .get_or_create_stream(telemetry_stream_config(config.replicas))
            .await
            .map_err(js_err)?;
        Ok(())
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Whether the connection to NATS is up right now (the client
    /// reconnects by itself; a service is not ready while it is down).
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
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

    async fn snapshot_store(&self) -> Result<jetstream::object_store::ObjectStore> {
        match self.js.get_object_store(SNAPSHOTS_BUCKET).await {
            Ok(store) => Ok(store),
            Err(_) => self
                .js
                .create_object_store(jetstream::object_store::Config {
                    bucket: SNAPSHOTS_BUCKET.to_string(),
                    description: Some(
                        "services' folded state at a sequence of LH_EVENTS: a cache, never the truth"
                            .into(),
                    ),
                    max_bytes: SNAPSHOTS_MAX_BYTES,
                    storage: StorageType::File,
                    num_replicas: self.replicas,
                    ..Default::default()
                })
                .await
                .map_err(js_err),
        }
    }

    /// Stores a snapshot under `key`, replacing the one there.
    pub async fn put_snapshot(&self, key: &str, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_SNAPSHOT_BYTES {
            return Err(BusError::JetStream(format!(
                "a snapshot of {} bytes is over the {MAX_SNAPSHOT_BYTES} allowed",
                bytes.len()
            )));
        }
        let store = self.snapshot_store().await?;
        let mut reader = bytes;
        store.put(key, &mut reader).await.map_err(js_err)?;
        Ok(())
    }

    /// The snapshot stored under `key`, if there is one.
    pub async fn get_snapshot(&self, key: &str) -> Result<Option<Vec<u8>>> {
        use tokio::io::AsyncReadExt as _;
        let store = self.snapshot_store().await?;
        let mut object = match store.get(key).await {
            Ok(object) => object,
            Err(e) if e.kind() == jetstream::object_store::GetErrorKind::NotFound => {
                return Ok(None)
            }
            Err(e) => return Err(js_err(e)),
        };
        let mut bytes = Vec::new();
        (&mut object)
            .take(MAX_SNAPSHOT_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(js_err)?;
        if bytes.len() > MAX_SNAPSHOT_BYTES {
            return Err(BusError::JetStream(format!(
                "the snapshot {key} is over the {MAX_SNAPSHOT_BYTES} bytes allowed"
            )));
        }
        Ok(Some(bytes))
    }

    /// Sequence of the newest event in the business log (0 when empty).
    pub async fn last_sequence(&self) -> Result<u64> {
        Ok(self.events_stream_state().await?.last_sequence)
    }

    /// Sequence of the newest sample on `LH_TELEMETRY` (0 when empty).
    pub async fn telemetry_last_sequence(&self) -> Result<u64> {
        let mut stream = self
            .js
            .get_stream(subject::TELEMETRY_STREAM)
            .await
            .map_err(js_err)?;
        Ok(stream.info().await.map_err(js_err)?.state.last_sequence)
    }

    fn headers(envelope: &Envelope, expect: Expect) -> HeaderMap {
        let mut headers = HeaderMap::new();
        inject_trace_context(&mut headers);
        headers.insert(header::NATS_MESSAGE_ID, envelope.id.to_string().as_str());
        headers.insert(EVENT_TYPE_HEADER, envelope.event_type.as_str());
        if let Expect::LastSubjectSequence(seq) = expect {
            headers.insert(
                header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                seq.to_string().as_str(),
            );
            // The event's own subject names its type and publisher; the
            // guard is on the whole aggregate.
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
                subject::guarded(&envelope.data.aggregate_subject()).as_str(),
            );
        }
        headers
    }

    /// Appends one event below its aggregate's subject.
    pub async fn publish(&self, envelope: &Envelope, expect: Expect) -> Result<Appended> {
        match self.publish_once(envelope, expect).await {
            Err(BusError::Conflict(conflict)) => {
                let batch = [(envelope.clone(), expect)];
                match self.past_legacy_tails(&batch).await? {
                    Some(moved) => self.publish_once(envelope, moved[0].1).await,
                    None => Err(BusError::Conflict(conflict)),
                }
            }
            other => other,
        }
    }

    async fn publish_once(&self, envelope: &Envelope, expect: Expect) -> Result<Appended> {
        let subject = envelope.subject();
        let ack = self
            .js
            .publish_with_headers(
                subject.clone(),
                Self::headers(envelope, expect),
                Bytes::from(envelope.to_json()),
            )
            .await
            .map_err(js_err)?
            .await
            .map_err(|e| publish_error(&subject, e))?;
        Ok(Appended {
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    /// After a conflict: the batch again with each guard that is above
    /// what its aggregate holds under `<aggregate>.>` lowered to that, or
    /// `None` when no guard is (the conflict is real) or one is below (a
    /// write the writer has not read).
    ///
    /// A writer guards with the sequence of the newest event it read on an
    /// aggregate. Where that is a legacy event (on the bare aggregate
    /// subject, written before subjects named their publisher), the server
    /// does not count it, and the guard could never match. The writer has
    /// read everything on the aggregate up to that event, so it has read
    /// everything the server counts: the guard the server counts is the
    /// one the writer meant.
    async fn past_legacy_tails(
        &self,
        batch: &[(Envelope, Expect)],
    ) -> Result<Option<Vec<(Envelope, Expect)>>> {
        let mut moved = batch.to_vec();
        let mut lowered = false;
        for (envelope, expect) in &mut moved {
            let Expect::LastSubjectSequence(seen) = *expect else {
                continue;
            };
            let counted = self
                .subject_last_sequence(&envelope.data.aggregate_subject())
                .await?;
            if counted > seen {
                return Ok(None);
            }
            if counted < seen {
                tracing::debug!(service = %self.service, aggregate = %envelope.data.aggregate_subject(),
                    seen, counted, "guarding past a legacy event");
                *expect = Expect::LastSubjectSequence(counted);
                lowered = true;
            }
        }
        Ok(lowered.then_some(moved))
    }

    /// Appends events to several aggregates as one atomic batch (ADR-50):
    /// the server stores all of them or none, and checks every message's
    /// expectation at commit.
    pub async fn publish_atomic(&self, events: &[(Envelope, Expect)]) -> Result<Appended> {
        assert!(
            !events.is_empty(),
            "an atomic batch holds at least one event"
        );
        assert!(events.len() <= MAX_BATCH_MESSAGES, "atomic batch too large");
        if events.len() == 1 {
            return self.publish(&events[0].0, events[0].1).await;
        }
        match self.publish_batch_once(events).await {
            Err(BusError::Conflict(conflict)) => match self.past_legacy_tails(events).await? {
                Some(moved) => self.publish_batch_once(&moved).await,
                None => Err(BusError::Conflict(conflict)),
            },
            other => other,
        }
    }

    async fn publish_batch_once(&self, events: &[(Envelope, Expect)]) -> Result<Appended> {
        let batch_id = uuid::Uuid::now_v7().simple().to_string();
        let last = events.len() - 1;
        let subjects: Vec<String> = events.iter().map(|(e, _)| e.subject()).collect();
        for (i, (envelope, expect)) in events.iter().enumerate() {
            let subject = subjects[i].clone();
            let mut headers = Self::headers(envelope, *expect);
            headers.insert(header::NATS_BATCH_ID, batch_id.as_str());
            headers.insert(header::NATS_BATCH_SEQUENCE, (i + 1).to_string().as_str());
            let payload = Bytes::from(envelope.to_json());
            if i < last {
                // Only the commit is acknowledged; earlier messages are
                // fire-and-forget on the same connection, so they arrive first.
                self.client
                    .publish_with_headers(subject.clone(), headers, payload)
                    .await
                    .map_err(js_err)?;
            } else {
                headers.insert(header::NATS_BATCH_COMMIT, header::NATS_BATCH_COMMIT_FINAL);
                let ack = self
                    .js
                    .publish_with_headers(subject.clone(), headers, payload)
                    .await
                    .map_err(js_err)?
                    .await
                    .map_err(|e| publish_error(&subjects.join(", "), e))?;
                return Ok(Appended {
                    sequence: ack.sequence,
                    duplicate: ack.duplicate,
                });
            }
        }
        unreachable!("the loop returns at the last event")
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
            head = head.max(
                self.last_sequence_in(subject::EVENTS_STREAM, filter)
                    .await?,
            );
        }
        Ok(head)
    }

    /// [`Bus::last_sequence_matching`] on `LH_TELEMETRY`.
    pub async fn telemetry_last_sequence_matching(&self, filters: &[&str]) -> Result<u64> {
        let mut head = 0;
        for filter in filters {
            head = head.max(
                self.last_sequence_in(subject::TELEMETRY_STREAM, filter)
                    .await?,
            );
        }
        Ok(head)
    }

    /// Stream sequence of the last event on any subject `filter` matches
    /// (0 when there is none).
    async fn last_sequence_on(&self, filter: &str) -> Result<u64> {
        self.last_sequence_in(lh_events::subject::EVENTS_STREAM, filter)
            .await
    }

    /// Sequence of the last message of `stream` on any subject `filter`
    /// matches (0 when there is none).
    async fn last_sequence_in(&self, stream: &str, filter: &str) -> Result<u64> {
        let stream = self.js.get_stream(stream).await.map_err(js_err)?;
        last_sequence_on_filter(&stream, filter).await
    }

    /// Replays the business log from `from_sequence` (1 for everything) for
    /// the subjects matching `filters`, then follows live, for as long as
    /// the [`Feed`] lives. Ordered consumer: gaps are detected and the
    /// consumer recreated by the client; when the consumer itself is lost
    /// (the server restarted, the connection dropped), the feed opens a new
    /// one after the last message it delivered, retrying until the server
    /// answers.
    pub async fn feed(&self, filters: &[&str], from_sequence: u64) -> Result<Feed> {
        self.open_feed(subject::EVENTS_STREAM, filters, from_sequence, true)
            .await
    }

    /// [`Bus::feed`] on `LH_TELEMETRY`: the samples of `filters` from
    /// `from_sequence` on (1 for all the stream still holds), then live.
    pub async fn telemetry_feed(
        &self,
        filters: &[&str],
        from_sequence: u64,
    ) -> Result<Feed<Sample>> {
        self.open_feed(subject::TELEMETRY_STREAM, filters, from_sequence, false)
            .await
    }

    /// [`Bus::feed`] for a second reading of what the service's own feeds
    /// already read (audit verification, a rebuild, a tool): the skipped
    /// messages are handed over as such but neither counted nor logged
    /// again, so that the skip counter tells how many there are, not how
    /// often someone looked.
    pub async fn reread(&self, filters: &[&str], from_sequence: u64) -> Result<Feed> {
        self.open_feed(subject::EVENTS_STREAM, filters, from_sequence, false)
            .await
    }

    async fn open_feed<T: FeedMessage>(
        &self,
        stream: &'static str,
        filters: &[&str],
        from_sequence: u64,
        report_skips: bool,
    ) -> Result<Feed<T>> {
        // The server refuses one consumer of overlapping filters; a merged
        // read would take them and count a message twice.
        for (i, a) in filters.iter().enumerate() {
            if let Some(b) = filters[i + 1..]
                .iter()
                .find(|b| subject::filters_overlap(a, b))
            {
                return Err(BusError::JetStream(format!(
                    "a feed's filters may not overlap: {a} and {b}"
                )));
            }
        }
        let mut connects = self.connects.clone();
        connects.mark_unchanged();
        let whole = match stream {
            subject::TELEMETRY_STREAM => subject::TELEMETRY_ALL,
            _ => subject::EVENTS_ALL,
        };
        let source = FeedSource {
            js: self.js.clone(),
            stream,
            filters: filters.iter().map(|f| f.to_string()).collect(),
            wide: (!filters.contains(&whole)).then(|| whole.to_string()),
            service: self.service.clone(),
            report_skips,
            connects,
            merge_backlogs: true,
        };
        // The first consumer is opened here so that a caller learns at once
        // of a server that refuses it; later ones are the pump's business.
        let elections = source.subscribe_elections().await;
        let messages = source.open(from_sequence.max(1)).await?;
        let (items, receiver) = tokio::sync::mpsc::channel(FEED_BUFFER_MESSAGES);
        let pump = tokio::spawn(source.pump(messages, elections, from_sequence.max(1), items));
        Ok(Feed { receiver, pump })
    }

    /// The events the log holds on one aggregate (`subject` is the
    /// aggregate's, and its legacy events count too) from `from_sequence`
    /// on, oldest first, at most `max_messages` of them (an error past
    /// that); messages that do not decode are left out.
    pub async fn subject_history(
        &self,
        subject: &str,
        from_sequence: u64,
        max_messages: usize,
    ) -> Result<Vec<Stored>> {
        let under = subject::guarded(subject);
        let last = self
            .last_sequence_on(subject)
            .await?
            .max(self.last_sequence_on(&under).await?);
        if last < from_sequence.max(1) {
            return Ok(Vec::new());
        }
        let mut feed = self.reread(&[subject, &under], from_sequence).await?;
        let mut events = Vec::new();
        loop {
            let item = feed
                .next_item_within(SUBJECT_HISTORY_READ_TIMEOUT)
                .await
                .ok_or_else(|| BusError::JetStream(format!("reading {subject} timed out")))??;
            let sequence = item.sequence();
            if let FeedItem::Event(event) = item {
                if events.len() == max_messages {
                    return Err(BusError::JetStream(format!(
                        "{subject} holds more than {max_messages} messages from {from_sequence}"
                    )));
                }
                events.push(event);
            }
            if sequence >= last {
                return Ok(events);
            }
        }
    }

    /// The oldest event the log still holds on an aggregate (`subject` is
    /// the aggregate's; for a lease, its request), if it holds one that
    /// decodes where it is stored.
    pub async fn first_event_on(&self, subject: &str) -> Result<Option<Envelope>> {
        let stream = self
            .js
            .get_stream(subject::EVENTS_STREAM)
            .await
            .map_err(js_err)?;
        // A legacy event on the bare aggregate subject is older than any
        // under it.
        for filter in [subject.to_string(), subject::guarded(subject)] {
            match stream.get_first_raw_message_by_subject(&filter, 1).await {
                Ok(m) => return Ok(Envelope::decode_stored(&m.subject, &m.payload).ok()),
                Err(e)
                    if e.kind()
                        == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound => {}
                Err(e) => return Err(js_err(e)),
            }
        }
        Ok(None)
    }

    /// The newest telemetry sample on `subject`, if the stream still has one.
    pub async fn last_telemetry(&self, subject: &str) -> Result<Option<Vec<u8>>> {
        let stream = self
            .js
            .get_stream(subject::TELEMETRY_STREAM)
            .await
            .map_err(js_err)?;
        match stream.get_last_raw_message_by_subject(subject).await {
            Ok(m) => Ok(Some(m.payload.to_vec())),
            Err(e)
                if e.kind()
                    == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
            {
                Ok(None)
            }
            Err(e) => Err(js_err(e)),
        }
    }

    /// The newest telemetry sample of every subject matching `filter` that
    /// the stream still holds (for example every node's last heartbeat), at
    /// most `max_subjects` of them.
    pub async fn last_telemetry_each(
        &self,
        filter: &str,
        max_subjects: usize,
    ) -> Result<Vec<Vec<u8>>> {
        let stream = self
            .js
            .get_stream(subject::TELEMETRY_STREAM)
            .await
            .map_err(js_err)?;
        let consumer = stream
            .create_consumer(OrderedConfig {
                filter_subject: filter.to_string(),
                deliver_policy: DeliverPolicy::LastPerSubject,
                ..Default::default()
            })
            .await
            .map_err(js_err)?;
        let mut messages = consumer.messages().await.map_err(js_err)?;
        // A sample stored while the consumer starts comes after the one it
        // supersedes: keep the newest per subject.
        let mut samples: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
        // An empty selection delivers nothing; a short wait tells that apart
        // from a slow server.
        loop {
            let next = tokio::time::timeout(Duration::from_millis(500), messages.next()).await;
            let Ok(Some(message)) = next else { break };
            let message = message.map_err(js_err)?;
            let pending = message.info().map_err(js_err)?.pending;
            let subject = message.subject.to_string();
            if samples.len() >= max_subjects && !samples.contains_key(&subject) {
                break;
            }
            samples.insert(subject, message.payload.to_vec());
            if pending == 0 {
                break;
            }
        }
        Ok(samples.into_values().collect())
    }

    /// Live telemetry samples on `filter`, as they are published.
    pub async fn subscribe_telemetry(&self, filter: &str) -> Result<async_nats::Subscriber> {
        self.client
            .subscribe(filter.to_string())
            .await
            .map_err(js_err)
    }

    /// Publishes a telemetry sample (heartbeat, usage) on `LH_TELEMETRY`
    /// without waiting for the store: losing one is harmless.
    pub async fn publish_telemetry(&self, subject: String, payload: Vec<u8>) -> Result<()> {
        self.client
            .publish(subject, payload.into())
            .await
            .map_err(js_err)
    }
}

/// The W3C trace context header.
pub const TRACE_PARENT_HEADER: &str = "traceparent";
/// A `traceparent` is `00-<32 hex>-<16 hex>-<2 hex>`: 55 characters.
const TRACE_PARENT_LEN: usize = 55;

/// Whether `value` has the shape of a W3C `traceparent` (a writer is not
/// trusted to send one).
fn is_trace_parent(value: &str) -> bool {
    value.len() == TRACE_PARENT_LEN
        && value
            .bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Makes `span` a child of the span that wrote an event (its
/// `trace_parent`), so one request reads as one trace across the services
/// it reaches. Nothing happens without a trace parent or without an
/// OpenTelemetry layer.
pub fn continue_trace(span: &tracing::Span, trace_parent: Option<&str>) {
    use opentelemetry::propagation::{Extractor, TextMapPropagator};
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct One<'a>(&'a str);
    impl Extractor for One<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            (key == TRACE_PARENT_HEADER).then_some(self.0)
        }
        fn keys(&self) -> Vec<&str> {
            vec![TRACE_PARENT_HEADER]
        }
    }
    let Some(trace_parent) = trace_parent.filter(|t| is_trace_parent(t)) else {
        return;
    };
    let context =
        opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&One(trace_parent));
    // Without the layer there is no trace to continue.
    let _ = span.set_parent(context);
}

/// Puts the current span's W3C trace context in the `traceparent` header,
/// so a trace follows an event from service to service. Without an OTLP
/// exporter the span context is empty and nothing is added.
fn inject_trace_context(headers: &mut HeaderMap) {
    use opentelemetry::propagation::{Injector, TextMapPropagator};
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct HeaderInjector<'a>(&'a mut HeaderMap);
    impl Injector for HeaderInjector<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key, value.as_str());
        }
    }
    let context = tracing::Span::current().context();
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .inject_context(&context, &mut HeaderInjector(headers));
}

fn publish_error(subject: &str, e: async_nats::jetstream::context::PublishError) -> BusError {
    let text = e.to_string();
    if e.kind() == PublishErrorKind::WrongLastSequence || text.contains("wrong last sequence") {
        BusError::Conflict(format!("{subject}: {text}"))
    } else if text.contains("error code 10201") {
        BusError::DuplicateBatch(format!("{subject}: {text}"))
    } else {
        BusError::JetStream(format!("{subject}: {text}"))
    }
}

/// What a feed's consumer delivers: a message, with how many of the
/// feed's filters follow it where a merged read counts them for it (its own
/// metadata counts those of one filter), or why the consumer is lost.
type MessageStream = std::pin::Pin<
    Box<
        dyn futures::Stream<Item = std::result::Result<(jetstream::Message, Option<u64>), String>>
            + Send,
    >,
>;

/// Sequence of the last message of `stream` on any subject `filter`
/// matches (0 when there is none).
async fn last_sequence_on_filter(stream: &jetstream::stream::Stream, filter: &str) -> Result<u64> {
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

/// Messages a feed reads (and decodes) ahead of its reader: enough that a
/// projection's next transaction is read while it writes the last one, and
/// at about 2 KiB a decoded event, a few MiB at most per feed.
const FEED_BUFFER_MESSAGES: usize = 1024;
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
struct FeedSource {
    js: jetstream::Context,
    /// The stream read: the business log or the telemetry stream.
    stream: &'static str,
    filters: Vec<String>,
    /// The stream's whole subject space, when the filters are narrower: what
    /// a stream its filters match often is read as.
    wide: Option<String>,
    service: Arc<str>,
    /// Count and log each skipped message (false on a second reading).
    report_skips: bool,
    connects: tokio::sync::watch::Receiver<u64>,
    /// Whether a long backlog of several filters may be read merged; off
    /// from a merged read that failed until the feed is at the head, so
    /// that a consumer which never delivers what it counted cannot hold
    /// the feed in a loop of merges.
    merge_backlogs: bool,
}

impl FeedSource {
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
                .create_consumer(OrderedConfig {
                    filter_subjects: vec![filter.clone()],
                    deliver_policy: deliver_from(from_sequence),
                    ..Default::default()
                })
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
        OrderedConfig {
            filter_subjects,
            deliver_policy: deliver_from(from_sequence),
            ..Default::default()
        }
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
        let mut held = Held::default();
        let mut density = Density::default();
        loop {
            let hold_over = held.deadline();
            let next = tokio::select! {
                next = messages.next() => next,
                // A new connection may be to a restarted server that lost
                // the consumer: reopen now, not heartbeats later.
                Ok(()) = self.connects.changed() => {
                    tracing::info!(service = %self.service, filters = ?self.filters,
                        next_sequence, "reconnected to NATS; reopening the event feed");
                    if !held.hand_over(&items).await {
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
                    if !held.hand_over(&items).await {
                        return;
                    }
                    (messages, reading) = self.reopen(next_sequence, &mut elections).await;
                    continue;
                }
                // Messages the filters do not match keep coming: the held
                // one may not wait for the head.
                _ = hold_over => {
                    if !held.hand_over(&items).await {
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
                            &mut held,
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
            if !held.hand_over(&items).await {
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
        held: &mut Held<T>,
        density: &mut Density,
        items: &tokio::sync::mpsc::Sender<Result<T>>,
    ) -> Delivered {
        let mut info = match message.info() {
            Ok(info) => info,
            Err(e) => {
                // Not a JetStream message at all: no retry gives it a
                // sequence, and without one the order is lost. What was
                // read before it is handed over first, in order.
                if held.hand_over(items).await {
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
            let item = T::from_message(self, &message, &info);
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
            let item = T::from_message(self, &message, &info);
            if !held.hand_over(items).await {
                return Delivered::ReaderGone;
            }
            held.keep(item);
        }
        if at_head {
            held.mark_last();
            if !held.hand_over(items).await {
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
struct Held<T> {
    item: Option<T>,
    since: tokio::time::Instant,
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Held {
            item: None,
            since: tokio::time::Instant::now(),
        }
    }
}

impl<T: FeedMessage> Held<T> {
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

/// When the server stored a message.
fn stored_at(info: &jetstream::message::Info) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(info.published.unix_timestamp(), info.published.nanosecond())
        .unwrap_or_default()
}

/// What a feed makes of one stored message.
trait FeedMessage: Send + 'static {
    fn from_message(
        source: &FeedSource,
        message: &jetstream::Message,
        info: &jetstream::message::Info,
    ) -> Self;
    /// Says that nothing the feed reads follows it (pending 0).
    fn mark_last(&mut self);
}

impl FeedMessage for Sample {
    fn from_message(
        _: &FeedSource,
        message: &jetstream::Message,
        info: &jetstream::message::Info,
    ) -> Self {
        Sample {
            sequence: info.stream_sequence,
            subject: message.subject.to_string(),
            payload: message.payload.clone(),
            pending: info.pending,
            stored_at: stored_at(info),
        }
    }

    fn mark_last(&mut self) {
        self.pending = 0;
    }
}

impl FeedMessage for FeedItem {
    /// Decodes one event, or counts and logs it as skipped.
    fn from_message(
        source: &FeedSource,
        message: &jetstream::Message,
        info: &jetstream::message::Info,
    ) -> Self {
        source.item(message, info)
    }

    fn mark_last(&mut self) {
        match self {
            FeedItem::Event(e) => e.pending = 0,
            FeedItem::Skipped(s) => s.pending = 0,
        }
    }
}

impl FeedSource {
    /// Decodes one message, or counts and logs it as skipped.
    fn item(&self, message: &jetstream::Message, info: &jetstream::message::Info) -> FeedItem {
        let (sequence, pending) = (info.stream_sequence, info.pending);
        let subject = message.subject.to_string();
        let payload = message.payload.clone();
        let stored_at = stored_at(info);
        let trace_parent = message
            .headers
            .as_ref()
            .and_then(|h| h.get(TRACE_PARENT_HEADER))
            .map(|v| v.as_str())
            .filter(|v| is_trace_parent(v))
            .map(str::to_string);
        match Envelope::decode_stored(&subject, &payload) {
            Ok(envelope) => FeedItem::Event(Stored {
                sequence,
                subject,
                envelope,
                payload,
                pending,
                stored_at,
                trace_parent,
            }),
            Err(why) => {
                if self.report_skips {
                    metrics::counter!("lh_events_skipped_total",
                        "service" => self.service.to_string(), "reason" => why.reason.as_str())
                    .increment(1);
                    tracing::warn!(service = %self.service, sequence, subject, reason = %why.reason,
                        detail = %why.detail, "skipping a stored message this service cannot use");
                }
                FeedItem::Skipped(Skipped {
                    sequence,
                    subject,
                    payload,
                    pending,
                    stored_at,
                    why,
                })
            }
        }
    }
}

/// Messages of one filter in stream order. A task reads them ahead (a
/// few at most) and survives losing its consumer, so that waiting on a
/// feed can be given up at any time without losing a message.
pub struct Feed<T = FeedItem> {
    receiver: tokio::sync::mpsc::Receiver<Result<T>>,
    pump: tokio::task::JoinHandle<()>,
}

impl<T> Drop for Feed<T> {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

impl<T> Feed<T> {
    /// The next stored message, decoded or skipped (a skip is counted and
    /// logged once, when read). Waits through a lost connection or a
    /// restarted server; an error only for a message without JetStream
    /// metadata, after which the feed ends (`None`).
    pub async fn next_item(&mut self) -> Option<Result<T>> {
        self.receiver.recv().await
    }

    /// Like [`Feed::next_item`], but gives up after `timeout` with `None`.
    pub async fn next_item_within(&mut self, timeout: Duration) -> Option<Result<T>> {
        tokio::time::timeout(timeout, self.next_item())
            .await
            .ok()
            .flatten()
    }

    /// The next message the feed has already read, without waiting: a
    /// reader behind the feed takes what waits for it. Its `pending` was
    /// counted when the feed read it, so it tells less than waits now.
    pub fn next_item_read(&mut self) -> Option<Result<T>> {
        self.receiver.try_recv().ok()
    }
}

impl Feed {
    /// The next event this code can use, stepping over the others (see
    /// [`Feed::next_item`]): for readers that act on events and keep no
    /// record of where they stand. A skipped message is never the answer,
    /// so after one that was last (`pending` 0) this waits for the next
    /// event.
    pub async fn next(&mut self) -> Option<Result<Stored>> {
        loop {
            match self.next_item().await? {
                Ok(FeedItem::Event(event)) => return Some(Ok(event)),
                Ok(FeedItem::Skipped(_)) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// Like [`Feed::next`], but gives up after `timeout` with `None`.
    pub async fn next_within(&mut self, timeout: Duration) -> Option<Result<Stored>> {
        tokio::time::timeout(timeout, self.next())
            .await
            .ok()
            .flatten()
    }
}

/// Request/reply between services (never stored): a JSON request on a
/// `lh.rpc.*` subject, answered by one member of a queue group.
pub mod rpc {
    use super::*;
    use serde::{de::DeserializeOwned, Serialize};

    /// Answer of a responder that failed: `{"error": "..."}`.
    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    pub struct RpcFailure {
        pub error: String,
    }

    /// Sends `request` and waits up to `timeout` for the answer.
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
        bus: &Bus,
        subject: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp> {
        let payload = serde_json::to_vec(request).map_err(js_err)?;
        let reply = tokio::time::timeout(
            timeout,
            bus.client.request(subject.to_string(), payload.into()),
        )
        .await
        .map_err(|_| BusError::JetStream(format!("{subject}: no answer within {timeout:?}")))?
        .map_err(|e| BusError::JetStream(format!("{subject}: {e}")))?;
        if let Ok(failure) = serde_json::from_slice::<RpcFailure>(&reply.payload) {
            return Err(BusError::JetStream(format!("{subject}: {}", failure.error)));
        }
        serde_json::from_slice(&reply.payload)
            .map_err(|e| BusError::JetStream(format!("{subject}: bad answer: {e}")))
    }

    /// Answers requests on `subject` (queue group `queue`) with `handler`
    /// until the subscription ends. Handler errors become `{"error": ...}`.
    pub async fn serve<Req, Resp, F, Fut>(
        bus: &Bus,
        subject: &str,
        queue: &str,
        handler: F,
    ) -> Result<()>
    where
        Req: DeserializeOwned,
        Resp: Serialize,
        F: Fn(Req) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<Resp, String>>,
    {
        serve_subjects(bus, subject, queue, |_, request| handler(request)).await
    }

    /// [`serve`] for a wildcard `subject`: `handler` is also given the
    /// subject each request came on, where the asker's permissions make
    /// that subject say who asks.
    pub async fn serve_subjects<Req, Resp, F, Fut>(
        bus: &Bus,
        subject: &str,
        queue: &str,
        handler: F,
    ) -> Result<()>
    where
        Req: DeserializeOwned,
        Resp: Serialize,
        F: Fn(&str, Req) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<Resp, String>>,
    {
        let mut sub = bus
            .client
            .queue_subscribe(subject.to_string(), queue.to_string())
            .await
            .map_err(js_err)?;
        while let Some(msg) = sub.next().await {
            let Some(reply) = msg.reply.clone() else {
                continue;
            };
            let answer = match serde_json::from_slice::<Req>(&msg.payload) {
                Ok(req) => match handler(msg.subject.as_str(), req).await {
                    Ok(resp) => serde_json::to_vec(&resp),
                    Err(error) => serde_json::to_vec(&RpcFailure { error }),
                },
                Err(e) => serde_json::to_vec(&RpcFailure {
                    error: format!("bad request: {e}"),
                }),
            }
            .map_err(js_err)?;
            if let Err(e) = bus.client.publish(reply, answer.into()).await {
                tracing::warn!(error = %e, subject, "cannot answer request");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::{Actor, EventData, LeaseStopRequested};
    use tracing_subscriber::layer::SubscriberExt;

    fn envelope() -> Envelope {
        Envelope::new(
            Actor::Admin,
            chrono::Utc::now(),
            EventData::LeaseStopRequested(LeaseStopRequested {
                lease_id: uuid::Uuid::nil(),
            }),
        )
    }

    #[test]
    fn a_nats_url_names_one_server_or_a_list() {
        let one = server_addrs("nats://127.0.0.1:4222").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].host(), "127.0.0.1");
        assert_eq!(one[0].port(), 4222);

        let cluster = server_addrs("nats://a:4222, nats://b:4223 ,c").unwrap();
        let hosts: Vec<(&str, u16)> = cluster.iter().map(|a| (a.host(), a.port())).collect();
        assert_eq!(hosts, [("a", 4222), ("b", 4223), ("c", 4222)]);
    }

    #[test]
    fn a_bad_nats_url_is_refused_with_the_culprit() {
        for bad in ["", "nats://a:4222,", "nats://a:4222,,nats://b:4222"] {
            assert!(
                matches!(server_addrs(bad), Err(BusError::BadServerAddr { .. })),
                "{bad:?} was accepted"
            );
        }
        match server_addrs("nats://a:4222,http://b:80") {
            Err(BusError::BadServerAddr { addr, .. }) => assert_eq!(addr, "http://b:80"),
            other => panic!("a non-NATS scheme was accepted: {other:?}"),
        }
        let too_many = vec!["nats://a:4222"; MAX_SERVER_ADDRS + 1].join(",");
        assert!(server_addrs(&too_many).is_err());
    }

    #[test]
    fn headers_carry_id_type_expectation_and_trace_context() {
        use opentelemetry::trace::TracerProvider as _;
        let env = envelope();
        let plain = Bus::headers(&env, Expect::LastSubjectSequence(7));
        assert_eq!(
            plain.get(header::NATS_MESSAGE_ID).unwrap().as_str(),
            env.id.to_string()
        );
        assert_eq!(
            plain.get(EVENT_TYPE_HEADER).unwrap().as_str(),
            "lease.stop_requested"
        );
        assert_eq!(
            plain
                .get(header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE)
                .unwrap()
                .as_str(),
            "7"
        );
        assert!(
            plain.get("traceparent").is_none(),
            "no span, no trace context"
        );

        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("append");
            let _entered = span.enter();
            let traced = Bus::headers(&env, Expect::Any);
            let tp = traced.get("traceparent").expect("traceparent set").as_str();
            assert!(tp.starts_with("00-") && tp.len() == 55, "{tp}");
        });
    }

    #[test]
    fn a_reader_continues_a_well_formed_trace_parent_and_ignores_any_other() {
        use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let written = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert!(is_trace_parent(written));
        for hostile in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",
            "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n",
            &"a".repeat(4096),
        ] {
            assert!(!is_trace_parent(hostile), "{hostile:?}");
        }
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let trace_of = |parent: Option<&str>| {
                let span = tracing::info_span!("read");
                continue_trace(&span, parent);
                span.context().span().span_context().trace_id().to_string()
            };
            assert_eq!(trace_of(Some(written)), "0af7651916cd43dd8448eb211c80319c");
            assert_ne!(trace_of(Some("00-zzz")), "0af7651916cd43dd8448eb211c80319c");
            assert_ne!(trace_of(None), "0af7651916cd43dd8448eb211c80319c");
        });
    }
}
