//! Charges that accrue while a lease runs: each hour and at its end, by
//! tier (performance's falling ladder, spot's market, a reservation's
//! cover), and the bounds on what a price may be.

use super::*;

/// Publishes what is due at `horizon` into the events, as the decide
/// loop and the log would; returns the charges.
fn charge_until(
    events: &mut Vec<Envelope>,
    lease: Uuid,
    horizon: DateTime<Utc>,
) -> Vec<ChargeAccrued> {
    match fold(events).plan_until(lease, horizon) {
        Plan::Publish(bill) => {
            events.extend(envelopes(&bill, Utc::now()));
            bill.charges
        }
        Plan::Nothing => Vec::new(),
        other => panic!("{other:?}"),
    }
}

/// The market's price of the fixtures' model in `zone` from `at`.
fn spot_price(at: DateTime<Utc>, zone: &str, price: &str) -> Envelope {
    let mut e = env(EventData::SpotPriceSet(SpotPriceSet {
        zone: zone.into(),
        gpu_model: fixtures::MODEL.into(),
        price_cny_per_gb_hour: price.parse().unwrap(),
        utilisation: Decimal::ZERO,
        gpus_total: 8,
        gpus_used: 0,
    }));
    e.occurred_at = at;
    e
}

fn total(charges: &[ChargeAccrued]) -> String {
    charges
        .iter()
        .map(|c| c.amount)
        .sum::<Decimal>()
        .to_string()
}

#[test]
fn a_running_lease_is_charged_each_hour_and_its_end_at_the_end() {
    let lease = Uuid::from_u128(1);
    let mut events = vec![book(1, t(0, 0, 0), "0.5")];
    let mut lifecycle = lease_events(lease, t(10, 20, 0), t(13, 30, 0), EndReason::Stopped);
    let ended = lifecycle.pop().unwrap();
    events.extend(lifecycle);
    // Nothing before the first hour is over.
    assert!(charge_until(&mut events, lease, t(10, 0, 0)).is_empty());
    let first = charge_until(&mut events, lease, t(12, 0, 0));
    let spans: Vec<_> = first
        .iter()
        .map(|c| (c.from, c.to, c.billed_seconds))
        .collect();
    assert_eq!(
        spans,
        vec![
            (t(10, 20, 0), t(11, 0, 0), 2400),
            (t(11, 0, 0), t(12, 0, 0), 3600)
        ]
    );
    assert_eq!(
        first[0].charge_id,
        rating::hourly_charge_id(lease, t(10, 0, 0))
    );
    // Asked again for the same hours (a replay, a second replica):
    // nothing more.
    assert!(charge_until(&mut events, lease, t(12, 0, 0)).is_empty());
    let second = charge_until(&mut events, lease, t(13, 0, 0));
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].age_seconds, Some(2400 + 2 * 3600));
    events.push(ended);
    let last = charge_until(&mut events, lease, t(13, 0, 0));
    assert_eq!((last[0].from, last[0].to), (t(13, 0, 0), t(13, 30, 0)));
    assert!(fold(&events).is_charged(lease));
    // 80 GB x 0.5 CNY/GB-h x 3 h 10 min = 126.666... -> 126.67 in all.
    let all: Vec<_> = [first, second, last].concat();
    assert_eq!(total(&all), "126.67");
    let amounts: Vec<String> = all.iter().map(|c| c.amount.to_string()).collect();
    assert_eq!(amounts, ["26.67", "40.00", "40.00", "20.00"]);
}

#[test]
fn performance_steps_down_with_billable_age_and_skips_gaps() {
    let lease = Uuid::from_u128(1);
    let mut events = vec![env(EventData::PriceBookPublished(
        rating::default_price_book(t(0, 0, 0)),
    ))];
    let mut lifecycle = lease_events(lease, t(1, 0, 0), t(9, 0, 0), EndReason::Stopped);
    if let EventData::LeaseRequested(r) = &mut lifecycle[0].data {
        r.tier = Tier::Performance;
    }
    let ended = lifecycle.pop().unwrap();
    events.extend(lifecycle);
    // Suspended 03:00-04:00: that hour neither billed nor aged.
    events.push(env(EventData::LeaseSuspended(LeaseSuspended {
        lease_id: lease,
        node_id: "n1".into(),
        gpu_indices: vec![0, 1],
        suspended_at: t(3, 0, 0),
        reason: "idle".into(),
    })));
    events.push(env(EventData::LeaseStarted(fixtures::started(
        lease,
        "n1",
        t(4, 0, 0),
    ))));
    let mut charges = charge_until(&mut events, lease, t(6, 0, 0));
    events.push(ended);
    charges.extend(charge_until(&mut events, lease, t(6, 0, 0)));
    // 80 GB; billable age 0-3 h at 2.0 (01-03, 04-05), 3-6 h at 1.6
    // (05-08), 6-7 h at 1.2 (08-09): 80 x (6 + 4.8 + 1.2) = 960.
    let amounts: Vec<String> = charges.iter().map(|c| c.amount.to_string()).collect();
    assert_eq!(
        amounts,
        ["160.00", "160.00", "160.00", "128.00", "128.00", "128.00", "96.00"]
    );
    assert_eq!(total(&charges), "960.00");
    assert!(charges.iter().all(|c| c.tier == Tier::Performance));
}

#[test]
fn the_notice_period_is_not_billed() {
    let lease = Uuid::from_u128(1);
    let mut events = vec![book(1, t(0, 0, 0), "0.5")];
    let mut lifecycle = lease_events(lease, t(10, 0, 0), t(10, 32, 0), EndReason::Preempted);
    let ended = lifecycle.pop().unwrap();
    events.extend(lifecycle);
    let mut notice = env(EventData::LeasePreemptionNoticed(LeasePreemptionNoticed {
        lease_id: lease,
        node_id: "n1".into(),
        preempted_for: Uuid::from_u128(2),
        deadline: t(10, 32, 0),
        reason: lh_events::PreemptionReason::Capacity,
    }));
    notice.occurred_at = t(10, 30, 0);
    events.push(notice);
    events.push(ended);
    let charges = charge_until(&mut events, lease, LATER);
    assert_eq!(charges.len(), 1);
    assert_eq!(
        (charges[0].to, charges[0].billed_seconds),
        (t(10, 30, 0), 1800)
    );
    assert_eq!(charges[0].amount.to_string(), "20.00");
}

#[test]
fn spot_follows_the_market_of_its_zone_and_model() {
    let lease = Uuid::from_u128(1);
    let mut events = vec![env(EventData::PriceBookPublished(
        rating::default_price_book(t(0, 0, 0)),
    ))];
    let price = spot_price;
    events.push(price(t(9, 0, 0), "z", "0.1"));
    events.push(price(t(9, 0, 0), "elsewhere", "9"));
    let mut lifecycle = lease_events(lease, t(10, 0, 0), t(11, 30, 0), EndReason::Stopped);
    if let EventData::LeaseRequested(r) = &mut lifecycle[0].data {
        r.tier = Tier::Spot;
    }
    let ended = lifecycle.pop().unwrap();
    events.extend(lifecycle);
    events.push(price(t(10, 30, 0), "z", "0.4"));
    let mut charges = charge_until(&mut events, lease, t(11, 0, 0));
    events.push(price(t(11, 15, 0), "z", "0.2"));
    events.push(ended);
    charges.extend(charge_until(&mut events, lease, t(11, 0, 0)));
    // 80 GB: 30 min at 0.1, 45 min at 0.4, 15 min at 0.2
    // = 80 x (0.05 + 0.3 + 0.05) = 32.00
    let amounts: Vec<String> = charges.iter().map(|c| c.amount.to_string()).collect();
    assert_eq!(amounts, ["20.00", "12.00"]);
    assert_eq!(charges[0].unit_price_cny_per_gb_hour.to_string(), "0.25");
}

#[test]
fn a_book_or_a_spot_price_out_of_bounds_is_not_charged_with() {
    let lease = Uuid::from_u128(1);
    let mut events = vec![env(EventData::PriceBookPublished(
        rating::default_price_book(t(0, 0, 0)),
    ))];
    // A newer book with a ladder of a million steps.
    let mut long = rating::default_price_book(t(1, 0, 0));
    long.version = 2;
    long.tiers[0].model = Some(ChargeModel::Graduated {
        steps: (0..1_000_000)
            .map(|h| PriceStep {
                from_hour: h,
                price_cny_per_gb_hour: Decimal::ONE,
            })
            .collect(),
    });
    events.push(env(EventData::PriceBookPublished(long)));
    let price = |at: DateTime<Utc>, p: &str| spot_price(at, "z", p);
    events.push(price(t(9, 0, 0), "0.1"));
    events.push(price(t(10, 15, 0), "100000000000000000000000000"));
    events.push(price(t(10, 30, 0), "-5"));
    let mut lifecycle = lease_events(lease, t(10, 0, 0), t(11, 0, 0), EndReason::Stopped);
    if let EventData::LeaseRequested(r) = &mut lifecycle[0].data {
        r.tier = Tier::Spot;
    }
    events.extend(lifecycle);
    let f = fold(&events);
    let Plan::Publish(bill) = f.plan_until(lease, LATER) else {
        panic!("expected a bill")
    };
    // An hour of 80 GB at 0.1, on the first book.
    assert_eq!(bill.charges[0].amount.to_string(), "8.00");
    assert_eq!(bill.charges[0].price_book_version, 1);
}

#[test]
fn a_market_keeps_only_the_prices_an_open_lease_still_needs() {
    let mut f = ChargingState::default();
    for i in 0..(PRUNE_MARKET_AT_POINTS as i64 * 3) {
        f.price_set(
            &SpotPriceSet {
                zone: "z".into(),
                gpu_model: "m".into(),
                price_cny_per_gb_hour: Decimal::ONE,
                utilisation: Decimal::ZERO,
                gpus_total: 1,
                gpus_used: 0,
            },
            t(0, 0, 0) + chrono::Duration::seconds(i),
        );
    }
    assert!(f.market["z/m"].len() < PRUNE_MARKET_AT_POINTS);
}

#[test]
fn a_market_an_old_lease_pins_is_pruned_ever_more_rarely() {
    let lease = Uuid::from_u128(1);
    let mut lifecycle = lease_events(lease, t(0, 0, 0), t(23, 0, 0), EndReason::Stopped);
    lifecycle.pop();
    if let EventData::LeaseRequested(r) = &mut lifecycle[0].data {
        r.tier = Tier::Spot;
    }
    let mut f = fold(&lifecycle);
    let zone = f.leases[&lease].zone.clone().unwrap();
    let model = f.leases[&lease].gpu_model.clone().unwrap();
    let key = market_key(&zone, &model);
    let mut prunes = 0;
    let mut limit = PRUNE_MARKET_AT_POINTS;
    for i in 0..(PRUNE_MARKET_AT_POINTS as i64 * 8) {
        f.price_set(
            &SpotPriceSet {
                zone: zone.clone(),
                gpu_model: model.clone(),
                price_cny_per_gb_hour: Decimal::ONE,
                utilisation: Decimal::ZERO,
                gpus_total: 1,
                gpus_used: 0,
            },
            t(0, 0, 1) + chrono::Duration::seconds(i),
        );
        let now_at = f
            .market_prune_at
            .get(&key)
            .copied()
            .unwrap_or(PRUNE_MARKET_AT_POINTS);
        if now_at != limit {
            limit = now_at;
            prunes += 1;
        }
    }
    // The running lease needs every point since its start: none is
    // dropped, and the open leases were scanned at 1024, 2048, 4096 and
    // 8192 points rather than at each of the 7,169 prices from the
    // 1024th on.
    assert_eq!(f.market[&key].len(), PRUNE_MARKET_AT_POINTS * 8);
    assert_eq!(prunes, 4);
}

#[test]
fn a_reservation_is_billed_each_hour_and_covers_the_reserved_leases_that_fit() {
    let tenant = Uuid::from_u128(7);
    let reservation = Uuid::from_u128(50);
    let mut events = vec![env(EventData::PriceBookPublished(
        rating::default_price_book(t(0, 0, 0)),
    ))];
    events.push(env(EventData::ReservationCommitted(ReservationCommitted {
        reservation_id: reservation,
        tenant_id: tenant,
        gpu_model: fixtures::MODEL.into(),
        zone: "z".into(),
        gpus: 2,
        starts_at: t(10, 0, 0),
        ends_at: t(12, 0, 0),
        requested_by: None,
    })));
    let reserved = |lease: Uuid, start, end| {
        let mut l = lease_events(lease, start, end, EndReason::Stopped);
        if let EventData::LeaseRequested(r) = &mut l[0].data {
            r.tier = Tier::Reserved;
        }
        l
    };
    // Two leases of 2 GPUs at once: the first fits, the second does not.
    let (covered, overflow, after) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
    let mut first = reserved(covered, t(11, 0, 0), t(12, 30, 0));
    let first_end = first.pop().unwrap();
    events.extend(first);
    events.extend(reserved(overflow, t(11, 0, 0), t(11, 30, 0)));
    events.push(first_end);
    // Once the first has ended, a third fits again.
    events.extend(reserved(after, t(13, 0, 0), t(13, 30, 0)));

    // The commitment: 2 x 40 GB x 0.35 per hour, whether used or not,
    // only as its term passes.
    assert_eq!(
        charge_until(&mut events, reservation, t(11, 0, 0))
            .iter()
            .map(|c| (c.amount.to_string(), c.reservation_id))
            .collect::<Vec<_>>(),
        vec![("28.00".to_string(), Some(reservation))]
    );
    let rest = charge_until(&mut events, reservation, t(13, 0, 0));
    assert_eq!(total(&rest), "28.00");
    assert!(fold(&events).is_charged(reservation));

    // Covered until the term ends at 12:00, then at basic.
    let charges = charge_until(&mut events, covered, LATER);
    assert!(charges
        .iter()
        .all(|c| c.reservation_id == Some(reservation)));
    assert_eq!(
        charges
            .iter()
            .map(|c| c.amount.to_string())
            .collect::<Vec<_>>(),
        ["0.00", "20.00"]
    );
    let charges = charge_until(&mut events, overflow, LATER);
    assert_eq!(charges[0].reservation_id, None);
    assert_eq!(total(&charges), "20.00");
    // Started after the term: nothing covers it.
    let charges = charge_until(&mut events, after, LATER);
    assert_eq!(
        (charges[0].reservation_id, total(&charges)),
        (None, "20.00".to_string())
    );
}
