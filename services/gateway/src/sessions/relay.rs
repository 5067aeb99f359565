//! The relay of one session: a client on one side (a WebSocket,
//! [`super::websocket`], or an SSH channel, `crate::ssh`), the lease's node
//! on the bus on the other (docs/adr/030). Each side may have at most a
//! window of data in flight; the client is read only while the node has
//! room, and the node told to go on only once the client took what it
//! sent. Whatever ends it (the command, either side, a limit, hostile
//! input) is an [`Ending`] that names it, which the client side turns into
//! its own close.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use lh_events::subject;
use lh_rpc::session::{
    Control, CreditBack, Frame, Incoming, Outgoing, Stream, Window, FRAME_OVERHEAD_BYTES,
    PING_INTERVAL_MS, SILENCE_LIMIT_MS,
};
use lh_rpc::session_lane::{self, Lane};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use uuid::Uuid;

/// How long a client has to take the end of its session (the close behind
/// what it has not read) before its connection is dropped.
const FINISH_GRACE: Duration = Duration::from_secs(30);
/// Resizes forwarded to the node at most this often; the last one wins.
const RESIZE_EVERY: Duration = Duration::from_millis(100);

/// WebSocket close codes (RFC 6455), which every ending carries: the SSH
/// side reads them as kinds of failure.
pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_GOING_AWAY: u16 = 1001;
pub const CLOSE_UNSUPPORTED: u16 = 1003;
pub const CLOSE_POLICY: u16 = 1008;
pub const CLOSE_TOO_BIG: u16 = 1009;
pub const CLOSE_INTERNAL: u16 = 1011;

/// What the client did.
#[derive(Debug)]
pub enum FromClient {
    /// Bytes for the command's stdin or the connection.
    Data(Vec<u8>),
    /// Its input ended.
    Eof,
    Resize {
        cols: u16,
        rows: u16,
    },
    /// It went away.
    Closed,
    /// It broke the protocol or a limit: the session ends so.
    Refused(Ending),
}

/// The client's side of a session.
pub trait ClientSide: Send {
    /// What the client does next (asked only while the node has room).
    fn recv(&mut self) -> impl Future<Output = FromClient> + Send;
    /// Hands the client bytes of `stream`; an error when it is gone.
    fn send(&mut self, stream: Stream, bytes: Bytes)
        -> impl Future<Output = Result<(), ()>> + Send;
    /// The command's output or the connection's far side ended.
    fn eof(&mut self) -> impl Future<Output = ()> + Send;
    /// Tells the client how it ended, and closes.
    fn finish(self, ending: &Ending) -> impl Future<Output = ()> + Send;
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// `session.ended`'s `ended_by`.
    pub reason: String,
    /// The WebSocket close code that says what kind of end it is.
    pub code: u16,
    pub message: String,
    /// The command's exit code, or 128 + its signal, when it exited.
    pub exit_code: Option<i32>,
}

impl Ending {
    pub fn new(reason: &str, code: u16, message: impl Into<String>) -> Self {
        Ending {
            reason: reason.into(),
            code,
            message: message.into(),
            exit_code: None,
        }
    }

    /// Whether the command exited by itself (with `exit_code`).
    pub fn exited(&self) -> bool {
        self.reason == "exited" && self.exit_code.is_some()
    }
}

#[derive(Debug, Clone)]
pub struct RelaySpec {
    pub node_id: String,
    pub session_id: Uuid,
    pub window_bytes: u32,
    pub idle_timeout: Duration,
    pub client_read_timeout: Duration,
    pub bytes_per_s: u64,
}

/// How a session went, for the trail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub exit_code: Option<i32>,
    pub ended_by: String,
}

/// Bytes per second, with a second's worth of burst.
struct Throttle {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Throttle {
    fn new(bytes_per_s: u64) -> Self {
        let rate = bytes_per_s.max(1) as f64;
        Throttle {
            rate,
            tokens: rate,
            last: Instant::now(),
        }
    }

    /// Waits until `bytes` may pass.
    async fn pass(&mut self, bytes: usize) {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.rate);
        self.last = now;
        self.tokens -= bytes as f64;
        if self.tokens < 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(-self.tokens / self.rate)).await;
        }
    }
}

/// How the relay reaches the session's node: the bus, or the lane the
/// node dialed (lh_rpc::session_lane).
pub enum NodeLink {
    Bus {
        client: async_nats::Client,
        /// Subscribed before the node was asked: it may answer at once.
        from_node: async_nats::Subscriber,
    },
    Lane(Lane),
}

enum ToNodeWay {
    Bus {
        client: async_nats::Client,
        subject: String,
    },
    Lane(OwnedWriteHalf),
}

struct ToNode {
    way: ToNodeWay,
    numbers: Outgoing,
}

impl ToNode {
    async fn send(&mut self, frame: Frame) {
        let payload = self.numbers.encode(&frame);
        match &mut self.way {
            ToNodeWay::Bus { client, subject } => {
                if let Err(e) = client.publish(subject.clone(), payload.into()).await {
                    tracing::debug!(subject = %subject, error = %e, "a session frame was not sent");
                }
            }
            // A lane that fails is seen closed from the node's side.
            ToNodeWay::Lane(sink) => {
                if let Err(e) = session_lane::send(sink, &payload).await {
                    tracing::debug!(error = %e, "a session frame was not sent on its lane");
                }
            }
        }
    }
}

enum FromNode {
    Bus(async_nats::Subscriber),
    Lane(FramedRead<OwnedReadHalf, LengthDelimitedCodec>),
}

impl FromNode {
    /// The node's next frame as it travelled; `None` once nothing more can
    /// come. Safe to drop unfinished: each arm is one stream's `next`.
    async fn next(&mut self) -> Option<Bytes> {
        match self {
            FromNode::Bus(subscriber) => subscriber.next().await.map(|m| m.payload),
            FromNode::Lane(lane) => match lane.next().await {
                Some(Ok(frame)) => Some(frame.freeze()),
                Some(Err(e)) => {
                    tracing::info!(error = %e, "a session's lane broke");
                    None
                }
                None => None,
            },
        }
    }
}

/// Runs one session until it ends.
pub async fn run<C: ClientSide + 'static>(
    mut client_side: C,
    link: NodeLink,
    spec: RelaySpec,
) -> Outcome {
    let (way, mut from_node) = match link {
        NodeLink::Bus { client, from_node } => (
            ToNodeWay::Bus {
                client,
                subject: subject::session_to_node(&spec.node_id, spec.session_id),
            },
            FromNode::Bus(from_node),
        ),
        NodeLink::Lane(lane) => (ToNodeWay::Lane(lane.sink), FromNode::Lane(lane.frames)),
    };
    let on_lane = matches!(way, ToNodeWay::Lane(_));
    let mut to_node = ToNode {
        way,
        numbers: Outgoing::default(),
    };
    let mut outcome = Outcome::default();
    let mut incoming = Incoming::default();
    let mut window = Window::new(spec.window_bytes);
    let mut credit_back = CreditBack::new(spec.window_bytes);
    let mut throttle_in = Throttle::new(spec.bytes_per_s);
    let mut throttle_out = Throttle::new(spec.bytes_per_s);
    let mut last_data = Instant::now();
    let mut last_heard = Instant::now();
    let mut ping = tokio::time::interval(Duration::from_millis(PING_INTERVAL_MS));
    ping.tick().await;
    let mut tick = tokio::time::interval(RESIZE_EVERY);
    let mut pending_resize: Option<(u16, u16)> = None;
    let mut exit: Option<(Option<i32>, Option<i32>)> = None;

    // Whether the node must be told (it did not end the session itself).
    let (mut ending, tell_node) = loop {
        tokio::select! {
            action = client_side.recv(), if window.room() > 0 => match action {
                FromClient::Data(bytes) => {
                    if bytes.is_empty() { continue; }
                    throttle_in.pass(bytes.len()).await;
                    outcome.bytes_in += bytes.len() as u64;
                    last_data = Instant::now();
                    let frame = Frame::Data { stream: Stream::Stdin, bytes: bytes.into() };
                    window.spend(frame.window_cost());
                    to_node.send(frame).await;
                }
                FromClient::Eof => {
                    to_node.send(Frame::Control(Control::Eof { stream: Stream::Stdin })).await;
                }
                FromClient::Resize { cols, rows } => pending_resize = Some((cols, rows)),
                FromClient::Closed => {
                    break (Ending::new("client_closed", CLOSE_NORMAL, "the client closed the session"), true);
                }
                FromClient::Refused(ending) => break (ending, true),
            },
            message = from_node.next() => {
                let Some(payload) = message else {
                    if on_lane {
                        break (Ending::new("lane_lost", CLOSE_INTERNAL, format!(
                            "the lane to node {} closed", spec.node_id)), false);
                    }
                    break (Ending::new("bus_lost", CLOSE_INTERNAL, "the gateway lost its subscription to the node"), true);
                };
                last_heard = Instant::now();
                let frame = match incoming.decode(&payload) {
                    Ok(frame) => frame,
                    Err(e) => break (Ending::new("frames_lost", CLOSE_INTERNAL, e), true),
                };
                match frame {
                    Frame::Data { stream, bytes } => {
                        throttle_out.pass(bytes.len()).await;
                        let cost = bytes.len() as u32 + FRAME_OVERHEAD_BYTES;
                        outcome.bytes_out += bytes.len() as u64;
                        last_data = Instant::now();
                        match tokio::time::timeout(spec.client_read_timeout, client_side.send(stream, bytes)).await {
                            Ok(Ok(())) => {}
                            Ok(Err(())) => break (Ending::new("client_closed", CLOSE_NORMAL, "the connection failed"), true),
                            Err(_) => break (Ending::new("client_not_reading", CLOSE_POLICY, format!(
                                "the client took nothing for {} s", spec.client_read_timeout.as_secs())), true),
                        }
                        if let Some(bytes) = credit_back.consumed(cost) {
                            to_node.send(Frame::Control(Control::Credit { bytes })).await;
                        }
                    }
                    Frame::Control(Control::Credit { bytes }) => window.credit(bytes),
                    Frame::Control(Control::Eof { .. }) => client_side.eof().await,
                    Frame::Control(Control::Exit { code, signal }) => exit = Some((code, signal)),
                    Frame::Control(Control::Close { reason, message }) => {
                        let code = match reason.as_str() {
                            "exited" | "closed" => CLOSE_NORMAL,
                            "lease_ended" => CLOSE_GOING_AWAY,
                            _ => CLOSE_INTERNAL,
                        };
                        break (Ending { reason, code, message, exit_code: None }, false);
                    }
                    Frame::Control(Control::Ping) => to_node.send(Frame::Control(Control::Pong)).await,
                    Frame::Control(_) => {}
                }
            }
            _ = ping.tick() => to_node.send(Frame::Control(Control::Ping)).await,
            _ = tick.tick() => {
                if last_heard.elapsed() > Duration::from_millis(SILENCE_LIMIT_MS) {
                    break (Ending::new("node_silent", CLOSE_INTERNAL, format!(
                        "node {} stopped answering (nothing for {} s)", spec.node_id, SILENCE_LIMIT_MS / 1000)), true);
                }
                if last_data.elapsed() > spec.idle_timeout {
                    break (Ending::new("idle", CLOSE_NORMAL, format!(
                        "idle for {} s", spec.idle_timeout.as_secs())), true);
                }
                if let Some((cols, rows)) = pending_resize.take() {
                    to_node.send(Frame::Control(Control::Resize { cols, rows })).await;
                }
                if let Some(bytes) = credit_back.flush() {
                    to_node.send(Frame::Control(Control::Credit { bytes })).await;
                }
            }
        }
    };
    if tell_node {
        to_node
            .send(Frame::Control(Control::Close {
                reason: ending.reason.clone(),
                message: ending.message.clone(),
            }))
            .await;
    }
    if let FromNode::Bus(mut subscriber) = from_node {
        let _ = subscriber.unsubscribe().await;
    }
    ending.exit_code = exit.and_then(|(code, signal)| code.or(signal.map(|s| 128 + s)));
    outcome.exit_code = ending.exit_code;
    outcome.ended_by = ending.reason.clone();
    // The client is told last, behind whatever it has not read yet: given
    // a while of its own, so that the session's end (its count, its record)
    // waits for no slow client.
    tokio::spawn(async move {
        let _ = tokio::time::timeout(FINISH_GRACE, client_side.finish(&ending)).await;
    });
    outcome
}
