//! The auditor's page and a tenant's account pages in a real browser,
//! against a real stack. An auditor sees the hash chain verified and
//! re-verifies it, filters the trail, pages it, and exports it: the file
//! holds exactly the records the API answers for the same filters, read
//! over more than one page. A tenant sees its prepaid balance and the rate
//! its running lease burns it at, adds and removes an SSH key, issues an
//! API key and revokes it (the API refuses it then), and sees its datasets
//! and workspaces (on a real object store) as the API lists them,
//! snapshots, restores and removes them; the auditor's page is not its.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lh_gateway::storage::StorageArgs;
use lh_test_stack::{Stack, ADMIN_TOKEN, AUDITOR_TOKEN, FLEET};
use lh_testkit::S3Store;
use reqwest::Method;
use serde_json::{json, Value};

use crate::browser::Browser;

/// Reads of the trail made with the admin's token before the export: more
/// than one page of an export (1000 records), so that it follows the cursor.
const ADMIN_READS: usize = 1050;
/// Admin reads in flight at once.
const ADMIN_READS_IN_FLIGHT: usize = 8;
/// How long the audit copy, pricing's balance or a download may take.
const PATIENCE: Duration = Duration::from_secs(90);

/// Every record the filter `query` answers the auditor, a page at a time.
async fn every_record(stack: &Stack, query: &str) -> Vec<Value> {
    let mut records = Vec::new();
    let mut after = 0;
    for _ in 0..100 {
        let path = format!("/v1/audit/events?{query}&after={after}&limit=1000");
        let (status, page) = stack.call(Method::GET, &path, AUDITOR_TOKEN, None).await;
        assert_eq!(status, 200, "{path}: {page}");
        records.extend(page["events"].as_array().unwrap().iter().cloned());
        match page["next"].as_u64() {
            Some(next) => after = next,
            None => return records,
        }
    }
    panic!("no end of pages for {query}");
}

/// [`every_record`], once it holds `want` records (the audit copy follows
/// the log).
async fn records_once(stack: &Stack, query: &str, want: usize) -> Vec<Value> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let records = every_record(stack, query).await;
        if records.len() >= want {
            return records;
        }
        assert!(
            Instant::now() < deadline,
            "{query}: {} records, not {want}",
            records.len()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn sequences(records: &[Value]) -> Vec<u64> {
    records
        .iter()
        .map(|r| r["sequence"].as_u64().unwrap())
        .collect()
}

/// The file with `extension` the browser saved that is not in `before`,
/// once it is whole.
async fn downloaded(browser: &Browser, extension: &str, before: &BTreeSet<PathBuf>) -> PathBuf {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let found = std::fs::read_dir(browser.downloads.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == extension) && !before.contains(p));
        if let Some(path) = found {
            return path;
        }
        assert!(Instant::now() < deadline, "no .{extension} downloaded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn saved(browser: &Browser) -> BTreeSet<PathBuf> {
    std::fs::read_dir(browser.downloads.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// The text of `css` once `done` holds of it, within [`PATIENCE`].
async fn text_once(browser: &Browser, css: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(element) = browser.find(css).await {
            let text = browser.text(&element).await;
            if done(&text) {
                return text;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{css} never as wanted: {}",
            browser.page_text().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn verified_sequence(browser: &Browser) -> u64 {
    let text = browser.text(&browser.wait("#verify-sequence").await).await;
    text.parse()
        .unwrap_or_else(|_| panic!("{text:?} is no sequence"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_auditor_verifies_the_chain_filters_pages_and_exports_exactly_what_the_api_answers() {
    let stack = Stack::start(FLEET).await;
    let (tenant_a, key_a) = stack.create_tenant("audited", 8).await;
    let (_, key_b) = stack.create_tenant("bystander", 8).await;
    for key in [&key_a, &key_b, &key_a] {
        stack
            .running(key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
            .await;
    }
    let placed_of_a = format!("tenant_id={tenant_a}&type=lease.placed");
    let expected = records_once(&stack, &placed_of_a, 2).await;
    assert_eq!(expected.len(), 2, "{expected:?}");

    let console = format!("{}/console/", stack.gateway_url);
    let browser = Browser::start().await;
    browser.sign_in(&console, AUDITOR_TOKEN).await;
    browser.click("#nav-audit").await;
    let status = text_once(&browser, "#verify-status", |t| !t.is_empty()).await;
    assert!(status.starts_with("Verified"), "{status}");
    let verdict = browser.wait("#verify-status").await;
    assert_eq!(
        browser.attribute(&verdict, "class").await.as_deref(),
        Some("verdict good")
    );
    let first = verified_sequence(&browser).await;
    let (s, report) = stack
        .call(Method::GET, "/v1/audit/verify", AUDITOR_TOKEN, None)
        .await;
    assert_eq!(s, 200, "{report}");
    assert_eq!(report["ok"], true, "{report}");
    assert!(
        first > 0 && first <= report["sequence"].as_u64().unwrap(),
        "{first} against {report}"
    );
    // Only an admin may replay the whole log.
    assert!(browser.find("#reverify-full").await.is_none());
    browser.screenshot("console-audit").await;

    // The admin reads the trail, each read recorded: the chain grows, and
    // re-verifying shows it verified further.
    let (_, me) = stack
        .call(Method::GET, "/v1/whoami", ADMIN_TOKEN, None)
        .await;
    let admin = format!("admin:{}", me["name"].as_str().unwrap());
    futures::stream::iter(0..ADMIN_READS)
        .map(|_| async {
            let (s, page) = stack
                .call(Method::GET, "/v1/audit/events?limit=1", ADMIN_TOKEN, None)
                .await;
            assert_eq!(s, 200, "{page}");
        })
        .buffer_unordered(ADMIN_READS_IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
    let reads_of_admin = format!("actor={admin}&type=audit.accessed");
    let reads = records_once(&stack, &reads_of_admin, ADMIN_READS).await;
    assert_eq!(reads.len(), ADMIN_READS);
    let deadline = Instant::now() + PATIENCE;
    loop {
        browser.click("#reverify").await;
        text_once(&browser, "#reverify", |t| t == "Re-verify").await;
        if verified_sequence(&browser).await > first + ADMIN_READS as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "never verified past {first}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let status = browser.text(&browser.wait("#verify-status").await).await;
    assert!(status.starts_with("Verified"), "{status}");

    // Filtered by a tenant and a type: the API's records, no others.
    browser.replace_text("#audit-tenant", &tenant_a).await;
    browser.replace_text("#audit-type", "lease.placed").await;
    browser.click("#audit-filter").await;
    browser
        .wait_text_of("#audit-count", "2 records shown, oldest first.")
        .await;
    for sequence in sequences(&expected) {
        let row = browser
            .wait(&format!("#audit-table tr[data-seq='{sequence}']"))
            .await;
        let text = browser.text(&row).await;
        assert!(
            text.contains("lease.placed") && text.contains(&tenant_a),
            "{text}"
        );
    }
    assert!(browser.find("#audit-more").await.is_none());

    // Exported, as JSON Lines: exactly what the API answers.
    let before = saved(&browser);
    browser.click("#audit-export").await;
    let file = downloaded(&browser, "jsonl", &before).await;
    let told = text_once(&browser, "#export-progress", |t| {
        !t.starts_with("Exporting")
    })
    .await;
    assert_eq!(
        told,
        format!(
            "Exported 2 records to {}.",
            file.file_name().unwrap().to_str().unwrap()
        )
    );
    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, expected, "{}", file.display());
    // And as CSV: a header, then one row each.
    browser.choose("export-format", "CSV").await;
    let before = saved(&browser);
    browser.click("#audit-export").await;
    let file = downloaded(&browser, "csv", &before).await;
    let csv = std::fs::read_to_string(&file).unwrap();
    let mut rows = csv.lines();
    assert!(
        rows.next()
            .unwrap()
            .starts_with("sequence,occurred_at,actor,"),
        "{csv}"
    );
    let firsts: Vec<u64> = rows
        .map(|r| r.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(firsts, sequences(&expected), "{csv}");

    // More than a page: the table pages on, the export follows the cursor.
    // WebDriver's clear sends no input event: the page's own Clear does.
    browser.click("#audit-clear").await;
    browser
        .wait_text_of("#audit-count", "100 records shown, oldest first.")
        .await;
    browser.replace_text("#audit-actor", &admin).await;
    browser.replace_text("#audit-type", "audit.accessed").await;
    browser.click("#audit-filter").await;
    browser
        .wait_text_of("#audit-count", "100 records shown, oldest first.")
        .await;
    browser.click("#audit-more").await;
    browser
        .wait_text_of("#audit-count", "200 records shown, oldest first.")
        .await;
    let row = browser.wait("#audit-table tbody tr:last-child").await;
    assert_eq!(
        browser.attribute(&row, "data-seq").await,
        Some(reads[199]["sequence"].to_string())
    );
    browser.choose("export-format", "JSON Lines").await;
    let before = saved(&browser);
    browser.click("#audit-export").await;
    let file = downloaded(&browser, "jsonl", &before).await;
    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), ADMIN_READS);
    assert_eq!(lines, every_record(&stack, &reads_of_admin).await);
    browser
        .wait_text_of(
            "#export-progress",
            &format!(
                "Exported {ADMIN_READS} records to {}.",
                file.file_name().unwrap().to_str().unwrap()
            ),
        )
        .await;
    // A filter the API refuses is told where it was typed.
    browser.replace_text("#audit-from", "yesterday").await;
    browser.click("#audit-filter").await;
    let error = browser.text(&browser.wait("#audit-error").await).await;
    assert!(error.contains("RFC 3339"), "{error}");

    // An admin may replay the whole log from the page.
    browser.click("#signout").await;
    browser.sign_in(&console, ADMIN_TOKEN).await;
    browser.click("#nav-audit").await;
    browser.click("#reverify-full").await;
    text_once(&browser, "#reverify-full", |t| {
        t == "Re-verify from the start"
    })
    .await;
    let status = browser.text(&browser.wait("#verify-status").await).await;
    assert!(status.starts_with("Verified"), "{status}");
    let checked = browser.text(&browser.wait("#verify-report").await).await;
    assert!(checked.contains("Checked from sequence 1"), "{checked}");
}

/// A stack whose gateway keeps tenants' data on `store`.
async fn stack_on(store: &S3Store, dir: &Path) -> Stack {
    use std::os::unix::fs::PermissionsExt;
    let (key_id, secret) = store.admin_keys();
    let secret_file = dir.join("s3-admin-secret");
    std::fs::write(&secret_file, secret).unwrap();
    std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let storage = StorageArgs {
        storage_endpoint: Some(store.endpoint()),
        storage_admin_access_key_id: Some(key_id.to_string()),
        storage_admin_secret_key_file: Some(secret_file),
        ..Default::default()
    };
    Stack::start_configured(FLEET, move |s| {
        s.gateway_config = Some(Arc::new(move |c| c.storage = storage.clone()));
    })
    .await
}

/// The tenant's own bucket, with the identity the gateway gives it.
async fn own_store(stack: &Stack, key: &str) -> lh_storage::TenantStore {
    let (s, creds) = stack
        .call(Method::GET, "/v1/storage/credentials", key, None)
        .await;
    assert_eq!(s, 200, "{creds}");
    lh_storage::TenantStore::new(
        &lh_storage::StoreConfig::new(creds["endpoint"].as_str().unwrap()),
        creds["bucket"].as_str().unwrap(),
        &lh_storage::Credentials::new(
            creds["access_key_id"].as_str().unwrap(),
            creds["secret_access_key"].as_str().unwrap(),
        ),
    )
    .unwrap()
}

/// An Ed25519 public key of 32 bytes drawn from `seed`: a key as far as
/// its form goes.
fn made_up_key(seed: u8) -> String {
    use base64::Engine as _;
    let mut blob = Vec::new();
    blob.extend_from_slice(&11u32.to_be_bytes());
    blob.extend_from_slice(b"ssh-ed25519");
    blob.extend_from_slice(&32u32.to_be_bytes());
    blob.extend_from_slice(&[seed; 32]);
    format!(
        "ssh-ed25519 {} made-up-{seed}",
        base64::engine::general_purpose::STANDARD.encode(blob)
    )
}

async fn listed(stack: &Stack, key: &str, path: &str, field: &str) -> Vec<Value> {
    let (s, body) = stack.call(Method::GET, path, key, None).await;
    assert_eq!(s, 200, "{path}: {body}");
    body[field].as_array().unwrap().clone()
}

/// Clicks the button `button` of the row `row`, then its confirmation.
async fn confirmed(browser: &Browser, row: &str, button: &str) {
    browser.click(&format!("{row} button.{button}")).await;
    browser.click(&format!("{row} button.confirm")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_sees_its_burn_rate_manages_its_keys_and_its_data() {
    let store = S3Store::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stack = stack_on(&store, dir.path()).await;
    let (tenant_id, key) = stack.create_tenant("account", 8).await;
    let (s, body) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant_id}/balance/top-ups"),
            ADMIN_TOKEN,
            Some(json!({"amount": "100.00"})),
        )
        .await;
    assert_eq!(s, 201, "{body}");

    let console = format!("{}/console/", stack.gateway_url);
    let browser = Browser::start().await;
    browser.sign_in(&console, &key).await;
    browser.wait("#gpu-table").await;
    // The auditor's page is not a tenant's, in the menu or by its address.
    assert!(browser.find("#nav-audit").await.is_none());
    browser.go(&format!("{console}#/audit")).await;
    browser.wait("#not-here").await;

    // A prepaid balance, nothing burning it; then a lease of 40 GB at the
    // default book's 0.5 CNY/GB-h burns it at 20 CNY an hour.
    browser.click("#nav-account").await;
    browser.wait_text_of("#balance", "100.00 CNY").await;
    browser.wait_text_of("#hours-left", "nothing running").await;
    browser.wait_text_of("#running-leases", "0").await;
    stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    text_once(&browser, "#burn-rate", |t| t == "20 CNY/h").await;
    browser.wait_text_of("#running-leases", "1").await;
    let left = text_once(&browser, "#hours-left", |t| t.ends_with(" h")).await;
    let hours: f64 = left.trim_end_matches(" h").parse().unwrap();
    assert!(hours > 4.0 && hours <= 5.0, "{left}");
    let (s, balance) = stack
        .call(
            Method::GET,
            &format!("/v1/tenants/{tenant_id}/balance"),
            &key,
            None,
        )
        .await;
    assert_eq!(s, 200, "{balance}");
    assert_eq!(balance["burn_rate_cny_per_hour"], "20", "{balance}");
    browser.screenshot("console-account").await;

    // SSH keys: a bad one refused where it was typed, a good one added,
    // listed as the API lists it, then removed.
    browser.click("#nav-keys").await;
    browser.wait("#ssh-empty").await;
    browser.type_into("#ssh-name", "laptop").await;
    browser
        .type_into("#ssh-public-key", "ssh-ed25519 nonsense")
        .await;
    browser.click("#ssh-add").await;
    browser.wait("#ssh-error").await;
    browser
        .replace_text("#ssh-public-key", &made_up_key(7))
        .await;
    browser.click("#ssh-add").await;
    let row = browser.wait("tr[data-name='laptop']").await;
    browser.wait_gone("#ssh-error").await;
    let keys = listed(&stack, &key, "/v1/ssh-keys", "ssh_keys").await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(
        browser.attribute(&row, "data-ssh-key").await.as_deref(),
        keys[0]["id"].as_str()
    );
    let text = browser.text(&row).await;
    assert!(
        text.contains(keys[0]["fingerprint"].as_str().unwrap()),
        "{text}"
    );

    // An API key issued, shown once, working; revoked, refused.
    browser.click("#issue-key").await;
    let issued = browser.text(&browser.wait("#new-api-key").await).await;
    assert!(issued.starts_with("lh_"), "{issued}");
    let (s, me) = stack.call(Method::GET, "/v1/whoami", &issued, None).await;
    assert_eq!(
        (s, me["tenant_id"].as_str()),
        (200, Some(tenant_id.as_str()))
    );
    let keys = listed(
        &stack,
        &key,
        &format!("/v1/tenants/{tenant_id}/keys"),
        "items",
    )
    .await;
    let new = keys
        .iter()
        .find(|k| issued.starts_with(k["prefix"].as_str().unwrap()))
        .expect("the new key is listed");
    let row = format!("tr[data-key-id='{}']", new["key_id"]);
    browser
        .wait_text_of(&format!("{row} td.state"), "active")
        .await;
    // The console's own key is told apart from the new one.
    let own = browser.text(&browser.wait("#api-key-table").await).await;
    assert_eq!(own.matches("this console's").count(), 1, "{own}");
    browser.screenshot("console-keys").await;
    browser.click("#new-api-key-done").await;
    browser.wait_gone("#new-api-key").await;
    confirmed(&browser, &row, "revoke").await;
    browser
        .wait_text_of(&format!("{row} td.state"), "revoked")
        .await;
    let (s, refused) = stack.call(Method::GET, "/v1/whoami", &issued, None).await;
    assert_eq!(s, 401, "{refused}");
    confirmed(&browser, "tr[data-name='laptop']", "remove").await;
    browser.wait("#ssh-empty").await;
    assert!(listed(&stack, &key, "/v1/ssh-keys", "ssh_keys")
        .await
        .is_empty());

    // Data: nothing yet, as the API says.
    browser.click("#nav-data").await;
    browser.wait("#datasets-empty").await;
    browser.wait("#workspaces-empty").await;
    let used = browser.wait("#storage-used").await;
    let (s, usage) = stack.call(Method::GET, "/v1/storage", &key, None).await;
    assert_eq!(s, 200, "{usage}");
    assert_eq!(
        browser.attribute(&used, "data-bytes").await,
        Some(usage["bytes"].to_string())
    );
    assert_eq!(
        browser.find("#writes-stopped").await.is_some(),
        usage["writes_stopped"] == true
    );

    // A dataset put with the CLI the page names, and a workspace synced as
    // a node syncs one.
    let data = dir.path().join("mnist");
    std::fs::create_dir_all(data.join("train/labels")).unwrap();
    std::fs::write(data.join("train.txt"), "seven pictures of sevens\n").unwrap();
    std::fs::write(data.join("train/labels/0"), vec![7u8; 1000]).unwrap();
    std::fs::write(data.join("empty"), "").unwrap();
    let key_file = dir.path().join("tenant.key");
    std::fs::write(&key_file, &key).unwrap();
    let command = browser
        .text(&browser.wait("#add-dataset-command").await)
        .await;
    assert!(command.starts_with("lh data put "), "{command}");
    let put = lh_cli::capture(
        [
            "lh",
            "--gateway-url",
            stack.gateway_url.as_str(),
            "--api-key-file",
            key_file.to_str().unwrap(),
            "data",
            "put",
            data.to_str().unwrap(),
            "--name",
            "mnist",
        ]
        .map(String::from),
    )
    .await;
    assert_eq!(put.code, 0, "{}{}", put.stdout, put.stderr);
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("ckpt"), "step 0").unwrap();
    let holder = lh_storage::workspace::Holder {
        lease_id: uuid::Uuid::new_v4(),
        placement: 1,
        node_id: "node-gone".into(),
    };
    lh_storage::workspace::sync(
        &own_store(&stack, &key).await,
        "ckpt",
        work.path(),
        holder,
        true,
        &Default::default(),
    )
    .await
    .unwrap();

    // Shown as the API lists them: the dataset's version and manifest.
    browser.click("#nav-account").await;
    browser.click("#nav-data").await;
    let datasets = listed(&stack, &key, "/v1/datasets", "datasets").await;
    let version = datasets[0]["versions"][0]["version"].as_str().unwrap();
    let row = "tr[data-dataset='mnist']";
    browser
        .wait_text_of(&format!("{row} .versions-count"), "1")
        .await;
    browser.click(&format!("{row} button.versions")).await;
    browser
        .click(&format!(
            "tr[data-version='{version}'] button.manifest-button"
        ))
        .await;
    let (s, manifest) = stack
        .call(
            Method::GET,
            &format!("/v1/datasets/mnist/versions/{version}/manifest"),
            &key,
            None,
        )
        .await;
    assert_eq!(s, 200, "{manifest}");
    let entries = manifest["files"].as_array().unwrap();
    let dirs = entries.iter().filter(|e| e["kind"] == "dir").count();
    let files = entries
        .iter()
        .filter(|e| e["kind"]["file"].is_object())
        .count();
    assert_eq!((files, dirs), (3, 2), "{manifest}");
    browser
        .wait_text_of(
            &format!("[data-manifest='{version}'] .manifest-summary"),
            &format!("{files} files, {dirs} directories, 0 links, 1.0 KiB in all."),
        )
        .await;

    // The workspace: snapshotted from the page, restored from it, as the
    // API then tells.
    let ws_row = "tr[data-workspace='ckpt']";
    browser.wait(ws_row).await;
    // None yet: the daily pass runs at midnight UTC.
    let before = listed(&stack, &key, "/v1/workspaces", "workspaces").await;
    assert_eq!(before[0]["snapshots"], json!([]), "{before:?}");
    browser
        .wait_text_of(&format!("{ws_row} .snapshots-count"), "0")
        .await;
    browser.screenshot("console-data").await;
    browser.click(&format!("{ws_row} button.snapshot")).await;
    browser
        .wait_text_of(&format!("{ws_row} .snapshots-count"), "1")
        .await;
    let today = chrono::Utc::now().date_naive().to_string();
    let after = listed(&stack, &key, "/v1/workspaces", "workspaces").await;
    assert_eq!(
        after[0]["snapshots"][0]["date"],
        today.as_str(),
        "{after:?}"
    );
    assert!(after[0]["restored_from"].is_null(), "{after:?}");
    confirmed(&browser, ws_row, "restore").await;
    let deadline = Instant::now() + PATIENCE;
    while listed(&stack, &key, "/v1/workspaces", "workspaces").await[0]["restored_from"]
        != today.as_str()
    {
        assert!(
            Instant::now() < deadline,
            "the workspace was never restored"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(browser.find("#data-error").await.is_none());

    // Both removed from the page, and gone from the API.
    confirmed(&browser, row, "remove").await;
    browser.wait("#datasets-empty").await;
    assert!(listed(&stack, &key, "/v1/datasets", "datasets")
        .await
        .is_empty());
    confirmed(&browser, ws_row, "remove").await;
    browser.wait("#workspaces-empty").await;
    assert!(listed(&stack, &key, "/v1/workspaces", "workspaces")
        .await
        .is_empty());
}
