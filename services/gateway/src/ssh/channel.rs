//! One SSH channel as a session's client side (docs/adr/030): a session
//! channel's shell, command or sftp subsystem, or a `direct-tcpip` channel
//! (`ssh -L`), relayed to the lease's node like a WebSocket.

use lh_events::{Actor, SessionKind, SessionTransport};
use lh_rpc::session::{OpenKind, Stream, TtySize};
use russh::server::Msg;
use russh::{Channel, ChannelMsg};

use crate::http::ApiContext;
use crate::sessions::open::{self, Opening};
use crate::sessions::relay::{ClientSide, Ending, FromClient};

/// A login shell: bash where the image has it, else sh.
pub const SHELL_COMMAND: [&str; 3] = [
    "sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi",
];
/// The sftp subsystem: OpenSSH's server wherever the image keeps it.
pub const SFTP_COMMAND: [&str; 3] = [
    "sh",
    "-c",
    "for p in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server /usr/lib/ssh/sftp-server /usr/libexec/sftp-server; do [ -x \"$p\" ] && exec \"$p\"; done; echo 'this image has no sftp-server (Debian: openssh-sftp-server)' >&2; exit 127",
];
/// The exit status a client sees when the session ended without one.
const EXIT_SESSION_FAILED: u32 = 255;
/// Terminal sizes beyond this are not terminals.
const MAX_TERMINAL_CELLS: u32 = 10_000;

/// Who signed in, and into which lease.
#[derive(Debug, Clone)]
pub struct SignedIn {
    pub actor: Actor,
    pub lease_id: uuid::Uuid,
    pub key_fingerprint: String,
    /// For a lease across nodes, the member the user named
    /// (`<lease>+<node>`); `None`: the first.
    pub member: Option<String>,
}

struct SshClient {
    channel: Channel<Msg>,
    tty: bool,
    port_forward: bool,
}

fn cells(n: u32) -> u16 {
    n.clamp(1, MAX_TERMINAL_CELLS) as u16
}

impl ClientSide for SshClient {
    async fn recv(&mut self) -> FromClient {
        loop {
            return match self.channel.wait().await {
                Some(ChannelMsg::Data { data }) => FromClient::Data(data.to_vec()),
                Some(ChannelMsg::Eof) => FromClient::Eof,
                Some(ChannelMsg::WindowChange {
                    col_width,
                    row_height,
                    ..
                }) => FromClient::Resize {
                    cols: cells(col_width),
                    rows: cells(row_height),
                },
                Some(ChannelMsg::Close) | None => FromClient::Closed,
                Some(_) => continue,
            };
        }
    }

    async fn send(&mut self, stream: Stream, bytes: bytes::Bytes) -> Result<(), ()> {
        let sent = if stream == Stream::Stderr && !self.tty {
            self.channel.extended_data(1, &bytes[..]).await
        } else {
            self.channel.data(&bytes[..]).await
        };
        sent.map_err(|_| ())
    }

    async fn eof(&mut self) {
        let _ = self.channel.eof().await;
    }

    async fn finish(self, ending: &Ending) {
        if !self.port_forward {
            if !ending.exited() && ending.reason != "client_closed" {
                let line = format!("leasehold: {}\r\n", ending.message);
                let _ = self.channel.extended_data(1, line.as_bytes()).await;
            }
            let status = match ending.exit_code {
                Some(code) if ending.exited() => code as u32 & 0xff,
                _ => EXIT_SESSION_FAILED,
            };
            let _ = self.channel.exit_status(status).await;
        }
        let _ = self.channel.eof().await;
        let _ = self.channel.close().await;
    }
}

/// A session channel: waits for its request (after an optional pty),
/// opens the session at the node and relays it. A refusal is written to
/// the channel's stderr with exit status 255, as OpenSSH does.
pub async fn run_session(mut channel: Channel<Msg>, ctx: ApiContext, who: SignedIn) {
    let mut tty: Option<TtySize> = None;
    let (command, kind) = loop {
        match channel.wait().await {
            Some(ChannelMsg::RequestPty {
                col_width,
                row_height,
                ..
            }) => {
                tty = Some(TtySize {
                    cols: cells(col_width),
                    rows: cells(row_height),
                })
            }
            Some(ChannelMsg::RequestShell { .. }) => {
                break (SHELL_COMMAND.map(String::from).to_vec(), SessionKind::Shell)
            }
            Some(ChannelMsg::Exec { command, .. }) => {
                let command = String::from_utf8_lossy(&command).into_owned();
                let kind = if tty.is_some() {
                    SessionKind::Shell
                } else {
                    SessionKind::Exec
                };
                break (vec!["sh".into(), "-c".into(), command], kind);
            }
            Some(ChannelMsg::RequestSubsystem { name, .. }) if name == "sftp" => {
                // sftp speaks binary on stdin and stdout: never a terminal.
                tty = None;
                break (SFTP_COMMAND.map(String::from).to_vec(), SessionKind::Exec);
            }
            Some(ChannelMsg::RequestSubsystem { name, .. }) => {
                let line = format!("leasehold: no subsystem {name:?} (sftp is served)\r\n");
                let _ = channel.extended_data(1, line.as_bytes()).await;
                let _ = channel.exit_status(EXIT_SESSION_FAILED).await;
                let _ = channel.close().await;
                return;
            }
            Some(ChannelMsg::Close) | None => return,
            Some(_) => {}
        }
    };
    let client = SshClient {
        channel,
        tty: tty.is_some(),
        port_forward: false,
    };
    let opening = OpenKind::Exec {
        command,
        tty,
        stdin: true,
    };
    relay(ctx, who, opening, kind, client).await;
}

/// A `direct-tcpip` channel (`ssh -L`), accepted by the caller once the
/// node has connected.
pub async fn run_forward(channel: Channel<Msg>, ctx: ApiContext, opened: open::Opened) {
    let client = SshClient {
        channel,
        tty: false,
        port_forward: true,
    };
    opened.relay(&ctx.bus, client).await;
}

/// Opens the session for a signed-in client: the lease as it is now, its
/// tenant's still (a key removed meanwhile is not re-checked here: a
/// connection outlives neither its lease nor the idle limit).
pub async fn open_for(
    ctx: &ApiContext,
    who: &SignedIn,
    kind: OpenKind,
    session_kind: SessionKind,
) -> Result<open::Opened, crate::http::ApiError> {
    let lease = crate::http::leases::lookup_lease(ctx, who.lease_id)
        .await?
        .ok_or_else(|| crate::http::ApiError::not_found(format!("no lease {}", who.lease_id)))?
        .lease
        .clone();
    open::open(
        &ctx.bus,
        &ctx.sessions,
        Opening {
            actor: who.actor.clone(),
            lease,
            kind,
            session_kind,
            transport: SessionTransport::Ssh,
            reason: None,
            ssh_key_fingerprint: Some(who.key_fingerprint.clone()),
            member: who.member.clone(),
        },
    )
    .await
}

async fn relay(
    ctx: ApiContext,
    who: SignedIn,
    kind: OpenKind,
    session_kind: SessionKind,
    client: SshClient,
) {
    match open_for(&ctx, &who, kind, session_kind).await {
        Ok(opened) => {
            opened.relay(&ctx.bus, client).await;
        }
        Err(e) => {
            let ending = Ending::new("refused", e.status.as_u16(), e.detail.clone());
            client.finish(&ending).await;
        }
    }
}
