//! The audit trail, answered by the audit service:
//!
//! - `GET /v1/audit/verify`: recompute its hash chain over the log;
//! - `GET /v1/audit/events`: its copy of the log, filtered by tenant,
//!   principal, event type and time, a page at a time in stream order.
//!
//! Operators (admin, auditor) may read every tenant's records; a tenant
//! reads only its own (the tenant filter is forced). Every operator's read
//! of the records is itself recorded, as `audit.accessed`.

use std::collections::BTreeMap;

use axum::extract::{Query, State};
use axum::Json;
use chrono::{DateTime, Utc};
use lh_events::{AuditAccessed, Envelope, EventData, Expect};
use lh_rpc::audit::{
    AuditRecord, EventsPage, EventsRequest, VerifyResponse, DEFAULT_AUDIT_PAGE_RECORDS,
};
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::{ApiContext, ApiError, Caller, RPC_TIMEOUT};

/// How long a full re-verification may take: it replays the whole log.
const FULL_VERIFY_RPC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct VerifyQuery {
    /// Re-verify everything from the genesis or the anchor instead of from
    /// the last verified checkpoint (admin only: it replays the whole log).
    pub full: Option<bool>,
}

#[utoipa::path(
    get, path = "/v1/audit/verify",
    params(VerifyQuery),
    responses(
        (status = 200, body = VerifyResponse),
        (status = 401, body = super::Problem), (status = 403, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn verify(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Query(query): Query<VerifyQuery>,
) -> Result<Json<VerifyResponse>, ApiError> {
    if !caller.is_operator() {
        return Err(ApiError::forbidden(
            "audit verification needs the admin or auditor token",
        ));
    }
    let full = query.full.unwrap_or(false);
    let answer = if full {
        caller.require_admin()?;
        lh_rpc::audit::call_with(
            &ctx.bus,
            &lh_rpc::audit::VerifyRequest { full },
            FULL_VERIFY_RPC_TIMEOUT,
        )
        .await?
    } else {
        lh_rpc::audit::call(&ctx.bus, RPC_TIMEOUT).await?
    };
    Ok(Json(answer))
}

/// Route of the records, as `audit.accessed` names it.
pub const EVENTS_ROUTE: &str = "/v1/audit/events";

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only this tenant's events; a tenant's key reads only its own.
    pub tenant_id: Option<Uuid>,
    /// Only events caused by this principal: `tenant:<id>`, `admin:<name>`,
    /// `auditor:<name>`, `service:<name>`, `node:<id>`.
    pub actor: Option<String>,
    /// Only events of this type, e.g. `lease.placed`.
    #[serde(rename = "type")]
    #[param(rename = "type")]
    pub event_type: Option<String>,
    /// Only events that occurred at or after this time (RFC 3339).
    pub from: Option<String>,
    /// Only events that occurred before this time (RFC 3339).
    pub to: Option<String>,
    /// Only events after this stream sequence: the previous page's `next`.
    pub after: Option<u64>,
    /// Records in the page, 1 to 1000; 100 by default.
    pub limit: Option<u32>,
}

fn time(text: Option<&str>, field: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
    text.map(|t| {
        DateTime::parse_from_rfc3339(t)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| {
                ApiError::unprocessable(
                    format!("{field} must be an RFC 3339 time, e.g. 2026-12-01T00:00:00Z"),
                    field,
                )
            })
    })
    .transpose()
}

/// The filter as an `audit.accessed` event records it: each parameter given.
fn asked(request: &EventsRequest) -> BTreeMap<String, String> {
    let mut filter = BTreeMap::new();
    let mut put = |name: &str, value: Option<String>| {
        if let Some(value) = value {
            filter.insert(name.to_string(), value);
        }
    };
    put("tenant_id", request.tenant_id.map(|t| t.to_string()));
    put("actor", request.actor.clone());
    put("type", request.event_type.clone());
    put("from", request.from.map(|t| t.to_rfc3339()));
    put("to", request.to.map(|t| t.to_rfc3339()));
    put("after", Some(request.after.to_string()));
    put("limit", Some(request.limit.to_string()));
    filter
}

#[utoipa::path(
    get, path = "/v1/audit/events",
    params(EventsQuery),
    responses(
        (status = 200, body = EventsPage),
        (status = 401, body = super::Problem), (status = 404, body = super::Problem),
        (status = 422, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn events(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EventsPage>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let tenant_id = match (&caller, query.tenant_id) {
        (Caller::Operator(_), asked) => asked,
        (Caller::Tenant { id, .. }, None) => Some(*id),
        (Caller::Tenant { id, .. }, Some(asked)) if asked == *id => Some(*id),
        // Another tenant's records are not found, so that its id does not leak.
        (Caller::Tenant { .. }, Some(_)) => {
            return Err(ApiError::not_found("no such tenant").field("tenant_id"))
        }
    };
    // Staff are named to operators only: a tenant may not look one up.
    if !caller.is_operator() && query.actor.as_deref().is_some_and(names_an_operator) {
        return Err(ApiError::unprocessable(
            "a tenant's records name operators by role only",
            "actor",
        ));
    }
    let request = EventsRequest {
        tenant_id,
        actor: query.actor,
        event_type: query.event_type,
        from: time(query.from.as_deref(), "from")?,
        to: time(query.to.as_deref(), "to")?,
        after: query.after.unwrap_or(0),
        limit: query.limit.unwrap_or(DEFAULT_AUDIT_PAGE_RECORDS),
    };
    if let Some((field, why)) = request.problem() {
        return Err(ApiError::unprocessable(why, field));
    }
    let mut page = lh_rpc::audit::call_events(&ctx.bus, &request, RPC_TIMEOUT).await?;
    if !caller.is_operator() {
        page.events = page.events.into_iter().map(as_a_tenant_sees).collect();
    }
    if caller.is_operator() {
        // The read is answered only once its trace is stored: an auditor
        // cannot read the trail without leaving one.
        let data = EventData::AuditAccessed(AuditAccessed {
            route: EVENTS_ROUTE.to_string(),
            filter: asked(&request),
            records: page.events.len() as u64,
        });
        let envelope = Envelope::new(caller.actor(), Utc::now(), data);
        ctx.bus.publish(&envelope, Expect::Any).await?;
        metrics::counter!("lh_gateway_audit_reads_total").increment(1);
    }
    Ok(Json(page))
}

/// Whether an actor filter names an operator (`admin:<name>`,
/// `auditor:<name>`).
fn names_an_operator(actor: &str) -> bool {
    actor
        .split_once(':')
        .is_some_and(|(role, _)| role == "admin" || role == "auditor")
}

/// A record as its tenant is shown it: an operator who acted on the tenant's
/// things by role, not by name. Staff names are the staff's personal data,
/// not the tenant's.
fn as_a_tenant_sees(mut record: AuditRecord) -> AuditRecord {
    if let Some(actor) = &record.actor {
        if names_an_operator(actor) {
            record.actor = actor.split_once(':').map(|(role, _)| role.to_string());
        }
    }
    if let Some(actor) = record.payload.get_mut("actor") {
        if actor.get("kind").and_then(|k| k.as_str()) == Some("operator") {
            if let Some(id) = actor.get_mut("id").and_then(|i| i.as_object_mut()) {
                id.remove("name");
            }
        }
    }
    record
}

#[cfg(test)]
mod tenant_view_tests {
    use super::*;

    #[test]
    fn a_tenant_sees_operators_by_role_and_others_as_they_are() {
        let record = |actor: &str, payload: serde_json::Value| AuditRecord {
            sequence: 1,
            occurred_at: None,
            actor: Some(actor.into()),
            event_type: Some("lease.stop_requested".into()),
            object: None,
            tenant_id: None,
            outcome: None,
            subject: "lh.evt.lease.x".into(),
            skip_reason: None,
            payload,
        };
        let by_alice = as_a_tenant_sees(record(
            "admin:alice",
            serde_json::json!({"actor": {"kind": "operator", "id": {"name": "alice", "role": "admin"}}}),
        ));
        assert_eq!(by_alice.actor.as_deref(), Some("admin"));
        assert_eq!(
            by_alice.payload,
            serde_json::json!({"actor": {"kind": "operator", "id": {"role": "admin"}}})
        );
        let own = serde_json::json!({"actor": {"kind": "tenant", "id": "t"}});
        let by_tenant = as_a_tenant_sees(record("tenant:t", own.clone()));
        assert_eq!(
            (by_tenant.actor.as_deref(), by_tenant.payload),
            (Some("tenant:t"), own)
        );
        assert!(names_an_operator("auditor:bob"));
        assert!(!names_an_operator("service:lh-scheduler"));
    }
}
