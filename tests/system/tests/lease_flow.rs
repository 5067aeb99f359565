//! A lease's whole life end to end through the HTTP API, on a real
//! nats-server and PostgreSQL.

use std::time::Duration;

use lh_events::EventData;
use lh_test_stack::{of_type, read_log, Stack, ADMIN_TOKEN, AUDITOR_TOKEN, FLEET};
use reqwest::Method;
use rust_decimal::{Decimal, RoundingStrategy};
use serde_json::{json, Value};

async fn invoice_with_lines(stack: &Stack, key: &str, period: &str, lines: usize) -> Value {
    for _ in 0..200 {
        let (status, body) = stack
            .call(
                Method::GET,
                &format!("/v1/charges?period={period}"),
                key,
                None,
            )
            .await;
        assert_eq!(status, 200, "{body}");
        if body["lines"].as_array().map(Vec::len) == Some(lines) {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("invoice never showed {lines} lines");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_flows_from_request_to_invoice_and_audit() {
    let stack = Stack::start(FLEET).await;
    let (tenant_id, key) = stack.create_tenant("acme", 16).await;

    let (status, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 2, "gpu_model": "A100-40GB", "tier": "basic"})),
        )
        .await;
    assert_eq!(status, 202, "{lease}");
    // The reply shows the read model at least as new as the request, so on a
    // fast machine the scheduler may already have placed the lease.
    assert!(
        ["requested", "queued", "placed", "running"].contains(&lease["state"].as_str().unwrap()),
        "{lease}"
    );
    let id = lease["id"].as_str().unwrap().to_string();

    let running = stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    assert_eq!(running["node_id"], "node-a");
    assert_eq!(running["tenant_id"], tenant_id.as_str());
    assert_eq!(running["gpu_uuids"].as_array().unwrap().len(), 2);
    assert_eq!(running["gpu_indices"], json!([0, 1]));
    assert!(running["started_at"].is_string());

    let (status, page) = stack.call(Method::GET, "/v1/leases", &key, None).await;
    assert_eq!(status, 200);
    assert_eq!(page["items"][0]["id"], id.as_str());

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, stopped) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(status, 202, "{stopped}");
    let ended = stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    assert!(ended["ended_at"].is_string());
    assert_eq!(ended["end_reason"], "stopped");

    // The amount, recomputed here from the node-agent's own timestamps.
    let bus = stack.bus().await;
    let log = read_log(&bus).await;
    let started = of_type(&log, "lease.started");
    let ended_ev = of_type(&log, "lease.ended");
    let (EventData::LeaseStarted(s), EventData::LeaseEnded(e)) =
        (&started[0].envelope.data, &ended_ev[0].envelope.data)
    else {
        panic!("missing lifecycle events");
    };
    let micros = (e.ended_at - s.started_at).num_microseconds().unwrap();
    let seconds = (micros + 999_999) / 1_000_000;
    let expected = (Decimal::from(80) * Decimal::new(5, 1) * Decimal::from(seconds)
        / Decimal::from(3600))
    .round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero);

    let period = s.started_at.format("%Y-%m").to_string();
    let invoice = invoice_with_lines(&stack, &key, &period, 1).await;
    let line = &invoice["lines"][0];
    assert_eq!(line["lease_id"], id.as_str());
    assert_eq!(line["tier"], "basic");
    assert_eq!(line["billed_seconds"], seconds);
    assert_eq!(line["vram_gb"], 80);
    assert_eq!(line["unit_price"], "0.5");
    assert_eq!(
        line["amount"].as_str().unwrap().parse::<Decimal>().unwrap(),
        expected
    );
    assert_eq!(
        invoice["total"]
            .as_str()
            .unwrap()
            .parse::<Decimal>()
            .unwrap(),
        expected
    );
    assert_eq!(invoice["currency"], "CNY");

    // The audit chain covers every event so far.
    let head = bus.last_sequence().await.unwrap();
    let mut verified = Value::Null;
    for _ in 0..100 {
        let (status, body) = stack
            .call(Method::GET, "/v1/audit/verify", ADMIN_TOKEN, None)
            .await;
        assert_eq!(status, 200, "{body}");
        if body["events"].as_u64().unwrap_or(0) >= head {
            verified = body;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(verified["ok"], true, "{verified}");
    assert_eq!(verified["head"].as_str().unwrap().len(), 64);
    // A full re-verification replays everything: admins only.
    let (status, body) = stack
        .call(
            Method::GET,
            "/v1/audit/verify?full=true",
            AUDITOR_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    let (status, full) = stack
        .call(Method::GET, "/v1/audit/verify?full=true", ADMIN_TOKEN, None)
        .await;
    assert_eq!(status, 200, "{full}");
    assert_eq!(full["ok"], true, "{full}");
    assert_eq!(full["checked_from"], 1, "{full}");
    assert_eq!(full["events_checked_this_run"], full["events"], "{full}");
    let (status, _) = stack
        .call(Method::GET, "/v1/audit/verify", &key, None)
        .await;
    assert_eq!(
        status, 403,
        "a tenant may not run the auditor's verification"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_idempotency_key_yields_one_lease_and_one_charge() {
    let stack = Stack::start(FLEET).await;
    let (_, key) = stack.create_tenant("idem", 16).await;
    let post = || async {
        let resp = stack
            .http
            .post(format!("{}/v1/leases", stack.gateway_url))
            .bearer_auth(&key)
            .header("Idempotency-Key", "order-42")
            .json(&json!({"gpus": 1, "gpu_model": "H100-80GB"}))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
    };
    let (s1, a) = post().await;
    let (s2, b) = post().await;
    assert_eq!((s1, s2), (202, 202), "{a} {b}");
    assert_eq!(a["id"], b["id"]);
    let id = a["id"].as_str().unwrap().to_string();
    stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    // A third call after the lease started still names the same lease.
    let (s3, c) = post().await;
    assert_eq!(s3, 202);
    assert_eq!(c["id"], a["id"]);
    assert_eq!(c["state"], "running");
    // Same key, different request: refused.
    let resp = stack
        .http
        .post(format!("{}/v1/leases", stack.gateway_url))
        .bearer_auth(&key)
        .header("Idempotency-Key", "order-42")
        .json(&json!({"gpus": 2, "gpu_model": "H100-80GB"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 409);

    let (status, _) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(status, 202);
    stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    let (_, page) = stack.call(Method::GET, "/v1/leases", &key, None).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);

    let bus = stack.bus().await;
    for _ in 0..200 {
        if !of_type(&read_log(&bus).await, "charge.accrued").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = read_log(&bus).await;
    assert_eq!(of_type(&log, "lease.requested").len(), 1);
    assert_eq!(of_type(&log, "charge.accrued").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_is_refused_with_problem_json_naming_the_field() {
    let stack = Stack::start(FLEET).await;
    let (_, key) = stack.create_tenant("strict", 4).await;
    let (_, other_key) = stack.create_tenant("other", 4).await;
    let url = format!("{}/v1/leases", stack.gateway_url);

    let send = |body: &'static str, key: Option<&str>| {
        let mut req = stack
            .http
            .post(&url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
            (status, ctype, resp.json::<Value>().await.unwrap())
        }
    };
    let cases: [(&str, Option<&str>, u16, Option<&str>); 7] = [
        ("{\"gpus\": 2,", Some(&key), 400, None),
        (
            r#"{"gpus":1,"gpu_model":"A100-40GB","colour":"red"}"#,
            Some(&key),
            400,
            Some("colour"),
        ),
        (r#"{"gpus":1}"#, Some(&key), 400, Some("gpu_model")),
        (
            r#"{"gpus":1,"gpu_model":"Z9000"}"#,
            Some(&key),
            422,
            Some("gpu_model"),
        ),
        (
            r#"{"gpus":5,"gpu_model":"A100-40GB"}"#,
            Some(&key),
            422,
            Some("gpus"),
        ),
        (
            r#"{"gpus":1,"gpu_model":"A100-40GB"}"#,
            None,
            401,
            Some("Authorization"),
        ),
        (
            r#"{"gpus":1,"gpu_model":"A100-40GB"}"#,
            Some("lh_wrong"),
            401,
            Some("Authorization"),
        ),
    ];
    for (body, k, status, field) in cases {
        let (s, ctype, problem) = send(body, k).await;
        assert_eq!(s, status, "{body}: {problem}");
        assert_eq!(ctype, "application/problem+json", "{body}");
        assert_eq!(problem["status"], status);
        assert!(problem["title"].is_string() && problem["detail"].is_string());
        assert_eq!(problem["field"].as_str(), field, "{body}: {problem}");
    }

    // Another tenant's lease is not found, not forbidden.
    let (_, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A10G-24GB"})),
        )
        .await;
    let id = lease["id"].as_str().unwrap();
    let (status, problem) = stack
        .call(Method::GET, &format!("/v1/leases/{id}"), &other_key, None)
        .await;
    assert_eq!(status, 404, "{problem}");
    let (status, _) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{id}/stop"),
            &other_key,
            None,
        )
        .await;
    assert_eq!(status, 404);
    let (status, problem) = stack
        .call(Method::GET, "/v1/invoices?period=2026-13", &key, None)
        .await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("period")));
    let (status, problem) = stack
        .call(
            Method::POST,
            "/v1/tenants",
            &key,
            Some(json!({"name":"x","email":"a@b.c","quota":{"max_gpus":1}})),
        )
        .await;
    assert_eq!(status, 403, "{problem}");
    let (status, problem) = stack
        .call(
            Method::POST,
            "/v1/tenants",
            ADMIN_TOKEN,
            Some(json!({"name":"x","email":"not-an-email","quota":{"max_gpus":1}})),
        )
        .await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("email")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quota_breach_across_leases_is_rejected_and_a_full_fleet_queues() {
    let stack = Stack::start(FLEET).await;
    let (_, key) = stack.create_tenant("small", 4).await;
    let a = stack
        .running(&key, json!({"gpus": 4, "gpu_model": "A10G-24GB"}))
        .await;
    let a = a["id"].as_str().unwrap();
    let b = stack
        .lease(&key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    let rejected = stack
        .wait_lease(&key, &b, |l| l["state"] == "rejected")
        .await;
    assert!(
        rejected["rejected_reason"]
            .as_str()
            .unwrap()
            .contains("quota"),
        "{rejected}"
    );

    let (_, big) = stack.create_tenant("big", 64).await;
    let c = stack
        .lease(&big, json!({"gpus": 1, "gpu_model": "A10G-24GB"}))
        .await;
    let queued = stack.wait_lease(&big, &c, |l| l["state"] == "queued").await;
    assert!(
        queued["queued_reason"]
            .as_str()
            .unwrap()
            .contains("capacity"),
        "{queued}"
    );
    assert_eq!(queued["queue_position"], 1);
    // Capacity frees: the queued lease runs.
    let (s, _) = stack
        .call(Method::POST, &format!("/v1/leases/{a}/stop"), &key, None)
        .await;
    assert_eq!(s, 202);
    stack
        .wait_lease(&big, &c, |l| l["state"] == "running")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_service_serves_health_ready_metrics_and_the_gateway_its_openapi() {
    let stack = Stack::start(FLEET).await;
    for name in stack.service_names() {
        for (addr, path) in [
            (stack.http_addr(&name), "/healthz"),
            (stack.http_addr(&name), "/readyz"),
            (stack.metrics_addr(&name), "/metrics"),
            (stack.metrics_addr(&name), "/healthz"),
        ] {
            let r = stack
                .http
                .get(format!("http://{addr}{path}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{name} {path}");
        }
    }
    // Clients of the API never read the gateway's metrics.
    let r = stack
        .http
        .get(format!("{}/metrics", stack.gateway_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "the public port serves no /metrics");
    assert_ne!(stack.metrics_addr("gateway"), stack.http_addr("gateway"));
    let doc: Value = stack
        .http
        .get(format!("{}/openapi.json", stack.gateway_url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/tenants",
        "/v1/leases",
        "/v1/leases/{id}",
        "/v1/leases/{id}/stop",
        "/v1/leases/{id}/resume",
        "/v1/leases/{id}/logs",
        "/v1/nodes/{id}/drain",
        "/v1/nodes/{id}/uncordon",
        "/v1/invoices",
        "/v1/invoices/{id}",
        "/v1/invoices/{id}/csv",
        "/v1/charges",
        "/v1/reports/cost",
        "/v1/audit/verify",
        "/v1/tenants/{id}",
        "/v1/tenants/{id}/suspend",
        "/v1/tenants/{id}/resume",
        "/v1/tenants/{id}/quota",
        "/v1/tenants/{id}/keys",
        "/v1/tenants/{id}/keys/{key_id}",
        "/v1/usage",
        "/v1/leases/{id}/usage",
    ] {
        assert!(doc["paths"][path].is_object(), "openapi lacks {path}");
    }
    // Every operation documents its errors as problem+json: the ones any
    // call can meet, those of writes, and 404 where an id is in the path.
    for (path, operations) in doc["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            let responses = operation["responses"].as_object().unwrap();
            let mut needed = vec!["401", "503"];
            if method != "get" {
                needed.extend(["403", "409", "429"]);
            }
            if path.contains('{') {
                needed.push("404");
            }
            if operation.get("requestBody").is_some() {
                needed.extend(["400", "422"]);
            }
            for status in needed {
                assert!(
                    responses.contains_key(status),
                    "{method} {path} does not document {status}"
                );
            }
            for (status, response) in responses {
                if status.as_str() >= "400" {
                    assert_eq!(
                        response["content"]["application/problem+json"]["schema"]["$ref"],
                        "#/components/schemas/Problem",
                        "{method} {path} {status}"
                    );
                    assert!(
                        response["content"].as_object().unwrap().len() == 1,
                        "{method} {path} {status} offers another media type"
                    );
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_drives_the_flow_against_the_real_gateway() {
    let stack = Stack::start(FLEET).await;
    let url = stack.gateway_url.clone();
    // Keys reach `lh` through files, never its command line.
    let keys = tempfile::tempdir().unwrap();
    let key_file = |key: &str| {
        let path = keys.path().join(key);
        std::fs::write(&path, key).unwrap();
        path.to_str().unwrap().to_string()
    };
    let lh = |key: &str, args: &[&str]| {
        let file = key_file(key);
        let mut argv = vec![
            "lh",
            "--gateway-url",
            &url,
            "--api-key-file",
            &file,
            "--json",
        ];
        argv.extend_from_slice(args);
        let argv: Vec<String> = argv.into_iter().map(String::from).collect();
        async move { lh_cli::capture(argv).await }
    };
    let out = lh(
        ADMIN_TOKEN,
        &[
            "tenant",
            "create",
            "--name",
            "acme",
            "--email",
            "ops@acme.example",
            "--max-gpus",
            "16",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let tenant: Value = serde_json::from_str(&out.stdout).unwrap();
    let key = tenant["api_key"].as_str().unwrap().to_string();

    let out = lh(
        &key,
        &[
            "lease",
            "create",
            "--gpus",
            "2",
            "--gpu-model",
            "A100-40GB",
            "--tier",
            "basic",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lease: Value = serde_json::from_str(&out.stdout).unwrap();
    let id = lease["id"].as_str().unwrap().to_string();
    let out = lh(
        &key,
        &["lease", "get", &id, "--wait", "running", "--timeout", "20"],
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    // A share of one GPU, from the CLI.
    let out = lh(
        &key,
        &[
            "lease",
            "create",
            "--milli",
            "300",
            "--vram-gb",
            "10",
            "--gpu-model",
            "A100-40GB",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let share: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(share["gpu_fraction"]["milli"], 300, "{share}");
    let share_id = share["id"].as_str().unwrap().to_string();
    let out = lh(&key, &["lease", "stop", &share_id]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = lh(&key, &["lease", "ls"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains(&id));
    let out = lh(&key, &["lease", "stop", &id]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = lh(
        &key,
        &["lease", "get", &id, "--wait", "ended", "--timeout", "20"],
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let period = chrono::Utc::now().format("%Y-%m").to_string();
    let mut shown = false;
    for _ in 0..100 {
        let out = lh(&key, &["invoice", "show", "--period", &period]).await;
        assert_eq!(out.code, 0, "{}", out.stderr);
        let invoice: Value = serde_json::from_str(&out.stdout).unwrap();
        let lines = invoice["lines"].as_array().cloned().unwrap_or_default();
        if lines.iter().any(|l| l["lease_id"] == id.as_str()) {
            shown = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(shown, "the invoice never showed the lease");
    // The month's draft is listed, and exports as CSV with the lease's line.
    let out = lh(&key, &["invoice", "ls", "--period", &period]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let list: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(list["invoices"][0]["status"], "draft", "{list}");
    assert_eq!(list["invoices"][0]["kind"], "invoice", "{list}");
    let out = lh(&key, &["invoice", "export", "--period", &period]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.starts_with("document,number,status,"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!(",line,{id},")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.lines().last().unwrap().contains(",total,"),
        "{}",
        out.stdout
    );
    // Tables by default.
    let file = key_file(&key);
    let argv: Vec<String> = [
        "lh",
        "--gateway-url",
        &url,
        "--api-key-file",
        &file,
        "invoice",
        "show",
        "--period",
        &period,
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let out = lh_cli::capture(argv).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("TOTAL"), "{}", out.stdout);
    let out = lh(ADMIN_TOKEN, &["audit", "verify"]).await;
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    // A tenant key cannot create tenants: exit code 2 for a 4xx.
    let out = lh(
        &key,
        &[
            "tenant",
            "create",
            "--name",
            "x",
            "--email",
            "a@b.co",
            "--max-gpus",
            "1",
        ],
    )
    .await;
    assert_eq!(out.code, 2, "{}", out.stderr);
}
