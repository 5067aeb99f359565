//! The projection loop against a real nats-server and a real PostgreSQL:
//! two runners never apply one event twice, and a database that goes away
//! stalls the loop (it retries) instead of ending it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use lh_bus::{Bus, BusConfig, Expect, Stored};
use lh_events::{subject, Actor, Envelope, EventData, NodeCordoned};
use lh_projection::{Progress, Projector};
use lh_testkit::{Nats, Postgres};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("tests/migrations");

/// Records every application, slowly enough that two runners overlap.
struct Recorder {
    delay: Duration,
    applications: Arc<AtomicU64>,
}

impl Projector for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn filters(&self) -> &'static [&'static str] {
        &[subject::NODES_ALL]
    }

    fn apply<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        event: &'c Stored,
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            sqlx::query("INSERT INTO applied (sequence) VALUES ($1)")
                .bind(event.sequence as i64)
                .execute(conn)
                .await?;
            self.applications.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }
}

async fn publish_cordons(bus: &Bus, n: usize) {
    for i in 0..n {
        let e = Envelope::new(
            Actor::Admin,
            chrono::Utc::now(),
            EventData::NodeCordoned(NodeCordoned {
                node_id: "n1".into(),
                drain: None,
                reason: format!("cordon {i}"),
            }),
        );
        bus.publish(&e, Expect::Any).await.unwrap();
    }
}

/// Starts `run` of `projector` in a task; returns its progress view.
async fn spawn_run(
    bus: &Bus,
    pool: &PgPool,
    projector: Recorder,
    stop: &CancellationToken,
) -> (Progress, tokio::task::JoinHandle<lh_projection::Result<()>>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (bus, pool, stop) = (bus.clone(), pool.clone(), stop.clone());
    let task = tokio::spawn(async move {
        lh_projection::run(&bus, &pool, &projector, stop.cancelled_owned(), move |p| {
            let _ = tx.send(p);
        })
        .await
    });
    (rx.await.expect("the run starts"), task)
}

async fn rows(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as("SELECT count(*), count(DISTINCT sequence) FROM applied")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn two_runners_starting_together_apply_each_event_once() {
    let nats = Nats::start().await.unwrap();
    let pg = lh_testkit::shared_postgres().await;
    let url = pg.create_database().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    publish_cordons(&bus, 12).await;
    let pool = lh_projection::connect_schema(&url, "twice").await.unwrap();
    lh_projection::migrate(&pool, &MIGRATOR).await.unwrap();
    let stop = CancellationToken::new();
    let applications = Arc::new(AtomicU64::new(0));
    let recorder = || Recorder {
        delay: Duration::from_millis(30),
        applications: applications.clone(),
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
    let pool = lh_projection::connect_schema(&url, "outage").await.unwrap();
    lh_projection::migrate(&pool, &MIGRATOR).await.unwrap();
    let stop = CancellationToken::new();
    let recorder = Recorder {
        delay: Duration::ZERO,
        applications: Arc::default(),
    };
    let (mut progress, task) = spawn_run(&bus, &pool, recorder, &stop).await;
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
