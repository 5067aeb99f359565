//! The platform through a PostgreSQL restart: the gateway answers 503 with
//! `Retry-After` while the database is gone, the projections wait, nothing
//! exits, and leases run and are billed once it is back.

use std::time::Duration;

use lh_bus::Expect;
use lh_events::{Actor, Envelope, EventData, LeaseStopRequested};
use lh_test_stack::{Stack, FLEET};
use reqwest::Method;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_restart_is_answered_with_503_and_stops_nothing() {
    let mut stack = Stack::start_with_own_postgres(FLEET).await;
    let (_, key) = stack.create_tenant("acme", 8).await;
    let before = stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A10G-24GB"}))
        .await;
    let before_id = before["id"].as_str().unwrap().to_string();

    stack.own_postgres.as_mut().unwrap().kill();
    // A lease the gateway holds in memory is answered as the read model
    // last showed it (nothing can change it while the database is gone);
    // one it does not hold must be read from the database.
    let (status, held) = stack
        .call(Method::GET, &format!("/v1/leases/{before_id}"), &key, None)
        .await;
    assert_eq!((status, &held), (200, &before), "a held lease");
    let response = stack
        .http
        .get(format!(
            "{}/v1/leases/{}",
            stack.gateway_url,
            uuid::Uuid::now_v7()
        ))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        problem["type"],
        "https://leasehold.dev/problems/database-unavailable"
    );

    // An event while the database is gone: the projections cannot write it,
    // and the gateway says it is not ready instead of exiting.
    let stop_of_nothing = Envelope::new(
        Actor::Admin,
        chrono::Utc::now(),
        EventData::LeaseStopRequested(LeaseStopRequested {
            lease_id: uuid::Uuid::new_v4(),
        }),
    );
    stack
        .bus()
        .await
        .publish(&stop_of_nothing, Expect::Any)
        .await
        .unwrap();
    let readyz = format!("{}/readyz", stack.gateway_url);
    let mut unready = false;
    for _ in 0..600 {
        let status = stack.http.get(&readyz).send().await.unwrap().status();
        if status == 503 {
            unready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        unready,
        "the gateway reports not ready while it cannot write"
    );
    stack.assert_none_stopped();

    stack
        .own_postgres
        .as_mut()
        .unwrap()
        .restart()
        .await
        .unwrap();
    stack.wait_ready().await;
    stack.assert_none_stopped();
    let (status, body) = stack
        .call(Method::GET, &format!("/v1/leases/{before_id}"), &key, None)
        .await;
    assert_eq!((status, &body["state"]), (200, &json!("running")), "{body}");

    // A new lease runs, ends and is billed, as the old one is.
    let after = stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A10G-24GB"}))
        .await;
    for lease in [&before, &after] {
        let id = lease["id"].as_str().unwrap();
        let (status, _) = stack
            .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
            .await;
        assert_eq!(status, 202);
    }
    let period = chrono::Utc::now().format("%Y-%m").to_string();
    stack.wait_invoice(&key, &period, 2).await;
    stack.assert_none_stopped();
}
