//! The live run loop: follows a projection's stream from its committed
//! offset, gathers what is already waiting into one transaction, and tells
//! its service each batch once the tables reflect it.

use std::time::Duration;

use lh_bus::{Bus, FeedItem};
use sqlx::PgPool;
use tokio::sync::watch;

use crate::commit::apply_batch;
use crate::database::resume_offset;
use crate::progress::Progress;
use crate::retry::until_done;
use crate::stream::{filtered_head, Input, Item};
use crate::{Projector, Result, MAX_EVENTS_PER_TRANSACTION, MAX_WAIT_FOR_PENDING_EVENT};

/// Runs `projector` until `shutdown` resolves. `on_progress` is handed the
/// progress view before the first event is read.
pub async fn run<P: Projector>(
    bus: &Bus,
    pool: &PgPool,
    projector: &P,
    shutdown: impl std::future::Future<Output = ()>,
    on_progress: impl FnOnce(Progress),
) -> Result<()> {
    run_observed(bus, pool, projector, shutdown, on_progress, |_| async {}).await
}

/// [`run`], telling `on_committed` the subjects of a batch of messages of
/// the log (in log order) once the tables reflect them (applied by this
/// runner or by another one of the same projection), and awaiting it
/// before [`Progress::applied`] says so: a cache of what the tables hold
/// can forget or re-read what changed before anyone waiting for that
/// sequence reads again.
pub async fn run_observed<P: Projector, Committed: std::future::Future<Output = ()>>(
    bus: &Bus,
    pool: &PgPool,
    projector: &P,
    shutdown: impl std::future::Future<Output = ()>,
    on_progress: impl FnOnce(Progress),
    mut on_committed: impl FnMut(Vec<String>) -> Committed,
) -> Result<()> {
    let name = projector.name();
    let (stalled_tx, stalled_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    let start = until_done(name, "read its offset", &mut shutdown, &stalled_tx, || {
        resume_offset(pool, projector)
    })
    .await;
    let Some(start) = start else {
        return Ok(());
    };
    let (applied_tx, applied_rx) = watch::channel(start);
    let (caught_tx, caught_rx) = watch::channel(false);
    on_progress(Progress::new(applied_rx, caught_rx, stalled_rx));
    if filtered_head(bus, projector).await? <= start {
        caught_tx.send_replace(true);
    }
    let mut applied = start;
    let mut feed = Input::open(bus, projector, start + 1, false).await?;
    loop {
        let next = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            next = feed.next_item_within(Duration::from_millis(500)) => next,
        };
        let Some(event) = next else {
            // A quiet spell is not the head by itself: a slow server can
            // pause a long replay for longer than that. Ask the log.
            if !*caught_tx.borrow()
                && filtered_head(bus, projector)
                    .await
                    .is_ok_and(|head| head <= applied)
            {
                caught_tx.send_replace(true);
            }
            continue;
        };
        // Under load, apply what is already waiting in one transaction:
        // what the feed has read ahead, and what was stored when this one
        // began, not what arrives while it is gathered, which would hold
        // the first event's commit back.
        let first = event?;
        let stored_after_first = first.pending();
        let mut batch = vec![first];
        while batch.len() < MAX_EVENTS_PER_TRANSACTION {
            if let Some(event) = feed.next_item_read() {
                batch.push(event?);
                continue;
            }
            let last = batch.last().expect("a batch holds an event");
            if last.pending() == 0 || batch.len() as u64 > stored_after_first {
                break;
            }
            match feed.next_item_within(MAX_WAIT_FOR_PENDING_EVENT).await {
                Some(event) => batch.push(event?),
                None => break,
            }
        }
        let done = until_done(name, "apply events", &mut shutdown, &stalled_tx, || {
            apply_batch(pool, projector, &batch)
        })
        .await;
        if done.is_none() {
            return Ok(());
        }
        let subjects = batch
            .iter()
            .filter_map(|item| match item {
                Item::Log(FeedItem::Event(event)) => Some(event.subject.clone()),
                Item::Log(FeedItem::Skipped(skipped)) => Some(skipped.subject.clone()),
                Item::Sample(_) => None,
            })
            .collect();
        on_committed(subjects).await;
        let last = batch.last().expect("a batch holds an event");
        applied = last.sequence();
        applied_tx.send_replace(applied);
        if last.pending() == 0 {
            caught_tx.send_replace(true);
        }
    }
}
