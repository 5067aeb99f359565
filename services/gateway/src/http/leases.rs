//! Leases: request, read, list, stop.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use lh_bus::{BusError, Expect};
use lh_domain::lease::{self, Invalid, InvalidKind};
use lh_events::{derived_id, subject, Actor, Envelope, EventData};
use lh_rpc::http::leases::{CreateLease, LeasePage, LeaseView};
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use crate::read_model::lease::{requested_lease, Lease, VIEW_COLUMNS};
use crate::read_model::lease_views::{page_json, CachedLease, MAX_LISTED_LEASES_PER_INDEX};

use super::{read_your_write, ApiContext, ApiError, ApiJson, Caller};

pub use lh_domain::lease::{MAX_IDEMPOTENCY_KEY_LEN, MAX_PRIORITY, MAX_WORKLOAD_ITEMS};

/// What a tenant at its limit of waiting leases is told to wait, in seconds.
pub const PENDING_RETRY_AFTER_SECS: u32 = 10;
pub const DEFAULT_PAGE: u32 = 50;
pub const MAX_PAGE: u32 = 500;
// A first page is answered from the rows that fill the list's index.
const _: () = assert!(MAX_LISTED_LEASES_PER_INDEX > MAX_PAGE as usize);

/// The problem a refused request answers with.
fn invalid(e: Invalid) -> ApiError {
    match e.kind {
        InvalidKind::Malformed => ApiError::bad_request(e.detail).field(e.field),
        InvalidKind::Unacceptable => ApiError::unprocessable(e.detail, &e.field),
        InvalidKind::OverLimit => ApiError::too_many_requests(e.detail)
            .field(e.field)
            .retry_after(PENDING_RETRY_AFTER_SECS),
    }
}

async fn fetch(ctx: &ApiContext, id: Uuid) -> Result<Option<Lease>, ApiError> {
    Ok(
        sqlx::query_as(&format!("SELECT {VIEW_COLUMNS} FROM leases WHERE id = $1"))
            .bind(id)
            .fetch_optional(&ctx.pool)
            .await?,
    )
}

/// The lease from memory, or read from the read model and kept. When the
/// read model has none, it waits until it has applied what the log holds on
/// the lease's subject (one lookup on the log), so that a lease whose
/// request was answered is seen by any read that follows the answer.
pub(crate) async fn lookup_lease(
    ctx: &ApiContext,
    id: Uuid,
) -> Result<Option<Arc<CachedLease>>, ApiError> {
    if let Some(lease) = ctx.lease_views.get(&id) {
        return Ok(Some(lease));
    }
    let mut generation = ctx.lease_views.generation();
    let row = match fetch(ctx, id).await? {
        Some(row) => row,
        None => {
            let last = ctx.bus.subject_last_sequence(&subject::lease(id)).await?;
            if last == 0 {
                return Ok(None);
            }
            // Read again even when the projection is there already: it may
            // have got there since the first read.
            read_your_write(ctx, last).await?;
            if let Some(lease) = ctx.lease_views.get(&id) {
                return Ok(Some(lease));
            }
            generation = ctx.lease_views.generation();
            match fetch(ctx, id).await? {
                Some(row) => row,
                None => return Ok(None),
            }
        }
    };
    // Answered as read even when not kept (it raced a batch): it is at
    // least as new as anything this caller waited for.
    let lease = CachedLease::new(row);
    ctx.lease_views.insert(generation, [lease.clone()]);
    Ok(Some(lease))
}

/// The lease if the caller may see it; 404 for another tenant's lease, so
/// that ids do not leak.
async fn lookup_visible_lease(
    ctx: &ApiContext,
    caller: &Caller,
    id: Uuid,
) -> Result<Arc<CachedLease>, ApiError> {
    let lease = lookup_lease(ctx, id).await?;
    match (lease, caller) {
        (Some(l), Caller::Tenant { id: tenant, .. }) if l.lease.view.tenant_id == *tenant => Ok(l),
        (Some(l), Caller::Operator(_)) => Ok(l),
        _ => Err(ApiError::not_found(format!("no lease {id}")).field("id")),
    }
}

/// [`lookup_visible_lease`], as a lease of its own.
pub(crate) async fn visible(
    ctx: &ApiContext,
    caller: &Caller,
    id: Uuid,
) -> Result<Lease, ApiError> {
    Ok(lookup_visible_lease(ctx, caller, id).await?.lease.clone())
}

/// `tenant`'s lease `id`, if it is that tenant's.
pub(crate) async fn tenants_lease(ctx: &ApiContext, tenant: Uuid, id: Uuid) -> Option<Lease> {
    let lease = lookup_lease(ctx, id).await.ok()??;
    (lease.lease.view.tenant_id == tenant).then(|| lease.lease.clone())
}

/// The member of `lease` a caller names with `?node=` (a lease across
/// nodes has a part on each); `None` when it names none. 422 naming
/// `node` for a node that is no member.
pub(crate) fn named_member(lease: &Lease, node: Option<&str>) -> Result<Option<String>, ApiError> {
    let Some(node) = node else {
        return Ok(None);
    };
    let members: Vec<&str> = lease
        .view
        .members
        .iter()
        .map(|m| m.node_id.as_str())
        .collect();
    // A lease on one node names it as its only member.
    if members.contains(&node)
        || (members.is_empty() && lease.view.node_id.as_deref() == Some(node))
    {
        return Ok(Some(node.to_string()));
    }
    Err(ApiError::unprocessable(
        format!(
            "lease {} runs on no node {node:?} now; its members: {}",
            lease.view.id,
            match members.is_empty() {
                true => "none (it is on one node)".to_string(),
                false => members.join(", "),
            }
        ),
        "node",
    ))
}

pub(super) fn parse_id(raw: &str) -> Result<Uuid, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::not_found(format!("no lease {raw}")).field("id"))
}

#[utoipa::path(
    post, path = "/v1/leases", request_body = CreateLease,
    params(("Idempotency-Key" = Option<String>, Header, description = "Same key from the same tenant yields the same lease")),
    responses(
        (status = 202, body = LeaseView),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 402, body = super::Problem, description = "The tenant's prepaid balance is exhausted; a top-up lifts it"),
        (status = 409, body = super::Problem), (status = 422, body = super::Problem),
        (status = 429, body = super::Problem, description = "Over the tenant's write budget or its limit of waiting leases; see Retry-After"),
        (status = 503, body = super::Problem, description = "The database or the log is out of reach; see Retry-After")
    )
)]
pub async fn create(
    State(ctx): State<ApiContext>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(mut body): ApiJson<CreateLease>,
) -> Result<(StatusCode, Json<LeaseView>), ApiError> {
    let (tenant_id, max_gpus) = caller.tenant()?;
    let admitted = ctx
        .lease_admission
        .check(
            &ctx.pool,
            tenant_id,
            ctx.limits.max_pending_leases,
            !ctx.progress.stalled(),
        )
        .await?;
    if admitted.exhausted {
        return Err(exhausted());
    }
    let tenant = lease::Tenant {
        id: tenant_id,
        max_gpus,
        pending_leases: admitted.pending_leases,
        max_pending_leases: ctx.limits.max_pending_leases,
    };
    let key = headers.get("idempotency-key").map(|v| v.as_bytes());
    let quote_id = body.quote_id;
    let template = body.template.take();
    let mut asked = lease::LeaseBody::from(body);
    if let Some(name) = &template {
        super::templates::fill_workload(&ctx.templates, name, &mut asked.workload)?;
    }
    let mut requested = lease::request(tenant, asked, key, Uuid::now_v7()).map_err(invalid)?;
    if let Some(quote_id) = quote_id {
        super::quotes::check_quote(&ctx, quote_id, &requested, Utc::now()).await?;
        requested.quote_id = Some(quote_id);
    }
    let lease_id = requested.lease_id;
    if let Some(workload) = requested.workload.as_mut() {
        super::datasets::resolve_mounts(&ctx, tenant_id, lease_id, workload).await?;
    }
    // From here a refusal lets go of the workspaces just claimed.
    let claimed = requested
        .workload
        .as_ref()
        .is_some_and(|w| !w.workspaces.is_empty());
    let unclaim = || async {
        if claimed {
            super::datasets::release_workspace_claims(&ctx, tenant_id, lease_id).await;
        }
    };
    let env = match requested.workload.as_mut() {
        Some(workload) => {
            let taken = crate::workload_env::take_values(
                &ctx.pool,
                ctx.keys.as_ref(),
                tenant_id,
                lease_id,
                workload,
            )
            .await;
            match taken {
                Ok(env) => env,
                Err(e) => {
                    unclaim().await;
                    return Err(e.into());
                }
            }
        }
        None => None,
    };
    let envelope = Envelope::new(
        Actor::Tenant(tenant_id),
        Utc::now(),
        EventData::LeaseRequested(requested.clone()),
    )
    .with_id(derived_id(&["lease.requested", &lease_id.to_string()]));
    // A new lease answers with the row the projection will make of its
    // request, without waiting for it: the request is durable once
    // appended, and a GET that finds no row yet waits for the projection
    // (see `lookup_lease`). A lease already on the log (the same key
    // again, whether the server caught it as a conflict or as a duplicate
    // message) answers as the read model holds it.
    let appended = match ctx
        .bus
        .publish(&envelope, Expect::LastSubjectSequence(0))
        .await
    {
        Ok(appended) if !appended.duplicate => Some(appended.sequence),
        Ok(_) | Err(BusError::Conflict(_)) => None,
        Err(e) => {
            // Maybe appended after all (an answer lost): then the lease
            // shows in the read model, which holds the workspace for it.
            unclaim().await;
            return Err(e.into());
        }
    };
    let lease = match appended {
        Some(sequence) => {
            ctx.lease_admission
                .appended(tenant_id, sequence, ctx.progress.applied());
            requested_lease(&requested, sequence, envelope.occurred_at).view
        }
        None => {
            let lease = lookup_lease(&ctx, lease_id)
                .await?
                .map(|l| l.lease.clone())
                .ok_or_else(|| {
                    ApiError::internal(format!("lease {lease_id} missing from read model"))
                })?;
            if !lease.asks_for(&requested) {
                return Err(ApiError::conflict(
                    "this Idempotency-Key was used for a different request",
                )
                .field("Idempotency-Key"));
            }
            lease.view
        }
    };
    // Stored once the request is on the log and is this one: a crash
    // before this line leaves a lease its node cannot start (it waits for
    // the values, then fails the lease), and a retry stores them.
    if let Some(env) = env {
        crate::workload_env::store(&ctx.pool, tenant_id, env).await?;
    }
    metrics::counter!("lh_gateway_leases_requested_total").increment(1);
    Ok((StatusCode::ACCEPTED, Json(lease)))
}

#[utoipa::path(
    get, path = "/v1/leases/{id}", params(("id" = Uuid, Path)),
    responses((status = 200, body = LeaseView), (status = 401, body = super::Problem), (status = 404, body = super::Problem))
)]
pub async fn get(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let lease = lookup_visible_lease(&ctx, &caller, parse_id(&id)?).await?;
    match (&ctx.ssh, lease.lease.view.state) {
        (Some(ssh), lease::LeaseState::Running) if lease.lease.view.workload.is_some() => {
            // How to reach it over SSH, beside the stored view.
            let mut view: serde_json::Value =
                serde_json::from_slice(&lease.json).map_err(ApiError::internal)?;
            let access = lh_rpc::http::sessions::SshAccess {
                command: format!("ssh -p {} {}@{}", ssh.port, lease.lease.view.id, ssh.host),
                host_key_fingerprint: ssh.host_key_fingerprint.clone(),
            };
            view["ssh"] = serde_json::to_value(access).map_err(ApiError::internal)?;
            Ok(Json(view).into_response())
        }
        _ => Ok(json_response(lease.json.clone())),
    }
}

/// A 200 with a body already serialised, as `Json` would answer it.
fn json_response(body: Bytes) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/leases", params(ListQuery),
    responses((status = 200, body = LeasePage), (status = 401, body = super::Problem), (status = 422, body = super::Problem))
)]
pub async fn list(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::unprocessable(
            format!("limit must be 1 to {MAX_PAGE}"),
            "limit",
        ));
    }
    // Newest first; the cursor is the request sequence of the last item seen.
    let before: i64 = match &query.cursor {
        None => i64::MAX,
        Some(c) => c
            .parse()
            .map_err(|_| ApiError::unprocessable("cursor is not one this API issued", "cursor"))?,
    };
    let tenant = match &caller {
        Caller::Tenant { id, .. } => Some(*id),
        _ => None,
    };
    // A request answered before the projection applied it is listed once it
    // has: a tenant's list shows its own writes, as a GET of one does, and
    // an operator's list every write this gateway answered.
    let appended = match tenant {
        Some(t) => ctx.lease_admission.newest_appended(t),
        None => ctx.lease_admission.newest_appended_by_any(),
    };
    if let Some(appended) = appended {
        read_your_write(&ctx, appended).await?;
    }
    let limit = limit as usize;
    let page = match ctx.lease_views.page(tenant, before, limit) {
        Some(page) => page,
        None => {
            let generation = ctx.lease_views.generation();
            let items: Vec<_> = newest_leases(&ctx.pool, tenant, before, limit + 1)
                .await?
                .into_iter()
                .map(CachedLease::new)
                .collect();
            ctx.lease_views.insert(generation, items.iter().cloned());
            // A first page that missed fills the list's index apart, once
            // however many miss meanwhile: the answer waits for its own
            // rows only, and under writes (where a fill that raced a batch
            // is not kept) misses cost a page's rows, not an index's.
            if query.cursor.is_none() {
                let (views, pool) = (ctx.lease_views.clone(), ctx.pool.clone());
                tokio::spawn(async move {
                    let Some(_fill) = views.begin_fill(tenant) else {
                        return;
                    };
                    let generation = views.generation();
                    match newest_leases(&pool, tenant, i64::MAX, MAX_LISTED_LEASES_PER_INDEX).await
                    {
                        Ok(rows) => views.fill_index(
                            generation,
                            tenant,
                            rows.into_iter().map(CachedLease::new).collect(),
                        ),
                        Err(e) => tracing::debug!(error = %e, "cannot fill a lease list's index"),
                    }
                });
            }
            items
        }
    };
    let (items, next_cursor) = match page.get(limit) {
        Some(_) => (
            &page[..limit],
            page[limit - 1].lease.requested_sequence.into(),
        ),
        None => (&page[..], None),
    };
    Ok(json_response(page_json(items, next_cursor).into()))
}

/// A tenant's (every tenant's with `None`) leases requested before
/// `before`, newest first, at most `rows`.
async fn newest_leases(
    pool: &sqlx::PgPool,
    tenant: Option<Uuid>,
    before: i64,
    rows: usize,
) -> Result<Vec<Lease>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {VIEW_COLUMNS} FROM leases
         WHERE ($1::uuid IS NULL OR tenant_id = $1) AND requested_sequence < $2
         ORDER BY requested_sequence DESC LIMIT $3"
    ))
    .bind(tenant)
    .bind(before)
    .bind(rows as i64)
    .fetch_all(pool)
    .await
}

#[utoipa::path(
    post, path = "/v1/leases/{id}/stop", params(("id" = Uuid, Path)),
    responses(
        (status = 202, body = LeaseView), (status = 401, body = super::Problem),
        (status = 404, body = super::Problem), (status = 409, body = super::Problem)
    )
)]
pub async fn stop(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<LeaseView>), ApiError> {
    caller.require_writer()?;
    let lease = visible(&ctx, &caller, parse_id(&id)?).await?;
    let (event, id) = lease::stop(lease.now()).map_err(|refused| ApiError::conflict(refused.0))?;
    append_stop_or_resume(
        &ctx,
        &caller,
        &lease,
        EventData::LeaseStopRequested(event),
        id,
    )
    .await
}

/// Appends a caller's request about `lease` and answers with the lease as
/// the read model shows it afterwards.
async fn append_stop_or_resume(
    ctx: &ApiContext,
    caller: &Caller,
    lease: &Lease,
    data: EventData,
    event_id: Uuid,
) -> Result<(StatusCode, Json<LeaseView>), ApiError> {
    let mut envelope = Envelope::new(caller.actor(), Utc::now(), data).with_id(event_id);
    envelope.tenant_id = Some(lease.view.tenant_id);
    let appended = ctx.bus.publish(&envelope, Expect::Any).await?;
    read_your_write(ctx, appended.sequence).await?;
    let lease = visible(ctx, caller, lease.view.id).await?;
    Ok((StatusCode::ACCEPTED, Json(lease.view)))
}

/// Asks every lease of `tenant_id` that has not ended to stop; how many
/// were asked and the sequence of the last request (0 when none).
pub(super) async fn stop_all_of(
    ctx: &ApiContext,
    caller: &Caller,
    tenant_id: Uuid,
) -> Result<(u32, u64), ApiError> {
    let leases: Vec<Lease> = sqlx::query_as(&format!(
        "SELECT {VIEW_COLUMNS} FROM leases
         WHERE tenant_id = $1 AND state NOT IN ('ended', 'rejected') AND NOT stop_requested"
    ))
    .bind(tenant_id)
    .fetch_all(&ctx.pool)
    .await?;
    let (mut asked, mut last) = (0u32, 0u64);
    for lease in &leases {
        let Ok((event, id)) = lease::stop(lease.now()) else {
            continue;
        };
        let mut envelope = Envelope::new(
            caller.actor(),
            Utc::now(),
            EventData::LeaseStopRequested(event),
        )
        .with_id(id);
        envelope.tenant_id = Some(tenant_id);
        last = ctx.bus.publish(&envelope, Expect::Any).await?.sequence;
        asked += 1;
    }
    Ok((asked, last))
}

#[utoipa::path(
    post, path = "/v1/leases/{id}/resume", params(("id" = Uuid, Path)),
    responses(
        (status = 202, body = LeaseView), (status = 401, body = super::Problem),
        (status = 402, body = super::Problem, description = "The tenant's prepaid balance is exhausted; a top-up lifts it"),
        (status = 404, body = super::Problem), (status = 409, body = super::Problem)
    )
)]
pub async fn resume(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<LeaseView>), ApiError> {
    caller.require_writer()?;
    let lease = visible(&ctx, &caller, parse_id(&id)?).await?;
    let (event, id) =
        lease::resume(lease.now()).map_err(|refused| ApiError::conflict(refused.0))?;
    refuse_if_exhausted(&ctx, lease.view.tenant_id).await?;
    append_stop_or_resume(
        &ctx,
        &caller,
        &lease,
        EventData::LeaseResumeRequested(event),
        id,
    )
    .await
}

/// 402 while the tenant's prepaid balance is exhausted: pricing stopped its
/// leases and would stop any that started again.
async fn refuse_if_exhausted(ctx: &ApiContext, tenant_id: Uuid) -> Result<(), ApiError> {
    // No limit on waiting leases: only the exhaustion is asked.
    let admitted = ctx
        .lease_admission
        .check(&ctx.pool, tenant_id, u32::MAX, !ctx.progress.stalled())
        .await?;
    if admitted.exhausted {
        return Err(exhausted());
    }
    Ok(())
}

fn exhausted() -> ApiError {
    ApiError::payment_required(
        "the tenant's prepaid balance is exhausted: its leases were stopped and new ones \
         are refused until a top-up brings it above zero",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(kind: InvalidKind) -> ApiError {
        invalid(Invalid {
            kind,
            field: "gpus".into(),
            detail: "why".into(),
        })
    }

    #[test]
    fn an_unreadable_request_is_a_400_and_a_broken_rule_a_422_both_naming_the_field() {
        let malformed = problem(InvalidKind::Malformed);
        assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
        assert_eq!(malformed.slug, "bad-request");
        let unacceptable = problem(InvalidKind::Unacceptable);
        assert_eq!(unacceptable.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(unacceptable.slug, "invalid-field");
        let over = problem(InvalidKind::OverLimit);
        assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(over.retry_after_secs, Some(PENDING_RETRY_AFTER_SECS));
        for e in [malformed, unacceptable] {
            assert_eq!(
                (e.field.as_deref(), e.detail.as_str()),
                (Some("gpus"), "why")
            );
        }
    }
}
