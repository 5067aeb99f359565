//! Tests of the charges fold, its plans and the decide loop shell.

use chrono::{DateTime, TimeZone, Utc};
use lh_domain::rating;
use lh_events::*;
use lh_service::decider::{fold_stored, Decider};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::decider::*;
use super::fold::*;
use super::plan::*;

fn env(data: EventData) -> Envelope {
    Envelope::new(Actor::Admin, Utc::now(), data)
}

fn t(h: u32, m: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 2, h, m, s).unwrap()
}

fn lease_events(
    lease_id: Uuid,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    reason: EndReason,
) -> Vec<Envelope> {
    let tenant = Uuid::from_u128(7);
    vec![
        env(EventData::LeaseRequested(fixtures::whole_request(
            lease_id,
            tenant,
            2,
            fixtures::MODEL,
        ))),
        env(EventData::LeasePlaced(fixtures::placed(
            lease_id,
            "n1",
            "z",
            fixtures::MODEL,
            40,
            &[0, 1],
        ))),
        env(EventData::LeaseStarted(fixtures::started(
            lease_id, "n1", start,
        ))),
        env(EventData::LeaseEnded(fixtures::ended(
            lease_id, "n1", end, reason,
        ))),
    ]
}

/// A horizon after every lease of these tests.
const LATER: DateTime<Utc> = DateTime::<Utc>::MAX_UTC;
const GRACE: chrono::Duration = chrono::Duration::seconds(300);

/// The leases with charges due once every hour is over.
fn due(f: &ChargingState) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = f
        .leases
        .keys()
        .copied()
        .filter(|id| matches!(f.plan_until(*id, LATER), Plan::Publish(_)))
        .collect();
    ids.sort();
    ids
}

fn fold(events: &[Envelope]) -> ChargingState {
    let mut f = ChargingState::default();
    for (i, e) in events.iter().enumerate() {
        f.apply(i as u64 + 1, e);
    }
    f
}

fn book(version: u32, from: DateTime<Utc>, price: &str) -> Envelope {
    let mut b = rating::default_price_book(from);
    b.version = version;
    b.tiers[0].price_cny_per_gb_hour = price.parse().unwrap();
    env(EventData::PriceBookPublished(b))
}

#[test]
fn an_ended_lease_is_due_until_its_charge_is_seen() {
    let lease = Uuid::from_u128(1);
    let mut events = vec![book(1, t(0, 0, 0), "0.5")];
    events.extend(lease_events(
        lease,
        t(10, 0, 0),
        t(10, 1, 30),
        EndReason::Stopped,
    ));
    let mut f = fold(&events);
    assert_eq!(due(&f), vec![lease]);
    let Plan::Publish(bill) = f.plan_until(lease, LATER) else {
        panic!("expected a bill")
    };
    assert_eq!(bill.charges.len(), 1);
    assert_eq!(bill.charges[0].amount.to_string(), "1.00");
    assert_eq!(bill.charges[0].billed_seconds, 90);
    let charge = envelopes(&bill, Utc::now()).remove(0);
    assert_eq!(charge.id, bill.charges[0].charge_id);
    assert_eq!(charge.causation_id, Some(bill.cause.id));
    assert_eq!(charge.actor, Actor::Service("lh-pricing".into()));
    f.apply(99, &charge);
    assert!(due(&f).is_empty());
    assert!(f.is_charged(lease));
}

#[test]
fn a_node_clock_far_off_moves_the_bill_by_the_skew_at_most() {
    let lease = Uuid::from_u128(1);
    let mut charges = Charges::new(chrono::Duration::seconds(30), GRACE);
    fold_stored(&mut charges, 1, t(0, 0, 0), &book(1, t(0, 0, 0), "0.5"));
    // The node says it started an hour before the log stored its
    // report, and ended ten minutes after the log stored that.
    let events = lease_events(lease, t(9, 0, 0), t(10, 11, 30), EndReason::Stopped);
    let stored = [t(10, 0, 0), t(10, 0, 0), t(10, 0, 0), t(10, 1, 30)];
    for (i, (e, at)) in events.iter().zip(stored).enumerate() {
        fold_stored(&mut charges, 2 + i as u64, at, e);
    }
    let Plan::Publish(bill) = charges.fold.plan_until(lease, LATER) else {
        panic!("expected a bill")
    };
    // From 09:59:30 (30 s of skew allowed) to 10:01:30 (when stored),
    // in the hours 09:00 and 10:00.
    let seconds: Vec<u64> = bill.charges.iter().map(|c| c.billed_seconds).collect();
    assert_eq!(seconds, vec![30, 90]);
}

/// The default book and a lease that ran 90 s; its `lease.ended` apart.
fn book_and_lease_until_its_end(lease: Uuid) -> (Vec<Envelope>, Envelope) {
    let mut events = vec![book(1, t(0, 0, 0), "0.5")];
    events.extend(lease_events(
        lease,
        t(10, 0, 0),
        t(10, 1, 30),
        EndReason::Stopped,
    ));
    let ended = events.pop().unwrap();
    (events, ended)
}

#[test]
fn a_lease_and_book_known_only_from_restatements_are_billed_the_same() {
    let lease = Uuid::from_u128(1);
    let (events, ended) = book_and_lease_until_its_end(lease);
    let stated = |events: &[Envelope], first: u64| -> Vec<StatedEvent> {
        events
            .iter()
            .enumerate()
            .map(|(i, e)| StatedEvent {
                sequence: first + i as u64,
                stored_at: t(10, 0, 0),
                envelope: Box::new(e.clone()),
            })
            .collect()
    };
    let book_restated = lh_domain::restate::restatement(&stated(&events[..1], 1)).unwrap();
    let lease_restated = lh_domain::restate::restatement(&stated(&events[1..], 2)).unwrap();
    let whole = {
        let mut all = events.clone();
        all.push(ended.clone());
        fold(&all)
    };
    // Started after the history expired; an event of the lease before
    // its restatement is read and then stood in for by it.
    let mut charges = Charges::new(chrono::Duration::seconds(30), GRACE);
    fold_stored(&mut charges, 40, t(10, 0, 0), &events[3]);
    fold_stored(&mut charges, 50, t(10, 0, 0), &env(book_restated));
    fold_stored(&mut charges, 51, t(10, 0, 0), &env(lease_restated.clone()));
    fold_stored(&mut charges, 52, t(10, 1, 30), &ended);
    let (Plan::Publish(fresh), Plan::Publish(known)) = (
        charges.fold.plan_until(lease, LATER),
        whole.plan_until(lease, LATER),
    ) else {
        panic!("both bill the lease")
    };
    assert_eq!(fresh.charges, known.charges);
    assert_eq!(fresh.charges[0].billed_seconds, 90);
    // To a fold that knows the lease, its restatement changes nothing.
    let mut again = Charges::new(chrono::Duration::seconds(30), GRACE);
    for (i, e) in events.iter().enumerate() {
        fold_stored(&mut again, 1 + i as u64, t(10, 0, 0), e);
    }
    fold_stored(&mut again, 51, t(10, 0, 0), &env(lease_restated));
    fold_stored(&mut again, 52, t(10, 1, 30), &ended);
    let Plan::Publish(bill) = again.fold.plan_until(lease, LATER) else {
        panic!("billed")
    };
    assert_eq!(bill.charges, known.charges);
}

#[test]
fn a_snapshot_taken_back_bills_the_same() {
    let lease = Uuid::from_u128(1);
    let (events, ended) = book_and_lease_until_its_end(lease);
    let mut before = Charges::new(chrono::Duration::seconds(30), GRACE);
    for (i, e) in events.iter().enumerate() {
        fold_stored(&mut before, 1 + i as u64, t(10, 0, 0), e);
    }
    let mut after = Charges::new(chrono::Duration::seconds(30), GRACE);
    let bytes = serde_json::to_vec(&before.snapshot().unwrap()).unwrap();
    assert!(
        after.restore(&serde_json::from_slice::<Box<serde_json::value::RawValue>>(&bytes).unwrap())
    );
    for c in [&mut before, &mut after] {
        fold_stored(c, 9, t(10, 1, 30), &ended);
    }
    let (Plan::Publish(a), Plan::Publish(b)) = (
        before.fold.plan_until(lease, LATER),
        after.fold.plan_until(lease, LATER),
    ) else {
        panic!("both bill")
    };
    assert_eq!(a.charges, b.charges);
    let other = serde_json::json!({"books": 3});
    assert!(!after.restore(&serde_json::value::to_raw_value(&other).unwrap()));
}

#[test]
fn the_fold_remembers_a_bounded_number_of_charged_leases() {
    let mut f = ChargingState::default();
    let first = Uuid::from_u128(1);
    for n in 1..=(MAX_REMEMBERED_CHARGED_LEASES as u128 + 1) {
        f.mark_charged(Uuid::from_u128(n));
        // A lease charged once per run is remembered once.
        f.mark_charged(Uuid::from_u128(n));
    }
    assert_eq!(f.charged.len(), MAX_REMEMBERED_CHARGED_LEASES);
    assert_eq!(f.charged_order.len(), MAX_REMEMBERED_CHARGED_LEASES);
    assert!(!f.is_charged(first), "the oldest is forgotten");
    assert!(f.is_charged(Uuid::from_u128(2)));
}

/// `lease` moved off node n1, lost, billed until `billing_ends_at`.
fn lost_on_n1(lease: Uuid, billing_ends_at: DateTime<Utc>) -> Envelope {
    env(EventData::LeaseMigrated(LeaseMigrated {
        lease_id: lease,
        reason: "node n1 lost".into(),
        from_node_id: "n1".into(),
        from_gpu_indices: vec![0, 1],
        billing_ends_at,
        to: None,
    }))
}

#[test]
fn a_migrated_lease_is_billed_per_run_without_overlap() {
    let lease = Uuid::from_u128(1);
    let mut events = vec![book(1, t(0, 0, 0), "0.5")];
    let mut run = lease_events(lease, t(10, 0, 0), t(10, 5, 0), EndReason::Stopped);
    let ended = run.pop().unwrap();
    events.extend(run);
    // The node was last heard at 10:01:30; the lease ran again from
    // 10:01:34 on another node until 10:05:00.
    events.push(lost_on_n1(lease, t(10, 1, 30)));
    events.push(env(EventData::LeaseStarted(LeaseStarted {
        lease_id: lease,
        node_id: "n2".into(),
        started_at: t(10, 1, 34),
        mig_devices: Vec::new(),
    })));
    events.push(ended);
    let f = fold(&events);
    let Plan::Publish(bill) = f.plan_until(lease, LATER) else {
        panic!("expected a bill")
    };
    let runs: Vec<_> = bill
        .charges
        .iter()
        .map(|c| (c.from, c.to, c.billed_seconds))
        .collect();
    // Both runs are in the hour 10:00: one charge, without the 4 s
    // between them.
    assert_eq!(runs, vec![(t(10, 0, 0), t(10, 5, 0), 90 + 206)]);
    // 80 GB x 0.5 CNY/GB-h x 296 s = 3.2888...
    assert_eq!(bill.charges[0].amount.to_string(), "3.29");

    // Moved and then cancelled while waiting: the first run is still billed.
    let mut events = vec![book(1, t(0, 0, 0), "0.5")];
    let mut run = lease_events(lease, t(10, 0, 0), t(10, 5, 0), EndReason::Cancelled);
    let ended = run.pop().unwrap();
    events.extend(run);
    events.push(lost_on_n1(lease, t(10, 1, 30)));
    events.push(ended);
    let Plan::Publish(bill) = fold(&events).plan_until(lease, LATER) else {
        panic!("expected a bill")
    };
    assert_eq!(bill.charges.len(), 1);
    assert_eq!(bill.charges[0].billed_seconds, 90);
}

#[test]
fn a_fraction_is_billed_by_its_vram() {
    let lease = Uuid::from_u128(1);
    let mut events = vec![book(1, t(0, 0, 0), "0.5")];
    let mut lifecycle = lease_events(lease, t(10, 0, 0), t(10, 1, 30), EndReason::Stopped);
    if let EventData::LeasePlaced(p) = &mut lifecycle[1].data {
        p.vram_gb_per_gpu = 10;
        p.gpus.truncate(1);
        p.gpus[0].milli = Some(300);
        p.gpus[0].vram_gb = Some(10);
    }
    events.extend(lifecycle);
    let Plan::Publish(bill) = fold(&events).plan_until(lease, LATER) else {
        panic!("expected a bill")
    };
    assert_eq!(bill.charges[0].vram_gb, 10);
    assert_eq!(bill.charges[0].gpus, 1);
    // 10 GB x 0.5 CNY/GB-h x 90 s = 0.125, rounded half away from zero.
    assert_eq!(bill.charges[0].amount.to_string(), "0.13");
}

#[test]
fn a_replayed_log_with_charges_has_nothing_due() {
    let lease = Uuid::from_u128(1);
    let mut events = vec![book(1, t(0, 0, 0), "0.5")];
    events.extend(lease_events(
        lease,
        t(10, 0, 0),
        t(10, 1, 30),
        EndReason::Completed,
    ));
    let Plan::Publish(bill) = fold(&events).plan_until(lease, LATER) else {
        panic!()
    };
    events.extend(envelopes(&bill, Utc::now()));
    assert!(due(&fold(&events)).is_empty());
}

#[test]
fn cancelled_never_started_or_backwards_leases_are_not_billed() {
    let a = Uuid::from_u128(1);
    let b = Uuid::from_u128(2);
    let c = Uuid::from_u128(3);
    let mut events = vec![book(1, t(0, 0, 0), "0.5")];
    events.extend(lease_events(
        a,
        t(10, 0, 0),
        t(10, 1, 0),
        EndReason::Cancelled,
    ));
    events.extend(lease_events(
        c,
        t(10, 0, 0),
        t(10, 0, 0),
        EndReason::Stopped,
    ));
    let mut never = lease_events(b, t(10, 0, 0), t(10, 1, 0), EndReason::Stopped);
    never.remove(2); // no lease.started
    events.extend(never);
    assert!(due(&fold(&events)).is_empty());
}

#[test]
fn the_book_is_the_newest_in_force_at_start_else_the_oldest() {
    let f = fold(&[
        book(2, t(12, 0, 0), "0.7"),
        book(1, t(8, 0, 0), "0.5"),
        book(3, t(20, 0, 0), "0.9"),
    ]);
    assert_eq!(f.book_for(t(7, 0, 0)).unwrap().version, 1);
    assert_eq!(f.book_for(t(9, 0, 0)).unwrap().version, 1);
    assert_eq!(f.book_for(t(12, 0, 0)).unwrap().version, 2);
    assert_eq!(f.book_for(t(23, 0, 0)).unwrap().version, 3);
}

#[test]
fn no_book_means_wait() {
    let lease = Uuid::from_u128(1);
    let f = fold(&lease_events(
        lease,
        t(10, 0, 0),
        t(10, 1, 30),
        EndReason::Stopped,
    ));
    assert!(matches!(f.plan_until(lease, LATER), Plan::WaitForBook));
}

#[test]
fn billing_uses_the_node_agents_timestamps_not_event_times() {
    let lease = Uuid::from_u128(1);
    let mut events = vec![book(1, t(0, 0, 0), "0.5")];
    // Envelopes all occur "now"; the started/ended timestamps say 1 h.
    events.extend(lease_events(
        lease,
        t(10, 0, 0),
        t(11, 0, 0),
        EndReason::Failed,
    ));
    let Plan::Publish(bill) = fold(&events).plan_until(lease, LATER) else {
        panic!()
    };
    assert_eq!(bill.charges[0].billed_seconds, 3600);
    assert_eq!(bill.charges[0].amount.to_string(), "40.00");
}

mod accrual;

mod storage;
