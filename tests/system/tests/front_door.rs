//! The gateway's front door: request budgets per credential and per client
//! address (429 with Retry-After), TLS when a certificate is configured, a
//! bound on a request's run, and 5xx bodies that carry no internal text.

use std::time::Duration;

use lh_test_stack::{Stack, ADMIN_TOKEN, FLEET};
use reqwest::{Method, StatusCode};
use serde_json::Value;

async fn get(stack: &Stack, path: &str, key: Option<&str>) -> reqwest::Response {
    let mut request = stack.http.get(format!("{}{path}", stack.gateway_url));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap()
}

async fn assert_limited(response: reqwest::Response, says: &str) {
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u32 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3600).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: Value = response.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains(says), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_credential_and_each_anonymous_address_has_its_own_request_budget() {
    let mut stack = Stack::start(FLEET).await;
    let (_, a) = stack.create_tenant("acme", 8).await;
    let (_, b) = stack.create_tenant("beta", 8).await;
    stack.gateway_front.requests_per_s_per_key = 0.01;
    stack.gateway_front.request_burst_per_key = 3;
    stack.gateway_front.anonymous_requests_per_s_per_ip = 0.01;
    stack.gateway_front.anonymous_request_burst_per_ip = 2;
    stack.stop_service("gateway").await;
    stack.start_service("gateway").await;
    stack.wait_ready().await;

    for _ in 0..3 {
        assert_eq!(get(&stack, "/v1/leases", Some(&a)).await.status(), 200);
    }
    assert_limited(get(&stack, "/v1/leases", Some(&a)).await, "credential").await;
    // Another tenant's key is not held back by the first one's flood.
    assert_eq!(get(&stack, "/v1/leases", Some(&b)).await.status(), 200);
    // Without a credential, the client's address has a budget of its own.
    for _ in 0..2 {
        assert_eq!(get(&stack, "/v1/leases", None).await.status(), 401);
    }
    assert_limited(get(&stack, "/v1/leases", None).await, "address").await;
    // Nor is a new wrong key each time a way around the budgets: refused
    // credentials are counted per address, and past the burst that address
    // waits whatever key it shows.
    for wrong in ["lh_wrong_1", "lh_wrong_2"] {
        assert_eq!(get(&stack, "/v1/leases", Some(wrong)).await.status(), 401);
    }
    assert_limited(
        get(&stack, "/v1/leases", Some("lh_wrong_3")).await,
        "refused credentials",
    )
    .await;
    assert_limited(
        get(&stack, "/v1/leases", Some(&b)).await,
        "refused credentials",
    )
    .await;
    // The console's files, which a page fetches without a key, twenty at
    // a time, are not the anonymous API's budget: the address held back
    // above still loads the console, and its budget is still spent.
    for _ in 0..3 {
        for file in [
            "/console/",
            "/console/app.js",
            "/console/ui.js",
            "/console/api.js",
            "/console/i18n.js",
        ] {
            assert_eq!(get(&stack, file, None).await.status(), 200, "{file}");
        }
    }
    assert_limited(get(&stack, "/v1/leases", None).await, "address").await;
    // Health is never budgeted: orchestrators must always get an answer.
    for _ in 0..10 {
        assert_eq!(get(&stack, "/readyz", None).await.status(), 200);
    }
    stack.assert_none_stopped();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_that_outruns_its_bound_is_answered_503_and_internal_errors_say_nothing_inside() {
    let mut stack = Stack::start(FLEET).await;
    stack.gateway_front.request_timeout_secs = 1;
    stack.stop_service("gateway").await;
    stack.start_service("gateway").await;
    stack.wait_ready().await;
    let (_, key) = stack.create_tenant("acme", 8).await;

    // A read that cannot finish: the read model's table locked by someone
    // else, as a long migration or a stuck transaction would.
    use sqlx::Connection as _;
    let mut locker = sqlx::PgConnection::connect(&stack.database_url)
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE gateway.leases IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let response = get(&stack, "/v1/leases", Some(&key)).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.unwrap();
    assert!(
        body["detail"].as_str().unwrap().contains("longer than 1 s"),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut locker)
        .await
        .unwrap();
    assert_eq!(get(&stack, "/v1/leases", Some(&key)).await.status(), 200);

    // A service behind the gateway gone: the 503 says so and nothing more.
    stack.stop_service("pricing").await;
    let response = get(&stack, "/v1/invoices?period=2026-12", Some(&key)).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = response.text().await.unwrap().to_lowercase();
    for inside in ["lh.rpc", "no responders", "nats", "pricing"] {
        assert!(!body.contains(inside), "503 body tells {inside:?}: {body}");
    }
    stack.start_service("pricing").await;

    // The log out of reach: the 503 names no subject, stream or server.
    stack.nats.server().kill();
    let (status, body) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(serde_json::json!({"gpus": 1, "gpu_model": "A10G-24GB"})),
        )
        .await;
    assert_eq!(status, 503, "{body}");
    let text = body.to_string().to_lowercase();
    for inside in ["lh.evt", "$js", "nats", "jetstream", "stream", "127.0.0.1"] {
        assert!(!text.contains(inside), "503 body tells {inside:?}: {body}");
    }
    stack.nats.server().restart().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_certificate_the_api_speaks_only_tls() {
    let mut stack = Stack::start(FLEET).await;
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file) = (dir.path().join("api.crt"), dir.path().join("api.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    stack.gateway_front.tls_cert_file = Some(cert_file);
    stack.gateway_front.tls_key_file = Some(key_file);
    stack.stop_service("gateway").await;
    stack.start_service("gateway").await;

    let addr = stack.http_addr("gateway");
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.pem().as_bytes()).unwrap())
        .resolve("localhost", addr)
        .build()
        .unwrap();
    let url = format!("https://localhost:{}", addr.port());
    let ready = async {
        loop {
            if let Ok(r) = client.get(format!("{url}/readyz")).send().await {
                if r.status() == 200 {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), ready)
        .await
        .expect("the gateway answers over TLS");
    let r = client
        .get(format!("{url}/v1/leases"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        r.status().is_success() || r.status() == 403,
        "{}",
        r.status()
    );
    // Plain HTTP on the TLS port gets no answer.
    let plain = stack
        .http
        .get(format!("http://{addr}/readyz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(
        plain.map(|r| !r.status().is_success()).unwrap_or(true),
        "plain HTTP answered on the TLS port"
    );
}
