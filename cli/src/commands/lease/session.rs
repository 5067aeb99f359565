//! `lh lease exec` and `lh lease shell`: a command in a lease's workload
//! over one WebSocket in the Kubernetes channel style (docs/adr/030): this
//! stdin to it, its stdout and stderr here, and its exit code as `lh`'s.

use std::io::{IsTerminal as _, Read as _};

use anyhow::Context as _;
use futures::{SinkExt as _, StreamExt as _};
use lh_rpc::http::sessions::{
    ExecStatus, TerminalSize, CHANNEL_RESIZE, CHANNEL_STATUS, CHANNEL_STDERR, CHANNEL_STDIN,
    CHANNEL_STDOUT, EXEC_SUBPROTOCOL,
};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

use super::wire::{self, Session, MAX_FRAME_DATA_BYTES};
use crate::args::{LeaseExec, LeaseShell};
use crate::client::Gateway;
use crate::error::CliError;
use crate::output::Out;
use crate::terminal::{self, RawMode};

/// Exit code: the session ended without the command's exit code: the
/// gateway closed it or the connection was lost, or the command could not
/// run or did not end by itself. 255, as `ssh` says the same.
pub const EXIT_SESSION_ERROR: i32 = 255;
/// Exit code: Ctrl-C ended the session (128 + SIGINT, as a shell says it).
pub const EXIT_INTERRUPTED: i32 = 130;
/// Exit code: SIGTERM ended the session (128 + SIGTERM).
pub const EXIT_TERMINATED: i32 = 143;

/// What `lease shell` runs: a login bash where the image has one, else
/// the POSIX shell every image has.
pub const SHELL_COMMAND: [&str; 3] = [
    "sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi",
];

/// Messages of stdin waiting for the WebSocket: with the reader's chunk,
/// at most 5 x 64 KiB read ahead of what the gateway took.
const STDIN_QUEUE_MESSAGES: usize = 4;

const STDIN_FD: i32 = libc::STDIN_FILENO;

/// What to run and how.
#[derive(Debug, Clone)]
pub(crate) struct ExecRequest<'a> {
    pub lease_id: &'a str,
    pub command: &'a [String],
    /// Forward this process's stdin.
    pub stdin: bool,
    /// A terminal for the command, this one raw.
    pub tty: bool,
    /// An operator's reason for entering a tenant's lease (the trail
    /// keeps it; the gateway asks operators for one).
    pub reason: Option<&'a str>,
    /// A lease across nodes: the member to enter (default the first).
    pub node: Option<&'a str>,
}

/// `lease exec`.
pub(super) async fn exec(
    gw: &Gateway,
    args: &LeaseExec,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    let mut tty = args.tty;
    if tty && !args.stdin {
        let _ = writeln!(
            err,
            "warning: --tty needs --stdin (-i), whose keys it would carry: running without a terminal"
        );
        tty = false;
    } else if tty && !std::io::stdin().is_terminal() {
        let _ = writeln!(
            err,
            "warning: stdin is not a terminal: running without one (drop -t to silence this)"
        );
        tty = false;
    }
    let request = ExecRequest {
        lease_id: &args.id,
        command: &args.command,
        stdin: args.stdin,
        tty,
        reason: args.reason.as_deref(),
        node: args.node.as_deref(),
    };
    run(gw, &request, out, err).await
}

/// `lease shell`.
pub(super) async fn shell(
    gw: &Gateway,
    args: &LeaseShell,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    if !std::io::stdin().is_terminal() {
        return Err(CliError::Usage(format!(
            "`lh lease shell` needs a terminal, and stdin is not one: to feed a shell from a \
             pipe or file, use `lh lease exec -i {} -- sh`",
            args.id
        ))
        .into());
    }
    let command: Vec<String> = SHELL_COMMAND.iter().map(|s| s.to_string()).collect();
    let request = ExecRequest {
        lease_id: &args.id,
        command: &command,
        stdin: true,
        tty: true,
        reason: args.reason.as_deref(),
        node: args.node.as_deref(),
    };
    run(gw, &request, out, err).await
}

/// Runs `request` and returns the exit code `lh` should have. A refused
/// upgrade is an `Err` (the gateway's problem); everything after it is a
/// code, with the reason on `err`.
pub(crate) async fn run(
    gw: &Gateway,
    request: &ExecRequest<'_>,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    if request.command.is_empty() {
        return Err(CliError::Usage("no command to run".into()).into());
    }
    let size = if request.tty {
        terminal::size(STDIN_FD)
    } else {
        None
    };
    let query = exec_query(request, size);
    let query: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let session = wire::open(
        gw,
        &["v1", "leases", request.lease_id, "exec"],
        &query,
        EXEC_SUBPROTOCOL,
    )
    .await?;
    // Raw only once the session is open: a refusal prints on a terminal
    // as it was.
    let raw = match request.tty {
        true => Some(RawMode::enter(STDIN_FD).context("cannot put the terminal in raw mode")?),
        false => None,
    };
    let ended = relay(session, request, size, out, err).await;
    // Back to cooked before saying anything: raw output has no carriage
    // returns.
    drop(raw);
    let ended = ended?;
    Ok(exit_code(&ended, err))
}

/// The exec request's query: the command word by word, whether stdin and
/// a terminal are wanted, and the terminal's size when it is known.
pub(crate) fn exec_query(
    request: &ExecRequest<'_>,
    size: Option<TerminalSize>,
) -> Vec<(&'static str, String)> {
    let mut query: Vec<(&'static str, String)> = request
        .command
        .iter()
        .map(|word| ("command", word.clone()))
        .collect();
    query.push(("stdin", request.stdin.to_string()));
    query.push(("tty", request.tty.to_string()));
    if let Some(reason) = request.reason {
        query.push(("reason", reason.to_string()));
    }
    if let Some(node) = request.node {
        query.push(("node", node.to_string()));
    }
    if let Some(size) = size.filter(|_| request.tty) {
        query.push(("cols", size.width.to_string()));
        query.push(("rows", size.height.to_string()));
    }
    query
}

/// How a session ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// The gateway said how the command ended.
    Status(ExecStatus),
    /// The gateway closed the session before that.
    Closed(Option<CloseFrame>),
    /// The connection broke, or the gateway broke the protocol.
    Lost(String),
    /// A signal here ended it, with this exit code.
    Signalled(i32),
}

/// The exit code for how the session ended, writing why to `err` when it
/// is not the command's own.
pub(crate) fn exit_code(ended: &Ended, err: Out<'_>) -> i32 {
    let why = match ended {
        Ended::Status(status) => match status_exit_code(status) {
            Ok(code) => return code,
            Err(why) => why,
        },
        Ended::Closed(frame) => format!(
            "the gateway closed the session {}",
            wire::describe_close(frame.as_ref())
        ),
        Ended::Lost(why) => why.clone(),
        Ended::Signalled(code) => return *code,
    };
    let _ = writeln!(err, "error: {why}");
    EXIT_SESSION_ERROR
}

/// The command's exit code, or what to say when the status has none a
/// process can exit with.
pub(crate) fn status_exit_code(status: &ExecStatus) -> Result<i32, String> {
    match status.exit_code() {
        Some(code) if (0..=255).contains(&code) => Ok(code),
        Some(code) => Err(format!("the command exited with {code}, not an exit code")),
        None => Err(status
            .message
            .clone()
            .or_else(|| status.reason.clone())
            .unwrap_or_else(|| format!("the command did not end by itself ({})", status.status))),
    }
}

/// Relays until the gateway says how the command ended, closes, or the
/// connection or a signal ends it. Writing to `out` failed (a closed
/// pipe) is an `Err`, after the session is closed.
async fn relay(
    session: Session,
    request: &ExecRequest<'_>,
    size: Option<TerminalSize>,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<Ended> {
    let (sink, mut stream) = session.split();
    let (stdin_tx, stdin_rx) = mpsc::channel(STDIN_QUEUE_MESSAGES);
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    if request.stdin {
        read_stdin(stdin_tx).context("cannot start reading stdin")?;
    } else {
        drop(stdin_tx);
    }
    let writer = write_messages(sink, stdin_rx, control_rx);
    tokio::pin!(writer);
    let mut resized = match request.tty {
        true => Some(signal(SignalKind::window_change()).context("cannot watch for resizes")?),
        false => None,
    };
    // Watched from here on (a `ctrl_c()` future would only start watching
    // when first polled, and a Ctrl-C before that would kill `lh`).
    let mut interrupted = signal(SignalKind::interrupt()).context("cannot watch for Ctrl-C")?;
    let mut terminated = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
    let mut last_size = size;
    let mut writer_done = false;

    let ended = loop {
        tokio::select! {
            message = stream.next() => match message {
                None => break Ended::Lost("the connection to the gateway ended".into()),
                Some(Err(e)) => break Ended::Lost(format!("connection to the gateway lost: {e}")),
                Some(Ok(Message::Binary(message))) => match wire::split_frame(&message) {
                    Some((CHANNEL_STDOUT, data)) => {
                        if let Err(e) = out.write_all(data).and_then(|()| out.flush()) {
                            let _ = control_tx.send(wire::close("stdout closed"));
                            wire::finish(&mut writer, writer_done).await;
                            return Err(e).context("cannot write the command's output");
                        }
                    }
                    Some((CHANNEL_STDERR, data)) => {
                        let _ = err.write_all(data).and_then(|()| err.flush());
                    }
                    Some((CHANNEL_STATUS, json)) => match serde_json::from_slice(json) {
                        Ok(status) => break Ended::Status(status),
                        Err(e) => break Ended::Lost(format!(
                            "the gateway sent a status that is not one ({e})"
                        )),
                    },
                    // An end of output, or a channel newer than this
                    // client: nothing to do with it.
                    Some(_) | None => {}
                },
                Some(Ok(Message::Close(frame))) => break Ended::Closed(frame),
                // Pings are answered by the WebSocket itself; text is not
                // part of the protocol.
                Some(Ok(_)) => {}
            },
            written = &mut writer, if !writer_done => {
                writer_done = true;
                if let Err(e) = written {
                    break Ended::Lost(format!("connection to the gateway lost: {e}"));
                }
            }
            Some(()) = next_signal(&mut resized) => {
                let now = terminal::size(STDIN_FD);
                if let Some(now) = now.filter(|now| Some(*now) != last_size) {
                    last_size = Some(now);
                    let _ = control_tx.send(resize_message(now));
                }
            }
            _ = interrupted.recv() => break Ended::Signalled(EXIT_INTERRUPTED),
            _ = terminated.recv() => break Ended::Signalled(EXIT_TERMINATED),
        }
    };
    if !matches!(ended, Ended::Closed(_) | Ended::Lost(_)) {
        let reason = match ended {
            Ended::Signalled(_) => "interrupted",
            _ => "",
        };
        let _ = control_tx.send(wire::close(reason));
        wire::finish(&mut writer, writer_done).await;
    }
    Ok(ended)
}

async fn next_signal(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

/// `[4, {"Width":..,"Height":..}]`.
pub(crate) fn resize_message(size: TerminalSize) -> Message {
    let json = serde_json::to_vec(&size).unwrap_or_default();
    wire::frame(CHANNEL_RESIZE, &json)
}

/// Sends what comes in, control messages (resizes, the close) before
/// stdin, until the close frame has gone out. Stdin and control each on
/// their own queue so that a resize or the close does not wait behind
/// input the gateway is slow to take.
async fn write_messages(
    mut sink: futures::stream::SplitSink<Session, Message>,
    mut stdin: mpsc::Receiver<Message>,
    mut control: mpsc::UnboundedReceiver<Message>,
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    let mut stdin_open = true;
    loop {
        let message = tokio::select! {
            biased;
            message = control.recv() => match message {
                Some(message) => message,
                None => return Ok(()),
            },
            message = stdin.recv(), if stdin_open => match message {
                Some(message) => message,
                None => {
                    stdin_open = false;
                    continue;
                }
            },
        };
        let last = matches!(message, Message::Close(_));
        sink.send(message).await?;
        if last {
            return Ok(());
        }
    }
}

/// Reads stdin on a thread of its own, a message per read, `[255, 0]` at
/// its end. A thread, not Tokio's stdin: its blocked read could not be
/// cancelled, and the runtime would wait for it (for a key press) on the
/// way out; this thread just ends with the process.
fn read_stdin(tx: mpsc::Sender<Message>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("lh-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; MAX_FRAME_DATA_BYTES];
            loop {
                let (message, last) = match stdin.read(&mut buf) {
                    Ok(0) => (wire::end_of(CHANNEL_STDIN), true),
                    Ok(n) => (wire::frame(CHANNEL_STDIN, &buf[..n]), false),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    // Input that cannot be read has ended as far as the
                    // command can tell.
                    Err(_) => (wire::end_of(CHANNEL_STDIN), true),
                };
                if tx.blocking_send(message).is_err() || last {
                    return;
                }
            }
        })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_rpc::http::sessions::{StatusCause, StatusDetails, REASON_NON_ZERO_EXIT};

    fn code_of(ended: Ended) -> (i32, String) {
        let mut err = Vec::new();
        let code = exit_code(&ended, &mut err);
        (code, String::from_utf8(err).unwrap())
    }

    #[test]
    fn the_command_s_exit_code_is_lh_s() {
        for code in [0, 1, 2, 3, 42, 127, 130, 255] {
            let status = ExecStatus::exited(code);
            assert_eq!(status_exit_code(&status), Ok(code));
            // As it comes over the wire.
            let json = serde_json::to_vec(&status).unwrap();
            let (got, said) = code_of(Ended::Status(serde_json::from_slice(&json).unwrap()));
            assert_eq!((got, said.as_str()), (code, ""));
        }
    }

    #[test]
    fn a_status_without_an_exit_code_says_why_and_exits_255() {
        let (code, said) = code_of(Ended::Status(ExecStatus::failed(
            "NotFound",
            "executable file not found: nvidia-smi",
        )));
        assert_eq!(code, EXIT_SESSION_ERROR);
        assert_eq!(said, "error: executable file not found: nvidia-smi\n");

        let bare = ExecStatus {
            status: "Failure".into(),
            reason: Some("NodeLost".into()),
            message: None,
            details: None,
        };
        assert_eq!(status_exit_code(&bare), Err("NodeLost".into()));
        // A code no process can exit with is not passed on as another.
        for code in [256, -1, 70000] {
            let mut status = ExecStatus::exited(1);
            status.details = Some(StatusDetails {
                causes: vec![StatusCause {
                    reason: "ExitCode".into(),
                    message: code.to_string(),
                }],
            });
            assert_eq!(status.reason.as_deref(), Some(REASON_NON_ZERO_EXIT));
            let why = status_exit_code(&status).unwrap_err();
            assert!(why.contains(&code.to_string()), "{why}");
        }
    }

    #[test]
    fn a_session_that_ends_otherwise_says_how() {
        let (code, said) = code_of(Ended::Closed(Some(CloseFrame {
            code: 1011.into(),
            reason: "node stopped answering".into(),
        })));
        assert_eq!(code, EXIT_SESSION_ERROR);
        assert_eq!(
            said,
            "error: the gateway closed the session 1011 (node stopped answering)\n"
        );
        let (code, said) = code_of(Ended::Lost("connection reset".into()));
        assert_eq!(
            (code, said.as_str()),
            (EXIT_SESSION_ERROR, "error: connection reset\n")
        );
        assert_eq!(
            code_of(Ended::Signalled(EXIT_INTERRUPTED)),
            (130, String::new())
        );
    }

    #[test]
    fn the_query_names_the_command_word_by_word() {
        let command = ["python3".to_string(), "-c".into(), "print(1)".into()];
        let size = Some(TerminalSize {
            width: 120,
            height: 40,
        });
        let request = ExecRequest {
            lease_id: "L1",
            command: &command,
            stdin: true,
            tty: true,
            reason: None,
            node: None,
        };
        let pairs = |q: Vec<(&str, String)>| -> Vec<String> {
            q.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
        };
        assert_eq!(
            pairs(exec_query(&request, size)),
            [
                "command=python3",
                "command=-c",
                "command=print(1)",
                "stdin=true",
                "tty=true",
                "cols=120",
                "rows=40"
            ]
        );
        let request = ExecRequest {
            stdin: false,
            tty: false,
            ..request
        };
        // No terminal, no size to send.
        assert_eq!(
            pairs(exec_query(&request, size)),
            [
                "command=python3",
                "command=-c",
                "command=print(1)",
                "stdin=false",
                "tty=false"
            ]
        );
        // An operator's reason goes with the request.
        let request = ExecRequest {
            reason: Some("ticket 42"),
            ..request
        };
        assert!(pairs(exec_query(&request, size)).contains(&"reason=ticket 42".to_string()));
        // So does the member of a lease across nodes to enter.
        let request = ExecRequest {
            node: Some("node-f"),
            ..request
        };
        assert!(pairs(exec_query(&request, size)).contains(&"node=node-f".to_string()));
    }

    #[test]
    fn a_resize_is_channel_4_then_kubernetes_json() {
        let Message::Binary(bytes) = resize_message(TerminalSize {
            width: 80,
            height: 24,
        }) else {
            panic!("not binary")
        };
        assert_eq!(&bytes[..], b"\x04{\"Width\":80,\"Height\":24}");
    }
}
