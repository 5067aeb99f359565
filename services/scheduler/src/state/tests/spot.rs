//! The spot market in the scheduler: bids, outbid notices, managed
//! recovery, zone and region constraints.

use rust_decimal::Decimal;

use super::given::*;

const BID: &str = "4";

fn d(s: &str) -> Decimal {
    s.parse().unwrap()
}

fn zone_node(id: &str, zone: &str, n: u32) -> EventData {
    EventData::NodeRegistered(fixtures::node(
        id,
        zone,
        n,
        fixtures::MODEL,
        fixtures::MODEL_VRAM_GB,
    ))
}

fn price(zone: &str, p: &str) -> EventData {
    EventData::SpotPriceSet(SpotPriceSet {
        zone: zone.into(),
        gpu_model: fixtures::MODEL.into(),
        price_cny_per_gb_hour: d(p),
        utilisation: Decimal::ZERO,
        gpus_total: 2,
        gpus_used: 0,
    })
}

fn spot(lease: Uuid, tenant: Uuid, bid: Option<&str>, max_retries: Option<u32>) -> LeaseRequested {
    LeaseRequested {
        tier: Tier::Spot,
        max_price_cny_per_gpu_hour: bid.map(d),
        recovery: max_retries.map(|max_retries| SpotRecovery {
            max_retries,
            zone_first: ZoneFirst::Same,
        }),
        ..fixtures::whole_request(lease, tenant, 1, fixtures::MODEL)
    }
}

fn placed_zone(s: &State, lease: Uuid) -> Option<String> {
    s.leases[&lease].zone.clone()
}

fn notices(d: &Decisions) -> Vec<&LeasePreemptionNoticed> {
    events_of(d)
        .into_iter()
        .filter_map(|e| match e {
            EventData::LeasePreemptionNoticed(n) => Some(n),
            _ => None,
        })
        .collect()
}

#[test]
fn a_bid_places_only_where_the_price_per_gpu_hour_is_at_or_under_it() {
    let (t, lease, now) = (Uuid::from_u128(1), Uuid::from_u128(10), Utc::now());
    // 0.2 × 40 GB = 8 CNY per GPU-hour in z1; 0.1 × 40 = 4 in z2.
    let mut s = given(vec![
        zone_node("a", "z1", 2),
        zone_node("b", "z2", 2),
        price("z1", "0.2"),
        price("z2", "0.1"),
        tenant(t, 10),
        EventData::LeaseRequested(spot(lease, t, Some(BID), None)),
    ]);
    settle(&mut s, now, &Rules::default());
    assert_eq!(placed_zone(&s, lease).as_deref(), Some("z2"));
}

#[test]
fn a_spot_price_no_broker_may_publish_is_ignored() {
    let (t, lease, now) = (Uuid::from_u128(1), Uuid::from_u128(10), Utc::now());
    // 0.1 × 40 GB = 4 CNY per GPU-hour: the bid covers it; then a price
    // far above the ceiling and a negative one, both ignored.
    let mut s = given(vec![
        zone_node("a", "z1", 2),
        price("z1", "0.1"),
        price("z1", "1000000000000000000000000000"),
        price("z1", "-3"),
        tenant(t, 10),
        EventData::LeaseRequested(spot(lease, t, Some(BID), None)),
    ]);
    assert_eq!(s.spot_price("z1", fixtures::MODEL), Some(d("0.1")));
    settle(&mut s, now, &Rules::default());
    assert_eq!(placed_zone(&s, lease).as_deref(), Some("z1"));
}

#[test]
fn an_outbid_request_waits_saying_why_until_the_price_falls() {
    let (t, lease, now) = (Uuid::from_u128(1), Uuid::from_u128(10), Utc::now());
    let mut s = given(vec![
        zone_node("a", "z1", 2),
        price("z1", "0.2"),
        tenant(t, 10),
        EventData::LeaseRequested(spot(lease, t, Some(BID), None)),
    ]);
    settle(&mut s, now, &Rules::default());
    match &s.leases[&lease].status {
        Status::Queued { reason, .. } => assert!(
            reason.starts_with(
                "outbid: the spot price of A100-40GB is above the bid of 4 CNY per GPU-hour"
            ) && reason.ends_with("(lowest: 8 in z1)"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    // Said once: the same reason again adds nothing.
    assert!(decide(&s).batches.is_empty());
    s.apply(9_000, &env(price("z1", "0.1")));
    settle(&mut s, now, &Rules::default());
    assert_eq!(placed(&s), vec![lease]);
}

#[test]
fn a_bid_without_a_known_price_waits_and_a_request_without_a_bid_does_not() {
    let (t, now) = (Uuid::from_u128(1), Utc::now());
    let (bidding, any_price) = (Uuid::from_u128(10), Uuid::from_u128(11));
    let mut s = given(vec![
        zone_node("a", "z1", 2),
        tenant(t, 10),
        EventData::LeaseRequested(spot(bidding, t, Some(BID), None)),
        EventData::LeaseRequested(spot(any_price, t, None, None)),
    ]);
    settle(&mut s, now, &Rules::default());
    assert_eq!(placed(&s), vec![any_price]);
    assert!(matches!(&s.leases[&bidding].status,
        Status::Queued { reason, .. } if reason.starts_with("no spot price")));
}

#[test]
fn a_price_above_a_running_bid_notices_the_lease_once_with_the_reason_outbid() {
    let (t, lease, now) = (Uuid::from_u128(1), Uuid::from_u128(10), Utc::now());
    let rules = Rules {
        preemption_notice: Duration::seconds(30),
        ..Rules::default()
    };
    let mut s = given(vec![
        zone_node("a", "z1", 2),
        price("z1", "0.1"),
        tenant(t, 10),
        EventData::LeaseRequested(spot(lease, t, Some(BID), None)),
    ]);
    settle(&mut s, now, &rules);
    assert_eq!(placed(&s), vec![lease]);
    assert!(
        notices(&decide_at(&s, now, &rules)).is_empty(),
        "the bid covers 4"
    );
    s.apply(9_000, &env(price("z1", "0.1001")));
    let d = decide_at(&s, now, &rules);
    let n = notices(&d);
    assert_eq!(n.len(), 1);
    assert_eq!(
        (
            n[0].lease_id,
            n[0].reason,
            n[0].preempted_for,
            n[0].deadline
        ),
        (
            lease,
            PreemptionReason::Outbid,
            Uuid::nil(),
            now + Duration::seconds(30)
        )
    );
    settle(&mut s, now, &rules);
    assert!(
        notices(&decide_at(&s, now, &rules)).is_empty(),
        "noticed once"
    );
    assert_eq!(s.spot_stats.preemptions.get("outbid"), Some(&1));
}

fn ended(lease: Uuid, reason: EndReason, at: DateTime<Utc>) -> EventData {
    EventData::LeaseEnded(LeaseEnded {
        lease_id: lease,
        node_id: Some("a".into()),
        ended_at: at,
        reason,
        exit_code: None,
        failure: None,
    })
}

fn recoveries(d: &Decisions) -> Vec<&LeaseRequested> {
    events_of(d)
        .into_iter()
        .filter_map(|e| match e {
            EventData::LeaseRequested(r) => Some(r),
            _ => None,
        })
        .collect()
}

#[test]
fn a_preempted_lease_is_requested_again_in_its_zone_first_up_to_its_limit() {
    let (t, first, now) = (Uuid::from_u128(1), Uuid::from_u128(10), Utc::now());
    let mut s = given(vec![
        zone_node("a", "z1", 1),
        zone_node("b", "z2", 1),
        tenant(t, 10),
        EventData::LeaseRequested(LeaseRequested {
            zones: vec!["z2".into()],
            ..spot(first, t, None, Some(1))
        }),
    ]);
    settle(&mut s, now, &Rules::default());
    assert_eq!(placed_zone(&s, first).as_deref(), Some("z2"));
    s.apply(9_000, &env(ended(first, EndReason::Preempted, now)));
    let d = decide(&s);
    let again = recoveries(&d);
    assert_eq!(again.len(), 1);
    let second = again[0].clone();
    assert_eq!(second.lease_id, recovered_id(first));
    assert_eq!(
        second.recovery_of,
        Some(RecoveryOf {
            lease_id: first,
            first_lease_id: first,
            attempt: 1,
            zone: "z2".into()
        })
    );
    assert_eq!(
        (second.zones.clone(), second.tier),
        (vec!["z2".to_string()], Tier::Spot)
    );
    assert_eq!(
        d.batches[0][0].1,
        Expect::LastSubjectSequence(0),
        "a new lease"
    );
    // Once requested, not again; placed in the zone it left.
    settle(&mut s, now, &Rules::default());
    assert!(recoveries(&decide(&s)).is_empty());
    settle(&mut s, now, &Rules::default());
    assert_eq!(placed_zone(&s, second.lease_id).as_deref(), Some("z2"));
    // The limit is one retry: preempted again, it is not recovered.
    s.apply(
        9_500,
        &env(ended(second.lease_id, EndReason::Preempted, now)),
    );
    assert!(recoveries(&decide(&s)).is_empty());
    // A lease that ends on its own is not recovered either.
    assert_eq!((s.spot_stats.accepted, s.spot_stats.succeeded), (2, 0));
    assert_eq!(s.spot_stats.failed, 2, "evicted without notice");
}

#[test]
fn a_recovered_lease_tries_the_zone_it_left_first_then_any() {
    let (t, first, now) = (Uuid::from_u128(1), Uuid::from_u128(10), Utc::now());
    let mut s = given(vec![
        zone_node("a", "z1", 1),
        zone_node("b", "z2", 1),
        tenant(t, 10),
        EventData::LeaseRequested(spot(first, t, None, Some(2))),
    ]);
    settle(&mut s, now, &Rules::default());
    let left = placed_zone(&s, first).unwrap();
    s.apply(9_000, &env(ended(first, EndReason::Preempted, now)));
    settle(&mut s, now, &Rules::default());
    settle(&mut s, now, &Rules::default());
    let second = recovered_id(first);
    assert_eq!(
        placed_zone(&s, second),
        Some(left.clone()),
        "the same zone first"
    );
    // With the zone it left full, any other zone it may run in.
    let blocker = Uuid::from_u128(20);
    s.apply(9_500, &env(ended(second, EndReason::Preempted, now)));
    s.apply(
        9_501,
        &env(EventData::LeaseRequested(LeaseRequested {
            zones: vec![left.clone()],
            ..fixtures::whole_request(blocker, t, 1, fixtures::MODEL)
        })),
    );
    settle(&mut s, now, &Rules::default());
    settle(&mut s, now, &Rules::default());
    let third = recovered_id(second);
    assert_eq!(placed_zone(&s, blocker), Some(left.clone()));
    assert_ne!(placed_zone(&s, third), Some(left));
    assert!(placed_zone(&s, third).is_some());
}

#[test]
fn zone_and_region_constraints_bound_placement() {
    let (t, now) = (Uuid::from_u128(1), Utc::now());
    let (in_zone, in_region, nowhere) = (
        Uuid::from_u128(10),
        Uuid::from_u128(11),
        Uuid::from_u128(12),
    );
    let mut s = given(vec![
        zone_node("a", "cn-north.1", 1),
        zone_node("b", "cn-north.2", 1),
        zone_node("c", "cn-east.1", 1),
        tenant(t, 10),
        EventData::LeaseRequested(LeaseRequested {
            zones: vec!["cn-east.1".into()],
            ..fixtures::whole_request(in_zone, t, 1, fixtures::MODEL)
        }),
        EventData::LeaseRequested(LeaseRequested {
            regions: vec!["cn-north".into()],
            ..fixtures::whole_request(in_region, t, 1, fixtures::MODEL)
        }),
        EventData::LeaseRequested(LeaseRequested {
            regions: vec!["eu-west".into()],
            ..fixtures::whole_request(nowhere, t, 1, fixtures::MODEL)
        }),
    ]);
    settle(&mut s, now, &Rules::default());
    assert_eq!(placed_zone(&s, in_zone).as_deref(), Some("cn-east.1"));
    assert!(placed_zone(&s, in_region).unwrap().starts_with("cn-north."));
    assert!(matches!(&s.leases[&nowhere].status,
        Status::Queued { reason, .. } if reason.starts_with("no node offers A100-40GB in the zones")));
}

#[test]
fn spot_figures_survive_a_snapshot() {
    let (t, lease, now) = (Uuid::from_u128(1), Uuid::from_u128(10), Utc::now());
    let mut s = given(vec![
        zone_node("a", "z1", 1),
        price("z1", "0.1"),
        tenant(t, 10),
        EventData::LeaseRequested(spot(lease, t, Some(BID), Some(1))),
    ]);
    settle(&mut s, now, &Rules::default());
    s.apply(9_000, &env(ended(lease, EndReason::Preempted, now)));
    let mut restored = Given::default();
    assert!(restored.restore(s.snapshot()));
    assert_eq!(restored.spot_stats, s.spot_stats);
    assert_eq!(restored.spot_price("z1", fixtures::MODEL), Some(d("0.1")));
    assert_eq!(recoveries(&decide(&restored)).len(), 1);
}

#[test]
fn a_moved_lease_keeps_to_its_zones() {
    let (t, lease, now) = (Uuid::from_u128(1), Uuid::from_u128(10), Utc::now());
    let mut s = given(vec![
        zone_node("a", "cn-north.1", 1),
        zone_node("b", "cn-east.1", 1),
        zone_node("c", "cn-north.2", 1),
        tenant(t, 10),
        EventData::LeaseRequested(LeaseRequested {
            regions: vec!["cn-north".into()],
            ..fixtures::whole_request(lease, t, 1, fixtures::MODEL)
        }),
    ]);
    settle(&mut s, now, &Rules::default());
    let from = s.leases[&lease].node_id.clone().unwrap();
    let drain = |node: &str| {
        EventData::NodeCordoned(NodeCordoned {
            node_id: node.into(),
            drain: Some(DrainMode::Move),
            reason: "test".into(),
        })
    };
    s.apply(9_000, &env(drain(&from)));
    settle(&mut s, now, &Rules::default());
    let to = s.leases[&lease].node_id.clone().unwrap();
    assert_ne!(to, "b", "cn-east is outside its regions");
    assert_ne!(to, from);
    // With no node of its regions left, it waits rather than leave them.
    s.apply(9_500, &env(drain(&to)));
    settle(&mut s, now, &Rules::default());
    assert_eq!(s.leases[&lease].node_id, None);
    assert!(!s.fleet.holdings.contains_key(&lease));
}

#[test]
fn spot_ratios_read_one_while_nothing_happened() {
    let mut stats = SpotStats::default();
    assert_eq!(
        (stats.acceptance_ratio(), stats.success_ratio()),
        (1.0, 1.0)
    );
    (
        stats.requested,
        stats.accepted,
        stats.succeeded,
        stats.failed,
    ) = (4, 2, 3, 1);
    assert_eq!(
        (stats.acceptance_ratio(), stats.success_ratio()),
        (0.5, 0.75)
    );
}

#[test]
fn a_snapshot_without_the_spot_market_is_refused_and_changes_nothing() {
    let (t, lease) = (Uuid::from_u128(1), Uuid::from_u128(10));
    let s = given(vec![
        zone_node("a", "z1", 1),
        tenant(t, 10),
        request(lease, t, 1),
    ]);
    let mut older = s.snapshot();
    older.as_object_mut().unwrap().remove("spot");
    let mut restored = State::default();
    assert!(!restored.restore(older));
    assert!(restored.leases.is_empty() && restored.fleet.nodes.is_empty());
}
