//! A tenant's keys and standing over its life: keys issued, listed without
//! secrets and revoked (refused as soon as the DELETE returns); a tenant
//! suspended with and without its leases stopped, then resumed; a quota
//! raised for new placements. The read model rebuilds identically.

use std::time::Duration;

use lh_test_stack::{Stack, ADMIN_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_key_is_refused_once_the_delete_returns() {
    let stack = Stack::start(FLEET).await;
    let (id, first) = stack.create_tenant("keys", 4).await;
    let keys = format!("/v1/tenants/{id}/keys");

    let (status, listed) = stack.call(Method::GET, &keys, &first, None).await;
    assert_eq!(status, 200, "{listed}");
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["key_id"], 1);
    assert_eq!(items[0]["state"], "active");
    assert_eq!(items[0]["prefix"].as_str().unwrap(), &first[..11]);
    assert!(
        !listed.to_string().contains(&first[11..]),
        "a listing shows no secret"
    );

    // The tenant rotates: a second key, then the first revoked with it.
    let (status, second) = stack
        .call(Method::POST, &keys, &first, Some(json!({})))
        .await;
    assert_eq!(status, 201, "{second}");
    assert_eq!(second["key_id"], 2);
    let second_key = second["api_key"].as_str().unwrap().to_string();
    assert!(second_key.starts_with(second["prefix"].as_str().unwrap()));
    // The gateway keeps a key it has seen; the revocation must reach it.
    let (status, _) = stack.call(Method::GET, "/v1/leases", &first, None).await;
    assert_eq!(status, 200);
    let (status, revoked) = stack
        .call(Method::DELETE, &format!("{keys}/1"), &second_key, None)
        .await;
    assert_eq!(
        (status, &revoked["state"]),
        (200, &json!("revoked")),
        "{revoked}"
    );
    let (status, refused) = stack.call(Method::GET, "/v1/leases", &first, None).await;
    assert_eq!(status, 401, "{refused}");
    assert!(
        refused["detail"].as_str().unwrap().contains("revoked"),
        "{refused}"
    );
    let (status, _) = stack
        .call(Method::GET, "/v1/leases", &second_key, None)
        .await;
    assert_eq!(status, 200);
    // Revoking again changes nothing; an unknown key is a 404.
    let (status, again) = stack
        .call(Method::DELETE, &format!("{keys}/1"), ADMIN_TOKEN, None)
        .await;
    assert_eq!(
        (status, &again["revoked_at"]),
        (200, &revoked["revoked_at"])
    );
    let (status, _) = stack
        .call(Method::DELETE, &format!("{keys}/99"), ADMIN_TOKEN, None)
        .await;
    assert_eq!(status, 404);

    // A key with an expiry works until then, and is 401 after.
    let at = chrono::Utc::now() + chrono::Duration::seconds(2);
    let (status, brief) = stack
        .call(
            Method::POST,
            &keys,
            ADMIN_TOKEN,
            Some(json!({"expires_at": at})),
        )
        .await;
    assert_eq!(status, 201, "{brief}");
    let brief_key = brief["api_key"].as_str().unwrap().to_string();
    let (status, _) = stack
        .call(Method::GET, "/v1/leases", &brief_key, None)
        .await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let (status, expired) = stack
        .call(Method::GET, "/v1/leases", &brief_key, None)
        .await;
    assert_eq!(status, 401, "{expired}");
    assert!(
        expired["detail"].as_str().unwrap().contains("expired"),
        "{expired}"
    );
    // An expiry in the past is refused, naming the field.
    let (status, past) = stack
        .call(
            Method::POST,
            &keys,
            ADMIN_TOKEN,
            Some(json!({"expires_at": "2020-01-01T00:00:00Z"})),
        )
        .await;
    assert_eq!(
        (status, &past["field"]),
        (422, &json!("expires_at")),
        "{past}"
    );

    stack.assert_gateway_rebuilds_identically().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_suspended_tenant_reads_but_writes_nothing_and_its_leases_stop_only_when_asked() {
    let stack = Stack::start(FLEET).await;
    let (id, key) = stack.create_tenant("paused", 8).await;
    let one = json!({"gpus": 1, "gpu_model": "A100-40GB"});
    let kept = stack.running(&key, one.clone()).await;
    let suspend = |stop_leases: bool| {
        let stack = &stack;
        let path = format!("/v1/tenants/{id}/suspend");
        async move {
            stack
                .call(
                    Method::POST,
                    &path,
                    ADMIN_TOKEN,
                    Some(json!({"reason": "unpaid", "stop_leases": stop_leases})),
                )
                .await
        }
    };
    let resume_path = format!("/v1/tenants/{id}/resume");
    let resume = || stack.call(Method::POST, &resume_path, ADMIN_TOKEN, None);

    let (status, body) = suspend(false).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["tenant"]["suspended"], true);
    assert_eq!(body["leases_stopping"], 0);
    let (status, refused) = stack
        .call(Method::POST, "/v1/leases", &key, Some(one.clone()))
        .await;
    assert_eq!(status, 403, "{refused}");
    assert!(refused["detail"].as_str().unwrap().contains("suspended"));
    let lease_path = format!("/v1/leases/{}", kept["id"].as_str().unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, lease) = stack.call(Method::GET, &lease_path, &key, None).await;
    assert_eq!(
        (status, &lease["state"]),
        (200, &json!("running")),
        "{lease}"
    );

    let (status, _) = resume().await;
    assert_eq!(status, 202);
    let other = stack.running(&key, one.clone()).await;

    // Suspended again, this time with its leases stopped.
    let (status, body) = suspend(true).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["leases_stopping"], 2, "{body}");
    for lease in [&kept, &other] {
        stack
            .wait_lease(ADMIN_TOKEN, lease["id"].as_str().unwrap(), |l| {
                l["state"] == "ended"
            })
            .await;
    }
    let (status, _) = resume().await;
    assert_eq!(status, 202);
    stack.running(&key, one).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_raised_quota_lets_a_larger_lease_be_placed() {
    let stack = Stack::start(FLEET).await;
    let (id, key) = stack.create_tenant("grows", 1).await;
    let two = json!({"gpus": 2, "gpu_model": "A100-40GB"});
    let (status, refused) = stack
        .call(Method::POST, "/v1/leases", &key, Some(two.clone()))
        .await;
    assert_eq!(status, 422, "{refused}");

    let quota = format!("/v1/tenants/{id}/quota");
    let (status, bad) = stack
        .call(
            Method::PUT,
            &quota,
            ADMIN_TOKEN,
            Some(json!({"quota": {"max_gpus": 0}})),
        )
        .await;
    assert_eq!(
        (status, &bad["field"]),
        (422, &json!("quota.max_gpus")),
        "{bad}"
    );
    let (status, tenant) = stack
        .call(
            Method::PUT,
            &quota,
            ADMIN_TOKEN,
            Some(json!({"quota": {"max_gpus": 4}, "weight": 3})),
        )
        .await;
    assert_eq!(status, 200, "{tenant}");
    assert_eq!(
        (&tenant["max_gpus"], &tenant["weight"]),
        (&json!(4), &json!(3))
    );
    let (status, seen): (u16, Value) = stack
        .call(Method::GET, &format!("/v1/tenants/{id}"), &key, None)
        .await;
    assert_eq!((status, &seen["max_gpus"]), (200, &json!(4)));
    stack.running(&key, two).await;
}
