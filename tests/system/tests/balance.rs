//! A prepaid tenant's balance end to end, on a real nats-server and
//! PostgreSQL: a warning before it runs out, its running lease stopped and
//! new ones refused when it does, leasing again after a top-up.

use std::time::Duration;

use lh_events::EventData;
use lh_test_stack::{of_type, Stack, ADMIN_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

/// 40 GB at the default book's 0.5 CNY/GB-h: 20 CNY an hour.
const ONE_GPU: &str = r#"{"gpus": 1, "gpu_model": "A100-40GB"}"#;

async fn top_up(stack: &Stack, tenant_id: &str, amount: &str) {
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant_id}/balance/top-ups"),
            ADMIN_TOKEN,
            Some(json!({ "amount": amount })),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["amount"], amount, "{body}");
}

/// Asks for a lease until the gateway answers `status` (its read model
/// follows the log).
async fn lease_answers(stack: &Stack, key: &str, status: u16) -> Value {
    let mut last = Value::Null;
    for _ in 0..100 {
        let (got, body) = stack
            .call(
                Method::POST,
                "/v1/leases",
                key,
                Some(serde_json::from_str(ONE_GPU).unwrap()),
            )
            .await;
        if got == status {
            return body;
        }
        last = body;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("POST /v1/leases never answered {status}; last: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_exhausted_balance_stops_the_leases_refuses_new_ones_until_a_top_up() {
    let stack = Stack::start(FLEET).await;
    let (tenant_id, key) = stack.create_tenant("prepaid", 4).await;
    let (_, postpaid_key) = stack.create_tenant("postpaid", 4).await;

    // Never topped up: postpaid.
    let (status, balance) = stack
        .call(
            Method::GET,
            &format!("/v1/tenants/{tenant_id}/balance"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 200, "{balance}");
    assert_eq!(balance["prepaid"], false, "{balance}");

    // Five fen: about nine seconds of one GPU.
    top_up(&stack, &tenant_id, "0.05").await;
    let lease = stack
        .running(&key, serde_json::from_str(ONE_GPU).unwrap())
        .await;
    let lease_id = lease["id"].as_str().unwrap().to_string();
    let postpaid = stack
        .running(&postpaid_key, serde_json::from_str(ONE_GPU).unwrap())
        .await;

    let tenant: uuid::Uuid = tenant_id.parse().unwrap();
    let lease_uuid: uuid::Uuid = lease_id.parse().unwrap();
    let (low_at, exhausted_at, exhausted_id) = stack
        .wait_log(60, |log| {
            let low = of_type(log, "balance.low").into_iter().next()?;
            let exhausted = of_type(log, "balance.exhausted").into_iter().next()?;
            Some((low.sequence, exhausted.sequence, exhausted.envelope.id))
        })
        .await;
    assert!(low_at < exhausted_at, "the warning comes first");
    let log = lh_test_stack::read_log(&stack.bus().await).await;
    let low = of_type(&log, "balance.low")[0];
    let EventData::BalanceLow(low) = &low.envelope.data else {
        unreachable!()
    };
    assert_eq!(low.tenant_id, tenant);
    assert_eq!(low.burn_rate_cny_per_hour.to_string(), "20");
    assert!(low.covers_seconds < low.warn_seconds, "{low:?}");
    let exhausted = of_type(&log, "balance.exhausted")[0];
    let EventData::BalanceExhausted(e) = &exhausted.envelope.data else {
        unreachable!()
    };
    assert_eq!(e.stopped_leases, [lease_uuid]);
    assert!(e.balance <= rust_decimal::Decimal::ZERO, "{e:?}");
    // Pricing asks the lease to stop, naming the exhaustion as its cause.
    let stop = of_type(&log, "lease.stop_requested")
        .into_iter()
        .find(|s| s.envelope.data.lease_id() == Some(lease_uuid))
        .expect("the prepaid lease is asked to stop");
    assert_eq!(stop.envelope.causation_id, Some(exhausted_id));
    stack
        .wait_lease(&key, &lease_id, |l| l["state"] == "ended")
        .await;

    let refused = lease_answers(&stack, &key, 402).await;
    assert_eq!(
        refused["type"], "https://leasehold.dev/problems/balance-exhausted",
        "{refused}"
    );
    assert!(
        refused["detail"].as_str().unwrap().contains("balance"),
        "{refused}"
    );
    // The postpaid tenant runs on, and sees what it spends an hour.
    let postpaid_tenant = postpaid["tenant_id"].as_str().unwrap();
    let (status, spent) = stack
        .call(
            Method::GET,
            &format!("/v1/tenants/{postpaid_tenant}/balance"),
            &postpaid_key,
            None,
        )
        .await;
    assert_eq!(status, 200, "{spent}");
    assert_eq!(spent["prepaid"], false, "{spent}");
    let burn: f64 = spent["burn_rate_cny_per_hour"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        burn > 0.0,
        "a postpaid tenant's running lease costs something: {spent}"
    );
    let (_, still) = stack
        .call(
            Method::GET,
            &format!("/v1/leases/{}", postpaid["id"].as_str().unwrap()),
            &postpaid_key,
            None,
        )
        .await;
    assert_eq!(still["state"], "running", "{still}");

    top_up(&stack, &tenant_id, "100.00").await;
    stack
        .wait_log(30, |log| {
            of_type(log, "balance.restored")
                .into_iter()
                .next()
                .map(|_| ())
        })
        .await;
    lease_answers(&stack, &key, 202).await;
    let (status, balance) = stack
        .call(
            Method::GET,
            &format!("/v1/tenants/{tenant_id}/balance"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 200, "{balance}");
    assert_eq!(balance["prepaid"], true, "{balance}");
    assert_eq!(balance["topped_up"], "100.05", "{balance}");
}
