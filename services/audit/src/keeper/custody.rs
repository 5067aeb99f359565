//! The keeper's two decisions, without I/O: when to sign the chain head and
//! publish `audit.checkpoint`, and when to publish `audit.pruned`.
//!
//! What it decides on comes as signals: the chain after each message the
//! copy committed ([`Signal::Chained`]), and, every prune interval, what
//! the log and the copy hold at their old end ([`Signal::OldEnd`]). From
//! the log it reads back only its own events, to know which of its
//! decisions are stored. Signing is pure (an ed25519 signature is a
//! function of the key and the statement), so the signed event is built
//! here too.
//!
//! A checkpoint is due after every N messages other than checkpoints, at
//! exactly the N-th, or after T with at least one such message, at the
//! head. Its own checkpoints are messages too, but no news: a quiet log
//! gets one timed checkpoint, not one every T. A decision is published
//! again (the same event, the same id) until the log holds it.

use chrono::{DateTime, Utc};
use ed25519_dalek::SigningKey;
use lh_domain::chain::Chain;
use lh_events::{derived_id, Actor, AuditCheckpoint, AuditPruned, Envelope, EventData, Expect};
use lh_service::decider::{Batch, Decider};

use super::CheckpointPolicy;
use crate::anchor::StoredCheckpoint;
use crate::signing::sign_checkpoint;
use crate::SERVICE;

/// One message the copy holds, with the chain after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Link {
    pub chain: Chain,
    /// Recorded as an `audit.checkpoint`: not news to sign.
    pub checkpoint: bool,
}

/// What the log and the copy hold at their old end.
#[derive(Debug, Clone)]
pub(crate) struct OldEnd {
    /// The oldest sequence the log still holds (1 until events expire).
    pub log_first: u64,
    /// The oldest sequence the copy still holds.
    pub copy_oldest: Option<u64>,
    /// The newest stored checkpoint at or before `log_first - 1`: the one
    /// verification would rest on.
    pub anchor: Option<StoredCheckpoint>,
}

/// What the keeper hears besides its own events on the log.
pub(crate) enum Signal {
    /// Messages the copy committed, in stream order.
    Chained(Vec<Link>),
    OldEnd(OldEnd),
}

/// What the old end of the log and the copy call for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PruneCall {
    /// Nothing expired, or the copy holds nothing below the anchor.
    Nothing,
    /// The log's oldest events expired before a checkpoint covered them:
    /// verification has no anchor, and the copy is kept whole.
    NoAnchor {
        log_first: u64,
        copy_oldest: u64,
    },
    /// The anchor was signed by another key: not pruning on it.
    NotOurs {
        anchor: u64,
    },
    Prune(AuditPruned),
}

impl OldEnd {
    /// Whether the copy can be pruned below an anchor this key signed.
    pub fn prune_call(&self, public_key: &[u8; 32]) -> PruneCall {
        if self.log_first <= 1 {
            return PruneCall::Nothing;
        }
        let Some(copy_oldest) = self.copy_oldest.filter(|&s| s < self.log_first) else {
            return PruneCall::Nothing;
        };
        let Some(anchor) = &self.anchor else {
            return PruneCall::NoAnchor {
                log_first: self.log_first,
                copy_oldest,
            };
        };
        if anchor.sequence <= copy_oldest {
            return PruneCall::Nothing;
        }
        if anchor.anchored_chain(&[*public_key]).is_none() {
            return PruneCall::NotOurs {
                anchor: anchor.sequence,
            };
        }
        PruneCall::Prune(AuditPruned {
            below_sequence: self.log_first,
            anchor_checkpoint: anchor.sequence,
        })
    }
}

/// The keeper's decisions and what they rest on.
pub(crate) struct Custody {
    key: SigningKey,
    public_key: [u8; 32],
    policy: CheckpointPolicy,
    /// The chain after the newest message the copy holds.
    head: Chain,
    /// Messages other than checkpoints chained after the newest checkpoint
    /// decided.
    since_checkpoint: u64,
    /// When the newest checkpoint was decided, or the keeper first decided
    /// at all: T counts from here.
    last_checkpoint_at: Option<DateTime<Utc>>,
    /// Chain heads a checkpoint was decided for that the log does not hold
    /// yet, oldest first.
    unsent_checkpoints: Vec<Chain>,
    /// The old end as last looked at, not decided on yet.
    old_end: Option<OldEnd>,
    /// A prune decided that the log does not hold yet.
    unsent_prune: Option<AuditPruned>,
}

impl Custody {
    /// A keeper resuming on a copy whose chain stands at `head`, holding
    /// `since_checkpoint` messages other than checkpoints after the newest
    /// checkpoint.
    pub fn resumed(
        key: SigningKey,
        policy: CheckpointPolicy,
        head: Chain,
        since_checkpoint: u64,
    ) -> Self {
        Self {
            public_key: key.verifying_key().to_bytes(),
            key,
            policy,
            head,
            since_checkpoint,
            last_checkpoint_at: None,
            unsent_checkpoints: Vec::new(),
            old_end: None,
            unsent_prune: None,
        }
    }

    /// Folds messages the copy committed; a message at or before the head
    /// (told twice) changes nothing.
    fn chained(&mut self, links: Vec<Link>, now: DateTime<Utc>) {
        for link in links {
            if link.chain.last_sequence <= self.head.last_sequence {
                continue;
            }
            self.head = link.chain;
            if link.checkpoint {
                continue;
            }
            self.since_checkpoint += 1;
            if self.since_checkpoint >= self.policy.every_events {
                self.checkpoint_at_head(now);
            }
        }
    }

    fn checkpoint_at_head(&mut self, now: DateTime<Utc>) {
        self.unsent_checkpoints.push(self.head);
        self.since_checkpoint = 0;
        self.last_checkpoint_at = Some(now);
    }

    /// The signed `audit.checkpoint` for the chain at `chain`.
    fn checkpoint_event(&self, chain: &Chain, now: DateTime<Utc>) -> Envelope {
        let signature = sign_checkpoint(&self.key, chain.last_sequence, chain.events, &chain.head);
        let data = EventData::AuditCheckpoint(AuditCheckpoint {
            sequence: chain.last_sequence,
            head: chain.head_hex(),
            events: chain.events,
            public_key: hex::encode(self.public_key),
            signature: hex::encode(signature.to_bytes()),
        });
        // One id per head: a checkpoint published twice (a retry, a
        // restart) is stored once within the log's duplicate window.
        let id = derived_id(&["audit-checkpoint", &chain.last_sequence.to_string()]);
        Envelope::new_with_id(id, Actor::Service(SERVICE.into()), now, data)
    }

    fn pruned_event(pruned: &AuditPruned, now: DateTime<Utc>) -> Envelope {
        // One id per anchor: a prune decided twice is stored once within
        // the log's duplicate window, and applying it twice deletes
        // nothing more.
        let id = derived_id(&["audit-pruned", &pruned.anchor_checkpoint.to_string()]);
        Envelope::new_with_id(
            id,
            Actor::Service(SERVICE.into()),
            now,
            EventData::AuditPruned(pruned.clone()),
        )
    }

    /// Forgets a decision the log now holds.
    fn stored(&mut self, data: &EventData) {
        match data {
            EventData::AuditCheckpoint(cp) => self
                .unsent_checkpoints
                .retain(|chain| chain.last_sequence != cp.sequence),
            EventData::AuditPruned(pruned) if self.unsent_prune.as_ref() == Some(pruned) => {
                self.unsent_prune = None
            }
            _ => {}
        }
    }
}

impl Decider for Custody {
    type Signal = Signal;

    fn name(&self) -> &'static str {
        SERVICE
    }

    fn filters(&self) -> &[&'static str] {
        &[lh_events::subject::AUDIT_ALL]
    }

    fn apply(&mut self, _sequence: u64, envelope: &Envelope) {
        self.stored(&envelope.data);
    }

    fn signal(&mut self, signal: Signal, now: DateTime<Utc>) -> bool {
        match signal {
            Signal::Chained(links) => self.chained(links, now),
            Signal::OldEnd(old_end) => self.old_end = Some(old_end),
        }
        true
    }

    fn decide(&mut self, now: DateTime<Utc>) -> Vec<Batch> {
        let since = *self.last_checkpoint_at.get_or_insert(now);
        let elapsed = (now - since).to_std().unwrap_or_default();
        if self.since_checkpoint > 0
            && (self.since_checkpoint >= self.policy.every_events || elapsed >= self.policy.every)
        {
            self.checkpoint_at_head(now);
        }
        if let Some(old_end) = self.old_end.take() {
            match old_end.prune_call(&self.public_key) {
                PruneCall::Nothing => {}
                PruneCall::NoAnchor {
                    log_first,
                    copy_oldest,
                } => tracing::warn!(
                    log_first,
                    oldest = copy_oldest,
                    "the log's oldest events expired before a checkpoint covered them: verification has no anchor; the audit copy is kept whole"
                ),
                PruneCall::NotOurs { anchor } => tracing::warn!(
                    anchor,
                    "the checkpoint at this sequence is not signed by this service's key: not pruning on it; will look again"
                ),
                PruneCall::Prune(pruned) => self.unsent_prune = Some(pruned),
            }
        }
        let checkpoints = self
            .unsent_checkpoints
            .iter()
            .map(|chain| vec![(self.checkpoint_event(chain, now), Expect::Any)]);
        let prune = self
            .unsent_prune
            .iter()
            .map(|pruned| vec![(Self::pruned_event(pruned, now), Expect::Any)]);
        checkpoints.chain(prune).collect()
    }

    fn appended(&mut self, batch: &Batch) {
        for (envelope, _) in batch {
            match &envelope.data {
                EventData::AuditCheckpoint(cp) => {
                    metrics::counter!("lh_audit_checkpoints_total").increment(1);
                    tracing::info!(
                        sequence = cp.sequence,
                        events = cp.events,
                        head = %cp.head,
                        "audit checkpoint signed"
                    );
                }
                EventData::AuditPruned(pruned) => tracing::info!(
                    below_sequence = pruned.below_sequence,
                    anchor_checkpoint = pruned.anchor_checkpoint,
                    "audit copy prune published"
                ),
                _ => {}
            }
            self.stored(&envelope.data);
        }
    }
}
