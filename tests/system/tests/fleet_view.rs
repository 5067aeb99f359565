//! The fleet as operators and tenants see it: `GET /v1/nodes` and
//! `/v1/nodes/{id}` (each node's state, GPUs, health, holders, last
//! heartbeat), `GET /v1/gpus` (what may be rented, with prices), and the
//! CLI's `lh node ls|get` and `lh gpus`, on a real stack.

use std::time::{Duration, Instant};

use lh_test_stack::{Stack, ADMIN_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

async fn lh(stack: &Stack, key: &str, args: &[&str]) -> lh_cli::Captured {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, key).unwrap();
    let mut argv = vec![
        "lh".to_string(),
        "--gateway-url".to_string(),
        stack.gateway_url.clone(),
        "--api-key-file".to_string(),
        key_file.to_str().unwrap().to_string(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    lh_cli::capture(argv).await
}

/// GETs `path` as `key` until `done` holds of the answer (the scheduler
/// renews its view at most twice a second), within 30 s.
async fn get_until(stack: &Stack, key: &str, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, body) = stack.call(Method::GET, path, key, None).await;
        if s == 200 && done(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "{path}: {s} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn offer<'a>(catalogue: &'a Value, model: &str) -> &'a Value {
    catalogue["offers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["gpu_model"] == model)
        .unwrap_or_else(|| panic!("no {model} in {catalogue}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operators_see_the_fleet_and_its_leases_and_tenants_what_they_may_rent() {
    let stack = Stack::start(FLEET).await;
    let (_, key) = stack.create_tenant("renter", 8).await;

    // Every model of the fleet, free, priced by the book in force.
    let catalogue = get_until(&stack, &key, "/v1/gpus", |c| {
        c["offers"].as_array().is_some_and(|o| o.len() == 3)
    })
    .await;
    let a100 = offer(&catalogue, "A100-40GB");
    assert_eq!(a100["zone"], "cn-north-1a");
    assert_eq!(
        (a100["gpus_total"].as_u64(), a100["gpus_free"].as_u64()),
        (Some(8), Some(8))
    );
    assert_eq!(a100["free_milli"], 8000);
    assert_eq!(a100["vram_gb"], 40);
    let basic = a100["prices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["tier"] == "basic")
        .unwrap_or_else(|| panic!("no basic price in {a100}"));
    let book = lh_domain::rating::default_price_book(chrono::Utc::now());
    let unit = lh_domain::rating::unit_price(&book, lh_events::Tier::Basic).unwrap();
    assert_eq!(
        basic["cny_per_gpu_hour"],
        json!((unit * rust_decimal::Decimal::from(40))
            .round_dp(4)
            .normalize()
            .to_string())
    );

    // A lease of two GPUs: two fewer free, and the node says who holds them.
    let (s, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 2, "gpu_model": "A100-40GB"})),
        )
        .await;
    assert_eq!(s, 202, "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();
    stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    get_until(&stack, &key, "/v1/gpus", |c| {
        offer(c, "A100-40GB")["gpus_free"] == 6
    })
    .await;
    let node = get_until(&stack, ADMIN_TOKEN, "/v1/nodes/node-a", |n| {
        n["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["held_by"] == json!(id))
            .count()
            == 2
    })
    .await;
    assert_eq!(node["state"], "ready", "{node}");
    assert!(node["last_heartbeat_at"].is_string(), "{node}");
    assert_eq!(node["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(node["gpus"][0]["health"], "healthy");
    // Each GPU's last reading comes with its node's heartbeat.
    let node = get_until(&stack, ADMIN_TOKEN, "/v1/nodes/node-a", |n| {
        n["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["temperature_c"].is_u64() && g["memory_used_mib"].is_u64())
    })
    .await;
    assert!(
        node["gpus"][0]["temperature_c"].as_u64().unwrap() < 200,
        "{node}"
    );

    // Drained, its GPUs leave the catalogue and the fleet says why.
    let (s, body) = stack
        .call(
            Method::POST,
            "/v1/nodes/node-a/drain",
            ADMIN_TOKEN,
            Some(json!({"mode": "finish"})),
        )
        .await;
    assert!((200..300).contains(&s), "{body}");
    let fleet = get_until(&stack, ADMIN_TOKEN, "/v1/nodes", |f| {
        f["nodes"][0]["state"] == "draining"
    })
    .await;
    assert_eq!(fleet["nodes"].as_array().unwrap().len(), 3);
    assert_eq!(fleet["nodes"][0]["id"], "node-a");
    assert_eq!(fleet["nodes"][0]["drain_mode"], "finish");
    let catalogue = get_until(&stack, &key, "/v1/gpus", |c| {
        c["offers"].as_array().is_some_and(|o| o.len() == 2)
    })
    .await;
    assert!(catalogue["offers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["gpu_model"] != "A100-40GB"));

    // The fleet is the operators': a tenant is refused, an unknown node is
    // named.
    let (s, _) = stack.call(Method::GET, "/v1/nodes", &key, None).await;
    assert_eq!(s, 403);
    let (s, p) = stack
        .call(Method::GET, "/v1/nodes/node-z", ADMIN_TOKEN, None)
        .await;
    assert_eq!((s, p["field"].as_str()), (404, Some("id")), "{p}");

    // The CLI shows the same.
    let gpus = lh(&stack, &key, &["gpus"]).await;
    assert_eq!(gpus.code, 0, "{}", gpus.stderr);
    assert!(
        gpus.stdout.contains("H100-80GB") && gpus.stdout.contains("cn-south-1c"),
        "{}",
        gpus.stdout
    );
    let ls = lh(&stack, ADMIN_TOKEN, &["node", "ls"]).await;
    assert_eq!(ls.code, 0, "{}", ls.stderr);
    assert!(
        ls.stdout.contains("draining (finish)") && ls.stdout.contains("2/8"),
        "{}",
        ls.stdout
    );
    let one = lh(&stack, ADMIN_TOKEN, &["node", "get", "node-a"]).await;
    assert_eq!(one.code, 0, "{}", one.stderr);
    assert!(one.stdout.contains(&id), "{}", one.stdout);
    let refused = lh(&stack, &key, &["node", "ls"]).await;
    assert_ne!(refused.code, 0);
}

/// An open event stream: what it has sent so far.
struct Heard {
    response: reqwest::Response,
    text: String,
}

impl Heard {
    async fn open(stack: &Stack, key: &str) -> Heard {
        Heard::open_after(stack, key, None).await
    }

    /// Opens a stream again after the change `last` (`Last-Event-ID`).
    async fn open_after(stack: &Stack, key: &str, last: Option<&str>) -> Heard {
        let mut request = reqwest::Client::new()
            .get(format!(
                "{}/v1/events/stream?for_secs=60",
                stack.gateway_url
            ))
            .bearer_auth(key);
        if let Some(last) = last {
            request = request.header("Last-Event-ID", last);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        let mut heard = Heard {
            response,
            text: String::new(),
        };
        heard.until(|t| t.contains("event: open")).await;
        heard
    }

    /// Reads until `done` holds of all it has sent, within 30 s.
    async fn until(&mut self, done: impl Fn(&str) -> bool) -> &str {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !done(&self.text) {
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .unwrap_or_else(|_| panic!("not heard in time; heard: {}", self.text))
                .unwrap()
                .unwrap_or_else(|| panic!("the stream ended; heard: {}", self.text));
            self.text.push_str(&String::from_utf8_lossy(&chunk));
        }
        &self.text
    }

    /// What else it sends within `wait`.
    async fn more_within(&mut self, wait: Duration) -> &str {
        let deadline = tokio::time::Instant::now() + wait;
        while let Ok(Ok(Some(chunk))) =
            tokio::time::timeout_at(deadline, self.response.chunk()).await
        {
            self.text.push_str(&String::from_utf8_lossy(&chunk));
        }
        &self.text
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_caller_hears_of_the_changes_it_may_read_and_no_others() {
    let stack = Stack::start(FLEET).await;
    let (_, key_a) = stack.create_tenant("hearer", 8).await;
    let (_, key_b) = stack.create_tenant("neighbour", 8).await;
    let mut a = Heard::open(&stack, &key_a).await;
    let mut b = Heard::open(&stack, &key_b).await;
    let mut admin = Heard::open(&stack, ADMIN_TOKEN).await;

    let (s, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key_a,
            Some(json!({"gpus": 1, "gpu_model": "H100-80GB"})),
        )
        .await;
    assert_eq!(s, 202, "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();
    let started = "\"type\":\"lease.started\",".to_string();
    let heard = a
        .until(|t| t.contains(&started) && t.contains(&id))
        .await
        .to_string();
    assert!(heard.contains("event: lease"), "{heard}");
    assert!(heard.contains("\"type\":\"lease.requested\""), "{heard}");
    assert!(
        !heard.contains("event: node"),
        "a tenant hears of no node: {heard}"
    );
    assert!(!heard.contains("tenant_id"), "{heard}");
    // The operator hears the lease and the node it took.
    admin
        .until(|t| t.contains(&id) && t.contains("\"node_id\":\"node-c\""))
        .await;

    // Another tenant hears nothing of it.
    let (s, _) = stack
        .call(
            Method::POST,
            "/v1/nodes/node-b/drain",
            ADMIN_TOKEN,
            Some(json!({"mode": "finish"})),
        )
        .await;
    assert!((200..300).contains(&s));
    admin
        .until(|t| t.contains("\"type\":\"node.cordoned\""))
        .await;
    let other = b.more_within(Duration::from_secs(2)).await;
    assert!(!other.contains(&id), "{other}");
    assert!(!other.contains("event: node"), "{other}");
    assert!(!other.contains("event: lease"), "{other}");

    // Opened again after the lease's request, a stream is told what came
    // since (its placing and start), and nothing it heard before; another
    // tenant's, opened after the same change, nothing of it.
    let requested = heard
        .split("\n\n")
        .find(|block| block.contains("\"type\":\"lease.requested\"") && block.contains(&id))
        .and_then(|block| block.lines().find_map(|l| l.strip_prefix("id:")))
        .map(|id| id.trim().to_string())
        .expect("the request's id");
    let mut again = Heard::open_after(&stack, &key_a, Some(&requested)).await;
    let replayed = again.until(|t| t.contains(&started)).await.to_string();
    assert!(replayed.contains("\"type\":\"lease.placed\""), "{replayed}");
    assert!(
        !replayed.contains("\"type\":\"lease.requested\""),
        "{replayed}"
    );
    let mut b_again = Heard::open_after(&stack, &key_b, Some(&requested)).await;
    let other = b_again.more_within(Duration::from_secs(1)).await;
    assert!(!other.contains(&id), "{other}");
    let refused = reqwest::Client::new()
        .get(format!("{}/v1/events/stream", stack.gateway_url))
        .bearer_auth(&key_a)
        .header("Last-Event-ID", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let problem: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(problem["field"], "Last-Event-ID", "{problem}");

    // A stream's life is bounded; a bad bound is named.
    let (s, p) = stack
        .call(Method::GET, "/v1/events/stream?for_secs=0", &key_a, None)
        .await;
    assert_eq!((s, p["field"].as_str()), (422, Some("for_secs")), "{p}");
    let anonymous = reqwest::get(format!("{}/v1/events/stream", stack.gateway_url))
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
}
