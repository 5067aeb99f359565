//! The gateway's front door: TLS when a certificate is configured, metrics
//! on an internal listener, a bound on connections, on the time to send
//! headers and on a request's whole run, and a request budget per
//! credential (per client address for callers without one) that answers
//! 429 with `Retry-After` before any handler or database lookup runs.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::limits::Budgets;
use super::ApiError;

/// Most credentials and client addresses whose budgets a replica keeps.
const MAX_TRACKED_CALLERS: usize = 100_000;
/// Bytes of a credential's SHA-256 that key its budget.
const CALLER_KEY_BYTES: usize = 16;
/// The one route that may run past the request timeout: a what-if reads a
/// whole month of charges, and is answered or given up within its own.
const WHAT_IF_PATH: &str = "/v1/billing/what-if";
const WHAT_IF_REQUEST_TIMEOUT: Duration =
    Duration::from_secs(lh_rpc::what_if::WHAT_IF_TIMEOUT_SECS + 5);

#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct FrontArgs {
    /// PEM certificate chain for TLS on the API; with --tls-key-file.
    /// Without both the API speaks plain HTTP (behind a TLS proxy).
    #[arg(long, env = "LH_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of that certificate.
    #[arg(long, env = "LH_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Internal listener for /metrics (with /healthz and /readyz); the API
    /// port never serves metrics.
    #[arg(long, env = "LH_METRICS_ADDR", default_value = "127.0.0.1:9100")]
    pub metrics_addr: String,
    /// Longest a request may run before it is answered 503.
    #[arg(long, env = "LH_REQUEST_TIMEOUT_SECS", default_value_t = 60)]
    pub request_timeout_secs: u64,
    /// Longest a client may take to send a request's headers.
    #[arg(long, env = "LH_HEADER_READ_TIMEOUT_SECS", default_value_t = 10)]
    pub header_read_timeout_secs: u64,
    /// Most client connections open at once.
    #[arg(long, env = "LH_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,
    /// Requests one credential (API key, token) may make per second,
    /// sustained, on each replica.
    #[arg(long, env = "LH_REQUESTS_PER_S_PER_KEY", default_value_t = 100.0)]
    pub requests_per_s_per_key: f64,
    /// Requests one credential may make in a burst above that rate.
    #[arg(long, env = "LH_REQUEST_BURST_PER_KEY", default_value_t = 400)]
    pub request_burst_per_key: u32,
    /// Requests without a credential one client address may make per
    /// second (a flood of bad keys is counted here too, by address).
    #[arg(
        long,
        env = "LH_ANONYMOUS_REQUESTS_PER_S_PER_IP",
        default_value_t = 10.0
    )]
    pub anonymous_requests_per_s_per_ip: f64,
    /// Requests without a credential one address may make in a burst.
    #[arg(long, env = "LH_ANONYMOUS_REQUEST_BURST_PER_IP", default_value_t = 50)]
    pub anonymous_request_burst_per_ip: u32,
    /// Refused requests (401, 403, 429) are summed per source over this
    /// many seconds into one `access.refused` event each.
    #[arg(long, env = "LH_REFUSAL_SUMMARY_SECS", default_value_t = super::refusals::DEFAULT_REFUSAL_INTERVAL_SECS)]
    pub refusal_summary_secs: u64,
}

impl Default for FrontArgs {
    fn default() -> Self {
        Self {
            tls_cert_file: None,
            tls_key_file: None,
            metrics_addr: "127.0.0.1:9100".into(),
            request_timeout_secs: 60,
            header_read_timeout_secs: 10,
            max_connections: 10_000,
            requests_per_s_per_key: 100.0,
            request_burst_per_key: 400,
            anonymous_requests_per_s_per_ip: 10.0,
            anonymous_request_burst_per_ip: 50,
            refusal_summary_secs: super::refusals::DEFAULT_REFUSAL_INTERVAL_SECS,
        }
    }
}

impl FrontArgs {
    /// How the API listener treats its clients.
    pub fn serve_options(&self) -> anyhow::Result<lh_service::ServeOptions> {
        let tls = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some(lh_service::tls_config(cert, key)?),
            (None, None) => None,
            _ => anyhow::bail!("set both LH_TLS_CERT_FILE and LH_TLS_KEY_FILE, or neither"),
        };
        Ok(lh_service::ServeOptions {
            tls,
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs.max(1)),
            max_connections: self.max_connections.max(1),
            ..lh_service::ServeOptions::default()
        })
    }
}

/// Whose budget a request spends.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum BudgetKey {
    Credential([u8; CALLER_KEY_BYTES]),
    Address(IpAddr),
}

/// The request budgets of this replica.
#[derive(Debug)]
pub struct RequestBudgets {
    timeout: Duration,
    per_key: Budgets<BudgetKey>,
    per_address: Budgets<BudgetKey>,
    /// Refused credentials per client address: each distinct wrong key would
    /// otherwise come with a fresh budget of its own.
    refused_per_address: Budgets<IpAddr>,
    /// The console's own files per client address: a page loads twenty at
    /// once, without a key (a module cannot send one), from memory.
    console_files_per_address: Budgets<IpAddr>,
}

/// The console's files one address may fetch a second, and in a burst: a
/// page's first view is about twenty, a browser's reloads a few times that.
pub const CONSOLE_FILES_PER_S_PER_IP: f64 = 100.0;
pub const CONSOLE_FILE_BURST_PER_IP: u32 = 400;

/// Whether `path` is one of the console's files (not the API).
fn console_file(path: &str) -> bool {
    path == "/console" || path.starts_with("/console/")
}

impl RequestBudgets {
    pub fn new(args: &FrontArgs) -> Arc<Self> {
        Arc::new(Self {
            timeout: Duration::from_secs(args.request_timeout_secs.max(1)),
            per_key: Budgets::with_rate(
                args.requests_per_s_per_key,
                args.request_burst_per_key,
                MAX_TRACKED_CALLERS,
            ),
            per_address: Budgets::with_rate(
                args.anonymous_requests_per_s_per_ip,
                args.anonymous_request_burst_per_ip,
                MAX_TRACKED_CALLERS,
            ),
            refused_per_address: Budgets::with_rate(
                args.anonymous_requests_per_s_per_ip,
                args.anonymous_request_burst_per_ip,
                MAX_TRACKED_CALLERS,
            ),
            console_files_per_address: Budgets::with_rate(
                CONSOLE_FILES_PER_S_PER_IP,
                CONSOLE_FILE_BURST_PER_IP,
                MAX_TRACKED_CALLERS,
            ),
        })
    }
}

/// Spends the caller's budget, then runs the request within the timeout.
pub async fn guard(
    State(budgets): State<Arc<RequestBudgets>>,
    request: Request,
    next: Next,
) -> Response {
    // The key as the caller's extractor reads it (a browser's WebSocket
    // carries it in a subprotocol), so both spend one budget.
    let bearer = super::auth::token_of(request.headers(), request.method(), request.uri().path())
        .ok()
        .filter(|t| !t.is_empty());
    // Without the peer (a server that did not record it) every such caller
    // shares one budget, which still bounds the flood.
    let ip = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip())
        .unwrap_or(IpAddr::from([0, 0, 0, 0]));
    if console_file(request.uri().path()) {
        if let Err(wait) = budgets.console_files_per_address.spend(ip, Instant::now()) {
            metrics::counter!("lh_gateway_requests_limited_total", "caller" => "console-files")
                .increment(1);
            return ApiError::too_many_requests(
                "too many console files from this address; slow down",
            )
            .retry_after(wait.as_secs_f64().ceil().clamp(1.0, 3600.0) as u32)
            .into_response();
        }
        return next.run(request).await;
    }
    if let Err(wait) = budgets.refused_per_address.check(&ip, Instant::now()) {
        metrics::counter!("lh_gateway_requests_limited_total", "caller" => "refused-address")
            .increment(1);
        return ApiError::too_many_requests(
            "too many refused credentials from this address; slow down",
        )
        .retry_after(wait.as_secs_f64().ceil().clamp(1.0, 3600.0) as u32)
        .into_response();
    }
    let spent = match &bearer {
        Some(token) => {
            let digest = Sha256::digest(token.as_bytes());
            let mut key = [0u8; CALLER_KEY_BYTES];
            key.copy_from_slice(&digest[..CALLER_KEY_BYTES]);
            budgets
                .per_key
                .spend(BudgetKey::Credential(key), Instant::now())
        }
        None => budgets
            .per_address
            .spend(BudgetKey::Address(ip), Instant::now()),
    };
    if let Err(wait) = spent {
        metrics::counter!("lh_gateway_requests_limited_total",
            "caller" => if bearer.is_some() { "credential" } else { "address" })
        .increment(1);
        return ApiError::too_many_requests(if bearer.is_some() {
            "this credential has sent too many requests; slow down"
        } else {
            "too many requests without a credential from this address; slow down"
        })
        .retry_after(wait.as_secs_f64().ceil().clamp(1.0, 3600.0) as u32)
        .into_response();
    }
    let with_credential = bearer.is_some();
    let timeout = if request.uri().path() == WHAT_IF_PATH {
        budgets.timeout.max(WHAT_IF_REQUEST_TIMEOUT)
    } else {
        budgets.timeout
    };
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => {
            if with_credential && response.status() == axum::http::StatusCode::UNAUTHORIZED {
                let _ = budgets.refused_per_address.spend(ip, Instant::now());
            }
            response
        }
        Err(_) => {
            metrics::counter!("lh_gateway_requests_timed_out_total").increment(1);
            ApiError::unavailable(format!(
                "the request took longer than {} s; it may still complete: retry with the same \
                 Idempotency-Key",
                timeout.as_secs()
            ))
            .retry_after(1)
            .into_response()
        }
    }
}
