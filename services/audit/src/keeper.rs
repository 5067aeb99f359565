//! The chain keeper: follows the whole business log in stream order, extends
//! the hash chain over each stored message's raw bytes and writes every event,
//! with its link, into the append-only `events` table.
//!
//! A message that does not decode (junk, an unknown type, a newer version)
//! is chained and copied like any other: the chain is over raw bytes, and
//! leaving one out would make the log and the copy disagree. Its row keeps
//! whatever of the envelope could be read and says why it was skipped.
//!
//! Rows are written in small batches, each one transaction; the table itself
//! is the keeper's offset (its last row is where the chain resumes), so a
//! crash between two batches neither loses nor doubles a row. One keeper per
//! schema: a Postgres advisory lock makes a second replica wait as a standby.
//!
//! Every N events or T seconds, whichever comes first and only when events
//! other than its own checkpoints arrived, the keeper signs the chain head and
//! publishes `audit.checkpoint`, which is then chained like any other event.
//!
//! Every prune interval, once the log's oldest events have expired, the
//! keeper publishes `audit.pruned` naming the anchor checkpoint (the newest
//! one covering the log's first sequence minus one). The rows below the
//! anchor are deleted when that event is chained, in the transaction that
//! copies it: the deletion always follows the event, a crash in between
//! only leaves the event to be applied on resume, and only the keeper
//! holding the lock prunes (a standby neither decides nor deletes).

use std::time::{Duration, Instant};

use chrono::Utc;
use ed25519_dalek::SigningKey;
use lh_bus::{Bus, Expect, FeedItem};
use lh_domain::chain::{Chain, Hash};
use lh_events::{
    derived_id, subject, trail, Actor, AuditCheckpoint, AuditPruned, Envelope, EventData,
};
use lh_service::Readiness;
use sqlx::{PgConnection, PgPool, QueryBuilder};

use crate::anchor::{self, log_first_sequence};
use crate::signing::sign_checkpoint;
use crate::SERVICE;

/// Most events written in one transaction.
pub const MAX_BATCH_EVENTS: usize = 256;
/// Event type of checkpoints, as `events.event_type` stores it.
const CHECKPOINT_TYPE: &str = "audit.checkpoint";
/// How long the feed may stay quiet before a partial batch is written (and
/// the keeper asks the log whether it has read the head).
const QUIET: Duration = Duration::from_millis(300);
/// First wait before a failed checkpoint is tried again; it doubles on each
/// further failure up to the max.
const CHECKPOINT_RETRY_MIN_WAIT: Duration = Duration::from_millis(200);
const CHECKPOINT_RETRY_MAX_WAIT: Duration = Duration::from_secs(5);

/// When checkpoints are due.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointPolicy {
    pub every_events: u64,
    pub every: Duration,
}

pub struct Keeper {
    pub bus: Bus,
    pub pool: PgPool,
    pub key: SigningKey,
    pub policy: CheckpointPolicy,
    /// How often to look whether the audit copy can be pruned.
    pub prune_every: Duration,
    pub ready: Readiness,
}

/// The event type the copy records: the envelope's, or as much of it as a
/// skipped message had.
fn event_type(item: &FeedItem) -> Option<&str> {
    match item {
        FeedItem::Event(e) => Some(&e.envelope.event_type),
        FeedItem::Skipped(s) => s.why.head.event_type.as_deref(),
    }
}

/// The tenant and principal of a message that did not decode as a whole,
/// as far as its envelope can be read: what auditors filter on stays
/// filled for a newer version or an unknown type, and is NULL for junk
/// (as migration 0004 fills rows copied before these columns).
fn lenient_head(payload: &[u8]) -> (Option<uuid::Uuid>, Option<String>) {
    let Ok(serde_json::Value::Object(mut head)) = serde_json::from_slice(payload) else {
        return (None, None);
    };
    let tenant_id = head
        .get("tenant_id")
        .and_then(serde_json::Value::as_str)
        .and_then(|t| t.parse().ok());
    let actor = head
        .remove("actor")
        .and_then(|a| serde_json::from_value::<Actor>(a).ok())
        .map(|a| a.principal());
    (tenant_id, actor)
}

/// Decided by the recorded type, as the count on resume is (see
/// `checkpoint_state`), so that both agree.
fn is_checkpoint(item: &FeedItem) -> bool {
    event_type(item) == Some(CHECKPOINT_TYPE)
}

/// First wait before the keeper starts over after a failure; doubles up to
/// [`RESTART_MAX`].
const RESTART_MIN: Duration = Duration::from_millis(200);
const RESTART_MAX: Duration = Duration::from_secs(5);

impl Keeper {
    /// Keeps the chain until the future is dropped. A failure (PostgreSQL
    /// restarting, NATS out of reach) starts the keeper over: it takes the
    /// lock again (a restarted database has forgotten it) and resumes from
    /// the table, which is its offset; it never ends the service.
    pub async fn run(&self) -> anyhow::Result<()> {
        let mut wait = RESTART_MIN;
        loop {
            let started = Instant::now();
            let Err(e) = self.keep().await;
            self.ready.set(false);
            if started.elapsed() > RESTART_MAX * 4 {
                wait = RESTART_MIN;
            }
            tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "the chain keeper failed; starting over");
            metrics::counter!("lh_audit_keeper_restarts_total").increment(1);
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RESTART_MAX);
        }
    }

    /// One run of the keeper, from taking the lock; it returns only with
    /// the error that ended it.
    async fn keep(&self) -> anyhow::Result<std::convert::Infallible> {
        // Held for as long as this future lives: dropping the connection
        // (shutdown, crash) releases the lock to a standby.
        let mut lock = self.pool.acquire().await?.detach();
        sqlx::query("SELECT pg_advisory_lock('events'::regclass::oid::bigint)")
            .execute(&mut lock)
            .await?;

        let mut chain = self.resume().await?;
        let (last_checkpoint, mut since_checkpoint) = self.checkpoint_state().await?;
        tracing::info!(
            sequence = chain.last_sequence,
            events = chain.events,
            head = %chain.head_hex(),
            last_checkpoint,
            public_key = %hex::encode(self.key.verifying_key().to_bytes()),
            "audit chain resumed"
        );
        metrics::gauge!("lh_audit_chain_sequence").set(chain.last_sequence as f64);

        // Whether the last read reached the head. A quiet feed alone does
        // not say so: a slow server can pause a long replay for longer than
        // QUIET, and a keeper that said ready there would be far behind.
        let mut at_head = self.bus.last_sequence().await? <= chain.last_sequence;
        if at_head {
            self.ready.set(true);
        }
        let mut last_read = chain.last_sequence;
        let mut feed = self
            .bus
            .feed(&[subject::EVENTS_ALL], chain.last_sequence + 1)
            .await?;
        let mut batch: Vec<FeedItem> = Vec::with_capacity(MAX_BATCH_EVENTS);
        let mut last_checkpoint_at = Instant::now();
        // After a checkpoint failed: when to try again, and the wait so far.
        let mut checkpoint_retry: Option<(Instant, Duration)> = None;
        // None: look at the first time the keeper is caught up.
        let mut prune_looked_at: Option<Instant> = None;
        loop {
            let next = feed.next_item_within(QUIET).await;
            let quiet = match next {
                None => {
                    if !at_head {
                        at_head = self
                            .bus
                            .last_sequence()
                            .await
                            .is_ok_and(|head| head <= last_read);
                    }
                    true
                }
                Some(event) => {
                    let event = event?;
                    if !is_checkpoint(&event) {
                        since_checkpoint += 1;
                    }
                    at_head = event.pending() == 0;
                    last_read = event.sequence();
                    batch.push(event);
                    at_head
                }
            };
            let checkpoint_due = since_checkpoint > 0
                && (since_checkpoint >= self.policy.every_events
                    || last_checkpoint_at.elapsed() >= self.policy.every)
                && checkpoint_retry.is_none_or(|(at, _)| Instant::now() >= at);
            if !batch.is_empty() && (quiet || checkpoint_due || batch.len() >= MAX_BATCH_EVENTS) {
                self.write(&mut chain, &mut batch).await?;
            }
            if at_head {
                // Not ready while checkpoints cannot be published: the
                // chain is kept, but nothing signs it.
                self.ready
                    .set(checkpoint_retry.is_none() && self.bus.is_connected());
                if prune_looked_at.is_none_or(|at| at.elapsed() >= self.prune_every) {
                    prune_looked_at = Some(Instant::now());
                    if let Err(e) = self.prune_if_due().await {
                        tracing::warn!(error = %format!("{e:#}"), "cannot decide a prune of the audit copy; will look again");
                    }
                }
            }
            if checkpoint_due {
                match self.checkpoint(&chain).await {
                    Ok(()) => {
                        since_checkpoint = 0;
                        last_checkpoint_at = Instant::now();
                        checkpoint_retry = None;
                    }
                    Err(e) => {
                        let wait = checkpoint_retry.map_or(CHECKPOINT_RETRY_MIN_WAIT, |(_, w)| {
                            (w * 2).min(CHECKPOINT_RETRY_MAX_WAIT)
                        });
                        tracing::warn!(error = %format!("{e:#}"), retry_in_ms = wait.as_millis() as u64,
                            "cannot record a checkpoint; will retry");
                        self.ready.set(false);
                        checkpoint_retry = Some((Instant::now() + wait, wait));
                    }
                }
            }
        }
    }

    /// The chain as the table left it.
    async fn resume(&self) -> anyhow::Result<Chain> {
        let last: Option<(i64, Vec<u8>)> =
            sqlx::query_as("SELECT sequence, hash FROM events ORDER BY sequence DESC LIMIT 1")
                .fetch_optional(&self.pool)
                .await?;
        let Some((sequence, hash)) = last else {
            return Ok(Chain::default());
        };
        // After a prune the rows below the anchor are gone: the count
        // continues from the anchor's.
        let pruned: Option<(i64, i64)> = sqlx::query_as(
            "SELECT c.sequence, c.events FROM prunes p JOIN checkpoints c ON c.sequence = p.anchor_checkpoint
             ORDER BY p.anchor_checkpoint DESC LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await?;
        let (after, before): (i64, i64) = pruned.unwrap_or_default();
        let since: i64 = sqlx::query_scalar("SELECT count(*) FROM events WHERE sequence > $1")
            .bind(after)
            .fetch_one(&self.pool)
            .await?;
        let events = before + since;
        let head = Hash::try_from(hash.as_slice())
            .map_err(|_| anyhow::anyhow!("stored hash at sequence {sequence} is not 32 bytes"))?;
        Ok(Chain {
            head,
            events: events as u64,
            last_sequence: sequence as u64,
        })
    }

    /// Sequence of the last checkpoint and how many events other than
    /// checkpoints the table holds after it.
    async fn checkpoint_state(&self) -> anyhow::Result<(u64, u64)> {
        let last: Option<(i64, Vec<u8>)> = sqlx::query_as(
            "SELECT sequence, public_key FROM checkpoints ORDER BY sequence DESC LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await?;
        let (last, public_key) = last.unwrap_or_default();
        if !public_key.is_empty() && public_key != self.key.verifying_key().to_bytes() {
            tracing::warn!(
                previous = %hex::encode(&public_key),
                "checkpoints were signed with another key before: pass the same --signing-key-file to keep one key"
            );
        }
        let since: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM events WHERE sequence > $1 AND event_type IS DISTINCT FROM $2",
        )
        .bind(last)
        .bind(CHECKPOINT_TYPE)
        .fetch_one(&self.pool)
        .await?;
        Ok((last as u64, since as u64))
    }

    /// Chains `batch` and stores it in one transaction; the in-memory chain
    /// moves only once the rows are committed.
    async fn write(&self, chain: &mut Chain, batch: &mut Vec<FeedItem>) -> anyhow::Result<()> {
        let mut next = *chain;
        let links: Vec<Hash> = batch
            .iter()
            .map(|e| {
                // The event's request reads as one trace, its chaining here
                // included.
                let span = match e {
                    FeedItem::Event(event) => {
                        let span = tracing::info_span!(
                            "lh.project",
                            projection = "audit",
                            event = event.envelope.event_type.as_str(),
                            sequence = event.sequence,
                        );
                        lh_bus::continue_trace(&span, event.trace_parent.as_deref());
                        span
                    }
                    FeedItem::Skipped(_) => tracing::Span::none(),
                };
                let _chaining = span.enter();
                next.append(e.sequence(), e.subject(), e.payload())
            })
            .collect();
        let mut insert = QueryBuilder::new(
            "INSERT INTO events (sequence, subject, event_id, event_type, occurred_at, skip_reason, \
             tenant_id, actor, object, outcome, payload, hash) ",
        );
        insert.push_values(batch.iter().zip(&links), |mut row, (item, link)| {
            let (id, occurred_at, skip_reason, tenant_id, actor) = match item {
                FeedItem::Event(e) => (
                    Some(e.envelope.id),
                    Some(e.envelope.occurred_at),
                    None,
                    e.envelope.tenant_id,
                    Some(e.envelope.actor.principal()),
                ),
                FeedItem::Skipped(s) => {
                    let (tenant_id, actor) = lenient_head(&s.payload);
                    (
                        s.why.head.id,
                        s.why.head.occurred_at,
                        Some(s.reason().as_str()),
                        tenant_id,
                        actor,
                    )
                }
            };
            row.push_bind(item.sequence() as i64)
                .push_bind(item.subject())
                .push_bind(id)
                .push_bind(event_type(item))
                .push_bind(occurred_at)
                .push_bind(skip_reason)
                .push_bind(tenant_id)
                .push_bind(actor)
                .push_bind(trail::object(item.subject()))
                .push_bind(event_type(item).map(|t| trail::outcome(t).as_str()))
                .push_bind(&item.payload()[..])
                .push_bind(&link[..]);
        });
        let prunes: Vec<(u64, &AuditPruned)> = batch
            .iter()
            .filter_map(|item| match item {
                FeedItem::Event(e) => match &e.envelope.data {
                    EventData::AuditPruned(pruned) => Some((e.sequence, pruned)),
                    _ => None,
                },
                FeedItem::Skipped(_) => None,
            })
            .collect();
        let log_first = if prunes.is_empty() {
            0
        } else {
            log_first_sequence(&self.bus).await?
        };
        let mut tx = self.pool.begin().await?;
        insert.build().execute(&mut *tx).await?;
        for (event_sequence, pruned) in prunes {
            self.apply_prune(&mut tx, event_sequence, pruned, log_first)
                .await?;
        }
        tx.commit().await?;
        *chain = next;
        batch.clear();
        metrics::gauge!("lh_audit_chain_sequence").set(chain.last_sequence as f64);
        Ok(())
    }

    /// Publishes `audit.pruned` when the log's oldest events have expired
    /// and the copy holds rows below the anchor that verification now
    /// starts from.
    async fn prune_if_due(&self) -> anyhow::Result<()> {
        let log_first = log_first_sequence(&self.bus).await?;
        if log_first <= 1 {
            return Ok(());
        }
        let oldest: Option<i64> = sqlx::query_scalar("SELECT min(sequence) FROM events")
            .fetch_one(&self.pool)
            .await?;
        let Some(oldest) = oldest.map(|s| s as u64).filter(|&s| s < log_first) else {
            return Ok(());
        };
        let Some(anchor) = anchor::newest_at_or_before(&self.pool, log_first - 1).await? else {
            tracing::warn!(
                log_first,
                oldest,
                "the log's oldest events expired before a checkpoint covered them: verification has no anchor; the audit copy is kept whole"
            );
            return Ok(());
        };
        if anchor.sequence <= oldest {
            return Ok(());
        }
        anyhow::ensure!(
            anchor
                .anchored_chain(&[self.key.verifying_key().to_bytes()])
                .is_some(),
            "the checkpoint at sequence {} is not signed by this service's key: not pruning on it",
            anchor.sequence
        );
        let data = EventData::AuditPruned(AuditPruned {
            below_sequence: log_first,
            anchor_checkpoint: anchor.sequence,
        });
        // One id per anchor: a prune decided twice (a retry, a restart)
        // is stored once within the log's duplicate window, and applying
        // it twice deletes nothing more.
        let envelope = Envelope::new(Actor::Service(SERVICE.into()), Utc::now(), data)
            .with_id(derived_id(&["audit-pruned", &anchor.sequence.to_string()]));
        self.bus.publish(&envelope, Expect::Any).await?;
        tracing::info!(
            below_sequence = log_first,
            anchor_checkpoint = anchor.sequence,
            "audit copy prune published"
        );
        Ok(())
    }

    /// Deletes the copy's rows below the anchor `pruned` names, within the
    /// transaction that copies its event. A prune that would remove a row
    /// the log still holds, or that rests on a checkpoint this service did
    /// not sign, is copied but not applied.
    async fn apply_prune(
        &self,
        tx: &mut PgConnection,
        event_sequence: u64,
        pruned: &AuditPruned,
        log_first: u64,
    ) -> anyhow::Result<()> {
        let anchor_sequence = pruned.anchor_checkpoint;
        let anchor = anchor::newest_at_or_before(&mut *tx, anchor_sequence)
            .await?
            .filter(|cp| cp.sequence == anchor_sequence);
        let sound = anchor_sequence > 0
            && anchor_sequence < pruned.below_sequence
            && pruned.below_sequence <= log_first
            && anchor.is_some_and(|cp| {
                cp.anchored_chain(&[self.key.verifying_key().to_bytes()])
                    .is_some()
            });
        if !sound {
            tracing::warn!(
                event_sequence,
                below_sequence = pruned.below_sequence,
                anchor_checkpoint = anchor_sequence,
                log_first,
                "audit.pruned does not rest on a signed checkpoint before the log's first sequence: not applied"
            );
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO prunes (anchor_checkpoint, below_sequence, event_sequence)
             VALUES ($1, $2, $3) ON CONFLICT (anchor_checkpoint) DO NOTHING",
        )
        .bind(anchor_sequence as i64)
        .bind(pruned.below_sequence as i64)
        .bind(event_sequence as i64)
        .execute(&mut *tx)
        .await?;
        let events = sqlx::query("DELETE FROM events WHERE sequence < $1")
            .bind(anchor_sequence as i64)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let checkpoints = sqlx::query("DELETE FROM checkpoints WHERE sequence < $1")
            .bind(anchor_sequence as i64)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        metrics::counter!("lh_audit_pruned_rows_total").increment(events);
        tracing::info!(
            anchor_checkpoint = anchor_sequence,
            below_sequence = pruned.below_sequence,
            events,
            checkpoints,
            "audit copy pruned"
        );
        Ok(())
    }

    /// Signs the head, publishes `audit.checkpoint` and records it.
    async fn checkpoint(&self, chain: &Chain) -> anyhow::Result<()> {
        let signature = sign_checkpoint(&self.key, chain.last_sequence, chain.events, &chain.head);
        let public_key = self.key.verifying_key().to_bytes();
        let data = EventData::AuditCheckpoint(AuditCheckpoint {
            sequence: chain.last_sequence,
            head: chain.head_hex(),
            events: chain.events,
            public_key: hex::encode(public_key),
            signature: hex::encode(signature.to_bytes()),
        });
        let envelope =
            Envelope::new(Actor::Service(SERVICE.into()), Utc::now(), data).with_id(derived_id(&[
                "audit-checkpoint",
                &chain.last_sequence.to_string(),
            ]));
        // Published first: a crash before the row is written leaves a
        // checkpoint in the log (harmless) rather than a row the log lacks.
        self.bus.publish(&envelope, Expect::Any).await?;
        sqlx::query(
            "INSERT INTO checkpoints (sequence, events, head, public_key, signature)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (sequence) DO NOTHING",
        )
        .bind(chain.last_sequence as i64)
        .bind(chain.events as i64)
        .bind(&chain.head[..])
        .bind(&public_key[..])
        .bind(&signature.to_bytes()[..])
        .execute(&self.pool)
        .await?;
        metrics::counter!("lh_audit_checkpoints_total").increment(1);
        tracing::info!(
            sequence = chain.last_sequence,
            events = chain.events,
            head = %chain.head_hex(),
            "audit checkpoint signed"
        );
        Ok(())
    }
}
