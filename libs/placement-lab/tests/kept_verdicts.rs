//! The engine keeps each node's verdict on a demand between decisions and
//! checks again only the nodes that changed: it must decide exactly as
//! scoring every node at every decision does (node, GPUs, score, ties,
//! runner-up, the seeded draw among ties, and every refusal's counts), on
//! fleets of many alike nodes, where ties are the rule.

use lh_placement::shape_mix::{ShapeMix, ShapeMixConfig};
use lh_placement::*;
use lh_placement_lab::policy::{self, POLICY_NAMES};
use proptest::prelude::*;

fn gpus(model: &str, vram_gb: u32, mode: SharingMode, count: usize) -> Vec<GpuSpec> {
    vec![
        GpuSpec {
            model: model.into(),
            vram_gb,
            mode,
        };
        count
    ]
}

/// A few kinds of node, so that a fleet holds many alike.
fn node(i: usize, kind: usize) -> NodeSpec {
    let (gpus, cpu_milli) = match kind {
        0 => (gpus("A100-40GB", 40, SharingMode::VGpu, 8), 64_000),
        1 => (gpus("A100-40GB", 40, SharingMode::Whole, 8), 64_000),
        2 => (gpus("A100-40GB", 40, SharingMode::Mig, 4), 32_000),
        3 => (gpus("T4", 16, SharingMode::VGpu, 2), 4_000),
        _ => (gpus("H100-80GB", 80, SharingMode::Whole, 8), 128_000),
    };
    NodeSpec {
        id: format!("n{i:03}"),
        zone: ["za", "zb", "zc"][i % 3].into(),
        cpu_milli,
        memory_mib: 512 * 1024,
        gpus,
        domains: Vec::new(),
        isolates_workloads: kind != 1,
        one_share_size_per_gpu: false,
        fabric: String::new(),
    }
}

/// A few shapes of request, so that demands repeat.
fn request(shape: usize) -> Request {
    let gpu = match shape {
        0 | 1 => GpuDemand::Whole { count: 1 },
        2 => GpuDemand::Whole { count: 2 },
        3 => GpuDemand::Whole { count: 8 },
        4 => GpuDemand::Fraction {
            milli: 250,
            vram_gb: 10,
        },
        5 => GpuDemand::Fraction {
            milli: 500,
            vram_gb: 20,
        },
        6 => GpuDemand::Mig {
            profile: "1g.5gb".into(),
        },
        7 => GpuDemand::Mig {
            profile: "3g.20gb".into(),
        },
        _ => GpuDemand::None,
    };
    let model = match shape {
        1 => "T4",
        6 | 7 => "A100-40GB",
        _ if shape.is_multiple_of(2) => "A100-40GB",
        _ => "H100-80GB",
    };
    Request {
        cpu_milli: 1_000 * (shape as u64 % 3),
        memory_mib: 1_024,
        gpu,
        models: vec![model.into()],
        zones: if shape == 5 {
            vec!["za".into()]
        } else {
            vec![]
        },
        preemptibility: Preemptibility::Guaranteed,
        needs_isolation: shape.is_multiple_of(3),
    }
}

const SHAPES: usize = 9;

/// Schedule (true) a request of a shape, or release the k-th live
/// allocation (false).
fn arb_ops() -> impl Strategy<Value = Vec<(bool, usize, usize)>> {
    prop::collection::vec((prop::bool::weighted(0.8), 0..SHAPES, 0usize..64), 1..150)
}

fn arb_fleet() -> impl Strategy<Value = Vec<NodeSpec>> {
    prop::collection::vec(prop::sample::select(vec![0usize, 0, 0, 1, 2, 3, 4]), 1..60).prop_map(
        |kinds| {
            kinds
                .into_iter()
                .enumerate()
                .map(|(i, k)| node(i, k))
                .collect()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn kept_verdicts_decide_as_scoring_every_node(
        nodes in arb_fleet(),
        ops in arb_ops(),
        p in prop::sample::select(POLICY_NAMES.to_vec()),
        seed in 0u64..1000,
    ) {
        let requests: Vec<Request> = (0..SHAPES).map(request).collect();
        let mix = ShapeMix::from_requests(&requests, ShapeMixConfig::PUBLISHED);
        let mut kept = Engine::new(Cluster::new(&nodes), policy::by_name(p, &mix).unwrap(), seed);
        let mut scanning =
            Engine::new(Cluster::new(&nodes), policy::by_name(p, &mix).unwrap(), seed)
                .without_index();
        let mut live: Vec<AllocId> = Vec::new();
        let mut placed = 0;
        for (schedule, shape, k) in ops {
            if schedule || live.is_empty() {
                let req = &requests[shape];
                let a = kept.decide(req);
                let b = scanning.decide(req);
                prop_assert_eq!(&a, &b);
                if let Ok(d) = a {
                    prop_assert_eq!(
                        d.provenance.winner_score.to_bits(),
                        b.unwrap().provenance.winner_score.to_bits()
                    );
                    let x = kept.place(req, &d).unwrap();
                    let y = scanning.place(req, &d).unwrap();
                    prop_assert_eq!(x, y);
                    live.push(x);
                    placed += 1;
                }
            } else {
                let id = live.swap_remove(k % live.len());
                kept.release(id).unwrap();
                scanning.release(id).unwrap();
            }
        }
        prop_assert_eq!(kept.cluster().nodes(), scanning.cluster().nodes());
        let _ = placed;
    }
}

/// A fleet of identical idle nodes ties on every one: the draw among them
/// must be the scan's, decision after decision.
#[test]
fn ties_among_many_alike_nodes_draw_as_the_scan_does() {
    let nodes: Vec<NodeSpec> = (0..200).map(|i| node(i, 0)).collect();
    let req = request(0);
    let mix = ShapeMix::from_requests([&req], ShapeMixConfig::PUBLISHED);
    let mut kept = Engine::new(
        Cluster::new(&nodes),
        policy::by_name("leasehold", &mix).unwrap(),
        7,
    );
    let mut scanning = Engine::new(
        Cluster::new(&nodes),
        policy::by_name("leasehold", &mix).unwrap(),
        7,
    )
    .without_index();
    let mut most_tied = 0;
    for _ in 0..400 {
        let a = kept.decide(&req).unwrap();
        let b = scanning.decide(&req).unwrap();
        assert_eq!(a, b);
        most_tied = most_tied.max(a.provenance.tied);
        kept.place(&req, &a).unwrap();
        scanning.place(&req, &b).unwrap();
    }
    assert!(
        most_tied > 100,
        "the fleet tied on {most_tied} nodes at most"
    );
}

/// An allocation as the world holds it, to load into a cluster again.
#[derive(Debug, Clone)]
struct Held {
    node: usize,
    shape: usize,
    gpus: GpuSet,
    mig_start: Option<u8>,
}

/// Takes `h` on `cluster` as it was placed.
fn load(cluster: &mut Cluster, requests: &[Request], h: &Held) {
    let d = cluster.demand(&requests[h.shape]);
    match h.mig_start {
        Some(start) => cluster
            .allocate_mig_at(h.node, &d, h.gpus.trailing_zeros() as u8, start)
            .unwrap(),
        None => cluster.allocate(h.node, &d, h.gpus).unwrap(),
    };
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// An engine kept from one run of decisions to the next, whose changed
    /// nodes are cleared and loaded again (and whose policy is replaced
    /// where the mix changes), decides each run as an engine built afresh
    /// from what is held then: verdicts, policy caches and all.
    #[test]
    fn a_kept_engine_with_nodes_loaded_again_decides_as_a_fresh_one(
        nodes in arb_fleet(),
        runs in prop::collection::vec(
            (prop::collection::vec(0..SHAPES, 1..12), prop::collection::vec(0usize..64, 0..6), any::<bool>()),
            1..8,
        ),
        seed in 0u64..1000,
    ) {
        let requests: Vec<Request> = (0..SHAPES).map(request).collect();
        let mixes = [
            ShapeMix::from_requests(&requests, ShapeMixConfig::PUBLISHED),
            ShapeMix::from_requests(&requests[..4], ShapeMixConfig::PUBLISHED),
        ];
        let policy = |m: usize| policy::by_name("leasehold", &mixes[m]).unwrap();
        let mut mix = 0;
        let mut kept = Engine::new(Cluster::new(&nodes), policy(mix), seed);
        let mut held: Vec<Held> = Vec::new();
        for (shapes, ends, new_mix) in runs {
            // Between runs, leases end: their nodes are loaded again.
            let mut changed: Vec<usize> = Vec::new();
            for k in ends {
                if !held.is_empty() {
                    changed.push(held.remove(k % held.len()).node);
                }
            }
            changed.sort_unstable();
            changed.dedup();
            for &i in &changed {
                kept.cluster_mut().clear_node(i).unwrap();
                for h in held.iter().filter(|h| h.node == i) {
                    load(kept.cluster_mut(), &requests, h);
                }
            }
            if new_mix {
                mix = 1 - mix;
                kept.set_policy(policy(mix));
            }
            kept.set_sequence(0);
            let mut cluster = Cluster::new(&nodes);
            for i in 0..nodes.len() {
                for h in held.iter().filter(|h| h.node == i) {
                    load(&mut cluster, &requests, h);
                }
            }
            let mut fresh = Engine::new(cluster, policy(mix), seed);
            for shape in shapes {
                let req = &requests[shape];
                let a = kept.decide(req);
                let b = fresh.decide(req);
                prop_assert_eq!(&a, &b);
                if let Ok(d) = a {
                    let x = kept.place(req, &d).unwrap();
                    fresh.place(req, &d).unwrap();
                    let mig = kept.cluster().allocation(x).and_then(|a| a.mig);
                    held.push(Held {
                        node: d.node,
                        shape,
                        gpus: d.gpus,
                        mig_start: mig.map(|m| m.start),
                    });
                }
            }
        }
    }
}
