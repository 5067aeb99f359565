//! The audit copy as a projection of the whole log: each run of stored
//! messages, decoded or not, is chained over its raw bytes and written
//! with its links into `events`, in the transaction the projection loop
//! commits it in. The table is the offset (its last row is where the
//! chain resumes), so the loop keeps none of its own.
//!
//! Two events of the keeper's own act on the copy as they are copied, in
//! the same transaction: an `audit.checkpoint` this service signed is
//! recorded in `checkpoints`, and a sound `audit.pruned` deletes the rows
//! below its anchor. A row there thus always follows its event on the log.

use std::sync::Mutex;

use futures::future::BoxFuture;
use lh_bus::{Bus, FeedItem, Stored};
use lh_domain::chain::{Chain, Hash};
use lh_events::{subject, trail, Actor, AuditCheckpoint, AuditPruned, EventData, SkipReason};
use lh_projection::{Judged, Projector, Verdict};
use sqlx::{PgConnection, QueryBuilder};

use super::custody::Link;
use super::refusals::{is_security_refusal, Refusal};
use crate::anchor::{self, log_first_sequence};
use crate::signing::checkpoint_signature_ok;

/// Event type of checkpoints, as `events.event_type` stores it.
pub(crate) const CHECKPOINT_TYPE: &str = "audit.checkpoint";
/// Most rows one INSERT statement writes (a transaction may write more).
const MAX_ROWS_PER_STATEMENT: usize = 256;

/// The projection that keeps the copy and its chain.
pub(crate) struct ChainCopy {
    bus: Bus,
    /// This service's key: only checkpoints it signed are recorded, and
    /// only prunes resting on one of them are applied.
    public_key: [u8; 32],
    /// The chain before and after the run of messages last chained: the
    /// one of them that stands at the copy's last row is where the next
    /// run goes on, without counting the table again.
    known: Mutex<[Chain; 2]>,
    /// The links of the run last chained, for the keeper's decisions once
    /// the loop committed them.
    chained: Mutex<Vec<Link>>,
    /// What of the run last chained the readers refused, for operators
    /// once the loop committed it.
    refused: Mutex<Vec<Refusal>>,
}

impl ChainCopy {
    /// The projection of a copy whose chain stands at `chain`.
    pub fn new(bus: Bus, public_key: [u8; 32], chain: Chain) -> Self {
        Self {
            bus,
            public_key,
            known: Mutex::new([chain, chain]),
            chained: Mutex::new(Vec::new()),
            refused: Mutex::new(Vec::new()),
        }
    }

    /// What the readers refused of the run last chained, once the loop
    /// committed it (a run tried again is judged again, to the same).
    pub fn take_refused(&self) -> Vec<Refusal> {
        std::mem::take(&mut *self.refused.lock().expect("refused events"))
    }

    /// The links of the run last chained, once the loop committed it: a
    /// run tried again is chained again to the same links (they are a
    /// function of the log), so whichever try committed, these are its.
    pub fn take_committed(&self) -> Vec<Link> {
        std::mem::take(&mut *self.chained.lock().expect("chained links"))
    }

    /// The chain at the copy's last row, as the transaction sees it.
    async fn chain_at_last_row(&self, conn: &mut PgConnection) -> sqlx::Result<Chain> {
        let last: Option<(i64, Vec<u8>)> =
            sqlx::query_as("SELECT sequence, hash FROM events ORDER BY sequence DESC LIMIT 1")
                .fetch_optional(&mut *conn)
                .await?;
        let Some((sequence, hash)) = last else {
            return Ok(Chain::default());
        };
        let known = *self.known.lock().expect("known chain");
        if let Some(chain) = known
            .iter()
            .find(|c| c.last_sequence == sequence as u64 && c.head[..] == hash[..])
        {
            return Ok(*chain);
        }
        resume(conn).await
    }

    /// Chains `messages` on from the copy's last row and writes them, with
    /// what the keeper's own events among them do to the copy.
    async fn copy(&self, conn: &mut PgConnection, messages: &[&FeedItem]) -> sqlx::Result<()> {
        // Judged as every reader judges them, so that the trail says what
        // the platform refused and tags nothing with a tenant on a
        // publisher's word alone.
        let skew = chrono::Duration::seconds(self.node_clock_skew_secs());
        let judged = lh_projection::judge_messages(conn, self.name(), messages, skew).await?;
        let before = self.chain_at_last_row(conn).await?;
        let mut chain = before;
        let mut links = Vec::with_capacity(messages.len());
        let mut hashes: Vec<Hash> = Vec::with_capacity(messages.len());
        for item in messages {
            // The event's request reads as one trace, its chaining here
            // included.
            let span = match item {
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
            hashes.push(chain.append(item.sequence(), item.subject(), item.payload()));
            links.push(Link {
                chain,
                checkpoint: is_checkpoint(item),
            });
        }
        for ((items, hashes), judged) in messages
            .chunks(MAX_ROWS_PER_STATEMENT)
            .zip(hashes.chunks(MAX_ROWS_PER_STATEMENT))
            .zip(judged.chunks(MAX_ROWS_PER_STATEMENT))
        {
            insert_rows(conn, items, hashes, judged).await?;
        }
        let mut log_first = None;
        for (item, judged) in messages.iter().zip(&judged) {
            let FeedItem::Event(event) = item else {
                continue;
            };
            if matches!(judged.verdict, Verdict::Refused(_)) {
                continue;
            }
            match &event.envelope.data {
                EventData::AuditCheckpoint(cp) => self.record_checkpoint(conn, cp).await?,
                EventData::AuditPruned(pruned) => {
                    let log_first = match log_first {
                        Some(first) => first,
                        None => *log_first.insert(
                            log_first_sequence(&self.bus)
                                .await
                                .map_err(|e| sqlx::Error::Io(std::io::Error::other(e)))?,
                        ),
                    };
                    self.apply_prune(conn, event.sequence, pruned, log_first)
                        .await?
                }
                _ => {}
            }
        }
        *self.known.lock().expect("known chain") = [before, chain];
        *self.chained.lock().expect("chained links") = links;
        *self.refused.lock().expect("refused events") = refusals(messages, &judged);
        Ok(())
    }

    /// Records a checkpoint this service signed in `checkpoints`; one
    /// signed by any other key is copied as an event and no more.
    async fn record_checkpoint(
        &self,
        conn: &mut PgConnection,
        cp: &AuditCheckpoint,
    ) -> sqlx::Result<()> {
        let (Ok(public_key), Ok(head), Ok(signature)) = (
            hex::decode(&cp.public_key),
            hex::decode(&cp.head),
            hex::decode(&cp.signature),
        ) else {
            return Ok(());
        };
        let Ok(head) = Hash::try_from(head.as_slice()) else {
            return Ok(());
        };
        if public_key[..] != self.public_key[..]
            || !checkpoint_signature_ok(&public_key, &signature, cp.sequence, cp.events, &head)
        {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO checkpoints (sequence, events, head, public_key, signature)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (sequence) DO NOTHING",
        )
        .bind(cp.sequence as i64)
        .bind(cp.events as i64)
        .bind(&head[..])
        .bind(&public_key[..])
        .bind(&signature[..])
        .execute(conn)
        .await?;
        Ok(())
    }

    /// Deletes the copy's rows below the anchor `pruned` names, within the
    /// transaction that copies its event. A prune that would remove a row
    /// the log still holds, or that rests on a checkpoint this service did
    /// not sign, is copied but not applied.
    async fn apply_prune(
        &self,
        conn: &mut PgConnection,
        event_sequence: u64,
        pruned: &AuditPruned,
        log_first: u64,
    ) -> sqlx::Result<()> {
        let anchor_sequence = pruned.anchor_checkpoint;
        let anchor = anchor::newest_at_or_before(&mut *conn, anchor_sequence)
            .await?
            .filter(|cp| cp.sequence == anchor_sequence);
        let sound = anchor_sequence > 0
            && anchor_sequence < pruned.below_sequence
            && pruned.below_sequence <= log_first
            && anchor.is_some_and(|cp| cp.anchored_chain(&[self.public_key]).is_some());
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
        .execute(&mut *conn)
        .await?;
        let events = sqlx::query("DELETE FROM events WHERE sequence < $1")
            .bind(anchor_sequence as i64)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        let checkpoints = sqlx::query("DELETE FROM checkpoints WHERE sequence < $1")
            .bind(anchor_sequence as i64)
            .execute(&mut *conn)
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
}

impl Projector for ChainCopy {
    fn name(&self) -> &'static str {
        "audit"
    }

    fn filters(&self) -> &'static [&'static str] {
        &[subject::EVENTS_ALL]
    }

    fn apply<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        event: &'c Stored,
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async move {
            let item = FeedItem::Event(event.clone());
            self.copy(conn, &[&item]).await
        })
    }

    fn apply_messages<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        messages: &'c [&'c FeedItem],
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(self.copy(conn, messages))
    }

    fn own_offset<'c>(
        &'c self,
        conn: &'c mut PgConnection,
    ) -> BoxFuture<'c, sqlx::Result<Option<u64>>> {
        Box::pin(async move {
            let last: Option<i64> = sqlx::query_scalar("SELECT max(sequence) FROM events")
                .fetch_one(&mut *conn)
                .await?;
            Ok(Some(last.unwrap_or(0) as u64))
        })
    }
}

/// Writes one statement's worth of rows: each message with its link.
async fn insert_rows(
    conn: &mut PgConnection,
    items: &[&FeedItem],
    hashes: &[Hash],
    judged: &[Judged],
) -> sqlx::Result<()> {
    let mut insert = QueryBuilder::new(
        "INSERT INTO events (sequence, subject, event_id, event_type, occurred_at, skip_reason, \
         tenant_id, actor, object, outcome, payload, hash) ",
    );
    let rows = items.iter().zip(hashes).zip(judged);
    insert.push_values(rows, |mut row, ((item, link), judged)| {
        let (id, occurred_at, skip_reason, tenant_id, actor) = match (item, &judged.verdict) {
            // Refused: kept, with who claimed to write it, in no tenant's
            // trail.
            (FeedItem::Event(e), Verdict::Refused(refused)) => (
                Some(e.envelope.id),
                Some(e.envelope.occurred_at),
                Some(refused.reason().as_str()),
                None,
                Some(e.envelope.actor.principal()),
            ),
            // A lease's event is the lease's tenant's, whatever its
            // envelope claims.
            (FeedItem::Event(e), _) => (
                Some(e.envelope.id),
                Some(e.envelope.occurred_at),
                None,
                judged.lease_tenant.or(e.envelope.tenant_id),
                Some(e.envelope.actor.principal()),
            ),
            (FeedItem::Skipped(s), _) => {
                let (tenant_id, actor) = lenient_head(&s.payload);
                // A forgery's claims put it in no tenant's trail; a newer
                // writer's event keeps the tenant it names.
                let forged = matches!(s.reason(), SkipReason::WrongSubject | SkipReason::NotOwner);
                (
                    s.why.head.id,
                    s.why.head.occurred_at,
                    Some(s.reason().as_str()),
                    tenant_id.filter(|_| !forged),
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
    insert.build().execute(conn).await?;
    Ok(())
}

/// The chain as the copy's rows leave it, counted from the table: after a
/// prune the rows below the anchor are gone, and the count continues from
/// the anchor's.
pub(crate) async fn resume(conn: &mut PgConnection) -> sqlx::Result<Chain> {
    let last: Option<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT sequence, hash FROM events ORDER BY sequence DESC LIMIT 1")
            .fetch_optional(&mut *conn)
            .await?;
    let Some((sequence, hash)) = last else {
        return Ok(Chain::default());
    };
    let pruned: Option<(i64, i64)> = sqlx::query_as(
        "SELECT c.sequence, c.events FROM prunes p JOIN checkpoints c ON c.sequence = p.anchor_checkpoint
         ORDER BY p.anchor_checkpoint DESC LIMIT 1",
    )
    .fetch_optional(&mut *conn)
    .await?;
    let (after, before): (i64, i64) = pruned.unwrap_or_default();
    let since: i64 = sqlx::query_scalar("SELECT count(*) FROM events WHERE sequence > $1")
        .bind(after)
        .fetch_one(&mut *conn)
        .await?;
    let head = Hash::try_from(hash.as_slice()).map_err(|_| {
        sqlx::Error::Decode(format!("stored hash at sequence {sequence} is not 32 bytes").into())
    })?;
    Ok(Chain {
        head,
        events: (before + since) as u64,
        last_sequence: sequence as u64,
    })
}

/// The event type the copy records: the envelope's, or as much of it as a
/// skipped message had.
/// The refusals among `messages` an operator is told of, with the
/// publisher as the subject names it (its last token is the writer).
fn refusals(messages: &[&FeedItem], judged: &[Judged]) -> Vec<Refusal> {
    messages
        .iter()
        .zip(judged)
        .filter_map(|(item, judged)| {
            let reason = match (item, &judged.verdict) {
                (FeedItem::Event(_), Verdict::Refused(refused)) => refused.reason(),
                (FeedItem::Skipped(skipped), _) => skipped.reason(),
                _ => return None,
            };
            if !is_security_refusal(reason) {
                return None;
            }
            // The server lets a user publish only under its own origin.
            let publisher = item.subject().rsplit('.').next().unwrap_or_default();
            Some(Refusal {
                publisher: publisher.to_string(),
                event_type: event_type(item).unwrap_or("unknown").to_string(),
                reason,
                sequence: item.sequence(),
            })
        })
        .collect()
}

fn event_type(item: &FeedItem) -> Option<&str> {
    match item {
        FeedItem::Event(e) => Some(&e.envelope.event_type),
        FeedItem::Skipped(s) => s.why.head.event_type.as_deref(),
    }
}

/// Decided by the recorded type, as the count on resume is (see
/// `checkpoint_state`), so that both agree.
fn is_checkpoint(item: &FeedItem) -> bool {
    event_type(item) == Some(CHECKPOINT_TYPE)
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
