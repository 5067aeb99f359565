use super::given::*;

#[test]
fn mig_leases_get_instances_by_nvidia_rules_and_count_by_size() {
    let (t, u) = (Uuid::from_u128(1), Uuid::from_u128(9));
    let l = |i: u128| Uuid::from_u128(100 + i);
    let mut s = given(vec![
        node_mig("m", 1),
        node("a", 1),
        tenant_with(t, 1, Some(45), 1),
        tenant(u, 8),
        request_mig(l(1), t, "3g.20gb"),
        request_mig(l(2), t, "3g.20gb"),
        request_mig(l(3), t, "1g.5gb"),
        request(l(4), t, 1),
        request(l(5), u, 1),
        request_mig(l(6), u, "9g.99gb"),
    ]);
    let d = decide(&s).batches;
    let placed_events: Vec<&LeasePlaced> = d
        .iter()
        .filter_map(|b| match &b[0].0.data {
            EventData::LeasePlaced(p) => Some(p),
            _ => None,
        })
        .collect();
    let first = placed_events[0];
    assert_eq!((first.lease_id, first.node_id.as_str()), (l(1), "m"));
    assert_eq!(first.decision.policy, "mig-best-fit");
    assert_eq!(first.vram_gb_per_gpu, 20);
    assert_eq!(
        (first.gpus[0].milli, first.gpus[0].vram_gb),
        (Some(428), Some(20))
    );
    assert_eq!(
        first.gpus[0].mig_instance,
        Some(MigInstance {
            profile: "3g.20gb".into(),
            start: 4
        })
    );
    settle(&mut s, Utc::now(), &Rules::default());
    // The second 3g.20gb goes next to the first (slots 0-3); the 1g.5gb
    // finds no memory slice left and waits; the whole GPU would take the
    // tenant past its 1-GPU quota (856 milli held); the other tenant's
    // whole GPU goes to the GPU outside MIG mode.
    let inst = |s: &State, lease| s.fleet.mig_instances[&lease].clone();
    assert_eq!(inst(&s, l(2)).start, 0);
    assert_eq!(where_is(&s, l(2)), ("m".to_string(), vec![0]));
    assert_eq!(where_is(&s, l(5)), ("a".to_string(), vec![0]));
    assert!(!s.leases.contains_key(&l(4)), "rejected by quota");
    let reason = |s: &State, lease| match &s.leases[&lease].status {
        Status::Queued { reason, .. } => reason.clone(),
        other => panic!("{other:?}"),
    };
    assert!(reason(&s, l(3)).starts_with("waiting for capacity: no room for a 1g.5gb"));
    assert_eq!(reason(&s, l(6)), "A100-40GB has no MIG profile 9g.99gb");
    let gpu = &s.fleet.nodes["m"].gpus[0];
    assert_eq!((gpu.used_milli(), gpu.used_vram_gb()), (856, 40));

    // The first instance ends and is destroyed: the 1g.5gb fits now.
    s.apply(90_000, &env(stopped(l(1), "m")));
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(where_is(&s, l(3)), ("m".to_string(), vec![0]));
    assert!(inst(&s, l(3)).start >= 4, "in the slices the 3g.20gb freed");
}

/// A MIG node whose GPU 0 holds instances no lease holds.
fn node_mig_unowned(id: &str, n: u32, unowned: &[(&str, u8)]) -> EventData {
    let EventData::NodeRegistered(mut r) = node_mig(id, n) else {
        unreachable!()
    };
    r.gpus[0].unowned_mig_instances = unowned
        .iter()
        .map(|(profile, start)| MigInstance {
            profile: profile.to_string(),
            start: *start,
        })
        .collect();
    EventData::NodeRegistered(r)
}

#[test]
fn instances_that_belong_to_no_lease_keep_leases_off_their_slots() {
    let t = Uuid::from_u128(1);
    let l = |i: u128| Uuid::from_u128(100 + i);
    // Node m's GPU holds an operator's 1g.5gb at slot 0; node n's GPU is
    // empty. A 4g.20gb can only start at slot 0: it goes to n, and a second
    // one finds no room anywhere and says why.
    let events = vec![
        node_mig_unowned("m", 1, &[("1g.5gb", 0)]),
        node_mig("n", 1),
        tenant(t, 8),
        request_mig(l(1), t, "4g.20gb"),
        request_mig(l(2), t, "4g.20gb"),
    ];
    let mut s = given(events.clone());
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(where_is(&s, l(1)), ("n".to_string(), vec![0]));
    let reason = |s: &State, lease| match &s.leases[&lease].status {
        Status::Queued { reason, .. } => reason.clone(),
        other => panic!("{other:?}"),
    };
    let waits = reason(&s, l(2));
    assert!(
        waits.starts_with("waiting for capacity: no room for a 4g.20gb"),
        "n's lease may end: {waits}"
    );

    // Once n's lease ends, n takes the 4g.20gb; a third one waits (n's
    // lease may end), never on m.
    s.apply(90_000, &env(stopped(l(1), "n")));
    s.apply(90_001, &env(request_mig(l(4), t, "4g.20gb")));
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(where_is(&s, l(2)), ("n".to_string(), vec![0]));
    assert!(!s.fleet.holdings.contains_key(&l(4)));
    assert!(reason(&s, l(4)).starts_with("waiting for capacity"));

    // A scheduler that folds the same log from the start decides the same.
    let mut again = given(events);
    settle(&mut again, Utc::now(), &Rules::default());
    assert_eq!(where_is(&again, l(1)), ("n".to_string(), vec![0]));
    assert!(!again.fleet.holdings.contains_key(&l(2)));

    // The operator destroys it: m registers again without it, and the
    // waiting 4g.20gb takes slot 0.
    s.apply(90_002, &env(node_mig("m", 1)));
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(where_is(&s, l(4)), ("m".to_string(), vec![0]));
    assert_eq!(s.fleet.mig_instances[&l(4)].start, 0);
}

#[test]
fn a_lease_instance_goes_beside_an_unowned_one_and_the_gpu_is_not_resliced() {
    let t = Uuid::from_u128(1);
    let l = |i: u128| Uuid::from_u128(100 + i);
    // Without it, a 3g.20gb takes slot 4 (see above); an operator's 1g.5gb
    // sits there, so slot 0 it is, and the next 3g.20gb waits.
    let mut s = given(vec![
        node_mig_unowned("m", 1, &[("1g.5gb", 4)]),
        tenant(t, 8),
        request_mig(l(1), t, "3g.20gb"),
        request_mig(l(2), t, "3g.20gb"),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(where_is(&s, l(1)), ("m".to_string(), vec![0]));
    assert_eq!(s.fleet.mig_instances[&l(1)].start, 0);
    assert!(!s.fleet.holdings.contains_key(&l(2)));
    // A 7g.40gb needs the whole GPU: an idle GPU may be re-sliced, but not
    // one that holds an instance nobody's lease holds.
    s.apply(90_000, &env(stopped(l(1), "m")));
    s.apply(90_001, &env(request_mig(l(3), t, "7g.40gb")));
    settle(&mut s, Utc::now(), &Rules::default());
    assert!(!s.fleet.holdings.contains_key(&l(3)));
    match &s.leases[&l(3)].status {
        Status::Queued { reason, .. } => assert!(
            reason.starts_with(crate::state::pending::UNOWNED_MIG_IN_THE_WAY),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
}

/// `lease.ended` of a lease its tenant stopped on `node`.
fn stopped(lease_id: Uuid, node: &str) -> EventData {
    EventData::LeaseEnded(LeaseEnded {
        lease_id,
        node_id: Some(node.into()),
        ended_at: Utc::now(),
        reason: EndReason::Stopped,
        exit_code: None,
        failure: None,
    })
}
