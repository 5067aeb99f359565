//! `lh lease port-forward`: a local TCP port relayed to a port inside a
//! lease's workload, one WebSocket per accepted connection (docs/adr/030),
//! so that one slow connection holds back only itself. [`forward`] is the
//! relay alone, for any command that wants a port of a lease here.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use lh_domain::lease::LeaseState;
use lh_rpc::http::sessions::{
    CHANNEL_CLOSE, CHANNEL_DATA, CHANNEL_ERROR, PORT_FORWARD_SUBPROTOCOL,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

use super::wire::{self, Session, MAX_FRAME_DATA_BYTES};
use crate::args::LeasePortForward;
use crate::client::Gateway;
use crate::error::{CliError, EXIT_FAILURE, EXIT_OK};
use crate::output::{write_out, Out};

/// Messages of one connection's data waiting for its WebSocket.
const QUEUE_MESSAGES: usize = 4;
/// The pause after an accept failed for want of descriptors or memory,
/// before trying again.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);

/// `lease port-forward`: checks the lease runs, listens, prints where,
/// and forwards until Ctrl-C or SIGTERM.
pub(super) async fn port_forward(
    gw: &Gateway,
    args: &LeasePortForward,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    // Ask first, as `kubectl port-forward` does: a wrong id or a lease that
    // does not run fails now, not at the first connection.
    let lease = gw.get(&["v1", "leases", &args.id], &[]).await?;
    let state = lease.get("state").cloned().unwrap_or_default();
    if serde_json::from_value::<LeaseState>(state.clone()).ok() != Some(LeaseState::Running) {
        let state = state.as_str().unwrap_or("in no state it names");
        let _ = writeln!(
            err,
            "error: lease {} is {state}, not running: nothing listens in it to forward to \
             (`lh lease get {} --wait running` waits for it)",
            args.id, args.id
        );
        return Ok(EXIT_FAILURE);
    }
    let wanted = SocketAddr::new(args.address, args.ports.local);
    let listener = TcpListener::bind(wanted)
        .await
        .map_err(|e| CliError::Usage(format!("cannot listen on {wanted}: {e}")))?;
    // Watched before anyone is told to connect: a signal handler is in
    // place once `signal` returns.
    let mut interrupted = signal(SignalKind::interrupt())?;
    let mut terminated = signal(SignalKind::terminate())?;
    let stop = async move {
        tokio::select! {
            _ = interrupted.recv() => {}
            _ = terminated.recv() => {}
        }
    };
    let local = listener.local_addr()?;
    write_out(
        out,
        &format!("Forwarding from {local} -> {}\n", args.ports.remote),
    )?;
    let reason = args.reason.as_deref();
    forward(gw, &args.id, listener, args.ports.remote, reason, stop, err).await?;
    Ok(EXIT_OK)
}

/// Relays every connection `listener` accepts to `remote_port` on
/// 127.0.0.1 inside lease `lease_id`'s workload, each over a WebSocket of
/// its own, until `shutdown` resolves; then drops the listener and every
/// connection still open. What ends one connection (a refusal, nothing
/// listening there, a lost session) is written to `err` as
/// `error: <local address> -> <remote port>: <why>` and ends only that one.
/// `reason`: an operator's, sent with each connection (the trail keeps it).
/// Fails only when the listener does.
pub async fn forward(
    gw: &Gateway,
    lease_id: &str,
    listener: TcpListener,
    remote_port: u16,
    reason: Option<&str>,
    shutdown: impl Future<Output = ()>,
    err: Out<'_>,
) -> io::Result<()> {
    let local = listener.local_addr()?;
    let (report_tx, mut reports) = mpsc::unbounded_channel::<String>();
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    let mut report = |why: &str| {
        let _ = writeln!(err, "error: {local} -> {remote_port}: {why}");
        let _ = err.flush();
    };
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => {
                    let gw = gw.clone();
                    let lease_id = lease_id.to_string();
                    let reason = reason.map(str::to_string);
                    let report_tx = report_tx.clone();
                    connections.spawn(async move {
                        let reason = reason.as_deref();
                        if let Err(why) = relay(&gw, &lease_id, remote_port, reason, socket).await {
                            let _ = report_tx.send(why);
                        }
                    });
                }
                Err(e) if accept_may_recover(&e) => {
                    report(&format!("cannot accept a connection: {e}"));
                    tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                }
                Err(e) => return Err(e),
            },
            Some(why) = reports.recv() => report(&why),
            // Reaped as they end, so the set holds only open ones.
            Some(_) = connections.join_next() => {}
        }
    }
    drop(listener);
    connections.shutdown().await;
    while let Ok(why) = reports.try_recv() {
        report(&why);
    }
    Ok(())
}

/// Whether an accept failed for this one connection, or for a lack of
/// descriptors or memory that may pass, rather than for the listener.
fn accept_may_recover(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// One connection, both ways at once, until both sides have ended, the
/// gateway closed, or something broke. `Err` is what to tell the user.
async fn relay(
    gw: &Gateway,
    lease_id: &str,
    remote_port: u16,
    reason: Option<&str>,
    socket: TcpStream,
) -> Result<(), String> {
    let port = remote_port.to_string();
    let mut query = vec![("port", port.as_str())];
    if let Some(reason) = reason {
        query.push(("reason", reason));
    }
    let session = wire::open(
        gw,
        &["v1", "leases", lease_id, "port-forward"],
        &query,
        PORT_FORWARD_SUBPROTOCOL,
    )
    .await
    .map_err(|e| e.to_string())?;
    let _ = socket.set_nodelay(true);
    let (from_local, to_local) = socket.into_split();
    let (sink, stream) = session.split();
    let (tx, rx) = mpsc::channel(QUEUE_MESSAGES);
    let (remote_ended_tx, mut remote_ended) = oneshot::channel();
    let closer = tx.clone();

    let writer = write_messages(sink, rx);
    let up = local_to_gateway(from_local, tx);
    let down = gateway_to_local(stream, to_local, remote_ended_tx);
    tokio::pin!(writer, up, down);
    let (mut local_ended, mut remote_has_ended, mut writer_done) = (false, false, false);
    let outcome = loop {
        if local_ended && remote_has_ended {
            break Ok(());
        }
        tokio::select! {
            ended = &mut up, if !local_ended => match ended {
                Up::Ended => local_ended = true,
                // The writer's own branch says why.
                Up::GatewayGone => local_ended = true,
                // The local side reset: its peer went away, nothing to
                // say about it.
                Up::Reset => break Ok(()),
            },
            // Only a sent `()`: the sender dropped means `down` ended, and
            // its branch, ready too, says how.
            Ok(()) = &mut remote_ended, if !remote_has_ended => remote_has_ended = true,
            ended = &mut down => {
                return match ended {
                    Down::Closed { frame, remote_ended } => {
                        let both_ended = local_ended && (remote_has_ended || remote_ended);
                        closed_early(frame.as_ref(), both_ended)
                    }
                    Down::Ended if local_ended && remote_has_ended => Ok(()),
                    Down::Ended => Err("the connection to the gateway ended".into()),
                    Down::LocalGone => {
                        let _ = closer.try_send(wire::close("local connection closed"));
                        wire::finish(&mut writer, writer_done).await;
                        Ok(())
                    }
                    Down::Failed(why) => {
                        let _ = closer.try_send(wire::close(""));
                        wire::finish(&mut writer, writer_done).await;
                        Err(why)
                    }
                };
            }
            written = &mut writer, if !writer_done => {
                writer_done = true;
                if let Err(e) = written {
                    break Err(format!("connection to the gateway lost: {e}"));
                }
            }
        }
    };
    let _ = closer.try_send(wire::close(""));
    wire::finish(&mut writer, writer_done).await;
    outcome
}

/// What a close frame from the gateway means for the user: nothing when
/// it is the normal end, else its code and reason.
fn closed_early(frame: Option<&CloseFrame>, both_ended: bool) -> Result<(), String> {
    match frame {
        Some(frame)
            if frame.code == CloseCode::Normal && (both_ended || frame.reason.is_empty()) =>
        {
            Ok(())
        }
        None if both_ended => Ok(()),
        frame => Err(format!(
            "the gateway closed the connection {}",
            wire::describe_close(frame)
        )),
    }
}

/// Sends what comes in until the close frame has gone out.
async fn write_messages(
    mut sink: futures::stream::SplitSink<Session, Message>,
    mut rx: mpsc::Receiver<Message>,
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    while let Some(message) = rx.recv().await {
        let last = matches!(message, Message::Close(_));
        sink.send(message).await?;
        if last {
            break;
        }
    }
    Ok(())
}

/// How the local side's bytes ended.
#[derive(Debug)]
enum Up {
    /// At its end of data, `[255, 0]` sent after them.
    Ended,
    /// The local side reset.
    Reset,
    /// The writer stopped taking messages: the WebSocket broke.
    GatewayGone,
}

/// The local side's bytes to the gateway, `[255, 0]` at their end.
async fn local_to_gateway(mut from: OwnedReadHalf, to: mpsc::Sender<Message>) -> Up {
    let mut buf = vec![0u8; MAX_FRAME_DATA_BYTES];
    loop {
        let message = match from.read(&mut buf).await {
            Ok(0) => wire::end_of(CHANNEL_DATA),
            Ok(n) => wire::frame(CHANNEL_DATA, &buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Up::Reset,
        };
        let last = matches!(&message, Message::Binary(b) if b[0] == CHANNEL_CLOSE);
        if to.send(message).await.is_err() {
            return Up::GatewayGone;
        }
        if last {
            return Up::Ended;
        }
    }
}

/// How the gateway's side of a connection ended.
#[derive(Debug)]
enum Down {
    /// A close frame, after the end of the gateway's data or not (the
    /// close may come before the select has seen `remote_ended`).
    Closed {
        frame: Option<CloseFrame>,
        remote_ended: bool,
    },
    /// The WebSocket ended without one.
    Ended,
    /// The local side stopped taking bytes.
    LocalGone,
    /// An error from the gateway, or the connection to it broke.
    Failed(String),
}

/// The gateway's bytes to the local side; at their end (`[255, 0]`) the
/// local side's write half is shut, and `remote_ended` told, while reading
/// goes on for a close or an error.
async fn gateway_to_local(
    mut from: futures::stream::SplitStream<Session>,
    mut to: OwnedWriteHalf,
    remote_ended: oneshot::Sender<()>,
) -> Down {
    let mut remote_ended = Some(remote_ended);
    while let Some(message) = from.next().await {
        let message = match message {
            Ok(Message::Binary(message)) => message,
            Ok(Message::Close(frame)) => {
                return Down::Closed {
                    frame,
                    remote_ended: remote_ended.is_none(),
                }
            }
            Ok(_) => continue,
            Err(e) => return Down::Failed(format!("connection to the gateway lost: {e}")),
        };
        match wire::split_frame(&message) {
            Some((CHANNEL_DATA, data)) => {
                if to.write_all(data).await.is_err() {
                    return Down::LocalGone;
                }
            }
            Some((CHANNEL_CLOSE, _)) => {
                let _ = to.shutdown().await;
                if let Some(tell) = remote_ended.take() {
                    let _ = tell.send(());
                }
            }
            Some((CHANNEL_ERROR, text)) => {
                return Down::Failed(String::from_utf8_lossy(text).into_owned());
            }
            // A channel newer than this client.
            Some(_) | None => {}
        }
    }
    Down::Ended
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close_frame(code: u16, reason: &str) -> CloseFrame {
        CloseFrame {
            code: CloseCode::from(code),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_normal_close_is_quiet_and_others_are_told() {
        assert_eq!(closed_early(Some(&close_frame(1000, "")), false), Ok(()));
        assert_eq!(closed_early(Some(&close_frame(1000, "done")), true), Ok(()));
        assert_eq!(closed_early(None, true), Ok(()));
        let idle = closed_early(Some(&close_frame(1000, "idle for 1800 s")), false).unwrap_err();
        assert!(idle.contains("1000 (idle for 1800 s)"), "{idle}");
        let gone = closed_early(Some(&close_frame(1001, "lease ended")), true).unwrap_err();
        assert!(gone.contains("1001 (lease ended)"), "{gone}");
        let none = closed_early(None, false).unwrap_err();
        assert!(none.contains("without a status"), "{none}");
    }

    #[test]
    fn only_a_passing_accept_failure_is_retried() {
        assert!(accept_may_recover(&io::Error::from_raw_os_error(
            libc::EMFILE
        )));
        assert!(accept_may_recover(&io::Error::from(
            io::ErrorKind::ConnectionAborted
        )));
        assert!(!accept_may_recover(&io::Error::from_raw_os_error(
            libc::EBADF
        )));
        assert!(!accept_may_recover(&io::Error::from_raw_os_error(
            libc::EINVAL
        )));
    }
}
