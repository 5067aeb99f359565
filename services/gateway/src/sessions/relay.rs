//! The relay of one session: the client's WebSocket on one side, the
//! lease's node on the bus on the other (docs/adr/030). Each side may have
//! at most a window of data in flight; the client is read only while the
//! node has room, the node told to go on only once the client took what it
//! sent. Whatever ends it (the command, either side, a limit, hostile
//! input) closes the WebSocket with a code and a reason that says so.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures::{SinkExt, StreamExt};
use lh_events::subject;
use lh_rpc::http::sessions::{
    ExecStatus, TerminalSize, CHANNEL_CLOSE, CHANNEL_DATA, CHANNEL_ERROR, CHANNEL_RESIZE,
    CHANNEL_STATUS, CHANNEL_STDERR, CHANNEL_STDIN, CHANNEL_STDOUT, MAX_SESSION_MESSAGE_BYTES,
};
use lh_rpc::session::{
    Control, CreditBack, Frame, Incoming, Outgoing, Stream, Window, PING_INTERVAL_MS,
    SILENCE_LIMIT_MS,
};
use tokio::time::Instant;
use uuid::Uuid;

/// Resizes forwarded to the node at most this often; the last one wins.
const RESIZE_EVERY: Duration = Duration::from_millis(100);
/// More resizes than this in one second is a flood, not a window dragged.
pub const MAX_RESIZES_PER_S: u32 = 200;

/// WebSocket close codes (RFC 6455).
const CLOSE_NORMAL: u16 = 1000;
const CLOSE_GOING_AWAY: u16 = 1001;
const CLOSE_UNSUPPORTED: u16 = 1003;
const CLOSE_POLICY: u16 = 1008;
const CLOSE_TOO_BIG: u16 = 1009;
const CLOSE_INTERNAL: u16 = 1011;

/// What the session carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayKind {
    /// A command; `stdin`: whether the client may send input.
    Exec {
        stdin: bool,
    },
    PortForward,
}

#[derive(Debug, Clone)]
pub struct RelaySpec {
    pub kind: RelayKind,
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

struct ToNode {
    client: async_nats::Client,
    subject: String,
    numbers: Outgoing,
}

impl ToNode {
    async fn send(&mut self, frame: Frame) {
        let payload = self.numbers.encode(&frame);
        if let Err(e) = self
            .client
            .publish(self.subject.clone(), payload.into())
            .await
        {
            tracing::debug!(subject = %self.subject, error = %e, "a session frame was not sent");
        }
    }

    async fn close(&mut self, reason: &str, message: &str) {
        self.send(Frame::Control(Control::Close {
            reason: reason.into(),
            message: message.into(),
        }))
        .await;
    }
}

/// Why the relay stops, and what the client is told.
struct End {
    reason: String,
    code: u16,
    message: String,
    /// Tell the node too (it did not end it itself).
    tell_node: bool,
}

impl End {
    fn by_client(reason: &str, code: u16, message: impl Into<String>) -> Self {
        End {
            reason: reason.into(),
            code,
            message: message.into(),
            tell_node: true,
        }
    }
}

/// Runs one session until it ends.
pub async fn run(
    socket: WebSocket,
    client: async_nats::Client,
    mut from_node: async_nats::Subscriber,
    spec: RelaySpec,
) -> Outcome {
    let (mut ws_out, mut ws_in) = socket.split();
    let mut to_node = ToNode {
        client,
        subject: subject::session_to_node(&spec.node_id, spec.session_id),
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
    let mut pending_resize: Option<TerminalSize> = None;
    let mut resizes_this_second = 0u32;
    let mut second_started = Instant::now();
    let mut exit: Option<(Option<i32>, Option<i32>)> = None;
    let is_exec = matches!(spec.kind, RelayKind::Exec { .. });

    let end: End = loop {
        tokio::select! {
            message = ws_in.next(), if window.room() > 0 => {
                let bytes = match message {
                    None | Some(Ok(Message::Close(_))) => {
                        break End::by_client("client_closed", CLOSE_NORMAL, "the client closed the session");
                    }
                    Some(Err(e)) => {
                        let text = e.to_string();
                        if text.contains("too long") || text.contains("Space limit") {
                            break End::by_client("message_too_big", CLOSE_TOO_BIG, format!(
                                "a message over {} bytes", MAX_SESSION_MESSAGE_BYTES * 16));
                        }
                        break End::by_client("client_closed", CLOSE_NORMAL, format!("the connection failed: {text}"));
                    }
                    Some(Ok(Message::Binary(bytes))) => bytes,
                    Some(Ok(Message::Text(_))) => {
                        break End::by_client("text_message", CLOSE_UNSUPPORTED,
                            "text messages are not part of the protocol: send binary messages, the channel first");
                    }
                    Some(Ok(_)) => continue,
                };
                if bytes.len() > MAX_SESSION_MESSAGE_BYTES {
                    break End::by_client("message_too_big", CLOSE_TOO_BIG, format!(
                        "a message of {} bytes, over the {MAX_SESSION_MESSAGE_BYTES} allowed", bytes.len()));
                }
                let Some((&channel, body)) = bytes.split_first() else { continue };
                match (spec.kind, channel) {
                    (RelayKind::Exec { stdin: true }, CHANNEL_STDIN) | (RelayKind::PortForward, CHANNEL_DATA) => {
                        if body.is_empty() { continue; }
                        throttle_in.pass(body.len()).await;
                        outcome.bytes_in += body.len() as u64;
                        last_data = Instant::now();
                        let frame = Frame::Data { stream: Stream::Stdin, bytes: body.to_vec() };
                        window.spend(frame.window_cost());
                        to_node.send(frame).await;
                    }
                    (RelayKind::Exec { stdin: false }, CHANNEL_STDIN) => {
                        break End::by_client("stdin_not_open", CLOSE_POLICY,
                            "this exec was opened without stdin (stdin=true opens it)");
                    }
                    (RelayKind::Exec { .. }, CHANNEL_RESIZE) => {
                        if second_started.elapsed() >= Duration::from_secs(1) {
                            second_started = Instant::now();
                            resizes_this_second = 0;
                        }
                        resizes_this_second += 1;
                        if resizes_this_second > MAX_RESIZES_PER_S {
                            break End::by_client("resize_flood", CLOSE_POLICY, format!(
                                "resize flood: over {MAX_RESIZES_PER_S} resizes in a second"));
                        }
                        match serde_json::from_slice::<TerminalSize>(body) {
                            Ok(size) => pending_resize = Some(size),
                            Err(e) => break End::by_client("bad_resize", CLOSE_POLICY, format!(
                                "a resize is {{\"Width\":COLS,\"Height\":ROWS}}: {e}")),
                        }
                    }
                    (_, CHANNEL_CLOSE) => {
                        to_node.send(Frame::Control(Control::Eof { stream: Stream::Stdin })).await;
                    }
                    (_, other) => {
                        break End::by_client("unknown_channel", CLOSE_POLICY, format!("unknown channel {other}"));
                    }
                }
            }
            message = from_node.next() => {
                let Some(message) = message else {
                    break End { reason: "bus_lost".into(), code: CLOSE_INTERNAL,
                        message: "the gateway lost its subscription to the node".into(), tell_node: true };
                };
                last_heard = Instant::now();
                let frame = match incoming.decode(&message.payload) {
                    Ok(frame) => frame,
                    Err(e) => break End { reason: "frames_lost".into(), code: CLOSE_INTERNAL, message: e, tell_node: true },
                };
                match frame {
                    Frame::Data { stream, bytes } => {
                        throttle_out.pass(bytes.len()).await;
                        let channel = match (is_exec, stream) {
                            (true, Stream::Stderr) => CHANNEL_STDERR,
                            (true, _) => CHANNEL_STDOUT,
                            (false, _) => CHANNEL_DATA,
                        };
                        let cost = Frame::Data { stream, bytes: Vec::new() }.window_cost() + bytes.len() as u32;
                        outcome.bytes_out += bytes.len() as u64;
                        last_data = Instant::now();
                        let mut message = Vec::with_capacity(bytes.len() + 1);
                        message.push(channel);
                        message.extend_from_slice(&bytes);
                        let sent = tokio::time::timeout(
                            spec.client_read_timeout,
                            ws_out.send(Message::Binary(message.into())),
                        ).await;
                        match sent {
                            Ok(Ok(())) => {}
                            Ok(Err(_)) => break End::by_client("client_closed", CLOSE_NORMAL, "the connection failed"),
                            Err(_) => break End::by_client("client_not_reading", CLOSE_POLICY, format!(
                                "the client took nothing for {} s", spec.client_read_timeout.as_secs())),
                        }
                        if let Some(bytes) = credit_back.consumed(cost) {
                            to_node.send(Frame::Control(Control::Credit { bytes })).await;
                        }
                    }
                    Frame::Control(Control::Credit { bytes }) => window.credit(bytes),
                    Frame::Control(Control::Eof { .. }) => {
                        let _ = ws_out.send(Message::Binary(vec![CHANNEL_CLOSE, CHANNEL_DATA].into())).await;
                    }
                    Frame::Control(Control::Exit { code, signal }) => exit = Some((code, signal)),
                    Frame::Control(Control::Close { reason, message }) => {
                        let code = match reason.as_str() {
                            "exited" | "closed" => CLOSE_NORMAL,
                            "lease_ended" => CLOSE_GOING_AWAY,
                            _ => CLOSE_INTERNAL,
                        };
                        break End { reason, code, message, tell_node: false };
                    }
                    Frame::Control(Control::Ping) => to_node.send(Frame::Control(Control::Pong)).await,
                    Frame::Control(_) => {}
                }
            }
            _ = ping.tick() => {
                to_node.send(Frame::Control(Control::Ping)).await;
            }
            _ = tick.tick() => {
                if last_heard.elapsed() > Duration::from_millis(SILENCE_LIMIT_MS) {
                    break End { reason: "node_silent".into(), code: CLOSE_INTERNAL, message: format!(
                        "node {} stopped answering (nothing for {} s)", spec.node_id, SILENCE_LIMIT_MS / 1000), tell_node: true };
                }
                if last_data.elapsed() > spec.idle_timeout {
                    break End::by_client("idle", CLOSE_NORMAL, format!(
                        "idle for {} s", spec.idle_timeout.as_secs()));
                }
                if let Some(size) = pending_resize.take() {
                    to_node.send(Frame::Control(Control::Resize { cols: size.width, rows: size.height })).await;
                }
                if let Some(bytes) = credit_back.flush() {
                    to_node.send(Frame::Control(Control::Credit { bytes })).await;
                }
            }
        }
    };
    if end.tell_node {
        to_node.close(&end.reason, &end.message).await;
    }
    let _ = from_node.unsubscribe().await;
    let exit_code = exit.and_then(|(code, signal)| code.or(signal.map(|s| 128 + s)));
    if is_exec {
        let status = match exit_code {
            Some(code) if end.reason == "exited" => ExecStatus::exited(code),
            _ => ExecStatus::failed(&end.reason, end.message.clone()),
        };
        let mut message = vec![CHANNEL_STATUS];
        message.extend(serde_json::to_vec(&status).expect("a status serializes"));
        let _ = tokio::time::timeout(
            spec.client_read_timeout,
            ws_out.send(Message::Binary(message.into())),
        )
        .await;
    } else if end.code != CLOSE_NORMAL {
        let mut message = vec![CHANNEL_ERROR];
        message.extend(end.message.as_bytes());
        let _ = tokio::time::timeout(
            spec.client_read_timeout,
            ws_out.send(Message::Binary(message.into())),
        )
        .await;
    }
    // A close reason is at most 123 bytes.
    let mut reason = end.message.clone();
    while reason.len() > 123 {
        reason.pop();
    }
    let _ = tokio::time::timeout(
        spec.client_read_timeout,
        ws_out.send(Message::Close(Some(CloseFrame {
            code: end.code,
            reason: reason.into(),
        }))),
    )
    .await;
    outcome.exit_code = exit_code;
    outcome.ended_by = end.reason;
    outcome
}
