//! Fractional (memory-sliced vGPU) leases end to end through the REST API:
//! shares pack onto one GPU, a share that would overflow its VRAM goes to
//! another GPU, and the invoice bills each share by its VRAM.

use std::time::Duration;

use lh_events::EventData;
use lh_test_stack::{expected_charge, of_type, read_log, Stack, TWO_A100};
use reqwest::Method;
use rust_decimal::Decimal;
use serde_json::{json, Value};

async fn fraction(stack: &Stack, key: &str, milli: u32, vram_gb: u32) -> String {
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            key,
            Some(json!({"gpu_fraction": {"milli": milli, "vram_gb": vram_gb}, "gpu_model": "A100-40GB"})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    assert_eq!(
        b["gpu_fraction"],
        json!({"milli": milli, "vram_gb": vram_gb})
    );
    b["id"].as_str().unwrap().to_string()
}

fn gpu_of(lease: &Value) -> (String, Value) {
    (
        lease["node_id"].as_str().unwrap().to_string(),
        lease["gpu_indices"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fractional_leases_share_a_gpu_and_bill_by_vram() {
    let stack = Stack::start(TWO_A100).await;
    let (_, key) = stack.create_tenant("slices", 4).await;

    // Bad fractions name the field.
    for (body, field) in [
        (
            json!({"gpus": 1, "gpu_fraction": {"milli": 100, "vram_gb": 1}, "gpu_model": "A100-40GB"}),
            "gpu_fraction",
        ),
        (json!({"gpu_model": "A100-40GB"}), "gpus"),
        (
            json!({"gpu_fraction": {"milli": 0, "vram_gb": 1}, "gpu_model": "A100-40GB"}),
            "gpu_fraction.milli",
        ),
        (
            json!({"gpu_fraction": {"milli": 100, "vram_gb": 41}, "gpu_model": "A100-40GB"}),
            "gpu_fraction.vram_gb",
        ),
    ] {
        let (s, p) = stack
            .call(Method::POST, "/v1/leases", &key, Some(body))
            .await;
        assert_eq!((s, p["field"].as_str()), (422, Some(field)), "{p}");
    }

    let a = fraction(&stack, &key, 300, 10).await;
    let a_run = stack
        .wait_lease(&key, &a, |l| l["state"] == "running")
        .await;
    let b = fraction(&stack, &key, 500, 20).await;
    let b_run = stack
        .wait_lease(&key, &b, |l| l["state"] == "running")
        .await;
    assert_eq!(gpu_of(&a_run), gpu_of(&b_run), "both shares on one GPU");
    assert_eq!(a_run["gpu_uuids"], b_run["gpu_uuids"]);
    // 10 GB are left there: a 15 GB share goes to the other GPU.
    let c = fraction(&stack, &key, 100, 15).await;
    let c_run = stack
        .wait_lease(&key, &c, |l| l["state"] == "running")
        .await;
    assert_ne!(gpu_of(&c_run), gpu_of(&a_run));

    let log = read_log(&stack.bus().await).await;
    for placed in of_type(&log, "lease.placed") {
        let EventData::LeasePlaced(p) = &placed.envelope.data else {
            unreachable!()
        };
        assert_eq!(p.decision.policy, "leasehold");
        assert!(p.gpus[0].milli.is_some() && p.gpus[0].vram_gb.is_some());
    }

    tokio::time::sleep(Duration::from_millis(1200)).await;
    for id in [&a, &b, &c] {
        let (s, body) = stack
            .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
            .await;
        assert_eq!(s, 202, "{body}");
    }
    for id in [&a, &b, &c] {
        stack.wait_lease(&key, id, |l| l["state"] == "ended").await;
    }

    // Each line is the share's VRAM x 0.5 CNY/GB-hour x billed seconds.
    let log = read_log(&stack.bus().await).await;
    let mut expected = std::collections::HashMap::new();
    for (id, vram) in [(&a, 10), (&b, 20), (&c, 15)] {
        let (seconds, amount, start) = expected_charge(&log, id, vram);
        expected.insert(id.to_string(), (vram, seconds, amount, start));
    }
    let period = expected[&a].3.format("%Y-%m").to_string();
    let invoice = stack.wait_invoice(&key, &period, 3).await;
    let lines = invoice["lines"].as_array().expect("three invoice lines");
    let mut total = Decimal::ZERO;
    for line in lines {
        let (vram, seconds, amount, _) = expected[line["lease_id"].as_str().unwrap()];
        assert_eq!(line["vram_gb"], vram, "{line}");
        assert_eq!(line["billed_seconds"], seconds, "{line}");
        assert_eq!(
            line["amount"].as_str().unwrap().parse::<Decimal>().unwrap(),
            amount,
            "{line}"
        );
        total += amount;
    }
    assert_eq!(
        invoice["total"]
            .as_str()
            .unwrap()
            .parse::<Decimal>()
            .unwrap(),
        total
    );

    // The lease view, gpu_fraction included, is what a replay gives.
    stack.assert_gateway_rebuilds_identically().await;
}
