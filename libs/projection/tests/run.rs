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

/// Records the time of each GPU health change it reads.
struct HealthTimes;

impl lh_projection::Projector for HealthTimes {
    fn name(&self) -> &'static str {
        "health_times"
    }

    fn filters(&self) -> &'static [&'static str] {
        &[lh_events::subject::NODES_ALL]
    }

    fn apply<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        event: &'c lh_bus::Stored,
    ) -> futures::future::BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async move {
            if let lh_events::EventData::NodeGpuHealthChanged(e) = &event.envelope.data {
                sqlx::query(
                    "INSERT INTO health_times (sequence, at, stored_at) VALUES ($1, $2, $3)",
                )
                .bind(event.sequence as i64)
                .bind(e.at)
                .bind(event.stored_at)
                .execute(conn)
                .await?;
            }
            Ok(())
        })
    }
}

#[tokio::test]
async fn a_node_s_times_reach_a_projection_held_to_when_the_log_stored_them() {
    use chrono::{Duration as Span, Utc};
    use lh_events::{Actor, Envelope, EventData, GpuHealth, HealthEvidence, NodeGpuHealthChanged};
    let (_nats, bus, url) = log_and_database().await;
    let pool = schema(&url, "node_times").await;
    sqlx::query(
        "CREATE TABLE health_times (sequence BIGINT, at TIMESTAMPTZ, stored_at TIMESTAMPTZ)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let claims = [Span::days(400), Span::zero(), -Span::days(400)];
    for claim in claims {
        let at = Utc::now() + claim;
        let change = NodeGpuHealthChanged {
            node_id: "n1".into(),
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            from: GpuHealth::Healthy,
            to: GpuHealth::Degraded,
            reason: "hot".into(),
            evidence: HealthEvidence::default(),
            at,
        };
        let envelope = Envelope::new(
            Actor::Node("n1".into()),
            at,
            EventData::NodeGpuHealthChanged(change),
        );
        bus.publish(&envelope, Expect::Any).await.unwrap();
    }
    let stop = CancellationToken::new();
    let (progress, _task) = spawn_run(&bus, &pool, HealthTimes, &stop).await;
    assert!(progress.wait_for(3, Duration::from_secs(20)).await);
    let rows: Vec<(i64, chrono::DateTime<Utc>, chrono::DateTime<Utc>)> =
        sqlx::query_as("SELECT sequence, at, stored_at FROM health_times ORDER BY sequence")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 3);
    let skew = Span::seconds(lh_events::node_time::DEFAULT_NODE_CLOCK_SKEW_SECS);
    for (sequence, at, stored_at) in &rows {
        assert!(
            *at <= *stored_at && *at >= *stored_at - skew,
            "event {sequence}: {at} is not held to {stored_at}"
        );
    }
    // A truthful clock is left as it said (the log stores within the skew).
    assert!(rows[1].1 > rows[1].2 - Span::seconds(5));
    stop.cancel();
}
