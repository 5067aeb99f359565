//! What auditors can ask of the audit trail, on real NATS and PostgreSQL:
//! `GET /v1/audit/events` answers exactly the log's events for each filter
//! and pages through them without gap or repeat; an operator's read is
//! itself recorded (`audit.accessed`); a tenant reads only its own records;
//! and `lh audit export` writes a tenant's whole trail.

use std::collections::BTreeSet;
use std::time::Duration;

use lh_bus::Stored;
use lh_test_stack::{read_log, Stack, ADMIN_TOKEN, AUDITOR_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

/// How long the audit copy may take to catch up with the log.
const CATCH_UP: Duration = Duration::from_secs(30);

/// Every record the filter `query` answers, read `limit` at a time.
async fn every_record(stack: &Stack, key: &str, query: &str, limit: u32) -> Vec<Value> {
    let mut records = Vec::new();
    let mut after = 0;
    for _ in 0..1000 {
        let path = format!("/v1/audit/events?{query}&after={after}&limit={limit}");
        let (status, page) = stack.call(Method::GET, &path, key, None).await;
        assert_eq!(status, 200, "{path}: {page}");
        let events = page["events"].as_array().unwrap();
        assert!(events.len() <= limit as usize);
        records.extend(events.iter().cloned());
        match page["next"].as_u64() {
            Some(next) => {
                assert_eq!(
                    events.len(),
                    limit as usize,
                    "a page short of its limit has a next"
                );
                assert!(next > after);
                after = next;
            }
            None => return records,
        }
    }
    panic!("no end of pages for {query}");
}

fn sequences(records: &[Value]) -> Vec<u64> {
    records
        .iter()
        .map(|r| r["sequence"].as_u64().unwrap())
        .collect()
}

/// The log's events up to `last` that `keep` selects, by sequence.
fn expected(log: &[Stored], last: u64, keep: impl Fn(&Stored) -> bool) -> Vec<u64> {
    log.iter()
        .filter(|s| s.sequence <= last && keep(s))
        .map(|s| s.sequence)
        .collect()
}

/// Waits until the audit copy holds the log's event at `sequence`.
async fn wait_copied(stack: &Stack, sequence: u64) {
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    loop {
        let path = format!("/v1/audit/events?after={}&limit=1", sequence - 1);
        let (status, page) = stack.call(Method::GET, &path, ADMIN_TOKEN, None).await;
        assert_eq!(status, 200, "{page}");
        if page["events"][0]["sequence"].as_u64() == Some(sequence) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the audit copy did not reach sequence {sequence}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn auditors_filter_and_page_the_trail_and_their_reads_are_recorded() {
    let stack = Stack::start(FLEET).await;
    let bus = stack.bus().await;
    let (tenant_a, key_a) = stack.create_tenant("acme", 2).await;
    let (tenant_b, key_b) = stack.create_tenant("bolt", 2).await;
    let lease_a = stack
        .lease(&key_a, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    stack
        .lease(&key_b, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    let log = read_log(&bus).await;
    let last = log.last().unwrap().sequence;
    wait_copied(&stack, last).await;

    // By tenant: exactly the log's events of tenant A, the same whether
    // read one record a page or all at once.
    let of_a = |s: &Stored| s.envelope.tenant_id.map(|t| t.to_string()) == Some(tenant_a.clone());
    let one_by_one = every_record(&stack, AUDITOR_TOKEN, &format!("tenant_id={tenant_a}"), 1).await;
    let at_once = every_record(
        &stack,
        AUDITOR_TOKEN,
        &format!("tenant_id={tenant_a}"),
        1000,
    )
    .await;
    // Tenant A's lease goes on being placed and started meanwhile: the
    // later read may hold more, never other.
    assert!(!one_by_one.is_empty() && at_once.starts_with(&one_by_one));
    let got = sequences(&at_once);
    // The log as read now holds every event the copy held at that read.
    let log_now = read_log(&bus).await;
    assert_eq!(got, expected(&log_now, *got.last().unwrap(), of_a));
    assert!(
        got.len() >= 2,
        "tenant.created and lease.requested at least: {got:?}"
    );

    // Each record says when, who, what, to what and with which outcome.
    let requested = at_once
        .iter()
        .find(|r| r["event_type"] == "lease.requested")
        .expect("tenant A's lease request is a record");
    assert_eq!(requested["actor"], format!("tenant:{tenant_a}"));
    assert_eq!(requested["object"], format!("lease.{lease_a}"));
    assert_eq!(requested["outcome"], "success");
    assert_eq!(requested["tenant_id"], tenant_a);
    assert!(requested["occurred_at"].is_string());
    assert_eq!(requested["payload"]["data"]["lease_id"], lease_a);

    // By actor and type: the two tenants the bootstrap admin created.
    let created = every_record(
        &stack,
        AUDITOR_TOKEN,
        "actor=admin:bootstrap&type=tenant.created",
        1000,
    )
    .await;
    let want = expected(&log, last, |s| {
        s.envelope.event_type == "tenant.created"
            && s.envelope.actor.principal() == "admin:bootstrap"
    });
    assert_eq!(sequences(&created), want);
    assert_eq!(want.len(), 2);

    // By time: from A's creation up to B's holds A's and not B's.
    let (a_at, b_at) = (
        created[0]["occurred_at"].as_str().unwrap(),
        created[1]["occurred_at"].as_str().unwrap(),
    );
    assert_ne!(a_at, b_at);
    let between = every_record(
        &stack,
        AUDITOR_TOKEN,
        &format!(
            "type=tenant.created&from={}&to={}",
            urlencode(a_at),
            urlencode(b_at)
        ),
        10,
    )
    .await;
    assert_eq!(sequences(&between), vec![want[0]]);

    // The auditor's reads are on the trail, with the filter and the count,
    // once the copy has caught up with them.
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    let read_of_a = loop {
        let reads = every_record(
            &stack,
            ADMIN_TOKEN,
            "type=audit.accessed&actor=auditor:auditor",
            1000,
        )
        .await;
        let found = reads.into_iter().find(|r| {
            r["payload"]["data"]["filter"]["tenant_id"] == tenant_a
                && r["payload"]["data"]["filter"]["limit"] == "1000"
        });
        if let Some(read) = found {
            break read;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no audit.accessed for the read of tenant A"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(read_of_a["payload"]["data"]["route"], "/v1/audit/events");
    assert_eq!(read_of_a["payload"]["data"]["records"], at_once.len());
    let log = read_log(&bus).await;
    assert!(
        log.iter().any(|s| s.envelope.event_type == "audit.accessed"
            && s.envelope.actor.principal() == "auditor:auditor"),
        "audit.accessed is in the log itself"
    );

    // A tenant reads only its own records, and reading leaves no
    // audit.accessed of its own.
    let own = every_record(&stack, &key_b, "type=lease.requested", 1000).await;
    assert_eq!(own.len(), 1);
    assert!(own.iter().all(|r| r["tenant_id"] == tenant_b));
    let (status, problem) = stack
        .call(
            Method::GET,
            &format!("/v1/audit/events?tenant_id={tenant_a}"),
            &key_b,
            None,
        )
        .await;
    assert_eq!(status, 404, "{problem}");
    assert_eq!(problem["field"], "tenant_id");
    assert!(!read_log(&bus)
        .await
        .iter()
        .any(|s| s.envelope.event_type == "audit.accessed"
            && s.envelope.actor.principal().starts_with("tenant:")));

    // Bad filters are refused naming the field.
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("from=yesterday", "from"),
    ] {
        let (status, problem) = stack
            .call(
                Method::GET,
                &format!("/v1/audit/events?{query}"),
                AUDITOR_TOKEN,
                None,
            )
            .await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (422, Some(field)),
            "{problem}"
        );
    }

    // `lh audit export` writes the same records; CSV has one row each.
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("auditor");
    std::fs::write(&key_file, AUDITOR_TOKEN).unwrap();
    let lh = |args: &[&str]| {
        let mut argv = vec![
            "lh".to_string(),
            "--gateway-url".to_string(),
            stack.gateway_url.clone(),
            "--api-key-file".to_string(),
            key_file.to_str().unwrap().to_string(),
        ];
        argv.extend(args.iter().map(|a| a.to_string()));
        lh_cli::capture(argv)
    };
    let out = lh(&[
        "audit", "export", "--tenant", &tenant_a, "--format", "jsonl",
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let exported: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(sequences(&exported)[..got.len()], got[..]);
    let out = lh(&["audit", "export", "--tenant", &tenant_a, "--format", "csv"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let mut rows = out.stdout.lines();
    assert!(rows
        .next()
        .unwrap()
        .starts_with("sequence,occurred_at,actor,"));
    assert_eq!(
        rows.next().unwrap().split(',').next().unwrap(),
        got[0].to_string()
    );
    let out = lh(&["audit", "replay", "--from", &last.to_string()]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let replayed: Vec<u64> = out
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["sequence"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(replayed.first(), Some(&last));
    assert!(replayed.windows(2).all(|w| w[0] < w[1]), "in log order");
    // From a time: every record at or after it, tenant B's creation first
    // of those the bootstrap admin made.
    let out = lh(&["audit", "replay", "--from", b_at]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let since: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let time = |t: &str| chrono::DateTime::parse_from_rfc3339(t).unwrap();
    assert!(since
        .iter()
        .all(|r| time(r["occurred_at"].as_str().unwrap()) >= time(b_at)));
    let created_since: Vec<&Value> = since
        .iter()
        .filter(|r| r["event_type"] == "tenant.created")
        .collect();
    assert_eq!(created_since[0]["sequence"], want[1]);
    let out = lh(&["audit", "export", "--subject", &tenant_a]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let document: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(document["tenant"]["id"], tenant_a);
    assert_eq!(document["leases"][0]["id"], lease_a);
    assert_eq!(document["leases"].as_array().unwrap().len(), 1);
    assert!(document["balance"].is_object());
    assert!(document["invoices"].is_object());
    let subject_records: BTreeSet<u64> = document["audit_records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["sequence"].as_u64().unwrap())
        .collect();
    assert!(got.iter().all(|s| subject_records.contains(s)));
    stack.assert_none_stopped();
}

/// Percent-encodes what RFC 3339 times carry that a query cannot (`+`, `:`).
fn urlencode(text: &str) -> String {
    text.replace('%', "%25")
        .replace('+', "%2B")
        .replace(':', "%3A")
}

/// The refusal summaries' interval in the flood test: short, so that the
/// test need not wait a minute for the summary.
const TEST_REFUSAL_INTERVAL_SECS: u64 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_bad_keys_is_summed_into_a_few_refusal_events() {
    let stack = Stack::start_configured(FLEET, |s| {
        s.gateway_front.refusal_summary_secs = TEST_REFUSAL_INTERVAL_SECS;
    })
    .await;
    let bus = stack.bus().await;
    let (tenant, key) = stack.create_tenant("acme", 2).await;
    let before = read_log(&bus).await.len();
    const FLOOD: u64 = 200;
    for i in 0..FLOOD {
        let (status, _) = stack
            .call(Method::GET, "/v1/leases", &format!("bad-key-{i}"), None)
            .await;
        assert_eq!(status, 401);
    }
    // A tenant refused what only an admin may do is counted as itself.
    for _ in 0..3 {
        let body = json!({"name": "x", "email": "x@x.example", "quota": {"max_gpus": 1}});
        let (status, _) = stack
            .call(Method::POST, "/v1/tenants", &key, Some(body))
            .await;
        assert_eq!(status, 403);
    }

    let summaries = |log: &[Stored]| -> Vec<Value> {
        log.iter()
            .filter(|s| s.envelope.event_type == "access.refused")
            .map(|s| serde_json::to_value(&s.envelope.data).unwrap())
            .collect()
    };
    let sum = |summaries: &[Value], source: &dyn Fn(&str) -> bool, field: &str, key: &str| {
        summaries
            .iter()
            .filter(|s| source(s["source"].as_str().unwrap()))
            .map(|s| s[field][key].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    // The loopback's network, never its address: the log keeps no one's IP.
    let from_ip = |s: &str| s == "ip:127.0.0.0/24";
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    let log = loop {
        let log = read_log(&bus).await;
        let found = summaries(&log[before..]);
        if sum(&found, &from_ip, "by_status", "401") >= FLOOD
            && found
                .iter()
                .any(|s| s["source"] == format!("tenant:{tenant}"))
        {
            break log;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no summaries: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let found = summaries(&log[before..]);
    let flood: Vec<&Value> = found
        .iter()
        .filter(|s| from_ip(s["source"].as_str().unwrap()))
        .collect();
    assert!(
        (1..=2).contains(&flood.len()),
        "one summary per interval the flood spanned: {flood:?}"
    );
    assert_eq!(sum(&found, &from_ip, "by_status", "401"), FLOOD);
    assert_eq!(sum(&found, &from_ip, "by_route", "GET /v1/leases"), FLOOD);
    assert_eq!(
        flood
            .iter()
            .map(|s| s["refused"].as_u64().unwrap())
            .sum::<u64>(),
        FLOOD
    );
    let own = format!("tenant:{tenant}");
    let is_own = |s: &str| s == own;
    assert_eq!(sum(&found, &is_own, "by_status", "403"), 3);
    assert_eq!(sum(&found, &is_own, "by_route", "POST /v1/tenants"), 3);

    // Auditors read them as failures.
    let last = log.last().unwrap().sequence;
    wait_copied(&stack, last).await;
    let records = every_record(&stack, AUDITOR_TOKEN, "type=access.refused", 100).await;
    assert!(records.len() > flood.len(), "the flood's and the tenant's");
    assert!(records
        .iter()
        .all(|r| r["outcome"] == "failure" && r["actor"] == "service:lh-gateway"));
    stack.assert_none_stopped();
}

/// The record of `event_type` about `object` among `records`.
fn record_of<'a>(records: &'a [Value], event_type: &str, object: &str) -> &'a Value {
    records
        .iter()
        .find(|r| r["event_type"] == event_type && r["object"] == object)
        .unwrap_or_else(|| panic!("no {event_type} record for {object}"))
}

/// What the seed documents ask each lease's audit records to answer: the
/// user, the GPUs it was given, the time, and how it ended, read back
/// through the auditor's route.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leases_records_name_its_user_its_gpus_their_times_and_how_it_ended() {
    let stack = Stack::start(FLEET).await;
    let (tenant, key) = stack.create_tenant("seed-fields", 1).await;
    let lease = stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    let lease_id = lease["id"].as_str().unwrap().to_string();
    let gpu_uuid = lease["gpu_uuids"][0].as_str().unwrap().to_string();
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{lease_id}/stop"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    stack
        .wait_lease(&key, &lease_id, |l| l["state"] == "ended")
        .await;
    wait_copied(&stack, stack.bus().await.last_sequence().await.unwrap()).await;

    let records = every_record(&stack, AUDITOR_TOKEN, &format!("tenant_id={tenant}"), 100).await;
    let object = format!("lease.{lease_id}");
    let requested = record_of(&records, "lease.requested", &object);
    assert_eq!(
        requested["actor"],
        format!("tenant:{tenant}"),
        "{requested}"
    );
    let placed = record_of(&records, "lease.placed", &object);
    assert!(
        placed["payload"].to_string().contains(&gpu_uuid),
        "the placement names its GPU: {placed}"
    );
    let ended = record_of(&records, "lease.ended", &object);
    assert_eq!(ended["payload"]["data"]["reason"], "stopped", "{ended}");
    for record in [requested, placed, ended] {
        assert_eq!(record["outcome"], "success", "{record}");
        let at: chrono::DateTime<chrono::Utc> = record["occurred_at"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("no time on {record}"));
        assert!(at <= chrono::Utc::now());
        assert!(record["tenant_id"] == tenant.as_str(), "{record}");
    }
    let started = record_of(&records, "lease.started", &object);
    assert!(
        started["actor"].as_str().unwrap().starts_with("node:"),
        "{started}"
    );
}
