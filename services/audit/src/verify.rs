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
//! Every message chained is also fed to the auditor's stream verifier
//! ([`lh_domain::chain_check`]), which checks each checkpoint on the stream
//! against the pinned keys: a checkpoint in the log signed by any other key
//! fails the run, whether or not the copy holds it.
//!
//! A run may resume from the checkpoint an earlier run verified instead of
//! the genesis or the anchor, whichever is later: it then checks only what
//! came after it (the service keeps that point, see `crate::VerifyState`).
//!
//! The audit copy is read in one repeatable-read transaction, so that a
//! prune committed meanwhile does not remove rows under the reader.
//!
//! What a run finds first is kept with its kind (a copy row that differs,
//! one missing from the copy, one missing from the log, a checkpoint that
//! fails) for the `audit.divergence_detected` event the service records.
//!
//! The request and report types are the contract in `lh_rpc::audit`, so that
//! the gateway can serve the same report without depending on this crate.

use std::collections::VecDeque;
use std::time::Duration;

use lh_bus::Bus;
use lh_domain::chain::{Chain, Hash};
use lh_domain::chain_check::{SignedHead, StreamCheck};
use lh_events::{subject, DivergenceKind};
use lh_rpc::audit::{VerifyAnchor, VerifyBadCheckpoint, VerifyResponse};
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
    /// The same messages, checked as an auditor checks the log: every
    /// checkpoint on it against the pinned keys.
    stream: StreamCheck,
    /// Keys a stored checkpoint must be signed with.
    trusted: Vec<[u8; 32]>,
    /// The first sequence found wrong, and how.
    first_mismatch: Option<(u64, DivergenceKind)>,
    /// The sequence the first stored checkpoint that did not hold signs.
    first_failed_checkpoint: Option<u64>,
    checkpoints: Vec<StoredCheckpoint>,
    /// Index of the first checkpoint not yet checked.
    next_checkpoint: usize,
    checkpoints_verified: u64,
}

impl Check {
    fn mismatch(&mut self, seq: u64, kind: DivergenceKind) {
        if self.first_mismatch.is_none_or(|(first, _)| seq < first) {
            self.first_mismatch = Some((seq, kind));
        }
    }

    /// Checks every stored checkpoint up to the chain's last sequence.
    fn checkpoints_upto_head(&mut self) {
        while let Some(cp) = self.checkpoints.get(self.next_checkpoint) {
            if cp.sequence > self.chain.last_sequence {
                break;
            }
            if cp.holds_for(&self.chain) && cp.signed_by_one_of(&self.trusted) {
                self.checkpoints_verified += 1;
            } else if self.first_failed_checkpoint.is_none() {
                self.first_failed_checkpoint = Some(cp.sequence);
            }
            self.next_checkpoint += 1;
        }
    }

    /// A message the stream delivered, compared with the copy's row for it.
    fn streamed(&mut self, sequence: u64, subject: &str, payload: &[u8], row: Option<Row>) {
        let link = self.chain.append(sequence, subject, payload);
        self.stream.message(sequence, subject, payload);
        match row {
            Some(row) => {
                let same = row.subject == subject
                    && row.payload[..] == payload[..]
                    && row.hash[..] == link[..];
                if !same {
                    self.mismatch(sequence, DivergenceKind::CopyRowDiffers);
                }
            }
            None => self.mismatch(sequence, DivergenceKind::MissingFromCopy),
        }
        self.checkpoints_upto_head();
    }

    /// A row of an event the log no longer holds: only the copy attests
    /// it, so it is chained from its stored bytes; a later checkpoint pins
    /// the result.
    fn expired(&mut self, row: &Row) {
        let link = self.chain.append(row.sequence, &row.subject, &row.payload);
        self.stream
            .message(row.sequence, &row.subject, &row.payload);
        if row.hash[..] != link[..] {
            self.mismatch(row.sequence, DivergenceKind::CopyRowDiffers);
        }
        self.checkpoints_upto_head();
    }
}

/// Where the chain starts: the genesis, a pinned anchor, or the checkpoint
/// an earlier run verified.
enum Start {
    Genesis,
    Anchor(Chain, SignedHead),
    Resume(Chain, SignedHead),
    /// Verification cannot start; the sentence says why.
    Refused(String),
}

fn chain_at(head: &SignedHead) -> Option<Chain> {
    let head_bytes: Hash = hex::decode(&head.head).ok()?.try_into().ok()?;
    Some(Chain {
        head: head_bytes,
        events: head.events,
        last_sequence: head.sequence,
    })
}

async fn start(
    db: &mut PgConnection,
    log_first: u64,
    trusted: &[[u8; 32]],
    resume: Option<&SignedHead>,
) -> sqlx::Result<Start> {
    let anchor = if log_first > 1 {
        anchor::newest_at_or_before(&mut *db, log_first - 1).await?
    } else {
        None
    };
    if let Some(resume) = resume {
        // Behind the anchor the copy may have been pruned: start there.
        let ahead = anchor
            .as_ref()
            .is_none_or(|a| resume.sequence >= a.sequence);
        let signed = StreamCheck::resume_trusting(trusted.to_vec(), resume);
        match (ahead, signed, chain_at(resume)) {
            (true, Ok(_), Some(chain)) => return Ok(Start::Resume(chain, resume.clone())),
            (true, Err(why), _) => {
                tracing::warn!(sequence = resume.sequence, %why, "not resuming from the last verified checkpoint");
            }
            _ => {}
        }
    }
    if log_first <= 1 {
        return Ok(Start::Genesis);
    }
    let Some(anchor) = anchor else {
        return Ok(Start::Refused(format!(
            "no anchor: the log starts at sequence {log_first} and no stored checkpoint covers sequence {} or earlier",
            log_first - 1
        )));
    };
    Ok(match anchor.anchored_chain(trusted) {
        Some(chain) => Start::Anchor(chain, anchor.signed_head()),
        None => Start::Refused(format!(
            "the anchor checkpoint at sequence {} is not signed by a pinned key",
            anchor.sequence
        )),
    })
}

/// What a run found, and what the next run may resume from.
pub(crate) struct Outcome {
    pub report: VerifyResponse,
    /// The last sequence of the audit copy the run verified up to.
    pub upper: u64,
    /// The last checkpoint that verified, when the whole run did.
    pub verified: Option<SignedHead>,
    /// What the run found wrong first, when it found anything.
    pub divergence: Option<(u64, DivergenceKind)>,
}

fn anchor_of(chain: &Chain) -> VerifyAnchor {
    VerifyAnchor {
        sequence: chain.last_sequence,
        events: chain.events,
        head: chain.head_hex(),
    }
}

/// Replays the log up to the audit copy's last sequence and compares.
/// Checkpoints must be signed by one of the `trusted` keys; `resume` is
/// where an earlier run left off (`None`: from the genesis or the anchor).
pub(crate) async fn verify(
    bus: &Bus,
    pool: &PgPool,
    trusted: &[[u8; 32]],
    resume: Option<&SignedHead>,
    run: u64,
) -> anyhow::Result<Outcome> {
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
    // Also after it: the keeper copies only what the log holds, so every
    // honest row of the snapshot is at or below this. A row above it is
    // one the log never held, found without waiting for the stream to
    // stall (which would outlast the caller's request).
    let log_last = bus.last_sequence().await?;

    let (chain, stream, anchor, resumed) = match start(&mut db, log_first, trusted, resume).await? {
        Start::Genesis => (
            Chain::default(),
            StreamCheck::from_genesis_trusting(trusted.to_vec()),
            None,
            None,
        ),
        Start::Anchor(chain, signed) => (
            chain,
            StreamCheck::resume_trusting(trusted.to_vec(), &signed).map_err(anyhow::Error::msg)?,
            Some(chain),
            None,
        ),
        Start::Resume(chain, signed) => (
            chain,
            StreamCheck::resume_trusting(trusted.to_vec(), &signed).map_err(anyhow::Error::msg)?,
            None,
            Some(chain),
        ),
        Start::Refused(problem) => {
            let report = VerifyResponse {
                ok: false,
                events: 0,
                head: Chain::default().head_hex(),
                sequence: 0,
                first_mismatch: None,
                checkpoints_verified: 0,
                checkpoints: 0,
                anchor: None,
                checked_from: log_first,
                events_checked_this_run: 0,
                resumed_from: None,
                first_bad_checkpoint: None,
                run,
                problem: Some(problem),
            };
            return Ok(Outcome {
                report,
                upper,
                verified: None,
                divergence: None,
            });
        }
    };
    let checked_from = chain.last_sequence + 1;
    let mut check = Check {
        chain,
        stream,
        trusted: trusted.to_vec(),
        first_mismatch: None,
        first_failed_checkpoint: None,
        checkpoints: anchor::between(&mut *db, chain.last_sequence, upper).await?,
        next_checkpoint: 0,
        checkpoints_verified: 0,
    };
    if let Some(start) = anchor.or(resumed) {
        // The copy's link where the run starts must be the signed head.
        let stored: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT hash FROM events WHERE sequence = $1")
                .bind(start.last_sequence as i64)
                .fetch_optional(&mut *db)
                .await?;
        match stored {
            Some(hash) if hash[..] != start.head[..] => {
                check.mismatch(start.last_sequence, DivergenceKind::CopyRowDiffers)
            }
            Some(_) => {}
            None => check.mismatch(start.last_sequence, DivergenceKind::MissingFromCopy),
        }
    }

    let mut rows = Rows::new(chain.last_sequence, upper);
    // Only what the log still holds is asked of it.
    let mut feed = if upper.min(log_last) >= checked_from.max(log_first) {
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
                check.mismatch(seq, DivergenceKind::MissingFromStream);
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
        if event.sequence() >= log_last {
            // The rest of the copy, if any, is past the log's end.
            feed = None;
        }
    }

    // The anchor is one of the stored checkpoints, verified by its signature.
    let anchor_counted = u64::from(anchor.is_some());
    let checkpoints = check.checkpoints.len() as u64 + anchor_counted;
    let checkpoints_verified = check.checkpoints_verified + anchor_counted;
    let stream = check.stream.report();
    let first_bad_checkpoint = stream.first_bad.as_ref().map(|bad| {
        metrics::counter!("lh_audit_bad_checkpoints_total").increment(1);
        let reason = serde_json::to_value(bad.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{:?}", bad.reason));
        tracing::error!(sequence = bad.sequence, checkpoint_at = bad.checkpoint_at, %reason,
            "a checkpoint on the log does not hold against the pinned keys");
        VerifyBadCheckpoint {
            sequence: bad.sequence,
            checkpoint_at: bad.checkpoint_at,
            reason,
        }
    });
    let ok = check.first_mismatch.is_none()
        && checkpoints_verified == checkpoints
        && first_bad_checkpoint.is_none();
    // Rows first: a bad checkpoint is often only the echo of a changed row.
    let divergence = check.first_mismatch.or_else(|| {
        (!ok).then(|| {
            let on_stream = first_bad_checkpoint.as_ref().map(|bad| bad.sequence);
            let first = match (check.first_failed_checkpoint, on_stream) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap_or(check.chain.last_sequence),
            };
            (first, DivergenceKind::CheckpointFails)
        })
    });
    let start_events = anchor.or(resumed).map_or(0, |c| c.events);
    let report = VerifyResponse {
        ok,
        events: check.chain.events,
        head: check.chain.head_hex(),
        sequence: check.chain.last_sequence,
        first_mismatch: check.first_mismatch.map(|(seq, _)| seq),
        checkpoints_verified,
        checkpoints,
        anchor: anchor.as_ref().map(anchor_of),
        checked_from,
        events_checked_this_run: check.chain.events - start_events,
        resumed_from: resumed.as_ref().map(anchor_of),
        first_bad_checkpoint,
        run,
        problem: None,
    };
    Ok(Outcome {
        report,
        upper,
        verified: if ok { stream.last_checkpoint } else { None },
        divergence,
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
            stream: StreamCheck::from_genesis_trusting(Vec::new()),
            trusted: Vec::new(),
            first_mismatch: None,
            first_failed_checkpoint: None,
            checkpoints: Vec::new(),
            next_checkpoint: 0,
            checkpoints_verified: 0,
        };
        check.expired(&row(1, b"a", h1));
        assert_eq!(check.first_mismatch, None);
        check.expired(&row(2, b"B", h2));
        assert_eq!(
            check.first_mismatch,
            Some((2, DivergenceKind::CopyRowDiffers)),
            "a changed payload breaks its link"
        );
    }
}
