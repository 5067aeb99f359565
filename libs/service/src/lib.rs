//! The shape every Leasehold service shares: common flags, one shutdown
//! mechanism, the bus connection and the health/metrics server.
//!
//! A service's library exposes `start(config, shutdown) -> Running`; its
//! `main.rs` parses flags, calls [`init_process`] and awaits
//! [`Running::wait`]. Tests call the same `start` with port 0 and read the
//! bound address from [`Running::http_addr`].

pub mod clock;
pub mod decider;
mod entry;
pub mod restate;
mod secret;

use std::net::SocketAddr;

use anyhow::Context as _;
use lh_bus::{Bus, BusConfig};
pub use lh_telemetry::{tls_config, MetricHelp, Readiness, ServeOptions};
pub use secret::Secret;
use tokio::task::JoinHandle;
pub use tokio_util::sync::CancellationToken;

pub use entry::{
    projection_main, rebuild_progress, report_rebuild, run_service, service_main,
    ProjectionCommand, ProjectionService, RebuildArgs, Service,
};

/// Metrics this library records, with their `# HELP` text.
pub const METRICS: &[lh_telemetry::MetricHelp] = &[
    (
        "lh_snapshots_restored_total",
        "Decider snapshots read back at start, by decider.",
    ),
    (
        "lh_snapshots_stored_total",
        "Decider snapshots written, by decider.",
    ),
    (
        "lh_decision_conflicts_total",
        "Decision batches refused because another replica appended first, by decider.",
    ),
    (
        "lh_restatements_total",
        "Aggregates restated before their history expired from the log, by service.",
    ),
    (
        "lh_restatements_failed_total",
        "Restatements that could not be written, by service.",
    ),
];

/// Gives the `# HELP` text of every metric a service may show: those of
/// the libraries every service links, then `own`. Call it first in a
/// service's `start`.
pub fn describe_metrics(own: &[lh_telemetry::MetricHelp]) {
    for metrics in [
        lh_telemetry::METRICS,
        lh_bus::METRICS,
        lh_projection::METRICS,
        METRICS,
        own,
    ] {
        lh_telemetry::describe_metrics(metrics);
    }
}

/// Flags every service takes.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// NATS server with JetStream, or a comma-separated list of a cluster's
    /// members (the client connects to any and fails over to the others).
    #[arg(long, env = "LH_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Listen address for /healthz, /readyz and /metrics (service default when unset).
    #[arg(long, env = "LH_HTTP_ADDR")]
    pub http_addr: Option<String>,
    /// Byte cap of the LH_EVENTS stream when this service creates it.
    #[arg(long, env = "LH_EVENTS_MAX_BYTES", default_value_t = lh_bus::EVENTS_DEFAULT_MAX_BYTES)]
    pub events_max_bytes: i64,
    /// Replicas of the streams when this service creates them (3 in production).
    #[arg(long, env = "LH_STREAM_REPLICAS", default_value_t = 1)]
    pub stream_replicas: usize,
    /// Days the event log keeps an event when this service creates it;
    /// never under 365.
    #[arg(long, env = "LH_EVENTS_MAX_AGE_DAYS", default_value_t = 365)]
    pub events_max_age_days: u64,
    /// Seconds the event log keeps an event, instead of the days: for
    /// tests that run a log past expiry, together with
    /// `LH_ALLOW_SHORT_RETENTION`.
    #[arg(long, env = "LH_EVENTS_MAX_AGE_SECS")]
    pub events_max_age_secs: Option<u64>,
    /// Accept a retention under 365 days (tests only).
    #[arg(long, env = "LH_ALLOW_SHORT_RETENTION", default_value_t = false)]
    pub allow_short_retention: bool,
    /// Days after which a live aggregate this service owns is restated on
    /// its subject, well before the log's age limit takes its history.
    #[arg(long, env = "LH_RESTATE_AFTER_DAYS", default_value_t = 30)]
    pub restate_after_days: u64,
    /// Seconds instead of days (tests that run a log past expiry).
    #[arg(long, env = "LH_RESTATE_AFTER_SECS")]
    pub restate_after_secs: Option<u64>,
}

impl CommonArgs {
    /// For tests: a service on `nats_url` listening on a free port.
    pub fn for_test(nats_url: &str) -> Self {
        Self {
            nats_url: nats_url.to_string(),
            http_addr: Some("127.0.0.1:0".to_string()),
            events_max_bytes: lh_bus::EVENTS_DEFAULT_MAX_BYTES,
            stream_replicas: 1,
            events_max_age_days: 365,
            events_max_age_secs: None,
            allow_short_retention: false,
            restate_after_days: 30,
            restate_after_secs: None,
        }
    }

    /// How old a full statement of a live aggregate may get before its
    /// owner restates it. Refused unless it is under half the log's age
    /// limit, so that a restatement that fails once has time to be retried.
    pub fn restate_after(&self) -> anyhow::Result<std::time::Duration> {
        let after = match self.restate_after_secs {
            Some(secs) => std::time::Duration::from_secs(secs),
            None => {
                std::time::Duration::from_secs(self.restate_after_days.saturating_mul(24 * 3600))
            }
        };
        let max_age = self.events_max_age();
        anyhow::ensure!(
            !after.is_zero() && after < max_age / 2,
            "LH_RESTATE_AFTER_DAYS / _SECS ({after:?}) must be above zero and under half the log's age limit ({max_age:?})"
        );
        Ok(after)
    }

    /// How long the event log keeps an event under these flags.
    pub fn events_max_age(&self) -> std::time::Duration {
        match self.events_max_age_secs {
            Some(secs) => std::time::Duration::from_secs(secs),
            None => {
                std::time::Duration::from_secs(self.events_max_age_days.saturating_mul(24 * 3600))
            }
        }
    }

    pub fn http_addr_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.http_addr.as_deref().unwrap_or(default)
    }

    /// Connects to NATS and checks the streams (see [`Bus::connect`]).
    pub async fn connect_bus(&self, service: &str) -> anyhow::Result<Bus> {
        let mut config = BusConfig::new(&self.nats_url, service);
        config.events_max_bytes = self.events_max_bytes;
        config.replicas = self.stream_replicas;
        config.events_max_age = self.events_max_age();
        config.allow_short_retention = self.allow_short_retention;
        // Secrets come from files the environment names, never from flags.
        let env = |name: &str| std::env::var(name).ok();
        config.credentials = lh_bus::Credentials::from_env(std::env::args(), env)
            .with_context(|| format!("{service}: NATS credentials"))?;
        config.tls =
            lh_bus::TlsFiles::from_env(env).with_context(|| format!("{service}: NATS TLS"))?;
        Bus::connect(&config)
            .await
            .with_context(|| format!("{service}: connecting to the event log"))
    }
}

/// Logging and tracing for a service binary.
pub fn init_process(service: &'static str) {
    lh_telemetry::init(service, lh_telemetry::LogFormat::from_env());
}

/// A token cancelled on SIGINT or SIGTERM.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler installs");
            tokio::select! {
                _ = ctrl_c => {},
                _ = term.recv() => {},
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutting down");
        cancel.cancel();
    });
    token
}

/// A started service.
pub struct Running {
    /// Where its HTTP server (health, and the API for the gateway) listens.
    pub http_addr: SocketAddr,
    /// Where its `/metrics` is served: `http_addr`, except for a service
    /// with a public API, which keeps its metrics on an internal listener.
    pub metrics_addr: SocketAddr,
    pub readiness: Readiness,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Serves `router` (merged with the health routes) on `addr` and runs
    /// `work` until it ends or `shutdown` is cancelled.
    pub async fn spawn(
        addr: &str,
        router: axum::Router,
        readiness: Readiness,
        shutdown: CancellationToken,
        work: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) -> anyhow::Result<Self> {
        let section = lh_telemetry::MetricsSection::default();
        Self::spawn_with_metrics(addr, router, readiness, section, shutdown, work).await
    }

    /// [`Running::spawn`] whose `/metrics` also serves `section`.
    pub async fn spawn_with_metrics(
        addr: &str,
        router: axum::Router,
        readiness: Readiness,
        section: lh_telemetry::MetricsSection,
        shutdown: CancellationToken,
        work: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) -> anyhow::Result<Self> {
        let router = router.merge(lh_telemetry::health_router_with(readiness.clone(), section));
        let stop = shutdown.clone();
        let (http_addr, http) =
            lh_telemetry::serve(addr, router, async move { stop.cancelled().await }).await?;
        let task = tokio::spawn(async move {
            let result = tokio::select! {
                r = work => r,
                _ = shutdown.cancelled() => Ok(()),
            };
            shutdown.cancel();
            let _ = http.await;
            result
        });
        Ok(Self {
            http_addr,
            metrics_addr: http_addr,
            readiness,
            task,
        })
    }

    /// A service with a public API: `router` and the health routes on
    /// `api_addr` served with `options` (TLS, timeouts, a connection bound),
    /// and `/metrics` with the health routes on the internal `metrics_addr`,
    /// so that clients of the API never read the service's metrics.
    #[allow(clippy::too_many_arguments)]
    pub async fn spawn_public(
        api_addr: &str,
        router: axum::Router,
        options: lh_telemetry::ServeOptions,
        metrics_addr: &str,
        readiness: Readiness,
        shutdown: CancellationToken,
        work: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) -> anyhow::Result<Self> {
        let public = router.merge(lh_telemetry::health_routes(readiness.clone()));
        let stop = shutdown.clone();
        let (http_addr, api) =
            lh_telemetry::serve_with(
                api_addr,
                public,
                options,
                async move { stop.cancelled().await },
            )
            .await?;
        let internal = lh_telemetry::health_router_with(
            readiness.clone(),
            lh_telemetry::MetricsSection::default(),
        );
        let stop = shutdown.clone();
        let (metrics_addr, metrics) =
            lh_telemetry::serve(
                metrics_addr,
                internal,
                async move { stop.cancelled().await },
            )
            .await?;
        let task = tokio::spawn(async move {
            let result = tokio::select! {
                r = work => r,
                _ = shutdown.cancelled() => Ok(()),
            };
            shutdown.cancel();
            let _ = api.await;
            let _ = metrics.await;
            result
        });
        Ok(Self {
            http_addr,
            metrics_addr,
            readiness,
            task,
        })
    }

    /// Waits for the service to end; its error, if it failed.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("service task panicked")?
    }

    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Ends the service at its next await point, without letting it finish
    /// what it was doing: the nearest a test gets to kill -9 inside one
    /// process. Cancel its shutdown token too, so its HTTP server closes.
    pub fn abort(&self) {
        self.task.abort();
    }
}

/// A spawned task that ends when its handle goes: a service's helper
/// never outlives the service.
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
