//! What verification rests on once the log's oldest events have expired:
//! the newest signed checkpoint at or before the log's first sequence minus
//! one. Its head, pinned by its signature, stands in for the chain before it.

use lh_bus::Bus;
use lh_domain::chain::{Chain, Hash};
use lh_domain::chain_check::SignedHead;
use lh_events::subject;

use crate::signing::checkpoint_signature_ok;

/// A row of `checkpoints`.
#[derive(Debug, Clone)]
pub(crate) struct StoredCheckpoint {
    pub sequence: u64,
    pub events: u64,
    pub head: Vec<u8>,
    pub public_key: Vec<u8>,
    pub signature: Vec<u8>,
}

type CheckpointRow = (i64, i64, Vec<u8>, Vec<u8>, Vec<u8>);

impl From<CheckpointRow> for StoredCheckpoint {
    fn from((sequence, events, head, public_key, signature): CheckpointRow) -> Self {
        Self {
            sequence: sequence as u64,
            events: events as u64,
            head,
            public_key,
            signature,
        }
    }
}

impl StoredCheckpoint {
    fn stated_head(&self) -> Option<Hash> {
        Hash::try_from(self.head.as_slice()).ok()
    }

    fn signature_ok(&self, head: &Hash) -> bool {
        checkpoint_signature_ok(
            &self.public_key,
            &self.signature,
            self.sequence,
            self.events,
            head,
        )
    }

    /// True when the recomputed `chain` stands where this checkpoint says
    /// and the signature covers it.
    pub fn holds_for(&self, chain: &Chain) -> bool {
        let Some(head) = self.stated_head() else {
            return false;
        };
        head == chain.head
            && self.events == chain.events
            && self.sequence == chain.last_sequence
            && self.signature_ok(&head)
    }

    /// True when the stored key is one of the `trusted`: the stored key
    /// names the signer, only pinning it makes it trusted.
    pub fn signed_by_one_of(&self, trusted: &[[u8; 32]]) -> bool {
        trusted.iter().any(|key| self.public_key[..] == key[..])
    }

    /// The checkpoint as a resume point for the stream verifier.
    pub fn signed_head(&self) -> SignedHead {
        SignedHead {
            sequence: self.sequence,
            events: self.events,
            head: hex::encode(&self.head),
            signature: hex::encode(&self.signature),
        }
    }

    /// The chain as this checkpoint states it, when one of the `trusted`
    /// keys signed it.
    pub fn anchored_chain(&self, trusted: &[[u8; 32]]) -> Option<Chain> {
        let head = self.stated_head()?;
        (self.signed_by_one_of(trusted) && self.signature_ok(&head)).then_some(Chain {
            head,
            events: self.events,
            last_sequence: self.sequence,
        })
    }
}

const CHECKPOINT_COLUMNS: &str = "sequence, events, head, public_key, signature";

/// The newest stored checkpoint covering `sequence` or less.
pub(crate) async fn newest_at_or_before(
    db: impl sqlx::PgExecutor<'_>,
    sequence: u64,
) -> sqlx::Result<Option<StoredCheckpoint>> {
    let row: Option<CheckpointRow> = sqlx::query_as(&format!(
        "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints
         WHERE sequence <= $1 ORDER BY sequence DESC LIMIT 1"
    ))
    .bind(sequence as i64)
    .fetch_optional(db)
    .await?;
    Ok(row.map(StoredCheckpoint::from))
}

/// Stored checkpoints with `after < sequence <= upto`, oldest first.
pub(crate) async fn between(
    db: impl sqlx::PgExecutor<'_>,
    after: u64,
    upto: u64,
) -> sqlx::Result<Vec<StoredCheckpoint>> {
    let rows: Vec<CheckpointRow> = sqlx::query_as(&format!(
        "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints
         WHERE sequence > $1 AND sequence <= $2 ORDER BY sequence"
    ))
    .bind(after as i64)
    .bind(upto as i64)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(StoredCheckpoint::from).collect())
}

/// The oldest sequence the business log still holds: 1 (or 0 when it was
/// never written) until events expire, then above 1.
pub(crate) async fn log_first_sequence(bus: &Bus) -> anyhow::Result<u64> {
    let mut stream = bus.jetstream().get_stream(subject::EVENTS_STREAM).await?;
    Ok(stream.info().await?.state.first_sequence)
}
