//! `lh` against a scripted stand-in for the gateway: checks the requests the
//! CLI sends (method, path, query, headers, body) and how it shows answers,
//! errors and exit codes. The stand-in is a few lines of HTTP/1.1 over Tokio.

use lh_cli::{capture, Captured, EXIT_CLIENT_ERROR, EXIT_FAILURE, EXIT_OK, EXIT_SERVER_ERROR};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// A request as the stand-in saw it.
#[derive(Debug, Clone)]
struct Req {
    method: String,
    /// Path and query, as sent.
    target: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("request body is JSON")
    }
}

struct Resp {
    status: u16,
    content_type: &'static str,
    body: String,
}

fn ok(status: u16, body: Value) -> Resp {
    Resp {
        status,
        content_type: "application/json",
        body: body.to_string(),
    }
}

fn problem(status: u16, title: &str, detail: &str, field: Option<&str>) -> Resp {
    let mut doc =
        json!({"type": "about:blank", "title": title, "status": status, "detail": detail});
    if let Some(field) = field {
        doc["field"] = json!(field);
    }
    Resp {
        status,
        content_type: "application/problem+json",
        body: doc.to_string(),
    }
}

type Handler = Arc<dyn Fn(&Req, usize) -> Resp + Send + Sync>;

struct Fake {
    url: String,
    log: Arc<Mutex<Vec<Req>>>,
    /// Holds the API key `lh` reads (`--api-key-file`).
    key_file: tempfile::NamedTempFile,
}

impl Fake {
    fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }

    /// Runs `lh` with this gateway and a fixed API key from a file.
    async fn lh(&self, args: &[&str]) -> Captured {
        let key_file = self.key_file.path().to_str().unwrap();
        let mut argv = vec!["lh", "--gateway-url", &self.url, "--api-key-file", key_file];
        argv.extend_from_slice(args);
        capture(argv).await
    }
}

/// Starts the stand-in; `handler` gets each request and its 0-based number.
async fn fake(handler: impl Fn(&Req, usize) -> Resp + Send + Sync + 'static) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let handler: Handler = Arc::new(handler);
    let server_log = log.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (log, handler) = (server_log.clone(), handler.clone());
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                let mut line = String::new();
                if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                let mut parts = line.split_whitespace();
                let method = parts.next().unwrap_or_default().to_string();
                let target = parts.next().unwrap_or_default().to_string();
                let mut headers = Vec::new();
                loop {
                    line.clear();
                    read.read_line(&mut line).await.unwrap();
                    let l = line.trim_end();
                    if l.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = l.split_once(':') {
                        headers.push((k.trim().to_string(), v.trim().to_string()));
                    }
                }
                let len = headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0usize);
                let mut body = vec![0; len];
                read.read_exact(&mut body).await.unwrap();
                let req = Req {
                    method,
                    target,
                    headers,
                    body: String::from_utf8(body).unwrap(),
                };
                let n = {
                    let mut log = log.lock().unwrap();
                    log.push(req.clone());
                    log.len() - 1
                };
                let resp = handler(&req, n);
                let head = format!(
                    "HTTP/1.1 {} X\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    resp.status,
                    resp.content_type,
                    resp.body.len()
                );
                let _ = write.write_all(head.as_bytes()).await;
                let _ = write.write_all(resp.body.as_bytes()).await;
                let _ = write.shutdown().await;
            });
        }
    });
    let key_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key_file.path(), "test-key\n").unwrap();
    Fake { url, log, key_file }
}

/// The id of the test lease named `name` (`L1`, `L2`, ...): a UUID that
/// ends in its number.
fn lease_id(name: &str) -> String {
    let n: u64 = name.trim_start_matches('L').parse().unwrap_or(0);
    format!("00000000-0000-7000-8000-{n:012}")
}

/// A lease view as the gateway answers it.
fn lease(name: &str, state: &str) -> Value {
    json!({
        "id": lease_id(name), "tenant_id": TENANT_ID,
        "state": state, "gpus": 2, "gpu_model": "H100", "tier": "basic", "priority": 0,
        "node_id": null, "zone": null, "gpu_uuids": [], "gpu_indices": [],
        "queued_reason": null, "queue_position": null, "rejected_reason": null,
        "stop_requested": false, "preemption_deadline": null, "end_reason": null,
        "migrations": 0, "last_migration_reason": null, "idle_since": null,
        "suspended_at": null, "created_at": "2026-12-01T10:00:00Z", "placed_at": null,
        "started_at": null, "ended_at": null
    })
}

/// A tenant's id, where a command takes one as a UUID.
const TENANT_ID: &str = "00000000-0000-7000-8000-0000000000aa";

/// `lh tenant create` with the flags every tenant test gives.
const TENANT_CREATE: [&str; 8] = [
    "tenant",
    "create",
    "--name",
    "acme",
    "--email",
    "a@acme.test",
    "--max-gpus",
    "4",
];

fn tenant_created() -> Resp {
    ok(
        201,
        json!({"id": "T1", "api_key": "lh_secret", "name": "acme", "quota": {"max_gpus": 4}}),
    )
}

#[tokio::test]
async fn tenant_create_posts_quota_and_prints_key() {
    let gw = fake(|_, _| tenant_created()).await;
    let out = gw.lh(&TENANT_CREATE).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(out.stdout.contains("lh_secret"));
    assert!(out.stdout.contains("export LH_API_KEY=lh_secret"));

    let reqs = gw.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "POST");
    assert_eq!(reqs[0].target, "/v1/tenants");
    assert_eq!(reqs[0].header("authorization"), Some("Bearer test-key"));
    assert_eq!(
        reqs[0].json(),
        json!({"name": "acme", "email": "a@acme.test", "quota": {"max_gpus": 4}})
    );
}

#[tokio::test]
async fn lease_create_sends_body_and_idempotency_key() {
    let gw = fake(|_, _| ok(202, lease("L1", "requested"))).await;
    let out = gw
        .lh(&[
            "lease",
            "create",
            "--gpus",
            "2",
            "--gpu-model",
            "H100",
            "--tier",
            "spot",
            "--idempotency-key",
            "idem-1",
        ])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(out.stdout.contains(&lease_id("L1")));
    assert!(out.stdout.contains("requested"));

    let out = gw
        .lh(&["lease", "create", "--gpus", "1", "--gpu-model", "A100"])
        .await;
    assert_eq!(out.code, EXIT_OK);

    let reqs = gw.requests();
    assert_eq!(reqs[0].target, "/v1/leases");
    assert_eq!(reqs[0].header("idempotency-key"), Some("idem-1"));
    assert_eq!(
        reqs[0].json(),
        json!({"gpus": 2, "gpu_model": "H100", "tier": "spot", "priority": 0})
    );
    assert_eq!(reqs[1].header("idempotency-key"), None);
    assert_eq!(reqs[1].json()["tier"], "basic");
}

#[tokio::test]
async fn a_spot_bid_zones_and_recovery_go_in_the_body_and_prices_are_read() {
    let gw = fake(|req, _| match req.target.as_str() {
        "/v1/leases" => ok(202, lease("L1", "requested")),
        _ => ok(
            200,
            json!({"markets": [{"zone": "z1", "region": "z1", "gpu_model": "H100",
                "current": {"price_cny_per_gb_hour": "0.2", "utilisation": "0.5", "at": "2026-12-04T10:00:00Z"},
                "gpus_total": 4, "gpus_used": 2, "history": []}]}),
        ),
    })
    .await;
    let out = gw
        .lh(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "H100",
            "--tier",
            "spot",
            "--max-price",
            "4.5",
            "--zone",
            "z1",
            "--zone",
            "z2",
            "--region",
            "cn-north",
            "--max-retries",
            "2",
            "--zone-first",
            "any",
        ])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    let out = gw
        .lh(&["spot", "prices", "--gpu-model", "H100", "--history", "3"])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(
        out.stdout.contains("0.2") && out.stdout.contains("2/4"),
        "{}",
        out.stdout
    );
    let reqs = gw.requests();
    assert_eq!(
        reqs[0].json(),
        json!({"gpus": 1, "gpu_model": "H100", "tier": "spot", "priority": 0,
               "max_price_cny_per_gpu_hour": "4.5", "zones": ["z1", "z2"], "regions": ["cn-north"],
               "recovery": {"max_retries": 2, "zone_first": "any"}})
    );
    assert_eq!(reqs[1].target, "/v1/spot/prices?history=3&gpu_model=H100");
}

#[tokio::test]
async fn json_flag_prints_the_servers_json() {
    let mut view = lease("L1", "running");
    view["extra_field_from_the_future"] = json!({"a": [1, 2]});
    let served = view.clone();
    let gw = fake(move |_, _| ok(200, served.clone())).await;
    let out = gw.lh(&["lease", "get", "L1", "--json"]).await;
    assert_eq!(out.code, EXIT_OK);
    let printed: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(printed, view);
    assert!(out.stdout.contains("\n  \"id\""), "pretty-printed");
    assert_eq!(gw.requests()[0].target, "/v1/leases/L1");
}

#[tokio::test]
async fn ids_are_escaped_in_paths() {
    let gw = fake(|_, _| ok(202, lease("x", "ended"))).await;
    let out = gw.lh(&["lease", "stop", "../tenants?x"]).await;
    assert_eq!(out.code, EXIT_OK);
    let req = &gw.requests()[0];
    assert_eq!(req.method, "POST");
    assert_eq!(req.target, "/v1/leases/..%2Ftenants%3Fx/stop");
}

#[tokio::test]
async fn ls_one_page_shows_the_next_cursor() {
    let gw = fake(|_, _| {
        ok(
            200,
            json!({"items": [lease("L1", "running")], "next_cursor": "c2"}),
        )
    })
    .await;
    let out = gw.lh(&["lease", "ls", "--limit", "1"]).await;
    assert_eq!(out.code, EXIT_OK);
    assert!(out.stdout.contains(&lease_id("L1")));
    assert!(out.stdout.contains("--cursor c2"), "{}", out.stdout);
    let reqs = gw.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].target, "/v1/leases?limit=1");
}

#[tokio::test]
async fn ls_all_follows_cursors() {
    let gw = fake(|req, _| {
        let page = match req.target.as_str() {
            "/v1/leases?limit=2" => json!({"items": [lease("L1", "running"), lease("L2", "queued")], "next_cursor": "c2"}),
            "/v1/leases?limit=2&cursor=c2" => json!({"items": [lease("L3", "ended")], "next_cursor": "c3"}),
            "/v1/leases?limit=2&cursor=c3" => json!({"items": [], "next_cursor": null}),
            other => return problem(400, "Bad Request", other, None),
        };
        ok(200, page)
    })
    .await;
    let out = gw
        .lh(&["lease", "ls", "--limit", "2", "--all", "--json"])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    let all: Value = serde_json::from_str(&out.stdout).unwrap();
    let ids: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [lease_id("L1"), lease_id("L2"), lease_id("L3")]);
    assert_eq!(all["next_cursor"], Value::Null);
    assert_eq!(gw.requests().len(), 3);

    let out = gw.lh(&["lease", "ls", "--limit", "2", "--all"]).await;
    assert_eq!(out.code, EXIT_OK);
    assert_eq!(
        out.stdout.lines().count(),
        4,
        "header + 3 rows:\n{}",
        out.stdout
    );
    assert!(!out.stdout.contains("--cursor"));
}

#[tokio::test]
async fn ls_all_stops_on_a_repeated_cursor() {
    let gw = fake(|_, _| ok(200, json!({"items": [], "next_cursor": "same"}))).await;
    let out = gw.lh(&["lease", "ls", "--all"]).await;
    assert_eq!(out.code, EXIT_SERVER_ERROR);
    assert!(out.stderr.contains("came back twice"), "{}", out.stderr);
    assert_eq!(gw.requests().len(), 2);
}

#[tokio::test]
async fn wait_polls_until_running() {
    let gw = fake(|_, n| {
        let mut view = lease(
            "L1",
            ["requested", "queued", "queued", "placed", "running"][n.min(4)],
        );
        if n == 1 || n == 2 {
            view["queue_position"] = json!(1);
            view["queued_reason"] = json!("no capacity");
        }
        ok(200, view)
    })
    .await;
    let started = std::time::Instant::now();
    let out = gw
        .lh(&["lease", "get", "L1", "--wait", "running", "--timeout", "10"])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert_eq!(gw.requests().len(), 5);
    // Four 200 ms pauses between five polls.
    assert!(started.elapsed() >= std::time::Duration::from_millis(750));
    let progress: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(
        progress,
        [
            "waiting for lease L1 to be running: requested",
            "waiting for lease L1 to be running: queued (#1, no capacity)",
            "waiting for lease L1 to be running: placed",
            "waiting for lease L1 to be running: running",
        ]
    );
    assert!(out.stdout.contains("running"));
}

#[tokio::test]
async fn wait_fails_when_the_lease_is_rejected() {
    let gw = fake(|_, _| {
        let mut view = lease("L1", "rejected");
        view["rejected_reason"] = json!("quota exceeded");
        ok(200, view)
    })
    .await;
    let out = gw.lh(&["lease", "get", "L1", "--wait", "running"]).await;
    assert_eq!(out.code, EXIT_FAILURE);
    assert!(out.stderr.contains("quota exceeded"));
    assert!(
        out.stderr.contains("error: lease L1 is rejected"),
        "{}",
        out.stderr
    );
    assert!(out.stdout.contains("rejected"), "last view still printed");
}

#[tokio::test]
async fn wait_times_out() {
    let gw = fake(|_, _| ok(200, lease("L1", "queued"))).await;
    let out = gw
        .lh(&["lease", "get", "L1", "--wait", "running", "--timeout", "0"])
        .await;
    assert_eq!(out.code, EXIT_FAILURE);
    assert!(out.stderr.contains("timed out after 0s"), "{}", out.stderr);
    assert_eq!(gw.requests().len(), 1);
}

#[tokio::test]
async fn invoice_query_and_total() {
    let gw = fake(|_, _| {
        ok(
            200,
            json!({
                "id": "I1", "kind": "invoice", "status": "draft", "number": null,
                "tenant_id": "T1", "period": "2026-12", "currency": "CNY",
                "lines": [{"lease_id": "L1", "tier": "basic", "charges": 1,
                           "billed_seconds": 90, "amount": "1.00",
                           "from": "2026-12-01T10:00:00Z", "to": "2026-12-01T10:01:30Z",
                           "price_book_version": 1}],
                "credits": [],
                "total": "1.00", "content_hash": "abc"
            }),
        )
    })
    .await;
    let out = gw
        .lh(&["invoice", "show", "--period", "2026-12", "--tenant", "T1"])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    let total = out.stdout.lines().find(|l| l.starts_with("TOTAL")).unwrap();
    assert_eq!(
        total.split_whitespace().collect::<Vec<_>>(),
        ["TOTAL", "1.00", "CNY"]
    );
    assert_eq!(gw.requests()[0].target, "/v1/invoices/2026-12?tenant_id=T1");
}

#[tokio::test]
async fn invoice_export_prints_the_csv_and_ls_filters() {
    const CSV: &str = "document,number\ninvoice,INV-000001\n";
    let gw = fake(|req, _| {
        if req.target.contains("/csv") {
            Resp {
                status: 200,
                content_type: "text/csv; charset=utf-8",
                body: CSV.to_string(),
            }
        } else {
            ok(200, json!({"invoices": []}))
        }
    })
    .await;
    let out = gw.lh(&["invoice", "export", "I1"]).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert_eq!(out.stdout, CSV);
    let out = gw
        .lh(&["invoice", "ls", "--status", "issued", "--limit", "5"])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert_eq!(out.stdout, "no invoices\n");
    let targets: Vec<String> = gw.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(
        targets,
        ["/v1/invoices/I1/csv", "/v1/invoices?status=issued&limit=5"]
    );
}

#[tokio::test]
async fn audit_verify_exit_codes() {
    let verdict = |ok: bool| {
        json!({"ok": ok, "events": 12, "head": "ab", "sequence": 12, "first_mismatch": null,
               "checkpoints_verified": 1, "checkpoints": 1, "checked_from": 1})
    };
    let good = fake(move |_, _| ok(200, verdict(true))).await;
    let out = good.lh(&["audit", "verify"]).await;
    assert_eq!(out.code, EXIT_OK);
    assert!(out.stderr.is_empty());
    assert_eq!(good.requests()[0].target, "/v1/audit/verify");

    let bad = fake(move |_, _| ok(200, verdict(false))).await;
    let out = bad.lh(&["--json", "audit", "verify"]).await;
    assert_eq!(out.code, EXIT_FAILURE);
    let printed: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(printed["ok"], false);
}

#[tokio::test]
async fn client_errors_exit_2_with_the_problem() {
    let gw = fake(|_, _| {
        problem(
            422,
            "Invalid request",
            "gpus exceeds quota of 4",
            Some("gpus"),
        )
    })
    .await;
    let out = gw
        .lh(&["lease", "create", "--gpus", "8", "--gpu-model", "H100"])
        .await;
    assert_eq!(out.code, EXIT_CLIENT_ERROR);
    assert_eq!(
        out.stderr,
        "error: Invalid request: gpus exceeds quota of 4 (field: gpus)\n"
    );
    assert!(out.stdout.is_empty());

    let gw = fake(|_, _| problem(404, "Not Found", "no lease L9", None)).await;
    let out = gw.lh(&["lease", "get", "L9"]).await;
    assert_eq!(out.code, EXIT_CLIENT_ERROR);
    assert_eq!(out.stderr, "error: Not Found: no lease L9\n");
}

#[tokio::test]
async fn server_errors_exit_3() {
    let gw = fake(|_, _| problem(503, "Service Unavailable", "scheduler is down", None)).await;
    let out = gw.lh(&["lease", "ls"]).await;
    assert_eq!(out.code, EXIT_SERVER_ERROR);
    assert_eq!(
        out.stderr,
        "error: Service Unavailable: scheduler is down\n"
    );

    let gw = fake(|_, _| Resp {
        status: 200,
        content_type: "text/html",
        body: "<html>proxy</html>".into(),
    })
    .await;
    let out = gw.lh(&["audit", "verify"]).await;
    assert_eq!(out.code, EXIT_SERVER_ERROR);
    assert!(out.stderr.contains("not JSON"), "{}", out.stderr);
}

#[tokio::test]
async fn unreachable_gateway_exits_3_and_names_the_url() {
    // A port that was just free: nothing listens there.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let out = capture(["lh", "--gateway-url", url.as_str(), "lease", "ls"]).await;
    assert_eq!(out.code, EXIT_SERVER_ERROR);
    assert!(
        out.stderr.starts_with(&format!(
            "error: could not reach the gateway at {url}/v1/leases: "
        )),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn node_drain_uncordon_and_lease_resume_post_what_the_api_takes() {
    let gw = fake(|req, _| {
        if req.target.starts_with("/v1/nodes/") {
            let drain = req.target.ends_with("/drain");
            let mut body = json!({"node_id": "node-a", "cordoned": drain, "sequence": 7});
            if drain {
                body["drain"] = json!("move");
            }
            ok(202, body)
        } else {
            ok(202, lease("L1", "requested"))
        }
    })
    .await;
    let out = gw
        .lh(&[
            "node", "drain", "node-a", "--mode", "move", "--reason", "bios",
        ])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(
        out.stdout.contains("drain") && out.stdout.contains("move"),
        "{}",
        out.stdout
    );
    let out = gw.lh(&["node", "uncordon", "node-a"]).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    let out = gw.lh(&["lease", "resume", "L1"]).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    let reqs = gw.requests();
    assert_eq!(reqs[0].target, "/v1/nodes/node-a/drain");
    assert_eq!(reqs[0].json(), json!({"mode": "move", "reason": "bios"}));
    assert_eq!(reqs[1].target, "/v1/nodes/node-a/uncordon");
    assert_eq!(reqs[2].target, "/v1/leases/L1/resume");
    assert!(reqs.iter().all(|r| r.method == "POST"));
}

#[tokio::test]
async fn tenant_create_sends_the_idle_policy() {
    let gw = fake(|_, _| tenant_created()).await;
    let out = gw
        .lh(&[
            &TENANT_CREATE[..],
            &["--idle-window-secs", "600", "--idle-action", "suspend"],
        ]
        .concat())
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert_eq!(
        gw.requests()[0].json()["idle_policy"],
        json!({"window_seconds": 600, "action": "suspend"})
    );
    // One without the other is refused before any request.
    let out = gw
        .lh(&[&TENANT_CREATE[..], &["--idle-action", "stop"]].concat())
        .await;
    assert_ne!(out.code, EXIT_OK);
    assert_eq!(gw.requests().len(), 1);
}

#[tokio::test]
async fn a_key_on_the_command_line_is_refused_and_says_what_to_use() {
    let gw = fake(|_, _| ok(200, json!({"items": [], "next_cursor": null}))).await;
    let out = capture([
        "lh",
        "--gateway-url",
        &gw.url,
        "--api-key",
        "lh_secret",
        "lease",
        "ls",
    ])
    .await;
    assert_eq!(out.code, EXIT_CLIENT_ERROR, "{}", out.stderr);
    for hint in ["LH_API_KEY", "--api-key-file", "ps"] {
        assert!(out.stderr.contains(hint), "{hint}: {}", out.stderr);
    }
    assert!(gw.requests().is_empty(), "nothing was sent");
    let missing = capture([
        "lh",
        "--gateway-url",
        &gw.url,
        "--api-key-file",
        "/nonexistent/lh-key",
        "lease",
        "ls",
    ])
    .await;
    assert_eq!(missing.code, EXIT_CLIENT_ERROR);
    assert!(
        missing.stderr.contains("/nonexistent/lh-key"),
        "{}",
        missing.stderr
    );
}

#[tokio::test]
async fn tenant_keys_are_created_listed_and_revoked() {
    let gw = fake(|req, _| match req.method.as_str() {
        "POST" => ok(
            201,
            json!({"key_id": 2, "api_key": "lh_abcdefgh_secret", "prefix": "lh_abcdefgh"}),
        ),
        "GET" => ok(
            200,
            json!({"items": [{"key_id": 1, "prefix": "lh_12345678", "state": "active",
                              "created_at": "2026-12-01T10:00:00Z", "expires_at": null, "revoked_at": null}]}),
        ),
        _ => ok(
            200,
            json!({"key_id": 1, "prefix": "lh_12345678", "state": "revoked",
                   "created_at": "2026-12-01T10:00:00Z", "expires_at": null,
                   "revoked_at": "2026-12-02T10:00:00Z"}),
        ),
    })
    .await;
    let out = gw
        .lh(&[
            "tenant",
            "key",
            "create",
            "T1",
            "--expires-at",
            "2027-01-01T00:00:00Z",
        ])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(out.stdout.contains("lh_abcdefgh_secret"), "{}", out.stdout);
    let out = gw.lh(&["tenant", "key", "ls", "T1"]).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(out.stdout.contains("lh_12345678"), "{}", out.stdout);
    let out = gw.lh(&["tenant", "key", "revoke", "T1", "1"]).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(out.stdout.contains("revoked"), "{}", out.stdout);

    let reqs = gw.requests();
    let seen: Vec<(&str, &str)> = reqs
        .iter()
        .map(|r| (r.method.as_str(), r.target.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("POST", "/v1/tenants/T1/keys"),
            ("GET", "/v1/tenants/T1/keys"),
            ("DELETE", "/v1/tenants/T1/keys/1"),
        ]
    );
    assert_eq!(
        reqs[0].json(),
        json!({"expires_at": "2027-01-01T00:00:00Z"})
    );
}

#[tokio::test]
async fn tenant_suspend_resume_and_set_quota_send_their_bodies() {
    let view = json!({"id": "T1", "max_gpus": 8, "max_vram_gb": null, "weight": 2,
                      "suspended": false, "suspended_reason": null,
                      "created_at": "2026-12-01T10:00:00Z"});
    let changed = json!({"tenant": view, "leases_stopping": 3});
    let gw = fake(move |req, _| {
        if req.method == "PUT" {
            ok(200, view.clone())
        } else {
            ok(202, changed.clone())
        }
    })
    .await;
    let out = gw
        .lh(&[
            "tenant",
            "suspend",
            "T1",
            "--reason",
            "unpaid",
            "--stop-leases",
        ])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(out.stdout.contains("3 lease(s)"), "{}", out.stdout);
    assert_eq!(gw.lh(&["tenant", "resume", "T1"]).await.code, EXIT_OK);
    let out = gw
        .lh(&[
            "tenant",
            "set-quota",
            "T1",
            "--max-gpus",
            "8",
            "--weight",
            "2",
        ])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    let reqs = gw.requests();
    assert_eq!(
        (reqs[0].method.as_str(), reqs[0].target.as_str()),
        ("POST", "/v1/tenants/T1/suspend")
    );
    assert_eq!(
        reqs[0].json(),
        json!({"reason": "unpaid", "stop_leases": true})
    );
    assert_eq!(reqs[1].target, "/v1/tenants/T1/resume");
    assert_eq!(
        (reqs[2].method.as_str(), reqs[2].target.as_str()),
        ("PUT", "/v1/tenants/T1/quota")
    );
    assert_eq!(
        reqs[2].json(),
        json!({"quota": {"max_gpus": 8}, "weight": 2})
    );
}

#[tokio::test]
async fn tenant_erase_posts_and_shows_the_erased_tenant() {
    let gw = fake(|_, _| {
        ok(
            200,
            json!({"id": "T1", "name": "[erased]", "email": "[erased]", "erased": true,
                   "max_gpus": 8, "max_vram_gb": null, "weight": 1, "suspended": true,
                   "suspended_reason": "erased", "created_at": "2026-12-01T10:00:00Z"}),
        )
    })
    .await;
    let out = gw.lh(&["tenant", "erase", "T1"]).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(out.stdout.contains("[erased]"), "{}", out.stdout);
    let reqs = gw.requests();
    assert_eq!(
        (reqs[0].method.as_str(), reqs[0].target.as_str()),
        ("POST", "/v1/tenants/T1/erase")
    );
}

#[tokio::test]
async fn price_books_are_listed_and_published_from_a_file() {
    let gw = fake(|req, _| match req.method.as_str() {
        "GET" => ok(
            200,
            json!({"books": [{"version": 1, "currency": "CNY",
            "effective_from": "2026-12-01T00:00:00Z",
            "tiers": [
                {"tier": "basic", "price_cny_per_gb_hour": "0.5"},
                {"tier": "performance", "price_cny_per_gb_hour": "2.0",
                 "model": {"kind": "graduated", "steps": [
                    {"from_hour": 0, "price_cny_per_gb_hour": "2.0"},
                    {"from_hour": 3, "price_cny_per_gb_hour": "1.6"}]}}
            ]}]}),
        ),
        _ => ok(
            201,
            json!({"version": 2, "effective_from": "2026-12-05T00:00:00Z"}),
        ),
    })
    .await;
    let out = gw.lh(&["price-book", "ls"]).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    let ladder = out
        .stdout
        .lines()
        .find(|l| l.contains("performance"))
        .unwrap();
    assert!(
        ladder.contains("graduated") && ladder.contains("3h:1.6"),
        "{ladder}"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("book.json");
    std::fs::write(
        &file,
        r#"{"version": 2, "tiers": [{"tier": "basic", "price_cny_per_gb_hour": "0.6"}]}"#,
    )
    .unwrap();
    let out = gw
        .lh(&["price-book", "publish", "--file", file.to_str().unwrap()])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    let sent = &gw.requests()[1];
    assert_eq!(
        (sent.method.as_str(), sent.target.as_str()),
        ("POST", "/v1/price-books")
    );
    assert_eq!(sent.json()["version"], 2);

    // Not JSON: refused before anything is sent.
    std::fs::write(&file, "version: 2").unwrap();
    let out = gw
        .lh(&["price-book", "publish", "--file", file.to_str().unwrap()])
        .await;
    assert_eq!(out.code, EXIT_CLIENT_ERROR, "{}", out.stderr);
    assert_eq!(gw.requests().len(), 2);
}

#[tokio::test]
async fn billing_what_if_sends_the_book_file_and_prints_each_tenant() {
    let gw = fake(|req, _| {
        if req.json()["book"]["tiers"][0]["price_cny_per_gb_hour"] == "-1" {
            return problem(
                422,
                "Invalid field",
                "a price must not be negative",
                Some("book.tiers[0].price_cny_per_gb_hour"),
            );
        }
        ok(
            200,
            json!({"period": "2026-11", "book_version": 2,
                "tenants": [{"tenant_id": "T-1", "charges": 3, "current_cny": "60.00",
                    "what_if_cny": "72.00", "difference_cny": "12.00"}],
                "charges": 3, "current_cny": "60.00", "what_if_cny": "72.00",
                "difference_cny": "12.00"}),
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("book.json");
    let path = file.to_str().unwrap();
    std::fs::write(
        &file,
        r#"{"version": 2, "tiers": [{"tier": "basic", "price_cny_per_gb_hour": "0.6"}]}"#,
    )
    .unwrap();
    let what_if = ["billing", "what-if", "--book", path, "--period", "2026-11"];
    let out = gw.lh(&what_if).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    let sent = &gw.requests()[0];
    assert_eq!(
        (sent.method.as_str(), sent.target.as_str()),
        ("POST", "/v1/billing/what-if")
    );
    assert_eq!(sent.json()["period"], "2026-11");
    assert_eq!(sent.json()["book"]["version"], 2);
    assert!(out.stdout.contains("T-1"), "{}", out.stdout);
    let out = gw.lh(&[&what_if[..], &["--csv"]].concat()).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert_eq!(
        out.stdout.lines().last(),
        Some("2026-11,TOTAL,3,60.00,72.00,12.00")
    );

    // The gateway's field is one of the file's.
    std::fs::write(
        &file,
        r#"{"tiers": [{"tier": "basic", "price_cny_per_gb_hour": "-1"}]}"#,
    )
    .unwrap();
    let out = gw.lh(&what_if).await;
    assert_eq!(out.code, EXIT_CLIENT_ERROR, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "(field: tiers[0].price_cny_per_gb_hour in {path})"
        )),
        "{}",
        out.stderr
    );
    // Not a book, or not there: refused before anything is sent, naming it.
    for text in ["[1, 2]", "tiers: []"] {
        std::fs::write(&file, text).unwrap();
        let out = gw.lh(&what_if).await;
        assert_eq!(out.code, EXIT_CLIENT_ERROR, "{}", out.stderr);
        assert!(out.stderr.contains(path), "{}", out.stderr);
    }
    let missing = dir.path().join("none.json");
    let out = gw
        .lh(&[
            "billing",
            "what-if",
            "--book",
            missing.to_str().unwrap(),
            "--period",
            "2026-11",
        ])
        .await;
    assert_eq!(out.code, EXIT_CLIENT_ERROR, "{}", out.stderr);
    assert!(out.stderr.contains("none.json"), "{}", out.stderr);
    assert_eq!(gw.requests().len(), 3);
}

#[tokio::test]
async fn reservations_are_created_and_listed() {
    let reservation = json!({"reservation_id": "R1", "tenant_id": "T1", "gpu_model": "A100-40GB",
        "zone": "z1", "gpus": 4, "starts_at": "2026-12-05T00:00:00Z",
        "ends_at": "2027-01-04T00:00:00Z"});
    let listed = reservation.clone();
    let gw = fake(move |req, _| match req.method.as_str() {
        "GET" => ok(200, json!({"reservations": [listed.clone()]})),
        _ => ok(201, reservation.clone()),
    })
    .await;
    let out = gw
        .lh(&[
            "reservation",
            "create",
            "--tenant",
            TENANT_ID,
            "--gpu-model",
            "A100-40GB",
            "--zone",
            "z1",
            "--gpus",
            "4",
        ])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(out.stdout.contains("R1"), "{}", out.stdout);
    let sent = &gw.requests()[0];
    assert_eq!(sent.target, "/v1/reservations");
    assert_eq!(
        sent.json(),
        json!({"tenant_id": TENANT_ID, "gpu_model": "A100-40GB", "zone": "z1", "gpus": 4})
    );
    let out = gw.lh(&["reservation", "ls", "--tenant", "T1"]).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(
        out.stdout.contains("2027-01-04T00:00:00Z"),
        "{}",
        out.stdout
    );
    assert_eq!(gw.requests()[1].target, "/v1/reservations?tenant_id=T1");
}

#[tokio::test]
async fn lease_usage_asks_for_the_window_and_prints_a_table_per_gpu() {
    let report = json!({
        "from": "2026-12-03T00:00:00Z", "to": "2026-12-04T00:00:00Z", "step_seconds": 3600,
        "series": [
            {"lease_id": "L1", "tenant_id": "T1", "node_id": "sim-a", "gpu_index": 0,
             "gpu_uuid": "GPU-aaa", "points": [
                {"at": "2026-12-03T05:00:00Z", "samples": 720, "utilization_pct_avg": 53.25,
                 "memory_used_mib_avg": 1234.5, "memory_used_mib_max": 2048,
                 "temperature_c_max": 71, "power_w_avg": 250.55},
                {"at": "2026-12-03T06:00:00Z", "samples": 12, "utilization_pct_avg": null,
                 "memory_used_mib_avg": 10.0, "memory_used_mib_max": 10,
                 "temperature_c_max": null, "power_w_avg": null}
            ]},
            {"lease_id": "L1", "tenant_id": "T1", "node_id": "sim-a", "gpu_index": 1,
             "gpu_uuid": "GPU-bbb", "points": []}
        ]
    });
    let answer = report.clone();
    let gw = fake(move |_, _| ok(200, answer.clone())).await;
    let out = gw
        .lh(&[
            "lease",
            "usage",
            "L1",
            "--from",
            "2026-12-03T00:00:00Z",
            "--to",
            "2026-12-04T00:00:00Z",
            "--step",
            "3600",
        ])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    let reqs = gw.requests();
    assert_eq!(reqs[0].method, "GET");
    assert_eq!(
        reqs[0].target,
        "/v1/leases/L1/usage?from=2026-12-03T00%3A00%3A00Z&to=2026-12-04T00%3A00%3A00Z&step=3600"
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines.contains(&"GPU 0 GPU-aaa on sim-a"), "{}", out.stdout);
    assert!(lines.contains(&"GPU 1 GPU-bbb on sim-a"), "{}", out.stdout);
    let row = lines
        .iter()
        .find(|l| l.starts_with("2026-12-03T05:00:00Z"))
        .unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "2026-12-03T05:00:00Z",
            "720",
            "53.2",
            "1234",
            "2048",
            "71",
            "250.6"
        ]
    );
    let row = lines
        .iter()
        .find(|l| l.starts_with("2026-12-03T06:00:00Z"))
        .unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        ["2026-12-03T06:00:00Z", "12", "-", "10", "10", "-", "-"]
    );

    // --json prints the gateway's document; no flags send no query.
    let out = gw.lh(&["--json", "lease", "usage", "L1"]).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert_eq!(serde_json::from_str::<Value>(&out.stdout).unwrap(), report);
    assert_eq!(gw.requests()[1].target, "/v1/leases/L1/usage");
}

/// The query of a request, decoded.
fn query_of(req: &Req) -> std::collections::BTreeMap<String, String> {
    reqwest::Url::parse(&format!("http://fake{}", req.target))
        .unwrap()
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// `lh [first...] report daily --date 2026-12-03 --out <out_file>`.
async fn report_the_day(gw: &Fake, first: &[&str], out_file: &std::path::Path) -> Captured {
    let mut args = first.to_vec();
    args.extend([
        "report",
        "daily",
        "--date",
        "2026-12-03",
        "--out",
        out_file.to_str().unwrap(),
    ]);
    gw.lh(&args).await
}

#[tokio::test]
async fn report_daily_reads_each_type_page_by_page_then_the_usage() {
    use chrono::{TimeZone as _, Utc};
    use lh_events::{fixtures, Actor, EndReason, Envelope, EventData};
    let t = |h: u32, m: u32| Utc.with_ymd_and_hms(2026, 12, 3, h, m, 0).unwrap();
    let (lease_id, tenant) = (uuid::Uuid::from_u128(7), uuid::Uuid::from_u128(1));
    let record = |sequence: u64, at, data| {
        let envelope = Envelope::new(Actor::Admin, at, data);
        json!({"sequence": sequence, "subject": "lh.evt.x", "payload": envelope})
    };
    let before = t(0, 0) - chrono::Duration::days(40);
    let node_a = record(
        3,
        before,
        EventData::NodeRegistered(fixtures::node("n-a", "z1", 1, "A100-40GB", 40)),
    );
    let node_b = record(
        5,
        before,
        EventData::NodeRegistered(fixtures::node("n-b", "z2", 1, "H100-80GB", 80)),
    );
    let requested = record(
        10,
        t(9, 0),
        EventData::LeaseRequested(fixtures::whole_request(lease_id, tenant, 1, "A100-40GB")),
    );
    let placed = record(
        11,
        t(9, 0),
        EventData::LeasePlaced(fixtures::placed(
            lease_id,
            "n-a",
            "z1",
            "A100-40GB",
            40,
            &[0],
        )),
    );
    let started = record(
        12,
        t(9, 0),
        EventData::LeaseStarted(fixtures::started(lease_id, "n-a", t(9, 0))),
    );
    let ended = record(
        13,
        t(10, 30),
        EventData::LeaseEnded(fixtures::ended(
            lease_id,
            "n-a",
            t(10, 30),
            EndReason::Stopped,
        )),
    );
    let gw = fake(move |req, _| {
        let q = query_of(req);
        if req.target.starts_with("/v1/usage") {
            return problem(404, "Not Found", "no such route", None);
        }
        let page = |events: Vec<Value>, next: Option<u64>| {
            ok(200, json!({"events": events, "next": next}))
        };
        match (q["type"].as_str(), q["after"].as_str()) {
            // Two pages of nodes.
            ("node.registered", "0") => page(vec![node_a.clone()], Some(3)),
            ("node.registered", "3") => page(vec![node_b.clone()], None),
            ("lease.requested", _) => page(vec![requested.clone()], None),
            ("lease.placed", _) => page(vec![placed.clone()], None),
            ("lease.started", _) => page(vec![started.clone()], None),
            ("lease.ended", _) => page(vec![ended.clone()], None),
            _ => page(Vec::new(), None),
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("day.svg");
    let out = report_the_day(&gw, &[], &out_file).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(
        out.stdout
            .contains("2 GPUs, 1 leases, 2 of 48 GPU-hours leased"),
        "{}",
        out.stdout
    );
    assert!(out.stderr.contains("no usage API"), "{}", out.stderr);
    assert!(std::fs::read_to_string(&out_file).unwrap().contains("<svg"));

    let reqs = gw.requests();
    let audit: Vec<_> = reqs
        .iter()
        .filter(|r| r.target.starts_with("/v1/audit/events?"))
        .map(query_of)
        .collect();
    // 2 node types (one of them on two pages) and 8 lease types.
    assert_eq!(audit.len(), 2 + 1 + 8);
    for q in &audit {
        assert_eq!(q["to"], "2026-12-04T00:00:00Z");
        assert_eq!(q["limit"], "1000");
        if q["type"].starts_with("lease.") {
            assert_eq!(q["from"], "2026-10-29T00:00:00Z", "35 days back");
        } else {
            assert!(!q.contains_key("from"), "the inventory from the start");
        }
    }
    assert_eq!(audit[1]["after"], "3", "the second page follows next");
    let usage = reqs
        .iter()
        .find(|r| r.target.starts_with("/v1/usage?"))
        .map(query_of)
        .expect("the usage is asked for");
    assert_eq!(usage["from"], "2026-12-03T00:00:00Z");
    assert_eq!(usage["to"], "2026-12-04T00:00:00Z");
    assert_eq!(usage["step"], "3600");
    assert!(!usage.contains_key("tenant"));

    // One tenant's report reads its lease events only, and its usage.
    let before = gw.requests().len();
    let tenant_text = tenant.to_string();
    let out = gw
        .lh(&[
            "report",
            "daily",
            "--date",
            "2026-12-03",
            "--tenant",
            &tenant_text,
            "--out",
            out_file.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(out.stdout.contains("1 leases"), "{}", out.stdout);
    for req in &gw.requests()[before..] {
        let q = query_of(req);
        let leases = q.get("type").is_some_and(|t| t.starts_with("lease."));
        if req.target.starts_with("/v1/usage?") {
            assert_eq!(q["tenant"], tenant_text);
        } else if leases {
            assert_eq!(q["tenant_id"], tenant_text);
        } else {
            assert!(!q.contains_key("tenant_id"), "{}", req.target);
        }
    }

    // A tenant filter that is no id is refused before anything is sent.
    let before = gw.requests().len();
    let out = gw
        .lh(&["report", "daily", "--tenant", "acme", "--out", "d.html"])
        .await;
    assert_eq!(out.code, EXIT_CLIENT_ERROR);
    assert!(out.stderr.contains("--tenant"), "{}", out.stderr);
    let out = gw.lh(&["report", "daily", "--out", "d.pdf"]).await;
    assert_eq!(out.code, EXIT_CLIENT_ERROR);
    assert!(out.stderr.contains(".html, .svg or .png"), "{}", out.stderr);
    assert_eq!(gw.requests().len(), before);
}

fn log_page(data: &str, next: u64, size: u64, finished: bool, node: &str) -> Resp {
    ok(
        200,
        json!({"data": data, "next_offset": next, "dropped_before": 0, "size": size,
               "finished": finished, "node_id": node}),
    )
}

#[tokio::test]
async fn lease_logs_reads_to_the_end_of_what_is_there_and_prints_it_raw() {
    let gw = fake(|_, n| match n {
        0 => log_page("x", 1, 2, false, "n1"),
        _ => log_page("y\n", 3, 3, false, "n1"),
    })
    .await;
    let out = gw.lh(&["lease", "logs", "L1"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (EXIT_OK, "xy\n"),
        "{}",
        out.stderr
    );
    let targets: Vec<String> = gw.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(
        targets,
        [
            "/v1/leases/L1/logs?max_bytes=262144&offset=0",
            "/v1/leases/L1/logs?max_bytes=262144&offset=1"
        ]
    );
}

#[tokio::test]
async fn lease_logs_follow_polls_from_next_offset_until_finished_and_restarts_on_a_new_node() {
    let gw = fake(|_, n| match n {
        0 => log_page("abc", 10, 10, false, "n1"),
        1 => log_page("", 10, 10, false, "n1"),
        2 => log_page("def\n", 14, 20, false, "n1"),
        3 => log_page("not printed", 99, 99, false, "n2"),
        _ => log_page("new\n", 4, 4, true, "n2"),
    })
    .await;
    let out = gw
        .lh(&["lease", "logs", "L1", "--follow", "--tail", "5"])
        .await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (EXIT_OK, "abcdef\nnew\n"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("now on node n2"), "{}", out.stderr);
    let targets: Vec<String> = gw.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(
        targets,
        [
            "/v1/leases/L1/logs?max_bytes=262144&tail=5",
            "/v1/leases/L1/logs?max_bytes=262144&offset=10",
            "/v1/leases/L1/logs?max_bytes=262144&offset=10",
            "/v1/leases/L1/logs?max_bytes=262144&offset=14",
            "/v1/leases/L1/logs?max_bytes=262144&offset=0",
        ]
    );
}

#[tokio::test]
async fn report_daily_reads_a_fleet_s_usage_node_by_node_when_one_answer_cannot_hold_it() {
    use chrono::{TimeZone as _, Utc};
    use lh_events::{fixtures, Actor, Envelope, EventData};
    let before = Utc.with_ymd_and_hms(2026, 10, 1, 0, 0, 0).unwrap();
    let node = |sequence: u64, id: &str| {
        let data = EventData::NodeRegistered(fixtures::node(id, "z1", 1, "A100-40GB", 40));
        let envelope = Envelope::new(Actor::Admin, before, data);
        json!({"sequence": sequence, "subject": "lh.evt.x", "payload": envelope})
    };
    let nodes = vec![node(1, "n-a"), node(2, "n-b"), node(3, "n-c")];
    let too_many = || {
        problem(
            422,
            "Unprocessable Entity",
            "more than 100000 points; ask for a coarser step or a shorter window",
            Some("step"),
        )
    };
    let busy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gw = fake({
        let busy = busy.clone();
        move |req, _| {
        let q = query_of(req);
        if req.target.starts_with("/v1/usage") {
            return match q.get("node").map(String::as_str) {
                Some("n-b") if busy.load(std::sync::atomic::Ordering::Relaxed) => {
                    problem(503, "Service Unavailable", "the database is busy", None)
                }
                // The whole fleet's day, and n-b's alone, are too many points.
                None | Some("n-b") => too_many(),
                Some(node) => ok(
                    200,
                    json!({
                        "from": "2026-12-03T00:00:00Z", "to": "2026-12-04T00:00:00Z",
                        "step_seconds": 3600,
                        "series": [{
                            "lease_id": uuid::Uuid::from_u128(7), "tenant_id": uuid::Uuid::from_u128(1),
                            "node_id": node, "gpu_index": 0, "gpu_uuid": format!("GPU-{node}"),
                            "points": [{"at": "2026-12-03T05:00:00Z", "samples": 720, "minutes": 60,
                                        "utilization_pct_avg": 50.0, "memory_used_mib_avg": 20480.0,
                                        "memory_used_mib_max": 20480, "temperature_c_max": null,
                                        "power_w_avg": null}]
                        }]
                    }),
                ),
            };
        }
        match q["type"].as_str() {
            "node.registered" => ok(200, json!({"events": nodes.clone(), "next": null})),
            _ => ok(200, json!({"events": [], "next": null})),
        }
    }})
    .await;
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("day.svg");
    let out = report_the_day(&gw, &["--json"], &out_file).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(
        out.stderr.contains("reading it node by node (3 nodes)"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("of node n-b: 422"), "{}", out.stderr);
    let asked: Vec<Option<String>> = gw
        .requests()
        .iter()
        .filter(|r| r.target.starts_with("/v1/usage?"))
        .map(|r| query_of(r).get("node").cloned())
        .collect();
    assert_eq!(
        asked,
        [
            None,
            Some("n-a".into()),
            Some("n-b".into()),
            Some("n-c".into())
        ]
    );
    // n-a's and n-c's hours are drawn; n-b's stay empty.
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    let vram_at_5 = |node: &str| {
        report["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["node_id"] == node)
            .map(|g| g["vram_pct"][5].as_f64().unwrap())
            .unwrap()
    };
    assert_eq!(vram_at_5("n-a"), 50.0);
    assert_eq!(vram_at_5("n-b"), 0.0);
    assert_eq!(vram_at_5("n-c"), 50.0);

    // A database too busy at n-b: the nodes after it are left, and named.
    busy.store(true, std::sync::atomic::Ordering::Relaxed);
    let before = gw.requests().len();
    let out = report_the_day(&gw, &[], &out_file).await;
    assert_eq!(out.code, EXIT_OK, "{}", out.stderr);
    assert!(out.stderr.contains("of node n-b: 503"), "{}", out.stderr);
    assert!(
        out.stderr.contains("the 1 node after n-b was not read"),
        "{}",
        out.stderr
    );
    let usage_asked = gw.requests()[before..]
        .iter()
        .filter(|r| r.target.starts_with("/v1/usage?"))
        .count();
    assert_eq!(usage_asked, 3, "the fleet, n-a, n-b; not n-c");
}
