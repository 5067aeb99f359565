//! Opening a session into a lease, whichever way the client came (a
//! WebSocket or SSH): the lease must run a workload on a node, the session
//! must fit the limits, the node must open its side, and the trail must
//! record it, all before the client is told yes. Then the relay, and the
//! end on the trail.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::Bus;
use lh_domain::lease::LeaseState;
use lh_events::{
    subject, Actor, Envelope, EventData, Expect, SessionEnded, SessionKind, SessionOpened,
    SessionTransport,
};
use lh_rpc::session::{
    Control, Frame, OpenKind, OpenReply, OpenSession, Outgoing, Refusal, DEFAULT_WINDOW_BYTES,
};
use uuid::Uuid;

use super::relay::{self, ClientSide, Outcome, RelaySpec};
use super::{OverLimit, Sessions, Slot, OPEN_TIMEOUT};
use crate::http::error::ApiError;
use crate::read_model::lease::Lease;

/// Tries at recording a session's end through a bus outage, a second
/// apart at first, doubling up to half a minute.
const END_RECORD_ATTEMPTS: u32 = 10;

/// What a client asks to open.
pub struct Opening {
    /// Who: the lease's tenant, or an operator.
    pub actor: Actor,
    /// The lease, as the caller may see it.
    pub lease: Lease,
    pub kind: OpenKind,
    pub session_kind: SessionKind,
    pub transport: SessionTransport,
    /// An operator's reason.
    pub reason: Option<String>,
    pub ssh_key_fingerprint: Option<String>,
    /// For a lease across nodes, the member to enter (one of its
    /// members); `None`: the first.
    pub member: Option<String>,
}

/// A session the node opened and the trail recorded, ready to relay.
pub struct Opened {
    link: relay::NodeLink,
    spec: RelaySpec,
    _slot: Slot,
    actor: Actor,
    session_id: Uuid,
    lease_id: Uuid,
    tenant_id: Uuid,
    opened_at: DateTime<Utc>,
}

/// Opens a session on `bus` within `sessions`' limits: every refusal is
/// an [`ApiError`] naming its cause.
pub async fn open(bus: &Bus, sessions: &Sessions, opening: Opening) -> Result<Opened, ApiError> {
    let lease = &opening.lease;
    let lease_id = lease.view.id;
    let tenant_id = lease.view.tenant_id;
    if lease.view.state != LeaseState::Running {
        return Err(ApiError::conflict(format!(
            "lease {lease_id} is {}: a session enters a running lease",
            lease.view.state.as_str()
        )));
    }
    if lease.view.workload.is_none() {
        return Err(ApiError::conflict(format!(
            "lease {lease_id} runs no workload: there is nothing to enter (create it with a command or an image)"
        )));
    }
    let node_id = opening
        .member
        .clone()
        .or_else(|| lease.view.node_id.clone());
    let (Some(node_id), Some(placement)) = (node_id, lease.last_placement_sequence) else {
        return Err(ApiError::conflict(format!(
            "lease {lease_id} is on no node"
        )));
    };
    let slot = sessions.take(tenant_id, lease_id).map_err(|over| {
        let detail = match over {
            OverLimit::Lease(n) => format!(
                "lease {lease_id} has {n} sessions open through this gateway, the most allowed (LH_SESSIONS_PER_LEASE)"
            ),
            OverLimit::Tenant(n) => format!(
                "the tenant has {n} sessions open through this gateway, the most allowed (LH_SESSIONS_PER_TENANT)"
            ),
        };
        ApiError::too_many_requests(detail).retry_after(5)
    })?;
    let session_id = Uuid::new_v4();
    let port = match &opening.kind {
        OpenKind::PortForward { port } => Some(*port),
        OpenKind::Exec { .. } => None,
    };
    let client = bus.client().clone();
    // Listening before asking: the node may answer at once.
    let from_node = client
        .subscribe(subject::session_from_node(&node_id, session_id))
        .await
        .map_err(|e| ApiError::unavailable(format!("the bus: {e}")).retry_after(2))?;
    let pending_lane = sessions.lanes.as_ref().and_then(|lanes| lanes.offer());
    let request = OpenSession {
        session_id,
        lease_id,
        placement: placement as u64,
        kind: opening.kind,
        window_bytes: DEFAULT_WINDOW_BYTES,
        max_sessions_per_lease: sessions.args.sessions_per_lease,
        lane: pending_lane.as_ref().map(|p| p.offer.clone()),
    };
    let payload = serde_json::to_vec(&request).expect("an opening serializes");
    let answer = tokio::time::timeout(
        OPEN_TIMEOUT,
        client.request(subject::session_open(&node_id), payload.into()),
    )
    .await;
    let unanswered = || {
        ApiError::unavailable(format!(
            "node {node_id}, where lease {lease_id} runs, did not answer within {} s",
            OPEN_TIMEOUT.as_secs()
        ))
        .retry_after(5)
    };
    let answer = match answer {
        Err(_) => return Err(unanswered()),
        Ok(Err(e)) => {
            tracing::info!(node = %node_id, error = %e, "a node did not take a session");
            return Err(unanswered());
        }
        Ok(Ok(message)) => serde_json::from_slice::<OpenReply>(&message.payload).map_err(|e| {
            ApiError::internal(format!("node {node_id} answered an opening with {e}"))
        })?,
    };
    let on_lane = match answer {
        OpenReply::Opened { lane } => lane,
        OpenReply::Refused { reason, message } => {
            return Err(match reason {
                Refusal::NotRunningHere | Refusal::Simulated | Refusal::CannotEnter => {
                    ApiError::conflict(message)
                }
                Refusal::TooManySessions => ApiError::too_many_requests(message).retry_after(5),
                Refusal::BadRequest | Refusal::CannotStart => {
                    ApiError::unprocessable(message, "command")
                }
                Refusal::ConnectionRefused => ApiError::bad_gateway(message).field("port"),
            })
        }
    };
    let link = match (on_lane, pending_lane) {
        (true, Some(pending)) => match pending.taken().await {
            Some(lane) => {
                let mut from_node = from_node;
                let _ = from_node.unsubscribe().await;
                relay::NodeLink::Lane(lane)
            }
            // The node relays on a lane this replica does not hold: it
            // sees it closed and ends its side.
            None => {
                return Err(ApiError::unavailable(format!(
                    "node {node_id} took the session's lane, which did not arrive"
                ))
                .retry_after(2))
            }
        },
        _ => relay::NodeLink::Bus {
            client: client.clone(),
            from_node,
        },
    };
    let opened_at = Utc::now();
    let opened = Envelope::new(
        opening.actor.clone(),
        opened_at,
        EventData::SessionOpened(SessionOpened {
            session_id,
            lease_id,
            tenant_id,
            node_id: node_id.clone(),
            placement: placement as u64,
            kind: opening.session_kind,
            transport: opening.transport,
            ssh_key_fingerprint: opening.ssh_key_fingerprint,
            port,
            reason: opening.reason,
            gateway: sessions.replica.clone(),
        }),
    );
    if let Err(e) = bus.publish(&opened, Expect::Any).await {
        // No session goes unrecorded: the node's side is told to end (a
        // lane's by its closing, as `link` drops).
        let close = Outgoing::default().encode(&Frame::Control(Control::Close {
            reason: "not_recorded".into(),
            message: "the trail could not record the session".into(),
        }));
        let _ = client
            .publish(subject::session_to_node(&node_id, session_id), close.into())
            .await;
        return Err(ApiError::from(e));
    }
    metrics::counter!("lh_gateway_sessions_opened_total").increment(1);
    let args = &sessions.args;
    let spec = RelaySpec {
        node_id,
        session_id,
        window_bytes: DEFAULT_WINDOW_BYTES,
        idle_timeout: Duration::from_secs(args.session_idle_timeout_secs.max(1)),
        client_read_timeout: Duration::from_secs(args.session_client_read_timeout_secs.max(1)),
        bytes_per_s: args.session_bytes_per_s,
    };
    Ok(Opened {
        link,
        spec,
        _slot: slot,
        actor: opening.actor,
        session_id,
        lease_id,
        tenant_id,
        opened_at,
    })
}

impl Opened {
    /// Relays the session with `client_side` until it ends, then records
    /// its end (retried through a bus outage: the trail must have it).
    pub async fn relay<C: ClientSide + 'static>(self, bus: &Bus, client_side: C) -> Outcome {
        let outcome = relay::run(client_side, self.link, self.spec).await;
        drop(self._slot);
        let closed_at = Utc::now();
        let ended = Envelope::new(
            self.actor,
            closed_at,
            EventData::SessionEnded(SessionEnded {
                session_id: self.session_id,
                lease_id: self.lease_id,
                tenant_id: self.tenant_id,
                opened_at: self.opened_at,
                duration_ms: (closed_at - self.opened_at).num_milliseconds().max(0) as u64,
                bytes_in: outcome.bytes_in,
                bytes_out: outcome.bytes_out,
                exit_code: outcome.exit_code,
                ended_by: outcome.ended_by.clone(),
            }),
        );
        for attempt in 0..END_RECORD_ATTEMPTS {
            match bus.publish(&ended, Expect::Any).await {
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(session = %self.session_id, attempt, error = %e,
                        "the end of a session is not recorded yet");
                    tokio::time::sleep(Duration::from_secs(1 << attempt.min(5))).await;
                }
            }
        }
        outcome
    }
}
