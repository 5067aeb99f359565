//! A replay with departures and waiting, beside the published protocol
//! (where nothing departs and a task that does not fit fails): what a
//! gang waits for, against a task of one node.
//!
//! 1. The tasks arrive in the seed's order ([`trace::arrival_sequence`],
//!    drawn as the protocol draws, but until they ask for
//!    [`FILLS`] x the cluster's GPU milli, so that the cluster fills and
//!    empties many times over), one every `interval`, where the interval
//!    makes the offered load `load` x the cluster's GPUs: the sum of each
//!    task's GPU milli times its hold, over the tasks' count times the
//!    cluster's GPU milli times `load`.
//! 2. Each task holds what it was given for its trace duration
//!    (`deletion_time - creation_time`), at least a second and at most
//!    [`HOLD_MAX_S`]: the trace's durations reach 145 days, and a replay
//!    whose few longest tasks outlast all its arrivals never settles.
//! 3. A task that cannot be placed waits. Whenever a task leaves, every
//!    waiting task is tried again in arrival order (one that fits goes,
//!    whatever waits before it); a new task is tried when it arrives.
//!    Nothing is reserved for a waiting gang.
//! 4. Allocation is the time-weighted mean of allocated GPU milli over the
//!    cluster's, over the second half of the arrivals (the first half fills
//!    the cluster); waits are those of every task.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use lh_placement::model::{GpuDemand, NodeSpec, Request};
use lh_placement::{AllocId, Cluster, Engine};

use crate::trace::{self, is_gang, Order, Task};

/// The tasks drawn ask for this many times the cluster's GPU milli.
pub const FILLS: f64 = 10.0;
/// The longest a task holds its GPUs in the replay, in seconds (6 hours).
pub const HOLD_MAX_S: u64 = 6 * 3600;

/// How long one class of tasks waited to start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Waits {
    pub tasks: usize,
    /// Started before the replay ended (every task that ever can does).
    pub started: usize,
    /// Mean and 95th percentile over the started tasks, in seconds.
    pub mean_s: f64,
    pub p95_s: f64,
}

impl Waits {
    fn of(tasks: usize, mut waits: Vec<u64>) -> Waits {
        waits.sort_unstable();
        let started = waits.len();
        let mean_s = match started {
            0 => 0.0,
            n => waits.iter().sum::<u64>() as f64 / n as f64 / 1e3,
        };
        let p95_s = match started {
            0 => 0.0,
            n => waits[(n * 95).div_ceil(100).saturating_sub(1)] as f64 / 1e3,
        };
        Waits {
            tasks,
            started,
            mean_s,
            p95_s,
        }
    }
}

/// One timed replay of one policy and seed.
#[derive(Debug, Clone, PartialEq)]
pub struct TimedRun {
    pub policy: String,
    pub seed: u64,
    /// Seconds between arrivals.
    pub interval_s: f64,
    /// Time-weighted GPU allocation over the arrivals, percent.
    pub allocation_pct: f64,
    pub singles: Waits,
    pub gangs: Waits,
}

/// Runs a timed replay (see the module) of `tasks` on `nodes`.
pub fn run_timed(
    nodes: &[NodeSpec],
    tasks: &[Task],
    policy_name: &str,
    seed: u64,
    load: f64,
) -> Result<TimedRun, String> {
    if !(load > 0.0 && load.is_finite()) {
        return Err(format!("load must be above 0, not {load}"));
    }
    if tasks.iter().all(|t| t.duration_s == 0) {
        return Err("the task list has no creation and deletion times".into());
    }
    let cluster = Cluster::new(nodes);
    let cap = cluster.gpu_milli_total();
    let mix = trace::mix_for(policy_name, tasks);
    let policy = crate::policy_by_name(policy_name, &mix)
        .ok_or_else(|| format!("unknown policy {policy_name}"))?;
    let seq = trace::arrival_sequence(tasks, cap, FILLS, seed, Order::AppendThenShuffle);
    let held_ms = |t: &Task| t.duration_s.clamp(1, HOLD_MAX_S) * 1000;
    let offered: f64 = seq
        .iter()
        .map(|&t| tasks[t].gpu_milli_total() as f64 * held_ms(&tasks[t]) as f64)
        .sum();
    let interval_ms = (offered / (seq.len() as f64 * cap as f64 * load)).max(1.0);
    let gang: Vec<bool> = tasks.iter().map(|t| is_gang(&cluster, t)).collect();
    let requests: Vec<Request> = tasks.iter().map(Task::request).collect();
    let mut engine = Engine::new(cluster, policy, seed).with_ranked_ties();

    let arrival_ms = |k: usize| (k as f64 * interval_ms) as u64;
    let end_ms = arrival_ms(seq.len().saturating_sub(1));
    let from_ms = end_ms / 2;
    // (when it leaves, which arrival) of every running task.
    let mut leaving: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut held: Vec<Vec<AllocId>> = vec![Vec::new(); seq.len()];
    let mut waiting: Vec<usize> = Vec::new();
    // Requests that found no room since the last departure: placements
    // only take room, so they find none until something leaves.
    let mut refused: HashSet<&Request> = HashSet::new();
    // Whole GPUs are waited for while a lease of them found no room: what
    // the policy is told before each moment's placements.
    let mut whole_waiting = false;
    let (mut single_waits, mut gang_waits) = (Vec::new(), Vec::new());
    let (mut area, mut last_ms) = (0.0f64, 0u64);
    let mut next = 0usize;
    loop {
        let next_arrival = (next < seq.len()).then(|| arrival_ms(next));
        let next_departure = leaving.peek().map(|Reverse((at, _))| *at);
        let now = match (next_arrival, next_departure) {
            (None, None) => break,
            (Some(a), Some(d)) => a.min(d),
            (Some(a), None) => a,
            (None, Some(d)) => d,
        };
        if next_arrival.is_none() && waiting.is_empty() {
            break;
        }
        let used = engine.cluster().gpu_milli_used() as f64;
        let clip = |t: u64| t.clamp(from_ms, end_ms);
        area += used * (clip(now) - clip(last_ms)) as f64;
        last_ms = now;
        let mut departed = false;
        while let Some(&Reverse((at, k))) = leaving.peek() {
            if at > now {
                break;
            }
            leaving.pop();
            for id in held[k].drain(..) {
                engine.release(id).map_err(|e| format!("{e:?}"))?;
            }
            departed = true;
        }
        if departed {
            refused.clear();
        }
        engine.set_whole_waiting(whole_waiting);
        if next_arrival == Some(now) {
            waiting.push(next);
            next += 1;
        }
        let mut still = Vec::with_capacity(waiting.len());
        whole_waiting = false;
        for k in std::mem::take(&mut waiting) {
            let t = seq[k];
            let request = &requests[t];
            let whole = matches!(request.gpu, GpuDemand::Whole { .. });
            if refused.contains(request) {
                still.push(k);
                whole_waiting |= whole;
                continue;
            }
            let placed = if gang[t] {
                engine
                    .schedule_gang(request)
                    .map(|members| members.into_iter().map(|(_, id)| id).collect::<Vec<_>>())
            } else {
                engine.schedule(request).map(|(_, id)| vec![id])
            };
            match placed {
                Ok(ids) => {
                    held[k] = ids;
                    leaving.push(Reverse((now + held_ms(&tasks[t]), k)));
                    let wait = now - arrival_ms(k);
                    if gang[t] {
                        gang_waits.push(wait);
                    } else {
                        single_waits.push(wait);
                    }
                }
                Err(_) => {
                    refused.insert(request);
                    still.push(k);
                    whole_waiting |= whole;
                }
            }
        }
        waiting = still;
    }
    let gangs = seq.iter().filter(|&&t| gang[t]).count();
    Ok(TimedRun {
        policy: policy_name.to_string(),
        seed,
        interval_s: interval_ms / 1e3,
        allocation_pct: match end_ms - from_ms {
            0 => 0.0,
            span => area / span as f64 / cap as f64 * 100.0,
        },
        singles: Waits::of(seq.len() - gangs, single_waits),
        gangs: Waits::of(gangs, gang_waits),
    })
}
