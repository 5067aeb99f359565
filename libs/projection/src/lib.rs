//! Read models in PostgreSQL, rebuilt from the log at will.
//!
//! A [`Projector`] turns one stored event into row changes. The
//! [`run`] loop applies each event in its own transaction together with the
//! stream sequence it came from (`projection_offsets`), so a crash anywhere
//! neither loses nor doubles a row: on restart the loop resumes right after
//! the last committed sequence.
//!
//! Each service owns one Postgres schema; every connection of its pool has
//! `search_path` set to it, so projector SQL is unqualified and [`rebuild`]
//! can replay the whole log into a fresh schema with the same code.
//!
//! A stored message the service cannot decode is not an error: the runner
//! records it in `skipped_events`, in the same transaction that moves the
//! offset past it, so the tables say what they do not reflect and a
//! rebuild records the very same rows.
//!
//! The same loop reads the telemetry stream for a projection that says so
//! ([`Projector::stream`]): samples come undecoded ([`Sample`]) and have no
//! `skipped_events` row (the projector counts what it cannot use), but
//! their stream position commits with their rows just the same. Such a
//! projection outlives the stream's 48 hours: it is [`replay`]ed into a
//! schema, never rebuilt from nothing.
//!
//! A projection of the log's messages rather than its events (a copy of the
//! log, which must hold every stored message whether it decodes or not)
//! takes each run of messages whole ([`Projector::apply_messages`]), and
//! may keep its offset in its own rows ([`Projector::own_offset`]): one row
//! a message is an offset already, and a second one could only disagree.

use std::time::Duration;

use futures::future::BoxFuture;
use lh_bus::{FeedItem, Sample, Stored};
use sqlx::PgConnection;

mod commit;
mod database;
mod live;
mod progress;
mod rebuild;
mod replay;
mod retry;
mod stream;

pub use commit::{judge_messages, Judged, Verdict};
pub use database::{committed_sequence, connect_schema, is_unavailable, migrate};
pub use live::{run, run_observed};
pub use progress::Progress;
pub use rebuild::{
    compare_tables, rebuild, rebuild_and_compare, swap_schemas, table_digest, RebuildReport,
    TableComparison,
};
pub use replay::replay;

/// Metrics this library records, with their `# HELP` text.
pub const METRICS: &[(&str, &str)] = &[(
    "lh_projection_retries_total",
    "Times a projection failed to apply or read and waited to try again, by projection.",
)];

/// Most connections one service's pool opens.
pub const MAX_POOL_CONNECTIONS: u32 = 16;
/// Most events one projection transaction applies, live or replayed: a
/// backlog commits in few transactions, with many leases per multi-row
/// statement. A live runner takes only what was waiting when its
/// transaction began, read ahead by its feed or stored (see
/// [`run_observed`]), so at the head a transaction is a few events and the
/// first one's commit is not held for later ones.
pub const MAX_EVENTS_PER_TRANSACTION: usize = 4096;
/// Longest a live runner waits for the next event its feed says is already
/// stored (`pending`) before it commits what it has.
pub const MAX_WAIT_FOR_PENDING_EVENT: Duration = Duration::from_millis(5);
/// Transactions a [`replay`] reads ahead of the one it writes, in a task of
/// their own: reading and decoding the next one overlaps writing this one,
/// so a rebuild costs about the longer of the two rather than their sum. At
/// [`MAX_EVENTS_PER_TRANSACTION`] events of about 2 KiB decoded, 8 MiB each.
pub const MAX_REPLAY_TRANSACTIONS_READ_AHEAD: usize = 1;
/// Longest a caller waits for a connection of the pool. A healthy pool
/// hands one out in milliseconds; past this the database is out of reach or
/// overloaded, and an API answers 503 rather than hang.
pub const POOL_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// The runner's record of the messages a projection stepped over.
pub const SKIPPED_TABLE: &str = "skipped_events";

#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The schema records migrations this build does not have, or others
    /// under the same versions: it was made by another history of the
    /// schema (docs/adr/025). A read model is rebuilt from the log, so the
    /// way out is to drop it, never to guess how to carry it over.
    #[error(
        "schema {schema:?} was made by migrations this build does not have ({detail}); \
         its read model is rebuilt from the log: drop the schema \
         (`make clean-data` for `make up`) and start again"
    )]
    ForeignMigrations { schema: String, detail: String },
    #[error("bus: {0}")]
    Bus(#[from] lh_bus::BusError),
    #[error("invalid schema name {0:?}")]
    SchemaName(String),
    #[error("the event feed closed")]
    FeedClosed,
}

pub type Result<T, E = ProjectionError> = std::result::Result<T, E>;

/// The stream a projection reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// `LH_EVENTS`, the business log: events, decoded or skipped.
    Events,
    /// `LH_TELEMETRY`: samples, kept 48 hours.
    Telemetry,
}

/// Turns events into rows. Must be idempotent per event and deterministic:
/// a rebuild from sequence 1 has to produce the very same rows.
pub trait Projector: Send + Sync + 'static {
    /// Key of this projection's offset row.
    fn name(&self) -> &'static str;
    /// Subjects this projection reads.
    fn filters(&self) -> &'static [&'static str];
    /// Applies one event inside the caller's transaction.
    fn apply<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        event: &'c Stored,
    ) -> BoxFuture<'c, sqlx::Result<()>>;
    /// Applies consecutive events, in stream order, inside the caller's
    /// transaction, to the same rows [`Projector::apply`] one by one would
    /// leave. A backlog (a rebuild, a catch-up) is mostly such runs: a
    /// projector that folds a run into a few statements saves a round trip
    /// to the database per event.
    fn apply_batch<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        events: &'c [&'c Stored],
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async move {
            for event in events {
                self.apply(&mut *conn, event).await?;
            }
            Ok(())
        })
    }
    /// Applies consecutive messages of the log, in stream order, inside
    /// the caller's transaction: by default each run of events through
    /// [`Projector::apply`] (or [`Projector::apply_batch`]), and each
    /// message the service cannot decode recorded in [`SKIPPED_TABLE`]. A
    /// projection of the log's messages rather than its events, which has
    /// a row for every stored message decoded or not, overrides it.
    fn apply_messages<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        messages: &'c [&'c FeedItem],
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(commit::apply_events_recording_skips(self, conn, messages))
    }
    /// How far, in seconds, a node's clock may be from the log's: the
    /// default [`Projector::apply_messages`] holds the times a node wrote to
    /// within this of when the log stored them, as the services that decide
    /// do, so that a view shows the times the bills count.
    fn node_clock_skew_secs(&self) -> i64 {
        lh_events::node_time::DEFAULT_NODE_CLOCK_SKEW_SECS
    }
    /// The last sequence this projection's own rows reflect, for one whose
    /// rows are their own offset (a row for every message of the log): read
    /// in each transaction before what follows is applied, and the runner
    /// then keeps no `projection_offsets` row for it. Runners take turns on
    /// that row; such a projection makes sure itself that one runner writes
    /// at a time. `None` (the default): the runner keeps the offset.
    fn own_offset<'c>(
        &'c self,
        _conn: &'c mut PgConnection,
    ) -> BoxFuture<'c, sqlx::Result<Option<u64>>> {
        Box::pin(async { Ok(None) })
    }
    /// The stream its [`Projector::filters`] are on.
    fn stream(&self) -> Stream {
        Stream::Events
    }
    /// Applies one telemetry sample inside the caller's transaction (a
    /// projection of [`Stream::Telemetry`]; one of the log reads none).
    fn apply_sample<'c>(
        &'c self,
        _conn: &'c mut PgConnection,
        _sample: &'c Sample,
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async { Ok(()) })
    }
    /// Applies consecutive samples, in stream order, inside the caller's
    /// transaction, to the same rows [`Projector::apply_sample`] one by one
    /// would leave (see [`Projector::apply_batch`]).
    fn apply_samples<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        samples: &'c [&'c Sample],
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async move {
            for sample in samples {
                self.apply_sample(&mut *conn, sample).await?;
            }
            Ok(())
        })
    }
}
