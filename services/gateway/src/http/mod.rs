//! The REST API: the router and the context every handler shares; one
//! module per resource, one error type rendered as `application/problem+json`
//! (`error.rs`), one authentication extractor (`auth.rs`) and the OpenAPI
//! document (`openapi.rs`).

pub mod audit;
mod auth;
pub mod balances;
pub mod billing;
pub mod console;
pub mod console_sign_in;
pub mod datasets;
pub(crate) mod error;
pub mod events;
pub mod fleet;
pub mod front;
pub mod invoices;
pub mod keys;
pub mod lease_logs;
pub mod lease_sessions;
pub mod lease_web;
pub mod leases;
pub mod limits;
pub mod nodes;
mod openapi;
pub mod price_books;
pub mod quotes;
pub mod refusals;
pub mod reservations;
pub mod spot;
pub mod ssh_keys;
pub mod templates;
pub mod tenants;
pub mod usage;
pub mod whoami;
pub mod workspaces;

use std::time::Duration;

use axum::routing::{delete, get, post, put};
use axum::Router;
use lh_bus::Bus;
use lh_projection::Progress;
use sqlx::PgPool;

pub use auth::{sha256_hex, Caller};
pub use error::{ApiError, ApiJson, Problem, MAX_BODY_BYTES};
pub use openapi::ApiDoc;

/// How long a write waits for its own event to show in the read model.
pub const READ_YOUR_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a call to another service may take.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// What every handler shares, behind one reference count: the extractors
/// clone the context for every request, and a NATS client, a pool and the
/// channel senders inside it each cost a count of their own to clone and
/// to drop.
#[derive(Clone)]
pub struct ApiContext(std::sync::Arc<ApiShared>);

impl ApiContext {
    pub fn new(shared: ApiShared) -> Self {
        ApiContext(std::sync::Arc::new(shared))
    }
}

impl std::ops::Deref for ApiContext {
    type Target = ApiShared;

    fn deref(&self) -> &ApiShared {
        &self.0
    }
}

pub struct ApiShared {
    pub bus: Bus,
    pub pool: PgPool,
    pub progress: Progress,
    pub principals: std::sync::Arc<crate::principals::Principals>,
    /// Tenants' keys as the read model showed them (see [`crate::tenant_keys`]).
    pub tenant_keys: std::sync::Arc<crate::tenant_keys::TenantKeys>,
    /// Tenants' balance exhaustion and waiting leases (see
    /// [`crate::lease_admission`]).
    pub lease_admission: std::sync::Arc<crate::lease_admission::LeaseAdmission>,
    /// Leases as the read model showed them (see [`crate::lease_views`]).
    pub lease_views: std::sync::Arc<crate::lease_views::LeaseViews>,
    pub limits: limits::TenantLimits,
    pub write_budgets: std::sync::Arc<limits::WriteBudgets>,
    /// Wraps tenants' data keys.
    pub keys: std::sync::Arc<dyn crate::keyring::KeyProvider>,
    /// Request budgets and the request timeout.
    pub request_budgets: std::sync::Arc<front::RequestBudgets>,
    /// Refused requests of the current interval, summed for the trail.
    pub refusals: std::sync::Arc<refusals::RefusalCounter>,
    /// The sessions into leases this replica relays.
    pub sessions: std::sync::Arc<crate::sessions::Sessions>,
    /// The SSH endpoint, when this replica runs one.
    pub ssh: Option<crate::sessions::SshEndpoint>,
    /// The workload templates leases may name.
    pub templates: std::sync::Arc<crate::templates::Templates>,
    /// Tenants' object storage; `None` where the platform keeps no data.
    pub storage: Option<std::sync::Arc<crate::storage::TenantStorage>>,
    /// Lease and node changes, for the event streams.
    pub changes: crate::changes::Changes,
    /// The event streams this replica may still open.
    pub streams: std::sync::Arc<tokio::sync::Semaphore>,
    /// The console's client at the OIDC issuer, where operators sign in
    /// there.
    pub console_sign_in: Option<std::sync::Arc<console_sign_in::ConsoleSignIn>>,
    /// Leases' web pages, where this replica serves them.
    pub lease_web: Option<std::sync::Arc<crate::lease_web::LeaseWeb>>,
}

pub fn router(ctx: ApiContext) -> Router {
    let budgets = ctx.request_budgets.clone();
    let refused = ctx.refusals.clone();
    Router::new()
        .route("/v1/whoami", get(whoami::whoami))
        .route("/v1/oidc/console", get(console_sign_in::console))
        .route("/v1/oidc/token", post(console_sign_in::token))
        .route("/v1/tenants", post(tenants::create).get(tenants::list))
        .route("/v1/tenants/{id}", get(tenants::get))
        .route("/v1/tenants/{id}/suspend", post(tenants::suspend))
        .route("/v1/tenants/{id}/resume", post(tenants::resume))
        .route("/v1/tenants/{id}/quota", put(tenants::set_quota))
        .route("/v1/tenants/{id}/erase", post(tenants::erase))
        .route("/v1/tenants/{id}/keys", post(keys::issue).get(keys::list))
        .route("/v1/tenants/{id}/balance", get(balances::get))
        .route("/v1/tenants/{id}/balance/top-ups", post(balances::top_up))
        .route("/v1/tenants/{id}/keys/{key_id}", delete(keys::revoke))
        .route("/v1/ssh-keys", post(ssh_keys::add).get(ssh_keys::list))
        .route("/v1/ssh-keys/{id}", delete(ssh_keys::remove))
        .route("/v1/storage", get(datasets::usage))
        .route("/v1/storage/credentials", get(datasets::credentials))
        .route("/v1/datasets", post(datasets::add).get(datasets::list))
        .route(
            "/v1/datasets/{name}",
            get(datasets::get).delete(datasets::remove),
        )
        .route(
            "/v1/datasets/{name}/versions/{version}/manifest",
            get(datasets::manifest),
        )
        .route("/v1/workspaces", get(workspaces::list))
        .route("/v1/workspaces/{name}", delete(workspaces::remove))
        .route(
            "/v1/workspaces/{name}/snapshots",
            post(workspaces::snapshot),
        )
        .route("/v1/workspaces/{name}/restore", post(workspaces::restore))
        .route("/v1/quotes", post(quotes::create))
        .route("/v1/leases", post(leases::create).get(leases::list))
        .route("/v1/leases/{id}", get(leases::get))
        .route("/v1/leases/{id}/stop", post(leases::stop))
        .route("/v1/leases/{id}/resume", post(leases::resume))
        .route("/v1/leases/{id}/usage", get(usage::lease))
        .route("/v1/usage", get(usage::fleet))
        .route("/v1/leases/{id}/logs", get(lease_logs::get))
        .route("/v1/leases/{id}/exec", get(lease_sessions::exec))
        .route("/v1/leases/{id}/web", post(lease_web::ticket))
        .route(
            "/v1/leases/{id}/port-forward",
            get(lease_sessions::port_forward),
        )
        .route("/v1/nodes", get(fleet::list))
        .route("/v1/nodes/{id}", get(fleet::get))
        .route("/v1/gpus", get(fleet::catalogue))
        .route("/v1/events/stream", get(events::stream))
        .route("/v1/nodes/{id}/enroll", post(nodes::enroll))
        .route("/v1/nodes/{id}/drain", post(nodes::drain))
        .route("/v1/nodes/{id}/uncordon", post(nodes::uncordon))
        .route("/v1/spot/prices", get(spot::prices))
        .route("/v1/templates", get(templates::list))
        .route("/v1/invoices", get(invoices::list))
        .route("/v1/invoices/{id}", get(invoices::show))
        .route("/v1/invoices/{id}/csv", get(invoices::csv))
        .route("/v1/charges", get(invoices::charges))
        .route("/v1/reports/cost", get(invoices::cost_report))
        .route(
            "/v1/price-books",
            post(price_books::publish).get(price_books::list),
        )
        .route(
            "/v1/reservations",
            post(reservations::commit).get(reservations::list),
        )
        .route("/v1/billing/what-if", post(billing::what_if))
        .route("/v1/audit/verify", get(audit::verify))
        .route("/v1/audit/events", get(audit::events))
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/console", get(console::bare))
        .route("/console/", get(console::index))
        .route("/console/{*path}", get(console::file))
        .fallback(|| async { ApiError::not_found("no such route") })
        .with_state(ctx)
        .layer(axum::middleware::from_fn_with_state(budgets, front::guard))
        .layer(axum::middleware::from_fn_with_state(
            refused,
            refusals::count,
        ))
}

/// The tenant a call is about: a tenant's own (another's is not found, so
/// that its existence is not told); the one an operator names.
pub(super) fn whose(caller: &Caller, asked: Option<uuid::Uuid>) -> Result<uuid::Uuid, ApiError> {
    match (caller, asked) {
        (Caller::Tenant { id, .. }, None) => Ok(*id),
        (Caller::Tenant { id, .. }, Some(asked)) if asked == *id => Ok(*id),
        (Caller::Tenant { .. }, Some(asked)) => {
            Err(ApiError::not_found(format!("no tenant {asked}")).field("tenant_id"))
        }
        (Caller::Operator(_), Some(asked)) => Ok(asked),
        (Caller::Operator(_), None) => Err(ApiError::unprocessable(
            "tenant_id is required of an operator",
            "tenant_id",
        )),
    }
}

/// A query that could not be read is a 400 saying why.
pub(super) fn query_of<Q>(
    query: Result<axum::extract::Query<Q>, axum::extract::rejection::QueryRejection>,
) -> Result<Q, ApiError> {
    let axum::extract::Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    Ok(query)
}

/// Appends `data` as `caller` to an aggregate whose subject still ends at
/// `last`, and waits for the read model; `conflict` is the 409's detail
/// when another write came first.
pub(super) async fn append_guarded(
    ctx: &ApiContext,
    caller: &Caller,
    last: u64,
    data: lh_events::EventData,
    conflict: &str,
) -> Result<(), ApiError> {
    let envelope = lh_events::Envelope::new(caller.actor(), chrono::Utc::now(), data);
    let appended = match ctx
        .bus
        .publish(&envelope, lh_bus::Expect::LastSubjectSequence(last))
        .await
    {
        Ok(a) => a,
        Err(lh_bus::BusError::Conflict(_)) => return Err(ApiError::conflict(conflict)),
        Err(e) => return Err(e.into()),
    };
    read_your_write(ctx, appended.sequence).await
}

/// Waits until the read model shows the event at `sequence`.
pub async fn read_your_write(ctx: &ApiContext, sequence: u64) -> Result<(), ApiError> {
    if ctx
        .progress
        .wait_for(sequence, READ_YOUR_WRITE_TIMEOUT)
        .await
    {
        Ok(())
    } else {
        Err(ApiError::unavailable(
            "the event was stored but the read model is behind; retry the GET shortly",
        )
        .retry_after(1))
    }
}
