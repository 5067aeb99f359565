//! The projection loop against a real nats-server and a real PostgreSQL:
//! two runners never apply one event twice, and a database that goes away
//! stalls the loop (it retries) instead of ending it.

mod common;

use std::time::Duration;

use common::{cordon, log_and_database, schema, spawn_run, Recorder};
use lh_bus::{Bus, BusConfig, Expect};
use lh_testkit::{Nats, Postgres};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

async fn publish_cordons(bus: &Bus, n: usize) {
    for i in 0..n {
        bus.publish(&cordon(i), Expect::Any).await.unwrap();
    }
}

async fn rows(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as("SELECT count(*), count(DISTINCT sequence) FROM applied")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn two_runners_starting_together_apply_each_event_once() {
    let (_nats, bus, url) = log_and_database().await;
    publish_cordons(&bus, 12).await;
    let pool = schema(&url, "twice").await;
    let stop = CancellationToken::new();
    let recorder = || Recorder {
        delay_per_event: Duration::from_millis(30),
        ..Recorder::new()
    };
    let ((a, _), (b, _)) = tokio::join!(
        spawn_run(&bus, &pool, recorder(), &stop),
        spawn_run(&bus, &pool, recorder(), &stop)
    );
    assert!(a.wait_for(12, Duration::from_secs(20)).await);
    assert!(b.wait_for(12, Duration::from_secs(20)).await);
    assert_eq!(rows(&pool).await, (12, 12), "each event applied once");
    stop.cancel();
}

#[tokio::test]
async fn a_database_outage_stalls_the_projection_until_it_is_back() {
    let nats = Nats::start().await.unwrap();
    let mut pg = Postgres::start().await.unwrap();
    let url = pg.create_database().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    let pool = schema(&url, "outage").await;
    let stop = CancellationToken::new();
    let (mut progress, task) = spawn_run(&bus, &pool, Recorder::new(), &stop).await;
    publish_cordons(&bus, 3).await;
    assert!(progress.wait_for(3, Duration::from_secs(10)).await);

    pg.kill();
    publish_cordons(&bus, 2).await;
    tokio::time::timeout(Duration::from_secs(20), async {
        while !progress.stalled() {
            progress.stalled_changed().await;
        }
    })
    .await
    .expect("the projection says it is stalled");
    assert!(!task.is_finished(), "an outage never ends the projection");

    pg.restart().await.unwrap();
    assert!(
        progress.wait_for(5, Duration::from_secs(30)).await,
        "caught up once the database is back"
    );
    assert!(!progress.stalled());
    assert_eq!(rows(&pool).await, (5, 5));
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_service_starting_before_its_database_waits_for_it() {
    let mut pg = Postgres::start().await.unwrap();
    let url = pg.create_database().await.unwrap();
    pg.kill();
    let connecting = tokio::spawn(async move { lh_projection::connect_schema(&url, "late").await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!connecting.is_finished(), "it waits instead of failing");
    pg.restart().await.unwrap();
    let pool = tokio::time::timeout(Duration::from_secs(30), connecting)
        .await
        .expect("connected once the database answers")
        .unwrap()
        .unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(one, 1);
}
