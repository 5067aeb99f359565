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
use lh_bus::Bus;
use lh_events::subject;
use lh_service::{CancellationToken, CommonArgs, Readiness, Running};
use sqlx::PgPool;

mod anchor;
#[cfg(test)]
mod chain_spec;
mod keeper;
mod query;
mod signing;
mod verify;

use lh_rpc::audit::{EventsRequest, VerifyRequest};

pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9105";
/// Name of this service: its NATS connection, its actor, its RPC queue group.
pub const SERVICE: &str = "lh-audit";

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/audit");

#[derive(clap::Parser, Clone)]
#[command(
    name = "lh-audit",
    about = "Leasehold audit: hash chain, signed checkpoints, verification"
)]
pub struct Config {
    #[command(flatten)]
    pub common: CommonArgs,
    /// PostgreSQL holding the audit schema.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
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
}

impl std::fmt::Debug for Config {
    // The database URL may carry a password: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("common", &self.common)
            .field("database_url", &"<redacted>")
            .field("schema", &self.schema)
            .field("signing_key_file", &self.signing_key_file)
            .field("checkpoint_every_events", &self.checkpoint_every_events)
            .field("checkpoint_every_secs", &self.checkpoint_every_secs)
            .field("prune_every_secs", &self.prune_every_secs)
            .finish()
    }
}

impl Config {
    /// For tests: an audit service on `nats_url` and `database_url`, on a
    /// free port, with an ephemeral key and the default checkpoint policy.
    pub fn for_test(nats_url: &str, database_url: &str) -> Self {
        Self {
            common: CommonArgs::for_test(nats_url),
            database_url: database_url.to_string(),
            schema: "audit".to_string(),
            signing_key_file: None,
            checkpoint_every_events: 1000,
            checkpoint_every_secs: 60,
            prune_every_secs: 3600,
        }
    }
}

/// What the verify endpoints need.
#[derive(Clone)]
struct Verifier {
    bus: Bus,
    pool: PgPool,
    /// The key an anchor checkpoint must be signed with: this service's own.
    pinned: ed25519_dalek::VerifyingKey,
}

/// Starts the keeper, the verify RPC and the HTTP API.
pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    anyhow::ensure!(
        config.checkpoint_every_events > 0
            && config.checkpoint_every_secs > 0
            && config.prune_every_secs > 0,
        "checkpoint and prune intervals must be positive"
    );
    let key = signing::load_or_generate(config.signing_key_file.as_deref())?;
    let bus = config.common.connect_bus(SERVICE).await?;
    let pool = lh_projection::connect_schema(&config.database_url, &config.schema).await?;
    lh_projection::migrate(&pool, &MIGRATOR).await?;

    let readiness = Readiness::default();
    let verifier = Arc::new(Verifier {
        bus: bus.clone(),
        pool: pool.clone(),
        pinned: key.verifying_key(),
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
/// `lh_events_stream_max_bytes`) and warns while it is past
/// [`lh_bus::EVENTS_FILL_WARNING`] of its limit: at the limit it refuses
/// appends. The audit service does it because it reads the whole log anyway.
async fn watch_log_fill(bus: lh_bus::Bus) -> std::convert::Infallible {
    let mut every = tokio::time::interval(LOG_FILL_CHECK);
    loop {
        every.tick().await;
        let Ok((bytes, max_bytes)) = bus.events_fill().await else {
            continue;
        };
        metrics::gauge!("lh_events_stream_bytes").set(bytes as f64);
        metrics::gauge!("lh_events_stream_max_bytes").set(max_bytes as f64);
        if let Some(filled) = lh_bus::events_fill_warning(bytes, max_bytes) {
            tracing::warn!(bytes, max_bytes, filled_pct = (filled * 100.0).round(),
                "the event log is filling up; raise LH_EVENTS_MAX_BYTES (it is applied at the next start)");
        }
    }
}

/// Answers [`subject::RPC_AUDIT_VERIFY`] until the connection ends.
async fn serve_verify(verifier: Arc<Verifier>) -> anyhow::Result<()> {
    lh_bus::rpc::serve(
        &verifier.bus,
        subject::RPC_AUDIT_VERIFY,
        SERVICE,
        |_: VerifyRequest| {
            let verifier = verifier.clone();
            async move {
                verify::verify(&verifier.bus, &verifier.pool, &verifier.pinned)
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

/// `GET /v1/verify`: the same report as the RPC.
async fn http_verify(State(verifier): State<Arc<Verifier>>) -> axum::response::Response {
    match verify::verify(&verifier.bus, &verifier.pool, &verifier.pinned).await {
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
