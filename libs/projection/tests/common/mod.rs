//! What the projection loop's tests share: a projector that records each
//! application as a row, the events it reads, and the servers it runs on.

#![allow(dead_code)]

use std::time::Duration;

use futures::future::BoxFuture;
use lh_bus::{Bus, BusConfig, Stored};
use lh_events::{subject, Actor, Envelope, EventData, NodeCordoned};
use lh_projection::{Progress, Projector};
use lh_testkit::Nats;
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("tests/migrations");

/// One row in `applied` per application of an event (the table has no
/// key). Each call takes `delay_per_call` and each event `delay_per_event`
/// more; the events from `fails_from` on fail to apply, as with a database
/// gone away.
pub struct Recorder {
    pub delay_per_call: Duration,
    pub delay_per_event: Duration,
    pub fails_from: u64,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            delay_per_call: Duration::ZERO,
            delay_per_event: Duration::ZERO,
            fails_from: u64::MAX,
        }
    }

    async fn record(&self, conn: &mut PgConnection, event: &Stored) -> sqlx::Result<()> {
        if !self.delay_per_event.is_zero() {
            tokio::time::sleep(self.delay_per_event).await;
        }
        if event.sequence >= self.fails_from {
            return Err(sqlx::Error::Protocol("the database went away".into()));
        }
        sqlx::query("INSERT INTO applied (sequence) VALUES ($1)")
            .bind(event.sequence as i64)
            .execute(conn)
            .await?;
        Ok(())
    }
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
        self.apply_batch_owned(conn, vec![event])
    }

    fn apply_batch<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        events: &'c [&'c Stored],
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        self.apply_batch_owned(conn, events.to_vec())
    }
}

impl Recorder {
    fn apply_batch_owned<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        events: Vec<&'c Stored>,
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async move {
            if !self.delay_per_call.is_zero() {
                tokio::time::sleep(self.delay_per_call).await;
            }
            for event in events {
                self.record(&mut *conn, event).await?;
            }
            Ok(())
        })
    }
}

/// The `i`-th event the recorder reads.
pub fn cordon(i: usize) -> Envelope {
    Envelope::new(
        Actor::Admin,
        chrono::Utc::now(),
        EventData::NodeCordoned(NodeCordoned {
            node_id: "n1".into(),
            drain: None,
            reason: format!("cordon {i}"),
        }),
    )
}

/// Reads every lease event and keeps nothing: the runner's own tables
/// (skipped events, lease holds) are what a test looks at.
pub struct Nothing;

impl Projector for Nothing {
    fn name(&self) -> &'static str {
        "nothing"
    }

    fn filters(&self) -> &'static [&'static str] {
        &[subject::LEASES_ALL]
    }

    fn apply<'c>(
        &'c self,
        _conn: &'c mut PgConnection,
        _event: &'c Stored,
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// A private nats-server, a bus on it and a fresh database on the shared
/// cluster.
pub async fn log_and_database() -> (Nats, Bus, String) {
    let (nats, url) = lh_testkit::nats_and_database().await;
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    (nats, bus, url)
}

/// A pool on schema `name` of `url`, migrated.
pub async fn schema(url: &str, name: &str) -> PgPool {
    let pool = lh_projection::connect_schema(url, name).await.unwrap();
    lh_projection::migrate(&pool, &MIGRATOR).await.unwrap();
    pool
}

/// Starts `run` of `projector` in a task; returns its progress view.
pub async fn spawn_run<P: Projector + Send + Sync + 'static>(
    bus: &Bus,
    pool: &PgPool,
    projector: P,
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
