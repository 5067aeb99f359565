//! lh-sim: replays a node list and a task list with the published openb
//! protocol (the trace's README) for every chosen policy and seed,
//! and scores the allocation curve.
//!
//! ```text
//! lh-sim --nodes FILE --tasks FILE [--policy NAME|all|A,B] [--seeds 42..51] [--out DIR]
//!        [--multinode] [--timed-load LOAD]
//! ```
//!
//! `--multinode` replays the task list's multi-node variant
//! (`trace::multinode`: 8-GPU tasks ask for 16, 4-GPU ones for 12), whose
//! gangs span two nodes; the lines then also count gangs placed and failed.
//! `--timed-load` runs the timed replay instead (`timed`: departures,
//! waiting, arrivals spaced for that offered load) and prints allocation and
//! waits, single-node tasks beside gangs, into `timed.md` as well.
//!
//! Prints one line per policy:
//! `policy=<name> alloc100=<pct> alloc130=<pct> seconds=<s>` (mean over the
//! seeds; without `--policy` only the default policy runs), and writes into
//! `--out` (default `target/lh-sim`): `alloc.csv` (policy, seed, arrived_pct,
//! alloc_pct), `summary.md` (the 100% and 130% table) and `alloc.svg` (mean
//! curves per policy).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use lh_placement_lab::policy::{DEFAULT_POLICY, POLICY_NAMES};
use lh_placement_lab::trace::{self, Order, SeedRun, MAX_PCT};

#[derive(Parser, Debug)]
#[command(
    name = "lh-sim",
    about = "Replay a GPU trace with the published openb protocol and score placement policies"
)]
struct Args {
    /// Node list CSV (sn,cpu_milli,memory_mib,gpu,model).
    #[arg(long)]
    nodes: PathBuf,
    /// Task list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]).
    #[arg(long)]
    tasks: PathBuf,
    /// A policy name, a comma-separated list, or `all`.
    #[arg(long, default_value = DEFAULT_POLICY)]
    policy: String,
    /// Seeds, inclusive range `A..B` or a comma-separated list.
    #[arg(long, default_value = "42..51")]
    seeds: String,
    /// Output directory.
    #[arg(long, default_value = "target/lh-sim")]
    out: PathBuf,
    /// Where appended tasks go: `readme` (append, then shuffle all) or
    /// `simulator` (shuffle the list, append the draws after it, as the
    /// published simulator's code does).
    #[arg(long, default_value = "readme")]
    order: String,
    /// Worker threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Replay the multi-node variant of the task list (8-GPU tasks ask for
    /// 16, 4-GPU ones for 12).
    #[arg(long)]
    multinode: bool,
    /// Run the timed replay (departures and waiting) at this offered load,
    /// a share of the cluster's GPUs (1.0: all of them).
    #[arg(long)]
    timed_load: Option<f64>,
}

fn parse_seeds(s: &str) -> Result<Vec<u64>> {
    if let Some((a, b)) = s.split_once("..") {
        let a: u64 = a.trim().parse().context("seed range start")?;
        let b: u64 = b
            .trim()
            .trim_start_matches('=')
            .parse()
            .context("seed range end")?;
        if b < a {
            bail!("empty seed range {s}");
        }
        return Ok((a..=b).collect());
    }
    s.split(',')
        .map(|x| x.trim().parse::<u64>().context("seed"))
        .collect()
}

fn mean_at(runs: &[&SeedRun], pct: usize) -> Option<f64> {
    let v: Vec<f64> = runs.iter().filter_map(|r| r.curve[pct]).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn fmt_pct(x: Option<f64>) -> String {
    x.map_or_else(|| "nan".to_string(), |v| format!("{v:.2}"))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let nodes_csv = std::fs::read_to_string(&args.nodes)
        .with_context(|| format!("reading {}", args.nodes.display()))?;
    let tasks_csv = std::fs::read_to_string(&args.tasks)
        .with_context(|| format!("reading {}", args.tasks.display()))?;
    let nodes = trace::parse_nodes(&nodes_csv).map_err(anyhow::Error::msg)?;
    let mut tasks = trace::parse_tasks(&tasks_csv).map_err(anyhow::Error::msg)?;
    if args.multinode {
        tasks = trace::multinode(&tasks);
    }
    let policies: Vec<String> = match args.policy.as_str() {
        "all" => POLICY_NAMES.iter().map(|s| s.to_string()).collect(),
        p => p.split(',').map(|s| s.trim().to_string()).collect(),
    };
    for p in &policies {
        if lh_placement_lab::policy_by_name(p, &Default::default()).is_none() {
            bail!("unknown policy {p} (known: {})", POLICY_NAMES.join(", "));
        }
    }
    let order = match args.order.as_str() {
        "readme" => Order::AppendThenShuffle,
        "simulator" => Order::ShuffleThenAppend,
        o => bail!("unknown order {o} (readme or simulator)"),
    };
    let seeds = parse_seeds(&args.seeds)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, seeds.len().max(1));
    eprintln!(
        "lh-sim: {} nodes, {} tasks, {} policies x {} seeds on {} threads",
        nodes.len(),
        tasks.len(),
        policies.len(),
        seeds.len(),
        threads
    );

    if let Some(load) = args.timed_load {
        return timed(&args, &nodes, &tasks, &policies, &seeds, threads, load);
    }
    let mut all: Vec<SeedRun> = Vec::new();
    let mut lines = Vec::new();
    for p in &policies {
        let started = Instant::now();
        let next = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let results: Mutex<Vec<SeedRun>> = Mutex::new(Vec::new());
        let error: Mutex<Option<String>> = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    match trace::run_seed(&nodes, &tasks, p, seed, order) {
                        Ok(r) => {
                            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                            eprintln!(
                                "  {p} seed {seed}: alloc130 {} ({} placed, {} failed) [{n}/{}] {:.1}s",
                                fmt_pct(r.curve[MAX_PCT]),
                                r.placed,
                                r.failed,
                                seeds.len(),
                                started.elapsed().as_secs_f64()
                            );
                            results.lock().unwrap().push(r);
                        }
                        Err(e) => {
                            *error.lock().unwrap() = Some(e);
                            break;
                        }
                    }
                });
            }
        });
        if let Some(e) = error.into_inner().unwrap() {
            bail!(e);
        }
        let secs = started.elapsed().as_secs_f64();
        let mut runs = results.into_inner().unwrap();
        runs.sort_by_key(|r| r.seed);
        let refs: Vec<&SeedRun> = runs.iter().collect();
        let mut line = format!(
            "policy={p} alloc100={} alloc130={} seconds={secs:.2}",
            fmt_pct(mean_at(&refs, 100)),
            fmt_pct(mean_at(&refs, MAX_PCT))
        );
        let gangs: usize = runs.iter().map(|r| r.gangs_placed + r.gangs_failed).sum();
        if gangs > 0 {
            let count = |f: fn(&SeedRun) -> usize| runs.iter().map(f).sum::<usize>();
            let singles = count(|r| r.placed + r.failed) - gangs;
            line.push_str(&format!(
                " gangs_placed={}/{gangs} singles_placed={}/{singles}",
                count(|r| r.gangs_placed),
                count(|r| r.placed - r.gangs_placed),
            ));
        }
        println!("{line}");
        lines.push((
            p.clone(),
            mean_at(&refs, 100),
            mean_at(&refs, MAX_PCT),
            secs,
        ));
        all.extend(runs);
    }

    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut csv = String::from("policy,seed,arrived_pct,alloc_pct\n");
    for r in &all {
        for (pct, v) in r.curve.iter().enumerate() {
            if let Some(v) = v {
                csv.push_str(&format!("{},{},{pct},{v:.2}\n", r.policy, r.seed));
            }
        }
    }
    std::fs::write(args.out.join("alloc.csv"), csv)?;

    let mut md = format!(
        "# lh-sim summary\n\nnodes: `{}`; tasks: `{}`; seeds: {}; order: {}\n\n| policy | alloc at 100% arrived | alloc at 130% arrived | seconds |\n| --- | --- | --- | --- |\n",
        args.nodes.display(),
        args.tasks.display(),
        args.seeds,
        args.order
    );
    for (p, a, b, s) in &lines {
        md.push_str(&format!(
            "| {p} | {} | {} | {s:.2} |\n",
            fmt_pct(*a),
            fmt_pct(*b)
        ));
    }
    std::fs::write(args.out.join("summary.md"), md)?;

    let curves: Vec<(String, Vec<Option<f64>>)> = policies
        .iter()
        .map(|p| {
            let refs: Vec<&SeedRun> = all.iter().filter(|r| &r.policy == p).collect();
            (
                p.clone(),
                (0..=MAX_PCT).map(|pct| mean_at(&refs, pct)).collect(),
            )
        })
        .collect();
    chart::write(
        &args.out.join("alloc.svg"),
        &args.tasks.display().to_string(),
        &curves,
    )?;
    eprintln!(
        "lh-sim: wrote {}/{{alloc.csv,summary.md,alloc.svg}}",
        args.out.display()
    );
    Ok(())
}

mod chart {
    use std::path::Path;

    use anyhow::{anyhow, Result};
    use plotters::prelude::*;

    const COLORS: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
    ];

    /// Mean allocation curve per policy, arrived % on x, allocated % on y.
    pub fn write(path: &Path, title: &str, curves: &[(String, Vec<Option<f64>>)]) -> Result<()> {
        let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e:?}"))?;
        let lo = curves
            .iter()
            .flat_map(|(_, c)| c.iter().skip(60).flatten())
            .fold(100.0f64, |m, &v| m.min(v));
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("GPU allocation vs arrived demand: {title}"),
                ("sans-serif", 18),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(60f64..131f64, (lo.floor() - 1.0).max(0.0)..100f64)
            .map_err(|e| anyhow!("{e:?}"))?;
        chart
            .configure_mesh()
            .x_desc("arrived GPU demand (% of capacity)")
            .y_desc("allocated GPU (% of capacity)")
            .draw()
            .map_err(|e| anyhow!("{e:?}"))?;
        for (i, (name, c)) in curves.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<(f64, f64)> = c
                .iter()
                .enumerate()
                .skip(60)
                .filter_map(|(x, y)| y.map(|y| (x as f64, y)))
                .collect();
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(|e| anyhow!("{e:?}"))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow!("{e:?}"))?;
        root.present().map_err(|e| anyhow!("{e:?}"))?;
        Ok(())
    }
}

/// Runs the timed replay for every policy and seed, and prints and writes
/// the means.
fn timed(
    args: &Args,
    nodes: &[lh_placement::NodeSpec],
    tasks: &[trace::Task],
    policies: &[String],
    seeds: &[u64],
    threads: usize,
    load: f64,
) -> Result<()> {
    use lh_placement_lab::timed::{run_timed, TimedRun};
    let mut md = format!(
        "# lh-sim timed replay\n\nnodes: `{}`; tasks: `{}`{}; seeds: {}; offered load: {load}\n\n\
         | policy | allocation % | single-node tasks: started, mean / p95 wait (s) | gangs: started, mean / p95 wait (s) | seconds |\n\
         | --- | --- | --- | --- | --- |\n",
        args.nodes.display(),
        args.tasks.display(),
        if args.multinode { " (multi-node variant)" } else { "" },
        args.seeds,
    );
    for p in policies {
        let started = Instant::now();
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<std::result::Result<TimedRun, String>>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    let r = run_timed(nodes, tasks, p, seed, load);
                    if let Ok(r) = &r {
                        eprintln!(
                            "  {p} seed {seed}: allocation {:.2}%, singles {}/{} wait {:.0} s, gangs {}/{} wait {:.0} s ({:.1}s)",
                            r.allocation_pct,
                            r.singles.started,
                            r.singles.tasks,
                            r.singles.mean_s,
                            r.gangs.started,
                            r.gangs.tasks,
                            r.gangs.mean_s,
                            started.elapsed().as_secs_f64()
                        );
                    }
                    results.lock().unwrap().push(r);
                });
            }
        });
        let runs: Vec<TimedRun> = results
            .into_inner()
            .unwrap()
            .into_iter()
            .collect::<std::result::Result<_, _>>()
            .map_err(anyhow::Error::msg)?;
        let n = runs.len().max(1) as f64;
        let secs = started.elapsed().as_secs_f64();
        // Per class: started, of, mean and p95 wait.
        let class = |of: fn(&TimedRun) -> &lh_placement_lab::timed::Waits| {
            let started: usize = runs.iter().map(|r| of(r).started).sum();
            let tasks: usize = runs.iter().map(|r| of(r).tasks).sum();
            let mean_s = runs.iter().map(|r| of(r).mean_s).sum::<f64>() / n;
            let p95_s = runs.iter().map(|r| of(r).p95_s).sum::<f64>() / n;
            (started, tasks, mean_s, p95_s)
        };
        let allocation = runs.iter().map(|r| r.allocation_pct).sum::<f64>() / n;
        let (s1, t1, m1, q1) = class(|r| &r.singles);
        let (s2, t2, m2, q2) = class(|r| &r.gangs);
        println!(
            "policy={p} load={load} allocation={allocation:.2} singles_started={s1}/{t1} singles_wait_mean_s={m1:.0} singles_wait_p95_s={q1:.0} gangs_started={s2}/{t2} gangs_wait_mean_s={m2:.0} gangs_wait_p95_s={q2:.0} seconds={secs:.2}"
        );
        md.push_str(&format!(
            "| {p} | {allocation:.2} | {s1}/{t1}, {m1:.0} / {q1:.0} | {s2}/{t2}, {m2:.0} / {q2:.0} | {secs:.2} |\n"
        ));
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::write(args.out.join("timed.md"), md)?;
    eprintln!("lh-sim: wrote {}/timed.md", args.out.display());
    Ok(())
}
