//! Decision throughput of the default policy and FGD: on the openb trace
//! cluster (1,213 nodes, when [`trace::openb_dir`] finds it) half-filled by the
//! trace, and on a synthetic 10,000 nodes x 8 GPUs cluster half-filled the
//! same way. One iteration = one `decide` (no allocation), cycling through
//! the trace's task shapes so the per-node caches see the mix they see in a
//! replay; a placement every 8 decisions keeps the caches honest.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use lh_placement::*;
use lh_placement_lab::trace::{self, Task};

fn synthetic_tasks() -> Vec<Task> {
    let shapes = [
        (12_000, 1, 1000),
        (4_000, 1, 460),
        (6_000, 1, 810),
        (32_000, 0, 0),
        (88_000, 8, 1000),
        (3_000, 1, 230),
    ];
    (0..1000)
        .map(|i| {
            let (cpu, n, m) = shapes[i % shapes.len()];
            Task {
                name: format!("t{i:05}"),
                cpu_milli: cpu,
                memory_mib: 16_384,
                num_gpu: n,
                gpu_milli: m,
                gpu_spec: String::new(),
                duration_s: 0,
            }
        })
        .collect()
}

fn setup(nodes: &[NodeSpec], tasks: &[Task], policy: &str) -> (Engine, Vec<Demand>) {
    let cluster = Cluster::new(nodes);
    let cap = cluster.gpu_milli_total();
    let w = if policy == "leasehold" {
        trace::leasehold_mix(tasks)
    } else {
        trace::published_mix(tasks)
    };
    let mut e = Engine::new(
        cluster,
        lh_placement_lab::policy_by_name(policy, &w).unwrap(),
        42,
    )
    .with_ranked_ties();
    let demands: Vec<Demand> = tasks
        .iter()
        .map(|t| e.cluster().demand(&t.request()))
        .collect();
    // Fill to about half of the GPU capacity.
    let seq = trace::arrival_sequence(tasks, cap, 1.3, 42, trace::Order::AppendThenShuffle);
    let mut i = 0;
    while e.cluster().gpu_milli_used() * 2 < cap && i < seq.len() * 4 {
        let _ = e.schedule_demand(&demands[seq[i % seq.len()]]);
        i += 1;
    }
    (e, demands)
}

fn bench_cluster(c: &mut Criterion, label: &str, nodes: &[NodeSpec], tasks: &[Task]) {
    for policy in ["leasehold", "fgd"] {
        let (mut e, demands) = setup(nodes, tasks, policy);
        let mut k = 0usize;
        let mut placed = Vec::new();
        c.bench_function(&format!("decide {policy} {label}"), |b| {
            b.iter(|| {
                let d = &demands[k % demands.len()];
                k += 1;
                let r = e.decide_demand(black_box(d));
                if k.is_multiple_of(8) {
                    if let Ok(dec) = &r {
                        if let Ok(id) = e.place_demand(d, dec) {
                            placed.push(id);
                        }
                    }
                    // Keep the fill level steady.
                    if placed.len() > 64 {
                        let id = placed.remove(0);
                        e.release(id).unwrap();
                    }
                }
                black_box(r.is_ok())
            })
        });
    }
}

fn decide(c: &mut Criterion) {
    if let Some(dir) = trace::openb_dir() {
        let nodes = trace::parse_nodes(
            &std::fs::read_to_string(dir.join("openb_node_list_gpu_node.csv")).unwrap(),
        )
        .unwrap();
        let tasks = trace::parse_tasks(
            &std::fs::read_to_string(dir.join("openb_pod_list_default.csv")).unwrap(),
        )
        .unwrap();
        bench_cluster(c, "openb 1213 nodes", &nodes, &tasks);
    } else {
        eprintln!("no openb trace (set LH_OPENB_DIR): skipping the trace cluster");
    }
    let big: Vec<NodeSpec> = (0..10_000)
        .map(|i| {
            NodeSpec::uniform(
                format!("n{i:05}"),
                "z",
                96_000,
                393_216,
                8,
                GpuSpec {
                    model: if i % 4 == 0 { "T4" } else { "G2" }.into(),
                    vram_gb: 16,
                    mode: SharingMode::VGpu,
                },
            )
        })
        .collect();
    bench_cluster(c, "10000 nodes x 8 GPUs", &big, &synthetic_tasks());
}

/// The cutting-stock LP behind version 3's slice cost, solved once per
/// workload (per decision pass in the scheduler): the slice sizes of the
/// default trace's workload summary (what `lh-sim` solves), and a live
/// workload with 141 distinct sizes (the LP keeps 32).
fn shares(c: &mut Criterion) {
    if let Some(dir) = trace::openb_dir() {
        let tasks = trace::parse_tasks(
            &std::fs::read_to_string(dir.join("openb_pod_list_default.csv")).unwrap(),
        )
        .unwrap();
        let trace = trace::leasehold_mix(&tasks).slice_sizes();
        c.bench_function("slice shares LP, openb default summary", |b| {
            b.iter(|| packing::SliceShares::solve(black_box(&trace)))
        });
    }
    let live: Vec<(u16, f64)> = (7..995)
        .step_by(7)
        .map(|s| (s, 1000.0 / f64::from(s)))
        .collect();
    c.bench_function("slice shares LP, 141 sizes", |b| {
        b.iter(|| packing::SliceShares::solve(black_box(&live)))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(4));
    targets = decide, shares
}
criterion_main!(benches);
