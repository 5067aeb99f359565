//! Tracing, metrics and the health endpoints every service serves.
//!
//! * [`init`] sets up `tracing` once per process: JSON or pretty logs, and
//!   OTLP/HTTP trace export when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
//! * [`metrics_handle`] installs one Prometheus recorder per process; the
//!   `metrics` macros anywhere in the code then show up on `/metrics`.
//! * [`describe_metrics`] gives each metric its `# HELP` line: Prometheus'
//!   conventions (and `promtool check metrics`) want one on every family.
//! * [`health_router`] serves `/healthz` (the process runs), `/readyz` (it
//!   has caught up and can do its job) and `/metrics`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use axum::{extract::State, http::StatusCode, routing::get, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::{layer::SubscriberExt, util::SubscriberInitExt, EnvFilter, Layer};

mod serve;
pub use serve::{serve_with, tls_config, ServeOptions};

static RECORDER: OnceLock<PrometheusHandle> = OnceLock::new();
static TRACING: OnceLock<()> = OnceLock::new();

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

impl LogFormat {
    /// `LH_LOG_FORMAT=json` selects JSON; anything else is pretty.
    pub fn from_env() -> Self {
        match std::env::var("LH_LOG_FORMAT").as_deref() {
            Ok("json") => LogFormat::Json,
            _ => LogFormat::Pretty,
        }
    }
}

/// Sets up logging and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, OTLP
/// trace export. Safe to call more than once (tests run many services in
/// one process); only the first call takes effect.
pub fn init(service_name: &'static str, format: LogFormat) {
    TRACING.get_or_init(|| {
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
        let fmt_layer = match format {
            LogFormat::Json => tracing_subscriber::fmt::layer().json().boxed(),
            LogFormat::Pretty => tracing_subscriber::fmt::layer().boxed(),
        };
        let otel_layer = otlp_tracer(service_name)
            .map(|tracer| tracing_opentelemetry::layer().with_tracer(tracer).boxed());
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(fmt_layer)
            .with(otel_layer)
            .try_init();
    });
}

fn otlp_tracer(service_name: &'static str) -> Option<opentelemetry_sdk::trace::Tracer> {
    use opentelemetry::trace::TracerProvider as _;
    std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok()?;
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("OTLP export disabled: {e}");
            return None;
        }
    };
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service_name)
                .build(),
        )
        .build();
    let tracer = provider.tracer(service_name);
    opentelemetry::global::set_tracer_provider(provider);
    Some(tracer)
}

/// A metric's name and its `# HELP` text.
pub type MetricHelp = (&'static str, &'static str);

/// Metrics this library records.
pub const METRICS: &[MetricHelp] = &[(
    "lh_http_connections_refused_total",
    "Connections refused because the listener was at its connection bound.",
)];

/// Bucket bounds, in seconds, of every `_seconds` histogram: from a
/// placement in the same pass (under a second) to a queue of an hour, so
/// that a p95 of 15 s falls between two bounds and not at the edge.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0,
];

/// Gives each metric its `# HELP` text on `/metrics`. The recorder is
/// installed first, so a description is never lost to the no-op recorder.
pub fn describe_metrics(metrics: &[MetricHelp]) {
    metrics_handle();
    for (name, help) in metrics {
        // The recorder keeps one description per name, whatever its kind.
        metrics::describe_counter!(*name, *help);
    }
}

/// The process-wide Prometheus recorder. Histograms whose name ends in
/// `_seconds` have [`SECONDS_BUCKETS`] (buckets, not a summary: quantiles
/// of several replicas can then be added up in Prometheus).
pub fn metrics_handle() -> PrometheusHandle {
    RECORDER
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .expect("the bucket bounds are not empty")
                .build_recorder();
            let handle = recorder.handle();
            // In tests several services share a process and one recorder.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Whether a service is ready to do its job; flipped by the service.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Metrics text a service renders itself and `/metrics` serves after the
/// recorder's: series whose label sets come and go (one per lease), which
/// the `metrics` recorder would keep forever once set.
#[derive(Clone, Default)]
pub struct MetricsSection(Arc<RwLock<String>>);

impl MetricsSection {
    /// Replaces the whole section (Prometheus text format, ending in `\n`).
    pub fn set(&self, text: String) {
        *self.0.write().expect("metrics section") = text;
    }

    pub fn text(&self) -> String {
        self.0.read().expect("metrics section").clone()
    }
}

/// `/healthz`, `/readyz` and `/metrics`, to merge into a service's router.
pub fn health_router(readiness: Readiness) -> Router {
    health_router_with(readiness, MetricsSection::default())
}

/// [`health_router`] whose `/metrics` also serves `section`.
pub fn health_router_with(readiness: Readiness, section: MetricsSection) -> Router {
    health_routes(readiness).merge(metrics_routes(section))
}

/// `/healthz` and `/readyz`: what a load balancer or an orchestrator asks.
pub fn health_routes(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(r): State<Readiness>| async move {
                if r.is_ready() {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .with_state(readiness)
}

/// `/metrics`, with `section` after the recorder's series.
pub fn metrics_routes(section: MetricsSection) -> Router {
    let handle = metrics_handle();
    Router::new().route(
        "/metrics",
        get(move || async move {
            let mut text = handle.render();
            text.push_str(&section.text());
            text
        }),
    )
}

/// Binds `addr` and serves `router` until `shutdown` resolves. Returns the
/// bound address at once (port 0 picks a free port).
pub async fn serve(
    addr: &str,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_with(addr, router, ServeOptions::default(), shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readyz_follows_readiness_and_metrics_render() {
        let readiness = Readiness::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr, _task) = serve("127.0.0.1:0", health_router(readiness.clone()), async {
            let _ = rx.await;
        })
        .await
        .unwrap();
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(get("/readyz").await.starts_with("HTTP/1.0 503"));
        readiness.set(true);
        assert!(get("/readyz").await.starts_with("HTTP/1.0 200"));
        metrics::counter!("lh_test_total").increment(1);
        assert!(get("/metrics").await.contains("lh_test_total 1"));
        let _ = tx.send(());
    }
}
