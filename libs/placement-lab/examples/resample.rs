//! Builds an openb-style task list with another share of GPU-sharing tasks,
//! to check that a policy generalises beyond the four published traces.
//!
//! ```text
//! cargo run --release -p lh-placement --example resample -- \
//!     TASKS.csv SHARE SEED > OUT.csv
//! ```
//!
//! `SHARE` (0..1) is the share of GPU demand (milli) that fractional tasks
//! (one GPU, under 1000 milli) should carry, as in the published `gpushareN`
//! traces (the default trace has about 0.28, `gpushare40` 0.40). CPU-only
//! tasks are kept as they are; the GPU tasks are drawn with replacement
//! from the input's fractional and whole-GPU rows, as many of each as gives
//! that share at the input's total GPU demand. Rows keep their columns; the
//! names get a fresh index so they stay unique.
use lh_placement::Rng;
use lh_placement_lab::trace;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 4 {
        eprintln!("usage: resample TASKS.csv SHARE SEED > OUT.csv");
        std::process::exit(2);
    }
    let csv = std::fs::read_to_string(&a[1]).expect("task list");
    let share: f64 = a[2].parse().expect("share in 0..1");
    let seed: u64 = a[3].parse().expect("seed");
    let tasks = trace::parse_tasks(&csv).expect("task list");
    let mut lines = csv.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next().expect("header");
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), tasks.len());
    let is_frac = |t: &trace::Task| t.num_gpu == 1 && t.gpu_milli < 1000;
    let (mut frac, mut whole, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    for (i, t) in tasks.iter().enumerate() {
        if t.num_gpu == 0 {
            cpu.push(i);
        } else if is_frac(t) {
            frac.push(i);
        } else {
            whole.push(i);
        }
    }
    let demand = |v: &[usize]| v.iter().map(|&i| tasks[i].gpu_milli_total()).sum::<u64>() as f64;
    let total = demand(&frac) + demand(&whole);
    let (mean_f, mean_w) = (
        demand(&frac) / frac.len() as f64,
        demand(&whole) / whole.len() as f64,
    );
    let n_frac = (share * total / mean_f).round() as usize;
    let n_whole = ((1.0 - share) * total / mean_w).round() as usize;
    let mut rng = Rng::new(seed);
    let mut out: Vec<usize> = cpu;
    out.extend((0..n_frac).map(|_| frac[rng.below(frac.len() as u64) as usize]));
    out.extend((0..n_whole).map(|_| whole[rng.below(whole.len() as u64) as usize]));
    println!("{header}");
    for (k, &i) in out.iter().enumerate() {
        let rest = rows[i].split_once(',').map_or("", |(_, r)| r);
        println!("resampled-{k:05},{rest}");
    }
    eprintln!(
        "resample: {} cpu-only, {n_frac} fractional, {n_whole} whole-GPU tasks",
        out.len() - n_frac - n_whole
    );
}
