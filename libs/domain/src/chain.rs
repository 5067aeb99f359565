//! The audit hash chain over the business log, in stream order.
//!
//! `h_0` is 32 zero bytes and, for the event stored at stream sequence `s`
//! on subject `subj` with payload bytes `p`:
//!
//! ```text
//! h_s = SHA-256( h_prev ‖ u64be(s) ‖ u32be(len subj) ‖ subj ‖ u64be(len p) ‖ p )
//! ```
//!
//! Checkpoints sign the statement
//! `leasehold-audit-checkpoint:v1:<sequence>:<events>:<head hex>` with ed25519.
//! The same text is in `schemas/audit-chain.md` for auditors.

use sha2::{Digest, Sha256};

pub type Hash = [u8; 32];

pub const GENESIS: Hash = [0; 32];

pub fn link(prev: &Hash, sequence: u64, subject: &str, payload: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update(prev);
    h.update(sequence.to_be_bytes());
    h.update((subject.len() as u32).to_be_bytes());
    h.update(subject.as_bytes());
    h.update((payload.len() as u64).to_be_bytes());
    h.update(payload);
    h.finalize().into()
}

pub fn checkpoint_statement(sequence: u64, events: u64, head: &Hash) -> String {
    format!(
        "leasehold-audit-checkpoint:v1:{sequence}:{events}:{}",
        hex::encode(head)
    )
}

/// Running state of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    pub head: Hash,
    pub events: u64,
    pub last_sequence: u64,
}

impl Default for Chain {
    fn default() -> Self {
        Self {
            head: GENESIS,
            events: 0,
            last_sequence: 0,
        }
    }
}

impl Chain {
    /// Extends the chain; sequences must strictly increase.
    pub fn append(&mut self, sequence: u64, subject: &str, payload: &[u8]) -> Hash {
        assert!(
            sequence > self.last_sequence,
            "audit chain sequences must increase: {} after {}",
            sequence,
            self.last_sequence
        );
        self.head = link(&self.head, sequence, subject, payload);
        self.events += 1;
        self.last_sequence = sequence;
        self.head
    }

    pub fn head_hex(&self) -> String {
        hex::encode(self.head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_change_changes_the_head() {
        let mut a = Chain::default();
        a.append(1, "lh.evt.x", b"one");
        a.append(2, "lh.evt.x", b"two");
        let mut b = Chain::default();
        b.append(1, "lh.evt.x", b"one");
        b.append(2, "lh.evt.x", b"tw0");
        assert_ne!(a.head, b.head);
        let mut c = Chain::default();
        c.append(1, "lh.evt.x", b"one");
        c.append(2, "lh.evt.x", b"two");
        assert_eq!(a, c);
    }

    #[test]
    #[should_panic]
    fn sequences_must_increase() {
        let mut a = Chain::default();
        a.append(2, "s", b"");
        a.append(2, "s", b"");
    }
}
