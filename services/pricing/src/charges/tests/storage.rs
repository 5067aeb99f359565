//! Tenants' storage on the charges fold: spans between measurements
//! charged once, whatever the replicas measured twice, and charged until
//! the erasure.

use super::*;

use super::super::storage::StoragePlan;

const TENANT: Uuid = Uuid::from_u128(7);
const GB: u64 = lh_domain::storage_rating::BYTES_PER_GB;

/// A book of 7.30 CNY per GB-month: 0.01 per GB-hour.
fn storage_book(from: DateTime<Utc>) -> Envelope {
    let mut b = rating::default_price_book(from);
    b.storage_cny_per_gb_month = Some("7.30".parse().unwrap());
    env(EventData::PriceBookPublished(b))
}

fn measured(at: DateTime<Utc>, bytes: u64) -> Envelope {
    Envelope::new(
        Actor::Service("lh-gateway".into()),
        at,
        EventData::StorageMeasured(StorageMeasured {
            tenant_id: TENANT,
            bucket: format!("lh-t-{}", TENANT.simple()),
            bytes,
            measured_at: at,
            writes_stopped: false,
        }),
    )
}

/// The storage charges due, applied back to the fold as the loop reads
/// them, from sequence `next` on.
fn charge_all(f: &mut ChargingState, next: &mut u64) -> Vec<StorageChargeAccrued> {
    let StoragePlan::Publish(bill) = f.plan_storage(TENANT) else {
        return Vec::new();
    };
    for c in &bill.charges {
        *next += 1;
        f.apply(
            *next,
            &env(EventData::StorageChargeAccrued(c.clone())).with_id(c.charge_id),
        );
    }
    bill.charges.clone()
}

fn total(charges: &[StorageChargeAccrued]) -> Decimal {
    charges.iter().map(|c| c.amount).sum()
}

#[test]
fn the_bytes_of_a_measurement_are_charged_until_the_next_once() {
    let mut f = fold(&[storage_book(t(0, 0, 0)), measured(t(10, 0, 0), 10 * GB)]);
    // One measurement closes no span.
    assert!(matches!(f.plan_storage(TENANT), StoragePlan::Nothing));
    f.apply(3, &measured(t(12, 0, 0), 20 * GB));
    let StoragePlan::Publish(bill) = f.plan_storage(TENANT) else {
        panic!("a span is due")
    };
    // Expects the storage subject empty, caused by the closing measurement.
    assert_eq!(bill.after_sequence, 0);
    assert_eq!(bill.cause.data.event_type(), "storage.measured");
    let mut next = 3;
    let charges = charge_all(&mut f, &mut next);
    assert_eq!(charges.len(), 1);
    let c = &charges[0];
    // 10 GB x 2 h x 0.01 = 0.20, on the tenant's storage subject.
    assert_eq!((c.from, c.to, c.bytes), (t(10, 0, 0), t(12, 0, 0), 10 * GB));
    assert_eq!(c.amount.to_string(), "0.20");
    assert_eq!(c.billed_seconds, 7200);
    assert_eq!(c.storage_id, storage_id(TENANT));
    assert_eq!(c.period, "2026-12");
    let data = EventData::StorageChargeAccrued(c.clone());
    assert_eq!(
        data.aggregate_subject(),
        subject::charge(storage_id(TENANT))
    );
    // Read back: nothing more, however often it is asked.
    assert!(matches!(f.plan_storage(TENANT), StoragePlan::Nothing));
    // The next span continues the month's sum and the subject's guard.
    f.apply(10, &measured(t(13, 0, 0), 0));
    let StoragePlan::Publish(bill) = f.plan_storage(TENANT) else {
        panic!("a span is due")
    };
    assert_eq!(bill.after_sequence, next);
    assert_eq!(bill.charges[0].amount.to_string(), "0.20");
    assert_eq!(bill.charges[0].bytes, 20 * GB);
}

#[test]
fn a_replayed_log_charges_nothing_again_and_derives_the_same_ids() {
    let events = vec![
        storage_book(t(0, 0, 0)),
        measured(t(10, 0, 0), 5 * GB),
        measured(t(11, 0, 0), 5 * GB),
    ];
    let mut first = fold(&events);
    let mut next = events.len() as u64;
    let charges = charge_all(&mut first, &mut next);
    assert_eq!(charges.len(), 1);
    // Another replica, or this one restarted, plans the same charge.
    let other = fold(&events);
    let StoragePlan::Publish(bill) = other.plan_storage(TENANT) else {
        panic!("due")
    };
    assert_eq!(bill.charges, charges);
    // And once the log holds it, nothing.
    let mut replayed = events.clone();
    replayed.extend(
        charges
            .iter()
            .map(|c| env(EventData::StorageChargeAccrued(c.clone()))),
    );
    assert!(matches!(
        fold(&replayed).plan_storage(TENANT),
        StoragePlan::Nothing
    ));
}

#[test]
fn measuring_twice_cuts_a_span_but_charges_the_same() {
    // Two replicas measured one interval, minutes apart: the same hours.
    let once = {
        let mut f = fold(&[
            storage_book(t(0, 0, 0)),
            measured(t(10, 0, 0), 3 * GB),
            measured(t(14, 0, 0), 3 * GB),
        ]);
        charge_all(&mut f, &mut 10)
    };
    let twice = {
        let mut f = fold(&[
            storage_book(t(0, 0, 0)),
            measured(t(10, 0, 0), 3 * GB),
            measured(t(10, 0, 0), 3 * GB),
            measured(t(10, 3, 0), 3 * GB),
            measured(t(14, 0, 0), 3 * GB),
        ]);
        charge_all(&mut f, &mut 10)
    };
    assert_eq!(once.len(), 1);
    assert_eq!(twice.len(), 2);
    assert_eq!(total(&once), total(&twice));
    assert_eq!(total(&once).to_string(), "0.12");
    // A measurement from before what is charged changes nothing.
    let mut f = fold(&[
        storage_book(t(0, 0, 0)),
        measured(t(10, 0, 0), 3 * GB),
        measured(t(14, 0, 0), 3 * GB),
    ]);
    let mut next = 10;
    charge_all(&mut f, &mut next);
    f.apply(20, &measured(t(12, 0, 0), 100 * GB));
    assert!(charge_all(&mut f, &mut next).is_empty());
}

#[test]
fn an_empty_bucket_costs_nothing_and_an_erasure_ends_the_charges() {
    let mut f = fold(&[
        storage_book(t(0, 0, 0)),
        measured(t(8, 0, 0), 0),
        measured(t(9, 0, 0), 0),
        measured(t(10, 0, 0), 4 * GB),
    ]);
    let mut next = 10;
    assert!(charge_all(&mut f, &mut next).is_empty());
    // Only the last point is kept of the free hours.
    assert_eq!(f.storage[&TENANT].points.len(), 1);
    let erased = Envelope::new(
        Actor::Admin,
        t(12, 30, 0),
        EventData::StorageErased(StorageErased {
            tenant_id: TENANT,
            bucket: "b".into(),
            objects_deleted: 3,
        }),
    );
    f.apply(11, &erased);
    let charges = charge_all(&mut f, &mut next);
    // 4 GB until the erasure: 2.5 h x 0.04 = 0.10.
    assert_eq!(charges.len(), 1);
    assert_eq!(
        (charges[0].from, charges[0].to),
        (t(10, 0, 0), t(12, 30, 0))
    );
    assert_eq!(charges[0].amount.to_string(), "0.10");
    // A measurement in flight during the erasure is not charged.
    f.apply(30, &measured(t(13, 0, 0), 4 * GB));
    f.apply(31, &measured(t(14, 0, 0), 4 * GB));
    assert!(charge_all(&mut f, &mut next).is_empty());
    assert!(f.storage[&TENANT].points.is_empty());
}

#[test]
fn storage_waits_for_a_book_and_is_free_on_one_without_its_price() {
    let mut f = fold(&[measured(t(10, 0, 0), GB), measured(t(11, 0, 0), GB)]);
    assert!(matches!(f.plan_storage(TENANT), StoragePlan::WaitForBook));
    let mut old = rating::default_price_book(t(0, 0, 0));
    old.storage_cny_per_gb_month = None;
    f.apply(3, &env(EventData::PriceBookPublished(old)));
    let charges = charge_all(&mut f, &mut 10);
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0].amount.to_string(), "0.00");
}

#[test]
fn a_prepaid_balance_pays_for_storage_too() {
    let mut f = fold(&[
        storage_book(t(0, 0, 0)),
        env(EventData::BalanceToppedUp(BalanceToppedUp {
            top_up_id: Uuid::from_u128(9),
            tenant_id: TENANT,
            amount: "10.00".parse().unwrap(),
            currency: "CNY".into(),
            requested_by: None,
        })),
        measured(t(0, 0, 0), 100 * GB),
        measured(t(10, 0, 0), 100 * GB),
    ]);
    let charges = charge_all(&mut f, &mut 10);
    // 100 GB x 10 h x 0.01 = 10.00: all of it.
    assert_eq!(total(&charges).to_string(), "10.00");
    let b = f.balances.get(TENANT).unwrap();
    assert_eq!(b.topped_up - b.charged, Decimal::ZERO);
}

#[test]
fn the_decide_loop_publishes_storage_charges_guarded_on_their_subject() {
    let mut charges = Charges::new(chrono::Duration::seconds(30), GRACE);
    let events = [
        storage_book(t(0, 0, 0)),
        measured(t(10, 0, 0), GB),
        measured(t(11, 0, 0), GB),
    ];
    for (i, e) in events.iter().enumerate() {
        fold_stored(&mut charges, i as u64 + 1, t(11, 0, 0), e);
    }
    let batches = charges.decide(t(11, 0, 1));
    let storage: Vec<_> = batches
        .iter()
        .flatten()
        .filter(|(e, _)| matches!(e.data, EventData::StorageChargeAccrued(_)))
        .collect();
    assert_eq!(storage.len(), 1);
    let (envelope, expect) = storage[0];
    assert_eq!(*expect, lh_bus::Expect::LastSubjectSequence(0));
    assert_eq!(envelope.actor, Actor::Service("lh-pricing".into()));
    assert_eq!(envelope.causation_id, Some(events[2].id));
    assert_eq!(
        envelope.subject(),
        format!(
            "lh.evt.charge.{}.storage_accrued.pricing",
            storage_id(TENANT)
        )
    );
}
