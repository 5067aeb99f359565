//! Request/reply between services (never stored): a JSON request on a
//! `lh.rpc.*` subject, answered by one member of a queue group.

use std::time::Duration;

use futures::StreamExt;
use serde::{de::DeserializeOwned, Serialize};

use crate::error::{js_err, BusError, Result};
use crate::Bus;

/// Answer of a responder that failed: `{"error": "..."}`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct RpcFailure {
    pub error: String,
}

/// Sends `request` and waits up to `timeout` for the answer.
pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
    bus: &Bus,
    subject: &str,
    request: &Req,
    timeout: Duration,
) -> Result<Resp> {
    let payload = serde_json::to_vec(request).map_err(js_err)?;
    let reply = tokio::time::timeout(
        timeout,
        bus.client.request(subject.to_string(), payload.into()),
    )
    .await
    .map_err(|_| BusError::JetStream(format!("{subject}: no answer within {timeout:?}")))?
    .map_err(|e| BusError::JetStream(format!("{subject}: {e}")))?;
    if let Ok(failure) = serde_json::from_slice::<RpcFailure>(&reply.payload) {
        return Err(BusError::JetStream(format!("{subject}: {}", failure.error)));
    }
    serde_json::from_slice(&reply.payload)
        .map_err(|e| BusError::JetStream(format!("{subject}: bad answer: {e}")))
}

/// Answers requests on `subject` (queue group `queue`) with `handler`
/// until the subscription ends. Handler errors become `{"error": ...}`.
pub async fn serve<Req, Resp, F, Fut>(
    bus: &Bus,
    subject: &str,
    queue: &str,
    handler: F,
) -> Result<()>
where
    Req: DeserializeOwned,
    Resp: Serialize,
    F: Fn(Req) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<Resp, String>>,
{
    serve_subjects(bus, subject, queue, |_, request| handler(request)).await
}

/// [`serve`] for a wildcard `subject`: `handler` is also given the
/// subject each request came on, where the asker's permissions make
/// that subject say who asks.
pub async fn serve_subjects<Req, Resp, F, Fut>(
    bus: &Bus,
    subject: &str,
    queue: &str,
    handler: F,
) -> Result<()>
where
    Req: DeserializeOwned,
    Resp: Serialize,
    F: Fn(&str, Req) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<Resp, String>>,
{
    let mut sub = bus
        .client
        .queue_subscribe(subject.to_string(), queue.to_string())
        .await
        .map_err(js_err)?;
    while let Some(msg) = sub.next().await {
        let Some(reply) = msg.reply.clone() else {
            continue;
        };
        let answer = match serde_json::from_slice::<Req>(&msg.payload) {
            Ok(req) => match handler(msg.subject.as_str(), req).await {
                Ok(resp) => serde_json::to_vec(&resp),
                Err(error) => serde_json::to_vec(&RpcFailure { error }),
            },
            Err(e) => serde_json::to_vec(&RpcFailure {
                error: format!("bad request: {e}"),
            }),
        }
        .map_err(js_err)?;
        if let Err(e) = bus.client.publish(reply, answer.into()).await {
            tracing::warn!(error = %e, subject, "cannot answer request");
        }
    }
    Ok(())
}
