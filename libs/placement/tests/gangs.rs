//! Leases of more GPUs than one node holds: all or nothing, on the fewest
//! nodes, one fabric before one zone before one region, never two regions.

use lh_placement::policy::Leasehold;
use lh_placement::{
    AllocId, Cluster, Decision, Engine, GpuSpec, NodeSpec, Request, ShapeMix, ShapeMixConfig,
    SharingMode,
};

const A100: &str = "A100-40GB";

fn node(id: &str, zone: &str, fabric: &str, gpus: usize) -> NodeSpec {
    NodeSpec {
        fabric: fabric.into(),
        ..NodeSpec::uniform(
            id,
            zone,
            96_000,
            1 << 20,
            gpus,
            GpuSpec {
                model: A100.into(),
                vram_gb: 40,
                mode: SharingMode::Whole,
            },
        )
    }
}

fn engine(nodes: &[NodeSpec]) -> Engine {
    let mix = ShapeMix::from_requests(
        &[
            Request::whole(1, 0, 0),
            Request::whole(8, 0, 0),
            Request::whole(4, 0, 0),
        ],
        ShapeMixConfig::PUBLISHED,
    );
    Engine::new(Cluster::new(nodes), Box::new(Leasehold::new(mix)), 42)
}

/// Takes `gpus` whole GPUs of node `id` with a lease of its own.
fn hold(e: &mut Engine, id: &str, gpus: u8) -> AllocId {
    let i = e.cluster().nodes().iter().position(|n| n.id == id).unwrap();
    let d = e.cluster().demand(&Request::whole(gpus, 0, 0));
    let set = e.cluster().pick_default(i, &d);
    e.cluster_mut().allocate(i, &d, set).unwrap()
}

fn gang(gpus: u8) -> Request {
    Request::whole(gpus, 16_000, 64 << 10).with_models([A100])
}

/// (node id, GPUs taken) of each member, in the order they were chosen.
fn members(e: &Engine, placed: &[(Decision, AllocId)]) -> Vec<(String, u32)> {
    placed
        .iter()
        .map(|(d, _)| (e.cluster().node(d.node).id.clone(), d.gpus.count_ones()))
        .collect()
}

#[test]
fn sixteen_gpus_take_two_whole_nodes_and_leave_the_others_whole() {
    let mut e = engine(&[
        node("a", "cn-north.1", "", 8),
        node("b", "cn-north.1", "", 8),
        node("c", "cn-north.1", "", 8),
    ]);
    hold(&mut e, "b", 2);
    let placed = e.schedule_gang(&gang(16)).unwrap();
    let mut got = members(&e, &placed);
    got.sort();
    assert_eq!(got, [("a".into(), 8), ("c".into(), 8)]);
    // Every member is told the same decision's sequence, and CPU and
    // memory are taken in proportion: 8 of 16 GPUs take half of each.
    assert_eq!(
        placed[0].0.provenance.sequence,
        placed[1].0.provenance.sequence
    );
    for n in ["a", "c"] {
        let n = e.cluster().nodes().iter().find(|x| x.id == n).unwrap();
        assert_eq!(n.cpu_total - n.cpu_free, 8_000);
        assert_eq!(n.memory_total - n.memory_free, 32 << 10);
    }
}

#[test]
fn twelve_gpus_take_a_whole_node_and_the_rest_where_four_fit_best() {
    let mut e = engine(&[
        node("a", "z.1", "", 8),
        node("b", "z.1", "", 8),
        node("c", "z.1", "", 8),
    ]);
    // b has 4 free, c 2: a whole node and b's 4 leave c's 2 and no broken
    // node besides.
    hold(&mut e, "b", 4);
    hold(&mut e, "c", 6);
    let placed = e.schedule_gang(&gang(12)).unwrap();
    assert_eq!(members(&e, &placed), [("a".into(), 8), ("b".into(), 4)]);
}

#[test]
fn a_gang_restarts_in_place_on_its_nodes_or_takes_nothing() {
    let mut e = engine(&[
        node("a", "z.1", "", 8),
        node("b", "z.1", "", 8),
        node("c", "z.1", "", 8),
    ]);
    let index = |e: &Engine, id: &str| e.cluster().nodes().iter().position(|n| n.id == id).unwrap();
    hold(&mut e, "b", 2);
    let placed = e.schedule_gang(&gang(12)).unwrap();
    let ranks = members(&e, &placed);
    assert_eq!(ranks[0].1 + ranks[1].1, 12);
    for (_, id) in placed {
        e.cluster_mut().release(id).unwrap();
    }
    // One GPU of the smaller member's node is gone (here: taken), and the
    // node still has room: every member again on its node, in rank order.
    let smaller = ranks.iter().min_by_key(|(_, n)| *n).unwrap().0.clone();
    hold(&mut e, &smaller, 1);
    let on: Vec<(usize, u32)> = ranks.iter().map(|(n, g)| (index(&e, n), *g)).collect();
    let again = e
        .schedule_gang_on(&gang(12), &on)
        .expect("room on its nodes");
    assert_eq!(members(&e, &again), ranks);
    assert_eq!(
        again[0].0.provenance.sequence,
        again[1].0.provenance.sequence
    );
    for (_, id) in again {
        e.cluster_mut().release(id).unwrap();
    }

    // A node with too few GPUs left for its member: nothing of the gang is
    // taken, not even the member before it.
    let larger = ranks.iter().max_by_key(|(_, n)| *n).unwrap().0.clone();
    hold(&mut e, &larger, 1);
    let used = e.cluster().gpu_milli_used();
    assert!(e.schedule_gang_on(&gang(12), &on).is_none());
    assert_eq!(e.cluster().gpu_milli_used(), used, "nothing taken");
    // Counts that are not the ask, or one node twice, are no restart.
    let (a, c) = (index(&e, "a"), index(&e, "c"));
    assert!(e.schedule_gang_on(&gang(12), &[(a, 8), (c, 8)]).is_none());
    assert!(e.schedule_gang_on(&gang(12), &[(c, 6), (c, 6)]).is_none());
    assert!(e.schedule_gang_on(&gang(12), &[(7, 6), (c, 6)]).is_none());
    assert_eq!(e.cluster().gpu_milli_used(), used);
}

#[test]
fn a_lease_one_node_could_hold_waits_for_it_rather_than_split() {
    let mut e = engine(&[node("a", "z.1", "", 8), node("b", "z.1", "", 8)]);
    hold(&mut e, "a", 4);
    hold(&mut e, "b", 4);
    let used = e.cluster().gpu_milli_used();
    let p = e.schedule_gang(&gang(8)).unwrap_err();
    assert!(p.gang.is_none(), "{p}");
    assert!(p.busy());
    assert_eq!(e.cluster().gpu_milli_used(), used);
}

#[test]
fn nodes_of_one_fabric_come_before_one_zone_and_one_zone_before_the_region() {
    // Both zones could hold 16 on two nodes; only zone 2's nodes share a
    // fabric.
    let mut e = engine(&[
        node("a1", "r.1", "", 8),
        node("a2", "r.1", "", 8),
        node("b1", "r.2", "ib-7", 8),
        node("b2", "r.2", "", 8),
        node("b3", "r.2", "ib-7", 8),
    ]);
    let placed = e.schedule_gang(&gang(16)).unwrap();
    let mut got = members(&e, &placed);
    got.sort();
    assert_eq!(got, [("b1".into(), 8), ("b3".into(), 8)]);

    // No fabric: one zone, the one that holds the gang.
    let mut e = engine(&[
        node("a1", "r.1", "", 8),
        node("a2", "r.1", "", 8),
        node("b1", "r.2", "", 8),
        node("b2", "r.2", "", 8),
    ]);
    hold(&mut e, "a1", 1);
    let placed = e.schedule_gang(&gang(16)).unwrap();
    let mut got = members(&e, &placed);
    got.sort();
    assert_eq!(got, [("b1".into(), 8), ("b2".into(), 8)]);

    // Only the region holds it: it spans its zones.
    let mut e = engine(&[node("a1", "r.1", "", 8), node("b1", "r.2", "", 8)]);
    assert_eq!(e.schedule_gang(&gang(16)).unwrap().len(), 2);
}

#[test]
fn the_fewest_nodes_come_before_one_zone() {
    // Zone 1 holds 16 only on three nodes (6 + 6 + 4); the region holds
    // it on two, the whole nodes of zones 2 and 3.
    let mut e = engine(&[
        node("a1", "r.1", "", 8),
        node("a2", "r.1", "", 8),
        node("a3", "r.1", "", 8),
        node("b1", "r.2", "", 8),
        node("c1", "r.3", "", 8),
    ]);
    hold(&mut e, "a1", 2);
    hold(&mut e, "a2", 2);
    hold(&mut e, "a3", 4);
    let placed = e.schedule_gang(&gang(16)).unwrap();
    let mut got = members(&e, &placed);
    got.sort();
    assert_eq!(got, [("b1".into(), 8), ("c1".into(), 8)]);
}

#[test]
fn a_gang_never_spans_regions_and_its_refusal_says_what_its_region_lacks() {
    let mut e = engine(&[
        node("a", "east.1", "", 8),
        node("b", "west.1", "", 8),
        node("c", "west.2", "", 8),
    ]);
    hold(&mut e, "c", 3);
    let used = e.cluster().gpu_milli_used();
    let p = e.schedule_gang(&gang(16)).unwrap_err();
    let g = p.gang.clone().expect("a gang's refusal");
    assert_eq!(
        (g.gpus, g.region.as_str(), g.free, g.capacity),
        (16, "west", 13, 16)
    );
    assert!(p.busy(), "west holds 16 once its leases end");
    assert_eq!(
        p.to_string(),
        "16 GPUs span nodes of one region: west has 13 of them free now, 16 with every lease there ended"
    );
    assert_eq!(e.cluster().gpu_milli_used(), used, "nothing taken");

    // Twenty-four fit in no region even empty: waiting does not help.
    let p = e.schedule_gang(&gang(24)).unwrap_err();
    assert!(!p.busy(), "{p}");
}

#[test]
fn a_placed_gang_released_member_by_member_leaves_the_cluster_as_it_was() {
    let mut e = engine(&[
        node("a", "z.1", "", 8),
        node("b", "z.1", "", 8),
        node("c", "z.1", "", 4),
    ]);
    let before: Vec<_> = e
        .cluster()
        .nodes()
        .iter()
        .map(|n| (n.cpu_free, n.memory_free, n.gpus.clone()))
        .collect();
    let placed = e.schedule_gang(&gang(20)).unwrap();
    assert_eq!(placed.len(), 3);
    assert_eq!(e.cluster().gpu_milli_used(), 20_000);
    for (_, id) in placed {
        e.release(id).unwrap();
    }
    let after: Vec<_> = e
        .cluster()
        .nodes()
        .iter()
        .map(|n| (n.cpu_free, n.memory_free, n.gpus.clone()))
        .collect();
    assert_eq!(before, after);
}

#[test]
fn a_gang_takes_only_what_its_zones_and_models_allow() {
    let mut e = engine(&[
        node("a", "r.1", "", 8),
        node("b", "r.1", "", 8),
        node("c", "r.2", "", 8),
    ]);
    let p = e.schedule_gang(&gang(16).with_zones(["r.2"])).unwrap_err();
    assert_eq!(p.gang.as_ref().map(|g| g.capacity), Some(8), "{p}");
    assert!(!p.busy());
    let p = e
        .schedule_gang(&Request::whole(16, 0, 0).with_models(["H100-80GB"]))
        .unwrap_err();
    assert_eq!(
        p.to_string(),
        "16 GPUs span nodes, and no node of 3 can take any of them"
    );
    assert_eq!(p.count(lh_placement::Reject::Model), 3);
}
