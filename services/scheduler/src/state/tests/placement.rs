use super::given::*;

#[test]
fn fractions_pack_onto_one_gpu_until_its_vram_is_spent() {
    let t = Uuid::from_u128(1);
    let (f1, f2, f3) = (Uuid::from_u128(2), Uuid::from_u128(3), Uuid::from_u128(4));
    let mut s = given(vec![
        node("a", 2),
        tenant(t, 16),
        request_frac(f1, t, 300, 10),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    s.apply(5000, &env(request_frac(f2, t, 500, 20)));
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(where_is(&s, f1), where_is(&s, f2), "same GPU");
    // 10 GB left on that GPU: a 15 GB share goes to the other one.
    s.apply(6000, &env(request_frac(f3, t, 100, 15)));
    let d = decide(&s).batches;
    match &d[0][0].0.data {
        EventData::LeasePlaced(p) => {
            assert_eq!(p.decision.policy, "leasehold");
            assert_eq!(p.vram_gb_per_gpu, 15);
            assert_eq!(p.gpus[0].milli, Some(100));
            assert_eq!(p.gpus[0].vram_gb, Some(15));
        }
        other => panic!("{other:?}"),
    }
    settle(&mut s, Utc::now(), &Rules::default());
    assert_ne!(where_is(&s, f3).1, where_is(&s, f1).1);
    let gpu = &s.fleet.nodes["a"].gpus[where_is(&s, f1).1[0] as usize];
    assert_eq!((gpu.used_milli(), gpu.used_vram_gb()), (800, 30));
    // A whole GPU is not free while shared: a 2-GPU lease waits.
    s.apply(7000, &env(request(Uuid::from_u128(5), t, 2)));
    settle(&mut s, Utc::now(), &Rules::default());
    assert!(matches!(
        s.leases[&Uuid::from_u128(5)].status,
        Status::Queued { .. }
    ));
}

#[test]
fn observations_on_a_lease_count_toward_the_sequence_its_writes_expect() {
    let t = Uuid::from_u128(1);
    let l1 = Uuid::from_u128(2);
    let t0 = Utc::now();
    let mut s = given(vec![
        node("a", 1),
        node("b", 1),
        tenant(t, 8),
        request(l1, t, 1),
    ]);
    settle(&mut s, t0, &Rules::default());
    let from = where_is(&s, l1).0;
    // The node-agent reports the lease idle, on the lease's subject.
    s.apply(
        9000,
        &env(EventData::LeaseIdleDetected(lh_events::LeaseIdleDetected {
            lease_id: l1,
            node_id: from.clone(),
            idle_since: t0,
            window_seconds: 300,
            action: lh_events::IdleAction::Notify,
            at: t0,
        })),
    );
    s.apply(
        9001,
        &env(EventData::NodeCordoned(NodeCordoned {
            node_id: from,
            drain: Some(DrainMode::Move),
            reason: "test".into(),
        })),
    );
    let d = decide_at(&s, t0, &Rules::default());
    let moved = d
        .batches
        .iter()
        .flatten()
        .find(|(e, _)| matches!(e.data, EventData::LeaseMigrated(_)))
        .expect("the lease moves");
    assert_eq!(moved.1, Expect::LastSubjectSequence(9000));
}

#[test]
fn places_with_expectations_on_lease_and_node() {
    let t = Uuid::from_u128(1);
    let l = Uuid::from_u128(2);
    let s = given(vec![node("a", 8), tenant(t, 16), request(l, t, 2)]);
    let d = decide(&s).batches;
    assert_eq!(d.len(), 1);
    let batch = &d[0];
    assert_eq!(batch.len(), 2);
    assert_eq!(batch[0].0.event_type, "lease.placed");
    assert_eq!(batch[0].1, Expect::LastSubjectSequence(3));
    assert_eq!(batch[1].0.event_type, "node.gpus_allocated");
    assert_eq!(batch[1].1, Expect::LastSubjectSequence(1));
}

#[test]
fn two_placements_on_one_node_chain_their_node_expectations() {
    let t = Uuid::from_u128(1);
    let s = given(vec![
        node("a", 8),
        tenant(t, 100),
        request(Uuid::from_u128(2), t, 1),
        request(Uuid::from_u128(3), t, 1),
    ]);
    let d = decide(&s).batches;
    assert_eq!(d.len(), 2);
    // The first expects the node as the state saw it (its registration,
    // sequence 1). Packed as the decide loop packs, the second allocation
    // merges into the first's message; in a later batch the loop would
    // chain it to the sequence the first got.
    assert_eq!(d[0][1].1, Expect::LastSubjectSequence(1));
    let scheduling = crate::Scheduling::new(
        crate::Config::for_test("nats://unused").rules(),
        s.liveness_since.unwrap_or_else(chrono::Utc::now),
    );
    use lh_service::decider::Decider as _;
    let packed = lh_service::decider::pack(
        d.clone(),
        |first, more| scheduling.can_merge(first, more),
        |first, more| scheduling.merge(first, more),
    );
    assert_eq!(packed.len(), 1);
    let nodes: Vec<_> = packed[0]
        .iter()
        .filter(|(e, _)| e.event_type == "node.gpus_allocated")
        .collect();
    assert_eq!(nodes.len(), 1, "one write per node per batch");
    assert_eq!(nodes[0].1, Expect::LastSubjectSequence(1));
    let indices: Vec<u32> = d
        .iter()
        .filter_map(|b| match &b[1].0.data {
            EventData::NodeGpusAllocated(a) => Some(a.allocations[0].gpu_indices[0]),
            _ => None,
        })
        .collect();
    assert_eq!(indices, vec![0, 1], "distinct GPUs");
}

#[test]
fn same_state_same_decision() {
    let t = Uuid::from_u128(1);
    let s = given(vec![
        node("b", 8),
        node("a", 8),
        tenant(t, 16),
        request(Uuid::from_u128(2), t, 2),
    ]);
    let now = Utc::now();
    let flat = |d: Decisions| -> Vec<(Uuid, EventData, Expect)> {
        d.batches
            .into_iter()
            .flatten()
            .map(|(e, x)| (e.id, e.data, x))
            .collect()
    };
    // The second pass plans with the engine the first one left.
    let mut engine = PlacementEngineCache::default();
    assert_eq!(
        flat(s.decide(now, &Rules::default(), &mut engine)),
        flat(s.decide(now, &Rules::default(), &mut engine))
    );
}

#[test]
fn a_waiting_lease_says_whether_busy_gpus_or_the_fleet_keep_it_out() {
    let t = Uuid::from_u128(1);
    let l = Uuid::from_u128;
    let mut s = given(vec![
        node("a", 2),
        node_mig("m", 1),
        tenant(t, 100),
        request(l(2), t, 2),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    s.apply(5000, &env(request(l(3), t, 1)));
    s.apply(5001, &env(request(l(4), t, 3)));
    s.apply(5002, &env(request_frac(l(5), t, 500, 41)));
    s.apply(5003, &env(request_frac(l(6), t, 500, 10)));
    settle(&mut s, Utc::now(), &Rules::default());
    let reason = |lease| match &s.leases[&lease].status {
        Status::Queued { reason, .. } => reason.clone(),
        other => panic!("{other:?}"),
    };
    // Busy: the node could take it once its lease ends.
    assert_eq!(
        reason(l(3)),
        "waiting for capacity: 1 x A100-40GB requested, at most 0 free on one node"
    );
    assert!(reason(l(6)).starts_with("waiting for capacity: a share of 500 milli / 10 GB"));
    // Never, as the fleet is: a GPU in MIG mode takes no whole-GPU lease,
    // and across nodes its region holds no more.
    assert_eq!(
        reason(l(4)),
        "3 x A100-40GB requested but the largest node has 2, and the nodes of one region 2 at most"
    );
    assert_eq!(
        reason(l(5)),
        "a share of 500 milli / 41 GB does not fit one A100-40GB (40 GB)"
    );
}

#[test]
fn no_gpu_in_the_right_mode_is_not_a_wait_for_capacity() {
    let t = Uuid::from_u128(1);
    let l = Uuid::from_u128;
    let mut s = given(vec![node_mig("m", 2), tenant(t, 100), request(l(2), t, 1)]);
    settle(&mut s, Utc::now(), &Rules::default());
    match &s.leases[&l(2)].status {
        Status::Queued { reason, .. } => assert_eq!(reason, "no A100-40GB out of MIG mode yet"),
        other => panic!("{other:?}"),
    }
    let mut s = given(vec![
        node("a", 2),
        tenant(t, 100),
        request_mig(l(2), t, "1g.5gb"),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    match &s.leases[&l(2)].status {
        Status::Queued { reason, .. } => assert_eq!(reason, "no A100-40GB in MIG mode yet"),
        other => panic!("{other:?}"),
    }
}
