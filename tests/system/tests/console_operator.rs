//! The operator's console in a real browser (headless Chromium over
//! WebDriver, as `console.rs`), against a real stack: an operator drains a
//! node from the fleet page and gives it back, suspends a tenant (whose
//! writes the API then refuses), sets its quota, issues and revokes a key,
//! publishes a price book and reads the day's report; the auditor reads
//! those pages without their buttons; a tenant who types their addresses
//! is told they are not its to see, and the API refuses it their calls.

use std::time::{Duration, Instant};

use lh_test_stack::{Stack, ADMIN_TOKEN, AUDITOR_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

use crate::browser::Browser;

/// WebDriver's Tab and Enter keys.
const TAB: &str = "\u{E004}";
const ENTER: &str = "\u{E007}";

/// Polls the API until `pred` holds of the answer to `GET path`, 30 s at most.
async fn api_until(stack: &Stack, path: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = stack.call(Method::GET, path, ADMIN_TOKEN, None).await;
        if status == 200 && pred(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "GET {path} never as expected: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_drains_suspends_issues_prices_and_reports_and_a_tenant_may_not() {
    let stack = Stack::start(FLEET).await;
    let (tenant, key) = stack.create_tenant("acme", 8).await;
    let lease = stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A10G-24GB"}))
        .await;
    let lease_id = lease["id"].as_str().unwrap().to_string();
    let console = format!("{}/console/", stack.gateway_url);

    // The list of tenants the pages read: operators', oldest first, paged,
    // bounded.
    let (_, other) = stack.create_tenant("globex", 2).await;
    let (status, page) = stack
        .call(Method::GET, "/v1/tenants?limit=1", AUDITOR_TOKEN, None)
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1), "{page}");
    assert_eq!(page["items"][0]["id"], tenant.as_str(), "{page}");
    assert_eq!(page["items"][0]["name"], "acme", "{page}");
    assert_eq!(page["items"][0]["max_gpus"], 8, "{page}");
    assert_eq!(page["next_after"], tenant.as_str(), "{page}");
    let (status, second) = stack
        .call(
            Method::GET,
            &format!("/v1/tenants?limit=1&after={tenant}"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["items"][0]["name"], "globex", "{second}");
    assert!(second.get("next_after").is_none(), "{second}");
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("after=nope", "after"),
    ] {
        let (status, problem) = stack
            .call(
                Method::GET,
                &format!("/v1/tenants?{query}"),
                ADMIN_TOKEN,
                None,
            )
            .await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (422, Some(field)),
            "{query}: {problem}"
        );
    }
    assert_eq!(
        stack.call(Method::GET, "/v1/tenants", &other, None).await.0,
        403,
        "a tenant lists no tenants"
    );

    let browser = Browser::start().await;
    browser.sign_in(&console, ADMIN_TOKEN).await;
    for page in ["fleet", "tenants", "prices", "report"] {
        browser.wait(&format!("#nav-{page}")).await;
    }

    // The fleet: each GPU's readings in its label, its heat by utilisation.
    browser.click("#nav-fleet").await;
    browser.wait("[data-node='node-a'] .cell").await;
    let cell = browser.wait("[data-node='node-b'] .cell.held").await;
    let label = browser
        .attribute(&cell, "aria-label")
        .await
        .unwrap_or_default();
    for word in ["utilisation", "memory", "temperature", "A10G-24GB"] {
        assert!(label.contains(word), "{word} not in {label:?}");
    }
    // The simulated nodes read a utilisation: the cell is shaded by it.
    let class = browser.attribute(&cell, "class").await.unwrap_or_default();
    assert!(class.contains("busy-"), "{class}");

    // Drained from the keyboard: the mode chosen, Tab to the button, Enter.
    browser
        .choose("drain-mode-node-a", "move to other nodes")
        .await;
    browser.press(TAB).await;
    assert_eq!(browser.focused_id().await, "drain-node-a");
    browser.press(ENTER).await;
    browser
        .wait_text_of("[data-node='node-a'] .node-state", "draining (move)")
        .await;
    api_until(&stack, "/v1/nodes/node-a", |n| n["state"] == "draining").await;
    browser.screenshot("console-fleet-drain").await;
    browser.click("#uncordon-node-a").await;
    browser
        .wait_text_of("[data-node='node-a'] .node-state", "ready")
        .await;
    api_until(&stack, "/v1/nodes/node-a", |n| n["state"] == "ready").await;

    // The tenants: suspended from the list, its writes then refused.
    browser.click("#nav-tenants").await;
    let state = format!("tr[data-tenant='{tenant}'] td.tenant-state");
    browser.wait_text_of(&state, "Active").await;
    browser.screenshot("console-tenants").await;
    browser.click(&format!("#suspend-{tenant}")).await;
    browser.wait_text_of(&state, "Suspended").await;
    let quote = json!({"gpus": 1, "gpu_model": "A100-40GB", "duration_seconds": 3600});
    let (status, refused) = stack
        .call(Method::POST, "/v1/quotes", &key, Some(quote.clone()))
        .await;
    assert_eq!(status, 403, "a suspended tenant's write: {refused}");

    // Its own page: the quota set, a key issued (shown once) and revoked.
    browser.click(&format!("#manage-{tenant}")).await;
    browser.wait_text_of("#tenant-state", "Suspended").await;
    browser.set_field("#quota-max-gpus", "3").await;
    browser.set_field("#quota-max-storage-gb", "250").await;
    browser.click("#quota-save").await;
    browser.wait_text_of("#quota-said", "Quota saved.").await;
    let (_, seen) = stack
        .call(
            Method::GET,
            &format!("/v1/tenants/{tenant}"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(
        (seen["max_gpus"].as_u64(), seen["max_storage_gb"].as_u64()),
        (Some(3), Some(250)),
        "{seen}"
    );
    browser.wait("tr[data-key='1']").await;
    browser.click("#issue-key").await;
    let issued = browser.text(&browser.wait("#issued-key code").await).await;
    assert!(issued.starts_with("lh_"), "{issued}");
    let (status, whoami) = stack.call(Method::GET, "/v1/whoami", &issued, None).await;
    assert_eq!(
        (status, whoami["tenant_id"].as_str()),
        (200, Some(tenant.as_str())),
        "{whoami}"
    );
    browser
        .wait_text_of("tr[data-key='2'] td.key-state", "active")
        .await;
    browser.screenshot("console-tenant").await;
    browser.click("#revoke-key-2").await;
    browser
        .wait_text_of("tr[data-key='2'] td.key-state", "revoked")
        .await;
    assert_eq!(
        stack.call(Method::GET, "/v1/whoami", &issued, None).await.0,
        401
    );
    browser.click("#back-to-tenants").await;
    browser.click(&format!("#resume-{tenant}")).await;
    browser.wait_text_of(&state, "Active").await;
    let (status, quoted) = stack
        .call(Method::POST, "/v1/quotes", &key, Some(quote))
        .await;
    assert_eq!(status, 201, "resumed, it writes again: {quoted}");

    // The prices: the book in force, a new version, spot prices now.
    browser.click("#nav-prices").await;
    browser
        .wait_text_of("tr[data-version='1'] .in-force", "in force")
        .await;
    browser
        .wait("#spot-prices tr[data-market='cn-east-1b/A10G-24GB']")
        .await;
    browser.set_field("#book-price-basic", "0.55").await;
    browser.click("#publish-book").await;
    let published = browser.text(&browser.wait("#book-published").await).await;
    assert!(published.starts_with("Version 2 published"), "{published}");
    browser.wait("tr[data-version='2'] .in-force").await;
    browser.screenshot("console-prices").await;
    let books = api_until(&stack, "/v1/price-books", |b| {
        b["books"].as_array().is_some_and(|b| b.len() == 2)
    })
    .await;
    let v2 = books["books"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["version"] == 2)
        .unwrap();
    let tier = |name: &str| {
        v2["tiers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tier"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(tier("basic")["price_cny_per_gb_hour"], "0.55", "{v2}");
    assert!(
        tier("basic")["model"].is_null(),
        "a changed price is flat: {v2}"
    );
    assert_eq!(
        tier("performance")["model"]["kind"],
        "graduated",
        "an unchanged tier keeps its model: {v2}"
    );
    assert_eq!(tier("spot")["model"]["kind"], "market", "{v2}");

    // Today's report: every GPU of the fleet, the lease that ran on one.
    browser.click("#nav-report").await;
    browser.wait("#report-day").await;
    browser.wait_text_of("#report-gpus", "20").await;
    let leases: u32 = browser
        .text(&browser.wait("#report-leases").await)
        .await
        .parse()
        .unwrap();
    assert!(leases >= 1, "{leases}");
    browser
        .wait(&format!("#report-timeline g.bar[data-lease='{lease_id}']"))
        .await;
    browser.wait("#report-heat tr[data-gpu='node-b/0']").await;
    let group = "#report-models tr[data-group='A10G-24GB/cn-east-1b']";
    browser
        .wait_text_of(&format!("{group} td:nth-child(3)"), "4")
        .await;
    // Its lease held one of its 4 GPUs for at least the hour it began in.
    let leased: u32 = browser
        .text(&browser.wait(&format!("{group} td:nth-child(5)")).await)
        .await
        .parse()
        .unwrap();
    assert!(leased >= 1, "{leased}");
    browser.screenshot("console-report").await;
    // A day before the fleet registered shows no GPU; each page of the
    // trail the report read was recorded as the operator's.
    let yesterday = (chrono::Utc::now() - chrono::Duration::days(1)).format("%Y-%m-%d");
    browser.go(&format!("{console}#/report/{yesterday}")).await;
    browser.wait("#report-no-gpus").await;
    let reads_by_admin = |page: &Value| {
        page["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["actor"] == "admin:bootstrap")
            .count()
    };
    // Two days of 10 event types each, a page or more each.
    api_until(
        &stack,
        "/v1/audit/events?type=audit.accessed&limit=1000",
        |page| reads_by_admin(page) >= 20,
    )
    .await;

    // The auditor reads the same pages without their buttons.
    browser.click("#signout").await;
    browser.sign_in(&console, AUDITOR_TOKEN).await;
    browser.click("#nav-tenants").await;
    browser.wait_text_of(&state, "Active").await;
    assert!(browser.find(&format!("#suspend-{tenant}")).await.is_none());
    assert!(browser.find("#nav-fleet").await.is_none());
    browser.click("#nav-prices").await;
    browser.wait("#price-books").await;
    assert!(browser.find("#publish-book").await.is_none());

    // A tenant that types an operator's page is told it is not its own,
    // and the API refuses it what those pages call.
    browser.click("#signout").await;
    browser.sign_in(&console, &key).await;
    browser.wait("#gpu-table").await;
    for page in ["fleet", "tenants", "prices", "report"] {
        assert!(
            browser.find(&format!("#nav-{page}")).await.is_none(),
            "{page} in a tenant's menu"
        );
        browser.go(&format!("{console}#/{page}")).await;
        browser.wait("#not-here").await;
        browser.go(&format!("{console}#/gpus")).await;
        browser.wait("#gpu-table").await;
    }
    for (method, path, body) in [
        (Method::GET, "/v1/nodes".to_string(), None),
        (Method::GET, "/v1/tenants".to_string(), None),
        (
            Method::POST,
            "/v1/nodes/node-a/drain".to_string(),
            Some(json!({"mode": "finish"})),
        ),
        (Method::POST, "/v1/nodes/node-a/uncordon".to_string(), None),
        (
            Method::POST,
            format!("/v1/tenants/{tenant}/suspend"),
            Some(json!({})),
        ),
        (
            Method::PUT,
            format!("/v1/tenants/{tenant}/quota"),
            Some(json!({"quota": {"max_gpus": 99}})),
        ),
        (
            Method::POST,
            "/v1/price-books".to_string(),
            Some(
                json!({"version": 9, "tiers": [{"tier": "basic", "price_cny_per_gb_hour": "0.01"}]}),
            ),
        ),
    ] {
        let (status, answer) = stack.call(method.clone(), &path, &key, body).await;
        assert_eq!(status, 403, "{method} {path} as a tenant: {answer}");
    }
}
