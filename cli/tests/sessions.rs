//! `lh lease exec` and `lh lease port-forward` against a stand-in gateway
//! that speaks the session WebSockets of docs/adr/030 (Tokio and
//! tokio-tungstenite, a few lines each): the exit code passed through,
//! stdin to its end, a close without a status, a refusal, Ctrl-C, and two
//! forwarded connections at once, byte for byte. `lh` runs as the real
//! binary, with its own stdin, signals and exit code.

use std::future::Future;
use std::os::fd::AsRawFd as _;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use lh_cli::{EXIT_CLIENT_ERROR, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_SESSION_ERROR};
use lh_rpc::http::sessions::{
    ExecStatus, CHANNEL_CLOSE, CHANNEL_DATA, CHANNEL_ERROR, CHANNEL_STATUS, CHANNEL_STDERR,
    CHANNEL_STDIN, CHANNEL_STDOUT, EXEC_SUBPROTOCOL, MAX_SESSION_MESSAGE_BYTES,
    PORT_FORWARD_SUBPROTOCOL,
};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const KEY: &str = "k-session-test";
/// Longest any one of these tests may take: they hang, not fail, when the
/// CLI misses an end of input or serialises connections.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);

type Ws = WebSocketStream<TcpStream>;
type Handler = Arc<dyn Fn(Upgrade, Ws) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A WebSocket request as the stand-in saw it.
#[derive(Debug, Clone)]
struct Upgrade {
    path: String,
    query: Vec<(String, String)>,
    authorization: Option<String>,
    subprotocol: Option<String>,
}

impl Upgrade {
    fn all(&self, key: &str) -> Vec<String> {
        self.query
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect()
    }

    fn one(&self, key: &str) -> Option<String> {
        self.all(key).into_iter().next()
    }
}

struct StandIn {
    url: String,
    upgrades: Arc<Mutex<Vec<Upgrade>>>,
    key_file: tempfile::NamedTempFile,
}

/// Starts a stand-in gateway: `GET /v1/leases/{id}` answers a lease in
/// `state`; a WebSocket upgrade is refused with `refusal` when given, else
/// accepted with the subprotocol asked for and handed to `handler`.
async fn stand_in<F, Fut>(
    state: &'static str,
    refusal: Option<(u16, &'static str)>,
    handler: F,
) -> StandIn
where
    F: Fn(Upgrade, Ws) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let upgrades = Arc::new(Mutex::new(Vec::new()));
    let handler: Handler = Arc::new(move |u, ws| Box::pin(handler(u, ws)));
    let log = upgrades.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (log, handler) = (log.clone(), handler.clone());
            tokio::spawn(async move {
                if is_upgrade(&stream).await {
                    upgrade(stream, log, handler, refusal).await;
                } else {
                    answer_lease(stream, state).await;
                }
            });
        }
    });
    let mut key_file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut key_file, KEY.as_bytes()).unwrap();
    StandIn {
        url,
        upgrades,
        key_file,
    }
}

/// Whether the request waiting on `stream` is a session's (by its path).
async fn is_upgrade(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 512];
    loop {
        let n = stream.peek(&mut buf).await.unwrap_or(0);
        let head = String::from_utf8_lossy(&buf[..n]);
        if let Some((line, _)) = head.split_once("\r\n") {
            return line.contains("/exec?") || line.contains("/port-forward?");
        }
        if n == 0 || n == buf.len() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn answer_lease(stream: TcpStream, state: &str) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut line = String::new();
    while read.read_line(&mut line).await.unwrap_or(0) > 0 {
        if line == "\r\n" {
            break;
        }
        line.clear();
    }
    let body = serde_json::json!({"id": "L1", "state": state}).to_string();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = write.write_all(head.as_bytes()).await;
    let _ = write.write_all(body.as_bytes()).await;
}

async fn upgrade(
    stream: TcpStream,
    log: Arc<Mutex<Vec<Upgrade>>>,
    handler: Handler,
    refusal: Option<(u16, &'static str)>,
) {
    let seen = Arc::new(Mutex::new(None));
    let seen_in_callback = seen.clone();
    // The callback's type is tungstenite's, its error a whole response.
    #[allow(clippy::result_large_err)]
    let callback = move |request: &Request, mut response: Response| {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let uri = request.uri();
        let query = reqwest::Url::parse(&format!("http://x{uri}"))
            .unwrap()
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let subprotocol = header("sec-websocket-protocol");
        *seen_in_callback.lock().unwrap() = Some(Upgrade {
            path: uri.path().to_string(),
            query,
            authorization: header("authorization"),
            subprotocol: subprotocol.clone(),
        });
        if let Some((status, body)) = refusal {
            let mut refused = ErrorResponse::new(Some(body.to_string()));
            *refused.status_mut() = StatusCode::from_u16(status).unwrap();
            refused.headers_mut().insert(
                "content-type",
                HeaderValue::from_static("application/problem+json"),
            );
            return Err(refused);
        }
        if let Some(subprotocol) = subprotocol {
            response
                .headers_mut()
                .insert("sec-websocket-protocol", subprotocol.parse().unwrap());
        }
        Ok(response)
    };
    let accepted = tokio_tungstenite::accept_hdr_async(stream, callback).await;
    let upgrade = seen.lock().unwrap().clone().expect("the request was read");
    log.lock().unwrap().push(upgrade.clone());
    if let Ok(ws) = accepted {
        handler(upgrade, ws).await;
    }
}

impl StandIn {
    fn upgrades(&self) -> Vec<Upgrade> {
        self.upgrades.lock().unwrap().clone()
    }

    /// `lh` with this gateway and key, stdin, stdout and stderr piped.
    fn lh(&self, args: &[&str]) -> Child {
        Command::new(env!("CARGO_BIN_EXE_lh"))
            .arg("--gateway-url")
            .arg(&self.url)
            .arg("--api-key-file")
            .arg(self.key_file.path())
            .args(args)
            .env_remove("LH_API_KEY")
            .env_remove("LH_GATEWAY_URL")
            .env_remove("LH_API_KEY_FILE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }
}

struct Ran {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

async fn finish(child: Child) -> Ran {
    let out = child.wait_with_output().await.unwrap();
    Ran {
        code: out.status.code().expect("lh exited, not killed"),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn binary(channel: u8, data: &[u8]) -> Message {
    let mut bytes = vec![channel];
    bytes.extend_from_slice(data);
    Message::Binary(bytes.into())
}

fn status_message(status: &ExecStatus) -> Message {
    binary(CHANNEL_STATUS, &serde_json::to_vec(status).unwrap())
}

/// Reads the client's messages until a close or the end, as `(channel,
/// bytes)`; checks none is over the gateway's limit.
async fn next_frame(ws: &mut Ws) -> Option<(u8, Vec<u8>)> {
    loop {
        match ws.next().await? {
            Ok(Message::Binary(bytes)) => {
                assert!(
                    bytes.len() <= MAX_SESSION_MESSAGE_BYTES,
                    "a message of {} bytes",
                    bytes.len()
                );
                let (channel, data) = bytes.split_first().expect("a message has a channel");
                return Some((*channel, data.to_vec()));
            }
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// Bytes that differ from one stream to the next (xorshift from `seed`).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

async fn within<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("the test timed out")
}

fn interrupt(child: &Child) {
    let pid = child.id().expect("lh still runs") as i32;
    // SAFETY: a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
}

#[tokio::test]
async fn exec_exits_with_the_command_s_exit_code() {
    within(async {
        // The stand-in runs `exit N` as a shell would: the code is the
        // command's, read from the request.
        let gw = stand_in("running", None, |upgrade: Upgrade, mut ws: Ws| async move {
            let script = upgrade.all("command").pop().unwrap_or_default();
            let code: i32 = script.trim_start_matches("exit ").parse().unwrap();
            ws.send(binary(CHANNEL_STDOUT, format!("out {code}\n").as_bytes()))
                .await
                .unwrap();
            ws.send(binary(CHANNEL_STDERR, format!("err {code}\n").as_bytes()))
                .await
                .unwrap();
            ws.send(status_message(&ExecStatus::exited(code)))
                .await
                .unwrap();
            while next_frame(&mut ws).await.is_some() {}
        })
        .await;
        for code in [0, 3, 42, 255] {
            let script = format!("exit {code}");
            let ran = finish(gw.lh(&["lease", "exec", "L1", "--", "sh", "-c", &script])).await;
            assert_eq!(ran.code, code, "stderr: {}", ran.stderr);
            assert_eq!(ran.stdout, format!("out {code}\n").as_bytes());
            assert_eq!(ran.stderr, format!("err {code}\n"));
        }
        let upgrade = gw.upgrades().pop().unwrap();
        assert_eq!(upgrade.path, "/v1/leases/L1/exec");
        assert_eq!(upgrade.all("command"), ["sh", "-c", "exit 255"]);
        assert_eq!(upgrade.one("stdin").as_deref(), Some("false"));
        assert_eq!(upgrade.one("tty").as_deref(), Some("false"));
        assert_eq!(upgrade.one("cols"), None);
        assert_eq!(
            upgrade.authorization.as_deref(),
            Some(format!("Bearer {KEY}").as_str())
        );
        assert_eq!(upgrade.subprotocol.as_deref(), Some(EXEC_SUBPROTOCOL));
    })
    .await;
}

#[tokio::test]
async fn a_tty_without_a_terminal_to_carry_is_dropped_with_a_warning() {
    within(async {
        let gw = stand_in("running", None, |_: Upgrade, mut ws: Ws| async move {
            ws.send(status_message(&ExecStatus::exited(0)))
                .await
                .unwrap();
            while next_frame(&mut ws).await.is_some() {}
        })
        .await;
        // No -i, then stdin a pipe: neither has keys for a terminal.
        for args in [
            &["lease", "exec", "-t", "L1", "--", "top"][..],
            &["lease", "exec", "-it", "L1", "--", "top"],
        ] {
            let ran = finish(gw.lh(args)).await;
            assert_eq!(ran.code, EXIT_OK, "stderr: {}", ran.stderr);
            assert!(ran.stderr.starts_with("warning: "), "{}", ran.stderr);
            let upgrade = gw.upgrades().pop().unwrap();
            assert_eq!(upgrade.one("tty").as_deref(), Some("false"), "{args:?}");
            assert_eq!(upgrade.one("cols"), None);
        }
    })
    .await;
}

#[tokio::test]
async fn exec_sends_stdin_to_its_end() {
    within(async {
        // `cat`: everything that came on stdin back on stdout once stdin
        // has ended, and an exit code made of what came.
        let gw = stand_in("running", None, |_: Upgrade, mut ws: Ws| async move {
            let mut input = Vec::new();
            let mut messages = 0;
            loop {
                match next_frame(&mut ws).await {
                    Some((CHANNEL_STDIN, data)) => {
                        input.extend_from_slice(&data);
                        messages += 1;
                    }
                    Some((CHANNEL_CLOSE, data)) => {
                        assert_eq!(data, [CHANNEL_STDIN]);
                        break;
                    }
                    other => panic!("before the end of stdin: {other:?}"),
                }
            }
            assert!(messages > 1, "more than 64 KiB came in one message");
            for chunk in input.chunks(10_000) {
                ws.send(binary(CHANNEL_STDOUT, chunk)).await.unwrap();
            }
            let code = i32::from(input.iter().fold(0u8, |a, b| a.wrapping_add(*b)) % 200) + 1;
            ws.send(status_message(&ExecStatus::exited(code)))
                .await
                .unwrap();
            while next_frame(&mut ws).await.is_some() {}
        })
        .await;
        let input = noise(7, 300_000);
        let mut child = gw.lh(&["lease", "exec", "-i", "L1", "--", "cat"]);
        let mut stdin = child.stdin.take().unwrap();
        let written = input.clone();
        tokio::spawn(async move {
            stdin.write_all(&written).await.unwrap();
            // Dropped: the end of lh's stdin.
        });
        let ran = finish(child).await;
        let expected = i32::from(input.iter().fold(0u8, |a, b| a.wrapping_add(*b)) % 200) + 1;
        assert_eq!(ran.code, expected, "stderr: {}", ran.stderr);
        assert!(ran.stdout == input, "stdout is not stdin");
        let upgrade = gw.upgrades().pop().unwrap();
        assert_eq!(upgrade.one("stdin").as_deref(), Some("true"));
    })
    .await;
}

#[tokio::test]
async fn a_session_closed_without_a_status_exits_255_and_says_why() {
    within(async {
        let gw = stand_in("running", None, |_: Upgrade, mut ws: Ws| async move {
            ws.send(binary(CHANNEL_STDOUT, b"partial\n")).await.unwrap();
            ws.close(Some(CloseFrame {
                code: CloseCode::Error,
                reason: "node stopped answering".into(),
            }))
            .await
            .unwrap();
            while next_frame(&mut ws).await.is_some() {}
        })
        .await;
        let ran = finish(gw.lh(&["lease", "exec", "L1", "--", "sleep", "600"])).await;
        assert_eq!(ran.code, EXIT_SESSION_ERROR, "stderr: {}", ran.stderr);
        assert_eq!(ran.stdout, b"partial\n");
        assert!(
            ran.stderr.contains("1011 (node stopped answering)"),
            "{}",
            ran.stderr
        );
    })
    .await;
}

#[tokio::test]
async fn a_refused_exec_shows_the_gateway_s_problem() {
    within(async {
        let problem = r#"{"type":"about:blank","title":"Lease not running","status":409,"detail":"lease L1 is queued"}"#;
        let gw = stand_in("queued", Some((409, problem)), |_: Upgrade, _: Ws| async {}).await;
        let ran = finish(gw.lh(&["lease", "exec", "L1", "--", "true"])).await;
        assert_eq!(ran.code, EXIT_CLIENT_ERROR, "stderr: {}", ran.stderr);
        assert_eq!(
            ran.stderr,
            "error: Lease not running: lease L1 is queued\n"
        );
        assert!(ran.stdout.is_empty());
    })
    .await;
}

#[tokio::test]
async fn ctrl_c_closes_an_exec_and_exits_130() {
    within(async {
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
        let closed_tx = Arc::new(Mutex::new(Some(closed_tx)));
        let gw = stand_in("running", None, move |_: Upgrade, mut ws: Ws| {
            let closed_tx = closed_tx.clone();
            async move {
                ws.send(binary(CHANNEL_STDOUT, b"started\n")).await.unwrap();
                let close = loop {
                    match ws.next().await {
                        Some(Ok(Message::Close(frame))) => break frame,
                        Some(Ok(_)) => {}
                        _ => break None,
                    }
                };
                if let Some(tx) = closed_tx.lock().unwrap().take() {
                    let _ = tx.send(close);
                }
            }
        })
        .await;
        let mut child = gw.lh(&["lease", "exec", "L1", "--", "sleep", "600"]);
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).await.unwrap();
        assert_eq!(line, "started\n");
        interrupt(&child);
        let ran = finish(child).await;
        assert_eq!(ran.code, EXIT_INTERRUPTED, "stderr: {}", ran.stderr);
        let close = closed_rx.await.unwrap().expect("lh sent a close frame");
        assert_eq!(close.code, CloseCode::Normal);
    })
    .await;
}

/// A pseudo-terminal of `cols` x `rows`: (controller, terminal).
fn pty(cols: u16, rows: u16) -> (std::fs::File, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd as _;
    let (mut controller, mut terminal) = (-1, -1);
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors, owned from here on.
    let rc = unsafe {
        libc::openpty(
            &mut controller,
            &mut terminal,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: fresh descriptors nothing else owns.
    unsafe {
        (
            std::fs::File::from_raw_fd(controller),
            std::os::fd::OwnedFd::from_raw_fd(terminal),
        )
    }
}

fn termios(fd: &impl std::os::fd::AsRawFd) -> libc::termios {
    let mut t = std::mem::MaybeUninit::uninit();
    // SAFETY: filled by tcgetattr when it returns 0, read only then.
    assert_eq!(
        unsafe { libc::tcgetattr(fd.as_raw_fd(), t.as_mut_ptr()) },
        0
    );
    unsafe { t.assume_init() }
}

#[tokio::test]
async fn a_shell_has_this_terminal_raw_follows_its_size_and_gives_it_back() {
    within(async {
        let (frames_tx, mut frames) = tokio::sync::mpsc::unbounded_channel();
        let gw = stand_in("running", None, move |_: Upgrade, mut ws: Ws| {
            let frames_tx = frames_tx.clone();
            async move {
                ws.send(binary(CHANNEL_STDOUT, b"ready\n")).await.unwrap();
                while let Some(frame) = next_frame(&mut ws).await {
                    let stop = frame.0 == CHANNEL_STDIN && frame.1.contains(&b'x');
                    let _ = frames_tx.send(frame);
                    if stop {
                        break;
                    }
                }
                ws.send(status_message(&ExecStatus::exited(0)))
                    .await
                    .unwrap();
                while next_frame(&mut ws).await.is_some() {}
            }
        })
        .await;
        let (mut controller, terminal) = pty(100, 30);
        let before = termios(&terminal);
        let mut child = {
            let mut command = Command::new(env!("CARGO_BIN_EXE_lh"));
            command
                .arg("--gateway-url")
                .arg(&gw.url)
                .arg("--api-key-file")
                .arg(gw.key_file.path())
                .args(["lease", "shell", "L1"])
                .stdin(Stdio::from(terminal.try_clone().unwrap()))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            command.spawn().unwrap()
        };
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).await.unwrap();
        assert_eq!(line, "ready\n");

        let raw = termios(&terminal);
        assert_eq!(raw.c_lflag & (libc::ICANON | libc::ECHO | libc::ISIG), 0);
        // Ctrl-C, alone, no newline: a byte for the remote terminal.
        std::io::Write::write_all(&mut controller, b"\x03").unwrap();
        assert_eq!(frames.recv().await.unwrap(), (CHANNEL_STDIN, vec![3]));

        let size = libc::winsize {
            ws_row: 50,
            ws_col: 132,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: sets the size of our own pty; then tells lh, whose
        // controlling terminal it is not, as the kernel would.
        unsafe {
            assert_eq!(
                libc::ioctl(controller.as_raw_fd(), libc::TIOCSWINSZ, &size),
                0
            );
            assert_eq!(libc::kill(child.id().unwrap() as i32, libc::SIGWINCH), 0);
        }
        let (channel, resize) = frames.recv().await.unwrap();
        assert_eq!(channel, 4);
        assert_eq!(resize, br#"{"Width":132,"Height":50}"#);

        std::io::Write::write_all(&mut controller, b"x").unwrap();
        let ran = finish(child).await;
        assert_eq!(ran.code, EXIT_OK, "stderr: {}", ran.stderr);
        let after = termios(&terminal);
        assert_eq!(
            (after.c_iflag, after.c_oflag, after.c_lflag, after.c_cc),
            (before.c_iflag, before.c_oflag, before.c_lflag, before.c_cc),
            "the terminal is as it was"
        );

        let upgrade = gw.upgrades().pop().unwrap();
        assert_eq!(upgrade.all("command"), lh_cli::SHELL_COMMAND);
        assert_eq!(upgrade.one("stdin").as_deref(), Some("true"));
        assert_eq!(upgrade.one("tty").as_deref(), Some("true"));
        assert_eq!(upgrade.one("cols").as_deref(), Some("100"));
        assert_eq!(upgrade.one("rows").as_deref(), Some("30"));
    })
    .await;
}

#[tokio::test]
async fn a_shell_without_a_terminal_is_refused_before_anything_is_sent() {
    within(async {
        let gw = stand_in("running", None, |_: Upgrade, _: Ws| async {}).await;
        let ran = finish(gw.lh(&["lease", "shell", "L1"])).await;
        assert_eq!(ran.code, EXIT_CLIENT_ERROR, "stderr: {}", ran.stderr);
        assert!(
            ran.stderr.contains("lh lease exec -i L1 -- sh"),
            "{}",
            ran.stderr
        );
        assert!(gw.upgrades().is_empty());
    })
    .await;
}

/// The stand-in's port forward: waits until `together` sessions are open
/// at once, then echoes each connection's bytes and its end.
fn echo_after(together: usize) -> impl Fn(Upgrade, Ws) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(together));
    move |upgrade: Upgrade, mut ws: Ws| {
        let barrier = barrier.clone();
        Box::pin(async move {
            assert_eq!(
                upgrade.subprotocol.as_deref(),
                Some(PORT_FORWARD_SUBPROTOCOL)
            );
            barrier.wait().await;
            loop {
                match next_frame(&mut ws).await {
                    Some((CHANNEL_DATA, data)) => {
                        // Split otherwise than it came: only the bytes count.
                        for chunk in data.chunks(5_000) {
                            ws.send(binary(CHANNEL_DATA, chunk)).await.unwrap();
                        }
                    }
                    Some((CHANNEL_CLOSE, data)) => {
                        assert_eq!(data, [CHANNEL_DATA]);
                        // As the gateway ends a connection both sides ended:
                        // its end of data, then a normal close with a reason.
                        ws.send(binary(CHANNEL_CLOSE, &[CHANNEL_DATA]))
                            .await
                            .unwrap();
                        let _ = ws
                            .close(Some(CloseFrame {
                                code: CloseCode::Normal,
                                reason: "both sides of the connection closed".into(),
                            }))
                            .await;
                    }
                    Some(other) => panic!("unexpected {other:?}"),
                    None => return,
                }
            }
        })
    }
}

/// Reads `Forwarding from 127.0.0.1:PORT -> REMOTE` and returns the
/// address and the remote port.
async fn forwarding_line(child: &mut Child) -> (String, u16) {
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).await.unwrap();
    let rest = line
        .trim_end()
        .strip_prefix("Forwarding from ")
        .unwrap_or_else(|| panic!("{line:?}"));
    let (local, remote) = rest.split_once(" -> ").unwrap();
    (local.to_string(), remote.parse().unwrap())
}

/// Writes `data` to `local` and reads back all it gets until the end.
async fn round_trip(local: &str, data: Vec<u8>) -> Vec<u8> {
    let socket = TcpStream::connect(local).await.unwrap();
    let (mut read, mut write) = socket.into_split();
    let writer = tokio::spawn(async move {
        write.write_all(&data).await.unwrap();
        write.shutdown().await.unwrap();
    });
    let mut back = Vec::new();
    read.read_to_end(&mut back).await.unwrap();
    writer.await.unwrap();
    back
}

#[tokio::test]
async fn port_forward_carries_two_connections_at_once_byte_for_byte() {
    within(async {
        let gw = stand_in("running", None, echo_after(2)).await;
        let mut child = gw.lh(&["lease", "port-forward", "L1", "0:8080"]);
        let (local, remote) = forwarding_line(&mut child).await;
        assert_eq!(remote, 8080);
        assert!(
            local.starts_with("127.0.0.1:") && !local.ends_with(":0"),
            "{local}"
        );

        const MIB: usize = 1024 * 1024;
        let (a, b) = (noise(1, MIB), noise(2, MIB));
        assert_ne!(a, b);
        // The stand-in echoes nothing until both are open: one connection
        // waiting for the other to finish would never finish.
        let (back_a, back_b) =
            tokio::join!(round_trip(&local, a.clone()), round_trip(&local, b.clone()));
        assert!(
            back_a == a,
            "connection a: {} bytes back, not its own",
            back_a.len()
        );
        assert!(
            back_b == b,
            "connection b: {} bytes back, not its own",
            back_b.len()
        );

        let upgrades = gw.upgrades();
        assert_eq!(upgrades.len(), 2);
        for upgrade in &upgrades {
            assert_eq!(upgrade.path, "/v1/leases/L1/port-forward");
            assert_eq!(upgrade.one("port").as_deref(), Some("8080"));
            assert_eq!(
                upgrade.authorization.as_deref(),
                Some(format!("Bearer {KEY}").as_str())
            );
        }
        interrupt(&child);
        let ran = finish(child).await;
        assert_eq!(ran.code, EXIT_OK, "stderr: {}", ran.stderr);
        assert_eq!(ran.stderr, "");
    })
    .await;
}

#[tokio::test]
async fn a_forwarded_connection_s_error_ends_that_one_only() {
    within(async {
        const REFUSED: &str = "dial tcp 127.0.0.1:9999: connection refused";
        let sessions = Arc::new(Mutex::new(0usize));
        let echo = echo_after(1);
        let gw = stand_in("running", None, move |upgrade: Upgrade, mut ws: Ws| {
            let first = {
                let mut n = sessions.lock().unwrap();
                *n += 1;
                *n == 1
            };
            if !first {
                return echo(upgrade, ws);
            }
            let refused: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
                ws.send(binary(CHANNEL_ERROR, REFUSED.as_bytes()))
                    .await
                    .unwrap();
                let _ = ws.close(None).await;
                while next_frame(&mut ws).await.is_some() {}
            });
            refused
        })
        .await;
        let mut child = gw.lh(&["lease", "port-forward", "L1", ":9999"]);
        let (local, _) = forwarding_line(&mut child).await;

        let mut refused = TcpStream::connect(&local).await.unwrap();
        let _ = refused.write_all(b"GET / HTTP/1.0\r\n\r\n").await;
        let mut got = Vec::new();
        // Ended, by a close or a reset, with nothing from the other side.
        let _ = refused.read_to_end(&mut got).await;
        assert!(got.is_empty(), "{got:?}");

        let data = noise(3, 100_000);
        assert!(round_trip(&local, data.clone()).await == data);

        interrupt(&child);
        let ran = finish(child).await;
        assert_eq!(ran.code, EXIT_OK, "stderr: {}", ran.stderr);
        assert_eq!(
            ran.stderr,
            format!("error: {local} -> 9999: {REFUSED}\n"),
            "one error, for the one connection"
        );
    })
    .await;
}

#[tokio::test]
async fn port_forward_ends_each_direction_on_its_own() {
    within(async {
        // A server that greets, ends its side, then still reads: the local
        // side sees the end of data while it may still send.
        let (heard_tx, heard_rx) = tokio::sync::oneshot::channel();
        let heard_tx = Arc::new(Mutex::new(Some(heard_tx)));
        let gw = stand_in("running", None, move |_: Upgrade, mut ws: Ws| {
            let heard_tx = heard_tx.clone();
            async move {
                ws.send(binary(CHANNEL_DATA, b"hello")).await.unwrap();
                ws.send(binary(CHANNEL_CLOSE, &[CHANNEL_DATA]))
                    .await
                    .unwrap();
                let mut heard = Vec::new();
                while let Some((channel, data)) = next_frame(&mut ws).await {
                    match channel {
                        CHANNEL_DATA => heard.extend_from_slice(&data),
                        CHANNEL_CLOSE => break,
                        other => panic!("channel {other}"),
                    }
                }
                if let Some(tx) = heard_tx.lock().unwrap().take() {
                    let _ = tx.send(heard);
                }
                let _ = ws.close(None).await;
            }
        })
        .await;
        let mut child = gw.lh(&["lease", "port-forward", "L1", "0:25"]);
        let (local, _) = forwarding_line(&mut child).await;
        let socket = TcpStream::connect(&local).await.unwrap();
        let (mut read, mut write) = socket.into_split();
        let mut greeting = Vec::new();
        read.read_to_end(&mut greeting).await.unwrap();
        assert_eq!(greeting, b"hello");
        // Still open this way.
        write.write_all(b"bye").await.unwrap();
        write.shutdown().await.unwrap();
        assert_eq!(heard_rx.await.unwrap(), b"bye");
        interrupt(&child);
        let ran = finish(child).await;
        assert_eq!(ran.code, EXIT_OK, "stderr: {}", ran.stderr);
        assert_eq!(ran.stderr, "");
    })
    .await;
}

#[tokio::test]
async fn port_forward_waits_for_nothing_on_a_lease_that_does_not_run() {
    within(async {
        let gw = stand_in("queued", None, |_: Upgrade, _: Ws| async {}).await;
        let ran = finish(gw.lh(&["lease", "port-forward", "L1", "0:80"])).await;
        assert_eq!(ran.code, EXIT_FAILURE, "stderr: {}", ran.stderr);
        assert!(
            ran.stderr.contains("lease L1 is queued, not running"),
            "{}",
            ran.stderr
        );
        assert!(ran.stdout.is_empty(), "it did not listen");
        assert!(gw.upgrades().is_empty());
    })
    .await;
}
