//! Usage kept per lease, GPU and minute: what the node-agents publish on
//! the telemetry stream is what `GET /v1/leases/{id}/usage` and
//! `GET /v1/usage` answer, each sample counted once through redeliveries,
//! gateway restarts and rebuilds; minutes older than the stream survive a
//! rebuild and go when past the kept days; tenants see their own only.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, DurationRound as _, TimeDelta, Utc};
use lh_bus::Bus;
use lh_events::subject;
use lh_events::telemetry::{LeaseGpuUsage, LeaseUsage};
use lh_test_stack::{Stack, ADMIN_TOKEN, AUDITOR_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};
use uuid::Uuid;

/// The usage samples the stream holds for `lease`, oldest first, with the
/// time the stream stored each.
async fn samples_of(bus: &Bus, lease: Uuid) -> Vec<(LeaseUsage, DateTime<Utc>)> {
    let filter = subject::usage_of_lease(lease);
    let mut feed = bus.telemetry_feed(&[&filter], 1).await.unwrap();
    let mut out = Vec::new();
    while let Some(sample) = feed.next_item_within(Duration::from_secs(2)).await {
        let sample = sample.unwrap();
        out.push((
            serde_json::from_slice(&sample.payload).unwrap(),
            sample.stored_at,
        ));
        if sample.pending == 0 {
            break;
        }
    }
    out
}

/// Waits until the usage projection has folded every usage sample the
/// telemetry stream holds now (heartbeats share the stream: its head is
/// not the projection's).
async fn usage_caught_up(stack: &Stack, pool: &sqlx::PgPool) {
    let bus = stack.bus().await;
    let mut feed = bus.telemetry_feed(&[subject::USAGE_ALL], 1).await.unwrap();
    let mut last = 0;
    while let Some(sample) = feed.next_item_within(Duration::from_secs(2)).await {
        let sample = sample.unwrap();
        last = sample.sequence as i64;
        if sample.pending == 0 {
            break;
        }
    }
    for _ in 0..200 {
        let at: Option<i64> = sqlx::query_scalar(
            "SELECT sequence FROM gateway.projection_offsets WHERE name = 'gateway_usage'",
        )
        .fetch_optional(pool)
        .await
        .unwrap();
        if at.unwrap_or(0) >= last {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the usage projection never reached telemetry sequence {last}");
}

async fn get(stack: &Stack, path: &str, key: &str) -> (u16, Value) {
    stack.call(Method::GET, path, key, None).await
}

fn minute(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::minutes(1)).unwrap()
}

/// Per minute of the samples' own clock: (samples, utilisation sum,
/// memory sum, memory max, temperature max, power sum, power count).
type Expected = BTreeMap<DateTime<Utc>, (u64, u64, u64, u64, u32, f64, u64)>;

fn expected(samples: &[(LeaseUsage, DateTime<Utc>)], gpu_uuid: &str) -> Expected {
    let mut by_minute = Expected::new();
    for (usage, stored_at) in samples {
        // The node's clock is the test process's: never far off.
        assert!((usage.at - *stored_at).num_seconds().abs() < 60);
        for g in usage.gpus.iter().filter(|g| g.uuid == gpu_uuid) {
            let e = by_minute.entry(minute(usage.at)).or_default();
            e.0 += 1;
            e.1 += u64::from(g.utilization_pct.unwrap());
            e.2 += g.memory_used_mib;
            e.3 = e.3.max(g.memory_used_mib);
            e.4 = e.4.max(g.temperature_c.unwrap());
            if let Some(p) = g.power_w {
                e.5 += p;
                e.6 += 1;
            }
        }
    }
    by_minute
}

fn assert_points_match(series: &Value, expected: &Expected) {
    let points = series["points"].as_array().unwrap();
    assert_eq!(points.len(), expected.len(), "{series}");
    for (point, (at, e)) in points.iter().zip(expected) {
        let at_sent: DateTime<Utc> = point["at"].as_str().unwrap().parse().unwrap();
        assert_eq!(at_sent, *at, "{point}");
        assert_eq!(point["samples"], e.0, "{point}");
        let close = |field: &str, want: f64| {
            let got = point[field].as_f64().unwrap();
            assert!(
                (got - want).abs() < 1e-6,
                "{field}: {got} != {want} in {point}"
            );
        };
        close("utilization_pct_avg", e.1 as f64 / e.0 as f64);
        close("memory_used_mib_avg", e.2 as f64 / e.0 as f64);
        assert_eq!(point["memory_used_mib_max"], e.3, "{point}");
        assert_eq!(point["temperature_c_max"], e.4, "{point}");
        if e.6 > 0 {
            close("power_w_avg", e.5 / e.6 as f64);
        } else {
            assert!(point["power_w_avg"].is_null(), "{point}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_s_usage_is_what_its_node_published_and_only_its_tenant_reads_it() {
    let stack = Stack::start(FLEET).await;
    let pool = sqlx::PgPool::connect(&stack.database_url).await.unwrap();
    let bus = stack.bus().await;
    let (tenant_a, key_a) = stack.create_tenant("acme", 16).await;
    let (_, key_b) = stack.create_tenant("globex", 16).await;
    let window_from = minute(Utc::now()).to_rfc3339();
    let lease = stack
        .running(&key_a, json!({"gpus": 2, "gpu_model": "A10G-24GB"}))
        .await;
    let id = lease["id"].as_str().unwrap().to_string();
    let lease_id: Uuid = id.parse().unwrap();
    // The test node-agents sample every second.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (s, _) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key_a, None)
        .await;
    assert_eq!(s, 202);
    stack
        .wait_lease(&key_a, &id, |l| l["state"] == "ended")
        .await;
    // A sample taken as the lease ended is on the stream by now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    usage_caught_up(&stack, &pool).await;

    let samples = samples_of(&bus, lease_id).await;
    assert!(samples.len() >= 3, "only {} samples", samples.len());
    let path = format!("/v1/leases/{id}/usage?from={window_from}&step=60");
    let path = path.replace('+', "%2B");
    let (s, report) = get(&stack, &path, &key_a).await;
    assert_eq!(s, 200, "{report}");
    assert_eq!(report["step_seconds"], 60);
    let series = report["series"].as_array().unwrap();
    assert_eq!(series.len(), 2, "one series per GPU: {report}");
    for one in series {
        assert_eq!(one["lease_id"], id.as_str());
        assert_eq!(one["tenant_id"], tenant_a.as_str());
        assert_eq!(one["node_id"], "node-b");
        let uuid = one["gpu_uuid"].as_str().unwrap();
        let e = expected(&samples, uuid);
        assert!(!e.is_empty(), "no sample of {uuid}");
        assert_points_match(one, &e);
        // The simulated board reports its temperature and power.
        assert!(one["points"][0]["temperature_c_max"].as_u64().unwrap() > 0);
        assert!(one["points"][0]["power_w_avg"].as_f64().unwrap() > 0.0);
    }
    assert!(series[0]["gpu_index"].as_u64() < series[1]["gpu_index"].as_u64());

    // One coarse step holds every sample.
    let day = format!(
        "/v1/leases/{id}/usage?from={}&step=86400",
        minute(Utc::now() - TimeDelta::days(1)).to_rfc3339()
    )
    .replace('+', "%2B");
    let (s, daily) = get(&stack, &day, &key_a).await;
    assert_eq!(s, 200, "{daily}");
    for one in daily["series"].as_array().unwrap() {
        let total: u64 = one["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["samples"].as_u64().unwrap())
            .sum();
        let uuid = one["gpu_uuid"].as_str().unwrap();
        assert_eq!(
            total,
            expected(&samples, uuid).values().map(|e| e.0).sum::<u64>()
        );
        // Its minutes are those that had a sample.
        let minutes: u64 = one["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["minutes"].as_u64().unwrap())
            .sum();
        assert_eq!(minutes, expected(&samples, uuid).len() as u64);
        let at: DateTime<Utc> = one["points"][0]["at"].as_str().unwrap().parse().unwrap();
        assert_eq!(at.timestamp() % 86_400, 0, "aligned to whole UTC days");
    }

    // Another tenant finds no such lease, and cannot name the tenant.
    let (s, body) = get(&stack, &path, &key_b).await;
    assert_eq!(s, 404, "{body}");
    let (s, body) = get(&stack, &format!("/v1/usage?tenant={tenant_a}"), &key_b).await;
    assert_eq!(s, 403, "{body}");
    assert_eq!(body["field"], "tenant");
    let (s, body) = get(&stack, "/v1/usage", &key_b).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["series"], json!([]), "{body}");
    // The tenant itself and the operators see it in the fleet view.
    for key in [key_a.as_str(), ADMIN_TOKEN, AUDITOR_TOKEN] {
        let (s, body) = get(&stack, "/v1/usage", key).await;
        assert_eq!(s, 200, "{body}");
        assert!(
            body["series"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["lease_id"] == id.as_str()),
            "{body}"
        );
    }
    let (s, body) = get(&stack, "/v1/usage?node=node-a", ADMIN_TOKEN).await;
    assert_eq!(s, 200);
    assert_eq!(body["series"], json!([]), "{body}");

    // Bad values are refused naming their field.
    for (query, field) in [
        ("step=90", "step"),
        ("step=abc", "step"),
        ("step=172800", "step"),
        ("from=yesterday", "from"),
        ("to=2026-13-01T00:00:00Z", "to"),
        ("from=2026-12-02T00:00:00Z&to=2026-12-01T00:00:00Z", "to"),
        (
            "from=2024-01-01T00:00:00Z&to=2026-01-01T00:00:00Z&step=86400",
            "from",
        ),
        ("tenant=acme", "tenant"),
    ] {
        let (s, body) = get(&stack, &format!("/v1/usage?{query}"), ADMIN_TOKEN).await;
        assert_eq!(s, 422, "{query}: {body}");
        assert_eq!(body["field"], field, "{query}: {body}");
    }
}

fn gpu(uuid: &str, util: Option<u32>, mib: u64, temp: u32, power: Option<f64>) -> LeaseGpuUsage {
    LeaseGpuUsage {
        index: 0,
        uuid: uuid.into(),
        utilization_pct: util,
        memory_used_mib: mib,
        shared: false,
        temperature_c: Some(temp),
        power_w: power,
    }
}

async fn publish(bus: &Bus, node: &str, lease: Uuid, at: DateTime<Utc>, gpus: Vec<LeaseGpuUsage>) {
    let usage = LeaseUsage {
        lease_id: lease,
        tenant_id: None,
        node_id: node.into(),
        at,
        gpus,
    };
    bus.publish_telemetry(
        subject::usage(node, lease),
        serde_json::to_vec(&usage).unwrap(),
    )
    .await
    .unwrap();
    bus.client().flush().await.unwrap();
}

/// The one series of `gpu_uuid`, from the admin's fleet view over the last
/// day, by the minute.
async fn series_of(stack: &Stack, gpu_uuid: &str) -> Value {
    let from = (Utc::now() - TimeDelta::hours(2))
        .to_rfc3339()
        .replace('+', "%2B");
    let (s, body) = get(
        stack,
        &format!("/v1/usage?gpu={gpu_uuid}&from={from}&step=60"),
        ADMIN_TOKEN,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let series = body["series"].as_array().unwrap();
    assert_eq!(series.len(), 1, "{body}");
    series[0].clone()
}

fn point_at(series: &Value, at: DateTime<Utc>) -> Value {
    series["points"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["at"].as_str().unwrap().parse::<DateTime<Utc>>().unwrap() == at)
        .cloned()
        .unwrap_or_else(|| panic!("no point at {at} in {series}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn samples_count_once_through_redelivery_restart_and_rebuild_and_old_minutes_are_kept_then_pruned(
) {
    // The simulated boards take no sample within the test: every sample of
    // the lease is one the test publishes, with figures it chose.
    let mut stack = Stack::start_configured(FLEET, |stack| {
        stack.node_gpus.sample_ms = 3_600_000;
    })
    .await;
    let pool = sqlx::PgPool::connect(&stack.database_url).await.unwrap();
    let bus = stack.bus().await;
    let (tenant, key) = stack.create_tenant("acme", 16).await;
    // A lease of the tenant; its samples here come from the test, as its
    // node, on the GPU it was placed on (a node may report no other).
    let lease = stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    let node = lease["node_id"].as_str().unwrap().to_string();
    let node = node.as_str();
    let placed_uuid = lease["gpu_uuids"][0].as_str().unwrap().to_string();
    let uuid = placed_uuid.as_str();
    let lease: Uuid = lease["id"].as_str().unwrap().parse().unwrap();

    // Two minutes ago: every sample of it in one minute, all within the
    // 5 minutes a node's clock may be off.
    let base = minute(Utc::now() - TimeDelta::minutes(2));
    let at = |s: i64| base + TimeDelta::seconds(s);
    publish(
        &bus,
        node,
        lease,
        at(5),
        vec![gpu(uuid, Some(50), 1000, 60, Some(200.0))],
    )
    .await;
    publish(
        &bus,
        node,
        lease,
        at(10),
        vec![gpu(uuid, Some(70), 3000, 65, Some(300.0))],
    )
    .await;
    // MIG mode: no utilisation, no power; the averages leave it out.
    publish(
        &bus,
        node,
        lease,
        at(15),
        vec![gpu(uuid, None, 2000, 62, None)],
    )
    .await;
    // Absurd figures are refused, the sane GPU of the same sample kept.
    publish(
        &bus,
        node,
        lease,
        at(20),
        vec![
            gpu(uuid, Some(150), 1, 1, Some(1.0)),
            gpu("GPU-test-1", Some(10), 10, 300, None),
            // Sane, but not a GPU the lease was placed on.
            gpu("GPU-test-foreign", Some(10), 10, 60, None),
        ],
    )
    .await;
    // A node whose clock is years off: counted in the stream's minute.
    let wild = "2001-01-01T00:00:00Z".parse().unwrap();
    publish(
        &bus,
        node,
        lease,
        wild,
        vec![gpu(uuid, Some(10), 500, 50, Some(100.0))],
    )
    .await;
    // A sample naming another node than its subject's is not taken.
    let usage = LeaseUsage {
        lease_id: lease,
        tenant_id: None,
        node_id: "node-elsewhere".into(),
        at: at(25),
        gpus: vec![gpu(uuid, Some(99), 99, 99, Some(99.0))],
    };
    bus.publish_telemetry(
        subject::usage(node, lease),
        serde_json::to_vec(&usage).unwrap(),
    )
    .await
    .unwrap();
    // A node that does not hold the lease cannot report for it, even on
    // its own subject: not another tenant's lease, not its own tenant's.
    publish(
        &bus,
        "node-elsewhere",
        lease,
        at(30),
        vec![gpu(uuid, Some(99), 99, 99, Some(99.0))],
    )
    .await;
    bus.client().flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    usage_caught_up(&stack, &pool).await;

    let check = |series: &Value, stream_minutes: &[DateTime<Utc>]| {
        let p = point_at(series, base);
        assert_eq!(p["samples"], 3, "{p}");
        assert_eq!(p["utilization_pct_avg"], 60.0, "{p}");
        assert_eq!(p["memory_used_mib_avg"], 2000.0, "{p}");
        assert_eq!(p["memory_used_mib_max"], 3000, "{p}");
        assert_eq!(p["temperature_c_max"], 65, "{p}");
        assert_eq!(p["power_w_avg"], 250.0, "{p}");
        // The wild clock's sample, in the minute the stream stored it.
        let wild_samples: u64 = stream_minutes
            .iter()
            .map(|m| point_at(series, *m)["samples"].as_u64().unwrap())
            .sum();
        assert_eq!(wild_samples, 1, "{series}");
        assert_eq!(
            series["points"].as_array().unwrap().len(),
            1 + stream_minutes.len()
        );
    };
    let series = series_of(&stack, uuid).await;
    assert_eq!(
        series["tenant_id"],
        tenant.as_str(),
        "the lease's tenant, not the node's word"
    );
    assert_eq!(series["node_id"], node);
    let wild_minutes: Vec<DateTime<Utc>> = series["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["at"].as_str().unwrap().parse().unwrap())
        .filter(|m| *m != base)
        .collect();
    check(&series, &wild_minutes);
    // The GPU at 300 °C was refused whole.
    let (s, body) = get(&stack, "/v1/usage?gpu=GPU-test-1", ADMIN_TOKEN).await;
    assert_eq!(s, 200);
    assert_eq!(body["series"], json!([]), "{body}");
    let (s, body) = get(&stack, "/v1/usage?gpu=GPU-test-foreign", ADMIN_TOKEN).await;
    assert_eq!(s, 200);
    assert_eq!(body["series"], json!([]), "{body}");

    // The whole stream delivered again (a position lost): each row knows
    // the newest sample it counts, so nothing is counted twice.
    stack.stop_service("gateway").await;
    sqlx::query("UPDATE gateway.projection_offsets SET sequence = 0 WHERE name = 'gateway_usage'")
        .execute(&pool)
        .await
        .unwrap();
    // And a sample published while the gateway is down is folded after.
    publish(
        &bus,
        node,
        lease,
        at(30),
        vec![gpu(uuid, Some(0), 0, 70, Some(100.0))],
    )
    .await;
    stack.start_service("gateway").await;
    stack.wait_ready().await;
    usage_caught_up(&stack, &pool).await;
    let series = series_of(&stack, uuid).await;
    let p = point_at(&series, base);
    assert_eq!(p["samples"], 4, "{p}");
    assert_eq!(p["utilization_pct_avg"], 40.0, "{p}");
    assert_eq!(p["memory_used_mib_avg"], 1500.0, "{p}");
    assert_eq!(p["temperature_c_max"], 70, "{p}");
    assert_eq!(p["power_w_avg"], 200.0, "{p}");

    // A minute far older than the stream, and one past the kept days.
    for days in [300, 401] {
        sqlx::query(
            "INSERT INTO gateway.lease_usage_minutes (lease_id, gpu_uuid, minute, tenant_id,
                node_id, gpu_index, samples, utilization_samples, utilization_pct_sum,
                memory_used_mib_sum, memory_used_mib_max, temperature_c_max, power_samples,
                power_w_sum, last_sequence)
             VALUES ($1, $2, $3, $4::uuid, $5, 0, 12, 12, 600, 1200, 100, 50, 12, 1200.0, 0)",
        )
        .bind(lease)
        .bind(uuid)
        .bind(base - TimeDelta::days(days))
        .bind(&tenant)
        .bind(node)
        .execute(&pool)
        .await
        .unwrap();
    }

    // A rebuild replays the stream into the live rows carried over: the
    // same counts, the old minutes kept.
    let digest = "SELECT count(*), md5(string_agg(t::text, ',' ORDER BY t::text)) FROM {schema}.lease_usage_minutes t
                  WHERE gpu_uuid = $1";
    let live_before: (i64, Option<String>) = sqlx::query_as(&digest.replace("{schema}", "gateway"))
        .bind(uuid)
        .fetch_one(&pool)
        .await
        .unwrap();
    let report = lh_gateway::rebuild(&stack.gateway_config(), "gateway_rebuild", false, |_, _| {})
        .await
        .unwrap();
    assert!(report.identical(), "{:?}", report.tables);
    let rebuilt: (i64, Option<String>) =
        sqlx::query_as(&digest.replace("{schema}", "gateway_rebuild"))
            .bind(uuid)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(rebuilt, live_before);
    // The sample's minute, the wild clock's, and the two old ones.
    assert_eq!(
        rebuilt.0,
        1 + i64::try_from(wild_minutes.len()).unwrap() + 2
    );

    // Pruning takes what is older than the kept days, nothing else.
    let gateway = sqlx::PgPool::connect_with(
        stack
            .database_url
            .parse::<sqlx::postgres::PgConnectOptions>()
            .unwrap()
            .options([("search_path", "gateway")]),
    )
    .await
    .unwrap();
    let pruned = lh_gateway::usage::prune(&gateway, 400, Utc::now())
        .await
        .unwrap();
    assert_eq!(pruned, 1);
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM gateway.lease_usage_minutes WHERE gpu_uuid = $1 AND minute < $2",
    )
    .bind(uuid)
    .bind(base - TimeDelta::days(2))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, 1, "the 300-day-old minute stays");

    // A node flooding its own lease's samples moves one minute by at most
    // what one a second would; once the lease ended, it moves nothing.
    let flooded = base + TimeDelta::minutes(1);
    for _ in 0..(lh_gateway::usage::MAX_SAMPLES_PER_GPU_MINUTE + 20) {
        publish(
            &bus,
            node,
            lease,
            flooded,
            vec![gpu(uuid, Some(100), 1, 50, None)],
        )
        .await;
    }
    let samples_in = |minute: DateTime<Utc>| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i32>(
                "SELECT samples FROM gateway.lease_usage_minutes WHERE gpu_uuid = $1 AND minute = $2",
            )
            .bind(uuid)
            .bind(minute)
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    };
    usage_caught_up(&stack, &pool).await;
    assert_eq!(
        samples_in(flooded).await,
        Some(lh_gateway::usage::MAX_SAMPLES_PER_GPU_MINUTE)
    );
    let (status, body) = stack
        .call(
            reqwest::Method::POST,
            &format!("/v1/leases/{lease}/stop"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    stack
        .wait_lease(&key, &lease.to_string(), |l| l["state"] == "ended")
        .await;
    let after_end = base - TimeDelta::minutes(1);
    publish(
        &bus,
        node,
        lease,
        after_end,
        vec![gpu(uuid, Some(1), 1, 50, None)],
    )
    .await;
    usage_caught_up(&stack, &pool).await;
    assert_eq!(samples_in(after_end).await, None);

    // More points than one answer holds: a coarser step is asked for.
    let minutes = lh_gateway::http::usage::MAX_USAGE_POINTS as i64 + 1;
    sqlx::query(
        "INSERT INTO gateway.lease_usage_minutes (lease_id, gpu_uuid, minute, tenant_id,
            node_id, gpu_index, samples, utilization_samples, utilization_pct_sum,
            memory_used_mib_sum, memory_used_mib_max, temperature_c_max, power_samples,
            power_w_sum, last_sequence)
         SELECT $1, 'GPU-test-many', $2 - make_interval(mins => n::int), $3::uuid, $4, 1,
                12, 12, 600, 1200, 100, 50, 12, 1200.0, 0
         FROM generate_series(1, $5) AS n",
    )
    .bind(lease)
    .bind(base)
    .bind(&tenant)
    .bind(node)
    .bind(minutes)
    .execute(&pool)
    .await
    .unwrap();
    let from = (base - TimeDelta::days(80))
        .to_rfc3339()
        .replace('+', "%2B");
    let to = base.to_rfc3339().replace('+', "%2B");
    let query = |step: u32| format!("/v1/usage?gpu=GPU-test-many&from={from}&to={to}&step={step}");
    let (s, body) = get(&stack, &query(60), ADMIN_TOKEN).await;
    assert_eq!(s, 422, "{body}");
    assert_eq!(body["field"], "step", "{body}");
    let (s, body) = get(&stack, &query(86_400), &key).await;
    assert_eq!(s, 200, "{body}");
    let days = body["series"][0]["points"].as_array().unwrap();
    let samples: u64 = days.iter().map(|p| p["samples"].as_u64().unwrap()).sum();
    assert_eq!(
        samples,
        12 * minutes as u64,
        "every minute summed into days"
    );
}

/// How big a year of minutes is: rows of one GPU, measured on PostgreSQL
/// (the figure docs/adr/018 quotes), and a prune of more rows than one
/// statement takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_day_of_minutes_has_a_known_size_and_prunes_in_bounded_batches() {
    let database_url = lh_testkit::shared_postgres()
        .await
        .create_database()
        .await
        .unwrap();
    let pool = lh_projection::connect_schema(&database_url, "gateway")
        .await
        .unwrap();
    lh_projection::migrate(&pool, &lh_gateway::projection::MIGRATOR)
        .await
        .unwrap();
    let rows: i64 = 20_000;
    sqlx::query(
        "INSERT INTO lease_usage_minutes (lease_id, gpu_uuid, minute, tenant_id, node_id,
            gpu_index, samples, utilization_samples, utilization_pct_sum, memory_used_mib_sum,
            memory_used_mib_max, temperature_c_max, power_samples, power_w_sum, last_sequence)
         SELECT $1, 'GPU-5c9f3a8e-1b2d-4c3e-8f9a-0123456789ab',
                timestamptz '2025-01-01' + make_interval(mins => n::int), $2, 'node-a', 3,
                12, 12, 12 * 55, 12 * 30000, 31000, 71, 12, 12 * 250.5, n * 12
         FROM generate_series(1, $3) AS n",
    )
    .bind(Uuid::new_v4())
    .bind(Uuid::new_v4())
    .bind(rows)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE lease_usage_minutes")
        .execute(&pool)
        .await
        .unwrap();
    let bytes: i64 = sqlx::query_scalar("SELECT pg_total_relation_size('lease_usage_minutes')")
        .fetch_one(&pool)
        .await
        .unwrap();
    let per_row = bytes / rows;
    eprintln!(
        "lease_usage_minutes: {bytes} bytes for {rows} rows, {per_row} bytes a row with its indexes; \
         a GPU-year of minutes (525,600 rows) is about {} MiB",
        per_row * 525_600 / (1024 * 1024)
    );
    assert!((100..=400).contains(&per_row), "{per_row} bytes a row");

    let now: DateTime<Utc> = "2027-01-01T00:00:00Z".parse().unwrap();
    // Every row is older than a day before `now`: more than one batch.
    assert!(rows > lh_gateway::usage::MAX_USAGE_PRUNE_ROWS);
    let pruned = lh_gateway::usage::prune(&pool, 1, now).await.unwrap();
    assert_eq!(pruned, rows as u64);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM lease_usage_minutes")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}
