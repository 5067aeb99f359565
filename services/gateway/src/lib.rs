//! Gateway: the REST API, authentication, idempotency, and the tenant and
//! lease read models (a PostgreSQL projection of the log, see
//! [`projection`]). Writes become events on the log; reads come from the
//! projection, which most writes wait for so a client reads its own write.
//! A lease request answers with the row its event will make instead, and a
//! read of a lease the projection does not have yet waits for it.

pub mod cache;
pub mod changes;
pub mod http;
pub mod invalidation;
pub mod keyring;
pub mod lease_admission;
pub mod lease_web;
pub mod oidc;
pub mod poison_free;
pub mod principals;
pub mod projection;
pub mod read_model;
pub mod seal;
pub mod sessions;
pub mod ssh;
pub mod ssh_keys;
pub mod storage;
pub mod templates;
pub mod tenant_keys;
pub mod usage;
pub mod workload_env;
pub mod workspaces;

pub use http::limits::TenantLimits;
pub use read_model::lease_views;

use std::path::PathBuf;

use anyhow::Context as _;
use lh_projection::Progress;
use lh_service::{CancellationToken, CommonArgs, Readiness, Running, Secret};
use tokio::sync::oneshot;

pub const DEFAULT_GATEWAY_ADDR: &str = "127.0.0.1:8080";
pub const DEFAULT_SCHEMA: &str = "gateway";

/// Metrics this service records, with their `# HELP` text.
pub const METRICS: &[lh_service::MetricHelp] = &[
    (
        "lh_gateway_leases_requested_total",
        "Lease requests the gateway accepted and appended to the log.",
    ),
    ("lh_gateway_tenants_created_total", "Tenants created."),
    (
        "lh_gateway_tenants_erased_total",
        "Tenants whose personal data was erased.",
    ),
    ("lh_gateway_api_keys_issued_total", "API keys issued."),
    ("lh_gateway_api_keys_revoked_total", "API keys revoked."),
    ("lh_gateway_ssh_keys_added_total", "SSH public keys tenants registered."),
    ("lh_gateway_ssh_keys_removed_total", "SSH public keys removed."),
    (
        "lh_gateway_storage_provisioned_total",
        "Tenants' buckets and storage identities made.",
    ),
    (
        "lh_gateway_event_streams_opened_total",
        "Event streams (GET /v1/events/stream) opened.",
    ),
    (
        "lh_gateway_storage_measurements_total",
        "Tenants' buckets measured, by result (recorded; duplicate: another replica recorded the interval's; failed: the store or the log out of reach).",
    ),
    (
        "lh_gateway_workspace_snapshots_total",
        "Workspace snapshots written (a day's first, or one over a changed head).",
    ),
    (
        "lh_gateway_workspace_restores_total",
        "Workspaces set back to one of their snapshots.",
    ),
    (
        "lh_gateway_workspaces_removed_total",
        "Workspaces removed with their snapshots.",
    ),
    (
        "lh_gateway_workspace_passes_total",
        "Tenants' workspaces kept (snapshotted and collected), by result (kept, failed).",
    ),
    (
        "lh_gateway_workspace_objects_collected_total",
        "Objects of tenants' buckets collected, by kind (snapshot, manifest, chunk).",
    ),
    (
        "lh_gateway_dataset_versions_added_total",
        "Dataset versions stored.",
    ),
    (
        "lh_gateway_dataset_versions_removed_total",
        "Dataset removals (one version, or every version of a dataset).",
    ),
    (
        "lh_gateway_sessions_opened_total",
        "Sessions into leases opened (exec, shells, forwarded connections, SSH channels).",
    ),
    (
        "lh_gateway_sessions_open",
        "Sessions into leases this replica relays now.",
    ),
    (
        "lh_gateway_session_lanes_total",
        "Connections nodes dialed for sessions' lanes, by result (taken, unknown_token, no_token, too_many, abandoned, failed).",
    ),
    (
        "lh_gateway_ssh_connections_refused_total",
        "SSH connections closed at once: the replica held as many as it takes.",
    ),
    (
        "lh_gateway_ssh_sign_ins_refused_total",
        "SSH sign-ins refused (a key not the lease's tenant's, or no such lease).",
    ),
    (
        "lh_gateway_audit_reads_total",
        "Reads of the audit trail, each itself recorded in the log.",
    ),
    (
        "lh_gateway_lease_log_reads_by_operators_total",
        "Reads of a tenant's workload log by an admin, each recorded in the log.",
    ),
    (
        "lh_gateway_node_commands_total",
        "Operator commands on nodes appended to the log, by type.",
    ),
    (
        "lh_gateway_writes_limited_total",
        "Writes refused because the tenant spent its write budget.",
    ),
    (
        "lh_gateway_requests_limited_total",
        "Requests refused by a rate limit, by the caller it was counted against.",
    ),
    (
        "lh_gateway_requests_timed_out_total",
        "Requests answered 503 because they ran past the request timeout.",
    ),
    (
        "lh_gateway_refusals_total",
        "Requests refused with a 4xx status (401, 403, 429...), by status.",
    ),    (
        "lh_gateway_usage_samples_skipped_total",
        "Usage samples not folded at all, by reason (undecodable, wrong_subject, unknown_lease, not_placed_here).",
    ),
    (
        "lh_gateway_usage_clock_clamped_total",
        "Usage samples stamped too far from when the stream stored them, put in the stream's minute.",
    ),
    (
        "lh_gateway_usage_gpus_refused_total",
        "GPU entries of usage samples left out for figures no device reports, by field.",
    ),
    (
        "lh_gateway_usage_rows_pruned_total",
        "Usage minutes deleted for being older than LH_USAGE_KEEP_DAYS.",
    ),
];

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
    pub database_url: Secret,
    /// Schema of the read models.
    #[arg(long, env = "LH_GATEWAY_SCHEMA", default_value = DEFAULT_SCHEMA)]
    pub schema: String,
    /// Bootstrap admin token (at least 32 characters, no placeholder);
    /// it acts as the operator `bootstrap`.
    #[arg(long, env = "LH_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<Secret>,
    /// File holding the bootstrap admin token when LH_ADMIN_TOKEN is unset.
    #[arg(long, env = "LH_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Bearer token of the shared auditor (read-only), checked as the admin token is.
    #[arg(long, env = "LH_AUDITOR_TOKEN", hide_env_values = true)]
    pub auditor_token: Option<Secret>,
    /// File holding the auditor token when LH_AUDITOR_TOKEN is unset.
    #[arg(long, env = "LH_AUDITOR_TOKEN_FILE")]
    pub auditor_token_file: Option<PathBuf>,
    /// Named operator keys: one `name role sha256hex` a line, role `admin`
    /// or `auditor`; each caller with such a key acts under its name.
    #[arg(long, env = "LH_ADMIN_KEYS_FILE")]
    pub admin_keys_file: Option<PathBuf>,
    #[command(flatten)]
    pub oidc: OidcArgs,
    #[command(flatten)]
    pub console_sign_in: http::console_sign_in::ConsoleSignInArgs,
    #[command(flatten)]
    pub lease_web: lease_web::LeaseWebArgs,
    /// File of the master keys that wrap tenants' data keys (`ID HEX` lines,
    /// mode 0600; the last line wraps). Never inside the database.
    #[arg(long, env = "LH_MASTER_KEY_FILE")]
    pub master_key_file: PathBuf,
    #[command(flatten)]
    pub limits: http::limits::TenantLimits,
    #[command(flatten)]
    pub front: http::front::FrontArgs,
    #[command(flatten)]
    pub usage: usage::UsageArgs,
    #[command(flatten)]
    pub sessions: sessions::SessionArgs,
    #[command(flatten)]
    pub ssh: ssh::SshArgs,
    /// TOML file of the workload templates leases may name (`[[template]]`
    /// entries; docs/workloads.md); without it, the built-in set (`jupyter`).
    /// Checked at start: a bad entry stops the gateway, naming it.
    #[arg(long, env = "LH_TEMPLATES_FILE")]
    pub templates_file: Option<PathBuf>,
    #[command(flatten)]
    pub storage: storage::StorageArgs,
}

/// Operators signed in with an OpenID Connect issuer (off unless the
/// issuer is set).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OidcArgs {
    /// The issuer (`iss`) whose tokens name admins and auditors.
    #[arg(long, env = "LH_OIDC_ISSUER", requires = "oidc_audience")]
    pub oidc_issuer: Option<String>,
    /// The audience (`aud`) tokens must be for.
    #[arg(long, env = "LH_OIDC_AUDIENCE", requires = "oidc_issuer")]
    pub oidc_audience: Option<String>,
    /// The issuer's JSON Web Key Set, from a file.
    #[arg(long, env = "LH_OIDC_JWKS_FILE", conflicts_with = "oidc_jwks_url")]
    pub oidc_jwks_file: Option<PathBuf>,
    /// The issuer's JSON Web Key Set, from a URL (https, or http on loopback).
    #[arg(long, env = "LH_OIDC_JWKS_URL")]
    pub oidc_jwks_url: Option<String>,
    /// The claim holding the roles (`admin`, `auditor`).
    #[arg(long, env = "LH_OIDC_ROLES_CLAIM", default_value = "roles")]
    pub oidc_roles_claim: String,
    /// The claim naming the tenant (its id) a person without an operator's
    /// role acts for; unset: tenants sign in with API keys only.
    #[arg(long, env = "LH_OIDC_TENANT_CLAIM")]
    pub oidc_tenant_claim: Option<String>,
}

impl OidcArgs {
    /// The issuer's configuration, or `None` when OIDC is off.
    pub fn config(&self) -> anyhow::Result<Option<oidc::OidcConfig>> {
        let (Some(issuer), Some(audience)) = (&self.oidc_issuer, &self.oidc_audience) else {
            anyhow::ensure!(
                self.oidc_jwks_file.is_none() && self.oidc_jwks_url.is_none(),
                "a JWKS is set but LH_OIDC_ISSUER and LH_OIDC_AUDIENCE are not"
            );
            return Ok(None);
        };
        let jwks = match (&self.oidc_jwks_file, &self.oidc_jwks_url) {
            (Some(path), None) => oidc::JwksSource::File(path.clone()),
            (None, Some(url)) => oidc::JwksSource::Url(
                url.parse()
                    .with_context(|| format!("LH_OIDC_JWKS_URL {url:?} is not a URL"))?,
            ),
            _ => anyhow::bail!("set one of LH_OIDC_JWKS_FILE and LH_OIDC_JWKS_URL"),
        };
        Ok(Some(oidc::OidcConfig {
            issuer: issuer.clone(),
            audience: audience.clone(),
            jwks,
            roles_claim: self.oidc_roles_claim.clone(),
            tenant_claim: self
                .oidc_tenant_claim
                .clone()
                .filter(|claim| !claim.trim().is_empty()),
        }))
    }
}

impl Config {
    /// The operators this gateway knows; at least one admin credential is
    /// required, or nobody could create a tenant.
    pub async fn principals(&self) -> anyhow::Result<principals::Principals> {
        let token = |value: &Option<Secret>, file: &Option<PathBuf>, what: &str| match (value, file)
        {
            (Some(t), _) => Ok(Some(t.expose().trim().to_string())),
            (None, Some(path)) => principals::read_token_file(what, path).map(Some),
            (None, None) => Ok(None),
        };
        let admin = token(&self.admin_token, &self.admin_token_file, "the admin token")?;
        let auditor = token(
            &self.auditor_token,
            &self.auditor_token_file,
            "the auditor token",
        )?;
        let named = match &self.admin_keys_file {
            Some(path) => principals::read_keys_file(path)?,
            None => Vec::new(),
        };
        let oidc = self.oidc.config()?;
        anyhow::ensure!(
            admin.is_some()
                || oidc.is_some()
                || named
                    .iter()
                    .any(|(o, _)| o.role == lh_events::OperatorRole::Admin),
            "no admin credential: set LH_ADMIN_TOKEN, LH_ADMIN_TOKEN_FILE, LH_ADMIN_KEYS_FILE \
             or LH_OIDC_ISSUER"
        );
        let principals = principals::Principals::new(admin.as_deref(), auditor.as_deref(), named)?;
        Ok(match oidc {
            Some(config) => principals.with_oidc(oidc::Verifier::new(config).await?),
            None => principals,
        })
    }
}

/// Starts the API and the projection feeding it.
pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    lh_service::describe_metrics(METRICS);
    // First: a bad file is the operator's to fix, and says so before
    // anything is connected.
    let templates = std::sync::Arc::new(templates::Templates::load(
        config.templates_file.as_deref(),
    )?);
    let principals = std::sync::Arc::new(config.principals().await?);
    let storage = config.storage.open()?.map(std::sync::Arc::new);
    let serve_options = config.front.serve_options()?;
    let bus = config.common.connect_bus(SERVICE).await?;
    let pool = lh_projection::connect_schema(config.database_url.expose(), &config.schema).await?;
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
    let caches = invalidation::Caches::default();
    let projection_task = {
        let bus = bus.clone();
        let pool = pool.clone();
        let stop = shutdown.clone();
        let caches = caches.clone();
        tokio::spawn(async move {
            lh_projection::run_observed(
                &bus,
                &pool,
                &projection::GatewayProjection,
                async move { stop.cancelled().await },
                move |p| {
                    let _ = progress_tx.send(p);
                },
                |stored_subjects| caches.committed(&pool, stored_subjects),
            )
            .await
        })
    };
    let progress = progress_rx
        .await
        .context("the gateway projection did not start")?;
    // Usage: folded from the telemetry stream by the same loop, on its own
    // offset; nothing waits for it (usage is no client's own write).
    let usage_task = {
        let bus = bus.clone();
        let pool = pool.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            lh_projection::run(
                &bus,
                &pool,
                &usage::UsageProjection,
                async move { stop.cancelled().await },
                |_| {},
            )
            .await
        })
    };
    let prune = usage::prune_every_hour(pool.clone(), config.usage.usage_keep_days);
    let readiness = Readiness::default();
    let ssh_bound = ssh::bind(&config.ssh).await?;
    let lane_bound = sessions::lane::bind(
        &config.sessions.session_lane_addr,
        config.sessions.session_lane_public_addr.as_deref(),
    )
    .await?;
    let lanes = lane_bound.as_ref().map(|(_, lanes)| lanes.clone());
    let lane_task = lane_bound.map(|(listener, lanes)| {
        lh_service::AbortOnDrop(sessions::lane::serve(listener, lanes, shutdown.clone()))
    });
    let changes = changes::Changes::new();
    let console_sign_in = config
        .console_sign_in
        .config(config.oidc.oidc_issuer.is_some())?;
    let lease_web = config.lease_web.config()?.map(std::sync::Arc::new);
    let lease_web_listener = match &config.lease_web.lease_web_addr {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding LH_LEASE_WEB_ADDR {addr}"))?,
        ),
        None => None,
    };
    let ctx = http::ApiContext::new(http::ApiShared {
        bus,
        pool,
        progress: progress.clone(),
        principals,
        tenant_keys: caches.tenant_keys,
        lease_admission: caches.lease_admission,
        lease_views: caches.lease_views,
        limits: config.limits,
        write_budgets: std::sync::Arc::new(http::limits::WriteBudgets::new(&config.limits)),
        keys,
        request_budgets: http::front::RequestBudgets::new(&config.front),
        refusals: std::sync::Arc::new(http::refusals::RefusalCounter::new(
            config.front.refusal_summary_secs,
        )),
        sessions: std::sync::Arc::new(
            sessions::Sessions::new(config.sessions.clone()).with_lanes(lanes),
        ),
        ssh: ssh_bound.as_ref().map(|b| b.endpoint.clone()),
        templates,
        storage: storage.clone(),
        changes: changes.clone(),
        streams: std::sync::Arc::new(tokio::sync::Semaphore::new(http::events::MAX_OPEN_STREAMS)),
        console_sign_in: console_sign_in.map(std::sync::Arc::new),
        lease_web: lease_web.clone(),
    });
    let lease_web_task = match (lease_web, lease_web_listener) {
        (Some(web), Some(listener)) => {
            let lease_of: lease_web::LeaseOf = {
                let ctx = ctx.clone();
                std::sync::Arc::new(move |tenant, lease| {
                    let ctx = ctx.clone();
                    Box::pin(async move { http::leases::tenants_lease(&ctx, tenant, lease).await })
                })
            };
            let reach = lease_web::Reach {
                pool: ctx.pool.clone(),
                bus: ctx.bus.clone(),
                sessions: ctx.sessions.clone(),
                write_budgets: ctx.write_budgets.clone(),
                lease_of,
            };
            Some(lh_service::AbortOnDrop(tokio::spawn(lease_web::serve(
                listener,
                web,
                reach,
                shutdown.clone(),
            ))))
        }
        _ => None,
    };
    let ssh_task = ssh_bound
        .map(|bound| lh_service::AbortOnDrop(ssh::serve(bound, ctx.clone(), shutdown.clone())));
    let summaries =
        http::refusals::publish_summaries(ctx.bus.clone(), ctx.refusals.clone(), SERVICE);
    // Tenants' buckets are measured only where the gateway keeps their data.
    let measuring = {
        let (pool, bus) = (ctx.pool.clone(), ctx.bus.clone());
        let storage = storage.clone();
        let interval_secs = config.storage.storage_measure_interval_secs;
        async move {
            match storage {
                Some(storage) => {
                    storage::measure::every_interval(storage, pool, bus, interval_secs).await
                }
                None => std::future::pending().await,
            }
        }
    };
    // Workspaces are snapshotted and collected only where the gateway
    // keeps tenants' data.
    let keeping = {
        let (pool, bus, keys) = (ctx.pool.clone(), ctx.bus.clone(), ctx.keys.clone());
        let storage = storage.clone();
        let keeping = config.storage.keeping();
        async move {
            match storage {
                Some(storage) => {
                    workspaces::every_interval(storage, pool, keys, bus, keeping).await
                }
                None => std::future::pending().await,
            }
        }
    };
    let following = changes::follow(
        ctx.bus.clone(),
        ctx.pool.clone(),
        ctx.progress.clone(),
        ctx.changes.clone(),
    );
    let environments =
        workload_env::serve(ctx.bus.clone(), ctx.pool.clone(), ctx.keys.clone(), storage);
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
            // The SSH endpoint, the lanes and the leases' web pages live as
            // long as the API.
            let _ssh = ssh_task;
            let _lease_web = lease_web_task;
            let _lanes = lane_task;
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
                r = usage_task => r.context("usage projection task panicked")?.map_err(Into::into),
                never = prune => match never {},
                _ = watch_ready => Ok(()),
                never = summaries => match never {},
                never = measuring => match never {},
                never = keeping => match never {},
                never = following => match never {},
                ended = environments => ended,
            }
        },
    )
    .await
}

/// Replays the log into `into` and compares its tables with the live
/// ones, carries the usage minutes over (see [`usage::carry_over`]); with
/// `swap`, the rebuilt schema replaces the live one (stop the gateway
/// first).
pub async fn rebuild(
    config: &Config,
    into: &str,
    swap: bool,
    on_event: impl FnMut(u64, u64),
) -> anyhow::Result<lh_projection::RebuildReport> {
    let bus = config.common.connect_bus(SERVICE).await?;
    let mut report = lh_projection::rebuild_and_compare(
        &bus,
        config.database_url.expose(),
        &config.schema,
        into,
        &projection::MIGRATOR,
        &projection::GatewayProjection,
        projection::TABLES,
        false,
        on_event,
    )
    .await?;
    // Usage minutes outlive the telemetry stream: the rebuilt schema takes
    // the live rows and adds what the stream still holds.
    usage::carry_over(&bus, config.database_url.expose(), &config.schema, into).await?;
    if swap {
        lh_projection::swap_schemas(config.database_url.expose(), &config.schema, into).await?;
        report.swapped = true;
    }
    Ok(report)
}

impl lh_service::Service for Config {
    const NAME: &'static str = "lh-gateway";

    async fn start(self, shutdown: CancellationToken) -> anyhow::Result<Running> {
        start(self, shutdown).await
    }
}

impl lh_service::ProjectionService for Config {
    const ABOUT: &'static str = "Leasehold REST gateway. Flags of the service go before the \
        subcommand, or come from the environment.";

    fn schema(&self) -> &str {
        &self.schema
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_prints_no_secret() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            config: Config,
        }
        let flags = <Flags as clap::Parser>::parse_from([
            "lh-gateway",
            "--database-url",
            "postgres://lh:db-secret@db/lh",
            "--admin-token",
            "admin-secret-0123456789abcdefghijklmnop",
            "--auditor-token",
            "auditor-secret-0123456789abcdefghijklmn",
            "--master-key-file",
            "/etc/lh/master.keys",
        ]);
        let printed = format!("{:?}", flags.config);
        for secret in ["db-secret", "admin-secret", "auditor-secret"] {
            assert!(!printed.contains(secret), "{secret} in {printed}");
        }
        assert_eq!(
            flags.config.database_url.expose(),
            "postgres://lh:db-secret@db/lh"
        );
    }
}
