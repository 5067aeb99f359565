//! A projection of the log's messages rather than its events, on a real
//! nats-server and a real PostgreSQL: it gets every stored message whole,
//! those it cannot decode included, and its rows are its offset, so a
//! restart resumes after its last row with no `projection_offsets` row and
//! no `skipped_events` row kept for it.

use std::time::Duration;

use futures::future::BoxFuture;
use lh_bus::{Bus, BusConfig, Expect, FeedItem, Stored};
use lh_events::{fixtures, subject};
use lh_projection::{Progress, Projector};
use sqlx::migrate::Migrator;
use sqlx::{PgConnection, PgPool};
use tokio::sync::oneshot;
use uuid::Uuid;

static NO_MIGRATIONS: Migrator = Migrator::DEFAULT;

/// Keeps one row per stored lease message: its sequence and whether it
/// decoded.
struct Copy;

impl Projector for Copy {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn filters(&self) -> &'static [&'static str] {
        &[subject::LEASES_ALL]
    }

    fn apply<'c>(
        &'c self,
        _conn: &'c mut PgConnection,
        _event: &'c Stored,
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async { unreachable!("a copy takes messages whole") })
    }

    fn apply_messages<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        messages: &'c [&'c FeedItem],
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async move {
            for message in messages {
                sqlx::query("INSERT INTO copied (sequence, decoded) VALUES ($1, $2)")
                    .bind(message.sequence() as i64)
                    .bind(matches!(message, FeedItem::Event(_)))
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        })
    }

    fn own_offset<'c>(
        &'c self,
        conn: &'c mut PgConnection,
    ) -> BoxFuture<'c, sqlx::Result<Option<u64>>> {
        Box::pin(async move {
            let last: Option<i64> = sqlx::query_scalar("SELECT max(sequence) FROM copied")
                .fetch_one(&mut *conn)
                .await?;
            Ok(Some(last.unwrap_or(0) as u64))
        })
    }
}

async fn publish_stop(bus: &Bus) -> u64 {
    bus.publish(&fixtures::stop_request(), Expect::Any)
        .await
        .unwrap()
        .sequence
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

/// Runs [`Copy`] until it has applied `head`, then stops it.
async fn copy_up_to(bus: &Bus, pool: &PgPool, head: u64) {
    let (progress_tx, progress_rx) = oneshot::channel::<Progress>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let run = {
        let (bus, pool) = (bus.clone(), pool.clone());
        tokio::spawn(async move {
            lh_projection::run(
                &bus,
                &pool,
                &Copy,
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
    assert!(progress.wait_for(head, Duration::from_secs(10)).await);
    stop_tx.send(()).unwrap();
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_copy_gets_every_message_and_resumes_after_its_last_row() {
    let (nats, database_url) = lh_testkit::nats_and_database().await;
    let bus = Bus::connect(&BusConfig::new(nats.url(), "projection-test"))
        .await
        .unwrap();
    let pool = lh_projection::connect_schema(&database_url, "copy")
        .await
        .unwrap();
    lh_projection::migrate(&pool, &NO_MIGRATIONS).await.unwrap();
    sqlx::query("CREATE TABLE copied (sequence BIGINT PRIMARY KEY, decoded BOOLEAN NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();

    publish_stop(&bus).await;
    let head = publish_undecodable(&bus).await;
    copy_up_to(&bus, &pool, head).await;
    // A second run resumes after the last row: a row copied twice would
    // break the primary key.
    publish_stop(&bus).await;
    let head = publish_undecodable(&bus).await;
    copy_up_to(&bus, &pool, head).await;

    let rows: Vec<(i64, bool)> =
        sqlx::query_as("SELECT sequence, decoded FROM copied ORDER BY sequence")
            .fetch_all(&pool)
            .await
            .unwrap();
    let undecodable = fixtures::undecodable().len();
    let one_run = [vec![true], vec![false; undecodable]].concat();
    assert_eq!(
        rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        [one_run.clone(), one_run].concat()
    );
    assert_eq!(rows.last().unwrap().0 as u64, head);
    let sequences: Vec<u64> = rows.iter().map(|r| r.0 as u64).collect();
    assert_eq!(sequences, (1..=head).collect::<Vec<_>>());

    let offsets: i64 = sqlx::query_scalar("SELECT count(*) FROM projection_offsets")
        .fetch_one(&pool)
        .await
        .unwrap();
    let skipped: i64 = sqlx::query_scalar("SELECT count(*) FROM skipped_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((offsets, skipped), (0, 0));
}
