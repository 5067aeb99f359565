//! Quotes through the HTTP API on a real nats-server and PostgreSQL: a
//! tenant prices a request, asks for a lease with the quote, and the
//! gateway refuses a quote that is not for this tenant or this request.

use lh_events::EventData;
use lh_test_stack::{of_type, Stack, FLEET};
use reqwest::Method;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_asked_for_with_a_quote_carries_it_and_a_wrong_quote_is_refused() {
    let stack = Stack::start(FLEET).await;
    let (_, key) = stack.create_tenant("quoted", 4).await;
    let (_, other_key) = stack.create_tenant("other", 4).await;

    let (status, quote) = stack
        .call(
            Method::POST,
            "/v1/quotes",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "duration_seconds": 7200})),
        )
        .await;
    assert_eq!(status, 201, "{quote}");
    // 40 GB for two hours at the default book's 0.5 CNY/GB-h.
    assert_eq!(quote["amount"], "40.00", "{quote}");
    assert_eq!(quote["price_book_version"], 1, "{quote}");
    let quote_id = quote["quote_id"].as_str().unwrap().to_string();

    let (status, bad) = stack
        .call(
            Method::POST,
            "/v1/quotes",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "duration_seconds": 0})),
        )
        .await;
    assert_eq!(status, 422, "{bad}");
    assert_eq!(bad["field"], "duration_seconds", "{bad}");

    let ask = |gpus: u32| json!({"gpus": gpus, "gpu_model": "A100-40GB", "quote_id": quote_id});
    for (caller, body, why) in [
        (&other_key, ask(1), "no quote"),
        (&key, ask(2), "other GPUs"),
    ] {
        let (status, refused) = stack
            .call(Method::POST, "/v1/leases", caller, Some(body))
            .await;
        assert_eq!(status, 422, "{refused}");
        assert_eq!(refused["field"], "quote_id", "{refused}");
        assert!(
            refused["detail"].as_str().unwrap().contains(why),
            "{refused}"
        );
    }

    let lease_id = stack.lease(&key, ask(1)).await;
    let requested = stack
        .wait_log(10, |log| {
            of_type(log, "lease.requested")
                .into_iter()
                .find_map(|e| match &e.envelope.data {
                    EventData::LeaseRequested(r) if r.lease_id.to_string() == lease_id => {
                        Some(r.clone())
                    }
                    _ => None,
                })
        })
        .await;
    assert_eq!(
        requested.quote_id.map(|q| q.to_string()),
        Some(quote_id.clone())
    );
}
