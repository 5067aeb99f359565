//! Given what the copy has chained and what the log and the copy hold at
//! their old end, when the keeper decides at some instant, then these
//! checkpoints and prunes.

use chrono::{DateTime, Duration, Utc};
use ed25519_dalek::SigningKey;
use lh_domain::chain::Chain;
use lh_events::{derived_id, Actor, AuditCheckpoint, AuditPruned, EventData, Expect};
use lh_service::decider::{Batch, Decider};

use super::custody::{Custody, Link, OldEnd, PruneCall, Signal};
use super::CheckpointPolicy;
use crate::anchor::StoredCheckpoint;
use crate::signing::{checkpoint_signature_ok, sign_checkpoint};

fn t(s: i64) -> DateTime<Utc> {
    "2026-12-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + Duration::seconds(s)
}

fn key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

fn public_key() -> [u8; 32] {
    key().verifying_key().to_bytes()
}

/// Every 10 messages or every 60 s.
fn policy() -> CheckpointPolicy {
    CheckpointPolicy {
        every_events: 10,
        every: std::time::Duration::from_secs(60),
    }
}

/// A made-up log, chained as the copy chains it.
#[derive(Default)]
struct Log {
    chain: Chain,
}

impl Log {
    /// The links of `n` further messages other than checkpoints.
    fn messages(&mut self, n: u64) -> Vec<Link> {
        (0..n).map(|_| self.message(false)).collect()
    }

    /// The link of one further `audit.checkpoint`.
    fn checkpoint(&mut self) -> Vec<Link> {
        vec![self.message(true)]
    }

    fn message(&mut self, checkpoint: bool) -> Link {
        let sequence = self.chain.last_sequence + 1;
        self.chain
            .append(sequence, "lh.evt.x", format!("m{sequence}").as_bytes());
        Link {
            chain: self.chain,
            checkpoint,
        }
    }
}

/// A keeper starting on an empty copy, at `t(0)`.
fn given_a_fresh_keeper() -> Custody {
    let mut custody = Custody::resumed(key(), policy(), Chain::default(), 0);
    assert_nothing(custody.decide(t(0)));
    custody
}

fn when_chained(custody: &mut Custody, links: Vec<Link>, at: DateTime<Utc>) {
    assert!(custody.signal(Signal::Chained(links), at));
}

/// Asserts that nothing was decided.
#[track_caller]
fn assert_nothing(decided: Vec<Batch>) {
    assert!(decided.is_empty(), "{decided:?}");
}

/// The log stored every batch decided.
fn stored(custody: &mut Custody, decided: &[Batch]) {
    for batch in decided {
        custody.appended(batch);
    }
}

fn checkpoints(batches: &[Batch]) -> Vec<AuditCheckpoint> {
    batches
        .iter()
        .flatten()
        .filter_map(|(envelope, _)| match &envelope.data {
            EventData::AuditCheckpoint(cp) => Some(cp.clone()),
            _ => None,
        })
        .collect()
}

fn prunes(batches: &[Batch]) -> Vec<AuditPruned> {
    batches
        .iter()
        .flatten()
        .filter_map(|(envelope, _)| match &envelope.data {
            EventData::AuditPruned(pruned) => Some(pruned.clone()),
            _ => None,
        })
        .collect()
}

/// The checkpoint the keeper's key signs for `chain`.
fn signed(chain: &Chain) -> AuditCheckpoint {
    AuditCheckpoint {
        sequence: chain.last_sequence,
        head: chain.head_hex(),
        events: chain.events,
        public_key: hex::encode(public_key()),
        signature: hex::encode(
            sign_checkpoint(&key(), chain.last_sequence, chain.events, &chain.head).to_bytes(),
        ),
    }
}

#[test]
fn given_nothing_chained_when_time_passes_then_no_checkpoint() {
    let mut custody = given_a_fresh_keeper();
    assert_nothing(custody.decide(t(3600)));
}

#[test]
fn given_fewer_than_n_messages_when_deciding_then_no_checkpoint_yet() {
    let mut custody = given_a_fresh_keeper();
    let mut log = Log::default();
    when_chained(&mut custody, log.messages(9), t(1));
    assert_nothing(custody.decide(t(1)));
}

#[test]
fn given_the_nth_message_when_deciding_then_a_checkpoint_signs_the_chain_after_it() {
    let mut custody = given_a_fresh_keeper();
    let mut log = Log::default();
    when_chained(&mut custody, log.messages(9), t(1));
    let tenth = log.messages(1);
    let at_tenth = tenth[0].chain;
    // Messages chained in the same run after the tenth do not move it.
    when_chained(&mut custody, [tenth, log.messages(3)].concat(), t(2));
    let decided = custody.decide(t(2));
    assert_eq!(checkpoints(&decided), [signed(&at_tenth)]);
    let (envelope, expect) = &decided[0][0];
    assert_eq!(*expect, Expect::Any);
    assert_eq!(envelope.actor, Actor::Service("lh-audit".into()));
    assert_eq!(envelope.id, derived_id(&["audit-checkpoint", "10"]));
    assert_eq!(envelope.occurred_at, t(2));
    let cp = signed(&at_tenth);
    assert!(checkpoint_signature_ok(
        &public_key(),
        &hex::decode(&cp.signature).unwrap(),
        10,
        10,
        &at_tenth.head
    ));
}

#[test]
fn given_a_backlog_in_one_run_when_deciding_then_one_checkpoint_every_n_messages() {
    let mut custody = given_a_fresh_keeper();
    let mut log = Log::default();
    let links = log.messages(25);
    let (tenth, twentieth) = (links[9].chain, links[19].chain);
    when_chained(&mut custody, links, t(1));
    assert_eq!(
        checkpoints(&custody.decide(t(1))),
        [signed(&tenth), signed(&twentieth)]
    );
}

#[test]
fn given_checkpoints_among_the_messages_when_counting_then_they_are_not_news() {
    let mut custody = given_a_fresh_keeper();
    let mut log = Log::default();
    let mut links = log.messages(5);
    links.extend(log.checkpoint());
    links.extend(log.messages(4));
    when_chained(&mut custody, links, t(1));
    // Nine messages are news, not ten.
    assert_nothing(custody.decide(t(1)));
    let tenth = log.messages(1);
    let at_tenth = tenth[0].chain;
    when_chained(&mut custody, tenth, t(2));
    assert_eq!(checkpoints(&custody.decide(t(2))), [signed(&at_tenth)]);
}

#[test]
fn given_a_few_messages_when_t_has_passed_then_a_checkpoint_signs_the_head() {
    let mut custody = given_a_fresh_keeper();
    let mut log = Log::default();
    when_chained(&mut custody, log.messages(3), t(1));
    // T counts from the keeper's first decision.
    assert_nothing(custody.decide(t(59)));
    assert_eq!(checkpoints(&custody.decide(t(60))), [signed(&log.chain)]);
}

#[test]
fn given_only_its_own_checkpoint_since_when_t_passes_again_then_nothing() {
    let mut custody = given_a_fresh_keeper();
    let mut log = Log::default();
    when_chained(&mut custody, log.messages(3), t(1));
    let decided = custody.decide(t(60));
    stored(&mut custody, &decided);
    // The checkpoint comes back as a message of the copy.
    when_chained(&mut custody, log.checkpoint(), t(61));
    assert_nothing(custody.decide(t(200)));
    // News again, long after the last one: due at once.
    when_chained(&mut custody, log.messages(1), t(201));
    assert_eq!(checkpoints(&custody.decide(t(201))), [signed(&log.chain)]);
}

#[test]
fn given_news_soon_after_a_checkpoint_when_deciding_then_the_next_waits_for_t() {
    let mut custody = given_a_fresh_keeper();
    let mut log = Log::default();
    when_chained(&mut custody, log.messages(3), t(1));
    let decided = custody.decide(t(60));
    stored(&mut custody, &decided);
    when_chained(&mut custody, log.checkpoint(), t(61));
    when_chained(&mut custody, log.messages(2), t(70));
    assert_nothing(custody.decide(t(119)));
    assert_eq!(checkpoints(&custody.decide(t(120))), [signed(&log.chain)]);
}

#[test]
fn given_a_checkpoint_the_log_refused_when_deciding_again_then_the_same_one_goes_out() {
    let mut custody = given_a_fresh_keeper();
    let mut log = Log::default();
    let links = log.messages(10);
    let at_tenth = links[9].chain;
    when_chained(&mut custody, links, t(1));
    assert_eq!(checkpoints(&custody.decide(t(1))), [signed(&at_tenth)]);
    // Not stored: more messages come, and it is still the same head.
    when_chained(&mut custody, log.messages(2), t(2));
    let again = custody.decide(t(3));
    assert_eq!(checkpoints(&again), [signed(&at_tenth)]);
    assert_eq!(again[0][0].0.id, derived_id(&["audit-checkpoint", "10"]));
    stored(&mut custody, &again);
    assert_nothing(custody.decide(t(4)));
}

#[test]
fn given_a_checkpoint_read_back_from_the_log_when_deciding_then_it_is_not_sent_again() {
    let mut custody = given_a_fresh_keeper();
    let mut log = Log::default();
    let links = log.messages(10);
    let at_tenth = links[9].chain;
    when_chained(&mut custody, links, t(1));
    let decided = custody.decide(t(1));
    custody.apply(11, &decided[0][0].0);
    assert_nothing(custody.decide(t(2)));
    assert_eq!(checkpoints(&decided), [signed(&at_tenth)]);
}

#[test]
fn given_links_told_twice_when_counting_then_they_count_once() {
    let mut custody = given_a_fresh_keeper();
    let mut log = Log::default();
    let links = log.messages(6);
    when_chained(&mut custody, links.clone(), t(1));
    when_chained(&mut custody, links, t(1));
    assert_nothing(custody.decide(t(1)));
}

#[test]
fn given_a_resumed_copy_with_n_messages_unsigned_when_deciding_then_its_head_is_signed() {
    let mut log = Log::default();
    log.messages(12);
    let mut custody = Custody::resumed(key(), policy(), log.chain, 12);
    assert_eq!(checkpoints(&custody.decide(t(0))), [signed(&log.chain)]);
}

#[test]
fn given_a_resumed_copy_with_a_few_messages_unsigned_when_t_passes_then_its_head_is_signed() {
    let mut log = Log::default();
    log.messages(3);
    let mut custody = Custody::resumed(key(), policy(), log.chain, 3);
    assert_nothing(custody.decide(t(0)));
    assert_eq!(checkpoints(&custody.decide(t(60))), [signed(&log.chain)]);
}

/// A stored checkpoint at `sequence`, signed by `key`.
fn stored_checkpoint(key: &SigningKey, sequence: u64) -> StoredCheckpoint {
    let head = [sequence as u8; 32];
    StoredCheckpoint {
        sequence,
        events: sequence,
        head: head.to_vec(),
        public_key: key.verifying_key().to_bytes().to_vec(),
        signature: sign_checkpoint(key, sequence, sequence, &head)
            .to_bytes()
            .to_vec(),
    }
}

fn old_end(log_first: u64, copy_oldest: Option<u64>, anchor: Option<u64>) -> OldEnd {
    OldEnd {
        log_first,
        copy_oldest,
        anchor: anchor.map(|sequence| stored_checkpoint(&key(), sequence)),
    }
}

fn when_looked_at(custody: &mut Custody, old_end: OldEnd, at: DateTime<Utc>) -> Vec<Batch> {
    assert!(custody.signal(Signal::OldEnd(old_end), at));
    custody.decide(at)
}

#[test]
fn given_a_log_that_expired_nothing_when_looking_then_no_prune() {
    let mut custody = given_a_fresh_keeper();
    assert_nothing(when_looked_at(
        &mut custody,
        old_end(1, Some(1), None),
        t(1),
    ));
}

#[test]
fn given_expired_events_and_an_anchor_of_ours_when_looking_then_the_copy_is_pruned_below_it() {
    let mut custody = given_a_fresh_keeper();
    let decided = when_looked_at(&mut custody, old_end(40, Some(1), Some(30)), t(1));
    assert_eq!(
        prunes(&decided),
        [AuditPruned {
            below_sequence: 40,
            anchor_checkpoint: 30,
        }]
    );
    let (envelope, expect) = &decided[0][0];
    assert_eq!(*expect, Expect::Any);
    assert_eq!(envelope.id, derived_id(&["audit-pruned", "30"]));
}

#[test]
fn given_expired_events_but_no_checkpoint_before_the_log_start_when_looking_then_no_prune() {
    let old_end = old_end(40, Some(1), None);
    assert_eq!(
        old_end.prune_call(&public_key()),
        PruneCall::NoAnchor {
            log_first: 40,
            copy_oldest: 1
        }
    );
    let mut custody = given_a_fresh_keeper();
    assert_nothing(when_looked_at(&mut custody, old_end, t(1)));
}

#[test]
fn given_a_copy_already_pruned_to_the_anchor_when_looking_then_no_prune() {
    let mut custody = given_a_fresh_keeper();
    assert_nothing(when_looked_at(
        &mut custody,
        old_end(40, Some(30), Some(30)),
        t(1),
    ));
    assert_nothing(when_looked_at(
        &mut custody,
        old_end(40, Some(40), Some(30)),
        t(2),
    ));
}

#[test]
fn given_an_anchor_signed_by_another_key_when_looking_then_no_prune() {
    let other = SigningKey::from_bytes(&[9; 32]);
    let old_end = OldEnd {
        log_first: 40,
        copy_oldest: Some(1),
        anchor: Some(stored_checkpoint(&other, 30)),
    };
    assert_eq!(
        old_end.prune_call(&public_key()),
        PruneCall::NotOurs { anchor: 30 }
    );
    let mut custody = given_a_fresh_keeper();
    assert_nothing(when_looked_at(&mut custody, old_end, t(1)));
}

#[test]
fn given_a_prune_the_log_refused_when_deciding_again_then_it_goes_out_until_stored() {
    let mut custody = given_a_fresh_keeper();
    let decided = when_looked_at(&mut custody, old_end(40, Some(1), Some(30)), t(1));
    assert_eq!(prunes(&decided).len(), 1);
    let again = custody.decide(t(2));
    assert_eq!(prunes(&again), prunes(&decided));
    stored(&mut custody, &again);
    // One look, one prune.
    assert_nothing(custody.decide(t(3)));
}
