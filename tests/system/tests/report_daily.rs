//! `lh report daily` against the whole platform: leases that ran today show
//! as bars on the GPUs they were placed on, read from the audit trail by
//! the auditor, and the page it writes counts them.

use std::time::Duration;

use lh_test_stack::{Stack, AUDITOR_TOKEN, FLEET};
use reqwest::Method;
use serde_json::json;

/// How long the audit copy may take to catch up with the log.
const CATCH_UP: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_day_with_two_leases_shows_their_bars() {
    let stack = Stack::start(FLEET).await;
    let (tenant, key) = stack.create_tenant("daily", 8).await;
    let first = stack
        .running(
            &key,
            json!({"gpus": 2, "gpu_model": "A100-40GB", "tier": "basic"}),
        )
        .await;
    let second = stack
        .running(
            &key,
            json!({"gpus": 1, "gpu_model": "H100-80GB", "tier": "basic"}),
        )
        .await;
    let first_id = first["id"].as_str().unwrap().to_string();
    let second_id = second["id"].as_str().unwrap().to_string();
    let (status, stopped) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{first_id}/stop"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 202, "{stopped}");
    stack
        .wait_lease(&key, &first_id, |l| l["state"] == "ended")
        .await;
    let started: chrono::DateTime<chrono::Utc> =
        second["started_at"].as_str().unwrap().parse().unwrap();
    let date = started.date_naive();

    // The audit copy follows the log: wait for the stop to be in it.
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    loop {
        let (status, page) = stack
            .call(
                Method::GET,
                "/v1/audit/events?type=lease.ended",
                AUDITOR_TOKEN,
                None,
            )
            .await;
        assert_eq!(status, 200, "{page}");
        if page["events"].as_array().is_some_and(|e| !e.is_empty()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no lease.ended in the trail"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // What the command reads, folded and computed.
    let gw = lh_cli::Gateway::new(&stack.gateway_url, Some(AUDITOR_TOKEN)).unwrap();
    let mut err = Vec::new();
    let input = lh_cli::report::read_day(&gw, date, None, &mut err)
        .await
        .unwrap();
    let report = lh_cli::report::DailyReport::compute(&input);
    assert_eq!(report.gpus.len(), 8 + 4 + 8, "every GPU of the fleet");
    let bars_of = |id: &str| -> Vec<String> {
        report
            .bars
            .iter()
            .filter(|b| b.lease_id.to_string() == id)
            .map(|b| report.gpus[b.row].label())
            .collect()
    };
    let placed = |lease: &serde_json::Value| -> Vec<String> {
        let node = lease["node_id"].as_str().unwrap();
        let mut gpus: Vec<String> = lease["gpu_indices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| format!("{node}/{i}"))
            .collect();
        gpus.sort();
        gpus
    };
    let mut first_bars = bars_of(&first_id);
    first_bars.sort();
    assert_eq!(first_bars, placed(&first), "one bar per GPU of the first");
    assert_eq!(bars_of(&second_id), placed(&second));
    assert_eq!(report.leases, 2);
    assert!(report
        .bars
        .iter()
        .all(|b| b.tenant_id.map(|t| t.to_string()) == Some(tenant.clone())));
    assert_eq!(report.queue_wait.started, 2);
    assert_eq!(report.availability.downtime_secs, 0);

    // The tenant's own report finds the same leases in the records
    // filtered by it.
    let tenant_id: uuid::Uuid = tenant.parse().unwrap();
    let input = lh_cli::report::read_day(&gw, date, Some(tenant_id), &mut err)
        .await
        .unwrap();
    let own = lh_cli::report::DailyReport::compute(&input);
    assert_eq!((own.leases, own.bars.len()), (2, 3));
    assert_eq!(own.gpus.len(), 20);

    // The command itself, as an operator runs it.
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("auditor");
    std::fs::write(&key_file, AUDITOR_TOKEN).unwrap();
    let page = dir.path().join("day.html");
    let out = lh_cli::capture([
        "lh",
        "--gateway-url",
        &stack.gateway_url,
        "--api-key-file",
        key_file.to_str().unwrap(),
        "report",
        "daily",
        "--date",
        &date.to_string(),
        "--out",
        page.to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("2 leases"), "{}", out.stdout);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<tr><th>Leases that ran</th><td>2</td></tr>"));
    assert!(html.contains(&tenant), "the tenants table names it");

    // With --json the numbers go to stdout as well.
    let picture = dir.path().join("day.svg");
    let out = lh_cli::capture([
        "lh",
        "--gateway-url",
        &stack.gateway_url,
        "--api-key-file",
        key_file.to_str().unwrap(),
        "--json",
        "report",
        "daily",
        "--date",
        &date.to_string(),
        "--out",
        picture.to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let numbers: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(numbers["leases"], 2, "{numbers}");
    assert_eq!(numbers["bars"].as_array().unwrap().len(), 3);
    assert!(std::fs::read_to_string(&picture)
        .unwrap()
        .starts_with("<svg"));

    // A day that has not come is refused before anything is read.
    let out = lh_cli::capture([
        "lh",
        "--gateway-url",
        &stack.gateway_url,
        "report",
        "daily",
        "--date",
        "2999-01-01",
        "--out",
        page.to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.code, lh_cli::EXIT_CLIENT_ERROR, "{}", out.stderr);
    assert!(out.stderr.contains("in the future"), "{}", out.stderr);
}
