//! `POST /v1/nodes/{id}/drain` and `/uncordon`: the operator takes a node out
//! of placement (its leases finishing where they are, or moved) and back in.
//! The scheduler acts on the events; the gateway only records the request.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use lh_bus::{BusError, Expect};
use lh_events::{derived_id, subject, Envelope, EventData, NodeCordoned, NodeUncordoned};
use lh_rpc::http::nodes::{DrainNode, NodeCordonView};

use super::{ApiContext, ApiError, ApiJson, Caller};

/// Tries before a node that keeps changing under the request gives up.
const ATTEMPTS: usize = 5;

#[utoipa::path(
    post, path = "/v1/nodes/{id}/drain", request_body = DrainNode, params(("id" = String, Path)),
    responses(
        (status = 202, body = NodeCordonView), (status = 400, body = super::Problem),
        (status = 401, body = super::Problem), (status = 403, body = super::Problem),
        (status = 404, body = super::Problem), (status = 422, body = super::Problem)
    )
)]
pub async fn drain(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(node_id): Path<String>,
    ApiJson(body): ApiJson<DrainNode>,
) -> Result<(StatusCode, Json<NodeCordonView>), ApiError> {
    caller.require_admin()?;
    let reason = body
        .reason
        .unwrap_or_else(|| "drained by the operator".into());
    if reason.chars().count() > 500 {
        return Err(ApiError::unprocessable(
            "reason must be at most 500 characters",
            "reason",
        ));
    }
    let data = EventData::NodeCordoned(NodeCordoned {
        node_id: node_id.clone(),
        drain: Some(body.mode),
        reason,
    });
    let sequence = record(&ctx, &caller, &node_id, "node.cordoned", data).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(NodeCordonView {
            node_id,
            cordoned: true,
            drain: Some(body.mode),
            sequence,
        }),
    ))
}

#[utoipa::path(
    post, path = "/v1/nodes/{id}/uncordon", params(("id" = String, Path)),
    responses(
        (status = 202, body = NodeCordonView), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 404, body = super::Problem)
    )
)]
pub async fn uncordon(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(node_id): Path<String>,
) -> Result<(StatusCode, Json<NodeCordonView>), ApiError> {
    caller.require_admin()?;
    let data = EventData::NodeUncordoned(NodeUncordoned {
        node_id: node_id.clone(),
    });
    let sequence = record(&ctx, &caller, &node_id, "node.uncordoned", data).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(NodeCordonView {
            node_id,
            cordoned: false,
            drain: None,
            sequence,
        }),
    ))
}

/// Appends `data` to a node that exists on the log. The id is derived from
/// the node subject's last sequence and the write expects that sequence, so
/// two racing requests append once and a later cordon after an uncordon is
/// a new event. A client that retries after a success appends the same
/// command again, which changes nothing.
async fn record(
    ctx: &ApiContext,
    caller: &Caller,
    node_id: &str,
    kind: &str,
    data: EventData,
) -> Result<u64, ApiError> {
    let node_subject = subject::node(node_id);
    for _ in 0..ATTEMPTS {
        let last = ctx.bus.subject_last_sequence(&node_subject).await?;
        if last == 0 {
            return Err(ApiError::not_found(format!("no node {node_id} on the log")).field("id"));
        }
        let envelope = Envelope::new(caller.actor(), Utc::now(), data.clone())
            .with_id(derived_id(&[kind, node_id, &last.to_string()]));
        match ctx
            .bus
            .publish(&envelope, Expect::LastSubjectSequence(last))
            .await
        {
            Ok(appended) => {
                metrics::counter!("lh_gateway_node_commands_total", "type" => kind.to_string())
                    .increment(1);
                return Ok(appended.sequence);
            }
            // The scheduler or the agent wrote to the node meanwhile.
            Err(BusError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::conflict(format!(
        "node {node_id} kept changing; retry"
    )))
}
