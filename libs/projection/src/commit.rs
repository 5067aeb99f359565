//! One transaction of a projection: its events applied in runs, the
//! messages it steps over recorded, and its offset moved (unless its own
//! rows are the offset), all committed together so a crash neither loses
//! nor doubles a row. The live loop and
//! a replay both commit through here.

use std::borrow::Cow;

use lh_bus::{FeedItem, Sample, Skipped, Stored};
use sqlx::{PgConnection, PgPool};
use tracing::Instrument;

use crate::stream::Item;
use crate::{Projector, Result};

/// Applies events (in stream order), records the skipped ones, and stores
/// the last one's sequence, in one transaction; events at or below the
/// committed sequence are left alone.
pub(crate) async fn apply_batch<P: Projector>(
    pool: &PgPool,
    projector: &P,
    events: &[Item],
) -> Result<()> {
    let Some(last) = events.last() else {
        return Ok(());
    };
    let mut tx = pool.begin().await?;
    let own_offset = projector.own_offset(&mut tx).await?;
    let committed = match own_offset {
        Some(sequence) => sequence,
        None => {
            let committed: Option<i64> = sqlx::query_scalar(
                "SELECT sequence FROM projection_offsets WHERE name = $1 FOR UPDATE",
            )
            .bind(projector.name())
            .fetch_optional(&mut *tx)
            .await?;
            committed.unwrap_or(0) as u64
        }
    };
    // A second runner of the same projection (or a replay) already did them.
    if committed >= last.sequence() {
        return Ok(());
    }
    let mut messages: Vec<&FeedItem> = Vec::new();
    // A projection reads one stream: samples never come between events.
    let mut samples: Vec<&Sample> = Vec::new();
    for item in events.iter().filter(|e| e.sequence() > committed) {
        match item {
            Item::Log(message) => messages.push(message),
            Item::Sample(sample) => samples.push(sample),
        }
    }
    if !messages.is_empty() {
        projector.apply_messages(&mut tx, &messages).await?;
    }
    match samples.as_slice() {
        [] => {}
        [sample] => projector.apply_sample(&mut tx, sample).await?,
        _ => projector.apply_samples(&mut tx, &samples).await?,
    }
    if own_offset.is_none() {
        sqlx::query(
            "INSERT INTO projection_offsets (name, sequence) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET sequence = EXCLUDED.sequence",
        )
        .bind(projector.name())
        .bind(last.sequence() as i64)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// What [`Projector::apply_messages`] does unless a projection says
/// otherwise: runs of events applied, each skipped message recorded.
pub(crate) async fn apply_events_recording_skips<P: Projector + ?Sized>(
    projector: &P,
    conn: &mut PgConnection,
    messages: &[&FeedItem],
) -> sqlx::Result<()> {
    let skew = chrono::Duration::seconds(projector.node_clock_skew_secs());
    // Where a node's times were off, the event as held; `None` elsewhere
    // (boxed: a backlog's transaction holds thousands of mostly `None`s).
    let held: Vec<Option<Box<Stored>>> = messages
        .iter()
        .map(|message| match message {
            FeedItem::Event(event) => held_to_the_log(event, skew),
            FeedItem::Skipped(_) => None,
        })
        .collect();
    let mut run: Vec<&Stored> = Vec::new();
    for (message, held) in messages.iter().zip(&held) {
        match message {
            FeedItem::Event(event) => run.push(held.as_deref().unwrap_or(event)),
            FeedItem::Skipped(skipped) => {
                apply_run(conn, projector, &mut run).await?;
                record_skip(conn, projector.name(), skipped).await?
            }
        }
    }
    apply_run(conn, projector, &mut run).await
}

/// The event with the times its node reported held to when the log stored
/// it, where they were off (`lh_events::node_time`): a projection shows the
/// times the bills count, and a node's clock, wrong or lying, moves neither
/// by more than the skew.
fn held_to_the_log(event: &Stored, skew: chrono::Duration) -> Option<Box<Stored>> {
    match event.envelope.held_to_the_log(event.stored_at, skew) {
        Cow::Borrowed(_) => None,
        Cow::Owned(envelope) => Some(Box::new(Stored {
            envelope,
            ..event.clone()
        })),
    }
}

/// Applies a run of consecutive events and empties it.
async fn apply_run<P: Projector + ?Sized>(
    conn: &mut PgConnection,
    projector: &P,
    run: &mut Vec<&Stored>,
) -> sqlx::Result<()> {
    match run.as_slice() {
        [] => {}
        [event] => {
            let span = project_span(projector, event);
            projector.apply(conn, event).instrument(span).await?
        }
        [first, .., last] => {
            let span = tracing::info_span!(
                "lh.project_batch",
                projection = projector.name(),
                events = run.len(),
                first_sequence = first.sequence,
                last_sequence = last.sequence,
            );
            // A few events (a runner that fell a little behind) still read
            // each in its own request's trace, spanning the statements
            // that applied them; a backlog is many requests' events, no
            // one trace to join.
            let _each: Vec<tracing::Span> = if run.len() <= MAX_EVENTS_TRACED_EACH {
                run.iter()
                    .map(|event| project_span(projector, event))
                    .collect()
            } else {
                Vec::new()
            };
            projector.apply_batch(conn, run).instrument(span).await?
        }
    }
    run.clear();
    Ok(())
}

/// Most events of one run that each get a span in their own trace.
const MAX_EVENTS_TRACED_EACH: usize = 16;

/// The span of applying `event`, in the trace of the request that wrote
/// it: one request reads as one trace, its read models included.
fn project_span<P: Projector + ?Sized>(projector: &P, event: &Stored) -> tracing::Span {
    let span = tracing::info_span!(
        "lh.project",
        projection = projector.name(),
        event = event.envelope.event_type.as_str(),
        sequence = event.sequence,
    );
    lh_bus::continue_trace(&span, event.trace_parent.as_deref());
    span
}

async fn record_skip(
    conn: &mut PgConnection,
    projection: &str,
    skipped: &Skipped,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO skipped_events (projection, sequence, subject, reason, stored_at)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
    )
    .bind(projection)
    .bind(skipped.sequence as i64)
    .bind(&skipped.subject)
    .bind(skipped.reason().as_str())
    .bind(skipped.stored_at)
    .execute(conn)
    .await?;
    Ok(())
}
