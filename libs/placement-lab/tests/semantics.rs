//! Small hand-made clusters with the expected choice of each policy: these
//! pin the semantics learned from the published simulator's Go code.

use lh_placement::policy::{Fgd, Leasehold};
use lh_placement::shape_mix::{ShapeMix, ShapeMixConfig};
use lh_placement::*;
use lh_placement_lab::policy::{self, BestFit, DotProduct, GpuClustering, GpuPacking};
use lh_placement_lab::trace::{self, arrival_sequence, curve, replay, Order, Task};

fn vgpu(model: &str) -> GpuSpec {
    GpuSpec {
        model: model.into(),
        vram_gb: 16,
        mode: SharingMode::VGpu,
    }
}

fn node(id: &str, cpu: u64, gpus: usize, model: &str) -> NodeSpec {
    NodeSpec::uniform(id, "z1", cpu, 1 << 20, gpus, vgpu(model))
}

fn engine(nodes: &[NodeSpec], p: Box<dyn Policy>) -> Engine {
    Engine::new(Cluster::new(nodes), p, 42)
}

/// Takes `milli` of GPU `gpu` of node `n` (and some CPU), directly.
fn occupy(e: &mut Engine, n: &str, gpu: u8, milli: u16) {
    let idx = e.cluster().nodes().iter().position(|x| x.id == n).unwrap();
    let r = if milli == 1000 {
        Request::whole(1, 1000, 0)
    } else {
        Request::fraction(milli, 0, 1000, 0)
    };
    let d = Decision {
        node: idx,
        gpus: 1 << gpu,
        provenance: e.decide(&Request::cpu_only(0, 0)).unwrap().provenance,
    };
    e.place(&r, &d).unwrap();
}

fn chosen(e: &mut Engine, r: &Request) -> (String, Vec<u8>) {
    let d = e.decide(r).unwrap();
    (e.cluster().node(d.node).id.clone(), d.gpu_indices())
}

#[test]
fn best_fit_prefers_the_node_left_with_least_free_cpu_and_gpu() {
    let nodes = [node("a", 32_000, 8, "G2"), node("b", 32_000, 8, "G2")];
    let mut e = engine(&nodes, Box::new(BestFit));
    occupy(&mut e, "b", 0, 1000);
    occupy(&mut e, "b", 1, 1000);
    let (n, gpus) = chosen(&mut e, &Request::whole(1, 4000, 0));
    assert_eq!(n, "b");
    // Whole GPUs: the first free ones by index.
    assert_eq!(gpus, vec![2]);
    let d = e.decide(&Request::whole(1, 4000, 0)).unwrap();
    assert_eq!(d.provenance.candidates, 2);
    assert!(d.provenance.winner_score > d.provenance.runner_up_score.unwrap());
}

#[test]
fn a_slice_goes_to_the_tightest_gpu_that_fits() {
    let nodes = [node("a", 32_000, 4, "G2")];
    let mut e = engine(&nodes, Box::new(BestFit));
    occupy(&mut e, "a", 1, 400); // 600 left
    occupy(&mut e, "a", 2, 700); // 300 left
    assert_eq!(
        chosen(&mut e, &Request::fraction(250, 0, 1000, 0)).1,
        vec![2]
    );
    assert_eq!(
        chosen(&mut e, &Request::fraction(500, 0, 1000, 0)).1,
        vec![1]
    );
    assert_eq!(
        chosen(&mut e, &Request::fraction(700, 0, 1000, 0)).1,
        vec![0]
    );
}

#[test]
fn gpu_packing_bands() {
    // Shared GPU first (>= 50), free GPU of a used node next (33..50), an
    // untouched node last (< 33).
    let nodes = [
        node("empty", 32_000, 8, "G2"),
        node("used", 32_000, 8, "G2"),
        node("shared", 32_000, 8, "G2"),
    ];
    let mut e = engine(&nodes, Box::new(GpuPacking));
    occupy(&mut e, "used", 0, 1000);
    occupy(&mut e, "shared", 0, 500);
    let d = e.decide(&Request::fraction(300, 0, 1000, 0)).unwrap();
    assert_eq!(e.cluster().node(d.node).id, "shared");
    // 100 - (500 * 100 / 1000) / 10 = 95
    assert_eq!(d.provenance.winner_score, 95.0);
    // A whole GPU cannot use the shared GPU: the used node (50 - 1 = 49)
    // beats the empty one (33 - 8 = 25).
    let d = e.decide(&Request::whole(1, 1000, 0)).unwrap();
    assert_eq!(e.cluster().node(d.node).id, "used");
    assert_eq!(d.provenance.winner_score, 49.0);
}

#[test]
fn gpu_clustering_keeps_kinds_together() {
    let nodes = [
        node("slices", 32_000, 8, "G2"),
        node("wholes", 32_000, 8, "G2"),
    ];
    let mut e = engine(&nodes, Box::new(GpuClustering));
    occupy(&mut e, "slices", 0, 500);
    occupy(&mut e, "wholes", 0, 1000);
    assert_eq!(
        chosen(&mut e, &Request::fraction(200, 0, 1000, 0)).0,
        "slices"
    );
    assert_eq!(chosen(&mut e, &Request::whole(1, 1000, 0)).0, "wholes");
}

#[test]
fn dot_product_prefers_the_smaller_product() {
    let nodes = [node("big", 96_000, 8, "G2"), node("small", 16_000, 2, "G2")];
    let mut e = engine(&nodes, Box::new(DotProduct));
    assert_eq!(chosen(&mut e, &Request::whole(1, 4000, 0)).0, "small");
}

fn workload_of(reqs: &[Request]) -> ShapeMix {
    ShapeMix::from_requests(reqs, ShapeMixConfig::PUBLISHED)
}

#[test]
fn fgd_fills_the_hole_that_fits_exactly() {
    // ShapeMix of 500- and 600-milli slices: a 500 request should close the
    // GPU that has exactly 500 left (useless to a 600 slice), not leave 500
    // on a new one.
    let w = workload_of(&[
        Request::fraction(500, 0, 1000, 0),
        Request::fraction(600, 0, 1000, 0),
    ]);
    let nodes = [node("a", 32_000, 2, "G2"), node("b", 32_000, 2, "G2")];
    for p in [
        Box::new(Fgd::new(w.clone())) as Box<dyn Policy>,
        Box::new(Leasehold::new(w.clone())),
    ] {
        let mut e = engine(&nodes, p);
        occupy(&mut e, "b", 1, 500);
        assert_eq!(
            chosen(&mut e, &Request::fraction(500, 0, 1000, 0)),
            ("b".into(), vec![1])
        );
    }
}

#[test]
fn fgd_keeps_whole_gpus_whole_for_a_whole_gpu_workload() {
    // Mostly whole-GPU tasks: a slice should go next to another slice, not
    // break a free GPU.
    let mut reqs = vec![Request::whole(1, 1000, 0); 9];
    reqs.push(Request::fraction(300, 0, 1000, 0));
    let w = workload_of(&reqs);
    let nodes = [node("a", 32_000, 2, "G2"), node("b", 32_000, 2, "G2")];
    let mut e = engine(&nodes, Box::new(Fgd::new(w)));
    occupy(&mut e, "a", 0, 300);
    assert_eq!(
        chosen(&mut e, &Request::fraction(300, 0, 1000, 0)),
        ("a".into(), vec![0])
    );
}

#[test]
fn typical_shapes_are_the_most_popular_until_95_percent() {
    let mut reqs = vec![Request::whole(1, 1000, 0); 90];
    reqs.extend(vec![Request::fraction(500, 0, 2000, 0); 6]);
    reqs.extend(vec![Request::cpu_only(4000, 0); 4]);
    let w = workload_of(&reqs);
    // 90 + 6 = 96 >= 95: the CPU-only shape is left out.
    assert_eq!(w.shapes.len(), 2);
    assert!((w.shapes[0].weight - 90.0 / 96.0).abs() < 1e-12);
    assert_eq!(
        w.shapes[1].gpu,
        GpuDemand::Fraction {
            milli: 500,
            vram_gb: 0
        }
    );
}

#[test]
fn model_constraints_and_pending_reasons() {
    let nodes = [node("t4", 32_000, 2, "T4"), node("g2", 32_000, 8, "G2")];
    let mut e = engine(&nodes, Box::new(BestFit));
    for _ in 0..2 {
        let (n, _) = chosen(
            &mut e,
            &Request::whole(1, 1000, 0).with_models(["T4", "P100"]),
        );
        assert_eq!(n, "t4");
        e.schedule(&Request::whole(1, 1000, 0).with_models(["T4"]))
            .unwrap();
    }
    let p = e
        .decide(&Request::whole(1, 1000, 0).with_models(["T4"]))
        .unwrap_err();
    assert_eq!(p.rejected.get("gpu busy"), Some(&1));
    assert_eq!(p.rejected.get("gpu model"), Some(&1));
    assert!(p.busy(), "the T4s free up when their leases end");
    let p = e.decide(&Request::whole(9, 1000, 0)).unwrap_err();
    assert_eq!(p.rejected.get("gpu too small"), Some(&2));
    assert!(!p.busy(), "no node has nine GPUs");
    let p = e.decide(&Request::cpu_only(64_000, 0)).unwrap_err();
    assert_eq!(p.rejected.get("cpu"), Some(&2));
    assert!(e
        .decide(&Request::whole(1, 1000, 0).with_zones(["elsewhere"]))
        .is_err());
}

#[test]
fn whole_gpus_prefer_the_tightest_nvlink_domain() {
    let mut n = node("a", 64_000, 8, "H100");
    n.domains = vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]];
    let mut e = engine(&[n], Box::new(BestFit));
    occupy(&mut e, "a", 0, 1000);
    occupy(&mut e, "a", 1, 1000);
    assert_eq!(chosen(&mut e, &Request::whole(2, 1000, 0)).1, vec![2, 3]);
    assert_eq!(
        chosen(&mut e, &Request::whole(4, 1000, 0)).1,
        vec![4, 5, 6, 7]
    );
}

#[test]
fn vram_is_a_hard_limit_for_slices() {
    let nodes = [node("a", 32_000, 1, "T4")];
    let mut e = engine(&nodes, Box::new(BestFit));
    e.schedule(&Request::fraction(100, 10, 1000, 0)).unwrap();
    assert!(e.decide(&Request::fraction(100, 7, 1000, 0)).is_err());
    e.schedule(&Request::fraction(100, 6, 1000, 0)).unwrap();
    assert_eq!(e.cluster().node(0).gpus[0].vram_free, 0);
}

#[test]
fn every_policy_is_deterministic_for_a_seed() {
    let nodes: Vec<NodeSpec> = (0..6)
        .map(|i| node(&format!("n{i}"), 32_000, 4, "G2"))
        .collect();
    let reqs = [
        Request::fraction(300, 0, 2000, 0),
        Request::whole(1, 2000, 0),
        Request::cpu_only(3000, 0),
        Request::fraction(700, 0, 2000, 0),
        Request::whole(2, 2000, 0),
    ];
    let w = workload_of(&reqs);
    for name in policy::POLICY_NAMES {
        let run = || {
            let mut e = Engine::new(
                Cluster::new(&nodes),
                lh_placement_lab::policy_by_name(name, &w).unwrap(),
                7,
            );
            (0..30)
                .map(|i| {
                    e.schedule(&reqs[i % reqs.len()])
                        .map(|(d, _)| (d.node, d.gpus))
                        .ok()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run(), "{name}");
    }
}

fn task(name: &str, cpu: u64, num: u32, milli: u32) -> Task {
    Task {
        name: name.into(),
        cpu_milli: cpu,
        memory_mib: 0,
        num_gpu: num,
        gpu_milli: milli,
        gpu_spec: String::new(),
        duration_s: 0,
    }
}

#[test]
fn protocol_on_a_small_synthetic_trace() {
    // 10 GPUs; whole-GPU tasks only: the cluster fills to exactly 100% and
    // the inflated list ends at exactly 130% arrived.
    let nodes: Vec<NodeSpec> = (0..5)
        .map(|i| node(&format!("n{i}"), 64_000, 2, "G2"))
        .collect();
    let tasks: Vec<Task> = (0..6)
        .map(|i| task(&format!("t{i}"), 1000, 1, 1000))
        .collect();
    for name in policy::POLICY_NAMES {
        for order in [Order::AppendThenShuffle, Order::ShuffleThenAppend] {
            let cluster = Cluster::new(&nodes);
            let cap = cluster.gpu_milli_total();
            let seq = arrival_sequence(&tasks, cap, 1.3, 42, order);
            assert_eq!(seq.len(), 13);
            let w = trace::published_mix(&tasks);
            let mut e = Engine::new(
                cluster,
                lh_placement_lab::policy_by_name(name, &w).unwrap(),
                42,
            )
            .with_ranked_ties();
            let r = replay(&mut e, &tasks, &seq);
            assert_eq!((r.placed, r.failed), (10, 3));
            let c = curve(&r, cap);
            assert_eq!(c[130], Some(100.0), "{name}");
            assert_eq!(c[100], Some(100.0));
            assert_eq!(c[50], Some(50.0));
            let pts: Vec<f64> = c.iter().flatten().copied().collect();
            assert!(
                pts.windows(2).all(|w| w[0] <= w[1]),
                "{name}: not monotone {c:?}"
            );
        }
    }
}

#[test]
fn curve_reads_like_the_published_analysis() {
    let r = trace::Replay {
        arrived: vec![1000, 2000, 2000, 9000],
        allocated: vec![1000, 1500, 2000, 8000],
        placed: 4,
        failed: 0,
        ..Default::default()
    };
    let c = curve(&r, 10_000);
    assert_eq!(c[10], Some(10.0));
    // Two tasks at 20% arrived: the mean of 15% and 20%.
    assert_eq!(c[20], Some(17.5));
    // 21% has no task; its neighbours 20% and 22% (none) stand in.
    assert_eq!(c[21], Some(17.5));
    assert_eq!(c[50], None);
    assert_eq!(c[89], Some(80.0));
}

#[test]
fn trace_rows_become_requests() {
    let tasks = trace::parse_tasks(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
         a,12000,16384,1,1000,\n\
         b,6000,12288,1,460,V100M16|V100M32\n\
         c,32000,65536,0,0,\n\
         d,88000,327680,8,1000,\n",
    )
    .unwrap();
    assert_eq!(tasks[0].request().gpu, GpuDemand::Whole { count: 1 });
    let b = tasks[1].request();
    assert_eq!(
        b.gpu,
        GpuDemand::Fraction {
            milli: 460,
            vram_gb: 0
        }
    );
    assert_eq!(b.models, vec!["V100M16", "V100M32"]);
    assert_eq!(tasks[2].request().gpu, GpuDemand::None);
    assert_eq!(tasks[3].gpu_milli_total(), 8000);
    let nodes =
        trace::parse_nodes("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n").unwrap();
    assert_eq!(nodes[0].gpus.len(), 2);
    assert_eq!(Cluster::new(&nodes).gpu_milli_total(), 2000);
}

fn mig_request(profile: &str) -> Request {
    Request {
        gpu: GpuDemand::Mig {
            profile: profile.into(),
        },
        ..Request::cpu_only(0, 0)
    }
    .with_models(["A100-40GB"])
}

#[test]
fn mig_instances_pack_onto_live_gpus_and_an_idle_gpu_is_resliced() {
    let mig_gpu = GpuSpec {
        model: "A100-40GB".into(),
        vram_gb: 40,
        mode: SharingMode::Mig,
    };
    let nodes = [
        NodeSpec::uniform("m", "z1", 64_000, 1 << 20, 2, mig_gpu),
        NodeSpec::uniform("v", "z1", 64_000, 1 << 20, 2, vgpu("A100-40GB")),
    ];
    let mut e = engine(
        &nodes,
        lh_placement_lab::policy_by_name("leasehold", &ShapeMix::default()).unwrap(),
    );

    // Only MIG GPUs take MIG instances, and they take nothing else.
    let (d, a) = e.schedule(&mig_request("3g.20gb")).unwrap();
    assert_eq!(e.cluster().node(d.node).id, "m");
    assert_eq!(d.provenance.policy, "mig-best-fit");
    let hold = e.cluster().allocation(a).unwrap().mig.unwrap();
    assert_eq!(
        (hold.profile.name, hold.start, hold.milli, hold.vram_gb),
        ("3g.20gb", 4, 428, 20)
    );
    for r in [Request::whole(1, 0, 0), Request::fraction(100, 1, 0, 0)] {
        let (d, _) = e.schedule(&r.with_models(["A100-40GB"])).unwrap();
        assert_eq!(e.cluster().node(d.node).id, "v");
    }

    // The next instances fill the live GPU; the idle one stays whole.
    let (d2, b) = e.schedule(&mig_request("3g.20gb")).unwrap();
    assert_eq!(d2.gpus, d.gpus, "packed next to the first");
    assert_eq!(e.cluster().allocation(b).unwrap().mig.unwrap().start, 0);
    let (d3, _) = e.schedule(&mig_request("7g.40gb")).unwrap();
    assert_ne!(d3.gpus, d.gpus, "a full-GPU profile takes the idle GPU");

    // No room for another 7g; nor for a 1g: two 3g.20gb cover all eight
    // memory slices though compute slice 3 is idle (NVIDIA's geometry).
    let pending = e.decide(&mig_request("7g.40gb")).unwrap_err();
    assert_eq!(pending.rejected.get("gpu busy"), Some(&1));
    assert_eq!(
        pending.rejected.get("gpu mode"),
        Some(&1),
        "node v has no MIG GPU"
    );
    assert!(e.decide(&mig_request("1g.5gb")).is_err());

    // Unknown profiles and other models fit nowhere.
    assert!(e.decide(&mig_request("1g.10gb")).is_err());
    assert!(e.decide(&mig_request("nope")).is_err());

    // Released, the GPU is idle again and may be cut differently.
    let live: Vec<AllocId> = e
        .cluster()
        .allocations()
        .filter(|(_, x)| x.mig.is_some() && x.gpus == d.gpus)
        .map(|(id, _)| id)
        .collect();
    for id in live {
        e.release(id).unwrap();
    }
    let (d5, c) = e.schedule(&mig_request("4g.20gb")).unwrap();
    assert_eq!(d5.gpus, d.gpus);
    assert_eq!(e.cluster().allocation(c).unwrap().mig.unwrap().start, 0);
}

#[test]
fn mig_instances_are_restored_where_they_are_and_overlaps_refused() {
    let mig_gpu = GpuSpec {
        model: "A100-40GB".into(),
        vram_gb: 40,
        mode: SharingMode::Mig,
    };
    let mut c = Cluster::new(&[NodeSpec::uniform("m", "z1", 8_000, 1 << 20, 1, mig_gpu)]);
    let d = c.demand(&mig_request("2g.10gb"));
    // 2g.10gb may start at 0, 2 or 4: restore one at 2, as the log says.
    let a = c.allocate_mig_at(0, &d, 0, 2).unwrap();
    assert_eq!(c.allocation(a).unwrap().mig.unwrap().start, 2);
    assert!(matches!(
        c.allocate_mig_at(0, &d, 0, 2),
        Err(AllocError::Mig(_))
    ));
    assert!(matches!(
        c.allocate_mig_at(0, &d, 0, 1),
        Err(AllocError::Mig(_))
    ));
    let d3 = c.demand(&mig_request("3g.20gb"));
    // 3g.20gb at 0 would cover slice 2: overlaps; at 4 it fits.
    assert!(c.allocate_mig_at(0, &d3, 0, 0).is_err());
    c.allocate_mig_at(0, &d3, 0, 4).unwrap();
    assert_eq!(c.node(0).gpus[0].milli_free, 1000 - 285 - 428);
}

#[test]
fn gang_reserve_keeps_the_last_untouched_big_node_for_gangs_but_never_refuses() {
    // As in the trace, the gang shape is too rare to be in the workload.
    let w = workload_of(&[Request::whole(1, 1000, 0)]);
    let nodes = [node("big", 128_000, 8, "G2"), node("small", 2_000, 2, "G2")];
    // On the small node this task leaves too little CPU for the other GPU:
    // FGD's measure sends it to the big node.
    let w1 = Request::whole(1, 1_500, 0);
    let mut plain = engine(
        &nodes,
        lh_placement_lab::policy_by_name("leasehold", &w).unwrap(),
    );
    assert_eq!(chosen(&mut plain, &w1).0, "big");
    let mut e = engine(
        &nodes,
        lh_placement_lab::policy_by_name("leasehold+gr=1", &w).unwrap(),
    );
    assert_eq!(chosen(&mut e, &w1).0, "small");
    // A gang may take the reserved node.
    assert_eq!(chosen(&mut e, &Request::whole(8, 8_000, 0)).0, "big");
    // Once nothing else fits, the reserve gives way instead of refusing.
    e.schedule(&w1).unwrap();
    assert_eq!(chosen(&mut e, &w1).0, "big");
}

#[test]
fn version_3_keeps_a_slice_out_of_a_hole_the_workload_cannot_fill() {
    // Mostly whole GPUs, and slices of 470 (the most common), 320 and 650.
    // A 320 beside a lone 470 leaves 210, which no slice of the workload
    // fills; on an untouched GPU it waits for a 650. FGD's measure (and so
    // version 2) sees a whole GPU broken and pairs them; the LP's shares see
    // that 470s pair with 470s and 320s with 650s.
    let mut reqs = vec![Request::whole(1, 1000, 0); 6];
    reqs.extend(vec![Request::fraction(470, 0, 1000, 0); 3]);
    reqs.push(Request::fraction(320, 0, 1000, 0));
    reqs.push(Request::fraction(650, 0, 1000, 0));
    let w = workload_of(&reqs);
    let nodes = [node("a", 32_000, 1, "G2"), node("b", 32_000, 1, "G2")];
    let slice = Request::fraction(320, 0, 1000, 0);
    let mut v2 = engine(
        &nodes,
        lh_placement_lab::policy_by_name("leasehold+v2", &w).unwrap(),
    );
    occupy(&mut v2, "a", 0, 470);
    assert_eq!(chosen(&mut v2, &slice).0, "a");
    let mut v3 = engine(
        &nodes,
        lh_placement_lab::policy_by_name("leasehold", &w).unwrap(),
    );
    occupy(&mut v3, "a", 0, 470);
    assert_eq!(chosen(&mut v3, &slice).0, "b");
}

#[test]
fn version_4_keeps_the_cpu_a_node_needs_to_reach_its_free_gpus() {
    // Slices of 500 milli that ask for 4,000 or 1,000 CPU, and CPU-only
    // tasks of 6,000. Node `a` has one GPU with 500 free and 6,500 CPU free,
    // node `b` four GPUs with 500 free each and 8,000 CPU free. A CPU-only
    // task leaves `a` 500 CPU, too little for either slice: its 500 free
    // milli are stranded. It leaves `b` 2,000, which the 1,000-CPU slices
    // still fit. FGD's score loses less on `a` (40 against 31); the
    // stranding charge of version 4 sends the task to `b`.
    let slice = |cpu_milli: u64, weight: f64| Shape {
        cpu_milli,
        memory_mib: 0,
        gpu: GpuDemand::Fraction {
            milli: 500,
            vram_gb: 0,
        },
        models: Vec::new(),
        weight,
    };
    let w = ShapeMix {
        shapes: vec![
            slice(4_000, 0.4),
            slice(1_000, 0.4),
            Shape {
                gpu: GpuDemand::None,
                ..slice(6_000, 0.2)
            },
        ],
    };
    let nodes = [node("a", 7_500, 1, "G2"), node("b", 12_000, 4, "G2")];
    let task = Request::cpu_only(6_000, 0);
    for (policy, want) in [
        ("fgd", "a"),
        ("leasehold+v1", "a"),
        ("leasehold+v2", "a"),
        ("leasehold+v3", "a"),
        ("leasehold+st=1", "b"),
        ("leasehold", "b"),
    ] {
        let mut e = engine(
            &nodes,
            lh_placement_lab::policy_by_name(policy, &w).unwrap(),
        );
        occupy(&mut e, "a", 0, 500);
        for gpu in 0..4 {
            occupy(&mut e, "b", gpu, 500);
        }
        assert_eq!(chosen(&mut e, &task).0, want, "{policy}");
    }
}
