//! The published trace experiment, as pure functions: parse the openb node
//! and task lists, build the arrival sequence for a seed, replay it through
//! an engine, and read the allocation curve the way the published analysis
//! does. `lh-sim` adds files, threads and charts.
//!
//! Protocol (the trace's README, and the published simulator's code):
//! 1. Inflate the task list with tasks drawn uniformly with replacement until
//!    one more would push requested GPU milli past 1.3 x the cluster's.
//! 2. Shuffle with the seed, place one task at a time; a task that fits
//!    nowhere fails for good; nothing departs.
//! 3. After every task, record arrived GPU milli and allocated GPU milli. The
//!    ratio at X% arrived is the mean allocation over the tasks whose arrived
//!    share rounds to X (the neighbours X±1 when none does).

use lh_placement::model::{GpuDemand, GpuSpec, NodeSpec, Request, SharingMode};
use lh_placement::{Cluster, Demand, Engine, Rng, ShapeMix, ShapeMixConfig};

/// Where the openb trace is on this machine, if anywhere: the folder named by
/// `LH_OPENB_DIR`, else `shared/traces/openb` beside the checkout. The trace is
/// not part of the repository, so tests and benches that want it go without.
pub fn openb_dir() -> Option<std::path::PathBuf> {
    let beside_checkout =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/openb");
    std::env::var_os("LH_OPENB_DIR")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain([beside_checkout])
        .find(|p| p.join("openb_node_list_gpu_node.csv").exists())
}

/// One task of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub num_gpu: u32,
    /// Share of one GPU per GPU (1..=1000); 1000 for whole GPUs.
    pub gpu_milli: u32,
    /// Any-of GPU models, `A|B`; empty for any.
    pub gpu_spec: String,
    /// Seconds it held its resources in the trace (`deletion_time -
    /// creation_time`); 0 where the list has no times.
    pub duration_s: u64,
}

impl Task {
    /// GPU milli the task asks for in total.
    pub fn gpu_milli_total(&self) -> u64 {
        if self.num_gpu == 0 {
            0
        } else {
            u64::from(self.gpu_milli) * u64::from(self.num_gpu)
        }
    }

    /// Per-GPU milli (what the simulator's inflation compares).
    pub fn gpu_milli_per_gpu(&self) -> u64 {
        if self.num_gpu == 0 {
            0
        } else {
            u64::from(self.gpu_milli)
        }
    }

    /// The engine request: whole GPUs when the task takes 1000 milli per GPU,
    /// a slice of one GPU (without a VRAM limit) below that, CPU only when it
    /// asks no GPU.
    pub fn request(&self) -> Request {
        let gpu = if self.num_gpu == 0 || self.gpu_milli == 0 {
            GpuDemand::None
        } else if self.num_gpu == 1 && self.gpu_milli < 1000 {
            GpuDemand::Fraction {
                milli: self.gpu_milli as u16,
                vram_gb: 0,
            }
        } else {
            GpuDemand::Whole {
                count: self.num_gpu.min(255) as u8,
            }
        };
        let models = if matches!(gpu, GpuDemand::None) {
            Vec::new()
        } else {
            self.gpu_spec
                .split('|')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        };
        Request {
            cpu_milli: self.cpu_milli,
            memory_mib: self.memory_mib,
            gpu,
            models,
            zones: Vec::new(),
            preemptibility: Default::default(),
            needs_isolation: false,
        }
    }
}

/// VRAM of the trace's models in GB (0 for the undisclosed G* ones). Only
/// whole-GPU leases take it; the trace's slices do not limit VRAM.
pub fn trace_vram_gb(model: &str) -> u32 {
    match model {
        "P100" | "T4" | "V100M16" => 16,
        "V100M32" => 32,
        "A10" => 24,
        _ => 0,
    }
}

fn columns(header: &str) -> Vec<String> {
    header.split(',').map(|s| s.trim().to_string()).collect()
}

fn col(cols: &[String], name: &str) -> Result<usize, String> {
    cols.iter()
        .position(|c| c == name)
        .ok_or_else(|| format!("missing column {name}"))
}

fn num(field: Option<&str>, what: &str, line: usize) -> Result<u64, String> {
    let s = field.unwrap_or("").trim();
    if s.is_empty() {
        return Ok(0);
    }
    s.parse::<u64>()
        .or_else(|_| s.parse::<f64>().map(|f| f as u64))
        .map_err(|_| format!("line {line}: bad {what} {s:?}"))
}

/// Parses `sn,cpu_milli,memory_mib,gpu,model`. Every GPU is shared as vGPU
/// (the trace's GPU-sharing cluster).
pub fn parse_nodes(csv: &str) -> Result<Vec<NodeSpec>, String> {
    let mut lines = csv.lines();
    let cols = columns(lines.next().ok_or("empty node list")?);
    let (sn, cpu, mem, gpu, model) = (
        col(&cols, "sn")?,
        col(&cols, "cpu_milli")?,
        col(&cols, "memory_mib")?,
        col(&cols, "gpu")?,
        col(&cols, "model")?,
    );
    let mut out = Vec::new();
    for (i, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let count = num(f.get(gpu).copied(), "gpu", i + 2)? as usize;
        let m = f.get(model).copied().unwrap_or("").trim().to_string();
        out.push(NodeSpec {
            id: f.get(sn).copied().unwrap_or("").trim().to_string(),
            zone: "default".to_string(),
            cpu_milli: num(f.get(cpu).copied(), "cpu_milli", i + 2)?,
            memory_mib: num(f.get(mem).copied(), "memory_mib", i + 2)?,
            gpus: vec![
                GpuSpec {
                    vram_gb: trace_vram_gb(&m),
                    model: m,
                    mode: SharingMode::VGpu,
                };
                count
            ],
            domains: Vec::new(),
            isolates_workloads: true,
            one_share_size_per_gpu: false,
            fabric: String::new(),
        });
    }
    Ok(out)
}

/// Parses `name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`.
pub fn parse_tasks(csv: &str) -> Result<Vec<Task>, String> {
    let mut lines = csv.lines();
    let cols = columns(lines.next().ok_or("empty task list")?);
    let (name, cpu, mem, ng, gm) = (
        col(&cols, "name")?,
        col(&cols, "cpu_milli")?,
        col(&cols, "memory_mib")?,
        col(&cols, "num_gpu")?,
        col(&cols, "gpu_milli")?,
    );
    let spec = cols.iter().position(|c| c == "gpu_spec");
    let created = cols.iter().position(|c| c == "creation_time");
    let deleted = cols.iter().position(|c| c == "deletion_time");
    let mut out = Vec::new();
    for (i, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let num_gpu = num(f.get(ng).copied(), "num_gpu", i + 2)? as u32;
        let gpu_milli = num(f.get(gm).copied(), "gpu_milli", i + 2)?.min(1000) as u32;
        let time = |at: Option<usize>, what| match at {
            Some(at) => num(f.get(at).copied(), what, i + 2),
            None => Ok(0),
        };
        let duration_s =
            time(deleted, "deletion_time")?.saturating_sub(time(created, "creation_time")?);
        out.push(Task {
            name: f.get(name).copied().unwrap_or("").trim().to_string(),
            cpu_milli: num(f.get(cpu).copied(), "cpu_milli", i + 2)?,
            memory_mib: num(f.get(mem).copied(), "memory_mib", i + 2)?,
            num_gpu,
            gpu_milli: if num_gpu > 0 { gpu_milli } else { 0 },
            gpu_spec: spec
                .and_then(|s| f.get(s))
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            duration_s,
        });
    }
    Ok(out)
}

/// The multi-node variant of a task list: every task asking for 8 whole
/// GPUs asks for 16, and every one asking for 4 asks for 12, each with the
/// CPU and memory per GPU it had. On the openb cluster, whose largest nodes
/// hold 8 GPUs, these are gangs of two nodes (8 + 8, 8 + 4); every other
/// task is as it was. Names gain `-x2` / `-x3`.
pub fn multinode(tasks: &[Task]) -> Vec<Task> {
    tasks
        .iter()
        .map(|t| {
            let wider = match (t.num_gpu, t.gpu_milli) {
                (8, 1000) => 16,
                (4, 1000) => 12,
                _ => return t.clone(),
            };
            let scale = |x: u64| x * u64::from(wider) / u64::from(t.num_gpu);
            Task {
                name: format!("{}-x{}", t.name, wider / t.num_gpu),
                cpu_milli: scale(t.cpu_milli),
                memory_mib: scale(t.memory_mib),
                num_gpu: wider,
                ..t.clone()
            }
        })
        .collect()
}

/// Where the appended tasks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// As the trace README states it: append, then shuffle everything.
    AppendThenShuffle,
    /// As the published simulator's code does it: shuffle the original list,
    /// then append the drawn tasks after it.
    ShuffleThenAppend,
}

/// The inflated, ordered task sequence for one seed (indices into `tasks`).
///
/// Tasks are first sorted by name (as the simulator does). Draws stop at the
/// first task whose per-GPU milli would push the requested total past
/// `ratio` x `capacity_milli` (the simulator compares the per-GPU milli, and
/// adds the task's total).
pub fn arrival_sequence(
    tasks: &[Task],
    capacity_milli: u64,
    ratio: f64,
    seed: u64,
    order: Order,
) -> Vec<usize> {
    let mut by_name: Vec<usize> = (0..tasks.len()).collect();
    by_name.sort_by(|&a, &b| tasks[a].name.cmp(&tasks[b].name));
    let mut rng = Rng::new(seed);
    let mut seq = by_name.clone();
    if order == Order::ShuffleThenAppend {
        rng.shuffle(&mut seq);
    }
    let target = ratio * capacity_milli as f64;
    let mut total: u64 = tasks.iter().map(Task::gpu_milli_total).sum();
    if (total as f64) > target {
        while (total as f64) > target && !seq.is_empty() {
            let i = rng.below(seq.len() as u64) as usize;
            total -= tasks[seq.remove(i)].gpu_milli_total();
        }
    } else if !by_name.is_empty() {
        loop {
            let t = by_name[rng.below(by_name.len() as u64) as usize];
            if (total + tasks[t].gpu_milli_per_gpu()) as f64 > target {
                break;
            }
            total += tasks[t].gpu_milli_total();
            seq.push(t);
        }
    }
    if order == Order::AppendThenShuffle {
        rng.shuffle(&mut seq);
    }
    seq
}

/// What one replay recorded, one entry per task in arrival order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replay {
    /// Cumulative requested GPU milli after each task.
    pub arrived: Vec<u64>,
    /// Allocated GPU milli after each task.
    pub allocated: Vec<u64>,
    pub placed: usize,
    pub failed: usize,
    /// Of those, the gangs: tasks of more GPUs than any node holds.
    pub gangs_placed: usize,
    pub gangs_failed: usize,
}

/// Whether `t` is a gang on `cluster`: more whole GPUs than any of its
/// nodes holds.
pub fn is_gang(cluster: &Cluster, t: &Task) -> bool {
    let largest = cluster.nodes().iter().map(|n| n.gpus.len()).max();
    t.gpu_milli == 1000 && largest.is_some_and(|l| t.num_gpu as usize > l)
}

/// Replays `seq` through `engine`; nothing departs.
pub fn replay(engine: &mut Engine, tasks: &[Task], seq: &[usize]) -> Replay {
    let demands: Vec<Demand> = tasks
        .iter()
        .map(|t| engine.cluster().demand(&t.request()))
        .collect();
    let mut r = Replay {
        arrived: Vec::with_capacity(seq.len()),
        allocated: Vec::with_capacity(seq.len()),
        ..Replay::default()
    };
    let gang: Vec<bool> = tasks.iter().map(|t| is_gang(engine.cluster(), t)).collect();
    let mut arrived = 0u64;
    for &t in seq {
        arrived += tasks[t].gpu_milli_total();
        let placed = if gang[t] {
            engine.schedule_gang(&tasks[t].request()).is_ok()
        } else {
            engine.schedule_demand(&demands[t]).is_ok()
        };
        match (placed, gang[t]) {
            (true, false) => r.placed += 1,
            (false, false) => r.failed += 1,
            (true, true) => r.gangs_placed += 1,
            (false, true) => r.gangs_failed += 1,
        }
        r.arrived.push(arrived);
        r.allocated.push(engine.cluster().gpu_milli_used());
    }
    r
}

/// Highest arrived percent the curve reports.
pub const MAX_PCT: usize = 130;

/// Allocation ratio (percent of `capacity_milli`) at each arrived percent
/// 0..=130, as the published analysis reads it: mean over the tasks whose
/// arrived share rounds (half to even) to that percent, each allocation
/// rounded to 2 decimals first; when no task does, the tasks within ±1
/// percent; `None` when none is.
pub fn curve(r: &Replay, capacity_milli: u64) -> Vec<Option<f64>> {
    let cap = capacity_milli as f64;
    let pts: Vec<(i64, f64)> = r
        .arrived
        .iter()
        .zip(&r.allocated)
        .map(|(&a, &u)| {
            let pct = (a as f64 / cap * 100.0).round_ties_even() as i64;
            let alloc = (u as f64 / cap * 100.0 * 100.0).round_ties_even() / 100.0;
            (pct, alloc)
        })
        .collect();
    (0..=MAX_PCT as i64)
        .map(|p| {
            let mean = |lo: i64, hi: i64| {
                let (s, n) = pts
                    .iter()
                    .filter(|(q, _)| (lo..=hi).contains(q))
                    .fold((0.0, 0usize), |(s, n), (_, a)| (s + a, n + 1));
                (n > 0).then(|| s / n as f64)
            };
            mean(p, p)
                .or_else(|| mean(p - 1, p + 1))
                .map(|m| (m * 100.0).round() / 100.0)
        })
        .collect()
}

/// The shape mix FGD measures against in the published experiments: the
/// task list's shapes (CPU and GPU, not memory), 95% most popular.
pub fn published_mix(tasks: &[Task]) -> ShapeMix {
    let reqs: Vec<Request> = tasks.iter().map(Task::request).collect();
    ShapeMix::from_requests(&reqs, ShapeMixConfig::PUBLISHED)
}

/// The shape mix Leasehold measures against: the same, with memory.
pub fn leasehold_mix(tasks: &[Task]) -> ShapeMix {
    let reqs: Vec<Request> = tasks.iter().map(Task::request).collect();
    ShapeMix::from_requests(
        &reqs,
        ShapeMixConfig {
            with_memory: true,
            ..ShapeMixConfig::PUBLISHED
        },
    )
}

/// The shape mix a policy of this name measures against: Leasehold's, FGD's
/// for the others, and for the `fillmg` switches of the ablation the uncut
/// list (the policy cuts it itself).
pub fn mix_for(policy_name: &str, tasks: &[Task]) -> ShapeMix {
    if !policy_name.starts_with("leasehold") {
        return published_mix(tasks);
    }
    if policy_name
        .split('+')
        .any(|s| s == "fillmg" || s == "fillmgd")
    {
        let reqs: Vec<Request> = tasks.iter().map(Task::request).collect();
        return ShapeMix::from_requests(
            &reqs,
            ShapeMixConfig {
                popularity: 1.0,
                with_memory: true,
                ..ShapeMixConfig::PUBLISHED
            },
        );
    }
    leasehold_mix(tasks)
}

/// One seed of one policy: the curve and the counts.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedRun {
    pub policy: String,
    pub seed: u64,
    pub curve: Vec<Option<f64>>,
    /// Tasks placed and failed, gangs included.
    pub placed: usize,
    pub failed: usize,
    pub gangs_placed: usize,
    pub gangs_failed: usize,
}

/// Runs the whole protocol for one policy and one seed.
pub fn run_seed(
    nodes: &[NodeSpec],
    tasks: &[Task],
    policy_name: &str,
    seed: u64,
    order: Order,
) -> Result<SeedRun, String> {
    run_seed_with(nodes, tasks, policy_name, seed, order, true)
}

/// [`run_seed`] with the choice of tie-breaking: `ranked` is the simulator's
/// (a node order drawn per seed), otherwise a fresh draw per decision.
pub fn run_seed_with(
    nodes: &[NodeSpec],
    tasks: &[Task],
    policy_name: &str,
    seed: u64,
    order: Order,
    ranked: bool,
) -> Result<SeedRun, String> {
    let cluster = Cluster::new(nodes);
    let cap = cluster.gpu_milli_total();
    let mix = mix_for(policy_name, tasks);
    let policy = crate::policy_by_name(policy_name, &mix)
        .ok_or_else(|| format!("unknown policy {policy_name}"))?;
    let seq = arrival_sequence(tasks, cap, 1.3, seed, order);
    let mut engine = Engine::new(cluster, policy, seed);
    if ranked {
        engine = engine.with_ranked_ties();
    }
    let r = replay(&mut engine, tasks, &seq);
    Ok(SeedRun {
        policy: policy_name.to_string(),
        seed,
        curve: curve(&r, cap),
        placed: r.placed + r.gangs_placed,
        failed: r.failed + r.gangs_failed,
        gangs_placed: r.gangs_placed,
        gangs_failed: r.gangs_failed,
    })
}
