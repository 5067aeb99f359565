//! The console in a real browser: headless Chromium from Debian's packages,
//! driven over WebDriver (chromedriver), against a real stack. A tenant
//! signs in with its key, sees the GPUs it may rent, switches to Chinese,
//! and sees its lease run without reloading; an operator sees the fleet,
//! which the tenant's console does not offer; the files come with a strict
//! Content Security Policy.

use std::time::{Duration, Instant};

use lh_test_stack::{Stack, ADMIN_TOKEN, FLEET};
use reqwest::Method;
use serde_json::json;

use crate::browser::Browser;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_signs_in_sees_what_it_may_rent_and_its_lease_run_and_an_operator_the_fleet() {
    let stack = Stack::start(FLEET).await;
    let (_, key) = stack.create_tenant("browser", 8).await;
    let console = format!("{}/console/", stack.gateway_url);

    // The page and its scripts, under a policy that loads nothing else.
    let page = reqwest::get(&console).await.unwrap();
    assert_eq!(page.status(), 200);
    let policy = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'"),
        "{policy}"
    );
    assert!(!policy.contains("unsafe-inline"), "{policy}");
    assert_eq!(
        reqwest::get(format!("{}/console/nope.js", stack.gateway_url))
            .await
            .unwrap()
            .status(),
        404
    );

    let browser = Browser::start().await;
    // A bad key is refused where it was typed.
    browser.sign_in(&console, "lh_not_a_key").await;
    browser.wait("#signin-error").await;
    browser.screenshot("console-sign-in").await;
    browser.sign_in(&console, &key).await;
    let table = browser.wait("#gpu-table").await;
    let text = browser.text(&table).await;
    assert!(
        text.contains("A100-40GB") && text.contains("H100-80GB") && text.contains("cn-north-1a"),
        "{text}"
    );
    browser.screenshot("console-gpus").await;
    // A tenant's console offers no fleet.
    assert!(browser.find("#nav-fleet").await.is_none());

    // In Chinese, at a word.
    browser.choose("language", "中文").await;
    browser.wait_text("算力租赁").await;
    browser.wait_text("可用区").await;
    browser.screenshot("console-gpus-zh").await;
    browser.choose("language", "English").await;
    browser.wait_text("Zone").await;

    // Its lease shows up and runs without a reload: the page follows the
    // event stream.
    browser.click("#nav-leases").await;
    browser.wait_text("No leases yet.").await;
    let (s, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A10G-24GB"})),
        )
        .await;
    assert_eq!(s, 202, "{lease}");
    let id = lease["id"].as_str().unwrap();
    let row = browser
        .wait(&format!("tr[data-lease='{id}'] td.state"))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while browser.text(&row).await != "running" {
        assert!(Instant::now() < deadline, "the lease never shows running");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    browser.screenshot("console-leases").await;

    // A lease from the form, priced before it is asked for, then stopped
    // from its page.
    browser.click("#nav-new").await;
    browser.choose("model", "H100-80GB").await;
    browser.set_field("#gpus", "2").await;
    browser.set_field("#hours", "3").await;
    browser.wait_text("for 3 h").await;
    let quote = browser.text(&browser.wait("#quote").await).await;
    assert!(quote.contains("CNY"), "{quote}");
    browser.screenshot("console-new-lease").await;
    browser.click("#rent").await;
    browser.wait_text_of("#lease-state", "running").await;
    browser.wait_text("H100-80GB × 2").await;
    let rented = browser.text(&browser.wait("#lease-title code").await).await;
    browser.screenshot("console-lease").await;
    browser.click("#stop").await;
    browser.wait_text_of("#lease-state", "ended").await;

    // The month's invoice, downloaded as CSV.
    browser.click("#nav-invoices").await;
    browser.click("#invoice-table button.csv").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let csv = loop {
        let done: Vec<_> = std::fs::read_dir(browser.downloads.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "csv"))
            .collect();
        if let Some(path) = done.first() {
            break std::fs::read_to_string(path).unwrap();
        }
        assert!(Instant::now() < deadline, "no CSV downloaded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(csv.starts_with("document,number,status"), "{csv}");
    assert!(csv.contains(&rented), "{rented} not in {csv}");
    browser.screenshot("console-invoices").await;

    // An operator sees the fleet: every node, the A10G lease's node held.
    browser.click("#signout").await;
    browser.sign_in(&console, ADMIN_TOKEN).await;
    browser.click("#nav-fleet").await;
    browser.wait("[data-node='node-a']").await;
    browser.wait("[data-node='node-b'] .cell.held").await;
    let text = browser.wait_text("node-c").await;
    assert!(text.contains("ready"), "{text}");
    browser.screenshot("console-fleet").await;
}
