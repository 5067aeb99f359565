//! `POST /v1/nodes/{id}/enroll`, `/drain` and `/uncordon`: the operator
//! vouches for what a node may claim, takes it out of placement (its
//! leases finishing where they are, or moved) and back in. The readers
//! act on the events; the gateway only records the request.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use lh_bus::{BusError, Expect};
use lh_events::{
    derived_id, subject, Envelope, EventData, NodeCordoned, NodeEnrolled, NodeUncordoned,
};
use lh_rpc::http::nodes::{DrainNode, EnrollNode, NodeCordonView, NodeEnrollmentView};

use super::{ApiContext, ApiError, ApiJson, Caller};

/// Tries before a node that keeps changing under the request gives up.
const ATTEMPTS: usize = 5;

/// Most GPUs one node may be enrolled for.
pub const MAX_ENROLLED_GPUS: u32 = 1024;
/// Longest node id and zone, in characters (a node id is a subject token).
pub const MAX_NODE_NAME_CHARS: usize = 64;

#[utoipa::path(
    post, path = "/v1/nodes/{id}/enroll", request_body = EnrollNode, params(("id" = String, Path)),
    responses(
        (status = 201, body = NodeEnrollmentView), (status = 400, body = super::Problem),
        (status = 401, body = super::Problem), (status = 403, body = super::Problem),
        (status = 409, body = super::Problem), (status = 422, body = super::Problem)
    )
)]
pub async fn enroll(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(node_id): Path<String>,
    ApiJson(body): ApiJson<EnrollNode>,
) -> Result<(StatusCode, Json<NodeEnrollmentView>), ApiError> {
    caller.require_admin()?;
    let name_ok = |name: &str| !name.is_empty() && name.chars().count() <= MAX_NODE_NAME_CHARS;
    // The node's NATS user is its id as one subject token: an id that is
    // not its own token would alias another's subjects.
    if !name_ok(&node_id)
        || !node_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(ApiError::unprocessable(
            format!("a node id is 1 to {MAX_NODE_NAME_CHARS} letters, digits, '-' or '_'"),
            "id",
        ));
    }
    if !name_ok(&body.zone) || body.zone.chars().any(char::is_control) {
        return Err(ApiError::unprocessable(
            format!("zone must be 1 to {MAX_NODE_NAME_CHARS} printable characters"),
            "zone",
        ));
    }
    if body.max_gpus == 0 || body.max_gpus > MAX_ENROLLED_GPUS {
        return Err(ApiError::unprocessable(
            format!("max_gpus must be 1 to {MAX_ENROLLED_GPUS}"),
            "max_gpus",
        ));
    }
    if body.gpu_models.is_empty() {
        return Err(ApiError::unprocessable(
            "name at least one GPU model",
            "gpu_models",
        ));
    }
    for (i, model) in body.gpu_models.iter().enumerate() {
        if lh_domain::catalog::vram_gb(model).is_none() {
            let known: Vec<&str> = lh_domain::catalog::model_names().collect();
            return Err(ApiError::unprocessable(
                format!("unknown GPU model {model:?}; known: {}", known.join(", ")),
                &format!("gpu_models[{i}]"),
            ));
        }
    }
    let mut gpu_models = body.gpu_models.clone();
    gpu_models.sort();
    gpu_models.dedup();
    let mut gpu_sharing = body.gpu_sharing.clone();
    gpu_sharing.retain(|s| !s.is_none());
    gpu_sharing.sort_by_key(|s| format!("{s:?}"));
    gpu_sharing.dedup();
    let enrolled = NodeEnrolled {
        node_id: node_id.clone(),
        zone: body.zone.clone(),
        max_gpus: body.max_gpus,
        gpu_models,
        max_isolation: body.max_isolation,
        gpu_sharing,
    };
    let sequence = append_to_node(
        &ctx,
        &caller,
        &node_id,
        "node.enrolled",
        EventData::NodeEnrolled(enrolled.clone()),
        false,
    )
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(NodeEnrollmentView {
            node_id,
            zone: enrolled.zone,
            max_gpus: enrolled.max_gpus,
            gpu_models: enrolled.gpu_models,
            max_isolation: enrolled.max_isolation,
            gpu_sharing: enrolled.gpu_sharing,
            sequence,
        }),
    ))
}

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
    append_to_node(ctx, caller, node_id, kind, data, true).await
}

/// [`record`], on a node that must be on the log already (`existing`) or
/// may be new (an enrollment comes before the node's first registration).
async fn append_to_node(
    ctx: &ApiContext,
    caller: &Caller,
    node_id: &str,
    kind: &str,
    data: EventData,
    existing: bool,
) -> Result<u64, ApiError> {
    let node_subject = subject::node(node_id);
    for _ in 0..ATTEMPTS {
        let last = ctx.bus.subject_last_sequence(&node_subject).await?;
        if existing && last == 0 {
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
