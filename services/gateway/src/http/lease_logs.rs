//! A lease's workload log: what its workload wrote to stdout and stderr.
//! Only the node the lease runs on holds it, so the gateway asks that node
//! over the bus (ADR 003: reads across services are request/reply). A lease
//! that failed over has a log for each placement, on each node it ran on;
//! this reads its last placement's, named by the placement's sequence: the
//! one it is on now, or, back in the queue, the one it last ran on. A
//! lease across nodes has a log on each member: `node` picks which.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::Json;
use chrono::Utc;
use lh_domain::lease::LeaseState;
use lh_events::{AuditAccessed, Envelope, EventData, Expect, OperatorRole};
use lh_rpc::http::lease_logs::LeaseLogsView;
use lh_rpc::lease_logs::{LeaseLogsReply, LeaseLogsRequest, MAX_LEASE_LOG_READ_BYTES};
use serde::Deserialize;
use utoipa::IntoParams;

use super::leases::{parse_id, visible};
use super::{ApiContext, ApiError, Caller};

/// How long the node the lease is on may take to answer.
pub const LEASE_LOGS_NODE_TIMEOUT: Duration = Duration::from_secs(5);
/// The route an admin's read of a lease's log is recorded under.
const LEASE_LOGS_ROUTE: &str = "/v1/leases/{id}/logs";

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct LeaseLogsQuery {
    /// Read from this offset (bytes since the workload started; default 0,
    /// the start of what is kept). Pass the previous answer's
    /// `next_offset` to follow.
    pub offset: Option<u64>,
    /// Read the last this many bytes instead of from `offset`.
    pub tail: Option<u64>,
    /// At most this many bytes, 1 to 262144 (default 65536).
    pub max_bytes: Option<u64>,
    /// For a lease across nodes: the member whose log to read (default
    /// the first); each runs its part and keeps its own log.
    pub node: Option<String>,
}

/// Nothing to read, and why.
fn nothing_to_read(node_id: Option<String>, finished: bool, detail: String) -> LeaseLogsView {
    LeaseLogsView {
        data: String::new(),
        next_offset: 0,
        dropped_before: 0,
        size: 0,
        finished,
        node_id,
        placement: None,
        detail: Some(detail),
        members: Vec::new(),
    }
}

#[utoipa::path(
    get, path = "/v1/leases/{id}/logs",
    params(("id" = String, Path, description = "lease id"), LeaseLogsQuery),
    responses(
        (status = 200, body = LeaseLogsView),
        (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "An auditor: workload output is the tenant's"),
        (status = 404, body = super::Problem, description = "No such lease, or its node keeps no log of it (past its keep time)"),
        (status = 422, body = super::Problem),
        (status = 503, body = super::Problem, description = "The lease's node did not answer within 5 s")
    )
)]
pub async fn get(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<LeaseLogsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<LeaseLogsView>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if query.max_bytes == Some(0) || query.max_bytes > Some(MAX_LEASE_LOG_READ_BYTES) {
        return Err(ApiError::unprocessable(
            format!("max_bytes must be 1 to {MAX_LEASE_LOG_READ_BYTES}"),
            "max_bytes",
        ));
    }
    if query.tail.is_some() && query.offset.is_some() {
        return Err(ApiError::unprocessable(
            "give either offset or tail, not both",
            "tail",
        ));
    }
    // A workload's output is its tenant's (tokens, data): the auditor
    // audits the platform and reads the trail, not what tenants print.
    if let Caller::Operator(operator) = &caller {
        if operator.role == OperatorRole::Auditor {
            return Err(ApiError::forbidden(
                "the auditor role reads the audit trail, not tenants' workload output",
            ));
        }
    }
    let lease = visible(&ctx, &caller, parse_id(&id)?).await?;
    let done = matches!(lease.view.state, LeaseState::Ended | LeaseState::Rejected);
    let waiting = matches!(lease.view.state, LeaseState::Requested | LeaseState::Queued);
    // Its last placement's node: where it is, or, back in the queue, where
    // it last ran. Every placement records both; a lease never placed has
    // neither.
    let members: Vec<String> = lease
        .view
        .members
        .iter()
        .map(|m| m.node_id.clone())
        .collect();
    let last_placement_node = super::leases::named_member(&lease, query.node.as_deref())?
        .or_else(|| lease.last_placement_node_id.clone());
    let last_placement = last_placement_node.zip(lease.last_placement_sequence);
    let Some((node_id, placement)) = last_placement else {
        // A follower waits for it to run; one that never will is done.
        return Ok(Json(nothing_to_read(
            None,
            done,
            format!(
                "lease {} is on no node ({}): its log starts when its workload runs",
                lease.view.id,
                lease.view.state.as_str()
            ),
        )));
    };
    let placement = Some(placement as u64);
    if lease.view.workload.is_none() {
        return Ok(Json(nothing_to_read(
            Some(node_id),
            done,
            format!(
                "lease {} runs no workload: nothing writes a log",
                lease.view.id
            ),
        )));
    }
    let request = LeaseLogsRequest {
        lease_id: lease.view.id,
        offset: query.offset.unwrap_or(0),
        tail: query.tail,
        max_bytes: query.max_bytes,
        placement,
    };
    if caller.is_operator() {
        // An admin reads a tenant's output only once the trail says so.
        let mut filter = std::collections::BTreeMap::new();
        filter.insert("lease_id".to_string(), lease.view.id.to_string());
        filter.insert("offset".to_string(), request.offset.to_string());
        if let Some(tail) = request.tail {
            filter.insert("tail".to_string(), tail.to_string());
        }
        let data = EventData::AuditAccessed(AuditAccessed {
            route: LEASE_LOGS_ROUTE.to_string(),
            filter,
            records: 1,
        });
        let envelope = Envelope::new(caller.actor(), Utc::now(), data);
        ctx.bus.publish(&envelope, Expect::Any).await?;
        metrics::counter!("lh_gateway_lease_log_reads_by_operators_total").increment(1);
    }
    let reply = lh_rpc::lease_logs::fetch(&ctx.bus, &node_id, &request, LEASE_LOGS_NODE_TIMEOUT)
        .await
        .map_err(|e| {
            ApiError::unavailable(format!(
                "node {node_id}, which holds the log of lease {}, did not answer: {e}",
                lease.view.id
            ))
        })?;
    let view = match reply {
        LeaseLogsReply::Logs(logs) => Ok(Json(LeaseLogsView {
            data: logs.data,
            next_offset: logs.next_offset,
            dropped_before: logs.dropped_before,
            size: logs.size,
            // Back in the queue, its last run's log is done but the lease
            // is not: a follower waits for the next placement's.
            finished: logs.finished && !waiting,
            node_id: Some(node_id),
            placement,
            detail: waiting.then(|| {
                format!(
                    "lease {} is back in the queue: this is the log of its last run",
                    lease.view.id
                )
            }),
            members: Vec::new(),
        })),
        // Back in the queue, its last run's log gone (past its keep time):
        // the next run writes a new one.
        LeaseLogsReply::NotFound { .. } if waiting => Ok(Json(LeaseLogsView {
            placement,
            ..nothing_to_read(
                Some(node_id),
                false,
                format!(
                    "lease {} is back in the queue and its last run's log is no longer \
                         kept; its next run writes a new one",
                    lease.view.id
                ),
            )
        })),
        // Placed, and its node has not started it yet: a follower waits.
        LeaseLogsReply::NotFound { .. }
            if matches!(
                lease.view.state,
                LeaseState::Requested | LeaseState::Queued | LeaseState::Placed
            ) =>
        {
            Ok(Json(LeaseLogsView {
                placement,
                ..nothing_to_read(
                    Some(node_id),
                    false,
                    format!(
                        "the workload of lease {} has not started yet",
                        lease.view.id
                    ),
                )
            }))
        }
        LeaseLogsReply::NotFound { why } => Err(ApiError::not_found(format!(
            "{why} (node {node_id}; a log is kept a while after its workload ends)"
        ))
        .field("id")),
    };
    view.map(|Json(view)| Json(LeaseLogsView { members, ..view }))
}
