//! `POST /v1/leases` answers once the request is on the log, without
//! waiting for the read model: on a real nats-server and PostgreSQL, the
//! answer is the row the projection then makes, a GET right after it sees
//! the lease, a retry finds the same lease, and the balance and
//! waiting-lease limits hold. Only the gateway runs (no scheduler), so a
//! lease stays as its request made it.

use chrono::Utc;
use lh_bus::Expect;
use lh_events::{
    Actor, BalanceExhausted, BalanceRestored, Envelope, EventData, LeaseStopRequested,
};
use lh_test_stack::{Stack, ADMIN_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};
use uuid::Uuid;

async fn gateway_alone(max_pending_leases: u32) -> Stack {
    let mut stack = Stack::bare(FLEET).await;
    stack.gateway_limits.writes_per_s = 100_000.0;
    stack.gateway_limits.write_burst = 100_000;
    stack.gateway_limits.max_pending_leases = max_pending_leases;
    stack.start_service("gateway").await;
    stack.wait_ready().await;
    stack
}

async fn post(
    stack: &Stack,
    key: &str,
    idempotency_key: Option<&str>,
    body: &Value,
) -> (u16, Value) {
    let mut req = stack
        .http
        .post(format!("{}/v1/leases", stack.gateway_url))
        .bearer_auth(key)
        .json(body);
    if let Some(k) = idempotency_key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// Makes sure the gateway's read model has applied everything appended so
/// far: a GET of a lease that has only a stop request on the log waits for
/// the projection to reach it, then answers 404.
async fn wait_read_model(stack: &Stack, key: &str) {
    let nowhere = Uuid::now_v7();
    let mut stop = Envelope::new(
        Actor::Admin,
        Utc::now(),
        EventData::LeaseStopRequested(LeaseStopRequested { lease_id: nowhere }),
    );
    stop.tenant_id = None;
    stack.bus().await.publish(&stop, Expect::Any).await.unwrap();
    let (status, body) = stack
        .call(Method::GET, &format!("/v1/leases/{nowhere}"), key, None)
        .await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_accepted_lease_is_the_row_a_get_right_after_reads() {
    let stack = gateway_alone(1_000).await;
    let (_, key) = stack.create_tenant("writer", 64).await;
    let bodies = [
        json!({"gpus": 1, "gpu_model": "A100-40GB"}),
        json!({"gpu_fraction": {"milli": 250, "vram_gb": 10}, "gpu_model": "A100-40GB", "priority": 7}),
        json!({"mig_profile": "3g.20gb", "gpu_model": "A100-40GB", "zones": ["cn-north-1a"]}),
        json!({"gpus": 2, "gpu_model": "H100-80GB", "tier": "spot",
               "max_price_cny_per_gpu_hour": "4.5", "recovery": {"max_retries": 2},
               "regions": ["cn-south-1"]}),
        json!({"gpus": 1, "gpu_model": "A100-40GB",
               "workload": {"command": ["python", "train.py"], "image": "pytorch:2",
                            "env": {"TOKEN": "secret"}}}),
    ];
    for round in 0..40 {
        for body in &bodies {
            let (status, accepted) = post(&stack, &key, None, body).await;
            assert_eq!(status, 202, "{accepted}");
            let id = accepted["id"].as_str().unwrap();
            let (status, read) = stack
                .call(Method::GET, &format!("/v1/leases/{id}"), &key, None)
                .await;
            assert_eq!(status, 200, "round {round}: {read}");
            assert_eq!(accepted, read, "the answer is the row the projection made");
        }
        // A list right after a write shows it too, at the head of the page.
        let (status, accepted) = post(&stack, &key, None, &bodies[0]).await;
        assert_eq!(status, 202, "{accepted}");
        let (status, page) = stack
            .call(Method::GET, "/v1/leases?limit=1", &key, None)
            .await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(
            page["items"][0]["id"], accepted["id"],
            "round {round}: the list shows the lease just accepted"
        );
        // So does an operator's list of every tenant's leases.
        let (status, accepted) = post(&stack, &key, None, &bodies[0]).await;
        assert_eq!(status, 202, "{accepted}");
        let (status, page) = stack
            .call(Method::GET, "/v1/leases?limit=1", ADMIN_TOKEN, None)
            .await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(
            page["items"][0]["id"], accepted["id"],
            "round {round}: the operator's list shows the lease just accepted"
        );
    }
    let (_, page) = stack
        .call(Method::GET, "/v1/leases?limit=500", &key, None)
        .await;
    assert!(
        !page.to_string().contains("secret"),
        "an environment's values never show"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_finds_the_same_lease_and_another_body_is_a_conflict() {
    let stack = gateway_alone(1_000).await;
    let (_, key) = stack.create_tenant("retrier", 16).await;
    let body = json!({"gpus": 1, "gpu_model": "A100-40GB"});
    for n in 0..20 {
        let k = format!("retry-{n}");
        let (status, first) = post(&stack, &key, Some(&k), &body).await;
        assert_eq!(status, 202, "{first}");
        // At once, before the read model may have the first.
        let (status, again) = post(&stack, &key, Some(&k), &body).await;
        assert_eq!(status, 202, "{again}");
        assert_eq!(first, again);
        let other = json!({"gpus": 2, "gpu_model": "A100-40GB"});
        let (status, conflict) = post(&stack, &key, Some(&k), &other).await;
        assert_eq!(status, 409, "{conflict}");
        assert_eq!(conflict["field"], "Idempotency-Key", "{conflict}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_exhausted_balance_refuses_leases_as_soon_as_the_read_model_has_it() {
    let stack = gateway_alone(1_000).await;
    let (tenant_id, key) = stack.create_tenant("spender", 16).await;
    let tenant_id: Uuid = tenant_id.parse().unwrap();
    let body = json!({"gpus": 1, "gpu_model": "A100-40GB"});
    // The gateway now holds "not exhausted" for the tenant.
    assert_eq!(post(&stack, &key, None, &body).await.0, 202);
    let bus = stack.bus().await;
    let exhausted = Envelope::new(
        Actor::Service("lh-pricing".into()),
        Utc::now(),
        EventData::BalanceExhausted(BalanceExhausted {
            tenant_id,
            balance: rust_decimal::Decimal::ZERO,
            stopped_leases: Vec::new(),
        }),
    );
    bus.publish(&exhausted, Expect::Any).await.unwrap();
    wait_read_model(&stack, &key).await;
    let (status, refused) = post(&stack, &key, None, &body).await;
    assert_eq!(status, 402, "{refused}");

    let restored = Envelope::new(
        Actor::Service("lh-pricing".into()),
        Utc::now(),
        EventData::BalanceRestored(BalanceRestored {
            tenant_id,
            balance: rust_decimal::Decimal::ONE,
        }),
    );
    bus.publish(&restored, Expect::Any).await.unwrap();
    wait_read_model(&stack, &key).await;
    let (status, accepted) = post(&stack, &key, None, &body).await;
    assert_eq!(status, 202, "{accepted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_waiting_lease_limit_counts_requests_the_read_model_has_not_applied() {
    let stack = gateway_alone(3).await;
    let (_, key) = stack.create_tenant("eager", 16).await;
    let body = json!({"gpus": 1, "gpu_model": "A100-40GB"});
    for _ in 0..3 {
        let (status, accepted) = post(&stack, &key, None, &body).await;
        assert_eq!(status, 202, "{accepted}");
    }
    // At once, and again once the read model holds all three.
    let (status, refused) = post(&stack, &key, None, &body).await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["field"], "tenant", "{refused}");
    wait_read_model(&stack, &key).await;
    let (status, refused) = post(&stack, &key, None, &body).await;
    assert_eq!(status, 429, "{refused}");
    // Another tenant is not held back.
    let (_, calm) = stack.create_tenant("calm", 16).await;
    assert_eq!(post(&stack, &calm, None, &body).await.0, 202);
}

/// A lease's log is read from its last placement, named by the placement's
/// sequence: not an older placement's on the same node, and, back in the
/// queue, still its last run's, as a log the lease will add to.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_s_log_is_its_last_placement_s_even_back_in_the_queue() {
    use lh_events::{fixtures, LeaseMigrated};
    use lh_rpc::lease_logs::{LeaseLogs, LeaseLogsReply, LeaseLogsRequest};
    use std::sync::{Arc, Mutex};

    const NODE: &str = "node-logs";
    let stack = gateway_alone(1_000).await;
    let (_, key) = stack.create_tenant("logger", 8).await;
    let bus = stack.bus().await;
    // The node: each placement's log says which it is, and has ended.
    let asked: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let node = {
        let (bus, asked) = (bus.clone(), asked.clone());
        tokio::spawn(async move {
            lh_bus::rpc::serve(
                &bus,
                &lh_events::subject::rpc_lease_logs(NODE),
                "node-agent",
                move |request: LeaseLogsRequest| {
                    asked.lock().unwrap().push(request.placement);
                    let data = format!("run of placement {:?}\n", request.placement);
                    std::future::ready(Ok::<_, String>(LeaseLogsReply::Logs(LeaseLogs {
                        next_offset: data.len() as u64,
                        size: data.len() as u64,
                        data,
                        dropped_before: 0,
                        finished: true,
                    })))
                },
            )
            .await
        })
    };
    let body = json!({"gpus": 1, "gpu_model": "A100-40GB",
                      "workload": {"command": ["python", "train.py"], "image": "pytorch:2"}});
    let (status, accepted) = post(&stack, &key, None, &body).await;
    assert_eq!(status, 202, "{accepted}");
    let id: Uuid = accepted["id"].as_str().unwrap().parse().unwrap();
    let place = |bus: lh_bus::Bus| async move {
        let placed = fixtures::by_owner(EventData::LeasePlaced(fixtures::placed(
            id,
            NODE,
            "cn-north-1a",
            "A100-40GB",
            40,
            &[0],
        )));
        bus.publish(&placed, Expect::Any).await.unwrap().sequence
    };
    let read = || async {
        let (status, page) = stack
            .call(Method::GET, &format!("/v1/leases/{id}/logs"), &key, None)
            .await;
        assert_eq!(status, 200, "{page}");
        page
    };

    let first = place(bus.clone()).await;
    wait_read_model(&stack, &key).await;
    let page = read().await;
    assert_eq!(page["placement"], first, "{page}");
    assert_eq!(page["node_id"], NODE, "{page}");
    assert_eq!(page["finished"], true, "{page}");

    // Back in the queue: its last run's log, which a follower keeps on.
    let requeued = fixtures::by_owner(EventData::LeaseMigrated(LeaseMigrated {
        lease_id: id,
        reason: "node_lost".into(),
        from_node_id: NODE.into(),
        from_gpu_indices: vec![0],
        billing_ends_at: Utc::now(),
        to: None,
    }));
    bus.publish(&requeued, Expect::Any).await.unwrap();
    wait_read_model(&stack, &key).await;
    let page = read().await;
    assert_eq!(page["placement"], first, "{page}");
    assert_eq!(page["data"], format!("run of placement Some({first})\n"));
    assert_eq!(page["finished"], false, "{page}");
    assert!(
        page["detail"]
            .as_str()
            .unwrap()
            .contains("back in the queue"),
        "{page}"
    );

    // Placed on the same node again: the new placement's log, not the old.
    let second = place(bus.clone()).await;
    wait_read_model(&stack, &key).await;
    let page = read().await;
    assert_eq!(page["placement"], second, "{page}");

    // Moved to other GPUs of the same node: that move's log.
    let on = fixtures::placed(id, NODE, "cn-north-1a", "A100-40GB", 40, &[1]);
    let moved = fixtures::by_owner(EventData::LeaseMigrated(LeaseMigrated {
        lease_id: id,
        reason: "gpu_unhealthy".into(),
        from_node_id: NODE.into(),
        from_gpu_indices: vec![0],
        billing_ends_at: Utc::now(),
        to: Some(lh_events::Relocation {
            node_id: on.node_id,
            zone: on.zone,
            vram_gb_per_gpu: on.vram_gb_per_gpu,
            gpus: on.gpus,
            decision: on.decision,
        }),
    }));
    let third = bus.publish(&moved, Expect::Any).await.unwrap().sequence;
    wait_read_model(&stack, &key).await;
    let page = read().await;
    assert_eq!(page["placement"], third, "{page}");
    assert_eq!(page["finished"], true, "{page}");
    assert_eq!(
        *asked.lock().unwrap(),
        [Some(first), Some(first), Some(second), Some(third)]
    );
    node.abort();
}
