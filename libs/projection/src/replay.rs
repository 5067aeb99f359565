//! Replaying a stream into a schema up to the head it had when the replay
//! began: a reader task fills transactions ahead of the writer so that
//! reading and writing overlap.

use std::time::Duration;

use lh_bus::Bus;
use sqlx::PgPool;

use crate::commit::apply_batch;
use crate::database::resume_offset;
use crate::stream::{filtered_head, head, Input, Item};
use crate::{
    ProjectionError, Projector, Result, MAX_EVENTS_PER_TRANSACTION,
    MAX_REPLAY_TRANSACTIONS_READ_AHEAD,
};

/// Applies what the stream of `projector` holds (up to its head at call
/// time) to the schema of `pool` as it stands, dropping nothing: how a
/// rebuild fills a fresh schema, how one that was stopped part way goes on
/// (from the sequence it committed), and how a projection that outlives its
/// stream (telemetry) is brought into one whose older rows were carried
/// over. Its projector must then tell a sample the rows already count.
///
/// The feed is read into transactions by a task of its own, up to
/// [`MAX_REPLAY_TRANSACTIONS_READ_AHEAD`] ahead of the one being written;
/// each transaction still commits its rows with its last sequence.
///
/// Returns the sequence the schema reflects; `on_event` is told each one
/// applied.
pub async fn replay<P: Projector>(
    bus: &Bus,
    pool: &PgPool,
    projector: &P,
    mut on_event: impl FnMut(u64, u64),
) -> Result<u64> {
    let committed = resume_offset(pool, projector).await?;
    let head = head(bus, projector).await?;
    if head <= committed {
        return Ok(committed);
    }
    // The last message the projection's filters match, at or before the
    // head: a quiet feed before it is a slow server, not the end.
    let target = filtered_head(bus, projector).await?.min(head);
    if target <= committed {
        return Ok(committed);
    }
    let feed = Input::open(bus, projector, committed + 1, true).await?;
    let (batches_tx, mut batches) = tokio::sync::mpsc::channel(MAX_REPLAY_TRANSACTIONS_READ_AHEAD);
    let _reader = AbortOnDrop(tokio::spawn(read_transactions(
        feed,
        ReadUntil {
            committed,
            head,
            target,
        },
        batches_tx,
    )));
    let mut reached = committed;
    while let Some(batch) = batches.recv().await {
        let batch = batch?;
        apply_batch(pool, projector, &batch).await?;
        for item in &batch {
            reached = item.sequence();
            on_event(reached, head);
        }
    }
    Ok(reached)
}

/// Quiet spells of [`REPLAY_QUIET_SPELL`] in a row a replay waits through
/// before its last matching message, before it gives up on the feed.
const MAX_REPLAY_QUIET_SPELLS: u32 = 30;
const REPLAY_QUIET_SPELL: Duration = Duration::from_secs(2);

/// Where a replay's reading stops.
struct ReadUntil {
    /// Already in the schema: the feed starts after it.
    committed: u64,
    /// The stream's head when the replay began: nothing after it is read.
    head: u64,
    /// The last message at or before `head` the filters match.
    target: u64,
}

/// Reads `feed` into transactions of at most [`MAX_EVENTS_PER_TRANSACTION`]
/// items and sends each (or the error that ends the reading) to `batches`,
/// until the replay's last message; ends early when the replay is gone.
async fn read_transactions(
    mut feed: Input,
    until: ReadUntil,
    batches: tokio::sync::mpsc::Sender<Result<Vec<Item>>>,
) {
    let mut batch = Vec::with_capacity(MAX_EVENTS_PER_TRANSACTION);
    let mut last_read = until.committed;
    let mut quiet_spells = 0;
    loop {
        let Some(item) = feed.next_item_within(REPLAY_QUIET_SPELL).await else {
            if last_read >= until.target {
                break;
            }
            quiet_spells += 1;
            if quiet_spells >= MAX_REPLAY_QUIET_SPELLS {
                let _ = batches.send(Err(ProjectionError::FeedClosed)).await;
                return;
            }
            continue;
        };
        quiet_spells = 0;
        let item = match item {
            Ok(item) => item,
            Err(e) => {
                let _ = batches.send(Err(e)).await;
                return;
            }
        };
        if item.sequence() > until.head {
            break;
        }
        last_read = item.sequence();
        let last = item.pending() == 0 || item.sequence() >= until.target;
        batch.push(item);
        if batch.len() == MAX_EVENTS_PER_TRANSACTION || last {
            let full =
                std::mem::replace(&mut batch, Vec::with_capacity(MAX_EVENTS_PER_TRANSACTION));
            if batches.send(Ok(full)).await.is_err() {
                return;
            }
        }
        if last {
            break;
        }
    }
    // A feed that went quiet before its last message leaves a batch.
    if !batch.is_empty() {
        let _ = batches.send(Ok(batch)).await;
    }
}

/// A task that ends with its owner: a replay dropped part way (its caller
/// gave up) leaves no reader behind.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
