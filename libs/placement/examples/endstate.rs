//! Where the idle GPU milli is at the end of one openb replay.
//!
//! ```text
//! cargo run --release -p lh-placement --example endstate -- NODES TASKS POLICY SEED
//! ```
use std::collections::BTreeMap;

use lh_placement::sim::{self, Order};
use lh_placement::{policy, Cluster, Engine, Kind};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let nodes = sim::parse_nodes(&std::fs::read_to_string(&a[1]).unwrap()).unwrap();
    let tasks = sim::parse_tasks(&std::fs::read_to_string(&a[2]).unwrap()).unwrap();
    let pname = &a[3];
    let seed: u64 = a[4].parse().unwrap();
    let cluster = Cluster::new(&nodes);
    let cap = cluster.gpu_milli_total();
    let w = if pname.starts_with("leasehold") {
        sim::leasehold_workload(&tasks)
    } else {
        sim::published_workload(&tasks)
    };
    let p = policy::by_name(pname, &w).unwrap();
    let seq = sim::arrival_sequence(&tasks, cap, 1.3, seed, Order::AppendThenShuffle);
    let mut e = Engine::new(cluster, p, seed).with_ranked_ties();
    // replay by hand to see failures
    let demands: Vec<_> = tasks
        .iter()
        .map(|t| e.cluster().demand(&t.request()))
        .collect();
    let mut fails: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut arrived = 0u64;
    let mut ties: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    let mut first_fail: BTreeMap<String, f64> = BTreeMap::new();
    for &t in &seq {
        arrived += tasks[t].gpu_milli_total();
        let d = demands[t];
        let key = match d.kind {
            Kind::None => "cpu".to_string(),
            Kind::Whole(n) => format!("whole{n}"),
            Kind::Frac { milli, .. } => format!("frac{milli:04}"),
            Kind::Mig(_) => "mig".into(),
        };
        let ent = fails.entry(key.clone()).or_default();
        ent.0 += 1;
        let res = e.schedule_demand(&d);
        if let Ok((dec, _)) = &res {
            let t = ties.entry(key.clone()).or_insert((0u64, 0u64, 0u64));
            t.0 += 1;
            t.1 += u64::from(dec.provenance.tied);
            if dec.provenance.tied > 1 {
                t.2 += 1;
            }
        }
        if res.is_err() {
            ent.1 += 1;
            if matches!(d.kind, Kind::Whole(8)) && ent.1 <= 3 {
                let c = e.cluster();
                let idle8: Vec<(u64, u64)> = c
                    .nodes()
                    .iter()
                    .filter(|n| n.gpus.len() >= 8 && n.idle_gpus() >= 8)
                    .map(|n| (n.cpu_free / 1000, n.memory_free / 1024))
                    .collect();
                println!(
                    "whole8 fail at {:.1}% needs cpu {} mem {}: nodes with 8 idle GPUs (cpu, mem GiB) {:?}",
                    arrived as f64 / cap as f64 * 100.0,
                    d.cpu_milli / 1000,
                    d.memory_mib / 1024,
                    idle8
                );
            }
            first_fail
                .entry(key)
                .or_insert(arrived as f64 / cap as f64 * 100.0);
        }
    }
    for (k, (n, t, m)) in &ties {
        println!(
            "ties {k}: placed {n} mean tied {:.1} share tied {:.2}",
            *t as f64 / *n as f64,
            *m as f64 / *n as f64
        );
    }
    let c = e.cluster();
    println!(
        "alloc {:.2}% idle {}",
        c.gpu_milli_used() as f64 / cap as f64 * 100.0,
        cap - c.gpu_milli_used()
    );
    println!("task kind: arrived failed first-fail-at%");
    for (k, (n, f)) in &fails {
        println!(
            "  {k}: {n} {f} {:.1}",
            first_fail.get(k).copied().unwrap_or(f64::NAN)
        );
    }
    // Idle by GPU free bucket and by model, and how nodes with idle whole GPUs look.
    let mut by_free: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
    let mut by_model: BTreeMap<String, u64> = BTreeMap::new();
    let mut whole_idle_cpu: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for n in c.nodes() {
        for g in &n.gpus {
            if g.milli_free == 0 {
                continue;
            }
            let b = if g.leases == 0 {
                1000
            } else {
                g.milli_free / 100 * 100
            };
            let e = by_free.entry(b).or_default();
            e.0 += 1;
            e.1 += u64::from(g.milli_free);
            *by_model
                .entry(c.models()[usize::from(g.model)].clone())
                .or_default() += u64::from(g.milli_free);
        }
        let idle = n.gpus.iter().filter(|g| g.leases == 0).count() as u64;
        if idle > 0 {
            let e = whole_idle_cpu.entry(n.cpu_free / 1000).or_default();
            e.0 += 1;
            e.1 += idle;
        }
    }
    println!("idle by GPU free bucket (1000 = untouched GPU): gpus milli");
    for (b, (n, m)) in &by_free {
        println!("  {b}: {n} {m}");
    }
    println!("idle by model: {by_model:?}");
    println!("nodes with untouched GPUs by free cores: nodes gpus");
    for (b, (n, g)) in &whole_idle_cpu {
        println!("  {b}: {n} {g}");
    }
    // What occupies the GPUs with 100..199 free.
    let mut occ: BTreeMap<Vec<u16>, u64> = BTreeMap::new();
    let mut per_gpu: BTreeMap<(u32, u8), Vec<u16>> = BTreeMap::new();
    for (_, a) in c.allocations() {
        if let Kind::Frac { milli, .. } = a.demand.kind {
            per_gpu
                .entry((a.node, a.gpus.trailing_zeros() as u8))
                .or_default()
                .push(milli);
        }
    }
    let mut smalls: BTreeMap<Vec<u16>, u64> = BTreeMap::new();
    let mut stranded: BTreeMap<(u16, u64), u64> = BTreeMap::new();
    for ((node, j), mut v) in per_gpu {
        let n = c.node(node as usize);
        let g = &n.gpus[usize::from(j)];
        if v.iter().any(|&m| m < 200) {
            let mut v = v.clone();
            v.sort();
            *smalls.entry(v).or_default() += 1;
        }
        if g.milli_free >= 200 {
            *stranded
                .entry((g.milli_free / 100 * 100, n.cpu_free / 2000 * 2))
                .or_default() += 1;
        }
        if g.milli_free >= 50 {
            v.sort();
            *occ.entry(v).or_default() += u64::from(g.milli_free);
        }
    }
    let mut occ: Vec<_> = occ.into_iter().collect();
    occ.sort_by(|a, b| b.1.cmp(&a.1));
    println!("partial GPUs with >= 50 free, by slices held: idle milli");
    for (v, m) in occ.iter().take(25) {
        println!("  {v:?}: {m}");
    }
    println!("GPUs holding a slice < 200: count by slices {smalls:?}");
    println!("partial GPUs with >= 200 free by (free bucket, node free cores /2*2): {stranded:?}");
    // Classify each idle milli: no task shape of the trace fits the GPU's free
    // milli (size), one fits by GPU but not by the node's CPU or memory
    // (stranded), or one would fit entirely (unfilled).
    let shapes: Vec<_> = demands
        .iter()
        .copied()
        .collect::<std::collections::HashSet<_>>()
        .into_iter()
        .collect();
    let (mut size, mut strand, mut unfilled) = (0u64, 0u64, 0u64);
    let mut sb: BTreeMap<(u16, bool, bool, String), (u64, u64)> = BTreeMap::new();
    for n in c.nodes() {
        for g in &n.gpus {
            if g.milli_free == 0 {
                continue;
            }
            let mut by_gpu = false;
            let mut full = false;
            let mut cpu_ok = false;
            let mut mem_ok = false;
            for d in &shapes {
                let gf = match d.kind {
                    Kind::Frac { milli, vram_gb } => g.fits_frac(milli, vram_gb, d.models),
                    Kind::Whole(1) => g.fits_whole(d.models),
                    _ => false,
                };
                if gf {
                    by_gpu = true;
                    cpu_ok |= n.cpu_free >= d.cpu_milli;
                    mem_ok |= n.memory_free >= d.memory_mib;
                    if n.cpu_free >= d.cpu_milli && n.memory_free >= d.memory_mib {
                        full = true;
                        break;
                    }
                }
            }
            let m = u64::from(g.milli_free);
            if full {
                unfilled += m
            } else if by_gpu {
                strand += m;
                let e = sb
                    .entry((
                        if g.leases == 0 {
                            1000
                        } else {
                            g.milli_free / 100 * 100
                        },
                        cpu_ok,
                        mem_ok,
                        c.models()[usize::from(g.model)].clone(),
                    ))
                    .or_default();
                e.0 += 1;
                e.1 += m;
            } else {
                size += m
            }
        }
    }
    println!("stranded by (free bucket, some cpu ok, some mem ok, model): gpus milli {sb:?}");
    println!("idle: size-fragment {size} cpu/mem-stranded {strand} unfilled {unfilled}");
}
