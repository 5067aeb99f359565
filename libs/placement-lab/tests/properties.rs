//! Property tests of the engine: capacities are never exceeded, whole-GPU
//! leases get distinct GPUs of one node, MIG layouts always follow NVIDIA's
//! placement rules, a decision is a function of the state and the seed, and
//! releasing restores the state.

use lh_placement::mig;
use lh_placement::shape_mix::{ShapeMix, ShapeMixConfig};
use lh_placement::*;
use lh_placement_lab::policy::{self, POLICY_NAMES};
use proptest::prelude::*;

fn arb_node(i: usize) -> impl Strategy<Value = NodeSpec> {
    (
        1u64..=64,
        1u64..=256,
        1usize..=8,
        prop::sample::select(vec!["A100", "T4", "H100"]),
        prop::sample::select(vec![
            SharingMode::VGpu,
            SharingMode::Whole,
            SharingMode::Mig,
        ]),
        prop::sample::select(vec![16u32, 24, 40, 80]),
        prop::bool::ANY,
    )
        .prop_map(
            move |(cores, gib, gpus, model, mode, vram, domains)| NodeSpec {
                id: format!("n{i}"),
                zone: if i.is_multiple_of(2) { "za" } else { "zb" }.into(),
                cpu_milli: cores * 1000,
                memory_mib: gib * 1024,
                gpus: vec![
                    match mode {
                        // MIG needs a model with a geometry.
                        SharingMode::Mig => GpuSpec {
                            model: MIG_MODELS[gpus % MIG_MODELS.len()].into(),
                            vram_gb: mig::geometry(MIG_MODELS[gpus % MIG_MODELS.len()])
                                .unwrap()
                                .memory_gb,
                            mode,
                        },
                        _ => GpuSpec {
                            model: model.into(),
                            vram_gb: vram,
                            mode,
                        },
                    };
                    gpus
                ],
                domains: if domains && gpus >= 4 {
                    vec![
                        (0..gpus as u8 / 2).collect(),
                        (gpus as u8 / 2..gpus as u8).collect(),
                    ]
                } else {
                    vec![]
                },
                isolates_workloads: true,
                one_share_size_per_gpu: false,
                fabric: String::new(),
            },
        )
}

const MIG_MODELS: &[&str] = &["A100-40GB", "H100-80GB", "A30-24GB"];

fn arb_nodes() -> impl Strategy<Value = Vec<NodeSpec>> {
    (1usize..=6).prop_flat_map(|n| (0..n).map(arb_node).collect::<Vec<_>>())
}

fn arb_request() -> impl Strategy<Value = Request> {
    let gpu = prop_oneof![
        Just(GpuDemand::None),
        (1u8..=4).prop_map(|count| GpuDemand::Whole { count }),
        (1u16..=1000, 0u32..=20)
            .prop_map(|(milli, vram_gb)| GpuDemand::Fraction { milli, vram_gb }),
        prop::sample::select(vec![
            "1g.5gb",
            "2g.10gb",
            "3g.20gb",
            "4g.20gb",
            "7g.40gb",
            "1g.10gb",
            "3g.40gb",
            "1g.6gb",
            "2g.12gb",
            "4g.24gb",
            "1g.5gb+me",
            "9g.99gb",
        ])
        .prop_map(|p| GpuDemand::Mig { profile: p.into() }),
    ];
    (
        0u64..=16_000,
        0u64..=32_768,
        gpu,
        prop::sample::select(vec![
            vec![],
            vec!["A100"],
            vec!["T4", "H100"],
            vec!["nope"],
            vec!["A100-40GB", "A30-24GB"],
        ]),
        prop::sample::select(vec![vec![], vec!["za"]]),
    )
        .prop_map(|(cpu, mem, gpu, models, zones)| Request {
            cpu_milli: cpu,
            memory_mib: mem,
            gpu,
            models: models.into_iter().map(String::from).collect(),
            zones: zones.into_iter().map(String::from).collect(),
            preemptibility: Preemptibility::Guaranteed,
            needs_isolation: false,
        })
}

/// Schedule (true) or release the k-th live allocation (false).
fn arb_ops() -> impl Strategy<Value = Vec<(bool, Request, usize)>> {
    prop::collection::vec(
        (prop::bool::weighted(0.75), arb_request(), 0usize..64),
        1..60,
    )
}

fn check_invariants(c: &Cluster) -> Result<(), TestCaseError> {
    let mut cpu = vec![0u64; c.len()];
    let mut mem = vec![0u64; c.len()];
    let mut milli: Vec<Vec<u64>> = c.nodes().iter().map(|n| vec![0; n.gpus.len()]).collect();
    let mut vram: Vec<Vec<u64>> = milli.clone();
    let mut whole: Vec<Vec<u32>> = c.nodes().iter().map(|n| vec![0; n.gpus.len()]).collect();
    let mut leases: Vec<Vec<u32>> = whole.clone();
    for (id, a) in c.allocations() {
        let n = a.node as usize;
        cpu[n] += a.demand.cpu_milli;
        mem[n] += a.demand.memory_mib;
        match a.demand.kind {
            Kind::Whole(k) => {
                prop_assert_eq!(
                    a.gpus.count_ones(),
                    u32::from(k),
                    "whole lease on distinct GPUs"
                );
                for j in gpu_indices(a.gpus) {
                    whole[n][j as usize] += 1;
                    leases[n][j as usize] += 1;
                }
            }
            Kind::Frac { milli: m, vram_gb } => {
                prop_assert_eq!(a.gpus.count_ones(), 1);
                let j = a.gpus.trailing_zeros() as usize;
                milli[n][j] += u64::from(m);
                vram[n][j] += u64::from(vram_gb);
                leases[n][j] += 1;
            }
            Kind::None => prop_assert_eq!(a.gpus, 0),
            Kind::Mig(p) => {
                prop_assert_eq!(a.gpus.count_ones(), 1);
                let j = a.gpus.trailing_zeros() as usize;
                let h = a.mig.expect("a MIG allocation holds an instance");
                prop_assert_eq!(h.profile.name, mig::profile_names()[usize::from(p)]);
                milli[n][j] += u64::from(h.milli);
                vram[n][j] += u64::from(h.vram_gb);
                leases[n][j] += 1;
                let layout = c.node(n).mig[j].as_ref().expect("MIG only on MIG GPUs");
                let inst = layout
                    .instance_of(&id.0)
                    .expect("the instance is in the layout");
                prop_assert_eq!((inst.profile, inst.start), (h.profile, h.start));
            }
        }
    }
    for n in c.nodes() {
        for (j, layout) in n.mig.iter().enumerate() {
            if let Some(layout) = layout {
                prop_assert!(mig::is_valid(layout), "MIG layout breaks NVIDIA's rules");
                prop_assert_eq!(layout.instances().len(), usize::from(n.gpus[j].leases));
            }
        }
    }
    for (i, n) in c.nodes().iter().enumerate() {
        prop_assert!(cpu[i] <= n.cpu_total && n.cpu_free == n.cpu_total - cpu[i]);
        prop_assert!(mem[i] <= n.memory_total && n.memory_free == n.memory_total - mem[i]);
        for (j, g) in n.gpus.iter().enumerate() {
            prop_assert!(milli[i][j] <= 1000, "GPU over 1000 milli");
            prop_assert!(vram[i][j] <= u64::from(g.vram_total), "GPU over its VRAM");
            prop_assert!(whole[i][j] <= 1);
            if whole[i][j] == 1 {
                prop_assert_eq!(leases[i][j], 1, "a whole GPU is not shared");
                prop_assert_eq!(g.milli_free, 0);
            } else {
                prop_assert_eq!(u64::from(g.milli_free), 1000 - milli[i][j]);
                prop_assert_eq!(u64::from(g.vram_free), u64::from(g.vram_total) - vram[i][j]);
                if g.mode == SharingMode::Whole {
                    prop_assert_eq!(milli[i][j], 0, "slices only on vGPU and MIG devices");
                }
                if g.mode == SharingMode::Mig {
                    prop_assert_eq!(whole[i][j], 0, "no whole lease on a MIG device");
                }
            }
            prop_assert_eq!(u32::from(g.leases), leases[i][j]);
        }
    }
    Ok(())
}

fn workload(ops: &[(bool, Request, usize)]) -> ShapeMix {
    let reqs: Vec<Request> = ops.iter().map(|o| o.1.clone()).collect();
    ShapeMix::from_requests(&reqs, ShapeMixConfig::PUBLISHED)
}

/// Each decision (node, GPUs, score bits) or None.
type Trail = Vec<Option<(usize, u32, u64)>>;

/// Runs the ops, returning each decision (node, GPUs, score) or None.
fn run(
    nodes: &[NodeSpec],
    policy_name: &str,
    seed: u64,
    ops: &[(bool, Request, usize)],
    check: bool,
) -> Result<(Trail, Engine), TestCaseError> {
    let w = workload(ops);
    let mut e = Engine::new(
        Cluster::new(nodes),
        policy::by_name(policy_name, &w).unwrap(),
        seed,
    );
    let mut live: Vec<AllocId> = Vec::new();
    let mut out = Vec::new();
    for (schedule, req, k) in ops {
        if *schedule || live.is_empty() {
            match e.schedule(req) {
                Ok((d, id)) => {
                    let a = e.cluster().allocation(id).unwrap();
                    prop_assert_eq!(a.node as usize, d.node);
                    if let GpuDemand::Whole { count } = req.gpu {
                        prop_assert_eq!(d.gpus.count_ones(), u32::from(count));
                    }
                    live.push(id);
                    out.push(Some((d.node, d.gpus, d.provenance.winner_score.to_bits())));
                }
                Err(p) => {
                    prop_assert!(p.rejected.values().sum::<u32>() == p.nodes);
                    out.push(None);
                }
            }
        } else {
            let id = live.swap_remove(k % live.len());
            e.release(id).unwrap();
            prop_assert!(e.release(id).is_err(), "double release refused");
            out.push(None);
        }
        if check {
            check_invariants(e.cluster())?;
        }
    }
    Ok((out, e))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn capacities_hold_and_release_restores(nodes in arb_nodes(), ops in arb_ops(), p in prop::sample::select(POLICY_NAMES.to_vec()), seed in 0u64..1000) {
        let (_, mut e) = run(&nodes, p, seed, &ops, true)?;
        let ids: Vec<AllocId> = e.cluster().allocations().map(|(id, _)| id).collect();
        for id in ids {
            e.release(id).unwrap();
        }
        check_invariants(e.cluster())?;
        let fresh = Cluster::new(&nodes);
        for (a, b) in e.cluster().nodes().iter().zip(fresh.nodes()) {
            prop_assert_eq!(a.cpu_free, b.cpu_free);
            prop_assert_eq!(a.memory_free, b.memory_free);
            prop_assert_eq!(&a.gpus, &b.gpus);
            prop_assert_eq!(a.tags, b.tags);
        }
        prop_assert_eq!(e.cluster().gpu_milli_used(), 0);
    }

    #[test]
    fn same_state_and_seed_same_decisions(nodes in arb_nodes(), ops in arb_ops(), p in prop::sample::select(POLICY_NAMES.to_vec()), seed in 0u64..1000) {
        let (a, _) = run(&nodes, p, seed, &ops, false)?;
        let (b, _) = run(&nodes, p, seed, &ops, false)?;
        prop_assert_eq!(a, b);
    }

    #[test]
    fn a_decision_does_not_change_the_state(nodes in arb_nodes(), req in arb_request(), p in prop::sample::select(POLICY_NAMES.to_vec())) {
        let w = ShapeMix::from_requests([&req], ShapeMixConfig::PUBLISHED);
        let mut e = Engine::new(Cluster::new(&nodes), policy::by_name(p, &w).unwrap(), 1);
        let before: Vec<Node> = e.cluster().nodes().to_vec();
        if let Ok(d) = e.decide(&req) {
            prop_assert!(e.cluster().check(d.node, &e.cluster().demand(&req)).is_ok());
        }
        prop_assert_eq!(before, e.cluster().nodes().to_vec());
    }
}

use lh_placement::cluster::Node;
