//! The gateway answers lease reads from memory (`lease_views`): what it
//! answers is what the read model holds once a write has been read back,
//! through a tenant's suspension and erasure, and every page of a list,
//! inside the kept index of newest leases and past it, is the database's
//! answer.

use lh_bus::Expect;
use lh_events::{fixtures, subject, Actor, Envelope, EventData};
use lh_gateway::lease_views::MAX_LISTED_LEASES_PER_INDEX;
use lh_test_stack::{Stack, ADMIN_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_after_a_write_shows_the_write_through_suspension_and_erasure() {
    let stack = Stack::start(FLEET).await;
    let (tenant, key) = stack.create_tenant("views", 4).await;
    let lease = stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    let id = lease["id"].as_str().unwrap().to_string();
    let path = format!("/v1/leases/{id}");

    // Read twice so the second answer comes from memory, list it too.
    for _ in 0..2 {
        let (status, kept) = stack.call(Method::GET, &path, &key, None).await;
        assert_eq!(status, 200, "{kept}");
        assert_eq!(kept["stop_requested"], false, "{kept}");
    }
    let (status, page) = stack.call(Method::GET, "/v1/leases", &key, None).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["items"][0]["stop_requested"], false, "{page}");

    // The stop's own answer and the reads right after it show the stop.
    let (status, stopping) = stack
        .call(Method::POST, &format!("{path}/stop"), &key, None)
        .await;
    assert_eq!(status, 202, "{stopping}");
    assert_eq!(stopping["stop_requested"], true, "{stopping}");
    // (The node may end it in between: a later state, never an earlier.)
    let (_, read) = stack.call(Method::GET, &path, &key, None).await;
    assert_eq!(read["stop_requested"], true, "a GET right after: {read}");
    let (_, page) = stack.call(Method::GET, "/v1/leases", &key, None).await;
    let listed = &page["items"][0];
    assert_eq!(
        (&listed["id"], &listed["stop_requested"]),
        (&json!(id), &json!(true)),
        "the list right after the stop: {page}"
    );

    // The node's events, not the gateway's, end it; reads follow them.
    let ended = stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    let (_, page) = stack.call(Method::GET, "/v1/leases", &key, None).await;
    assert_eq!(page["items"][0], ended);
    let (_, all) = stack
        .call(Method::GET, "/v1/leases", ADMIN_TOKEN, None)
        .await;
    assert!(all["items"].as_array().unwrap().contains(&ended), "{all}");

    // Suspended, then erased, the tenant still reads its leases as they
    // are (an erased tenant's key reads, as before), and writes nothing.
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant}/suspend"),
            ADMIN_TOKEN,
            Some(json!({"reason": "closing"})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let (status, read) = stack.call(Method::GET, &path, &key, None).await;
    assert_eq!((status, &read), (200, &ended));
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant}/erase"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, refused) = stack
        .call(Method::POST, &format!("{path}/resume"), &key, None)
        .await;
    assert_eq!(status, 403, "{refused}");
    let (status, page) = stack.call(Method::GET, "/v1/leases", &key, None).await;
    assert_eq!((status, &page["items"][0]), (200, &ended), "{page}");
    let (status, read) = stack.call(Method::GET, &path, ADMIN_TOKEN, None).await;
    assert_eq!((status, &read), (200, &ended), "an operator reads it too");
}

/// Every lease id of `tenant` (all with `None`), newest first, as the read
/// model's table holds them.
async fn database_order(stack: &Stack, tenant: Option<Uuid>) -> Vec<String> {
    let pool = sqlx::PgPool::connect(&stack.database_url_for("gateway"))
        .await
        .unwrap();
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM gateway.leases WHERE ($1::uuid IS NULL OR tenant_id = $1)
         ORDER BY requested_sequence DESC",
    )
    .bind(tenant)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    ids.iter().map(Uuid::to_string).collect()
}

/// Every page of `GET /v1/leases` with `key`, `limit` a page: the ids in
/// order, and each page's length.
async fn listed(stack: &Stack, key: &str, limit: usize) -> (Vec<String>, Vec<usize>) {
    let (mut ids, mut pages) = (Vec::new(), Vec::new());
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => format!("/v1/leases?limit={limit}"),
            Some(c) => format!("/v1/leases?limit={limit}&cursor={c}"),
        };
        let (status, page) = stack.call(Method::GET, &path, key, None).await;
        assert_eq!(status, 200, "{page}");
        let items = page["items"].as_array().unwrap();
        pages.push(items.len());
        ids.extend(items.iter().map(|l| l["id"].as_str().unwrap().to_string()));
        match &page["next_cursor"] {
            Value::Null => return (ids, pages),
            Value::String(c) => cursor = Some(c.clone()),
            other => panic!("a cursor {other}"),
        }
    }
}

/// Appends a request for one lease of `tenant` straight onto the log.
async fn request_on_log(bus: &lh_bus::Bus, tenant: Uuid) -> Uuid {
    let lease = Uuid::now_v7();
    let request = fixtures::whole_request(lease, tenant, 1, fixtures::MODEL);
    let envelope = Envelope::new(
        Actor::Tenant(tenant),
        chrono::Utc::now(),
        EventData::LeaseRequested(request),
    );
    bus.publish(&envelope, Expect::LastSubjectSequence(0))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", subject::lease(lease)));
    lease
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_page_is_the_databases_inside_the_kept_index_and_past_it() {
    // Only the gateway: the requests stay requested, nothing else moves.
    let mut stack = Stack::bare(FLEET).await;
    stack.start_service("gateway").await;
    stack.wait_ready().await;
    let (tenant, key) = stack.create_tenant("many", 4).await;
    let (_, other_key) = stack.create_tenant("few", 4).await;
    let tenant: Uuid = tenant.parse().unwrap();
    let bus = stack.bus().await;
    let beyond = MAX_LISTED_LEASES_PER_INDEX + 60;
    let mut last = Uuid::nil();
    for _ in 0..beyond {
        last = request_on_log(&bus, tenant).await;
    }
    stack
        .wait_lease(&key, &last.to_string(), |l| l["state"] == "requested")
        .await;
    let other_lease = stack
        .lease(&other_key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;

    let expected = database_order(&stack, Some(tenant)).await;
    assert_eq!(expected.len(), beyond);
    // The first page fills the index; the pages after it cross its end.
    let (ids, pages) = listed(&stack, &key, 500).await;
    assert_eq!(pages, [500, 500, 60]);
    assert_eq!(ids, expected, "pages of 500");
    let (ids, pages) = listed(&stack, &key, 7).await;
    assert_eq!(pages.len(), beyond.div_ceil(7));
    assert_eq!(ids, expected, "pages of 7");

    // A lease requested after the index was filled heads the next list.
    let newest = request_on_log(&bus, tenant).await;
    stack
        .wait_lease(&key, &newest.to_string(), |l| l["state"] == "requested")
        .await;
    let expected = database_order(&stack, Some(tenant)).await;
    assert_eq!(expected[0], newest.to_string());
    let (ids, _) = listed(&stack, &key, 500).await;
    assert_eq!(ids, expected, "after one more");

    // The other tenant sees only its own; an operator sees every lease.
    let (ids, _) = listed(&stack, &other_key, 50).await;
    assert_eq!(ids, [other_lease]);
    let (ids, _) = listed(&stack, ADMIN_TOKEN, 300).await;
    assert_eq!(ids, database_order(&stack, None).await, "an operator's");
    let (ids, _) = listed(&stack, ADMIN_TOKEN, 300).await;
    assert_eq!(ids, database_order(&stack, None).await, "from memory");

    // The cursor is the request sequence, as it was.
    let (_, page) = stack
        .call(Method::GET, "/v1/leases?limit=1", &key, None)
        .await;
    let cursor: i64 = page["next_cursor"].as_str().unwrap().parse().unwrap();
    assert!(cursor > 0, "{page}");
}
