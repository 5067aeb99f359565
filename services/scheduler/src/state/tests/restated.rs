//! A scheduler that starts after the log's first events expired knows from
//! the restatements what one that folded the whole history knows.

use super::given::*;

fn stated(sequence: u64, data: EventData) -> StatedEvent {
    let envelope = env(data);
    StatedEvent {
        sequence,
        stored_at: envelope.occurred_at,
        envelope: Box::new(envelope),
    }
}

/// The history of a tenant, a node and three leases (one placed, two
/// waiting in request order), with each subject's restatement.
fn history() -> (Vec<StatedEvent>, Vec<EventData>) {
    let (t, a, b, c) = (
        Uuid::from_u128(1),
        Uuid::from_u128(10),
        Uuid::from_u128(11),
        Uuid::from_u128(12),
    );
    let events = vec![
        stated(1, tenant(t, 8)),
        stated(2, node("a", 2)),
        stated(3, request(a, t, 1)),
        stated(4, request(c, t, 2)),
        stated(
            5,
            EventData::LeasePlaced(fixtures::placed(a, "a", "z", fixtures::MODEL, 40, &[1])),
        ),
        stated(6, started(a, Utc::now())),
        stated(7, request(b, t, 2)),
    ];
    let subjects: Vec<String> = events
        .iter()
        .map(|e| e.envelope.data.aggregate_subject())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let restatements = subjects
        .iter()
        .map(|subject| {
            let on: Vec<StatedEvent> = events
                .iter()
                .filter(|e| &e.envelope.data.aggregate_subject() == subject)
                .cloned()
                .collect();
            lh_domain::restate::restatement(&on).unwrap()
        })
        .collect();
    (events, restatements)
}

fn summary(s: &State) -> Vec<(Uuid, Status, u64, Option<String>)> {
    let mut v: Vec<_> = s
        .leases
        .values()
        .map(|l| {
            (
                l.id,
                l.status.clone(),
                l.requested_sequence,
                l.node_id.clone(),
            )
        })
        .collect();
    v.sort_by_key(|x| x.0);
    v
}

#[test]
fn restatements_alone_give_the_state_the_whole_history_gives() {
    let (events, restatements) = history();
    let mut whole = Given::default();
    for e in &events {
        whole.apply(e.sequence, &e.envelope);
    }
    let mut fresh = Given::default();
    for (i, r) in restatements.iter().enumerate() {
        fresh.apply(100 + i as u64, &env(r.clone()));
    }
    assert_eq!(summary(&fresh), summary(&whole));
    assert_eq!(fresh.fleet.holdings, whole.fleet.holdings);
    assert_eq!(fresh.fleet.nodes, whole.fleet.nodes);
    assert_eq!(fresh.tenants.len(), 1);
    // The same decisions: the queue keeps its order (c asked before b).
    assert_eq!(events_of(&decide(&fresh)), events_of(&decide(&whole)));

    // To a scheduler that knows the history they add nothing but the
    // subjects' newest sequences.
    let before = summary(&whole);
    for (i, r) in restatements.iter().enumerate() {
        whole.apply(100 + i as u64, &env(r.clone()));
    }
    assert_eq!(summary(&whole), before);
    assert!(whole.leases.values().all(|l| l.subject_sequence >= 100));
}

#[test]
fn a_snapshot_taken_back_gives_the_same_state_and_decisions() {
    let (events, _) = history();
    let mut whole = Given::default();
    for e in &events {
        whole.apply(e.sequence, &e.envelope);
    }
    let bytes = serde_json::to_vec(&whole.snapshot()).unwrap();
    let mut restored = Given::default();
    assert!(restored.restore(serde_json::from_slice(&bytes).unwrap()));
    assert_eq!(summary(&restored), summary(&whole));
    assert_eq!(restored.fleet.holdings, whole.fleet.holdings);
    assert_eq!(restored.fleet.nodes, whole.fleet.nodes);
    assert_eq!(restored.waiting_count(), whole.waiting_count());
    assert_eq!(events_of(&decide(&restored)), events_of(&decide(&whole)));
    assert!(!State::default().restore(serde_json::json!({"fleet": 1})));
}

#[test]
fn a_node_s_start_restated_counts_the_lease_time_its_first_folding_did() {
    let skew = Duration::seconds(30);
    let (t, a) = (Uuid::from_u128(1), Uuid::from_u128(10));
    let stored: DateTime<Utc> = "2026-12-03T10:00:00Z".parse().unwrap();
    let mut events = vec![
        stated(1, tenant(t, 8)),
        stated(2, node("a", 2)),
        stated(3, request(a, t, 1)),
        stated(
            4,
            EventData::LeasePlaced(fixtures::placed(a, "a", "z", fixtures::MODEL, 40, &[1])),
        ),
    ];
    // Its node says it started two hours before the log stored that.
    let data = started(a, stored - Duration::hours(2));
    let start = StatedEvent {
        sequence: 5,
        stored_at: stored,
        envelope: Box::new(Envelope::new(Actor::Node("a".into()), stored, data)),
    };
    events.push(start);
    // Each event as the decide loop folds it: held to when it was stored.
    let fold = |state: &mut State, sequence, stored_at, envelope: &Envelope| {
        state.apply(sequence, &envelope.held_to_the_log(stored_at, skew));
    };
    let mut whole = State::default();
    for e in &events {
        fold(&mut whole, e.sequence, e.stored_at, &e.envelope);
    }
    let lease_events: Vec<StatedEvent> = events
        .iter()
        .filter(|e| e.envelope.data.aggregate_subject() == subject::lease(a))
        .cloned()
        .collect();
    let mut fresh = State::default();
    for (i, e) in events[..2].iter().enumerate() {
        fold(&mut fresh, i as u64 + 1, e.stored_at, &e.envelope);
    }
    let restated = lh_domain::restate::restatement(&lease_events).unwrap();
    let by_restater = Envelope::new(Actor::Service(SERVICE.into()), Utc::now(), restated);
    fold(&mut fresh, 100, Utc::now(), &by_restater);
    let hour_later = stored + Duration::hours(1);
    let owed = whole.availability.up_to(hour_later)[&t].owed_ms;
    // Counted from its storing less the skew, by both.
    assert_eq!(owed, (3600 + 30) * 1000);
    assert_eq!(fresh.availability.up_to(hour_later)[&t].owed_ms, owed);
}
