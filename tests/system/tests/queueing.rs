//! The queue's rules through the REST API on the real stack:
//! preemption of spot leases for an on-demand one, VRAM quotas, priorities.

use std::time::Duration;

use lh_events::EventData;
use lh_test_stack::{of_type, read_log, Stack, FLEET};
use reqwest::Method;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_on_demand_lease_preempts_spot_after_the_notice() {
    let mut stack = Stack::bare(FLEET).await;
    // Any running spot lease may be preempted, with a one-second notice.
    stack.preemption_min_runtime_secs = 0;
    stack.preemption_notice_secs = 1;
    for name in [
        "scheduler",
        "pricing",
        "audit",
        "gateway",
        "node-agent:node-b",
    ] {
        stack.start_service(name).await;
    }
    stack.wait_ready().await;
    let (_, spot_key) = stack.create_tenant("spotty", 16).await;
    let (_, key) = stack.create_tenant("urgent", 16).await;

    let spot_a = stack
        .lease(
            &spot_key,
            json!({"gpus": 3, "gpu_model": "A10G-24GB", "tier": "spot"}),
        )
        .await;
    let spot_b = stack
        .lease(
            &spot_key,
            json!({"gpus": 1, "gpu_model": "A10G-24GB", "tier": "spot"}),
        )
        .await;
    stack
        .wait_lease(&spot_key, &spot_a, |l| l["state"] == "running")
        .await;
    stack
        .wait_lease(&spot_key, &spot_b, |l| l["state"] == "running")
        .await;

    let od = stack
        .lease(
            &key,
            json!({"gpus": 1, "gpu_model": "A10G-24GB", "tier": "basic"}),
        )
        .await;
    let waiting = stack
        .wait_lease(&key, &od, |l| {
            l["queued_reason"]
                .as_str()
                .is_some_and(|r| r.contains("preempting"))
        })
        .await;
    assert!(
        waiting["queued_reason"]
            .as_str()
            .unwrap()
            .contains("preempting 1 spot lease"),
        "{waiting}"
    );
    // The cheapest victim is the 1-GPU lease.
    let victim = stack
        .wait_lease(&spot_key, &spot_b, |l| l["preemption_deadline"].is_string())
        .await;
    assert_eq!(victim["state"], "running");
    let ended = stack
        .wait_lease(&spot_key, &spot_b, |l| l["state"] == "ended")
        .await;
    assert_eq!(ended["end_reason"], "preempted");
    let running = stack
        .wait_lease(&key, &od, |l| l["state"] == "running")
        .await;
    assert_eq!(running["gpu_uuids"].as_array().unwrap().len(), 1);
    let (_, other) = stack
        .call(
            Method::GET,
            &format!("/v1/leases/{spot_a}"),
            &spot_key,
            None,
        )
        .await;
    assert_eq!(
        other["state"], "running",
        "the 3-GPU spot lease is untouched"
    );

    // Ended at the deadline, not before, and billed up to its end.
    let bus = stack.bus().await;
    let log = read_log(&bus).await;
    let notice = of_type(&log, "lease.preemption_noticed");
    assert_eq!(notice.len(), 1);
    let (EventData::LeasePreemptionNoticed(n), Some(end)) = (
        &notice[0].envelope.data,
        of_type(&log, "lease.ended")
            .into_iter()
            .find_map(|e| match &e.envelope.data {
                EventData::LeaseEnded(x) if x.lease_id.to_string() == spot_b => Some(x.clone()),
                _ => None,
            }),
    ) else {
        panic!("missing notice or end");
    };
    assert!(
        end.ended_at >= n.deadline,
        "ended {} before deadline {}",
        end.ended_at,
        n.deadline
    );
    let period = chrono::Utc::now().format("%Y-%m").to_string();
    for _ in 0..100 {
        let (_, inv) = stack
            .call(
                Method::GET,
                &format!("/v1/charges?period={period}"),
                &spot_key,
                None,
            )
            .await;
        if inv["lines"].as_array().is_some_and(|l| l.len() == 1) {
            assert_eq!(inv["lines"][0]["lease_id"], spot_b.as_str());
            assert_eq!(inv["lines"][0]["tier"], "spot");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the preempted lease was never billed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vram_quota_and_priorities_through_the_api() {
    let stack = Stack::start(FLEET).await;
    let (status, body) = stack
        .call(
            Method::POST,
            "/v1/tenants",
            lh_test_stack::ADMIN_TOKEN,
            Some(json!({"name": "vram", "email": "ops@vram.example", "quota": {"max_gpus": 8, "max_vram_gb": 100}, "weight": 3})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["weight"], 3);
    assert_eq!(body["quota"]["max_vram_gb"], 100);
    let key = body["api_key"].as_str().unwrap().to_string();
    let a = stack
        .lease(&key, json!({"gpus": 2, "gpu_model": "A100-40GB"}))
        .await;
    stack
        .wait_lease(&key, &a, |l| l["state"] == "running")
        .await;
    // 80 GB held; 40 more would exceed 100 GB although only 3 of 8 GPUs.
    let b = stack
        .lease(
            &key,
            json!({"gpus": 1, "gpu_model": "A100-40GB", "priority": 7}),
        )
        .await;
    let rejected = stack
        .wait_lease(&key, &b, |l| l["state"] == "rejected")
        .await;
    assert!(
        rejected["rejected_reason"]
            .as_str()
            .unwrap()
            .contains("VRAM"),
        "{rejected}"
    );
    assert_eq!(rejected["priority"], 7);

    for (body, field) in [(
        json!({"gpus": 1, "gpu_model": "A100-40GB", "priority": 5000}),
        "priority",
    )] {
        let (s, p) = stack
            .call(Method::POST, "/v1/leases", &key, Some(body))
            .await;
        assert_eq!((s, p["field"].as_str()), (422, Some(field)), "{p}");
    }
    for (body, field) in [
        (
            json!({"name": "w", "email": "a@b.co", "quota": {"max_gpus": 1}, "weight": 0}),
            "weight",
        ),
        (
            json!({"name": "w", "email": "a@b.co", "quota": {"max_gpus": 1, "max_vram_gb": 0}}),
            "quota.max_vram_gb",
        ),
    ] {
        let (s, p) = stack
            .call(
                Method::POST,
                "/v1/tenants",
                lh_test_stack::ADMIN_TOKEN,
                Some(body),
            )
            .await;
        assert_eq!((s, p["field"].as_str()), (422, Some(field)), "{p}");
    }
}
