//! Gateway: the REST API, authentication, idempotency, and the tenant and
//! lease read models (a PostgreSQL projection of the log, see
//! [`projection`]). Writes become events on the log; reads come from the
//! projection, which the write waits for so a client reads its own write.

pub mod http;
pub mod keyring;
pub mod projection;
pub mod seal;

pub use http::limits::TenantLimits;

use std::path::PathBuf;

use anyhow::Context as _;
use lh_projection::Progress;
use lh_service::{CancellationToken, CommonArgs, Readiness, Running};
use tokio::sync::oneshot;

pub const DEFAULT_GATEWAY_ADDR: &str = "127.0.0.1:8080";
pub const DEFAULT_SCHEMA: &str = "gateway";
const SERVICE: &str = "lh-gateway";
/// How often readiness looks at the connection to the log.
const CONNECTION_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

#[derive(clap::Args, Debug, Clone)]
pub struct Config {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Where the API listens (also serves /healthz and /readyz; /metrics is
    /// on --metrics-addr).
    #[arg(long, env = "LH_GATEWAY_ADDR", default_value = DEFAULT_GATEWAY_ADDR)]
    pub gateway_addr: String,
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Schema of the read models.
    #[arg(long, env = "LH_GATEWAY_SCHEMA", default_value = DEFAULT_SCHEMA)]
    pub schema: String,
    /// Bearer token of the platform admin.
    #[arg(long, env = "LH_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// File holding the admin token when LH_ADMIN_TOKEN is unset.
    #[arg(long, env = "LH_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Bearer token of the auditor (read-only audit calls).
    #[arg(long, env = "LH_AUDITOR_TOKEN", hide_env_values = true)]
    pub auditor_token: Option<String>,
    /// File of the master keys that wrap tenants' data keys (`ID HEX` lines,
    /// mode 0600; the last line wraps). Never inside the database.
    #[arg(long, env = "LH_MASTER_KEY_FILE")]
    pub master_key_file: PathBuf,
    #[command(flatten)]
    pub limits: http::limits::TenantLimits,
    #[command(flatten)]
    pub front: http::front::FrontArgs,
}

impl Config {
    fn admin_token(&self) -> anyhow::Result<String> {
        if let Some(t) = &self.admin_token {
            return Ok(t.trim().to_string());
        }
        let path = self
            .admin_token_file
            .as_ref()
            .context("set LH_ADMIN_TOKEN or LH_ADMIN_TOKEN_FILE")?;
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("reading admin token from {}", path.display()))?;
        let token = token.trim().to_string();
        anyhow::ensure!(
            token.len() >= 16,
            "admin token in {} is shorter than 16 characters",
            path.display()
        );
        Ok(token)
    }
}

/// Starts the API and the projection feeding it.
pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    let admin_token = config.admin_token()?;
    let serve_options = config.front.serve_options()?;
    let bus = config.common.connect_bus(SERVICE).await?;
    let pool = lh_projection::connect_schema(&config.database_url, &config.schema).await?;
    lh_projection::migrate(&pool, &projection::MIGRATOR).await?;
    let keys = keyring::file_provider(&config.master_key_file)?;
    seal::migrate_keys(&pool, keys.as_ref()).await?;
    lh_service::restate::spawn(
        &bus,
        &config.common,
        SERVICE,
        &[lh_service::restate::Family::Tenant],
        shutdown.clone(),
    )?;

    let (progress_tx, progress_rx) = oneshot::channel::<Progress>();
    let projection_task = {
        let bus = bus.clone();
        let pool = pool.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            lh_projection::run(
                &bus,
                &pool,
                &projection::GatewayProjection,
                async move { stop.cancelled().await },
                move |p| {
                    let _ = progress_tx.send(p);
                },
            )
            .await
        })
    };
    let progress = progress_rx
        .await
        .context("the gateway projection did not start")?;
    let readiness = Readiness::default();
    let ctx = http::ApiContext {
        bus,
        pool,
        progress: progress.clone(),
        admin_token,
        auditor_token: config.auditor_token.clone(),
        limits: config.limits,
        write_budgets: std::sync::Arc::new(http::limits::WriteBudgets::new(&config.limits)),
        keys,
        request_budgets: http::front::RequestBudgets::new(&config.front),
    };
    let ready = readiness.clone();
    let bus = ctx.bus.clone();
    let router = http::router(ctx).layer(tower_http::trace::TraceLayer::new_for_http());
    Running::spawn_public(
        &config.gateway_addr,
        router,
        serve_options,
        &config.front.metrics_addr,
        readiness,
        shutdown,
        async move {
            // Ready once the read model has caught up with the log, and
            // not while it cannot write to the database, nor while the log
            // is out of reach (requests could not append).
            let watch_ready = async {
                let mut progress = progress;
                while !progress
                    .wait_caught_up(std::time::Duration::from_secs(3600))
                    .await
                {}
                loop {
                    let now_ready = bus.is_connected() && !progress.stalled();
                    if now_ready != ready.is_ready() {
                        tracing::info!(ready = now_ready, "gateway readiness changed");
                        ready.set(now_ready);
                    }
                    tokio::select! {
                        _ = progress.stalled_changed() => {}
                        _ = tokio::time::sleep(CONNECTION_CHECK_INTERVAL) => {}
                    }
                }
            };
            tokio::select! {
                r = projection_task => r.context("projection task panicked")?.map_err(Into::into),
                _ = watch_ready => Ok(()),
            }
        },
    )
    .await
}

/// Replays the log into `into` and compares its tables with the live
/// ones; with `swap`, the rebuilt schema replaces the live one (stop the
/// gateway first).
pub async fn rebuild(
    config: &Config,
    into: &str,
    swap: bool,
    on_event: impl FnMut(u64, u64),
) -> anyhow::Result<lh_projection::RebuildReport> {
    let bus = config.common.connect_bus(SERVICE).await?;
    Ok(lh_projection::rebuild_and_compare(
        &bus,
        &config.database_url,
        &config.schema,
        into,
        &projection::MIGRATOR,
        &projection::GatewayProjection,
        projection::TABLES,
        swap,
        on_event,
    )
    .await?)
}

impl lh_service::ProjectionService for Config {
    const NAME: &'static str = "lh-gateway";
    const ABOUT: &'static str = "Leasehold REST gateway. Flags of the service go before the \
        subcommand, or come from the environment.";

    fn schema(&self) -> &str {
        &self.schema
    }

    async fn start(self, shutdown: CancellationToken) -> anyhow::Result<Running> {
        start(self, shutdown).await
    }

    async fn rebuild(
        &self,
        into: &str,
        swap: bool,
        on_event: impl FnMut(u64, u64),
    ) -> anyhow::Result<lh_projection::RebuildReport> {
        rebuild(self, into, swap, on_event).await
    }
}
