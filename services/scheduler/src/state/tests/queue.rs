use super::given::*;

#[test]
fn a_fraction_counts_its_milli_and_vram_toward_the_quotas() {
    let t = Uuid::from_u128(1);
    // 1 GPU and 30 GB: 600 + 300 milli fit the GPU quota, a third
    // 200 milli does not; VRAM 20 + 10 fits, nothing more.
    let mut s = given(vec![
        node("a", 4),
        tenant_with(t, 1, Some(30), 1),
        request_frac(Uuid::from_u128(2), t, 600, 20),
        request_frac(Uuid::from_u128(3), t, 300, 10),
        request_frac(Uuid::from_u128(4), t, 50, 1),
        request_frac(Uuid::from_u128(5), t, 200, 1),
    ]);
    let d = decide(&s).batches;
    let fields: Vec<Option<String>> = d
        .iter()
        .filter_map(|b| match &b[0].0.data {
            EventData::LeaseRejected(r) => Some(r.field.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(fields, vec![Some("gpu_fraction".into()); 2]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(placed(&s), vec![Uuid::from_u128(2), Uuid::from_u128(3)]);
}

#[test]
fn a_resumed_lease_over_quota_waits_instead_of_being_rejected() {
    let t = Uuid::from_u128(1);
    let (l1, l2) = (Uuid::from_u128(2), Uuid::from_u128(3));
    let t0 = Utc::now();
    let mut s = given(vec![node("a", 2), tenant(t, 1), request(l1, t, 1)]);
    settle(&mut s, t0, &Rules::default());
    let (node_id, _) = where_is(&s, l1);
    s.apply(9000, &env(suspended(l1, &node_id, t0)));
    s.apply(9001, &env(request(l2, t, 1)));
    settle(&mut s, t0, &Rules::default());
    assert!(s.fleet.holdings.contains_key(&l2), "the quota had room");
    s.apply(
        20_000,
        &env(EventData::LeaseResumeRequested(
            lh_events::LeaseResumeRequested { lease_id: l1 },
        )),
    );
    let d = decide_at(&s, t0, &Rules::default());
    match events_of(&d)[..] {
        [EventData::LeaseQueued(q)] => {
            assert_eq!(q.lease_id, l1);
            assert!(q.reason.starts_with("quota exceeded"), "{}", q.reason);
        }
        ref other => panic!("{other:?}"),
    }
    settle(&mut s, t0, &Rules::default());
    assert!(
        decide_at(&s, t0, &Rules::default()).batches.is_empty(),
        "said once"
    );
}

#[test]
fn a_suspended_lease_holds_nothing_until_resumed_and_a_stop_ends_it() {
    let t = Uuid::from_u128(1);
    let l1 = Uuid::from_u128(2);
    let t0 = Utc::now();
    let mut s = given(vec![node("a", 1), tenant(t, 1), request(l1, t, 1)]);
    settle(&mut s, t0, &Rules::default());
    let (node_id, _) = where_is(&s, l1);
    s.apply(9000, &env(suspended(l1, &node_id, t0)));
    assert!(!s.fleet.holdings.contains_key(&l1), "GPU freed");
    assert!(
        decide_at(&s, t0, &Rules::default()).batches.is_empty(),
        "not queued"
    );
    assert!(s.tenant_usage().is_empty(), "counts nothing toward quota");
    s.apply(
        9001,
        &env(EventData::LeaseResumeRequested(
            lh_events::LeaseResumeRequested { lease_id: l1 },
        )),
    );
    settle(&mut s, t0, &Rules::default());
    assert_eq!(where_is(&s, l1).0, "a", "placed again");
    // Suspended again, then stopped: the scheduler ends it.
    s.apply(20_000, &env(suspended(l1, "a", t0)));
    s.apply(
        20_001,
        &env(EventData::LeaseStopRequested(LeaseStopRequested {
            lease_id: l1,
        })),
    );
    let d = decide_at(&s, t0, &Rules::default());
    match events_of(&d)[..] {
        [EventData::LeaseEnded(e)] => assert_eq!(e.reason, EndReason::Stopped),
        ref other => panic!("{other:?}"),
    }
}

#[test]
fn quota_breach_is_rejected_with_the_field() {
    let t = Uuid::from_u128(1);
    let s = given(vec![
        node("a", 8),
        tenant(t, 2),
        request(Uuid::from_u128(2), t, 2),
        request(Uuid::from_u128(3), t, 1),
    ]);
    let d = decide(&s).batches;
    assert_eq!(d.len(), 2);
    assert_eq!(d[0][0].0.event_type, "lease.placed");
    match &d[1][0].0.data {
        EventData::LeaseRejected(r) => {
            assert_eq!(r.field.as_deref(), Some("gpus"));
            assert!(r.reason.contains("quota"), "{}", r.reason);
        }
        other => panic!("expected rejection, got {other:?}"),
    }
}

#[test]
fn vram_quota_counts_gigabytes_not_devices() {
    let t = Uuid::from_u128(1);
    // 100 GB allows two 40 GB GPUs, not three.
    let mut s = given(vec![
        node("a", 8),
        tenant_with(t, 8, Some(100), 1),
        request(Uuid::from_u128(2), t, 2),
        request(Uuid::from_u128(3), t, 1),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(placed(&s), vec![Uuid::from_u128(2)]);
    assert!(!s.leases.contains_key(&Uuid::from_u128(3)), "rejected");
}

#[test]
fn smaller_requests_backfill_around_a_waiting_one() {
    let t = Uuid::from_u128(1);
    let s = given(vec![
        node("a", 4),
        tenant(t, 100),
        request(Uuid::from_u128(2), t, 3),
        request(Uuid::from_u128(3), t, 2),
        request(Uuid::from_u128(4), t, 1),
    ]);
    let d = decide(&s).batches;
    let types: Vec<&str> = d.iter().map(|b| b[0].0.event_type.as_str()).collect();
    // 3 placed; 2 does not fit and queues; 1 fits around it.
    assert_eq!(types, vec!["lease.placed", "lease.queued", "lease.placed"]);
    let mut s = s;
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(placed(&s), vec![Uuid::from_u128(2), Uuid::from_u128(4)]);
    match &s.leases[&Uuid::from_u128(3)].status {
        Status::Queued { position, .. } => assert_eq!(*position, 1),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_starving_lease_stops_backfill() {
    let t = Uuid::from_u128(1);
    let long_ago = Utc::now() - Duration::hours(1);
    let mut s = Given::default();
    s.apply(1, &env(node("a", 4)));
    s.apply(2, &env(tenant(t, 100)));
    s.apply(3, &env(request(Uuid::from_u128(2), t, 3)));
    s.apply(4, &env_at(request(Uuid::from_u128(3), t, 2), long_ago));
    s.apply(5, &env(request(Uuid::from_u128(4), t, 1)));
    settle(&mut s, Utc::now(), &Rules::default());
    // Lease 3 (2 GPUs) has waited an hour: lease 4 may not take the last GPU.
    assert_eq!(placed(&s), vec![Uuid::from_u128(2)]);
}

#[test]
fn on_demand_goes_before_spot_and_priority_within_a_tenant() {
    let t = Uuid::from_u128(1);
    let s = given(vec![
        tenant(t, 100),
        request_full(Uuid::from_u128(10), t, 1, Tier::Spot, 0),
        request_full(Uuid::from_u128(11), t, 1, Tier::Basic, 0),
        request_full(Uuid::from_u128(12), t, 1, Tier::Basic, 5),
    ]);
    assert_eq!(
        s.queue_order(),
        vec![
            Uuid::from_u128(12),
            Uuid::from_u128(11),
            Uuid::from_u128(10)
        ]
    );
}

#[test]
fn weighted_fair_share_interleaves_tenants() {
    let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
    let mut events = vec![tenant_with(a, 100, None, 1), tenant_with(b, 100, None, 2)];
    for i in 0..6 {
        events.push(request(Uuid::from_u128(100 + i), a, 1));
    }
    for i in 0..6 {
        events.push(request(Uuid::from_u128(200 + i), b, 1));
    }
    let s = given(events);
    let order: Vec<Uuid> = s.queue_order();
    let owners: String = order
        .iter()
        .map(|id| {
            if s.leases[id].tenant_id == a {
                'a'
            } else {
                'b'
            }
        })
        .collect();
    // B has twice the weight: it gets about two leases per one of A's.
    assert_eq!(&owners[..9], "abbabbabb");
}

#[test]
fn a_queued_lease_is_placed_when_capacity_frees_and_stop_cancels_waiting() {
    let t = Uuid::from_u128(1);
    let (a, b, c) = (Uuid::from_u128(2), Uuid::from_u128(3), Uuid::from_u128(4));
    let mut s = given(vec![
        node("a", 2),
        tenant(t, 100),
        request(a, t, 2),
        request(b, t, 2),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert!(matches!(s.leases[&b].status, Status::Queued { .. }));
    s.apply(
        101,
        &env(EventData::LeaseEnded(LeaseEnded {
            lease_id: a,
            node_id: Some("a".into()),
            ended_at: Utc::now(),
            reason: EndReason::Stopped,
            exit_code: None,
            failure: None,
        })),
    );
    s.apply(102, &env(request(c, t, 1)));
    s.apply(
        103,
        &env(EventData::LeaseStopRequested(LeaseStopRequested {
            lease_id: c,
        })),
    );
    let d = decide(&s).batches;
    assert_eq!(d[0][0].0.event_type, "lease.placed");
    assert_eq!(d[1][0].0.event_type, "lease.ended");
}

#[test]
fn on_demand_preempts_the_cheapest_old_enough_spot_leases() {
    let (t, now) = (Uuid::from_u128(1), Utc::now());
    let (old_small, old_big, young) = (
        Uuid::from_u128(10),
        Uuid::from_u128(11),
        Uuid::from_u128(12),
    );
    let mut s = given(vec![
        node("a", 4),
        tenant(t, 100),
        request_full(old_big, t, 2, Tier::Spot, 0),
        request_full(old_small, t, 1, Tier::Spot, 0),
        request_full(young, t, 1, Tier::Spot, 0),
    ]);
    settle(&mut s, now, &Rules::default());
    s.apply(5050, &env(started(old_big, now - Duration::minutes(30))));
    s.apply(5051, &env(started(old_small, now - Duration::minutes(20))));
    s.apply(5052, &env(started(young, now - Duration::minutes(1))));
    let on_demand = Uuid::from_u128(20);
    s.apply(5053, &env(request(on_demand, t, 1)));
    let d = decide_at(&s, now, &Rules::default()).batches;
    let notices: Vec<&LeasePreemptionNoticed> = d
        .iter()
        .flatten()
        .filter_map(|(e, _)| match &e.data {
            EventData::LeasePreemptionNoticed(n) => Some(n),
            _ => None,
        })
        .collect();
    // One GPU is needed: the 1-GPU lease is cheapest; the young one is exempt.
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].lease_id, old_small);
    assert_eq!(notices[0].preempted_for, on_demand);
    assert_eq!(notices[0].deadline, now + Duration::seconds(120));
    assert_eq!(notices[0].reason, PreemptionReason::Capacity);
    // Once noticed, nothing is preempted twice.
    for batch in &d {
        for (e, _) in batch {
            s.apply(5060, e);
        }
    }
    let again = decide_at(&s, now, &Rules::default()).batches;
    assert!(again
        .iter()
        .flatten()
        .all(|(e, _)| e.event_type != "lease.preemption_noticed"));
    // The victim ends at its deadline: the on-demand lease gets the GPU.
    s.apply(
        70,
        &env(EventData::LeaseEnded(LeaseEnded {
            lease_id: old_small,
            node_id: Some("a".into()),
            ended_at: now,
            reason: EndReason::Preempted,
            exit_code: None,
            failure: None,
        })),
    );
    settle(&mut s, now, &Rules::default());
    assert_eq!(s.leases[&on_demand].status, Status::Holding);
}

#[test]
fn spot_never_preempts_and_young_spot_is_safe() {
    let (t, now) = (Uuid::from_u128(1), Utc::now());
    let young = Uuid::from_u128(10);
    let mut s = given(vec![
        node("a", 1),
        tenant(t, 100),
        request_full(young, t, 1, Tier::Spot, 0),
    ]);
    settle(&mut s, now, &Rules::default());
    s.apply(5050, &env(started(young, now - Duration::minutes(9))));
    s.apply(
        5051,
        &env(request_full(Uuid::from_u128(11), t, 1, Tier::Spot, 0)),
    );
    s.apply(5052, &env(request(Uuid::from_u128(12), t, 1)));
    let d = decide_at(&s, now, &Rules::default()).batches;
    assert!(d
        .iter()
        .flatten()
        .all(|(e, _)| e.event_type != "lease.preemption_noticed"));
}

/// The preemption notices a pass gives, as (victim, preempted for).
fn notices_of(d: &[lh_service::decider::Batch]) -> Vec<(Uuid, Uuid)> {
    d.iter()
        .flatten()
        .filter_map(|(e, _)| match &e.data {
            EventData::LeasePreemptionNoticed(n) => Some((n.lease_id, n.preempted_for)),
            _ => None,
        })
        .collect()
}

#[test]
fn performance_and_reserved_are_on_demand_and_preempt_spot() {
    for tier in [Tier::Performance, Tier::Reserved] {
        let (t, now) = (Uuid::from_u128(1), Utc::now());
        let spot = Uuid::from_u128(10);
        let mut s = given(vec![
            node("a", 1),
            tenant(t, 100),
            request_full(spot, t, 1, Tier::Spot, 0),
        ]);
        settle(&mut s, now, &Rules::default());
        s.apply(5050, &env(started(spot, now - Duration::minutes(30))));
        let on_demand = Uuid::from_u128(20);
        s.apply(5051, &env(request_full(on_demand, t, 1, tier, 0)));
        let d = decide_at(&s, now, &Rules::default()).batches;
        assert_eq!(notices_of(&d), vec![(spot, on_demand)], "{tier:?}");
    }
}

#[test]
fn spot_never_preempts_performance_or_reserved() {
    for tier in [Tier::Performance, Tier::Reserved] {
        let (t, now) = (Uuid::from_u128(1), Utc::now());
        let held = Uuid::from_u128(10);
        let mut s = given(vec![
            node("a", 1),
            tenant(t, 100),
            request_full(held, t, 1, tier, 0),
        ]);
        settle(&mut s, now, &Rules::default());
        s.apply(5050, &env(started(held, now - Duration::minutes(30))));
        s.apply(
            5051,
            &env(request_full(Uuid::from_u128(11), t, 1, Tier::Spot, 0)),
        );
        let d = decide_at(&s, now, &Rules::default()).batches;
        assert_eq!(notices_of(&d), vec![], "{tier:?}");
        assert!(s.fleet.holdings.contains_key(&held), "{tier:?}");
    }
}

#[test]
fn a_changed_quota_governs_new_placements() {
    let t = Uuid::from_u128(1);
    let mut s = given(vec![
        node("a", 8),
        tenant(t, 1),
        EventData::TenantQuotaChanged(lh_events::TenantQuotaChanged {
            tenant_id: t,
            quota: lh_events::Quota {
                max_gpus: 3,
                max_vram_gb: None,
                max_storage_gb: None,
            },
            weight: 2,
        }),
        request(Uuid::from_u128(2), t, 2),
        request(Uuid::from_u128(3), t, 2),
    ]);
    assert_eq!(s.tenants[&t].weight, 2);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(
        placed(&s),
        vec![Uuid::from_u128(2)],
        "3 GPUs allow 2, not 4"
    );
    assert!(!s.leases.contains_key(&Uuid::from_u128(3)), "rejected");
}

#[test]
fn a_suspended_tenants_leases_wait_until_it_is_resumed() {
    let t = Uuid::from_u128(1);
    let lease = Uuid::from_u128(2);
    let mut s = given(vec![
        node("a", 8),
        tenant(t, 4),
        EventData::TenantSuspended(lh_events::TenantSuspended {
            tenant_id: t,
            reason_sealed: "c2VhbGVk".into(),
            stop_leases: false,
        }),
        request(lease, t, 1),
    ]);
    let d = decide(&s).batches;
    match &d[..] {
        [b] => match &b[0].0.data {
            EventData::LeaseQueued(q) => assert_eq!(q.reason, SUSPENDED_TENANT),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    settle(&mut s, Utc::now(), &Rules::default());
    assert!(placed(&s).is_empty());
    assert!(decide(&s).batches.is_empty(), "told once");
    s.apply(
        5_000,
        &env(EventData::TenantResumed(lh_events::TenantResumed {
            tenant_id: t,
        })),
    );
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(placed(&s), vec![lease]);
}
