//! The spot market on the real stack: prices that follow use, a bid that
//! the price outgrows, the notice, the end at its deadline, and the managed
//! recovery that waits for the price to fall, and the bill that leaves the
//! notice period out.

use std::time::Duration;

use lh_events::{EndReason, EventData, PreemptionReason, Tier};
use lh_test_stack::{read_log, Stack, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

/// node-b: four A10G-24GB in cn-east-1b. Under the default band a GPU-hour
/// there costs 0.1 + 0.4 u² CNY per GB-hour × 24 GB: 2.4 idle, 3.0 with
/// one GPU taken, 4.8 with two, 7.8 with three.
const MODEL: &str = "A10G-24GB";
const ZONE: &str = "cn-east-1b";
const NOTICE_SECS: i64 = 2;

async fn prices(stack: &Stack, key: &str) -> Value {
    let (status, body) = stack
        .call(
            Method::GET,
            &format!("/v1/spot/prices?zone={ZONE}&gpu_model={MODEL}"),
            key,
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn wait_price(stack: &Stack, key: &str, price: &str) -> Value {
    for _ in 0..200 {
        let body = prices(stack, key).await;
        if body["markets"][0]["current"]["price_cny_per_gb_hour"] == price {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the price never became {price}: {}",
        prices(stack, key).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outbid_spot_lease_is_noticed_ended_at_the_deadline_and_recovered() {
    let mut stack = Stack::bare(FLEET).await;
    stack.preemption_notice_secs = NOTICE_SECS;
    for name in [
        "scheduler",
        "pricing",
        "spot-broker",
        "audit",
        "gateway",
        "node-agent:node-b",
    ] {
        stack.start_service(name).await;
    }
    stack.wait_ready().await;
    let (_, spot_key) = stack.create_tenant("bidder", 16).await;
    let (_, key) = stack.create_tenant("on-demand", 16).await;
    wait_price(&stack, &spot_key, "0.1").await;

    // A bid is for spot only, and named when wrong.
    let (status, problem) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": MODEL, "max_price_cny_per_gpu_hour": "3"})),
        )
        .await;
    assert_eq!(
        (status, &problem["field"]),
        (422, &json!("max_price_cny_per_gpu_hour"))
    );
    // The same Idempotency-Key with another bid is another request: refused.
    // (A model node-b does not have: it waits, out of this market.)
    let keyed = |bid: &'static str| {
        stack
            .http
            .post(format!("{}/v1/leases", stack.gateway_url))
            .bearer_auth(&spot_key)
            .header("Idempotency-Key", "bid-1")
            .json(&json!({"gpus": 1, "gpu_model": "H100-80GB", "tier": "spot",
                          "max_price_cny_per_gpu_hour": bid}))
            .send()
    };
    assert_eq!(keyed("3").await.unwrap().status().as_u16(), 202);
    assert_eq!(keyed("3").await.unwrap().status().as_u16(), 202);
    assert_eq!(keyed("4").await.unwrap().status().as_u16(), 409);

    // Placed at 2.4; its own GPU takes the price to 3.0, still covered.
    let first = stack
        .lease(
            &spot_key,
            json!({"gpus": 1, "gpu_model": MODEL, "tier": "spot",
                   "max_price_cny_per_gpu_hour": "3",
                   "recovery": {"max_retries": 1, "zone_first": "same"}}),
        )
        .await;
    stack
        .wait_lease(&spot_key, &first, |l| l["state"] == "running")
        .await;
    let market = wait_price(&stack, &spot_key, "0.125").await;
    let history = &market["markets"][0]["history"];
    assert_eq!(history[0]["price_cny_per_gb_hour"], "0.1", "{market}");

    // On-demand work takes two more GPUs: 7.8 a GPU-hour outbids it.
    let od = stack
        .lease(
            &key,
            json!({"gpus": 2, "gpu_model": MODEL, "tier": "basic"}),
        )
        .await;
    stack
        .wait_lease(&key, &od, |l| l["state"] == "running")
        .await;
    let ended = stack
        .wait_lease(&spot_key, &first, |l| l["state"] == "ended")
        .await;
    assert_eq!(ended["end_reason"], "preempted");
    assert_eq!(ended["preemption_reason"], "outbid", "{ended}");
    assert_eq!(ended["spot"]["max_price_cny_per_gpu_hour"], "3", "{ended}");

    // Noticed as outbid, ended at the deadline and not before.
    let notice = stack
        .wait_log(10, |log| {
            log.iter().find_map(|e| match &e.envelope.data {
                EventData::LeasePreemptionNoticed(n) if n.lease_id.to_string() == first => {
                    Some(n.clone())
                }
                _ => None,
            })
        })
        .await;
    assert_eq!(notice.reason, PreemptionReason::Outbid);
    assert!(notice.preempted_for.is_nil());
    let log = read_log(&stack.bus().await).await;
    let end = log
        .iter()
        .find_map(|e| match &e.envelope.data {
            EventData::LeaseEnded(x) if x.lease_id.to_string() == first => Some(x.clone()),
            _ => None,
        })
        .expect("the end is on the log");
    assert_eq!(end.reason, EndReason::Preempted);
    assert!(end.ended_at >= notice.deadline, "{end:?} {notice:?}");

    // Billed up to the notice and not through it: the notice period is the
    // tenant's time to save work. (A few seconds at well under 1 CNY a
    // GB-hour round to 0.00, so the time billed is what shows it.)
    let noticed_at = log
        .iter()
        .find_map(|e| match &e.envelope.data {
            EventData::LeasePreemptionNoticed(n) if n.lease_id.to_string() == first => {
                Some(e.envelope.occurred_at)
            }
            _ => None,
        })
        .expect("the notice is on the log");
    let started_at = log
        .iter()
        .find_map(|e| match &e.envelope.data {
            EventData::LeaseStarted(s) if s.lease_id.to_string() == first => Some(s.started_at),
            _ => None,
        })
        .expect("the start is on the log");
    let charges = stack
        .wait_log(10, |log| {
            let charges: Vec<_> = log
                .iter()
                .filter_map(|e| match &e.envelope.data {
                    EventData::ChargeAccrued(c) if c.lease_id.to_string() == first => {
                        Some(c.clone())
                    }
                    _ => None,
                })
                .collect();
            (!charges.is_empty()).then_some(charges)
        })
        .await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    let charge = &charges[0];
    assert_eq!(charge.tier, Tier::Spot);
    assert_eq!(
        (charge.from, charge.to),
        (started_at, noticed_at),
        "{charge:?}"
    );
    // Whole seconds, the last one begun counting.
    let run_nanos = (noticed_at - started_at).num_nanoseconds().unwrap().max(0) as u64;
    assert_eq!(charge.billed_seconds, run_nanos.div_ceil(1_000_000_000));
    assert!(
        end.ended_at - charge.to >= chrono::Duration::seconds(NOTICE_SECS),
        "{charge:?} {end:?}"
    );
    // The month's invoice carries that line as billed.
    let period = noticed_at.format("%Y-%m").to_string();
    let mut line = Value::Null;
    for _ in 0..100 {
        let (status, draft) = stack
            .call(
                Method::GET,
                &format!("/v1/invoices/{period}"),
                &spot_key,
                None,
            )
            .await;
        assert_eq!(status, 200, "{draft}");
        if let Some(found) = draft["lines"]
            .as_array()
            .and_then(|lines| lines.iter().find(|l| l["lease_id"] == first.as_str()))
        {
            line = found.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(line["tier"], "spot", "{line}");
    assert_eq!(line["billed_seconds"], charge.billed_seconds, "{line}");

    // Recovered as a new lease of the same spec, which waits while two
    // GPUs of four are taken (4.8 > 3)...
    let recovery = stack
        .wait_log(10, |log| {
            log.iter().find_map(|e| match &e.envelope.data {
                EventData::LeaseRequested(r)
                    if r.recovery_of
                        .as_ref()
                        .is_some_and(|of| of.lease_id.to_string() == first) =>
                {
                    Some(r.clone())
                }
                _ => None,
            })
        })
        .await;
    let of = recovery.recovery_of.clone().unwrap();
    assert_eq!((of.attempt, of.zone.as_str()), (1, ZONE));
    assert_eq!(
        (
            recovery.gpus,
            recovery.gpu_model.as_str(),
            recovery.max_price_cny_per_gpu_hour
        ),
        (1, MODEL, Some("3".parse().unwrap()))
    );
    let second = recovery.lease_id.to_string();
    let waiting = stack
        .wait_lease(&spot_key, &second, |l| {
            l["queued_reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("outbid"))
        })
        .await;
    assert_eq!(waiting["state"], "queued", "{waiting}");
    assert_eq!(
        waiting["spot"]["recovery_of"]["lease_id"],
        first.as_str(),
        "{waiting}"
    );

    // ... and runs once the on-demand lease is gone and the price falls.
    let (status, _) = stack
        .call(Method::POST, &format!("/v1/leases/{od}/stop"), &key, None)
        .await;
    assert_eq!(status, 202);
    let running = stack
        .wait_lease(&spot_key, &second, |l| l["state"] == "running")
        .await;
    assert_eq!(running["zone"], ZONE);

    // The scheduler's figures say what happened.
    let metrics = stack
        .http
        .get(format!(
            "http://{}/metrics",
            stack.metrics_addr("scheduler")
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |series: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no {series} in:\n{metrics}"))
    };
    assert_eq!(value("lh_spot_preemptions_total{reason=\"outbid\"}"), "1");
    assert_eq!(value("lh_spot_leases_accepted_total"), "2");
    assert_eq!(
        value("lh_spot_leases_ended_total{outcome=\"succeeded\"}"),
        "1"
    );
    // The read model's spot terms come back the same from the log.
    stack.assert_gateway_rebuilds_identically().await;
    stack.assert_none_stopped();
}
