//! Chain verification: the answer to "has anything in the log or in the
//! audit copy been changed?".
//!
//! While the log starts at sequence 1, the stream is replayed from there up
//! to the last sequence the keeper stored, the chain is recomputed from the
//! raw stream payloads, and each link is compared with the row Postgres holds
//! (same subject, same payload bytes, same hash). Stored checkpoints are then
//! checked against the recomputed chain and their ed25519 signature. Two
//! copies and the signed heads must agree: changing either copy, or both
//! without the key, shows up.
//!
//! Once the log's oldest events have expired (its first sequence F is above
//! 1), the chain starts from an anchor instead: the newest stored checkpoint
//! covering F-1 or less, signed by the pinned key. The copy's rows between
//! the anchor and F, which only the copy still holds, are chained from their
//! stored bytes (a later signed checkpoint pins them); from F on, the stream
//! is compared with the copy as above. Without such a checkpoint nothing
//! can be verified, and the report says so.
//!
//! The audit copy is read in one repeatable-read transaction, so that a
//! prune committed meanwhile does not remove rows under the reader.
//!
//! The request and report types are the contract in `lh_rpc::audit`, so that
//! the gateway can serve the same report without depending on this crate.

use std::collections::VecDeque;
use std::time::Duration;

use ed25519_dalek::VerifyingKey;
use lh_bus::Bus;
use lh_domain::chain::Chain;
use lh_events::subject;
use lh_rpc::audit::{VerifyAnchor, VerifyResponse};
use sqlx::{PgConnection, PgPool};

use crate::anchor::{self, log_first_sequence, StoredCheckpoint};

/// Rows read from Postgres per query while merging with the stream.
const ROWS_PER_PAGE: i64 = 1_000;
/// How long the stream may stay silent before the events the audit copy
/// holds are declared missing from it.
const STREAM_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// One row of the audit copy.
struct Row {
    sequence: u64,
    subject: String,
    payload: Vec<u8>,
    hash: Vec<u8>,
}

/// The audit copy read in sequence order, a page at a time.
struct Rows {
    upper: u64,
    after: u64,
    page: VecDeque<Row>,
}

impl Rows {
    fn new(after: u64, upper: u64) -> Self {
        Self {
            upper,
            after,
            page: VecDeque::new(),
        }
    }

    async fn peek(&mut self, db: &mut PgConnection) -> sqlx::Result<Option<&Row>> {
        if self.page.is_empty() && self.after < self.upper {
            let rows: Vec<(i64, String, Vec<u8>, Vec<u8>)> = sqlx::query_as(
                "SELECT sequence, subject, payload, hash FROM events
                 WHERE sequence > $1 AND sequence <= $2 ORDER BY sequence LIMIT $3",
            )
            .bind(self.after as i64)
            .bind(self.upper as i64)
            .bind(ROWS_PER_PAGE)
            .fetch_all(&mut *db)
            .await?;
            self.page.extend(
                rows.into_iter()
                    .map(|(sequence, subject, payload, hash)| Row {
                        sequence: sequence as u64,
                        subject,
                        payload,
                        hash,
                    }),
            );
            self.after = self.page.back().map_or(self.upper, |r| r.sequence);
        }
        Ok(self.page.front())
    }

    fn pop(&mut self) -> Option<Row> {
        self.page.pop_front()
    }
}

/// The recomputed chain and what it has found so far.
struct Check {
    chain: Chain,
    first_mismatch: Option<u64>,
    checkpoints: Vec<StoredCheckpoint>,
    /// Index of the first checkpoint not yet checked.
    next_checkpoint: usize,
    checkpoints_verified: u64,
}

impl Check {
    fn mismatch(&mut self, seq: u64) {
        if self.first_mismatch.is_none_or(|first| seq < first) {
            self.first_mismatch = Some(seq);
        }
    }

    /// Checks every stored checkpoint up to the chain's last sequence.
    fn checkpoints_upto_head(&mut self) {
        while let Some(cp) = self.checkpoints.get(self.next_checkpoint) {
            if cp.sequence > self.chain.last_sequence {
                break;
            }
            if cp.holds_for(&self.chain) {
                self.checkpoints_verified += 1;
            }
            self.next_checkpoint += 1;
        }
    }

    /// A message the stream delivered, compared with the copy's row for it.
    fn streamed(&mut self, sequence: u64, subject: &str, payload: &[u8], row: Option<Row>) {
        let link = self.chain.append(sequence, subject, payload);
        match row {
            Some(row) => {
                let same = row.subject == subject
                    && row.payload[..] == payload[..]
                    && row.hash[..] == link[..];
                if !same {
                    self.mismatch(sequence);
                }
            }
            // The copy lacks this event.
            None => self.mismatch(sequence),
        }
        self.checkpoints_upto_head();
    }

    /// A row of an event the log no longer holds: only the copy attests
    /// it, so it is chained from its stored bytes; a later checkpoint pins
    /// the result.
    fn expired(&mut self, row: &Row) {
        let link = self.chain.append(row.sequence, &row.subject, &row.payload);
        if row.hash[..] != link[..] {
            self.mismatch(row.sequence);
        }
        self.checkpoints_upto_head();
    }
}

/// Where the chain starts: the genesis, or a pinned anchor.
enum Start {
    Genesis,
    Anchor(Chain),
    /// Verification cannot start; the sentence says why.
    Refused(String),
}

async fn start(
    db: &mut PgConnection,
    log_first: u64,
    pinned: &VerifyingKey,
) -> sqlx::Result<Start> {
    if log_first <= 1 {
        return Ok(Start::Genesis);
    }
    let Some(anchor) = anchor::newest_at_or_before(&mut *db, log_first - 1).await? else {
        return Ok(Start::Refused(format!(
            "no anchor: the log starts at sequence {log_first} and no stored checkpoint covers sequence {} or earlier",
            log_first - 1
        )));
    };
    Ok(match anchor.anchored_chain(pinned) {
        Some(chain) => Start::Anchor(chain),
        None => Start::Refused(format!(
            "the anchor checkpoint at sequence {} is not signed by this service's key",
            anchor.sequence
        )),
    })
}

/// Replays the log up to the audit copy's last sequence and compares.
/// `pinned` is the key the anchor must be signed with.
pub(crate) async fn verify(
    bus: &Bus,
    pool: &PgPool,
    pinned: &VerifyingKey,
) -> anyhow::Result<VerifyResponse> {
    let mut db = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *db)
        .await?;
    let upper: i64 = sqlx::query_scalar("SELECT coalesce(max(sequence), 0) FROM events")
        .fetch_one(&mut *db)
        .await?;
    let upper = upper as u64;
    // Read after the snapshot: a prune the snapshot missed rests on an
    // anchor no newer than the one chosen from this value.
    let mut log_first = log_first_sequence(bus).await?;

    let (chain, anchor) = match start(&mut db, log_first, pinned).await? {
        Start::Genesis => (Chain::default(), None),
        Start::Anchor(chain) => (chain, Some(chain)),
        Start::Refused(problem) => {
            return Ok(VerifyResponse {
                ok: false,
                events: 0,
                head: Chain::default().head_hex(),
                sequence: 0,
                first_mismatch: None,
                checkpoints_verified: 0,
                checkpoints: 0,
                anchor: None,
                checked_from: log_first,
                problem: Some(problem),
            })
        }
    };
    let checked_from = chain.last_sequence + 1;
    let mut check = Check {
        chain,
        first_mismatch: None,
        checkpoints: anchor::between(&mut *db, chain.last_sequence, upper).await?,
        next_checkpoint: 0,
        checkpoints_verified: 0,
    };
    if let Some(anchor) = &anchor {
        // The copy's link at the anchor must be the signed head.
        let stored: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT hash FROM events WHERE sequence = $1")
                .bind(anchor.last_sequence as i64)
                .fetch_optional(&mut *db)
                .await?;
        if stored.as_deref() != Some(&anchor.head[..]) {
            check.mismatch(anchor.last_sequence);
        }
    }

    let mut rows = Rows::new(chain.last_sequence, upper);
    // Only what the log still holds is asked of it.
    let mut feed = if upper >= checked_from.max(log_first) {
        Some(bus.reread(&[subject::EVENTS_ALL], checked_from).await?)
    } else {
        None
    };
    loop {
        let next = match feed.as_mut() {
            Some(feed) => feed.next_item_within(STREAM_STALL_TIMEOUT).await,
            None => None,
        };
        let next = next.transpose()?;
        let streamed_at = next.as_ref().map_or(u64::MAX, |e| e.sequence());
        // Rows before the next streamed message: expired ones are chained
        // from the copy; any other is one the log lacks.
        while let Some(row) = rows.peek(&mut db).await? {
            let seq = row.sequence;
            if seq >= streamed_at {
                break;
            }
            if seq >= log_first {
                // The log may have expired more since it was asked.
                log_first = log_first_sequence(bus).await?;
            }
            let row = rows.pop().expect("a peeked row");
            if seq < log_first {
                check.expired(&row);
            } else {
                check.mismatch(seq);
            }
        }
        let Some(event) = next else { break };
        if event.sequence() > upper {
            break;
        }
        let row = match rows.peek(&mut db).await? {
            Some(row) if row.sequence == event.sequence() => rows.pop(),
            _ => None,
        };
        check.streamed(event.sequence(), event.subject(), event.payload(), row);
        if event.sequence() == upper {
            break;
        }
    }

    // The anchor is one of the stored checkpoints, verified by its signature.
    let anchor_counted = u64::from(anchor.is_some());
    let checkpoints = check.checkpoints.len() as u64 + anchor_counted;
    let checkpoints_verified = check.checkpoints_verified + anchor_counted;
    Ok(VerifyResponse {
        ok: check.first_mismatch.is_none() && checkpoints_verified == checkpoints,
        events: check.chain.events,
        head: check.chain.head_hex(),
        sequence: check.chain.last_sequence,
        first_mismatch: check.first_mismatch,
        checkpoints_verified,
        checkpoints,
        anchor: anchor.map(|a| VerifyAnchor {
            sequence: a.last_sequence,
            events: a.events,
            head: a.head_hex(),
        }),
        checked_from,
        problem: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_domain::chain::Hash;

    fn row(sequence: u64, payload: &[u8], hash: Hash) -> Row {
        Row {
            sequence,
            subject: "lh.evt.x".into(),
            payload: payload.to_vec(),
            hash: hash.to_vec(),
        }
    }

    #[test]
    fn an_expired_row_is_chained_from_its_stored_bytes() {
        let mut honest = Chain::default();
        let h1 = honest.append(1, "lh.evt.x", b"a");
        let h2 = honest.append(2, "lh.evt.x", b"b");
        let mut check = Check {
            chain: Chain::default(),
            first_mismatch: None,
            checkpoints: Vec::new(),
            next_checkpoint: 0,
            checkpoints_verified: 0,
        };
        check.expired(&row(1, b"a", h1));
        assert_eq!(check.first_mismatch, None);
        check.expired(&row(2, b"B", h2));
        assert_eq!(
            check.first_mismatch,
            Some(2),
            "a changed payload breaks its link"
        );
    }
}
