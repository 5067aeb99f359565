//! Audit: the tamper-evident record of everything Leasehold did.
//!
//! The service keeps three things in step with the business log:
//!
//! * a SHA-256 **hash chain** over every stored message of `LH_EVENTS`, in
//!   stream order, over the raw stored bytes (format: `schemas/audit-chain.md`,
//!   pure code: [`lh_domain::chain`]);
//! * a second, independent **append-only copy** of every event in Postgres
//!   (`audit.events`, with its chain link), written by the chain keeper;
//! * **signed checkpoints**: every N events or T seconds the chain head is
//!   signed with ed25519 and published as `audit.checkpoint`.
//!
//! Verification recomputes the chain from the stream and compares it with the
//! copy and the checkpoints; it answers on NATS ([`subject::RPC_AUDIT_VERIFY`],
//! for the gateway) and on `GET /v1/verify` (for auditors). Once the log's
//! oldest events have expired it starts from a signed checkpoint, the
//! anchor, and the copy is pruned below it (`audit.pruned`).
//!
//! Auditors query the copy, filtered and paged, over
//! [`subject::RPC_AUDIT_EVENTS`] (the gateway's `GET /v1/audit/events`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Json, Router};
use lh_bus::{Bus, Expect};
use lh_events::{subject, Actor, AuditDivergenceDetected, DivergenceKind, Envelope, EventData};
use lh_service::{CancellationToken, CommonArgs, Readiness, Running, Secret};
use sqlx::PgPool;

mod anchor;
#[cfg(test)]
mod chain_spec;
mod files;
mod keeper;
pub mod keys;
mod query;
mod signing;
mod verify;

use anyhow::Context as _;
use lh_domain::chain_check::{parse_public_key, SignedHead};
use lh_rpc::audit::{EventsRequest, VerifyRequest, VerifyResponse};

pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9105";

/// Metrics this service records, with their `# HELP` text.
pub const METRICS: &[lh_service::MetricHelp] = &[
    (
        "lh_audit_chain_sequence",
        "Log sequence the audit hash chain has reached.",
    ),
    (
        "lh_audit_checkpoints_total",
        "Signed checkpoints of the chain written.",
    ),
    (
        "lh_audit_bad_checkpoints_total",
        "Checkpoints a verification found bad.",
    ),
    (
        "lh_audit_pruned_rows_total",
        "Chain rows pruned below the oldest anchor kept.",
    ),
    (
        "lh_audit_keeper_restarts_total",
        "Times the chain keeper failed and started over.",
    ),
    (
        "lh_audit_verify_runs_total",
        "Verifications of the chain against the log.",
    ),
    (
        "lh_audit_divergences_total",
        "Divergences between the chain and the log this replica reported.",
    ),
    (
        "lh_events_stream_bytes",
        "Bytes the event log (stream EVENTS) holds.",
    ),
    (
        "lh_events_stream_max_bytes",
        "Bytes the event log may hold; at the limit it refuses appends.",
    ),
    (
        "lh_events_stream_fill_ratio",
        "How full the event log is: its bytes over its limit (0 to 1).",
    ),
    (
        "lh_stream_messages",
        "Messages a JetStream stream holds, by stream.",
    ),
    (
        "lh_stream_bytes",
        "Bytes a JetStream stream holds, by stream.",
    ),
    (
        "lh_stream_consumers",
        "Consumers reading a JetStream stream, by stream.",
    ),
    (
        "lh_stream_replicas_current",
        "Followers of a JetStream stream up to date with its leader, by stream.",
    ),
    (
        "lh_stream_replicas_lagging",
        "Followers of a JetStream stream behind its leader or offline, by stream.",
    ),
    (
        "lh_stream_read_timestamp_seconds",
        "Unix time the lh_stream_* figures of a stream were last read; the gauges keep their last value while it cannot be read.",
    ),
];

/// Name of this service: its NATS connection, its actor, its RPC queue group.
pub const SERVICE: &str = "lh-audit";

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/audit");

#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "lh-audit",
    about = "Leasehold audit: hash chain, signed checkpoints, verification"
)]
pub struct Config {
    #[command(flatten)]
    pub common: CommonArgs,
    /// PostgreSQL holding the audit schema.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Secret,
    /// Schema this service owns.
    #[arg(long, env = "LH_AUDIT_SCHEMA", default_value = "audit")]
    pub schema: String,
    /// File holding the hex ed25519 seed that signs checkpoints; generated
    /// (mode 0600) when missing. Without it the key is ephemeral.
    #[arg(long, env = "LH_AUDIT_KEY_FILE")]
    pub signing_key_file: Option<PathBuf>,
    /// Sign a checkpoint after this many new events...
    #[arg(long, env = "LH_AUDIT_CHECKPOINT_EVERY_EVENTS", default_value_t = 1000)]
    pub checkpoint_every_events: u64,
    /// ...or after this many seconds with new events, whichever comes first.
    #[arg(long, env = "LH_AUDIT_CHECKPOINT_EVERY_SECS", default_value_t = 60)]
    pub checkpoint_every_secs: u64,
    /// How often to look whether the log's oldest events have expired, and
    /// to prune the audit copy in step with it.
    #[arg(long, env = "LH_AUDIT_PRUNE_EVERY_SECS", default_value_t = 3600)]
    pub prune_every_secs: u64,
    /// Public keys (hex ed25519, comma-separated) a checkpoint must be
    /// signed with. Pinning is what gives verification meaning: when none is
    /// pinned, the service trusts its own key, which whoever can replace the
    /// key file can also replace.
    #[arg(
        long,
        env = "LH_AUDIT_TRUSTED_PUBLIC_KEYS",
        value_name = "HEX[,HEX]",
        value_delimiter = ','
    )]
    pub trusted_public_keys: Vec<String>,
    /// A file of further trusted public keys, one hex key a line (`#`
    /// starts a comment).
    #[arg(long, env = "LH_AUDIT_TRUSTED_PUBLIC_KEYS_FILE")]
    pub trusted_public_keys_file: Option<PathBuf>,
    /// File holding the bearer token `GET /v1/verify` requires. Without it
    /// the endpoint answers every request with 401.
    #[arg(long, env = "LH_AUDIT_VERIFY_TOKEN_FILE")]
    pub verify_token_file: Option<PathBuf>,
}

impl Config {
    /// For tests: an audit service on `nats_url` and `database_url`, on a
    /// free port, with an ephemeral key and the default checkpoint policy.
    pub fn for_test(nats_url: &str, database_url: &str) -> Self {
        Self {
            common: CommonArgs::for_test(nats_url),
            database_url: database_url.into(),
            schema: "audit".to_string(),
            signing_key_file: None,
            checkpoint_every_events: 1000,
            checkpoint_every_secs: 60,
            prune_every_secs: 3600,
            trusted_public_keys: Vec::new(),
            trusted_public_keys_file: None,
            verify_token_file: None,
        }
    }

    /// The pinned keys from the flag and the file; empty when none is.
    pub fn pinned_public_keys(&self) -> anyhow::Result<Vec<[u8; 32]>> {
        let mut texts: Vec<String> = self.trusted_public_keys.clone();
        if let Some(path) = &self.trusted_public_keys_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading trusted public keys {}", path.display()))?;
            texts.extend(
                text.lines()
                    .map(|line| line.split('#').next().unwrap_or("").trim().to_string()),
            );
        }
        let mut keys = Vec::new();
        for text in texts.iter().map(|t| t.trim()).filter(|t| !t.is_empty()) {
            let key =
                parse_public_key(text).map_err(|e| anyhow::anyhow!("trusted_public_keys: {e}"))?;
            if keys.len() >= MAX_TRUSTED_PUBLIC_KEYS {
                anyhow::bail!("trusted_public_keys: more than {MAX_TRUSTED_PUBLIC_KEYS} keys");
            }
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        Ok(keys)
    }
}

/// Most keys that may be pinned: a handful covers a key rotation.
pub const MAX_TRUSTED_PUBLIC_KEYS: usize = 16;
/// Longest bearer token the verify endpoint reads from its file.
const MAX_VERIFY_TOKEN_BYTES: usize = 4096;
/// How long a verification result is served again while no new event
/// arrived: the copy could be changed behind the triggers without one.
pub const VERIFY_CACHE_MAX_AGE_SECS: u64 = 30;

/// What the verify endpoints need.
struct Verifier {
    bus: Bus,
    pool: PgPool,
    /// The keys checkpoints must be signed with.
    trusted: Vec<[u8; 32]>,
    /// The bearer token `GET /v1/verify` requires; `None` refuses all.
    http_token: Option<String>,
    /// Held for the length of a run: one run at a time, and a call that
    /// waited gets that run's cached result.
    state: tokio::sync::Mutex<VerifyState>,
}

/// What verification carries from one run to the next.
#[derive(Default)]
struct VerifyState {
    /// The last checkpoint a run verified, also kept in `verified_checkpoint`.
    resume: Option<SignedHead>,
    cached: Option<Cached>,
    runs: u64,
}

struct Cached {
    /// The audit copy's last sequence the report covers.
    upper: u64,
    at: std::time::Instant,
    report: VerifyResponse,
}

impl Verifier {
    /// Verifies from the last verified checkpoint (or everything when
    /// `full`), or returns the cached result while it still holds.
    async fn verify(&self, full: bool) -> anyhow::Result<VerifyResponse> {
        let mut state = self.state.lock().await;
        if !full {
            let upper: i64 = sqlx::query_scalar("SELECT coalesce(max(sequence), 0) FROM events")
                .fetch_one(&self.pool)
                .await?;
            if let Some(cached) = &state.cached {
                if cached.upper == upper as u64
                    && cached.at.elapsed() < Duration::from_secs(VERIFY_CACHE_MAX_AGE_SECS)
                {
                    return Ok(cached.report.clone());
                }
            }
        }
        state.runs += 1;
        let resume = if full { None } else { state.resume.clone() };
        let outcome = verify::verify(
            &self.bus,
            &self.pool,
            &self.trusted,
            resume.as_ref(),
            state.runs,
        )
        .await?;
        metrics::counter!("lh_audit_verify_runs_total").increment(1);
        if let Some(verified) = outcome.verified {
            // A full run that held replaces even a later resume point: that
            // one may rest on a copy since restored from an older backup.
            let later = state
                .resume
                .as_ref()
                .is_none_or(|r| verified.sequence > r.sequence);
            if full || later {
                store_verified(&self.pool, &verified).await?;
                state.resume = Some(verified);
            }
        }
        match outcome.divergence {
            Some(found) => self.record_divergence(found, &outcome.report, full).await,
            // Only a full run sees the whole copy: an incremental one that
            // holds says nothing of a divergence before its resume point.
            None if full && outcome.report.ok => {
                if let Err(e) = sqlx::query("DELETE FROM reported_divergence")
                    .execute(&self.pool)
                    .await
                {
                    tracing::warn!(error = %e, "cannot forget the last divergence recorded");
                }
            }
            None => {}
        }
        state.cached = Some(Cached {
            upper: outcome.upper,
            at: std::time::Instant::now(),
            report: outcome.report.clone(),
        });
        Ok(outcome.report)
    }
}

impl Verifier {
    /// Publishes `audit.divergence_detected` for `found` unless it was the
    /// last one recorded (kept in `reported_divergence`, not in memory: it
    /// holds across restarts and for every replica). A failure to record
    /// is logged and left to the next run that finds it: the report itself
    /// still goes out.
    async fn record_divergence(
        &self,
        found: (u64, DivergenceKind),
        report: &VerifyResponse,
        full: bool,
    ) {
        let (first_sequence, kind) = found;
        tracing::error!(
            first_sequence,
            kind = kind.as_str(),
            checked_from = report.checked_from,
            checked_to = report.sequence,
            "the log and the audit copy diverge"
        );
        let event = AuditDivergenceDetected {
            first_sequence,
            kind,
            checked_from: report.checked_from,
            checked_to: report.sequence,
            head: report.head.clone(),
            full,
        };
        match self.claim_and_publish(event).await {
            Ok(true) => metrics::counter!("lh_audit_divergences_total").increment(1),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), first_sequence, kind = kind.as_str(),
                    "cannot record audit.divergence_detected; the next run that finds it tries again");
            }
        }
    }

    /// Records the finding as the last one reported and publishes its
    /// event, in one transaction: false when it already was the last one
    /// (another replica reported it). The row is locked while publishing,
    /// so two replicas do not both publish; a failed publish leaves the
    /// previous finding recorded.
    async fn claim_and_publish(&self, event: AuditDivergenceDetected) -> anyhow::Result<bool> {
        let mut tx = self.pool.begin().await?;
        let claimed = sqlx::query(
            "INSERT INTO reported_divergence (first_sequence, kind) VALUES ($1, $2)
             ON CONFLICT (singleton) DO UPDATE SET first_sequence = excluded.first_sequence,
                 kind = excluded.kind, reported_at = now()
             WHERE (reported_divergence.first_sequence, reported_divergence.kind)
                 IS DISTINCT FROM (excluded.first_sequence, excluded.kind)",
        )
        .bind(event.first_sequence as i64)
        .bind(event.kind.as_str())
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !claimed {
            return Ok(false);
        }
        let envelope = Envelope::new(
            Actor::Service(SERVICE.into()),
            chrono::Utc::now(),
            EventData::AuditDivergenceDetected(event),
        );
        self.bus.publish(&envelope, Expect::Any).await?;
        tx.commit().await?;
        Ok(true)
    }
}

async fn load_verified(pool: &PgPool) -> anyhow::Result<Option<SignedHead>> {
    let row: Option<(i64, i64, Vec<u8>, Vec<u8>)> =
        sqlx::query_as("SELECT sequence, events, head, signature FROM verified_checkpoint")
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|(sequence, events, head, signature)| SignedHead {
        sequence: sequence as u64,
        events: events as u64,
        head: hex::encode(head),
        signature: hex::encode(signature),
    }))
}

async fn store_verified(pool: &PgPool, verified: &SignedHead) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO verified_checkpoint (sequence, events, head, signature)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (singleton) DO UPDATE SET sequence = excluded.sequence,
             events = excluded.events, head = excluded.head,
             signature = excluded.signature, verified_at = now()",
    )
    .bind(verified.sequence as i64)
    .bind(verified.events as i64)
    .bind(hex::decode(&verified.head)?)
    .bind(hex::decode(&verified.signature)?)
    .execute(pool)
    .await?;
    Ok(())
}

fn read_verify_token(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading verify token {}", path.display()))?;
    let token = text.trim().to_string();
    anyhow::ensure!(
        !token.is_empty() && token.len() <= MAX_VERIFY_TOKEN_BYTES,
        "verify token {} must hold 1 to {MAX_VERIFY_TOKEN_BYTES} bytes",
        path.display()
    );
    // The deployments ship placeholders so that a forgotten one stops the
    // service rather than guarding the endpoint with a published token.
    let lower = token.to_ascii_lowercase();
    anyhow::ensure!(
        !["replace-me", "change-me"]
            .iter()
            .any(|p| lower.starts_with(p)),
        "verify token {} is a placeholder: put a random one there (openssl rand -hex 32)",
        path.display()
    );
    Ok(token)
}

impl lh_service::Service for Config {
    const NAME: &'static str = "lh-audit";

    async fn start(self, shutdown: CancellationToken) -> anyhow::Result<Running> {
        start(self, shutdown).await
    }
}

/// Starts the keeper, the verify RPC and the HTTP API.
pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    lh_service::describe_metrics(METRICS);
    // At 0 from the start, so that the first divergence is an increase
    // that `increase()` in an alert rule sees.
    metrics::counter!("lh_audit_divergences_total").increment(0);
    anyhow::ensure!(
        config.checkpoint_every_events > 0
            && config.checkpoint_every_secs > 0
            && config.prune_every_secs > 0,
        "checkpoint and prune intervals must be positive"
    );
    let key = signing::load_or_generate(config.signing_key_file.as_deref())?;
    let own_key = key.verifying_key().to_bytes();
    let mut trusted = config.pinned_public_keys()?;
    if trusted.is_empty() {
        tracing::warn!(public_key = hex::encode(own_key),
            "no trusted public keys pinned (LH_AUDIT_TRUSTED_PUBLIC_KEYS): trusting this service's own signing key, which means little; pin it");
        trusted.push(own_key);
    } else if !trusted.contains(&own_key) {
        tracing::warn!(public_key = hex::encode(own_key),
            "this service's signing key is not among the pinned keys: its own checkpoints will fail verification");
    }
    let http_token = match &config.verify_token_file {
        Some(path) => Some(read_verify_token(path)?),
        None => {
            tracing::warn!("no LH_AUDIT_VERIFY_TOKEN_FILE: GET /v1/verify refuses every request");
            None
        }
    };
    let bus = config.common.connect_bus(SERVICE).await?;
    let pool = lh_projection::connect_schema(config.database_url.expose(), &config.schema).await?;
    lh_projection::migrate(&pool, &MIGRATOR).await?;

    let readiness = Readiness::default();
    let verifier = Arc::new(Verifier {
        bus: bus.clone(),
        pool: pool.clone(),
        trusted,
        http_token,
        state: tokio::sync::Mutex::new(VerifyState {
            resume: load_verified(&pool).await?,
            ..VerifyState::default()
        }),
    });
    let fill = bus.clone();
    let keeper = keeper::Keeper {
        bus,
        pool,
        key,
        policy: keeper::CheckpointPolicy {
            every_events: config.checkpoint_every_events,
            every: Duration::from_secs(config.checkpoint_every_secs),
        },
        prune_every: Duration::from_secs(config.prune_every_secs),
        ready: readiness.clone(),
    };
    let router = Router::new()
        .route("/v1/verify", get(http_verify))
        .with_state(verifier.clone());
    Running::spawn(
        config.common.http_addr_or(DEFAULT_HTTP_ADDR),
        router,
        readiness,
        shutdown,
        async move {
            tokio::select! {
                r = keeper.run() => r,
                r = serve_verify(verifier.clone()) => r,
                r = serve_events(verifier) => r,
                never = watch_log_fill(fill) => match never {},
            }
        },
    )
    .await
}

/// How often the keeper of the trail looks at how full the log is.
const LOG_FILL_CHECK: Duration = Duration::from_secs(60);

/// Reports how full the business log is (`lh_events_stream_bytes`,
/// `lh_events_stream_max_bytes`, and their ratio for alerts,
/// `lh_events_stream_fill_ratio`) and warns while it is past
/// [`lh_bus::EVENTS_FILL_WARNING`] of its limit: at the limit it refuses
/// appends. The audit service does it because it reads the whole log anyway;
/// it shows both streams' figures (`lh_stream_*{stream}`) alongside. A
/// gauge keeps its last value when a stream cannot be read, so each read
/// also stamps `lh_stream_read_timestamp_seconds{stream}`: how old the
/// figures are is what tells them stale.
async fn watch_log_fill(bus: lh_bus::Bus) -> std::convert::Infallible {
    // Never read yet: stale from the start, so that a service that can
    // never read a stream is seen to, not left without the series.
    for stream in [subject::EVENTS_STREAM, subject::TELEMETRY_STREAM] {
        metrics::gauge!("lh_stream_read_timestamp_seconds", "stream" => stream).set(0.0);
    }
    let mut every = tokio::time::interval(LOG_FILL_CHECK);
    loop {
        every.tick().await;
        for stream in [subject::EVENTS_STREAM, subject::TELEMETRY_STREAM] {
            let figures = match bus.stream_figures(stream).await {
                Ok(figures) => figures,
                Err(e) => {
                    tracing::warn!(stream, error = %e,
                        "cannot read the stream's figures; its gauges keep the last ones read");
                    continue;
                }
            };
            metrics::gauge!("lh_stream_messages", "stream" => stream).set(figures.messages as f64);
            metrics::gauge!("lh_stream_bytes", "stream" => stream).set(figures.bytes as f64);
            metrics::gauge!("lh_stream_consumers", "stream" => stream)
                .set(figures.consumers as f64);
            metrics::gauge!("lh_stream_replicas_current", "stream" => stream)
                .set(figures.replicas_current as f64);
            metrics::gauge!("lh_stream_replicas_lagging", "stream" => stream)
                .set(figures.replicas_lagging as f64);
            metrics::gauge!("lh_stream_read_timestamp_seconds", "stream" => stream)
                .set(chrono::Utc::now().timestamp() as f64);
            if stream == subject::EVENTS_STREAM {
                report_log_fill(figures.bytes, figures.max_bytes);
            }
        }
    }
}

fn report_log_fill(bytes: u64, max_bytes: u64) {
    metrics::gauge!("lh_events_stream_bytes").set(bytes as f64);
    metrics::gauge!("lh_events_stream_max_bytes").set(max_bytes as f64);
    if max_bytes > 0 {
        metrics::gauge!("lh_events_stream_fill_ratio").set(bytes as f64 / max_bytes as f64);
    }
    if let Some(filled) = lh_bus::events_fill_warning(bytes, max_bytes) {
        tracing::warn!(bytes, max_bytes, filled_pct = (filled * 100.0).round(),
            "the event log is filling up; raise LH_EVENTS_MAX_BYTES (it is applied at the next start)");
    }
}

/// Answers [`subject::RPC_AUDIT_VERIFY`] until the connection ends.
async fn serve_verify(verifier: Arc<Verifier>) -> anyhow::Result<()> {
    lh_bus::rpc::serve(
        &verifier.bus,
        subject::RPC_AUDIT_VERIFY,
        SERVICE,
        |request: VerifyRequest| {
            let verifier = verifier.clone();
            async move {
                verifier
                    .verify(request.full)
                    .await
                    .map_err(|e| format!("audit verification failed: {e:#}"))
            }
        },
    )
    .await?;
    anyhow::bail!("the verify subscription ended")
}

/// Answers [`subject::RPC_AUDIT_EVENTS`] until the connection ends.
async fn serve_events(verifier: Arc<Verifier>) -> anyhow::Result<()> {
    lh_bus::rpc::serve(
        &verifier.bus,
        subject::RPC_AUDIT_EVENTS,
        SERVICE,
        |request: EventsRequest| {
            let pool = verifier.pool.clone();
            async move {
                query::events(&pool, &request)
                    .await
                    .map_err(|e| format!("audit query failed: {e:#}"))
            }
        },
    )
    .await?;
    anyhow::bail!("the audit events subscription ended")
}

/// True when `headers` carry `Authorization: Bearer <expected>`; compared
/// in constant time so the answer's timing does not reveal the token.
fn bearer_matches(headers: &axum::http::HeaderMap, expected: &str) -> bool {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| constant_time_eq(given.trim().as_bytes(), expected.as_bytes()))
}

/// Compares every byte whatever the first difference; only the length
/// shows, and the token's length is no secret worth keeping.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn unauthorized() -> axum::response::Response {
    (
        StatusCode::UNAUTHORIZED,
        [
            (axum::http::header::CONTENT_TYPE, "application/problem+json"),
            (axum::http::header::WWW_AUTHENTICATE, "Bearer"),
        ],
        serde_json::json!({
            "type": "about:blank",
            "title": "authentication required",
            "status": 401,
            "detail": "GET /v1/verify needs the bearer token of LH_AUDIT_VERIFY_TOKEN_FILE",
        })
        .to_string(),
    )
        .into_response()
}

/// `GET /v1/verify`: the same incremental report as the RPC, for holders
/// of the verify token.
async fn http_verify(
    State(verifier): State<Arc<Verifier>>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let authorized = verifier
        .http_token
        .as_deref()
        .is_some_and(|token| bearer_matches(&headers, token));
    if !authorized {
        return unauthorized();
    }
    match verifier.verify(false).await {
        Ok(report) => Json(report).into_response(),
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "audit verification failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(axum::http::header::CONTENT_TYPE, "application/problem+json")],
                serde_json::json!({
                    "type": "about:blank",
                    "title": "audit verification failed",
                    "status": 500,
                    "detail": format!("{e:#}"),
                })
                .to_string(),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_prints_no_secret() {
        let config = Config::for_test("nats://127.0.0.1:1", "postgres://lh:db-secret@db/lh");
        let printed = format!("{config:?}");
        assert!(!printed.contains("db-secret"), "{printed}");
        assert_eq!(
            config.database_url.expose(),
            "postgres://lh:db-secret@db/lh"
        );
    }

    #[test]
    fn the_bearer_token_must_match_exactly() {
        let mut headers = axum::http::HeaderMap::new();
        assert!(!bearer_matches(&headers, "tok"));
        for (given, ok) in [
            ("Bearer tok", true),
            ("Bearer tok2", false),
            ("Bearer to", false),
            ("tok", false),
            ("Basic tok", false),
        ] {
            headers.insert(axum::http::header::AUTHORIZATION, given.parse().unwrap());
            assert_eq!(bearer_matches(&headers, "tok"), ok, "{given}");
        }
    }

    #[test]
    fn a_placeholder_verify_token_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("verify.token");
        std::fs::write(&path, "REPLACE-ME-openssl-rand-hex-32\n").unwrap();
        assert!(read_verify_token(&path).is_err());
        std::fs::write(&path, "\n").unwrap();
        assert!(read_verify_token(&path).is_err());
        std::fs::write(&path, "3f9a\n").unwrap();
        assert_eq!(read_verify_token(&path).unwrap(), "3f9a");
    }

    #[test]
    fn pinned_keys_come_from_the_flag_and_the_file_and_are_checked() {
        let key = |seed: u8| {
            hex::encode(
                ed25519_dalek::SigningKey::from_bytes(&[seed; 32])
                    .verifying_key()
                    .to_bytes(),
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("trusted.keys");
        std::fs::write(
            &file,
            format!("# rotated out in March\n{}\n\n{}\n", key(2), key(1)),
        )
        .unwrap();
        let mut config = Config::for_test("nats://127.0.0.1:1", "postgres://x");
        assert!(config.pinned_public_keys().unwrap().is_empty());
        config.trusted_public_keys = vec![key(1)];
        config.trusted_public_keys_file = Some(file);
        let keys = config.pinned_public_keys().unwrap();
        assert_eq!(keys.len(), 2, "the duplicate counts once");
        config.trusted_public_keys = vec!["abcd".into()];
        let err = config.pinned_public_keys().unwrap_err().to_string();
        assert!(err.contains("trusted_public_keys"), "{err}");
    }
}
