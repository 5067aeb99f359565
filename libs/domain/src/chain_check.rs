//! Verifying the audit chain from the log alone, with a pinned key: what an
//! auditor who trusts neither the audit service nor its database runs.
//!
//! The stream holds no links, only the messages, so a message that was
//! changed, dropped or inserted shows up at the first signed checkpoint
//! after it: the checkpoint's `head` or `events` then disagree with the
//! chain recomputed here. That checkpoint's `sequence` is the *first bad
//! sequence*: the earliest point the log can be proven wrong. Every
//! checkpoint is checked in this order, and the first rule it breaks is its
//! [`Breach`]:
//!
//! 1. its data has the five fields, `head` 64 hex digits ([`Breach::MalformedCheckpoint`]);
//! 2. `public_key` is a pinned key ([`Breach::KeyNotPinned`]);
//! 3. `signature` verifies over its own statement ([`Breach::BadSignature`]);
//! 4. `sequence` lies before the checkpoint message itself ([`Breach::NotBeforeCheckpoint`]);
//! 5. the chain at `sequence` is still in memory ([`Breach::OutOfWindow`]);
//! 6. `events` equals the count at `sequence` ([`Breach::EventsMismatch`]):
//!    a dropped message, which leaves a gap in the sequences;
//! 7. `head` equals the link at `sequence` ([`Breach::HeadMismatch`]): a
//!    changed message.
//!
//! The chain "at" a sequence `S` is its state after the last message whose
//! sequence is at most `S` (the spec's count of events "up to and including
//! `S`"). The Python verifier in `tools/audit-verify` implements the same
//! rules from `schemas/audit-chain.md`; `cli/tests/audit_verify.rs` runs both over
//! tampered logs and asks them to agree.
//!
//! No I/O: the caller reads the stream and feeds [`StreamCheck::message`].

use std::collections::VecDeque;

use ed25519_dalek::{Signature, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chain::{checkpoint_statement, Chain, Hash};

/// The event type of a signed checkpoint, in the envelope's `type`.
pub const CHECKPOINT_EVENT_TYPE: &str = "audit.checkpoint";

/// How many past chain states are kept for checkpoints to be compared
/// with: a checkpoint that trails the sequence it signs by more messages
/// than this cannot be checked (the audit service publishes its checkpoint
/// right after the sequence it signs).
pub const MAX_CHECKPOINT_LAG_MESSAGES: usize = 100_000;

/// A checkpoint that verified: where a later run can start from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedHead {
    pub sequence: u64,
    pub events: u64,
    /// 64 lowercase hex digits.
    pub head: String,
    /// 128 lowercase hex digits.
    pub signature: String,
}

impl SignedHead {
    /// `SEQUENCE:EVENTS:HEAD:SIGNATURE`, the form `--resume-from` takes.
    pub fn to_resume_token(&self) -> String {
        format!(
            "{}:{}:{}:{}",
            self.sequence, self.events, self.head, self.signature
        )
    }

    pub fn parse_resume_token(token: &str) -> Result<Self, String> {
        let parts: Vec<&str> = token.trim().split(':').collect();
        let [sequence, events, head, signature] = parts[..] else {
            return Err(format!(
                "{token:?} is not SEQUENCE:EVENTS:HEAD:SIGNATURE (4 fields)"
            ));
        };
        let number = |what: &str, text: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("the {what} {text:?} is not a whole number"))
        };
        Ok(Self {
            sequence: number("sequence", sequence)?,
            events: number("events", events)?,
            head: head.to_ascii_lowercase(),
            signature: signature.to_ascii_lowercase(),
        })
    }
}

/// Why a checkpoint does not hold; see the module's list for the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Breach {
    MalformedCheckpoint,
    KeyNotPinned,
    BadSignature,
    NotBeforeCheckpoint,
    OutOfWindow,
    EventsMismatch,
    HeadMismatch,
}

/// The first checkpoint that did not hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstBad {
    /// The sequence the checkpoint signs (its `data.sequence`).
    pub sequence: u64,
    /// The stream sequence of the checkpoint message itself.
    pub checkpoint_at: u64,
    pub reason: Breach,
}

/// What a run found. The Python verifier prints the same fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamReport {
    pub ok: bool,
    /// The first sequence whose link was recomputed.
    pub checked_from: u64,
    /// The last sequence chained.
    pub sequence: u64,
    pub events: u64,
    pub head: String,
    /// Checkpoints checked (those signing a sequence before `checked_from`
    /// are left out: a resumed run checked them before).
    pub checkpoints: u64,
    pub checkpoints_verified: u64,
    /// `first_bad.sequence`, at the top for scripts.
    pub first_bad_sequence: Option<u64>,
    pub first_bad: Option<FirstBad>,
    /// The first sequence missing between two chained messages.
    pub first_gap: Option<u64>,
    /// The last checkpoint that verified before anything broke: where the
    /// next run can resume.
    pub last_checkpoint: Option<SignedHead>,
    /// The signed checkpoint this run started from, when it resumed.
    pub resumed_from: Option<SignedHead>,
    /// Events after the last verified checkpoint: chained, but no signature
    /// pins them yet.
    pub unsigned_events: u64,
    /// Why verification could not be done or means nothing.
    pub problem: Option<String>,
}

/// One chain state kept for checkpoints that arrive later.
#[derive(Debug, Clone, Copy)]
struct Past {
    sequence: u64,
    events: u64,
    head: Hash,
}

/// The verification engine: feed it the stream's messages in order.
#[derive(Debug, Clone)]
pub struct StreamCheck {
    /// Keys a checkpoint may be signed with: one for an auditor, several
    /// while the service rotates its key.
    pinned: Vec<[u8; 32]>,
    chain: Chain,
    checked_from: u64,
    past: VecDeque<Past>,
    checkpoints: u64,
    checkpoints_verified: u64,
    first_bad: Option<FirstBad>,
    first_gap: Option<u64>,
    last_checkpoint: Option<SignedHead>,
    resumed_from: Option<SignedHead>,
    /// Events count at the last verified checkpoint (or the start).
    signed_events: u64,
}

/// Checks `signature` over the statement of `(sequence, events, head)`
/// with `public_key`; malformed keys and signatures do not verify. Strict
/// (RFC 8032 with canonical encodings, no small-order keys), as libsodium,
/// which the Python verifier uses, checks them.
pub fn signature_holds(
    public_key: &[u8; 32],
    signature_hex: &str,
    sequence: u64,
    events: u64,
    head: &Hash,
) -> bool {
    let Ok(key) = VerifyingKey::from_bytes(public_key) else {
        return false;
    };
    let Some(signature) = hex::decode(signature_hex)
        .ok()
        .and_then(|b| Signature::from_slice(&b).ok())
    else {
        return false;
    };
    key.verify_strict(
        checkpoint_statement(sequence, events, head).as_bytes(),
        &signature,
    )
    .is_ok()
}

fn parse_head(text: &str) -> Option<Hash> {
    if text.len() != 64 {
        return None;
    }
    hex::decode(text).ok()?.try_into().ok()
}

/// Parses a pinned public key: 64 hex digits.
pub fn parse_public_key(text: &str) -> Result<[u8; 32], String> {
    let text = text.trim();
    hex::decode(text)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .filter(|k| VerifyingKey::from_bytes(k).is_ok())
        .ok_or_else(|| format!("{text:?} is not an ed25519 public key (64 hex digits)"))
}

/// The checkpoint fields of a payload whose envelope `type` is
/// [`CHECKPOINT_EVENT_TYPE`]: `None` for any other message, `Some(None)`
/// for a checkpoint whose data is malformed.
fn checkpoint_data(payload: &[u8]) -> Option<Option<Claim>> {
    // Most messages are not checkpoints: parse only those that could be.
    // The search is most of what a message costs beyond its link, so it
    // is a vectorised one.
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(CHECKPOINT_EVENT_TYPE));
    FINDER.find(payload)?;
    let envelope: Value = serde_json::from_slice(payload).ok()?;
    if envelope.get("type").and_then(Value::as_str) != Some(CHECKPOINT_EVENT_TYPE) {
        return None;
    }
    let data = envelope.get("data");
    let field = |name: &str| data.and_then(|d| d.get(name));
    let claim = (|| {
        Some(Claim {
            sequence: field("sequence")?.as_u64()?,
            events: field("events")?.as_u64()?,
            head: parse_head(field("head")?.as_str()?)?,
            public_key: field("public_key")?.as_str()?.to_string(),
            signature: field("signature")?.as_str()?.to_string(),
        })
    })();
    Some(claim)
}

struct Claim {
    sequence: u64,
    events: u64,
    head: Hash,
    public_key: String,
    signature: String,
}

impl StreamCheck {
    /// Starts at the genesis: the stream is read from sequence 1.
    pub fn from_genesis(pinned: [u8; 32]) -> Self {
        Self::from_genesis_trusting(vec![pinned])
    }

    /// Starts at the genesis, trusting checkpoints signed by any of `pinned`.
    pub fn from_genesis_trusting(pinned: Vec<[u8; 32]>) -> Self {
        Self::starting(pinned, Chain::default(), None)
    }

    /// Starts from a checkpoint a previous run verified, after checking its
    /// signature with the pinned key again.
    pub fn resume(pinned: [u8; 32], from: &SignedHead) -> Result<Self, String> {
        Self::resume_trusting(vec![pinned], from)
    }

    /// Resumes from `from`, which one of `pinned` must have signed.
    pub fn resume_trusting(pinned: Vec<[u8; 32]>, from: &SignedHead) -> Result<Self, String> {
        let head = parse_head(&from.head)
            .ok_or_else(|| format!("the resume head {:?} is not 64 hex digits", from.head))?;
        let signed = pinned
            .iter()
            .any(|key| signature_holds(key, &from.signature, from.sequence, from.events, &head));
        if !signed {
            let which = if pinned.len() == 1 { "the" } else { "a" };
            return Err(format!(
                "the checkpoint to resume from (sequence {}) is not signed by {which} pinned key",
                from.sequence
            ));
        }
        let chain = Chain {
            head,
            events: from.events,
            last_sequence: from.sequence,
        };
        Ok(Self::starting(pinned, chain, Some(from.clone())))
    }

    fn starting(pinned: Vec<[u8; 32]>, chain: Chain, resumed_from: Option<SignedHead>) -> Self {
        Self {
            pinned,
            chain,
            checked_from: chain.last_sequence + 1,
            past: VecDeque::from([Past {
                sequence: chain.last_sequence,
                events: chain.events,
                head: chain.head,
            }]),
            checkpoints: 0,
            checkpoints_verified: 0,
            first_bad: None,
            first_gap: None,
            last_checkpoint: resumed_from.clone(),
            resumed_from,
            signed_events: chain.events,
        }
    }

    /// The first sequence to read.
    pub fn checked_from(&self) -> u64 {
        self.checked_from
    }

    /// The last sequence chained.
    pub fn last_sequence(&self) -> u64 {
        self.chain.last_sequence
    }

    /// Chains one message and checks it when it is a checkpoint. Messages
    /// at or before the last chained sequence are ignored (a redelivery).
    pub fn message(&mut self, sequence: u64, subject: &str, payload: &[u8]) {
        if sequence <= self.chain.last_sequence {
            return;
        }
        if sequence > self.chain.last_sequence + 1 && self.first_gap.is_none() {
            self.first_gap = Some(self.chain.last_sequence + 1);
        }
        self.chain.append(sequence, subject, payload);
        self.past.push_back(Past {
            sequence,
            events: self.chain.events,
            head: self.chain.head,
        });
        if self.past.len() > MAX_CHECKPOINT_LAG_MESSAGES {
            self.past.pop_front();
        }
        if let Some(claim) = checkpoint_data(payload) {
            self.checkpoint(sequence, claim);
        }
    }

    /// The chain at `sequence`: after the last message at or before it.
    fn at(&self, sequence: u64) -> Option<Past> {
        let after = self.past.partition_point(|p| p.sequence <= sequence);
        (after > 0).then(|| self.past[after - 1])
    }

    fn checkpoint(&mut self, at: u64, claim: Option<Claim>) {
        let Some(claim) = claim else {
            return self.breach(at, at, Breach::MalformedCheckpoint);
        };
        if claim.sequence < self.checked_from {
            // Signed before where this run started: checked by the run
            // that verified the checkpoint it resumed from.
            return;
        }
        self.checkpoints += 1;
        let signer = parse_public_key(&claim.public_key)
            .ok()
            .filter(|key| self.pinned.contains(key));
        let reason = match signer {
            None => Some(Breach::KeyNotPinned),
            Some(signer)
                if !signature_holds(
                    &signer,
                    &claim.signature,
                    claim.sequence,
                    claim.events,
                    &claim.head,
                ) =>
            {
                Some(Breach::BadSignature)
            }
            Some(_) => None,
        };
        let reason = if reason.is_some() {
            reason
        } else if claim.sequence >= at {
            Some(Breach::NotBeforeCheckpoint)
        } else {
            match self.at(claim.sequence) {
                None => Some(Breach::OutOfWindow),
                Some(past) if past.events != claim.events => Some(Breach::EventsMismatch),
                Some(past) if past.head != claim.head => Some(Breach::HeadMismatch),
                Some(_) => None,
            }
        };
        match reason {
            Some(reason) => self.breach(claim.sequence, at, reason),
            None => {
                self.checkpoints_verified += 1;
                if self.first_bad.is_none() {
                    self.signed_events = claim.events;
                    self.last_checkpoint = Some(SignedHead {
                        sequence: claim.sequence,
                        events: claim.events,
                        head: hex::encode(claim.head),
                        signature: claim.signature.to_ascii_lowercase(),
                    });
                }
            }
        }
    }

    fn breach(&mut self, sequence: u64, checkpoint_at: u64, reason: Breach) {
        if self.first_bad.is_none() {
            self.first_bad = Some(FirstBad {
                sequence,
                checkpoint_at,
                reason,
            });
        }
    }

    /// What was found so far.
    pub fn report(&self) -> StreamReport {
        let unsigned_events = self.chain.events - self.signed_events;
        let problem = (self.first_bad.is_none()
            && self.resumed_from.is_none()
            && self.checkpoints_verified == 0
            && self.chain.events > 0)
            .then(|| {
                format!(
                    "no checkpoint signed by the pinned key covers any of the {} events: nothing pins them",
                    self.chain.events
                )
            });
        StreamReport {
            ok: self.first_bad.is_none() && problem.is_none(),
            checked_from: self.checked_from,
            sequence: self.chain.last_sequence,
            events: self.chain.events,
            head: self.chain.head_hex(),
            checkpoints: self.checkpoints,
            checkpoints_verified: self.checkpoints_verified,
            first_bad_sequence: self.first_bad.as_ref().map(|b| b.sequence),
            first_bad: self.first_bad.clone(),
            first_gap: self.first_gap,
            last_checkpoint: self.last_checkpoint.clone(),
            resumed_from: self.resumed_from.clone(),
            unsigned_events,
            problem,
        }
    }

    /// A report for a run that could not start; `problem` says why.
    pub fn refused(&self, problem: String) -> StreamReport {
        StreamReport {
            ok: false,
            problem: Some(problem),
            ..self.report()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer as _, SigningKey};

    const SUBJECT: &str = "lh.evt.x";

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn checkpoint(signer: &SigningKey, named: &SigningKey, chain: &Chain) -> Vec<u8> {
        let signature = signer
            .sign(checkpoint_statement(chain.last_sequence, chain.events, &chain.head).as_bytes());
        serde_json::to_vec(&serde_json::json!({
            "type": CHECKPOINT_EVENT_TYPE,
            "data": {
                "sequence": chain.last_sequence,
                "events": chain.events,
                "head": chain.head_hex(),
                "public_key": hex::encode(named.verifying_key().to_bytes()),
                "signature": hex::encode(signature.to_bytes()),
            }
        }))
        .unwrap()
    }

    /// Ten events, a checkpoint at 11 signing 10, ten more, one at 22
    /// signing 21. `edit` may change, drop or replace a message.
    fn run(edit: impl Fn(u64, Vec<u8>) -> Option<Vec<u8>>) -> StreamReport {
        let pinned = key(1);
        let mut honest = Chain::default();
        let mut messages = Vec::new();
        for s in 1..=22u64 {
            let payload = if s == 11 || s == 22 {
                checkpoint(&pinned, &pinned, &honest)
            } else {
                format!("{{\"n\":{s}}}").into_bytes()
            };
            honest.append(s, SUBJECT, &payload);
            messages.push((s, payload));
        }
        let mut check = StreamCheck::from_genesis(pinned.verifying_key().to_bytes());
        for (s, payload) in messages {
            if let Some(payload) = edit(s, payload) {
                check.message(s, SUBJECT, &payload);
            }
        }
        check.report()
    }

    #[test]
    fn an_honest_log_verifies_and_names_its_last_checkpoint() {
        let report = run(|_, p| Some(p));
        assert!(report.ok, "{report:?}");
        assert_eq!((report.events, report.sequence), (22, 22));
        assert_eq!(report.checkpoints_verified, 2);
        assert_eq!(report.last_checkpoint.unwrap().sequence, 21);
        assert_eq!(report.unsigned_events, 1);
    }

    #[test]
    fn a_changed_payload_fails_at_the_next_checkpoint() {
        let report = run(|s, p| Some(if s == 15 { b"{\"n\":0}".to_vec() } else { p }));
        let bad = report.first_bad.unwrap();
        assert_eq!((bad.sequence, bad.checkpoint_at), (21, 22));
        assert_eq!(bad.reason, Breach::HeadMismatch);
        assert_eq!(report.last_checkpoint.unwrap().sequence, 10);
        assert!(!report.ok);
    }

    #[test]
    fn a_dropped_message_is_a_gap_and_an_events_mismatch() {
        let report = run(|s, p| (s != 5).then_some(p));
        assert_eq!(report.first_gap, Some(5));
        let bad = report.first_bad.unwrap();
        assert_eq!((bad.sequence, bad.reason), (10, Breach::EventsMismatch));
    }

    #[test]
    fn a_checkpoint_re_signed_with_another_key_is_refused() {
        let other = key(2);
        let report = run(|s, p| {
            if s != 22 {
                return Some(p);
            }
            // The attacker's chain state is the honest one; only the key differs.
            let v: Value = serde_json::from_slice(&p).unwrap();
            let head: Hash = hex::decode(v["data"]["head"].as_str().unwrap())
                .unwrap()
                .try_into()
                .unwrap();
            let chain = Chain {
                head,
                events: 21,
                last_sequence: 21,
            };
            Some(checkpoint(&other, &other, &chain))
        });
        assert_eq!(report.first_bad_sequence, Some(21));
        assert_eq!(report.first_bad.unwrap().reason, Breach::KeyNotPinned);
        assert_eq!(report.checkpoints, 2);
        assert_eq!(report.checkpoints_verified, 1);
    }

    #[test]
    fn any_of_several_pinned_keys_may_sign_and_no_other() {
        // The first checkpoint by the old key, the second by the new one,
        // as during a key rotation.
        let (old, new, stranger) = (key(1), key(2), key(3));
        let mut chain = Chain::default();
        let mut messages = Vec::new();
        for s in 1..=22u64 {
            let payload = match s {
                11 => checkpoint(&old, &old, &chain),
                22 => checkpoint(&new, &new, &chain),
                _ => format!("{{\"n\":{s}}}").into_bytes(),
            };
            chain.append(s, SUBJECT, &payload);
            messages.push((s, payload));
        }
        let check_with = |pinned: Vec<[u8; 32]>| {
            let mut check = StreamCheck::from_genesis_trusting(pinned);
            for (s, payload) in &messages {
                check.message(*s, SUBJECT, payload);
            }
            check.report()
        };
        let both = [
            old.verifying_key().to_bytes(),
            new.verifying_key().to_bytes(),
        ];
        let report = check_with(both.to_vec());
        assert!(report.ok, "{report:?}");
        assert_eq!(report.checkpoints_verified, 2);

        let report = check_with(vec![both[0], stranger.verifying_key().to_bytes()]);
        let bad = report.first_bad.unwrap();
        assert_eq!((bad.sequence, bad.reason), (21, Breach::KeyNotPinned));

        let from = check_with(both.to_vec()).last_checkpoint.unwrap();
        assert!(StreamCheck::resume_trusting(both.to_vec(), &from).is_ok());
        assert!(StreamCheck::resume_trusting(vec![both[0]], &from).is_err());
    }

    #[test]
    fn a_log_without_checkpoints_is_not_ok() {
        let report = run(|s, p| (s != 11 && s != 22).then_some(p));
        assert!(!report.ok);
        assert!(report.problem.unwrap().contains("no checkpoint"));
    }

    #[test]
    fn a_resumed_run_rechecks_the_signature_and_continues() {
        let first = run(|_, p| Some(p));
        let from = first.last_checkpoint.unwrap();
        let pinned = key(1).verifying_key().to_bytes();
        let mut check = StreamCheck::resume(pinned, &from).unwrap();
        assert_eq!(check.checked_from(), 22);
        let token = SignedHead::parse_resume_token(&from.to_resume_token()).unwrap();
        assert_eq!(token, from);
        check.message(22, SUBJECT, b"{}");
        let report = check.report();
        assert!(report.ok, "{report:?}");
        assert_eq!(report.events, 22);
        let forged = SignedHead {
            events: from.events + 1,
            ..from
        };
        assert!(StreamCheck::resume(pinned, &forged).is_err());
        assert!(StreamCheck::resume(key(2).verifying_key().to_bytes(), &token).is_err());
    }
}
