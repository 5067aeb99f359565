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

use std::time::Duration;

use futures::future::BoxFuture;
use lh_bus::{Bus, Feed, FeedItem, Sample, Skipped, Stored};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use tokio::sync::watch;
use tracing::Instrument;

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

/// One message a projection reads, from either stream.
// A projection reads one stream: boxing the log's items would cost an
// allocation each for nothing.
#[allow(clippy::large_enum_variant)]
enum Item {
    Log(FeedItem),
    Sample(Sample),
}

impl Item {
    fn sequence(&self) -> u64 {
        match self {
            Item::Log(item) => item.sequence(),
            Item::Sample(sample) => sample.sequence,
        }
    }

    fn pending(&self) -> u64 {
        match self {
            Item::Log(item) => item.pending(),
            Item::Sample(sample) => sample.pending,
        }
    }
}

/// The feed of a projection's stream.
enum Input {
    Log(Feed),
    Telemetry(Feed<Sample>),
}

impl Input {
    /// A feed of what `projector` reads from `from_sequence` on; `reread`
    /// for a second reading of the log (a rebuild).
    async fn open<P: Projector>(
        bus: &Bus,
        projector: &P,
        from_sequence: u64,
        reread: bool,
    ) -> Result<Self> {
        Ok(match (projector.stream(), reread) {
            (Stream::Events, false) => {
                Input::Log(bus.feed(projector.filters(), from_sequence).await?)
            }
            (Stream::Events, true) => {
                Input::Log(bus.reread(projector.filters(), from_sequence).await?)
            }
            (Stream::Telemetry, _) => Input::Telemetry(
                bus.telemetry_feed(projector.filters(), from_sequence)
                    .await?,
            ),
        })
    }

    fn next_item_read(&mut self) -> Option<Result<Item>> {
        match self {
            Input::Log(feed) => feed
                .next_item_read()
                .map(|r| r.map(Item::Log).map_err(Into::into)),
            Input::Telemetry(feed) => feed
                .next_item_read()
                .map(|r| r.map(Item::Sample).map_err(Into::into)),
        }
    }

    async fn next_item_within(&mut self, timeout: Duration) -> Option<Result<Item>> {
        match self {
            Input::Log(feed) => feed
                .next_item_within(timeout)
                .await
                .map(|r| r.map(Item::Log).map_err(Into::into)),
            Input::Telemetry(feed) => feed
                .next_item_within(timeout)
                .await
                .map(|r| r.map(Item::Sample).map_err(Into::into)),
        }
    }
}

/// The newest sequence of the stream `projector` reads.
async fn head<P: Projector>(bus: &Bus, projector: &P) -> Result<u64> {
    Ok(match projector.stream() {
        Stream::Events => bus.last_sequence().await?,
        Stream::Telemetry => bus.telemetry_last_sequence().await?,
    })
}

/// The newest sequence `projector`'s filters match: what its tables must
/// reach to be at the head.
async fn filtered_head<P: Projector>(bus: &Bus, projector: &P) -> Result<u64> {
    Ok(match projector.stream() {
        Stream::Events => bus.last_sequence_matching(projector.filters()).await?,
        Stream::Telemetry => {
            bus.telemetry_last_sequence_matching(projector.filters())
                .await?
        }
    })
}

fn check_schema_name(schema: &str) -> Result<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !schema.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(ProjectionError::SchemaName(schema.to_string()))
    }
}

/// A pool whose connections all work inside `schema` (created when missing).
pub async fn connect_schema(database_url: &str, schema: &str) -> Result<PgPool> {
    check_schema_name(schema)?;
    let base: PgConnectOptions = database_url.parse()?;
    {
        // A service may start before its database answers (they start
        // together, or the database restarts): wait for it.
        let mut wait = RETRY_MIN;
        let admin = loop {
            match PgPoolOptions::new()
                .max_connections(1)
                .connect_with(base.clone())
                .await
            {
                Ok(admin) => break admin,
                Err(e) if is_unavailable(&e) => {
                    tracing::warn!(schema, error = %e, retry_in_ms = wait.as_millis() as u64,
                        "the database does not answer yet");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
                Err(e) => return Err(e.into()),
            }
        };
        // Two services starting at once may race on CREATE SCHEMA.
        let _ = sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .execute(&admin)
            .await;
        admin.close().await;
    }
    let options = base.options([("search_path", schema)]);
    Ok(PgPoolOptions::new()
        .max_connections(MAX_POOL_CONNECTIONS)
        .acquire_timeout(POOL_ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await?)
}

/// Runs the service's migrations and the runner's own offset table.
pub async fn migrate(pool: &PgPool, migrator: &Migrator) -> Result<()> {
    migrator.run(pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS projection_offsets (
            name TEXT PRIMARY KEY,
            sequence BIGINT NOT NULL
        )",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS skipped_events (
            projection TEXT NOT NULL,
            sequence BIGINT NOT NULL,
            subject TEXT NOT NULL,
            reason TEXT NOT NULL,
            stored_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (projection, sequence)
        )",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Whether a database error means PostgreSQL is out of reach for now
/// (down, restarting, refusing connections, out of connections), not that
/// the statement is wrong: what a caller should retry, or answer with 503.
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // SQLSTATE classes 08 (connection exception), 53 (insufficient
        // resources) and 57P (the server is shutting down or starting).
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("53") || c.starts_with("57P")),
        _ => false,
    }
}

/// First wait after a failed write to the database; doubles up to
/// [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Runs `attempt` until it succeeds or `shutdown` resolves (`None`),
/// backing off between failures and telling `stalled` meanwhile. A
/// projection must never end for an outage: PostgreSQL restarts, and the
/// tables catch up when it is back.
async fn until_done<T, F, Fut>(
    projection: &'static str,
    what: &'static str,
    shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    stalled: &watch::Sender<bool>,
    mut attempt: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut wait = RETRY_MIN;
    loop {
        match attempt().await {
            Ok(value) => {
                if stalled.send_replace(false) {
                    tracing::info!(projection, "the database answers again");
                }
                return Some(value);
            }
            Err(e) => {
                stalled.send_replace(true);
                let outage = matches!(&e, ProjectionError::Database(db) if is_unavailable(db));
                if outage {
                    tracing::warn!(projection, error = %e, retry_in_ms = wait.as_millis() as u64, "cannot {what}: database unavailable");
                } else {
                    tracing::error!(projection, error = %e, retry_in_ms = wait.as_millis() as u64, "cannot {what}");
                }
                metrics::counter!("lh_projection_retries_total", "projection" => projection)
                    .increment(1);
                tokio::select! {
                    _ = shutdown.as_mut() => return None,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Makes sure the projection's offset row exists, so that every runner's
/// `FOR UPDATE` on it locks something: two runners starting at once on an
/// empty schema then take turns instead of both applying the first events.
async fn ensure_offset_row(pool: &PgPool, name: &str) -> Result<()> {
    sqlx::query(
        "INSERT INTO projection_offsets (name, sequence) VALUES ($1, 0)
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(name)
    .execute(pool)
    .await?;
    Ok(())
}

/// Last sequence this projection committed (0 when it never ran).
pub async fn committed_sequence(pool: &PgPool, name: &str) -> Result<u64> {
    let seq: Option<i64> =
        sqlx::query_scalar("SELECT sequence FROM projection_offsets WHERE name = $1")
            .bind(name)
            .fetch_optional(pool)
            .await?;
    Ok(seq.unwrap_or(0) as u64)
}

/// Where a running projection stands; cheap to clone and share with handlers.
#[derive(Clone)]
pub struct Progress {
    applied: watch::Receiver<u64>,
    caught_up: watch::Receiver<bool>,
    stalled: watch::Receiver<bool>,
}

impl Progress {
    /// True while the projection cannot write to the database (it retries).
    pub fn stalled(&self) -> bool {
        *self.stalled.borrow()
    }

    /// Waits until [`Progress::stalled`] changes; false once the
    /// projection has ended.
    pub async fn stalled_changed(&mut self) -> bool {
        self.stalled.changed().await.is_ok()
    }

    /// Highest stream sequence reflected in the tables.
    pub fn applied(&self) -> u64 {
        *self.applied.borrow()
    }

    /// True once the projection has replayed the log up to its head.
    pub fn caught_up(&self) -> bool {
        *self.caught_up.borrow()
    }

    /// Waits until the tables reflect `sequence` (read-your-writes for an
    /// API that just appended an event). False on timeout.
    pub async fn wait_for(&self, sequence: u64, timeout: Duration) -> bool {
        let mut rx = self.applied.clone();
        tokio::time::timeout(timeout, rx.wait_for(|s| *s >= sequence))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    /// Waits until the projection first reaches the head of the log.
    pub async fn wait_caught_up(&self, timeout: Duration) -> bool {
        let mut rx = self.caught_up.clone();
        tokio::time::timeout(timeout, rx.wait_for(|c| *c))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }
}

/// Runs `projector` until `shutdown` resolves. `on_progress` is handed the
/// progress view before the first event is read.
pub async fn run<P: Projector>(
    bus: &Bus,
    pool: &PgPool,
    projector: &P,
    shutdown: impl std::future::Future<Output = ()>,
    on_progress: impl FnOnce(Progress),
) -> Result<()> {
    run_observed(bus, pool, projector, shutdown, on_progress, |_| async {}).await
}

/// [`run`], telling `on_committed` the subjects of a batch of messages of
/// the log (in log order) once the tables reflect them (applied by this
/// runner or by another one of the same projection), and awaiting it
/// before [`Progress::applied`] says so: a cache of what the tables hold
/// can forget or re-read what changed before anyone waiting for that
/// sequence reads again.
pub async fn run_observed<P: Projector, Committed: std::future::Future<Output = ()>>(
    bus: &Bus,
    pool: &PgPool,
    projector: &P,
    shutdown: impl std::future::Future<Output = ()>,
    on_progress: impl FnOnce(Progress),
    mut on_committed: impl FnMut(Vec<String>) -> Committed,
) -> Result<()> {
    let name = projector.name();
    let (stalled_tx, stalled_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    let start = until_done(
        name,
        "read its offset",
        &mut shutdown,
        &stalled_tx,
        || async {
            ensure_offset_row(pool, name).await?;
            committed_sequence(pool, name).await
        },
    )
    .await;
    let Some(start) = start else {
        return Ok(());
    };
    let (applied_tx, applied_rx) = watch::channel(start);
    let (caught_tx, caught_rx) = watch::channel(false);
    on_progress(Progress {
        applied: applied_rx,
        caught_up: caught_rx,
        stalled: stalled_rx,
    });
    if filtered_head(bus, projector).await? <= start {
        caught_tx.send_replace(true);
    }
    let mut applied = start;
    let mut feed = Input::open(bus, projector, start + 1, false).await?;
    loop {
        let next = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            next = feed.next_item_within(Duration::from_millis(500)) => next,
        };
        let Some(event) = next else {
            // A quiet spell is not the head by itself: a slow server can
            // pause a long replay for longer than that. Ask the log.
            if !*caught_tx.borrow()
                && filtered_head(bus, projector)
                    .await
                    .is_ok_and(|head| head <= applied)
            {
                caught_tx.send_replace(true);
            }
            continue;
        };
        // Under load, apply what is already waiting in one transaction:
        // what the feed has read ahead, and what was stored when this one
        // began, not what arrives while it is gathered, which would hold
        // the first event's commit back.
        let first = event?;
        let stored_after_first = first.pending();
        let mut batch = vec![first];
        while batch.len() < MAX_EVENTS_PER_TRANSACTION {
            if let Some(event) = feed.next_item_read() {
                batch.push(event?);
                continue;
            }
            let last = batch.last().expect("a batch holds an event");
            if last.pending() == 0 || batch.len() as u64 > stored_after_first {
                break;
            }
            match feed.next_item_within(MAX_WAIT_FOR_PENDING_EVENT).await {
                Some(event) => batch.push(event?),
                None => break,
            }
        }
        let done = until_done(name, "apply events", &mut shutdown, &stalled_tx, || {
            apply_batch(pool, projector, &batch)
        })
        .await;
        if done.is_none() {
            return Ok(());
        }
        let subjects = batch
            .iter()
            .filter_map(|item| match item {
                Item::Log(FeedItem::Event(event)) => Some(event.subject.clone()),
                Item::Log(FeedItem::Skipped(skipped)) => Some(skipped.subject.clone()),
                Item::Sample(_) => None,
            })
            .collect();
        on_committed(subjects).await;
        let last = batch.last().expect("a batch holds an event");
        applied = last.sequence();
        applied_tx.send_replace(applied);
        if last.pending() == 0 {
            caught_tx.send_replace(true);
        }
    }
}

/// Applies events (in stream order), records the skipped ones, and stores
/// the last one's sequence, in one transaction; events at or below the
/// committed sequence are left alone.
async fn apply_batch<P: Projector>(pool: &PgPool, projector: &P, events: &[Item]) -> Result<()> {
    let Some(last) = events.last() else {
        return Ok(());
    };
    let mut tx = pool.begin().await?;
    let committed: Option<i64> =
        sqlx::query_scalar("SELECT sequence FROM projection_offsets WHERE name = $1 FOR UPDATE")
            .bind(projector.name())
            .fetch_optional(&mut *tx)
            .await?;
    let committed = committed.unwrap_or(0) as u64;
    // A second runner of the same projection (or a replay) already did them.
    if committed >= last.sequence() {
        return Ok(());
    }
    let mut run: Vec<&Stored> = Vec::new();
    // A projection reads one stream: samples never come between events.
    let mut samples: Vec<&Sample> = Vec::new();
    for item in events.iter().filter(|e| e.sequence() > committed) {
        match item {
            Item::Log(FeedItem::Event(event)) => run.push(event),
            Item::Log(FeedItem::Skipped(skipped)) => {
                apply_run(&mut tx, projector, &mut run).await?;
                record_skip(&mut tx, projector.name(), skipped).await?
            }
            Item::Sample(sample) => samples.push(sample),
        }
    }
    apply_run(&mut tx, projector, &mut run).await?;
    match samples.as_slice() {
        [] => {}
        [sample] => projector.apply_sample(&mut tx, sample).await?,
        _ => projector.apply_samples(&mut tx, &samples).await?,
    }
    sqlx::query(
        "INSERT INTO projection_offsets (name, sequence) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET sequence = EXCLUDED.sequence",
    )
    .bind(projector.name())
    .bind(last.sequence() as i64)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Applies a run of consecutive events and empties it.
async fn apply_run<P: Projector>(
    conn: &mut PgConnection,
    projector: &P,
    run: &mut Vec<&Stored>,
) -> Result<()> {
    match run.as_slice() {
        [] => {}
        [event] => {
            let span = project_span(projector, event);
            projector.apply(conn, event).instrument(span).await?
        }
        [first, .., last] => {
            let span = tracing::info_span!(
                "lh.project_batch",
                projection = projector.name(),
                events = run.len(),
                first_sequence = first.sequence,
                last_sequence = last.sequence,
            );
            // A few events (a runner that fell a little behind) still read
            // each in its own request's trace, spanning the statements
            // that applied them; a backlog is many requests' events, no
            // one trace to join.
            let _each: Vec<tracing::Span> = if run.len() <= MAX_EVENTS_TRACED_EACH {
                run.iter()
                    .map(|event| project_span(projector, event))
                    .collect()
            } else {
                Vec::new()
            };
            projector.apply_batch(conn, run).instrument(span).await?
        }
    }
    run.clear();
    Ok(())
}

/// Most events of one run that each get a span in their own trace.
const MAX_EVENTS_TRACED_EACH: usize = 16;

/// The span of applying `event`, in the trace of the request that wrote
/// it: one request reads as one trace, its read models included.
fn project_span<P: Projector>(projector: &P, event: &Stored) -> tracing::Span {
    let span = tracing::info_span!(
        "lh.project",
        projection = projector.name(),
        event = event.envelope.event_type.as_str(),
        sequence = event.sequence,
    );
    lh_bus::continue_trace(&span, event.trace_parent.as_deref());
    span
}

async fn record_skip(conn: &mut PgConnection, projection: &str, skipped: &Skipped) -> Result<()> {
    sqlx::query(
        "INSERT INTO skipped_events (projection, sequence, subject, reason, stored_at)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
    )
    .bind(projection)
    .bind(skipped.sequence as i64)
    .bind(&skipped.subject)
    .bind(skipped.reason().as_str())
    .bind(skipped.stored_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Replays the whole log (up to its head at call time) into a fresh
/// `schema`, dropping whatever that schema held. Returns the sequence
/// reached. `on_event` is told each applied sequence (for progress output).
pub async fn rebuild<P: Projector>(
    bus: &Bus,
    database_url: &str,
    schema: &str,
    migrator: &Migrator,
    projector: &P,
    on_event: impl FnMut(u64, u64),
) -> Result<u64> {
    check_schema_name(schema)?;
    {
        let base: PgConnectOptions = database_url.parse()?;
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(base)
            .await?;
        sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .execute(&admin)
            .await?;
        admin.close().await;
    }
    let pool = connect_schema(database_url, schema).await?;
    migrate(&pool, migrator).await?;
    let reached = replay(bus, &pool, projector, on_event).await;
    pool.close().await;
    reached
}

/// Applies what the stream of `projector` holds (up to its head at call
/// time) to the schema of `pool` as it stands, dropping nothing: how a
/// rebuild fills a fresh schema, how one that was stopped part way goes on
/// (from the sequence it committed), and how a projection that outlives its
/// stream (telemetry) is brought into one whose older rows were carried
/// over. Its projector must then tell a sample the rows already count.
///
/// The feed is read into transactions by a task of its own, up to
/// [`MAX_REPLAY_TRANSACTIONS_READ_AHEAD`] ahead of the one being written;
/// each transaction still commits its rows with its last sequence.
///
/// Returns the sequence the schema reflects; `on_event` is told each one
/// applied.
pub async fn replay<P: Projector>(
    bus: &Bus,
    pool: &PgPool,
    projector: &P,
    mut on_event: impl FnMut(u64, u64),
) -> Result<u64> {
    ensure_offset_row(pool, projector.name()).await?;
    let committed = committed_sequence(pool, projector.name()).await?;
    let head = head(bus, projector).await?;
    if head <= committed {
        return Ok(committed);
    }
    // The last message the projection's filters match, at or before the
    // head: a quiet feed before it is a slow server, not the end.
    let target = filtered_head(bus, projector).await?.min(head);
    if target <= committed {
        return Ok(committed);
    }
    let feed = Input::open(bus, projector, committed + 1, true).await?;
    let (batches_tx, mut batches) = tokio::sync::mpsc::channel(MAX_REPLAY_TRANSACTIONS_READ_AHEAD);
    let _reader = AbortOnDrop(tokio::spawn(read_transactions(
        feed,
        ReadUntil {
            committed,
            head,
            target,
        },
        batches_tx,
    )));
    let mut reached = committed;
    while let Some(batch) = batches.recv().await {
        let batch = batch?;
        apply_batch(pool, projector, &batch).await?;
        for item in &batch {
            reached = item.sequence();
            on_event(reached, head);
        }
    }
    Ok(reached)
}

/// Quiet spells of [`REPLAY_QUIET_SPELL`] in a row a replay waits through
/// before its last matching message, before it gives up on the feed.
const MAX_REPLAY_QUIET_SPELLS: u32 = 30;
const REPLAY_QUIET_SPELL: Duration = Duration::from_secs(2);

/// Where a replay's reading stops.
struct ReadUntil {
    /// Already in the schema: the feed starts after it.
    committed: u64,
    /// The stream's head when the replay began: nothing after it is read.
    head: u64,
    /// The last message at or before `head` the filters match.
    target: u64,
}

/// Reads `feed` into transactions of at most [`MAX_EVENTS_PER_TRANSACTION`]
/// items and sends each (or the error that ends the reading) to `batches`,
/// until the replay's last message; ends early when the replay is gone.
async fn read_transactions(
    mut feed: Input,
    until: ReadUntil,
    batches: tokio::sync::mpsc::Sender<Result<Vec<Item>>>,
) {
    let mut batch = Vec::with_capacity(MAX_EVENTS_PER_TRANSACTION);
    let mut last_read = until.committed;
    let mut quiet_spells = 0;
    loop {
        let Some(item) = feed.next_item_within(REPLAY_QUIET_SPELL).await else {
            if last_read >= until.target {
                break;
            }
            quiet_spells += 1;
            if quiet_spells >= MAX_REPLAY_QUIET_SPELLS {
                let _ = batches.send(Err(ProjectionError::FeedClosed)).await;
                return;
            }
            continue;
        };
        quiet_spells = 0;
        let item = match item {
            Ok(item) => item,
            Err(e) => {
                let _ = batches.send(Err(e)).await;
                return;
            }
        };
        if item.sequence() > until.head {
            break;
        }
        last_read = item.sequence();
        let last = item.pending() == 0 || item.sequence() >= until.target;
        batch.push(item);
        if batch.len() == MAX_EVENTS_PER_TRANSACTION || last {
            let full =
                std::mem::replace(&mut batch, Vec::with_capacity(MAX_EVENTS_PER_TRANSACTION));
            if batches.send(Ok(full)).await.is_err() {
                return;
            }
        }
        if last {
            break;
        }
    }
    // A feed that went quiet before its last message leaves a batch.
    if !batch.is_empty() {
        let _ = batches.send(Ok(batch)).await;
    }
}

/// A task that ends with its owner: a replay dropped part way (its caller
/// gave up) leaves no reader behind.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Replaces schema `live` by `rebuilt` in one transaction (the old one is dropped).
pub async fn swap_schemas(database_url: &str, live: &str, rebuilt: &str) -> Result<()> {
    check_schema_name(live)?;
    check_schema_name(rebuilt)?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url)
        .await?;
    let mut tx = pool.begin().await?;
    let old = format!("{live}_old");
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {old} CASCADE"))
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!("ALTER SCHEMA {live} RENAME TO {old}"))
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!("ALTER SCHEMA {rebuilt} RENAME TO {live}"))
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!("DROP SCHEMA {old} CASCADE"))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    pool.close().await;
    Ok(())
}

/// How one table of a rebuilt schema compares with the live one:
/// `(row count, md5 over all rows)` each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableComparison {
    pub table: &'static str,
    pub live: (i64, String),
    pub rebuilt: (i64, String),
}

impl TableComparison {
    pub fn identical(&self) -> bool {
        self.live == self.rebuilt
    }
}

/// The outcome of [`rebuild_and_compare`].
#[derive(Debug, Clone)]
pub struct RebuildReport {
    pub live_schema: String,
    pub rebuilt_schema: String,
    /// Last sequence applied to the rebuilt schema.
    pub reached: u64,
    pub tables: Vec<TableComparison>,
    /// The rebuilt schema replaced the live one.
    pub swapped: bool,
}

impl RebuildReport {
    pub fn identical(&self) -> bool {
        self.tables.iter().all(TableComparison::identical)
    }
}

/// Digests of `tables` in two schemas, read in one UTC session so that
/// timestamps print the same way.
pub async fn compare_tables(
    database_url: &str,
    live: &str,
    rebuilt: &str,
    tables: &[&'static str],
) -> Result<Vec<TableComparison>> {
    let options: PgConnectOptions = database_url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.options([("timezone", "UTC")]))
        .await?;
    let mut out = Vec::new();
    for table in tables {
        out.push(TableComparison {
            table,
            live: table_digest(&pool, live, table).await?,
            rebuilt: table_digest(&pool, rebuilt, table).await?,
        });
    }
    pool.close().await;
    Ok(out)
}

/// Replays the log into the fresh schema `into` (see [`rebuild`]), compares
/// `tables` and then [`SKIPPED_TABLE`] with schema `live`, and with `swap`
/// makes the rebuilt schema the live one. Refuses to rebuild into the live
/// schema.
#[allow(clippy::too_many_arguments)]
pub async fn rebuild_and_compare<P: Projector>(
    bus: &Bus,
    database_url: &str,
    live: &str,
    into: &str,
    migrator: &Migrator,
    projector: &P,
    tables: &[&'static str],
    swap: bool,
    on_event: impl FnMut(u64, u64),
) -> Result<RebuildReport> {
    if live == into {
        return Err(ProjectionError::SchemaName(format!(
            "{into} is the live schema; rebuilding into it would drop it"
        )));
    }
    let reached = rebuild(bus, database_url, into, migrator, projector, on_event).await?;
    let tables = [tables, &[SKIPPED_TABLE]].concat();
    let tables = compare_tables(database_url, live, into, &tables).await?;
    if swap {
        swap_schemas(database_url, live, into).await?;
    }
    Ok(RebuildReport {
        live_schema: live.to_string(),
        rebuilt_schema: into.to_string(),
        reached,
        tables,
        swapped: swap,
    })
}

/// MD5 over every row of `schema.table` in a canonical order: equal digests
/// mean byte-identical tables.
pub async fn table_digest(pool: &PgPool, schema: &str, table: &str) -> Result<(i64, String)> {
    check_schema_name(schema)?;
    check_schema_name(table)?;
    let row: (i64, Option<String>) = sqlx::query_as(&format!(
        "SELECT count(*), md5(string_agg(t::text, E'\\n' ORDER BY t::text)) FROM {schema}.{table} t"
    ))
    .fetch_one(pool)
    .await?;
    Ok((row.0, row.1.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn schema_names_are_checked() {
        assert!(super::check_schema_name("gateway_rebuild").is_ok());
        assert!(super::check_schema_name("Gateway").is_err());
        assert!(super::check_schema_name("x; DROP").is_err());
        assert!(super::check_schema_name("1abc").is_err());
    }
}
