//! Leases of more GPUs than a node holds: one `lease.placed` naming every
//! member, a `node.gpus_allocated` per member in the same batch, all of the
//! gang's GPUs held until it ends, and a reason that says what is missing
//! while it waits.

use super::given::*;

fn ended(lease: Uuid) -> EventData {
    EventData::LeaseEnded(LeaseEnded {
        lease_id: lease,
        node_id: None,
        ended_at: Utc::now(),
        reason: EndReason::Stopped,
        exit_code: None,
        failure: None,
    })
}

#[test]
fn sixteen_gpus_are_placed_on_two_nodes_in_one_batch_and_held_until_the_end() {
    let t = Uuid::from_u128(1);
    let gang = Uuid::from_u128(2);
    let mut s = given(vec![
        node("a", 8),
        node("b", 8),
        node("c", 4),
        tenant(t, 17),
        request(gang, t, 16),
    ]);
    let d = decide(&s);
    assert_eq!(d.batches.len(), 1, "one atomic batch");
    let batch = &d.batches[0];
    let EventData::LeasePlaced(p) = &batch[0].0.data else {
        panic!("{:?}", batch[0].0.data)
    };
    let mut members: Vec<(&str, usize)> = p
        .members
        .iter()
        .map(|m| (m.node_id.as_str(), m.gpus.len()))
        .collect();
    let in_rank_order: Vec<&str> = members.iter().map(|m| m.0).collect();
    members.sort();
    assert_eq!(members, [("a", 8), ("b", 8)]);
    assert_eq!(p.node_id, in_rank_order[0], "the first member");
    assert_eq!(p.gpu_count(), 16);
    assert_eq!(
        p.members[1].address, in_rank_order[1],
        "its registered host name"
    );
    // One allocation per member, each guarded by its own node's sequence,
    // each an event of its own.
    let allocated: Vec<&str> = batch[1..]
        .iter()
        .map(|(e, _)| match &e.data {
            EventData::NodeGpusAllocated(a) => a.node_id.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(allocated, in_rank_order);
    assert!(batch[1..]
        .iter()
        .all(|(_, x)| matches!(x, Expect::LastSubjectSequence(_))));
    assert_ne!(batch[1].0.id, batch[2].0.id);

    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(placed(&s), [gang]);
    let held = |s: &State, node: &str| {
        s.fleet.nodes[node]
            .gpus
            .iter()
            .filter(|g| g.held_by == Some(gang))
            .count()
    };
    assert_eq!((held(&s, "a"), held(&s, "b"), held(&s, "c")), (8, 8, 0));
    // A one-GPU lease goes to the only node left.
    let one = Uuid::from_u128(3);
    s.apply(9_000, &env(request(one, t, 1)));
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(where_is(&s, one).0, "c");

    // The gang's end gives back every member's GPUs.
    s.apply(10_000, &env(ended(gang)));
    assert_eq!((held(&s, "a"), held(&s, "b")), (0, 0));
    assert!(s.fleet.gang_members.is_empty());
}

#[test]
fn a_waiting_gang_takes_nothing_and_says_what_its_region_lacks() {
    let t = Uuid::from_u128(1);
    let (busy, gang) = (Uuid::from_u128(2), Uuid::from_u128(3));
    let mut s = given(vec![
        node("a", 8),
        node("b", 8),
        tenant(t, 32),
        request(busy, t, 4),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    s.apply(5_000, &env(request(gang, t, 16)));
    let d = decide(&s);
    let events = events_of(&d);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EventData::NodeGpusAllocated(_))),
        "{events:?}"
    );
    let reason = events
        .iter()
        .find_map(|e| match e {
            EventData::LeaseQueued(q) if q.lease_id == gang => Some(q.reason.clone()),
            _ => None,
        })
        .expect("the gang is told why it waits");
    assert_eq!(
        reason,
        format!(
            "waiting for capacity: 16 x {}: 16 GPUs span nodes of one region: z has 12 of them \
             free now, 16 with every lease there ended",
            fixtures::MODEL
        )
    );
    // Once the small lease ends, the gang goes.
    s.apply(6_000, &env(ended(busy)));
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(placed(&s), [gang]);
}

#[test]
fn a_tenants_quota_counts_every_gpu_of_its_gang() {
    let t = Uuid::from_u128(1);
    let (gang, one) = (Uuid::from_u128(2), Uuid::from_u128(3));
    let mut s = given(vec![
        node("a", 8),
        node("b", 8),
        node("c", 8),
        tenant(t, 16),
        request(gang, t, 16),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(placed(&s), [gang]);
    s.apply(9_000, &env(request(one, t, 1)));
    let refused = events_of(&decide(&s)).into_iter().find_map(|e| match e {
        EventData::LeaseRejected(r) => Some(r.reason.clone()),
        _ => None,
    });
    assert_eq!(
        refused.as_deref(),
        Some("quota exceeded: tenant holds 16 GPUs, asks for 1 more, quota is 16")
    );
}

#[test]
fn a_lost_member_moves_the_whole_gang_and_it_is_placed_again_without_that_node() {
    let t = Uuid::from_u128(1);
    let gang = Uuid::from_u128(2);
    let t0 = Utc::now();
    let mut s = given(vec![
        node("a", 8),
        node("b", 8),
        node("c", 8),
        tenant(t, 16),
        request(gang, t, 16),
    ]);
    settle(&mut s, t0, &Rules::default());
    let first = where_is(&s, gang).0;
    let member = s.fleet.gang_members[&gang][0].0.clone();
    let rules = Rules::default();
    s.liveness_since = Some(t0);
    let at = |secs: i64| t0 + Duration::seconds(secs);
    // The member other than the first falls silent.
    for n in ["a", "b", "c"] {
        let heard = if n == member { at(1) } else { at(5) };
        s.heard(n, heard, heard);
    }
    let d = decide_at(&s, at(5), &rules);
    let moved = events_of(&d)
        .into_iter()
        .find_map(|e| match e {
            EventData::LeaseMigrated(m) => Some(m.clone()),
            _ => None,
        })
        .expect("the gang moves");
    assert_eq!(moved.from_node_id, first, "named by its first member");
    assert!(moved.reason.contains(&member), "{}", moved.reason);
    assert_eq!(
        moved.billing_ends_at,
        at(1),
        "billed until the member was heard"
    );
    assert!(moved.to.is_none(), "back to the queue, to be placed whole");
    settle(&mut s, at(5), &rules);
    assert!(s.fleet.gang_members.is_empty());
    assert!(s
        .fleet
        .nodes
        .values()
        .all(|n| n.gpus.iter().all(|g| g.held_by.is_none())));
    // The next pass places it again, on the two nodes still heard.
    for n in ["a", "b", "c"].into_iter().filter(|n| *n != member) {
        s.heard(n, at(6), at(6));
    }
    settle(&mut s, at(6), &rules);
    settle(&mut s, at(6), &rules);
    assert_eq!(placed(&s), [gang]);
    let mut nodes: Vec<String> = std::iter::once(where_is(&s, gang).0)
        .chain(s.fleet.gang_members[&gang].iter().map(|(n, _)| n.clone()))
        .collect();
    nodes.sort();
    let mut expected: Vec<String> = ["a", "b", "c"]
        .into_iter()
        .filter(|n| *n != member)
        .map(str::to_string)
        .collect();
    expected.sort();
    assert_eq!(nodes, expected);
}

/// Each member of `gang` as the fleet holds it: (node, GPU indices), in
/// node-rank order.
fn ranks_of(s: &State, gang: Uuid) -> Vec<(String, Vec<u32>)> {
    std::iter::once(where_is(s, gang))
        .chain(s.fleet.gang_members[&gang].iter().cloned())
        .collect()
}

#[test]
fn a_gang_restarts_in_place_where_its_nodes_have_room_and_moves_where_they_have_not() {
    let t = Uuid::from_u128(1);
    let gang = Uuid::from_u128(2);
    let t0 = Utc::now();
    let rules = Rules::default();
    let mut s = given(vec![
        node("b", 8),
        node("c", 8),
        tenant(t, 12),
        request(gang, t, 12),
    ]);
    settle(&mut s, t0, &rules);
    s.apply(5_000, &env(started(gang, t0)));
    // Node a of 4 GPUs comes: placed afresh, the gang's part of 4 would
    // fill it.
    s.apply(5_500, &env(node("a", 4)));
    let before = ranks_of(&s, gang);
    let counts = |r: &[(String, Vec<u32>)]| -> Vec<(String, usize)> {
        r.iter().map(|(n, g)| (n.clone(), g.len())).collect()
    };
    let (smaller, its_gpus) = before
        .iter()
        .find(|(_, g)| g.len() == 4)
        .cloned()
        .expect("a member of 4");

    // A GPU under the member of 4 fails; its node has 4 more free.
    let failed = its_gpus[0];
    s.apply(
        6_000,
        &env(health(&smaller, failed, GpuHealth::Unhealthy, t0)),
    );
    let d = decide_at(&s, t0, &rules);
    let moved = events_of(&d)
        .into_iter()
        .find_map(|e| match e {
            EventData::LeaseMigrated(m) => Some(m.clone()),
            _ => None,
        })
        .expect("the gang leaves its GPUs");
    assert!(moved.to.is_none(), "{moved:?}");
    settle(&mut s, t0, &rules);
    settle(&mut s, t0, &rules);
    assert_eq!(placed(&s), [gang]);
    let after = ranks_of(&s, gang);
    assert_eq!(
        counts(&after),
        counts(&before),
        "the same nodes, ranks and counts"
    );
    assert_eq!(
        after[0], before[0],
        "the first member's GPUs are its own again"
    );
    let (_, now_on) = after.iter().find(|(n, _)| *n == smaller).unwrap();
    assert!(!now_on.contains(&failed), "{now_on:?}");

    // A GPU under the member of 8 fails: its node has 7 left, so the gang
    // is placed afresh (7 and 5 on the nodes of 8), and that GPU is
    // nobody's.
    s.apply(7_000, &env(started(gang, t0)));
    let (larger, its_gpus) = after[0].clone();
    s.apply(
        8_000,
        &env(health(&larger, its_gpus[0], GpuHealth::Unhealthy, t0)),
    );
    settle(&mut s, t0, &rules);
    settle(&mut s, t0, &rules);
    assert_eq!(placed(&s), [gang]);
    let moved = ranks_of(&s, gang);
    assert_eq!(moved.iter().map(|(_, g)| g.len()).sum::<usize>(), 12);
    assert_ne!(counts(&moved), counts(&after), "placed afresh");
    assert!(
        !moved.contains(&(larger.clone(), its_gpus.clone())),
        "{moved:?}"
    );
    assert!(s.fleet.nodes[&larger].gpus[its_gpus[0] as usize]
        .held_by
        .is_none());
}

#[test]
fn a_spot_gang_is_preempted_whole_where_its_gpus_make_the_room() {
    let (t, now) = (Uuid::from_u128(1), Utc::now());
    let (held, gang, wanting) = (Uuid::from_u128(2), Uuid::from_u128(3), Uuid::from_u128(4));
    // `held` on a (b joins after), then a spot gang of 12: b whole, and 4
    // beside `held`. The two nodes tie on the gang's cost, and a comes
    // first among ties.
    let mut s = given(vec![node("a", 8), tenant(t, 100)]);
    s.apply(10_000, &env(request(held, t, 4)));
    settle(&mut s, now, &Rules::default());
    s.apply(15_000, &env(node("b", 8)));
    s.apply(20_000, &env(request_full(gang, t, 12, Tier::Spot, 0)));
    settle(&mut s, now, &Rules::default());
    let (beside, whole) = (where_is(&s, held).0, "b");
    assert_eq!(beside, "a");
    let on = |s: &Given, node: &str| {
        s.fleet.nodes[node]
            .gpus
            .iter()
            .filter(|g| g.held_by == Some(gang))
            .count()
    };
    assert_eq!((on(&s, whole), on(&s, &beside)), (8, 4));
    s.apply(30_000, &env(started(held, now - Duration::minutes(30))));
    s.apply(30_001, &env(started(gang, now - Duration::minutes(30))));

    // Eight on-demand GPUs: only the node the gang holds whole can give
    // them. The 4 it holds beside `held` make no room for 8.
    s.apply(40_000, &env(request(wanting, t, 8)));
    let d = decide_at(&s, now, &Rules::default());
    let notices: Vec<&LeasePreemptionNoticed> = events_of(&d)
        .into_iter()
        .filter_map(|e| match e {
            EventData::LeasePreemptionNoticed(n) => Some(n),
            _ => None,
        })
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].lease_id, gang);
    let queued = events_of(&d).into_iter().find_map(|e| match e {
        EventData::LeaseQueued(q) if q.lease_id == wanting => Some(q.reason.clone()),
        _ => None,
    });
    let reason = queued.expect("it waits for its victim");
    assert!(reason.contains(&format!(" on {whole};")), "{reason}");

    // The gang ends at its deadline, on every member: the 8 go.
    for batch in &d.batches {
        for (e, _) in batch {
            s.apply(50_000, e);
        }
    }
    s.apply(60_000, &env(ended(gang)));
    assert_eq!((on(&s, whole), on(&s, &beside)), (0, 0));
    settle(&mut s, now, &Rules::default());
    assert_eq!(where_is(&s, wanting).0, whole);
}

#[test]
fn a_gang_goes_to_nodes_that_declare_one_fabric() {
    let t = Uuid::from_u128(1);
    let gang = Uuid::from_u128(2);
    let on_fabric = |id: &str, fabric: &str| {
        let mut n = fixtures::node(id, "z", 8, fixtures::MODEL, fixtures::MODEL_VRAM_GB);
        n.fabric = Some(fabric.into());
        EventData::NodeRegistered(n)
    };
    // a and b come first in every order the engine might try, but only
    // c and d share a fabric; e's label is not one and counts as none.
    let mut s = given(vec![
        node("a", 8),
        node("b", 8),
        on_fabric("c", "ib-1"),
        on_fabric("d", "ib-1"),
        on_fabric("e", "ib 1\n"),
        tenant(t, 16),
        request(gang, t, 16),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    let mut members: Vec<String> = s.fleet.gang_members[&gang]
        .iter()
        .map(|(n, _)| n.clone())
        .chain([where_is(&s, gang).0])
        .collect();
    members.sort();
    assert_eq!(members, ["c", "d"]);
    assert_eq!(s.fleet.nodes["e"].fabric, None);
}

#[test]
fn an_on_demand_gang_preempts_spot_leases_on_as_many_nodes_as_it_needs() {
    let (t, now) = (Uuid::from_u128(1), Utc::now());
    let (s1, s2, s3, gang) = (
        Uuid::from_u128(2),
        Uuid::from_u128(3),
        Uuid::from_u128(4),
        Uuid::from_u128(5),
    );
    // a and b each held whole by a spot lease, c by two halves of spot:
    // the gang of 16 takes the cheapest two nodes' worth.
    let mut s = given(vec![
        node("a", 8),
        node("b", 8),
        node("c", 8),
        tenant(t, 100),
    ]);
    for (i, (lease, gpus)) in [(s1, 8), (s2, 8), (s3, 8)].into_iter().enumerate() {
        s.apply(
            10_000 + i as u64,
            &env(request_full(lease, t, gpus, Tier::Spot, 0)),
        );
    }
    settle(&mut s, now, &Rules::default());
    let mut seq = 20_000;
    for lease in [s1, s2, s3] {
        seq += 1;
        s.apply(seq, &env(started(lease, now - Duration::minutes(30))));
    }
    // s3 ran longest: evicting it loses the most work.
    s.apply(seq + 1, &env(started(s3, now - Duration::hours(5))));
    s.apply(30_000, &env(request(gang, t, 16)));
    let d = decide_at(&s, now, &Rules::default());
    let mut noticed: Vec<Uuid> = events_of(&d)
        .into_iter()
        .filter_map(|e| match e {
            EventData::LeasePreemptionNoticed(n) => Some(n.lease_id),
            _ => None,
        })
        .collect();
    noticed.sort();
    assert_eq!(noticed, [s1, s2], "the two that lose least");
    let reason = events_of(&d)
        .into_iter()
        .find_map(|e| match e {
            EventData::LeaseQueued(q) if q.lease_id == gang => Some(q.reason.clone()),
            _ => None,
        })
        .expect("it waits for its victims");
    let on: Vec<String> = [s1, s2].iter().map(|v| where_is(&s, *v).0).collect();
    assert!(
        reason.contains(&format!("on {}, {}", on[0], on[1]))
            || reason.contains(&format!("on {}, {}", on[1], on[0])),
        "{reason}"
    );
    for batch in &d.batches {
        for (e, _) in batch {
            s.apply(40_000, e);
        }
    }
    for victim in [s1, s2] {
        s.apply(50_000, &env(ended(victim)));
    }
    settle(&mut s, now, &Rules::default());
    let mut members: Vec<String> = s.fleet.gang_members[&gang]
        .iter()
        .map(|(n, _)| n.clone())
        .chain([where_is(&s, gang).0])
        .collect();
    members.sort();
    let mut freed = on.clone();
    freed.sort();
    assert_eq!(members, freed);
}
