//! Where the idle GPU milli is at the end of one openb replay (the published
//! protocol, as `lh-sim` runs it), to see what a policy leaves behind.
//!
//! ```text
//! cargo run --release -p lh-placement --example endstate -- NODES TASKS POLICY SEED
//! ```
//!
//! Prints the LP's share of a GPU for each slice size, the allocation, the
//! tasks that arrived and failed per shape (and the arrived share at the
//! first failure), the idle milli by how much of a GPU is free, the slice
//! mixes of the partly used GPUs that keep the most
//! idle milli, where the smallest slices went, and the idle milli split into
//! "no trace shape fits the GPU", "a shape fits the GPU but not the node's
//! CPU or memory" (stranded) and "a shape would fit" (unfilled), and how
//! close the GPUs of slices without an 810 are to the LP's best packing of
//! the slices they hold.
use std::collections::{BTreeMap, HashSet};

use lh_placement::packing::SliceShares;
use lh_placement::{Cluster, Demand, Engine, Kind};
use lh_placement_lab::trace::{self, Order};

fn label(d: &Demand) -> String {
    match d.kind {
        Kind::None => "cpu".to_string(),
        Kind::Whole(n) => format!("whole{n}"),
        Kind::Frac { milli, .. } => format!("frac{milli:04}"),
        Kind::Mig(_) => "mig".to_string(),
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 {
        eprintln!("usage: endstate NODES TASKS POLICY SEED");
        std::process::exit(2);
    }
    let nodes = trace::parse_nodes(&std::fs::read_to_string(&a[1]).expect("nodes")).unwrap();
    let tasks = trace::parse_tasks(&std::fs::read_to_string(&a[2]).expect("tasks")).unwrap();
    let name = &a[3];
    let seed: u64 = a[4].parse().expect("seed");
    let cluster = Cluster::new(&nodes);
    let cap = cluster.gpu_milli_total();
    let workload = trace::mix_for(name, &tasks);
    let p = lh_placement_lab::policy_by_name(name, &workload).expect("policy");
    // What version 3 prices each slice size at (the cutting-stock LP's
    // shares of a GPU, `lh_placement::packing`).
    // The LP sees the cut mix, also where a switch hands the policy the
    // uncut one.
    let sizes = if name.starts_with("leasehold") {
        trace::leasehold_mix(&tasks).slice_sizes()
    } else {
        workload.slice_sizes()
    };
    let shares = SliceShares::solve(&sizes);
    let mut milli: Vec<u16> = sizes.iter().map(|s| s.0).collect();
    milli.sort_unstable();
    milli.dedup();
    let listed: Vec<String> = milli
        .iter()
        .rev()
        .map(|&m| format!("{m}:{:.3}", shares.share(m)))
        .collect();
    println!("slice shares of a GPU (LP): {}", listed.join(" "));
    let seq = trace::arrival_sequence(&tasks, cap, 1.3, seed, Order::AppendThenShuffle);
    let mut e = Engine::new(cluster, p, seed).with_ranked_ties();
    let demands: Vec<Demand> = tasks
        .iter()
        .map(|t| e.cluster().demand(&t.request()))
        .collect();

    // (arrived, failed, arrived % at the first failure) per shape.
    let mut per_kind: BTreeMap<String, (u64, u64, Option<f64>)> = BTreeMap::new();
    // Every failure of a multi-GPU task: its GPUs, and the arrived % then.
    let mut multi_failed: Vec<(u8, f64)> = Vec::new();
    let mut arrived = 0u64;
    for &t in &seq {
        arrived += tasks[t].gpu_milli_total();
        let d = demands[t];
        let k = per_kind.entry(label(&d)).or_default();
        k.0 += 1;
        if e.schedule_demand(&d).is_err() {
            let at = arrived as f64 / cap as f64 * 100.0;
            k.1 += 1;
            k.2.get_or_insert(at);
            if let Kind::Whole(n @ 2..) = d.kind {
                multi_failed.push((n, at));
            }
        }
    }
    let c = e.cluster();
    println!(
        "alloc {:.2}% idle {}",
        c.gpu_milli_used() as f64 / cap as f64 * 100.0,
        cap - c.gpu_milli_used()
    );
    println!("shape: arrived failed first-failure-at-%");
    for (k, (n, f, at)) in &per_kind {
        println!(
            "  {k}: {n} {f} {}",
            at.map_or("-".into(), |x| format!("{x:.1}"))
        );
    }

    let mut by_free: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
    for n in c.nodes() {
        for g in n.gpus.iter().filter(|g| g.milli_free > 0) {
            let b = if g.leases == 0 {
                1000
            } else {
                g.milli_free / 100 * 100
            };
            let e = by_free.entry(b).or_default();
            e.0 += 1;
            e.1 += u64::from(g.milli_free);
        }
    }
    println!("idle by free milli of the GPU, in 100s (1000: untouched): GPUs, milli");
    for (b, (n, m)) in &by_free {
        println!("  {b}: {n} {m}");
    }

    let mut slices: BTreeMap<(u32, u32), Vec<u16>> = BTreeMap::new();
    for (_, al) in c.allocations() {
        if let Kind::Frac { milli, .. } = al.demand.kind {
            slices
                .entry((al.node, al.gpus.trailing_zeros()))
                .or_default()
                .push(milli);
        }
    }
    let mut mixes: BTreeMap<Vec<u16>, u64> = BTreeMap::new();
    let mut small: BTreeMap<Vec<u16>, u64> = BTreeMap::new();
    // The GPUs of slices without an 810: how many, their idle milli, and
    // how many GPUs the LP's shares say their slices need at best.
    let (mut mix_gpus, mut mix_idle, mut mix_lp) = (0u64, 0u64, 0.0f64);
    for ((node, j), mut v) in slices {
        v.sort_unstable();
        let g = &c.node(node as usize).gpus[j as usize];
        if !v.contains(&810) {
            mix_gpus += 1;
            mix_idle += u64::from(g.milli_free);
            mix_lp += v.iter().map(|&m| shares.share(m)).sum::<f64>();
        }
        *mixes.entry(v.clone()).or_default() += u64::from(g.milli_free);
        if v[0] < 200 {
            *small.entry(v).or_default() += 1;
        }
    }
    let mut mixes: Vec<_> = mixes.into_iter().filter(|m| m.1 > 0).collect();
    mixes.sort_by_key(|m| std::cmp::Reverse(m.1));
    println!("slice mixes of partly used GPUs by idle milli (top 15)");
    for (v, m) in mixes.iter().take(15) {
        println!("  {v:?}: {m}");
    }
    println!("GPUs holding a slice under 200 milli, by mix: {small:?}");
    println!(
        "GPUs of slices without an 810: {mix_gpus}, idle {mix_idle}; their slices on the LP's shares: {mix_lp:.1} GPUs"
    );

    let shapes: HashSet<Demand> = demands.iter().copied().collect();
    let (mut size, mut stranded, mut unfilled) = (0u64, 0u64, 0u64);
    for n in c.nodes() {
        for g in n.gpus.iter().filter(|g| g.milli_free > 0) {
            let mut gpu_fits = false;
            let mut node_fits = false;
            for d in &shapes {
                let fits = match d.kind {
                    Kind::Frac { milli, vram_gb } => g.fits_frac(milli, vram_gb, d.models),
                    Kind::Whole(1) => g.fits_whole(d.models),
                    _ => false,
                };
                if fits {
                    gpu_fits = true;
                    if n.cpu_free >= d.cpu_milli && n.memory_free >= d.memory_mib {
                        node_fits = true;
                        break;
                    }
                }
            }
            let m = u64::from(g.milli_free);
            if node_fits {
                unfilled += m;
            } else if gpu_fits {
                stranded += m;
            } else {
                size += m;
            }
        }
    }
    println!("idle: no shape fits the GPU {size}, stranded by CPU/memory {stranded}, unfilled {unfilled}");

    // The most any rule that places every task that fits could give back
    // (placement.md, "How far the default trace can go"): every hole of
    // 200 milli or more filled, the slices packed as the LP's shares say,
    // and every multi-GPU task that failed while whole GPUs were still
    // placed saved. A GPU the slices need no more, or a saved task's GPU,
    // goes to the pool of whole GPUs and 810s, at that pool's mean fill.
    let mut pool: HashSet<(usize, usize)> = HashSet::new();
    for (_, al) in c.allocations() {
        let whole = matches!(al.demand.kind, Kind::Whole(_));
        let is_810 = matches!(al.demand.kind, Kind::Frac { milli: 810, .. });
        if whole || is_810 {
            for j in 0..32 {
                if al.gpus & (1 << j) != 0 {
                    pool.insert((al.node as usize, j));
                }
            }
        }
    }
    let pool_fill = pool
        .iter()
        .map(|&(n, j)| 1000.0 - f64::from(c.node(n).gpus[j].milli_free))
        .sum::<f64>()
        / pool.len().max(1) as f64;
    let holes: u64 = c
        .nodes()
        .iter()
        .flat_map(|n| &n.gpus)
        .filter(|g| g.milli_free >= 200)
        .map(|g| u64::from(g.milli_free))
        .sum();
    let run_out = per_kind.get("whole1").and_then(|k| k.2).unwrap_or(f64::MAX);
    let saved: Vec<&(u8, f64)> = multi_failed
        .iter()
        .filter(|(_, at)| *at < run_out)
        .collect();
    let saved_milli: f64 = saved
        .iter()
        .map(|(n, _)| f64::from(*n) * (1000.0 - pool_fill))
        .sum();
    let lp_gap = (mix_gpus as f64 - mix_lp).max(0.0) * pool_fill;
    let back = holes as f64 + lp_gap + saved_milli;
    println!(
        "most a rule could give back: holes of 200+ {holes}, the LP's gap {lp_gap:.0}, {} multi-GPU tasks failed before whole GPUs ran out at {run_out:.1}% ({saved_milli:.0}; pool fill {pool_fill:.1}): {back:.0} milli, to {:.2}%",
        saved.len(),
        (c.gpu_milli_used() as f64 + back) / cap as f64 * 100.0
    );
}
