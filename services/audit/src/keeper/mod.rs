//! The chain keeper: follows the whole business log in stream order, extends
//! the hash chain over each stored message's raw bytes and writes every event,
//! with its link, into the append-only `events` table.
//!
//! A message that does not decode (junk, an unknown type, a newer version)
//! is chained and copied like any other: the chain is over raw bytes, and
//! leaving one out would make the log and the copy disagree. Its row keeps
//! whatever of the envelope could be read and says why it was skipped.
//!
//! Rows are written in batches, each one transaction; the table itself
//! is the keeper's offset (its last row is where the chain resumes), so a
//! crash between two batches neither loses nor doubles a row. One keeper per
//! schema: a Postgres advisory lock makes a second replica wait as a standby.
//!
//! Every N events or T seconds, whichever comes first and only when events
//! other than its own checkpoints arrived, the keeper signs the chain head and
//! publishes `audit.checkpoint`, which is then chained like any other event
//! and, signed by this service's key, recorded in `checkpoints`.
//!
//! Every prune interval, once the log's oldest events have expired, the
//! keeper publishes `audit.pruned` naming the anchor checkpoint (the newest
//! one covering the log's first sequence minus one). The rows below the
//! anchor are deleted when that event is chained, in the transaction that
//! copies it: the deletion always follows the event, a crash in between
//! only leaves the event to be applied on resume, and only the keeper
//! holding the lock prunes (a standby neither decides nor deletes).
//!
//! The keeper is the workspace's two loops under that lock: the copy is a
//! projection ([`copy::ChainCopy`] on `lh_projection::run_observed`), and
//! the two decisions are a decider ([`custody::Custody`] on
//! `lh_service::decider`) that hears of each committed run of links and of
//! each look at the old end of the log.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use lh_bus::Bus;
use lh_projection::Progress;
use lh_service::clock::SystemClock;
use lh_service::{CancellationToken, Readiness};
use sqlx::{PgConnection, PgPool};
use tokio::sync::mpsc;

use crate::anchor::{self, log_first_sequence};

mod copy;
mod custody;
pub mod refusals;
#[cfg(test)]
mod tests;

use copy::{ChainCopy, CHECKPOINT_TYPE};
use custody::{Custody, OldEnd, Signal};

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

/// First wait before the keeper starts over after a failure; doubles up to
/// [`RESTART_MAX`].
const RESTART_MIN: Duration = Duration::from_millis(200);
const RESTART_MAX: Duration = Duration::from_secs(5);
/// How often the keeper makes sure the connection holding its lock is
/// still there.
const LOCK_CHECK_EVERY: Duration = Duration::from_secs(1);
/// How often the keeper's readiness is brought in line with its loops.
const READINESS_CHECK_EVERY: Duration = Duration::from_millis(100);

impl Keeper {
    /// Keeps the chain until the future is dropped. A failure (the lock's
    /// connection lost with a restarting PostgreSQL, NATS out of reach)
    /// starts the keeper over: it takes the lock again (a restarted
    /// database has forgotten it) and resumes from the table, which is its
    /// offset; it never ends the service.
    pub async fn run(&self) -> anyhow::Result<()> {
        // Outlives the keeper's restarts: an interval's sums survive them.
        let tally = std::sync::Arc::new(refusals::RefusalTally::new(chrono::Utc::now()));
        let _summaries = lh_service::AbortOnDrop(tokio::spawn(refusals::publish_summaries(
            self.bus.clone(),
            tally.clone(),
        )));
        let mut wait = RESTART_MIN;
        loop {
            let started = Instant::now();
            // On the heap: both loops' futures are large, and a term
            // holds them all.
            let Err(e) = Box::pin(self.keep(&tally)).await;
            self.ready.set(false);
            if started.elapsed() > RESTART_MAX * 4 {
                wait = RESTART_MIN;
            }
            tracing::warn!(error = %format!("{e:#}"), retry_in_ms = wait.as_millis() as u64, "the chain keeper failed; starting over");
            metrics::counter!("lh_audit_keeper_restarts_total").increment(1);
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RESTART_MAX);
        }
    }

    /// One term of the keeper, from taking the lock; it returns only with
    /// the error that ended it.
    async fn keep(&self, tally: &refusals::RefusalTally) -> anyhow::Result<Infallible> {
        // Held for as long as this future lives: dropping the connection
        // (shutdown, crash) releases the lock to a standby.
        let mut lock = self.pool.acquire().await?.detach();
        sqlx::query("SELECT pg_advisory_lock('events'::regclass::oid::bigint)")
            .execute(&mut lock)
            .await?;

        let chain = copy::resume(&mut *self.pool.acquire().await?).await?;
        let (last_checkpoint, since_checkpoint) = self.checkpoint_state().await?;
        let public_key = self.key.verifying_key().to_bytes();
        tracing::info!(
            sequence = chain.last_sequence,
            events = chain.events,
            head = %chain.head_hex(),
            last_checkpoint,
            public_key = %hex::encode(public_key),
            "audit chain resumed"
        );
        metrics::gauge!("lh_audit_chain_sequence").set(chain.last_sequence as f64);

        let chain_copy = ChainCopy::new(self.bus.clone(), public_key, chain);
        let mut custody = Custody::resumed(self.key.clone(), self.policy, chain, since_checkpoint);
        let (signals, heard) = mpsc::unbounded_channel();
        let (progress_tx, progress_rx) = tokio::sync::oneshot::channel();
        // Never cancelled: both loops end when this term drops them.
        let stop = CancellationToken::new();
        let deciding = Readiness::default();

        let copying = Box::pin(lh_projection::run_observed(
            &self.bus,
            &self.pool,
            &chain_copy,
            stop.clone().cancelled_owned(),
            |progress| {
                let _ = progress_tx.send(progress);
            },
            |_subjects| {
                tally.add(chain_copy.take_refused());
                let links = chain_copy.take_committed();
                if let Some(last) = links.last() {
                    metrics::gauge!("lh_audit_chain_sequence").set(last.chain.last_sequence as f64);
                    let _ = signals.send(Signal::Chained(links));
                }
                async {}
            },
        ));
        let signals_heard = futures::stream::unfold(heard, |mut heard| async move {
            heard.recv().await.map(|signal| (signal, heard))
        });
        let decisions = Box::pin(lh_service::decider::run_with_signals(
            &self.bus,
            &mut custody,
            &SystemClock,
            stop,
            deciding.clone(),
            signals_heard,
        ));
        let watching = async {
            let Ok(progress) = progress_rx.await else {
                return std::future::pending().await;
            };
            tokio::select! {
                never = self.look_at_old_end(progress.clone(), signals.clone()) => never,
                never = self.report_readiness(progress, deciding.clone()) => never,
            }
        };
        tokio::select! {
            ended = copying => match ended {
                Ok(()) => anyhow::bail!("the copy's projection ended"),
                Err(e) => Err(anyhow::Error::new(e).context("the copy's projection failed")),
            },
            ended = decisions => match ended {
                Ok(()) => anyhow::bail!("the keeper's decisions ended"),
                Err(e) => Err(e.context("the keeper's decisions failed")),
            },
            lost = lock_lost(&mut lock) => Err(lost.context("lost the connection holding the keeper's lock")),
            never = watching => match never {},
        }
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

    /// Every prune interval, from the first time the copy caught up with
    /// the log, tells the decisions what the log and the copy hold at their
    /// old end.
    async fn look_at_old_end(
        &self,
        progress: Progress,
        signals: mpsc::UnboundedSender<Signal>,
    ) -> Infallible {
        while !progress.wait_caught_up(self.prune_every).await {}
        let mut every = tokio::time::interval(self.prune_every);
        loop {
            every.tick().await;
            match self.old_end().await {
                Ok(old_end) => {
                    let _ = signals.send(Signal::OldEnd(old_end));
                }
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot look at the old end of the log and the audit copy; will look again")
                }
            }
        }
    }

    async fn old_end(&self) -> anyhow::Result<OldEnd> {
        let log_first = log_first_sequence(&self.bus).await?;
        if log_first <= 1 {
            return Ok(OldEnd {
                log_first,
                copy_oldest: None,
                anchor: None,
            });
        }
        let oldest: Option<i64> = sqlx::query_scalar("SELECT min(sequence) FROM events")
            .fetch_one(&self.pool)
            .await?;
        Ok(OldEnd {
            log_first,
            copy_oldest: oldest.map(|s| s as u64),
            anchor: anchor::newest_at_or_before(&self.pool, log_first - 1).await?,
        })
    }

    /// Ready while the copy has caught up with the log and is not stalled
    /// on the database, and the decisions have caught up with the log and
    /// can publish.
    async fn report_readiness(&self, progress: Progress, deciding: Readiness) -> Infallible {
        loop {
            self.ready.set(
                progress.caught_up()
                    && !progress.stalled()
                    && deciding.is_ready()
                    && self.bus.is_connected(),
            );
            tokio::time::sleep(READINESS_CHECK_EVERY).await;
        }
    }
}

/// Returns once the connection holding the lock fails: the lock went with
/// it, and another replica may hold it now.
async fn lock_lost(lock: &mut PgConnection) -> anyhow::Error {
    loop {
        tokio::time::sleep(LOCK_CHECK_EVERY).await;
        if let Err(e) = sqlx::query("SELECT 1").execute(&mut *lock).await {
            return e.into();
        }
    }
}
