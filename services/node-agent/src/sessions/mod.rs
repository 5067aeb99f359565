//! Sessions into the leases that run here (docs/adr/030): the gateway asks
//! to open one on `lh.sess.node.<node>.open`, then relays its frames on
//! `lh.sess.node.<node>.<session>`; the node answers on
//! `lh.sess.up.<node>.<session>`. Only the gateway may publish to this
//! node's session subjects and only this node on its answers (the NATS
//! accounts say so), and a session enters only a workload that runs here
//! for the placement the gateway named. Where the gateway offers a lane
//! (lh_rpc::session_lane) and this node's bus is not encrypted, the frames
//! travel on it instead.

pub mod enter;
pub mod pty;
pub mod relay;

use std::collections::HashMap;

use bytes::Bytes;
use futures::StreamExt;
use lh_bus::Bus;
use lh_events::subject;
use lh_rpc::session::{
    max_frames_in_window, Control, Frame, OpenKind, OpenReply, OpenSession, Outgoing, Refusal,
    DEFAULT_WINDOW_BYTES, MAX_COMMAND_ARGS, MAX_COMMAND_BYTES,
};
use lh_rpc::session_lane;
use tokio::sync::mpsc;
use uuid::Uuid;

pub use crate::workload::door::{DoorTarget, Doors};

/// Most sessions one node relays at once, over all its leases.
pub const MAX_SESSIONS_PER_NODE: usize = 1024;
/// The largest window a gateway may ask for: what a session's queue holds.
pub const MAX_WINDOW_BYTES: u32 = 4 * DEFAULT_WINDOW_BYTES;
/// Frames beyond the window's data frames a session's queue takes (pings,
/// resizes, credit).
const CONTROL_FRAMES_QUEUED: usize = 256;

/// Serves the sessions into this node's leases until the subscription ends.
/// `simulated`: the node runs no workloads, which a refusal says.
pub async fn serve(bus: Bus, node_id: String, doors: Doors, simulated: bool) -> anyhow::Result<()> {
    let client = bus.client().clone();
    // A lane carries bytes in clear: never where the bus would not.
    let lanes = !bus.is_encrypted();
    let mut requests = client
        .subscribe(subject::sessions_to_node(&node_id))
        .await?;
    let open_subject = subject::session_open(&node_id);
    let mut sessions: HashMap<Uuid, mpsc::Sender<Bytes>> = HashMap::new();
    let (ended_tx, mut ended) = mpsc::unbounded_channel::<Uuid>();
    loop {
        tokio::select! {
            Some(id) = ended.recv() => { sessions.remove(&id); }
            message = requests.next() => {
                let Some(message) = message else { break };
                if message.subject.as_str() == open_subject {
                    let Some(reply) = message.reply.clone() else { continue };
                    let open = match serde_json::from_slice::<OpenSession>(&message.payload) {
                        Ok(open) => open,
                        Err(e) => {
                            answer(&client, reply, refused(Refusal::BadRequest, format!("not an opening: {e}"))).await;
                            continue;
                        }
                    };
                    if sessions.len() >= MAX_SESSIONS_PER_NODE {
                        answer(&client, reply, refused(Refusal::TooManySessions,
                            format!("this node relays {MAX_SESSIONS_PER_NODE} sessions, the most it takes"))).await;
                        continue;
                    }
                    if sessions.contains_key(&open.session_id) {
                        answer(&client, reply, refused(Refusal::BadRequest, "that session is open already".into())).await;
                        continue;
                    }
                    let window = open.window_bytes.clamp(1, MAX_WINDOW_BYTES);
                    let (tx, rx) = mpsc::channel(frames_queued(window));
                    sessions.insert(open.session_id, tx);
                    let (client, node_id, doors, ended) =
                        (client.clone(), node_id.clone(), doors.clone(), ended_tx.clone());
                    let here = Here { client, node_id, doors, simulated, lanes };
                    tokio::spawn(async move {
                        let id = open.session_id;
                        open_and_run(here, reply, open, window, rx).await;
                        let _ = ended.send(id);
                    });
                    continue;
                }
                let Some(id) = message
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|t| t.parse::<Uuid>().ok())
                else {
                    continue;
                };
                match sessions.get(&id) {
                    Some(tx) => {
                        if tx.try_send(message.payload).is_err() {
                            // Beyond its window (or ended): the session
                            // sees its queue close and says so.
                            sessions.remove(&id);
                        }
                    }
                    None => {
                        // Unknown here (this agent restarted, or it ended):
                        // the gateway hears so at once instead of waiting.
                        let mut numbers = Outgoing::default();
                        let close = numbers.encode(&Frame::Control(Control::Close {
                            reason: "unknown_session".into(),
                            message: format!("node {node_id} has no session {id}"),
                        }));
                        let _ = client
                            .publish(subject::session_from_node(&node_id, id), close.into())
                            .await;
                    }
                }
            }
        }
    }
    anyhow::bail!("the session subscription ended")
}

/// Frames a session's queue takes: its window's, and the control frames
/// beside them.
fn frames_queued(window: u32) -> usize {
    max_frames_in_window(window) + CONTROL_FRAMES_QUEUED
}

/// What every session on this node shares.
struct Here {
    client: async_nats::Client,
    node_id: String,
    doors: Doors,
    /// The node simulates its workloads: there is nothing to enter.
    simulated: bool,
    /// Whether a lane the gateway offers may be taken.
    lanes: bool,
}

fn refused(reason: Refusal, message: String) -> OpenReply {
    OpenReply::Refused { reason, message }
}

async fn answer(client: &async_nats::Client, reply: async_nats::Subject, answer: OpenReply) {
    let payload = serde_json::to_vec(&answer).expect("a reply serializes");
    if let Err(e) = client.publish(reply, payload.into()).await {
        tracing::debug!(error = %e, "a session opening was not answered");
    }
}

/// Checks the opening, enters the workload and relays until the end.
async fn open_and_run(
    here: Here,
    reply: async_nats::Subject,
    open: OpenSession,
    window: u32,
    frames: mpsc::Receiver<Bytes>,
) {
    let Here {
        client,
        node_id,
        doors,
        simulated,
        lanes,
    } = here;
    if simulated {
        let message = format!(
            "node {node_id} simulates its workloads (--runtime sim): nothing of lease {} runs to enter",
            open.lease_id
        );
        return answer(&client, reply, refused(Refusal::Simulated, message)).await;
    }
    let entry = match doors.enter(open.lease_id, open.placement, open.max_sessions_per_lease) {
        Ok(entry) => entry,
        Err((reason, message)) => return answer(&client, reply, refused(reason, message)).await,
    };
    let work = match &open.kind {
        OpenKind::Exec {
            command,
            tty,
            stdin,
        } => {
            if let Some(why) = bad_command(command) {
                return answer(&client, reply, refused(Refusal::BadRequest, why)).await;
            }
            match enter::exec(&entry.target, open.session_id, command, *tty, *stdin) {
                Ok(exec) => relay::Work::Exec(Box::new(exec)),
                Err(e) => {
                    let message = format!("cannot start {:?}: {e}", command[0]);
                    return answer(&client, reply, refused(Refusal::CannotStart, message)).await;
                }
            }
        }
        OpenKind::PortForward { port } => {
            if *port == 0 {
                return answer(
                    &client,
                    reply,
                    refused(Refusal::BadRequest, "port 0".into()),
                )
                .await;
            }
            match enter::connect(&entry.target, *port).await {
                Ok(stream) => relay::Work::Port(stream),
                Err(e) => {
                    let message = format!(
                        "nothing accepts connections on port {port} in lease {}: {e}",
                        open.lease_id
                    );
                    return answer(&client, reply, refused(Refusal::ConnectionRefused, message))
                        .await;
                }
            }
        }
    };
    let lane = match (&open.lane, lanes) {
        (Some(offer), true) => match session_lane::dial(offer).await {
            Ok(lane) => Some(lane),
            Err(e) => {
                tracing::info!(session = %open.session_id, lane = %offer.addr, error = %e,
                    "the session's lane is not reached: its frames keep to the bus");
                None
            }
        },
        _ => None,
    };
    answer(
        &client,
        reply,
        OpenReply::Opened {
            lane: lane.is_some(),
        },
    )
    .await;
    let (way, frames) = match lane {
        Some(lane) => {
            // Frames on the bus for this session now find no queue and are
            // dropped: the gateway sends it none.
            drop(frames);
            let (tx, rx) = mpsc::channel(frames_queued(window));
            relay::read_lane(lane.frames, tx);
            (relay::Way::Lane(lane.sink), rx)
        }
        None => (
            relay::Way::Bus {
                client,
                subject: subject::session_from_node(&node_id, open.session_id),
            },
            frames,
        ),
    };
    let up = relay::Uplink {
        way,
        numbers: Outgoing::default(),
    };
    let why = relay::run(work, entry, frames, up, window).await;
    tracing::info!(session = %open.session_id, lease = %open.lease_id, ended_by = why, "session ended");
}

/// Why a command cannot be run as asked, if it cannot.
fn bad_command(command: &[String]) -> Option<String> {
    if command.is_empty() || command[0].is_empty() {
        return Some("no command".into());
    }
    if command.len() > MAX_COMMAND_ARGS {
        return Some(format!(
            "{} arguments, over the {MAX_COMMAND_ARGS} allowed",
            command.len()
        ));
    }
    let bytes: usize = command.iter().map(String::len).sum();
    if bytes > MAX_COMMAND_BYTES {
        return Some(format!(
            "a command of {bytes} bytes, over the {MAX_COMMAND_BYTES} allowed"
        ));
    }
    if command.iter().any(|a| a.contains('\0')) {
        return Some("a NUL byte in the command".into());
    }
    None
}
