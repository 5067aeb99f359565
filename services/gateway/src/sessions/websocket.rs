//! A session's client on a WebSocket, in the Kubernetes channel style
//! (exec) or on the port-forward channels (docs/adr/030): what the client
//! sends becomes [`FromClient`], what the node sends becomes channel
//! messages, and the ending a status (exec) or an error (port forward) and
//! a close frame that names it.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use lh_rpc::http::sessions::{
    ExecStatus, TerminalSize, CHANNEL_CLOSE, CHANNEL_DATA, CHANNEL_ERROR, CHANNEL_RESIZE,
    CHANNEL_STATUS, CHANNEL_STDERR, CHANNEL_STDIN, CHANNEL_STDOUT, MAX_SESSION_MESSAGE_BYTES,
};
use lh_rpc::session::Stream;
use tokio::time::Instant;

use super::relay::{
    ClientSide, Ending, FromClient, CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TOO_BIG, CLOSE_UNSUPPORTED,
};

/// More resizes than this in one second is a flood, not a window dragged.
pub const MAX_RESIZES_PER_S: u32 = 200;
/// The socket takes messages up to this many times the protocol's limit,
/// so that an oversized one is read whole and closed with a reason (1009);
/// only past it does the connection itself fail.
pub const SOCKET_MESSAGE_SLACK: usize = 16;
/// Longest a close frame's reason may be (RFC 6455).
const MAX_CLOSE_REASON_BYTES: usize = 123;

/// What the WebSocket carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channels {
    /// A command; `stdin`: whether the client may send input.
    Exec {
        stdin: bool,
    },
    PortForward,
}

pub struct WebSocketClient {
    out: SplitSink<WebSocket, Message>,
    input: SplitStream<WebSocket>,
    channels: Channels,
    resizes_this_second: u32,
    second_started: Instant,
}

impl WebSocketClient {
    pub fn new(socket: WebSocket, channels: Channels) -> Self {
        let (out, input) = socket.split();
        WebSocketClient {
            out,
            input,
            channels,
            resizes_this_second: 0,
            second_started: Instant::now(),
        }
    }

    async fn message(&mut self, channel: u8, bytes: &[u8]) -> Result<(), ()> {
        let mut message = Vec::with_capacity(bytes.len() + 1);
        message.push(channel);
        message.extend_from_slice(bytes);
        self.out
            .send(Message::Binary(message.into()))
            .await
            .map_err(|_| ())
    }
}

impl ClientSide for WebSocketClient {
    async fn recv(&mut self) -> FromClient {
        loop {
            let bytes = match self.input.next().await {
                None | Some(Ok(Message::Close(_))) => return FromClient::Closed,
                Some(Err(e)) => {
                    let text = e.to_string();
                    if text.contains("too long") || text.contains("Space limit") {
                        return FromClient::Refused(Ending::new(
                            "message_too_big",
                            CLOSE_TOO_BIG,
                            format!(
                                "a message over {} bytes",
                                MAX_SESSION_MESSAGE_BYTES * SOCKET_MESSAGE_SLACK
                            ),
                        ));
                    }
                    return FromClient::Closed;
                }
                Some(Ok(Message::Binary(bytes))) => bytes,
                Some(Ok(Message::Text(_))) => {
                    return FromClient::Refused(Ending::new(
                        "text_message",
                        CLOSE_UNSUPPORTED,
                        "text messages are not part of the protocol: send binary messages, the channel first",
                    ))
                }
                Some(Ok(_)) => continue,
            };
            if bytes.len() > MAX_SESSION_MESSAGE_BYTES {
                return FromClient::Refused(Ending::new(
                    "message_too_big",
                    CLOSE_TOO_BIG,
                    format!(
                        "a message of {} bytes, over the {MAX_SESSION_MESSAGE_BYTES} allowed",
                        bytes.len()
                    ),
                ));
            }
            let Some((&channel, body)) = bytes.split_first() else {
                continue;
            };
            return match (self.channels, channel) {
                (Channels::Exec { stdin: true }, CHANNEL_STDIN)
                | (Channels::PortForward, CHANNEL_DATA) => FromClient::Data(body.to_vec()),
                (Channels::Exec { stdin: false }, CHANNEL_STDIN) => {
                    FromClient::Refused(Ending::new(
                        "stdin_not_open",
                        CLOSE_POLICY,
                        "this exec was opened without stdin (stdin=true opens it)",
                    ))
                }
                (Channels::Exec { .. }, CHANNEL_RESIZE) => {
                    if self.second_started.elapsed() >= Duration::from_secs(1) {
                        self.second_started = Instant::now();
                        self.resizes_this_second = 0;
                    }
                    self.resizes_this_second += 1;
                    if self.resizes_this_second > MAX_RESIZES_PER_S {
                        return FromClient::Refused(Ending::new(
                            "resize_flood",
                            CLOSE_POLICY,
                            format!("resize flood: over {MAX_RESIZES_PER_S} resizes in a second"),
                        ));
                    }
                    match serde_json::from_slice::<TerminalSize>(body) {
                        Ok(size) => FromClient::Resize {
                            cols: size.width,
                            rows: size.height,
                        },
                        Err(e) => FromClient::Refused(Ending::new(
                            "bad_resize",
                            CLOSE_POLICY,
                            format!("a resize is {{\"Width\":COLS,\"Height\":ROWS}}: {e}"),
                        )),
                    }
                }
                (_, CHANNEL_CLOSE) => FromClient::Eof,
                (_, other) => FromClient::Refused(Ending::new(
                    "unknown_channel",
                    CLOSE_POLICY,
                    format!("unknown channel {other}"),
                )),
            };
        }
    }

    async fn send(&mut self, stream: Stream, bytes: bytes::Bytes) -> Result<(), ()> {
        let channel = match (self.channels, stream) {
            (Channels::Exec { .. }, Stream::Stderr) => CHANNEL_STDERR,
            (Channels::Exec { .. }, _) => CHANNEL_STDOUT,
            (Channels::PortForward, _) => CHANNEL_DATA,
        };
        self.message(channel, &bytes).await
    }

    async fn eof(&mut self) {
        if self.channels == Channels::PortForward {
            let _ = self.message(CHANNEL_CLOSE, &[CHANNEL_DATA]).await;
        }
    }

    async fn finish(mut self, ending: &Ending) {
        match self.channels {
            Channels::Exec { .. } => {
                let status = match ending.exit_code {
                    Some(code) if ending.exited() => ExecStatus::exited(code),
                    _ => ExecStatus::failed(&ending.reason, ending.message.clone()),
                };
                let json = serde_json::to_vec(&status).expect("a status serializes");
                let _ = self.message(CHANNEL_STATUS, &json).await;
            }
            Channels::PortForward if ending.code != CLOSE_NORMAL => {
                let _ = self.message(CHANNEL_ERROR, ending.message.as_bytes()).await;
            }
            Channels::PortForward => {}
        }
        let mut reason = ending.message.clone();
        while reason.len() > MAX_CLOSE_REASON_BYTES {
            reason.pop();
        }
        let _ = self
            .out
            .send(Message::Close(Some(CloseFrame {
                code: ending.code,
                reason: reason.into(),
            })))
            .await;
    }
}
