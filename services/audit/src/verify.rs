//! Chain verification: the answer to "has anything in the log or in the
//! audit copy been changed?".
//!
//! The stream is replayed from sequence 1 up to the last sequence the keeper
//! stored, the chain is recomputed from the raw stream payloads, and each link
//! is compared with the row Postgres holds (same subject, same payload bytes,
//! same hash). Stored checkpoints are then checked against the recomputed
//! chain and their ed25519 signature. Two copies and the signed heads must
//! agree: changing either copy, or both without the key, shows up.
//!
//! The request and report types are the contract in `lh_rpc::audit`, so that
//! the gateway can serve the same report without depending on this crate.

use std::collections::VecDeque;
use std::time::Duration;

use lh_bus::Bus;
use lh_domain::chain::{Chain, Hash};
use lh_events::subject;
use lh_rpc::audit::VerifyResponse;
use sqlx::PgPool;

use crate::signing::checkpoint_signature_ok;

/// Rows read from Postgres per query while merging with the stream.
const ROWS_PER_PAGE: i64 = 1_000;
/// How long the stream may stay silent before the events the audit copy
/// holds are declared missing from it.
const STREAM_STALL_TIMEOUT: Duration = Duration::from_secs(10);

struct StoredCheckpoint {
    sequence: u64,
    events: u64,
    head: Vec<u8>,
    public_key: Vec<u8>,
    signature: Vec<u8>,
}

impl StoredCheckpoint {
    fn holds_for(&self, chain: &Chain) -> bool {
        let Ok(head) = Hash::try_from(self.head.as_slice()) else {
            return false;
        };
        head == chain.head
            && self.events == chain.events
            && self.sequence == chain.last_sequence
            && checkpoint_signature_ok(
                &self.public_key,
                &self.signature,
                self.sequence,
                self.events,
                &head,
            )
    }
}

/// One row of the audit copy.
struct Row {
    sequence: u64,
    subject: String,
    payload: Vec<u8>,
    hash: Vec<u8>,
}

/// The audit copy read in sequence order, a page at a time.
struct Rows<'a> {
    pool: &'a PgPool,
    upper: u64,
    after: u64,
    page: VecDeque<Row>,
}

impl<'a> Rows<'a> {
    fn new(pool: &'a PgPool, upper: u64) -> Self {
        Self {
            pool,
            upper,
            after: 0,
            page: VecDeque::new(),
        }
    }

    async fn peek(&mut self) -> sqlx::Result<Option<&Row>> {
        if self.page.is_empty() && self.after < self.upper {
            let rows: Vec<(i64, String, Vec<u8>, Vec<u8>)> = sqlx::query_as(
                "SELECT sequence, subject, payload, hash FROM events
                 WHERE sequence > $1 AND sequence <= $2 ORDER BY sequence LIMIT $3",
            )
            .bind(self.after as i64)
            .bind(self.upper as i64)
            .bind(ROWS_PER_PAGE)
            .fetch_all(self.pool)
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

    fn pop(&mut self) {
        self.page.pop_front();
    }
}

/// Replays the log up to the audit copy's last sequence and compares.
pub(crate) async fn verify(bus: &Bus, pool: &PgPool) -> anyhow::Result<VerifyResponse> {
    let upper: i64 = sqlx::query_scalar("SELECT coalesce(max(sequence), 0) FROM events")
        .fetch_one(pool)
        .await?;
    let upper = upper as u64;
    let checkpoints: Vec<StoredCheckpoint> =
        sqlx::query_as::<_, (i64, i64, Vec<u8>, Vec<u8>, Vec<u8>)>(
            "SELECT sequence, events, head, public_key, signature FROM checkpoints
         WHERE sequence <= $1 ORDER BY sequence",
        )
        .bind(upper as i64)
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(
            |(sequence, events, head, public_key, signature)| StoredCheckpoint {
                sequence: sequence as u64,
                events: events as u64,
                head,
                public_key,
                signature,
            },
        )
        .collect();

    let mut chain = Chain::default();
    let mut first_mismatch: Option<u64> = None;
    let mut mismatch = |seq: u64| {
        if first_mismatch.is_none_or(|first| seq < first) {
            first_mismatch = Some(seq);
        }
    };
    let mut checkpoints_verified = 0u64;
    let mut next_checkpoint = checkpoints.iter().peekable();
    let mut rows = Rows::new(pool, upper);

    if upper > 0 {
        let mut feed = bus.reread(&[subject::EVENTS_ALL], 1).await?;
        loop {
            // Every stored message, decodable or not: the chain covers them all.
            let Some(event) = feed.next_item_within(STREAM_STALL_TIMEOUT).await else {
                // The audit copy holds events the stream does not deliver.
                mismatch(rows.peek().await?.map_or(upper, |r| r.sequence));
                break;
            };
            let event = event?;
            if event.sequence() > upper {
                mismatch(rows.peek().await?.map_or(upper, |r| r.sequence));
                break;
            }
            let link = chain.append(event.sequence(), event.subject(), event.payload());
            // Rows the stream skipped over: the copy holds what the log lacks.
            while let Some(row) = rows.peek().await? {
                if row.sequence >= event.sequence() {
                    break;
                }
                let seq = row.sequence;
                mismatch(seq);
                rows.pop();
            }
            match rows.peek().await? {
                Some(row) if row.sequence == event.sequence() => {
                    let same = row.subject == event.subject()
                        && row.payload[..] == event.payload()[..]
                        && row.hash[..] == link[..];
                    if !same {
                        mismatch(event.sequence());
                    }
                    rows.pop();
                }
                // The copy lacks this event.
                _ => mismatch(event.sequence()),
            }
            while let Some(cp) = next_checkpoint.next_if(|cp| cp.sequence <= event.sequence()) {
                if cp.holds_for(&chain) {
                    checkpoints_verified += 1;
                }
            }
            if event.sequence() == upper {
                break;
            }
        }
    }

    let checkpoints_total = checkpoints.len() as u64;
    Ok(VerifyResponse {
        ok: first_mismatch.is_none() && checkpoints_verified == checkpoints_total,
        events: chain.events,
        head: chain.head_hex(),
        sequence: chain.last_sequence,
        first_mismatch,
        checkpoints_verified,
        checkpoints: checkpoints_total,
    })
}
