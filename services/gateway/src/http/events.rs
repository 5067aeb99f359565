//! `GET /v1/events/stream`: lease and node changes as server-sent events,
//! each caller told only of what it may read (`crate::changes`): a tenant
//! of its own leases, an operator of every lease and node. A change names
//! the lease or node; read it again for what changed.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;
use utoipa::IntoParams;

use super::{ApiContext, ApiError, Caller};
use crate::changes::{Change, Missed, Reader};

/// Most streams one replica holds open at once.
pub const MAX_OPEN_STREAMS: usize = 1024;
/// Longest a stream stays open, in seconds: the client connects again, and
/// its credential is checked again (a revoked key stops hearing).
pub const MAX_STREAM_SECS: u64 = 900;
/// A comment sent this often keeps proxies from closing a quiet stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    /// Seconds the stream stays open, 1 to 900 (the default).
    pub for_secs: Option<u64>,
}

#[utoipa::path(
    get, path = "/v1/events/stream", params(StreamQuery),
    responses(
        (status = 200, description = "`text/event-stream`: an `open` event, then a `lease` or `node` event per change (`id` its sequence on the log; data `{\"type\", \"sequence\", \"occurred_at\", \"lease_id\" | \"node_id\"}`), and `lagged` (`{\"missed\": n}`, n null when unknown) where the stream fell behind: read again what it shows. With `Last-Event-ID` (the last `id` heard), the changes since are sent first, or `lagged` where they reach past what the replica keeps"),
        (status = 400, body = super::Problem, description = "`Last-Event-ID` is not a sequence"),
        (status = 401, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem, description = "As many streams are open as the replica holds")
    )
)]
pub async fn stream(
    State(ctx): State<ApiContext>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    query: Result<Query<StreamQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let last_heard = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "Last-Event-ID is the id of the last change heard: a sequence number",
                    )
                    .field("Last-Event-ID")
                })?,
        ),
    };
    let for_secs = query.for_secs.unwrap_or(MAX_STREAM_SECS);
    if !(1..=MAX_STREAM_SECS).contains(&for_secs) {
        return Err(ApiError::unprocessable(
            format!("for_secs must be 1 to {MAX_STREAM_SECS}"),
            "for_secs",
        ));
    }
    let reader = match &caller {
        Caller::Operator(_) => Reader::Operator,
        Caller::Tenant { id, .. } => Reader::Tenant(*id),
    };
    let permit = ctx.streams.clone().try_acquire_owned().map_err(|_| {
        ApiError::unavailable(format!(
            "this replica holds {MAX_OPEN_STREAMS} streams open; retry shortly"
        ))
        .retry_after(5)
    })?;
    metrics::counter!("lh_gateway_event_streams_opened_total").increment(1);
    let (changes, missed) = ctx.changes.subscribe(last_heard);
    // What it missed comes first, after its `open`.
    let mut first = std::collections::VecDeque::from([Event::default().event("open").data("{}")]);
    match missed {
        Missed::These(missed) => {
            first.extend(missed.iter().filter(|c| c.visible_to(reader)).map(event_of))
        }
        Missed::Unknown => {
            first.push_back(Event::default().event("lagged").data("{\"missed\":null}"))
        }
    }
    // A replica behind the one the client heard last tells it nothing twice.
    let heard = last_heard.unwrap_or(0);
    let until = tokio::time::Instant::now() + Duration::from_secs(for_secs);
    let told = futures::stream::unfold(
        (changes, permit, first),
        move |(mut changes, permit, mut first)| async move {
            if let Some(event) = first.pop_front() {
                return Some((Ok(event), (changes, permit, first)));
            }
            loop {
                let event = match tokio::time::timeout_at(until, changes.recv()).await {
                    Err(_) | Ok(Err(RecvError::Closed)) => return None,
                    Ok(Ok(change)) if change.sequence <= heard => continue,
                    Ok(Ok(change)) if change.visible_to(reader) => event_of(&change),
                    Ok(Ok(_)) => continue,
                    Ok(Err(RecvError::Lagged(missed))) => Event::default()
                        .event("lagged")
                        .data(format!("{{\"missed\":{missed}}}")),
                };
                return Some((Ok(event), (changes, permit, first)));
            }
        },
    );
    Ok(Sse::new(told).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

fn event_of(change: &Change) -> Event {
    let kind = if change.lease_id.is_some() {
        "lease"
    } else {
        "node"
    };
    Event::default()
        .event(kind)
        .id(change.sequence.to_string())
        .data(serde_json::to_string(change).unwrap_or_default())
}
