//! How soon each page of the console shows, measured in a real browser
//! against a stack holding 1,000 leases: every page in each role's menu,
//! and a lease's page, loaded afresh. The browser's own clock measures
//! from the navigation's start to the first view of the page's content
//! (its heading drawn, nothing still loading). This measures; it asserts
//! only that every page shows. The figures are printed, and written as
//! JSON to `LH_CONSOLE_TIMINGS` where that is set (docs/benchmarks.md).

use std::time::Duration;

use lh_test_stack::{Stack, ADMIN_TOKEN, AUDITOR_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

use crate::browser::Browser;

/// Leases the tenant holds when the pages are measured.
const LEASES: usize = 1000;
/// Requests in flight at once while the leases are asked for.
const ASKING_AT_ONCE: usize = 16;

/// Resolves with the page's milliseconds since its navigation began, once
/// `main` holds a heading and no word that it is still loading.
const FIRST_VIEW: &str = r#"
const done = arguments[arguments.length - 1];
const loading = arguments[0];
const ready = () => {
  const main = document.querySelector("main");
  return main && main.querySelector("h2") && !main.textContent.includes(loading);
};
const check = () => (ready() ? done(performance.now()) : requestAnimationFrame(check));
check();
"#;

/// Each page of the menu the caller signed in as sees, and `extra`, loaded
/// afresh: its name and milliseconds to its first view.
async fn measure(browser: &Browser, console: &str, extra: &[String]) -> Vec<(String, f64)> {
    browser.wait("nav a").await;
    let links = browser
        .run_script(
            "return [...document.querySelectorAll('nav a')].map(a => a.getAttribute('href'));",
            json!([]),
        )
        .await;
    let mut pages: Vec<String> = links
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    pages.extend(extra.iter().cloned());
    let mut times = Vec::new();
    for page in pages {
        // A page of its own each time: no script or answer carried over
        // but the browser's cache, as a user opening it anew.
        browser.go("about:blank").await;
        browser.go(&format!("{console}{page}")).await;
        let ms = browser
            .call(
                Method::POST,
                "/execute/async",
                json!({"script": FIRST_VIEW, "args": ["Loading"]}),
            )
            .await;
        let Some(ms) = ms.as_f64() else {
            let calls = browser
                .run_script(
                    "return performance.getEntriesByType('resource').map(e => e.name + ' ' + Math.round(e.duration) + ' ' + e.responseStatus);",
                    json!([]),
                )
                .await;
            let probe = browser
                .call(
                    Method::POST,
                    "/execute/async",
                    json!({"script": "const done = arguments[0]; const c = new AbortController(); setTimeout(() => c.abort(), 3000); fetch('/v1/gpus', {signal: c.signal}).then(r => done('answered ' + r.status)).catch(e => done('no answer: ' + e));", "args": []}),
                )
                .await;
            panic!(
                "{page} never showed: {ms}; it shows: {}; its calls: {calls}; a call now: {probe}",
                browser.page_text().await
            );
        };
        println!("first view {page:24} {ms:7.0} ms");
        times.push((page, ms));
    }
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_page_shows_first_with_a_thousand_leases_measured() {
    let stack = Stack::start_configured(FLEET, |s| {
        // The front door as deployed: a page's files and calls within the
        // budgets a browser meets on `make up`.
        let deployed = lh_gateway::http::front::FrontArgs::default();
        s.gateway_front.requests_per_s_per_key = deployed.requests_per_s_per_key;
        s.gateway_front.request_burst_per_key = deployed.request_burst_per_key;
        s.gateway_front.anonymous_requests_per_s_per_ip = deployed.anonymous_requests_per_s_per_ip;
        s.gateway_front.anonymous_request_burst_per_ip = deployed.anonymous_request_burst_per_ip;
        s.gateway_config = Some(std::sync::Arc::new(|c: &mut lh_gateway::Config| {
            c.limits.writes_per_s = 10_000.0;
            c.limits.write_burst = 10_000;
        }));
    })
    .await;
    let (tenant, key) = stack.create_tenant("busy", 8).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/leases", stack.gateway_url);
    let asks = (0..LEASES).map(|i| {
        let http = http.clone();
        let url = url.clone();
        let key = key.clone();
        async move {
            let model = ["A100-40GB", "H100-80GB", "A10G-24GB"][i % 3];
            // Asked as fast as the key's request budget lets.
            let answer = loop {
                let answer = http
                    .post(&url)
                    .bearer_auth(&key)
                    .json(&json!({"gpus": 1, "gpu_model": model}))
                    .send()
                    .await
                    .unwrap();
                if answer.status() != 429 {
                    break answer;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            assert_eq!(answer.status(), 202);
            let body: Value = answer.json().await.unwrap();
            body["id"].as_str().unwrap().to_string()
        }
    });
    use futures::StreamExt as _;
    let ids: Vec<String> = futures::stream::iter(asks)
        .buffer_unordered(ASKING_AT_ONCE)
        .collect()
        .await;
    // The read model holds them all before the pages are measured.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (_, newest) = stack
            .call(Method::GET, "/v1/leases?limit=1", ADMIN_TOKEN, None)
            .await;
        let (_, page) = stack
            .call(
                Method::GET,
                &format!("/v1/leases/{}", ids[LEASES - 1]),
                &key,
                None,
            )
            .await;
        if page["id"].is_string() && newest["items"].as_array().is_some_and(|i| !i.is_empty()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the leases never showed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // What the pages' slowest calls take on their own, for the record.
    for path in [
        "/v1/leases?limit=100".to_string(),
        "/v1/gpus".into(),
        "/v1/whoami".into(),
        format!("/v1/tenants/{tenant}/balance"),
    ] {
        let path = path.as_str();
        let started = std::time::Instant::now();
        let (s, _) = stack.call(Method::GET, path, &key, None).await;
        assert_eq!(s, 200, "{path}");
        println!(
            "API {path:24} {:7.0} ms",
            started.elapsed().as_secs_f64() * 1000.0
        );
    }
    let console = format!("{}/console/", stack.gateway_url);
    let browser = Browser::start().await;
    let mut report = serde_json::Map::new();
    for (role, secret, extra) in [
        ("tenant", key.as_str(), vec![format!("#/lease/{}", ids[0])]),
        ("admin", ADMIN_TOKEN, vec![format!("#/lease/{}", ids[0])]),
        ("auditor", AUDITOR_TOKEN, vec![]),
    ] {
        browser.go("about:blank").await;
        browser.sign_in(&console, secret).await;
        println!("as {role}:");
        let times = measure(&browser, &console, &extra).await;
        assert!(!times.is_empty());
        report.insert(
            role.into(),
            json!(times
                .iter()
                .map(|(page, ms)| json!({"page": page, "ms": ms}))
                .collect::<Vec<_>>()),
        );
        browser.click("#signout").await;
    }
    if let Some(path) = std::env::var_os("LH_CONSOLE_TIMINGS") {
        let report = json!({"leases": LEASES, "pages": report});
        std::fs::write(path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    }
}
