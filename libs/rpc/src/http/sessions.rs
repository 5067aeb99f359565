//! The WebSockets of a session into a lease (docs/adr/030): exec and shell
//! in the Kubernetes channel style, port forwarding on channels of its own.
//! One message is one frame: its first byte the channel, the rest the
//! channel's bytes.

use serde::{Deserialize, Serialize};

/// The exec WebSocket's subprotocol (`Sec-WebSocket-Protocol`).
pub const EXEC_SUBPROTOCOL: &str = "v5.channel.k8s.io";
/// The port-forward WebSocket's subprotocol.
pub const PORT_FORWARD_SUBPROTOCOL: &str = "v1.port-forward.leasehold.dev";

/// The subprotocol under which a browser's WebSocket carries its key,
/// base64url without padding after this prefix: a browser cannot set a
/// header on a WebSocket. The name is Kubernetes' API server's, so that
/// clients written for it work unchanged; the gateway never echoes it.
pub const BEARER_SUBPROTOCOL_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// Exec, client to server: the command's standard input.
pub const CHANNEL_STDIN: u8 = 0;
/// Exec, server to client: the command's standard output.
pub const CHANNEL_STDOUT: u8 = 1;
/// Exec, server to client: the command's standard error (none with a TTY,
/// where both are one stream on stdout).
pub const CHANNEL_STDERR: u8 = 2;
/// Exec, server to client: how it ended, an [`ExecStatus`] as JSON, sent
/// once, last.
pub const CHANNEL_STATUS: u8 = 3;
/// Exec, client to server: the terminal's new size, a [`TerminalSize`] as
/// JSON.
pub const CHANNEL_RESIZE: u8 = 4;
/// Either way: `[255, channel]`, the sender has nothing more on
/// `channel` (the client's stdin ended; the forwarded connection's side
/// closed).
pub const CHANNEL_CLOSE: u8 = 255;

/// Port forward, both ways: the connection's bytes.
pub const CHANNEL_DATA: u8 = 0;
/// Port forward, server to client: why the connection ended, as text.
pub const CHANNEL_ERROR: u8 = 1;

/// Most bytes one WebSocket message may carry, its channel byte included;
/// a larger one closes the session (1009).
pub const MAX_SESSION_MESSAGE_BYTES: usize = 64 * 1024 + 1;

/// How a running lease is reached over the gateway's SSH endpoint: in
/// `GET /v1/leases/{id}` as `ssh`, where the endpoint runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SshAccess {
    /// `ssh -p PORT LEASE@HOST`.
    pub command: String,
    /// The endpoint's host key, `SHA256:...` as `ssh` prints it.
    pub host_key_fingerprint: String,
}

/// The terminal's size, as Kubernetes sends it on the resize channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// How an exec ended, as a Kubernetes `Status`: `Success`, or `Failure`
/// with `reason` `NonZeroExitCode` and the code as the first cause's
/// message (`ExitCode`), or another reason when it could not run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecStatus {
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<StatusDetails>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusDetails {
    pub causes: Vec<StatusCause>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCause {
    pub reason: String,
    pub message: String,
}

/// `Failure`'s reason when the command exited non-zero.
pub const REASON_NON_ZERO_EXIT: &str = "NonZeroExitCode";
/// The cause that carries the exit code.
pub const CAUSE_EXIT_CODE: &str = "ExitCode";

impl ExecStatus {
    /// The status of a command that exited with `code` (`128 + n` for a
    /// signal `n`, as a shell says it).
    pub fn exited(code: i32) -> Self {
        if code == 0 {
            return ExecStatus {
                status: "Success".into(),
                reason: None,
                message: None,
                details: None,
            };
        }
        ExecStatus {
            status: "Failure".into(),
            reason: Some(REASON_NON_ZERO_EXIT.into()),
            message: Some(format!(
                "command terminated with non-zero exit code: {code}"
            )),
            details: Some(StatusDetails {
                causes: vec![StatusCause {
                    reason: CAUSE_EXIT_CODE.into(),
                    message: code.to_string(),
                }],
            }),
        }
    }

    /// The status of a session that ended without an exit code.
    pub fn failed(reason: &str, message: impl Into<String>) -> Self {
        ExecStatus {
            status: "Failure".into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            details: None,
        }
    }

    /// The exit code it carries: 0 for `Success`, the code for a
    /// non-zero exit, `None` when the command did not end by itself.
    pub fn exit_code(&self) -> Option<i32> {
        if self.status == "Success" {
            return Some(0);
        }
        if self.reason.as_deref() != Some(REASON_NON_ZERO_EXIT) {
            return None;
        }
        self.details
            .as_ref()?
            .causes
            .iter()
            .find(|c| c.reason == CAUSE_EXIT_CODE)?
            .message
            .parse()
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_code_survives_the_status() {
        for code in [0, 1, 3, 127, 255] {
            let json = serde_json::to_string(&ExecStatus::exited(code)).unwrap();
            let back: ExecStatus = serde_json::from_str(&json).unwrap();
            assert_eq!(back.exit_code(), Some(code), "{json}");
        }
        assert_eq!(ExecStatus::failed("NodeLost", "gone").exit_code(), None);
    }

    #[test]
    fn a_resize_is_what_kubernetes_sends() {
        let size: TerminalSize = serde_json::from_str(r#"{"Width":120,"Height":40}"#).unwrap();
        assert_eq!(
            size,
            TerminalSize {
                width: 120,
                height: 40
            }
        );
    }
}
