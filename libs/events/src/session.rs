//! Sessions into a lease (docs/adr/030): an exec, a shell or a forwarded
//! port, relayed by the gateway to the lease's node. The trail says who
//! opened one into which lease, when, for how long and how many bytes
//! went each way; never the command's text or the bytes themselves.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What a session does inside the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    /// A command, without a terminal.
    Exec,
    /// A command on a terminal (`lh lease shell`, `exec -t`).
    Shell,
    /// One TCP connection to a port inside the lease.
    PortForward,
}

/// How the client reached the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionTransport {
    /// The REST API's WebSockets (`lh lease exec`, the console).
    #[default]
    WebSocket,
    /// The gateway's SSH endpoint: one session per channel.
    Ssh,
    /// A lease's web page in a browser, through the gateway: one session
    /// per connection to the lease's port, kept across requests.
    Http,
}

impl SessionTransport {
    pub fn is_web_socket(&self) -> bool {
        *self == SessionTransport::WebSocket
    }
}

/// A session into a lease was opened. The envelope's actor says who: the
/// lease's tenant, or an operator with `reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionOpened {
    pub session_id: Uuid,
    pub lease_id: Uuid,
    pub tenant_id: Uuid,
    pub node_id: String,
    /// The lease's placement the session entered: a session ends when the
    /// lease moves.
    pub placement: u64,
    pub kind: SessionKind,
    #[serde(default, skip_serializing_if = "SessionTransport::is_web_socket")]
    pub transport: SessionTransport,
    /// The key an SSH client signed in with (its SHA-256 fingerprint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_fingerprint: Option<String>,
    /// The port forwarded to, for a port forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Why an operator entered a tenant's lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The gateway replica that relayed it.
    pub gateway: String,
}

/// A session into a lease ended: how long it lasted and how much it
/// carried, never what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionEnded {
    pub session_id: Uuid,
    pub lease_id: Uuid,
    pub tenant_id: Uuid,
    pub opened_at: DateTime<Utc>,
    pub duration_ms: u64,
    /// Bytes from the client into the lease (stdin, the connection's).
    pub bytes_in: u64,
    /// Bytes from the lease to the client (stdout and stderr, the
    /// connection's).
    pub bytes_out: u64,
    /// The command's exit code, when it exited by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it ended (`exited`, `client_closed`, `idle`, `lease_ended`,
    /// `node_silent`, `client_not_reading`, `message_too_big`,
    /// `unknown_channel`, `resize_flood`, `frames_lost`, ...).
    pub ended_by: String,
}
