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
    s.apply(
        90_000,
        &env(EventData::LeaseEnded(LeaseEnded {
            lease_id: l(1),
            node_id: Some("m".into()),
            ended_at: Utc::now(),
            reason: EndReason::Stopped,
            exit_code: None,
            failure: None,
        })),
    );
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(where_is(&s, l(3)), ("m".to_string(), vec![0]));
    assert!(inst(&s, l(3)).start >= 4, "in the slices the 3g.20gb freed");
}
