//! A projection over messages it cannot decode, on a real nats-server and a
//! real PostgreSQL: it steps over them without failing, counts them as
//! applied, records each in `skipped_events`, and a rebuild records the
//! very same rows.

mod common;

use std::time::Duration;

use common::Nothing;
use lh_bus::{Bus, BusConfig, Expect};
use lh_events::{fixtures, subject};
use lh_projection::Progress;
use sqlx::migrate::Migrator;
use tokio::sync::oneshot;
use uuid::Uuid;

static NO_MIGRATIONS: Migrator = Migrator::DEFAULT;

async fn publish_stop(bus: &Bus) -> u64 {
    let envelope = fixtures::stop_request();
    bus.publish(&envelope, Expect::Any).await.unwrap().sequence
}

async fn publish_undecodable(bus: &Bus) -> u64 {
    let mut last = 0;
    for (_, bytes) in fixtures::undecodable() {
        last = bus
            .jetstream()
            .publish(subject::lease(Uuid::now_v7()), bytes.into())
            .await
            .unwrap()
            .await
            .unwrap()
            .sequence;
    }
    last
}

#[tokio::test]
async fn skipped_messages_are_recorded_and_a_rebuild_records_the_same() {
    let (nats, database_url) = lh_testkit::nats_and_database().await;
    let bus = Bus::connect(&BusConfig::new(nats.url(), "projection-test"))
        .await
        .unwrap();
    publish_stop(&bus).await;
    publish_undecodable(&bus).await;
    publish_stop(&bus).await;
    // The newest message is one more the projection cannot use.
    let head = publish_undecodable(&bus).await;

    let pool = lh_projection::connect_schema(&database_url, "live")
        .await
        .unwrap();
    lh_projection::migrate(&pool, &NO_MIGRATIONS).await.unwrap();
    let (progress_tx, progress_rx) = oneshot::channel::<Progress>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let run = {
        let (bus, pool) = (bus.clone(), pool.clone());
        tokio::spawn(async move {
            lh_projection::run(
                &bus,
                &pool,
                &Nothing,
                async {
                    let _ = stop_rx.await;
                },
                |progress| {
                    let _ = progress_tx.send(progress);
                },
            )
            .await
        })
    };
    let progress = progress_rx.await.unwrap();
    assert!(
        progress.wait_for(head, Duration::from_secs(10)).await,
        "a skipped message counts as applied"
    );
    assert!(progress.wait_caught_up(Duration::from_secs(5)).await);
    assert_eq!(
        lh_projection::committed_sequence(&pool, "nothing")
            .await
            .unwrap(),
        head
    );
    let reasons: Vec<String> =
        sqlx::query_scalar("SELECT reason FROM skipped_events ORDER BY sequence")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected: Vec<String> = fixtures::undecodable()
        .iter()
        .map(|(reason, _)| reason.as_str().to_string())
        .collect();
    assert_eq!(reasons, [expected.clone(), expected].concat());

    let report = lh_projection::rebuild_and_compare(
        &bus,
        &database_url,
        "live",
        "rebuilt",
        &NO_MIGRATIONS,
        &Nothing,
        &[],
        false,
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(report.reached, head);
    assert_eq!(report.tables.len(), 1);
    assert_eq!(report.tables[0].table, lh_projection::SKIPPED_TABLE);
    assert_eq!(report.tables[0].live.0, 8);
    assert!(report.identical(), "{:?}", report.tables);

    assert!(!run.is_finished(), "the loop never stopped");
    stop_tx.send(()).unwrap();
    run.await.unwrap().unwrap();
}
