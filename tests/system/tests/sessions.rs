//! Sessions into a lease end to end (docs/adr/030), on real podman: a
//! tenant's exec runs inside its container with its exit code, stdin and
//! a terminal that resizes; a port inside the container is forwarded,
//! several connections at once; nobody else gets in; each session is on
//! the trail with who and how many bytes, never what; and hostile input
//! (oversized messages, unknown channels, resize floods, text, a client
//! that never reads, a node that never answers) gets a close that names
//! it, while another session on the same lease goes on unslowed.

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use lh_events::EventData;
use lh_node_agent::RuntimeKind;
use lh_rpc::http::sessions::{ExecStatus, EXEC_SUBPROTOCOL, PORT_FORWARD_SUBPROTOCOL};
use lh_test_stack::{of_type, Stack, ADMIN_TOKEN, AUDITOR_TOKEN};
use reqwest::Method;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

pub(crate) type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

use crate::workloads::{base_image, own_node_fleet, PODMAN_ARGS};

pub(crate) async fn tenant(stack: &Stack, name: &str) -> String {
    stack.create_trusted_tenant(name, 2).await
}

async fn running_lease(stack: &Stack, key: &str, command: Value) -> String {
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB",
                "workload": {"image": "localhost/leasehold/base", "command": command}})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let id = b["id"].as_str().unwrap().to_string();
    let lease = stack
        .wait_lease(key, &id, |l| {
            l["state"] == "running" || l["state"] == "ended"
        })
        .await;
    assert_eq!(lease["state"], "running", "{lease}");
    id
}

/// Opens a session WebSocket; the refusal's status and problem otherwise.
pub(crate) async fn open(
    stack: &Stack,
    key: &str,
    path: &str,
    protocol: &str,
) -> Result<Ws, (u16, Value)> {
    let url = format!(
        "{}{path}",
        stack.gateway_url.replacen("http://", "ws://", 1)
    );
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Authorization", format!("Bearer {key}").parse().unwrap());
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Ok((ws, response)) => {
            assert_eq!(
                response
                    .headers()
                    .get("sec-websocket-protocol")
                    .and_then(|v| v.to_str().ok()),
                Some(protocol)
            );
            Ok(ws)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let status = response.status().as_u16();
            let body = response.body().clone().unwrap_or_default();
            Err((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
        }
        Err(e) => panic!("{path}: {e}"),
    }
}

pub(crate) fn exec_path(lease: &str, command: &[&str], extra: &str) -> String {
    let args: String = command
        .iter()
        .map(|a| format!("&command={}", urlencode(a)))
        .collect();
    format!("/v1/leases/{lease}/exec?x=1{args}{extra}").replacen("x=1&", "", 1)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What came back on an exec: stdout, stderr, the status and the close.
#[derive(Debug, Default)]
pub(crate) struct Ran {
    pub(crate) stdout: Vec<u8>,
    stderr: Vec<u8>,
    status: Option<ExecStatus>,
    close: Option<(u16, String)>,
}

pub(crate) async fn collect(ws: &mut Ws, within: Duration) -> Ran {
    let mut ran = Ran::default();
    let deadline = tokio::time::Instant::now() + within;
    while let Ok(Some(message)) = tokio::time::timeout_at(deadline, ws.next()).await {
        match message {
            Ok(Message::Binary(bytes)) => match bytes.split_first() {
                Some((1, rest)) => ran.stdout.extend_from_slice(rest),
                Some((2, rest)) => ran.stderr.extend_from_slice(rest),
                Some((3, rest)) => ran.status = Some(serde_json::from_slice(rest).unwrap()),
                _ => {}
            },
            Ok(Message::Close(frame)) => {
                ran.close = frame.map(|f| (u16::from(f.code), f.reason.to_string()));
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    ran
}

async fn send(ws: &mut Ws, channel: u8, bytes: &[u8]) {
    let mut message = vec![channel];
    message.extend_from_slice(bytes);
    ws.send(Message::Binary(message.into())).await.unwrap();
}

async fn session_events(
    stack: &Stack,
    lease: &str,
) -> (
    Vec<lh_events::SessionOpened>,
    Vec<lh_events::SessionEnded>,
    Vec<lh_bus::Stored>,
) {
    let log = lh_test_stack::read_log(&stack.bus().await).await;
    let opened = of_type(&log, "session.opened")
        .into_iter()
        .filter_map(|e| match &e.envelope.data {
            EventData::SessionOpened(o) if o.lease_id.to_string() == lease => Some(o.clone()),
            _ => None,
        })
        .collect();
    let ended = of_type(&log, "session.ended")
        .into_iter()
        .filter_map(|e| match &e.envelope.data {
            EventData::SessionEnded(o) if o.lease_id.to_string() == lease => Some(o.clone()),
            _ => None,
        })
        .collect();
    (opened, ended, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_enters_its_container_lease_by_exec_shell_and_port_and_nobody_else_does() {
    base_image();
    let (_, fleet) = own_node_fleet(2, None);
    let stack = Stack::start_configured(&fleet, |s| {
        s.node_runtime = RuntimeKind::Podman;
        s.node_container_args = PODMAN_ARGS.map(String::from).into();
        s.gateway_config = Some(std::sync::Arc::new(|c: &mut lh_gateway::Config| {
            c.sessions.sessions_per_lease = 4;
            // A MiB each way then takes seconds: the limit holds.
            c.sessions.session_bytes_per_s = 256 * 1024;
            // The nodes dial back for each session's frames: everything
            // below crosses lanes, not the bus (the other tests here keep
            // to the bus).
            c.sessions.session_lane_addr = "127.0.0.1:0".into();
        }));
    })
    .await;
    let key = tenant(&stack, "enters").await;
    let other = tenant(&stack, "stranger").await;
    let lease = running_lease(
        &stack,
        &key,
        json!(["sh", "-c", "nc -ll -p 8080 -e cat & exec sleep 600"]),
    )
    .await;

    // A command: its streams apart, its exit code, inside the container
    // (its own /scratch, none of the host's /work).
    let mut ws = open(
        &stack,
        &key,
        &exec_path(
            &lease,
            &[
                "sh",
                "-c",
                "echo out; echo err >&2; test -d /scratch && ! test -e /work && exit 3",
            ],
            "",
        ),
        EXEC_SUBPROTOCOL,
    )
    .await
    .unwrap();
    let ran = collect(&mut ws, Duration::from_secs(30)).await;
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "out\n", "{ran:?}");
    assert_eq!(String::from_utf8_lossy(&ran.stderr), "err\n", "{ran:?}");
    assert_eq!(
        ran.status.as_ref().and_then(ExecStatus::exit_code),
        Some(3),
        "{ran:?}"
    );
    assert_eq!(ran.close.as_ref().map(|c| c.0), Some(1000), "{ran:?}");

    // Stdin, a MiB of it, through both windows and back, byte for byte.
    let ws = open(
        &stack,
        &key,
        &exec_path(&lease, &["cat"], "&stdin=true"),
        EXEC_SUBPROTOCOL,
    )
    .await
    .unwrap();
    let input: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let echo_started = Instant::now();
    let (mut tx, mut rx) = ws.split();
    let sending = {
        let input = input.clone();
        tokio::spawn(async move {
            for chunk in input.chunks(32 * 1024) {
                let mut message = vec![0u8];
                message.extend_from_slice(chunk);
                tx.send(Message::Binary(message.into())).await.unwrap();
            }
            tx.send(Message::Binary(vec![255, 0].into())).await.unwrap();
            tx
        })
    };
    let mut echoed = Vec::new();
    let mut status = None;
    while let Ok(Some(Ok(message))) = tokio::time::timeout(Duration::from_secs(30), rx.next()).await
    {
        match message {
            Message::Binary(b) if b.first() == Some(&1) => echoed.extend_from_slice(&b[1..]),
            Message::Binary(b) if b.first() == Some(&3) => {
                status = serde_json::from_slice::<ExecStatus>(&b[1..]).ok()
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    let _ = sending.await;
    if echoed.len() != input.len() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let log = lh_test_stack::read_log(&stack.bus().await).await;
        let ends: Vec<String> = lh_test_stack::of_type(&log, "session.ended")
            .iter()
            .map(|e| format!("{:?}", e.envelope.data))
            .collect();
        panic!(
            "{} of {} bytes echoed (status {status:?}); sessions ended: {ends:#?}",
            echoed.len(),
            input.len()
        );
    }
    assert!(echoed == input, "the echo differs");
    // 256 KiB/s with a second's burst: the rest of the MiB waits 3 s.
    assert!(
        echo_started.elapsed() >= Duration::from_millis(2500),
        "a MiB passed a 256 KiB/s limit in {:?}",
        echo_started.elapsed()
    );
    assert_eq!(status.and_then(|s| s.exit_code()), Some(0));

    // A terminal: its size, a resize, and the shell's exit.
    let mut ws = open(
        &stack,
        &key,
        &exec_path(&lease, &["sh"], "&stdin=true&tty=true&cols=81&rows=23"),
        EXEC_SUBPROTOCOL,
    )
    .await
    .unwrap();
    send(&mut ws, 0, b"stty size\n").await;
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen.contains("23 81") && Instant::now() < deadline {
        if let Ok(Some(Ok(Message::Binary(b)))) =
            tokio::time::timeout(Duration::from_secs(5), ws.next()).await
        {
            seen.push_str(&String::from_utf8_lossy(&b[1..]));
        }
    }
    assert!(seen.contains("23 81"), "{seen:?}");
    send(&mut ws, 4, br#"{"Width":120,"Height":40}"#).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(&mut ws, 0, b"stty size; exit 7\n").await;
    let ran = collect(&mut ws, Duration::from_secs(20)).await;
    let text = format!("{seen}{}", String::from_utf8_lossy(&ran.stdout));
    assert!(text.contains("40 120"), "{text:?}");
    assert_eq!(ran.status.and_then(|s| s.exit_code()), Some(7));

    // A port inside the container, two connections at once, each its own.
    let mut a = open(
        &stack,
        &key,
        &format!("/v1/leases/{lease}/port-forward?port=8080"),
        PORT_FORWARD_SUBPROTOCOL,
    )
    .await
    .unwrap();
    let mut b = open(
        &stack,
        &key,
        &format!("/v1/leases/{lease}/port-forward?port=8080"),
        PORT_FORWARD_SUBPROTOCOL,
    )
    .await
    .unwrap();
    send(&mut a, 0, b"first\n").await;
    send(&mut b, 0, b"second\n").await;
    for (ws, want) in [(&mut a, "first\n"), (&mut b, "second\n")] {
        let mut got = Vec::new();
        while got.len() < want.len() {
            match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
                Ok(Some(Ok(Message::Binary(m)))) if m.first() == Some(&0) => {
                    got.extend_from_slice(&m[1..])
                }
                other => panic!("no echo: {other:?}"),
            }
        }
        assert_eq!(String::from_utf8_lossy(&got), want);
    }
    send(&mut a, 255, &[0]).await;
    let _ = a.close(None).await;
    let _ = b.close(None).await;
    // Nothing listens on 8081: refused before any WebSocket, naming the port.
    let (status, problem) = open(
        &stack,
        &key,
        &format!("/v1/leases/{lease}/port-forward?port=8081"),
        PORT_FORWARD_SUBPROTOCOL,
    )
    .await
    .unwrap_err();
    assert_eq!(
        (status, problem["field"].as_str()),
        (502, Some("port")),
        "{problem}"
    );

    // The CLI, as a tenant runs it, on the real gateway: the command's
    // output and its exit code as lh's; a local port through forward().
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("key");
    std::fs::write(&key_file, &key).unwrap();
    let out = lh_cli::capture([
        "lh",
        "--gateway-url",
        &stack.gateway_url,
        "--api-key-file",
        key_file.to_str().unwrap(),
        "lease",
        "exec",
        &lease,
        "--",
        "sh",
        "-c",
        "echo from-cli; echo to-stderr >&2; exit 4",
    ])
    .await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (4, "from-cli\n"),
        "{out:?}"
    );
    assert!(out.stderr.contains("to-stderr"), "{out:?}");
    let echoed = forward_once(&stack, &key, &lease, None, "through lh\n").await;
    assert_eq!(echoed, "through lh\n");

    // Each session so far (three commands, a terminal, three forwarded
    // connections, the CLI's two) had its frames on a lane.
    let metrics = stack.metrics_text().await;
    let taken: f64 = metrics
        .lines()
        .find(|l| l.starts_with("lh_gateway_session_lanes_total{result=\"taken\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0);
    assert!(taken >= 7.0, "{taken} lanes taken:\n{metrics}");

    // Nobody else: another tenant does not see the lease, the auditor and
    // an admin (operator sessions off) may not enter.
    let path = exec_path(&lease, &["true"], "");
    for (caller, status) in [
        (other.as_str(), 404),
        (AUDITOR_TOKEN, 403),
        (ADMIN_TOKEN, 403),
        ("not-a-key", 401),
    ] {
        let refused = open(&stack, caller, &path, EXEC_SUBPROTOCOL)
            .await
            .unwrap_err();
        assert_eq!(refused.0, status, "{}", refused.1);
    }
    // Bad requests name their field.
    let (s, p) = open(
        &stack,
        &key,
        &format!("/v1/leases/{lease}/exec"),
        EXEC_SUBPROTOCOL,
    )
    .await
    .unwrap_err();
    assert_eq!((s, p["field"].as_str()), (422, Some("command")), "{p}");
    let (s, p) = open(
        &stack,
        &key,
        &exec_path(&lease, &["true"], "&cols=0&tty=true"),
        EXEC_SUBPROTOCOL,
    )
    .await
    .unwrap_err();
    assert_eq!((s, p["field"].as_str()), (422, Some("cols")), "{p}");
    let (s, p) = open(&stack, &key, &path, "v4.channel.k8s.io")
        .await
        .unwrap_err();
    assert_eq!(
        (s, p["field"].as_str()),
        (400, Some("Sec-WebSocket-Protocol")),
        "{p}"
    );

    // At most four sessions on one lease: the fifth waits its turn.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(
            open(
                &stack,
                &key,
                &exec_path(&lease, &["sleep", "60"], ""),
                EXEC_SUBPROTOCOL,
            )
            .await
            .unwrap(),
        );
    }
    let (s, p) = open(&stack, &key, &path, EXEC_SUBPROTOCOL)
        .await
        .unwrap_err();
    assert_eq!(s, 429, "{p}");
    for mut ws in held {
        let _ = ws.close(None).await;
    }

    // A session ends with its lease: stopped, its shell is closed 1001.
    // (The node counts the held sessions until each one's close reaches it.)
    let given_back = Instant::now() + Duration::from_secs(10);
    let mut last = loop {
        match open(
            &stack,
            &key,
            &exec_path(&lease, &["sleep", "300"], ""),
            EXEC_SUBPROTOCOL,
        )
        .await
        {
            Ok(ws) => break ws,
            Err((429, p)) if Instant::now() < given_back => {
                let _ = p;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    let (s, b) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{lease}/stop"),
            &key,
            None,
        )
        .await;
    assert!(s < 300, "{b}");
    let ran = collect(&mut last, Duration::from_secs(60)).await;
    assert_eq!(ran.close.as_ref().map(|c| c.0), Some(1001), "{ran:?}");
    assert_eq!(
        ran.status.and_then(|s| s.reason).as_deref(),
        Some("lease_ended")
    );

    // The trail: who, which lease, how many bytes; never the bytes. Twelve
    // sessions opened (three commands, two connections, the CLI's command
    // and connection, four held, one ended by its lease).
    let deadline = Instant::now() + Duration::from_secs(30);
    let (opened, ended, log) = loop {
        let (opened, ended, log) = session_events(&stack, &lease).await;
        if ended.len() >= 12 || Instant::now() > deadline {
            break (opened, ended, log);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        (opened.len(), ended.len()),
        (12, 12),
        "{opened:?} {ended:?}"
    );
    assert!(ended.iter().any(|e| e.ended_by == "lease_ended"));
    let tenant_id = opened[0].tenant_id;
    assert!(opened
        .iter()
        .all(|o| o.tenant_id == tenant_id && o.reason.is_none()));
    let kinds: Vec<_> = opened.iter().map(|o| o.kind).collect();
    assert!(kinds.contains(&lh_events::SessionKind::Shell), "{kinds:?}");
    assert_eq!(
        opened
            .iter()
            .filter(|o| o.kind == lh_events::SessionKind::PortForward && o.port == Some(8080))
            .count(),
        3
    );
    let cat = ended
        .iter()
        .find(|e| e.bytes_in == input.len() as u64)
        .unwrap_or_else(|| panic!("the MiB of stdin is counted: {ended:?}"));
    assert_eq!(
        (cat.bytes_out, cat.exit_code, cat.ended_by.as_str()),
        (input.len() as u64, Some(0), "exited")
    );
    assert!(ended
        .iter()
        .any(|e| e.exit_code == Some(3) && e.bytes_out == 8));
    // The session's own bytes never reach the log.
    for stored in &log {
        let text = serde_json::to_string(&stored.envelope).unwrap();
        assert!(
            !text.contains("stty size") && !text.contains("echo out"),
            "{text}"
        );
    }
}

/// How the stand-in node of [`hostile_input_and_silent_nodes_get_a_close_that_names_them`]
/// treats a session, by the command's first word.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fake {
    /// Sends back what it is sent.
    Echo,
    /// Sends stdout as fast as its window allows.
    Flood,
    /// Takes stdin and never gives credit back.
    Hold,
    /// Opens, then never says anything again.
    Silent,
}

#[derive(Default)]
struct FakeSeen {
    /// Data bytes each session sent the node.
    received: std::collections::HashMap<uuid::Uuid, u64>,
    /// Why each session ended, as the gateway told the node.
    closed: std::collections::HashMap<uuid::Uuid, String>,
    pings: u64,
}

/// A node that answers openings (or, `answer` false, never does) and
/// behaves as each session's command says: a hostile or a hung node, as
/// the gateway must survive one.
fn fake_node(
    client: async_nats::Client,
    node: String,
    answer: bool,
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<FakeSeen>>,
) {
    use lh_rpc::session::*;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(FakeSeen::default()));
    let shared = seen.clone();
    let task = tokio::spawn(async move {
        let mut sub = client
            .subscribe(lh_events::subject::sessions_to_node(&node))
            .await
            .unwrap();
        let mut sessions: std::collections::HashMap<
            uuid::Uuid,
            tokio::sync::mpsc::UnboundedSender<Frame>,
        > = Default::default();
        let open_subject = lh_events::subject::session_open(&node);
        let mut incoming: std::collections::HashMap<uuid::Uuid, Incoming> = Default::default();
        while let Some(message) = sub.next().await {
            if message.subject.as_str() == open_subject {
                if !answer {
                    continue;
                }
                let open: OpenSession = serde_json::from_slice(&message.payload).unwrap();
                let mode = match &open.kind {
                    OpenKind::Exec { command, .. } => match command[0].as_str() {
                        "flood" => Fake::Flood,
                        "hold" => Fake::Hold,
                        "silent" => Fake::Silent,
                        _ => Fake::Echo,
                    },
                    OpenKind::PortForward { .. } => Fake::Echo,
                };
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Frame>();
                sessions.insert(open.session_id, tx);
                incoming.insert(open.session_id, Incoming::default());
                let reply = serde_json::to_vec(&OpenReply::Opened { lane: false }).unwrap();
                client
                    .publish(message.reply.unwrap(), reply.into())
                    .await
                    .unwrap();
                let (client, seen, id) = (client.clone(), shared.clone(), open.session_id);
                let up = lh_events::subject::session_from_node(&node, id);
                tokio::spawn(async move {
                    let mut out = Outgoing::default();
                    let mut window = Window::new(open.window_bytes);
                    let send = |frame: Frame, out: &mut Outgoing| {
                        let payload = out.encode(&frame);
                        let client = client.clone();
                        let up = up.clone();
                        async move { client.publish(up, payload.into()).await.unwrap() }
                    };
                    loop {
                        if mode == Fake::Flood {
                            while window.room() > 0 {
                                let frame = Frame::Data {
                                    stream: Stream::Stdout,
                                    bytes: vec![b'z'; window.room().min(32 * 1024)].into(),
                                };
                                window.spend(frame.window_cost());
                                send(frame, &mut out).await;
                            }
                        }
                        let Some(frame) = rx.recv().await else { return };
                        match frame {
                            Frame::Data { bytes, .. } => {
                                *seen.lock().unwrap().received.entry(id).or_default() +=
                                    bytes.len() as u64;
                                if mode == Fake::Echo {
                                    let cost = bytes.len() as u32 + FRAME_OVERHEAD_BYTES;
                                    send(
                                        Frame::Data {
                                            stream: Stream::Stdout,
                                            bytes,
                                        },
                                        &mut out,
                                    )
                                    .await;
                                    send(Frame::Control(Control::Credit { bytes: cost }), &mut out)
                                        .await;
                                }
                            }
                            Frame::Control(Control::Credit { bytes }) => window.credit(bytes),
                            Frame::Control(Control::Ping) => {
                                seen.lock().unwrap().pings += 1;
                                if mode != Fake::Silent {
                                    send(Frame::Control(Control::Pong), &mut out).await;
                                }
                            }
                            Frame::Control(Control::Close { reason, .. }) => {
                                seen.lock().unwrap().closed.insert(id, reason);
                                return;
                            }
                            Frame::Control(_) => {}
                        }
                    }
                });
                continue;
            }
            let Some(id) = message
                .subject
                .rsplit('.')
                .next()
                .and_then(|t| t.parse::<uuid::Uuid>().ok())
            else {
                continue;
            };
            let (Some(tx), Some(numbers)) = (sessions.get(&id), incoming.get_mut(&id)) else {
                continue;
            };
            let frame = numbers
                .decode(&message.payload)
                .expect("the gateway numbers its frames");
            let _ = tx.send(frame);
        }
    });
    (task, seen)
}

/// Reads until the close; its code and reason, and the status if any.
/// Sends `text` through one connection that `lh_cli::forward` (what `lh
/// lease port-forward` runs) forwards to port 8080 of `lease` as `key`,
/// with an operator's `reason`; what came back, once forward() stopped.
async fn forward_once(
    stack: &Stack,
    key: &str,
    lease: &str,
    reason: Option<&str>,
    text: &str,
) -> String {
    let gw = lh_cli::Gateway::new(&stack.gateway_url, Some(key)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let forwarding = {
        let (lease, reason) = (lease.to_string(), reason.map(str::to_string));
        tokio::spawn(async move {
            let mut err: Vec<u8> = Vec::new();
            let shutdown = async {
                let _ = stopped.await;
            };
            let reason = reason.as_deref();
            lh_cli::forward(&gw, &lease, listener, 8080, reason, shutdown, &mut err).await
        })
    };
    let text = text.as_bytes().to_vec();
    let echoed = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(local).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&text).unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .unwrap();
    let _ = stop.send(());
    forwarding.await.unwrap().unwrap();
    echoed
}

async fn until_close(ws: &mut Ws, within: Duration) -> Ran {
    collect(ws, within).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_input_and_silent_nodes_get_a_close_that_names_them() {
    let (node, fleet) = own_node_fleet(2, None);
    let mut stack = Stack::start_configured(&fleet, |s| {
        s.gateway_config = Some(std::sync::Arc::new(|c: &mut lh_gateway::Config| {
            c.sessions.sessions_per_lease = 16;
            c.sessions.session_client_read_timeout_secs = 2;
            c.sessions.session_idle_timeout_secs = 5;
            c.sessions.operator_sessions = true;
        }));
    })
    .await;
    let key = tenant(&stack, "hostile").await;
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": {"command": ["sleep", "600"]}})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let lease = b["id"].as_str().unwrap().to_string();
    stack
        .wait_lease(&key, &lease, |l| l["state"] == "running")
        .await;
    let path = |command: &str, extra: &str| exec_path(&lease, &[command], extra);

    // A simulated node has nothing to enter, and says so.
    let (s, p) = open(&stack, &key, &path("sh", ""), EXEC_SUBPROTOCOL)
        .await
        .unwrap_err();
    assert_eq!(s, 409, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("simulates"), "{p}");

    // The node's agent is gone (and nobody declares it lost): refused at
    // once, as nothing listens.
    stack.stop_service("scheduler").await;
    stack.stop_service(&format!("node-agent:{node}")).await;
    // Gone from the server too: a stopped agent's connection closes a
    // moment after it stops, sooner or later on a loaded machine.
    let bus = stack.bus().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let asked = tokio::time::timeout(
            Duration::from_secs(1),
            bus.client()
                .request(lh_events::subject::session_open(&node), "{}".into()),
        )
        .await;
        match asked {
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => break,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "the agent still listens: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let started = Instant::now();
    let (s, p) = open(&stack, &key, &path("sh", ""), EXEC_SUBPROTOCOL)
        .await
        .unwrap_err();
    assert_eq!(s, 503, "{p}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    // A node that hears and never answers: refused after five seconds.
    let (hung, _) = fake_node(bus.client().clone(), node.clone(), false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (s, p) = open(&stack, &key, &path("sh", ""), EXEC_SUBPROTOCOL)
        .await
        .unwrap_err();
    assert_eq!(s, 503, "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("did not answer within 5 s"),
        "{p}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(4500),
        "{:?}",
        started.elapsed()
    );
    hung.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // From here a node that answers, and then misbehaves as asked.
    let (_node_task, seen) = fake_node(bus.client().clone(), node.clone(), true);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Where operator sessions are on, an admin enters with a reason, which
    // the trail keeps beside who; never without one, and never the auditor.
    let (s, p) = open(&stack, ADMIN_TOKEN, &path("echo", ""), EXEC_SUBPROTOCOL)
        .await
        .unwrap_err();
    assert_eq!((s, p["field"].as_str()), (422, Some("reason")), "{p}");
    assert_eq!(
        open(
            &stack,
            AUDITOR_TOKEN,
            &path("echo", "&reason=look"),
            EXEC_SUBPROTOCOL
        )
        .await
        .unwrap_err()
        .0,
        403
    );
    let mut admin = open(
        &stack,
        ADMIN_TOKEN,
        &path("echo", "&reason=ticket%2042"),
        EXEC_SUBPROTOCOL,
    )
    .await
    .unwrap();
    let _ = admin.close(None).await;
    let (_, _, log) = session_events(&stack, &lease).await;
    let by_admin = log
        .iter()
        .find_map(|e| match &e.envelope.data {
            EventData::SessionOpened(o) if o.reason.as_deref() == Some("ticket 42") => {
                Some(e.envelope.actor.clone())
            }
            _ => None,
        })
        .expect("the admin's session is on the trail with its reason");
    assert!(
        matches!(by_admin, lh_events::Actor::Operator(_)),
        "{by_admin:?}"
    );
    // The same for a forwarded port, with the CLI's forward() (what `lh
    // lease port-forward --reason` runs): each connection carries it.
    let echoed = forward_once(
        &stack,
        ADMIN_TOKEN,
        &lease,
        Some("ticket 43"),
        "by the operator\n",
    )
    .await;
    assert_eq!(echoed, "by the operator\n");
    let (_, _, log) = session_events(&stack, &lease).await;
    assert!(
        log.iter().any(|e| matches!(&e.envelope.data,
            EventData::SessionOpened(o) if o.reason.as_deref() == Some("ticket 43")
                && o.kind == lh_events::SessionKind::PortForward)),
        "the admin's forwarded connection is on the trail with its reason"
    );

    // A node that goes silent after the opening: closed after 30 s of
    // silence while the client keeps the session busy (not idle).
    let mut silent = open(
        &stack,
        &key,
        &path("silent", "&stdin=true"),
        EXEC_SUBPROTOCOL,
    )
    .await
    .unwrap();
    let silent_started = Instant::now();
    let silent_task = tokio::spawn(async move {
        loop {
            tokio::select! {
                ran = until_close(&mut silent, Duration::from_secs(1)) => {
                    if ran.close.is_some() || ran.status.is_some() {
                        return ran;
                    }
                }
            }
            let _ = send(&mut silent, 0, b".").await;
        }
    });

    // Hostile messages, each closed with its reason.
    let cases: [(&str, Vec<u8>, bool, u16, &str); 4] = [
        (
            "too big",
            [vec![0u8], vec![b'x'; 70 * 1024]].concat(),
            false,
            1009,
            "over the 65537 allowed",
        ),
        (
            "unknown channel",
            vec![7, 1, 2, 3],
            false,
            1008,
            "unknown channel 7",
        ),
        (
            "stdin never opened",
            b"\0hello".to_vec(),
            false,
            1008,
            "without stdin",
        ),
        ("text", b"hello".to_vec(), true, 1003, "text messages"),
    ];
    for (what, message, text, code, reason) in cases {
        let extra = if what == "stdin never opened" {
            ""
        } else {
            "&stdin=true"
        };
        let mut ws = open(&stack, &key, &path("echo", extra), EXEC_SUBPROTOCOL)
            .await
            .unwrap();
        let message = if text {
            Message::Text(String::from_utf8(message).unwrap().into())
        } else {
            Message::Binary(message.into())
        };
        let _ = ws.send(message).await;
        let ran = until_close(&mut ws, Duration::from_secs(10)).await;
        let (got_code, got_reason) = ran
            .close
            .clone()
            .unwrap_or_else(|| panic!("{what}: no close: {ran:?}"));
        assert_eq!(got_code, code, "{what}: {ran:?}");
        assert!(got_reason.contains(reason), "{what}: {got_reason:?}");
    }

    // A resize flood (a dragged window sends tens a second, not hundreds).
    let mut ws = open(
        &stack,
        &key,
        &path("echo", "&stdin=true&tty=true"),
        EXEC_SUBPROTOCOL,
    )
    .await
    .unwrap();
    for i in 0..300u16 {
        let _ = send(
            &mut ws,
            4,
            format!(r#"{{"Width":{},"Height":40}}"#, 80 + i % 50).as_bytes(),
        )
        .await;
    }
    let ran = until_close(&mut ws, Duration::from_secs(10)).await;
    assert_eq!(ran.close.as_ref().map(|c| c.0), Some(1008), "{ran:?}");
    assert!(ran.close.unwrap().1.contains("resize flood"));

    // A client that floods a node that never takes its input: the gateway
    // stops reading it at the window, nothing piles up.
    let held = open(&stack, &key, &path("hold", "&stdin=true"), EXEC_SUBPROTOCOL)
        .await
        .unwrap();
    let (mut tx, _rx) = held.split();
    let flooding = tokio::spawn(async move {
        // Three windows' worth, of which the node may be sent one.
        for _ in 0..3 * lh_rpc::session::DEFAULT_WINDOW_BYTES / (32 * 1024) {
            let mut message = vec![0u8];
            message.extend(vec![b'h'; 32 * 1024]);
            if tx.send(Message::Binary(message.into())).await.is_err() {
                break;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held_bytes: u64 = {
        let seen = seen.lock().unwrap();
        seen.received.values().copied().max().unwrap_or(0)
    };
    assert!(
        held_bytes <= (lh_rpc::session::DEFAULT_WINDOW_BYTES as u64) + 64 * 1024 && held_bytes > 0,
        "the node got {held_bytes} bytes it never took"
    );
    flooding.abort();

    // A client that never reads: closed after 2 s of not taking, while
    // another session on the same lease answers at once.
    let mut flood = open(&stack, &key, &path("flood", ""), EXEC_SUBPROTOCOL)
        .await
        .unwrap();
    let mut echo = open(&stack, &key, &path("echo", "&stdin=true"), EXEC_SUBPROTOCOL)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..3 {
        let asked = Instant::now();
        send(&mut echo, 0, b"ping").await;
        match tokio::time::timeout(Duration::from_secs(5), echo.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => assert_eq!(&b[..], b"\x01ping"),
            other => panic!("the other session did not answer: {other:?}"),
        }
        assert!(
            asked.elapsed() < Duration::from_millis(500),
            "{:?}",
            asked.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let ran = until_close(&mut flood, Duration::from_secs(30)).await;
    let (code, reason) = ran
        .close
        .clone()
        .unwrap_or_else(|| panic!("no close: {} bytes", ran.stdout.len()));
    assert_eq!(code, 1008, "{reason}");
    assert!(reason.contains("took nothing"), "{reason}");

    // An echo session left alone is idle after 5 s.
    let ran = until_close(&mut echo, Duration::from_secs(15)).await;
    assert_eq!(ran.close.as_ref().map(|c| c.0), Some(1000), "{ran:?}");
    assert!(ran.close.unwrap().1.contains("idle for 5 s"));

    let ran = silent_task.await.unwrap();
    let waited = silent_started.elapsed();
    assert!(
        (Duration::from_secs(29)..Duration::from_secs(40)).contains(&waited),
        "{waited:?}"
    );
    assert_eq!(ran.close.as_ref().map(|c| c.0), Some(1011), "{ran:?}");
    assert!(ran.close.unwrap().1.contains("stopped answering"));
    assert_eq!(
        ran.status.and_then(|s| s.reason).as_deref(),
        Some("node_silent")
    );

    // The node was told why each session ended, and so is the trail.
    let told = Instant::now() + Duration::from_secs(5);
    while !seen
        .lock()
        .unwrap()
        .closed
        .values()
        .any(|r| r == "node_silent")
        && Instant::now() < told
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen_closed: Vec<String> = seen.lock().unwrap().closed.values().cloned().collect();
    for reason in [
        "message_too_big",
        "unknown_channel",
        "text_message",
        "stdin_not_open",
        "resize_flood",
        "client_not_reading",
        "idle",
        "node_silent",
    ] {
        assert!(
            seen_closed.iter().any(|r| r == reason),
            "{reason} not told: {seen_closed:?}"
        );
    }
    assert!(seen.lock().unwrap().pings >= 2);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, ended, _) = session_events(&stack, &lease).await;
        let reasons: Vec<&str> = ended.iter().map(|e| e.ended_by.as_str()).collect();
        if [
            "message_too_big",
            "client_not_reading",
            "node_silent",
            "idle",
        ]
        .iter()
        .all(|r| reasons.contains(r))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{reasons:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A process lease's exec runs as the lease's own user, in its home, with
/// the workload's environment: never as the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_lease_s_exec_runs_as_its_own_user_with_its_environment() {
    let (_, fleet) = own_node_fleet(2, None);
    let stack = Stack::start_configured(&fleet, |s| s.node_runtime = RuntimeKind::Process).await;
    let key = tenant(&stack, "processes").await;
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB",
                "workload": {"command": ["sleep", "600"], "env": {"GREETING": "hello"}}})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let lease = b["id"].as_str().unwrap().to_string();
    stack
        .wait_lease(&key, &lease, |l| l["state"] == "running")
        .await;
    let mut ws = open(
        &stack,
        &key,
        &exec_path(
            &lease,
            &["sh", "-c", "id -u; pwd; echo $GREETING $LEASEHOLD_LEASE_ID"],
            "",
        ),
        EXEC_SUBPROTOCOL,
    )
    .await
    .unwrap();
    let ran = collect(&mut ws, Duration::from_secs(20)).await;
    let out = String::from_utf8_lossy(&ran.stdout).into_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out:?} {ran:?}");
    let uid: u64 = lines[0].parse().unwrap();
    assert!(uid >= 2_000_000_000, "ran as uid {uid}");
    assert!(
        lines[1].contains(&lease) || lines[1].contains("leases"),
        "{out}"
    );
    assert_eq!(lines[2], format!("hello {lease}"));
    assert_eq!(ran.status.and_then(|s| s.exit_code()), Some(0));
    stop_lease(&stack, &key, &lease).await;
}

/// A free loopback port for a listener the test hands a service.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A new ed25519 key pair in `dir`: the private key's path and the public
/// key's text.
pub(crate) fn ssh_key(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, String) {
    let path = dir.join(name);
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success());
    let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
    (path, public.trim().to_string())
}

/// OpenSSH's own client, as a tenant runs it: only this key, the gateway's
/// host key checked against `known_hosts`, never a prompt.
pub(crate) fn ssh_command(
    program: &str,
    key: &std::path::Path,
    known_hosts: &std::path::Path,
    port_flag: &str,
    port: u16,
) -> std::process::Command {
    let mut command = std::process::Command::new(program);
    command
        .arg(port_flag)
        .arg(port.to_string())
        .arg("-i")
        .arg(key)
        .args([
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
        ])
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
        .args(["-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR"]);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ordinary_ssh_client_gets_a_shell_runs_commands_copies_files_and_forwards_a_port() {
    base_image();
    let dir = tempfile::tempdir().unwrap();
    let host_key = dir.path().join("host_key");
    let port = free_port();
    let (_, fleet) = own_node_fleet(2, None);
    let stack = {
        let host_key = host_key.clone();
        Stack::start_configured(&fleet, move |s| {
            s.node_runtime = RuntimeKind::Podman;
            s.node_container_args = PODMAN_ARGS.map(String::from).into();
            let host_key = host_key.clone();
            s.gateway_config = Some(std::sync::Arc::new(move |c: &mut lh_gateway::Config| {
                c.ssh.ssh_addr = format!("127.0.0.1:{port}");
                c.ssh.ssh_host_key_file = host_key.clone();
                c.ssh.ssh_max_connections = 8;
            }));
        })
        .await
    };
    let key = tenant(&stack, "sshes").await;
    let other = tenant(&stack, "elsewhere").await;
    let (private, public) = ssh_key(dir.path(), "tenant");
    let (other_private, other_public) = ssh_key(dir.path(), "other");
    for (api_key, public) in [(&key, &public), (&other, &other_public)] {
        let (s, b) = stack
            .call(
                Method::POST,
                "/v1/ssh-keys",
                api_key,
                Some(json!({"name": "laptop", "public_key": public})),
            )
            .await;
        assert_eq!(s, 201, "{b}");
    }
    let lease = running_lease(
        &stack,
        &key,
        json!(["sh", "-c", "nc -ll -p 8080 -e cat & exec sleep 600"]),
    )
    .await;

    // The lease says how to reach it, and which host key to expect: the
    // one the gateway keeps in its file.
    let (s, view) = stack
        .call(Method::GET, &format!("/v1/leases/{lease}"), &key, None)
        .await;
    assert_eq!(s, 200, "{view}");
    assert_eq!(
        view["ssh"]["command"],
        format!("ssh -p {port} {lease}@127.0.0.1"),
        "{view}"
    );
    let host_public = std::process::Command::new("ssh-keygen")
        .arg("-y")
        .arg("-f")
        .arg(&host_key)
        .output()
        .unwrap();
    assert!(host_public.status.success());
    let host_public = String::from_utf8(host_public.stdout).unwrap();
    let known_hosts = dir.path().join("known_hosts");
    std::fs::write(&known_hosts, format!("[127.0.0.1]:{port} {host_public}")).unwrap();
    let fingerprint = std::process::Command::new("ssh-keygen")
        .arg("-lf")
        .arg(&known_hosts)
        .output()
        .unwrap();
    let fingerprint = String::from_utf8(fingerprint.stdout).unwrap();
    let expected = view["ssh"]["host_key_fingerprint"].as_str().unwrap();
    assert!(
        fingerprint.contains(expected),
        "{fingerprint} vs {expected}"
    );

    let ssh = |args: &[&str]| {
        let mut command = ssh_command("ssh", &private, &known_hosts, "-p", port);
        command.arg(format!("{lease}@127.0.0.1")).args(args);
        command
    };
    // A command: its output and exit code, inside the container.
    let out = tokio::task::spawn_blocking({
        let mut c = ssh(&["nproc; test -d /scratch && ! test -e /work && exit 3"]);
        move || c.output().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cpus: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(cpus >= 1);

    // A shell on a terminal.
    let out = tokio::task::spawn_blocking({
        let mut c = ssh(&[]);
        c.arg("-tt")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        move || {
            use std::io::Write;
            let mut child = c.spawn().unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"echo $((6*7)); exit 5\n")
                .unwrap();
            child.wait_with_output().unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("42"),
        "{out:?}"
    );
    assert_eq!(out.status.code(), Some(5));

    // scp copies a file in (over sftp), and it is there.
    let local = dir.path().join("data.bin");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(&local, &data).unwrap();
    let out = tokio::task::spawn_blocking({
        let mut c = ssh_command("scp", &private, &known_hosts, "-P", port);
        c.arg(&local)
            .arg(format!("{lease}@127.0.0.1:/scratch/data.bin"));
        move || c.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "scp: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tokio::task::spawn_blocking({
        let mut c = ssh(&["md5sum /scratch/data.bin"]);
        move || c.output().unwrap()
    })
    .await
    .unwrap();
    let local_sum = std::process::Command::new("md5sum")
        .arg(&local)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next(),
        String::from_utf8_lossy(&local_sum.stdout)
            .split_whitespace()
            .next()
    );

    // -L: a local port reaches the lease's 8080.
    let local_port = free_port();
    let mut forward = ssh(&["-N"]);
    forward
        .arg("-L")
        .arg(format!("127.0.0.1:{local_port}:localhost:8080"));
    let mut forward = forward.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let echoed = loop {
        let attempt = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(("127.0.0.1", local_port))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"through ssh\n")?;
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf)?;
            Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
        })
        .await
        .unwrap();
        match attempt {
            Ok(text) if !text.is_empty() => break text,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(300)).await,
            other => panic!("no echo through -L: {other:?}"),
        }
    };
    assert_eq!(echoed, "through ssh\n");
    let _ = forward.kill();
    let _ = forward.wait();

    // Nobody else: another tenant's key, a user that is no lease.
    for (private, user) in [
        (&other_private, lease.clone()),
        (&private, "root".to_string()),
    ] {
        let out = tokio::task::spawn_blocking({
            let mut c = ssh_command("ssh", private, &known_hosts, "-p", port);
            c.arg(format!("{user}@127.0.0.1")).arg("true");
            move || c.output().unwrap()
        })
        .await
        .unwrap();
        assert_eq!(out.status.code(), Some(255), "{user}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
            "{out:?}"
        );
    }

    // A flood of connections: past eight held at once, a new one is closed
    // before the server says a word; the endpoint serves again after.
    let held: Vec<std::net::TcpStream> = (0..8)
        .map(|_| {
            let s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s
        })
        .collect();
    for mut s in held.iter() {
        use std::io::Read;
        let mut banner = [0u8; 8];
        s.read_exact(&mut banner).unwrap();
        assert_eq!(&banner[..4], b"SSH-", "a held connection is greeted");
    }
    let refused = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 8];
        s.read(&mut buf).unwrap_or(0)
    })
    .await
    .unwrap();
    assert_eq!(refused, 0, "the ninth connection was greeted");
    drop(held);
    let out = tokio::task::spawn_blocking({
        let mut c = ssh(&["true"]);
        move || {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let out = c.output().unwrap();
                if out.status.success() || Instant::now() > deadline {
                    return out;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");

    // The trail: each channel a session, by SSH, with the key that signed in.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (opened, _, _) = session_events(&stack, &lease).await;
        let by_ssh: Vec<_> = opened
            .iter()
            .filter(|o| o.transport == lh_events::SessionTransport::Ssh)
            .collect();
        if by_ssh.len() >= 5 {
            let fingerprint = by_ssh[0].ssh_key_fingerprint.clone().unwrap();
            assert!(fingerprint.starts_with("SHA256:"));
            assert!(by_ssh
                .iter()
                .any(|o| o.kind == lh_events::SessionKind::PortForward && o.port == Some(8080)));
            assert!(by_ssh
                .iter()
                .any(|o| o.kind == lh_events::SessionKind::Shell));
            break;
        }
        assert!(Instant::now() < deadline, "{by_ssh:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop_lease(&stack, &key, &lease).await;
}

/// Stops `lease` and waits for its end: no container or process of a test
/// outlives it.
async fn stop_lease(stack: &Stack, key: &str, lease: &str) {
    let (s, b) = stack
        .call(Method::POST, &format!("/v1/leases/{lease}/stop"), key, None)
        .await;
    assert!(s < 300, "{b}");
    stack
        .wait_lease(key, lease, |l| l["state"] == "ended")
        .await;
}
