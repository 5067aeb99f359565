//! The simple baselines of the published simulator: random, best fit, dot
//! product (Tetris), GPU packing and GPU clustering. Scores are the integers
//! 0..=100 the simulator's score plugins return (Go's `int64(x)` truncation
//! included), because ties, drawn at random, are part of how they behave.

use lh_placement::cluster::{Cluster, Demand, GpuSet, Kind, MILLI};
use lh_placement::policy::{Policy, Scored};
use lh_placement::rng::Rng;

/// Normalisers of the simulator (`MaxSpecCpu`, `MaxSpecGpu`): the largest
/// node of the trace has 128 cores and 8 GPUs.
pub const MAX_SPEC_CPU: f64 = 128_000.0;
pub const MAX_SPEC_GPU: f64 = 8_000.0;
const MAX_SCORE: i64 = 100;

/// GPU choice "best" of the simulator's Open-Gpu-Share plugin: a slice goes
/// to the GPU with the least free milli that fits (first index among equals);
/// whole GPUs are the first free ones by index.
fn pick_best(cluster: &Cluster, node: usize, d: &Demand) -> GpuSet {
    cluster.pick_default(node, d)
}

/// Uniformly random node; a slice goes to a uniformly random GPU that fits
/// (the simulator's `random` GPU selection); whole GPUs the first free ones.
#[derive(Debug, Clone, Default)]
pub struct RandomPolicy;

impl Policy for RandomPolicy {
    fn name(&self) -> &'static str {
        "random"
    }
    fn version(&self) -> u32 {
        1
    }
    fn score(&mut self, cluster: &Cluster, node: usize, d: &Demand, rng: &mut Rng) -> Scored {
        let gpus = match d.kind {
            Kind::Frac { milli, vram_gb } => {
                let mut pick = 0;
                let mut seen = 0u64;
                for (j, g) in cluster.node(node).gpus.iter().enumerate() {
                    if g.fits_frac(milli, vram_gb, d.models) {
                        seen += 1;
                        if rng.below(seen) == 0 {
                            pick = 1 << j;
                        }
                    }
                }
                pick
            }
            _ => pick_best(cluster, node, d),
        };
        Scored::new(rng.next_f64(), gpus)
    }
}

/// Best fit: the node left with the least free CPU and GPU (each normalised
/// by the largest node, weights ½ and ½).
#[derive(Debug, Clone, Default)]
pub struct BestFit;

fn best_fit_score(cluster: &Cluster, node: usize, d: &Demand) -> i64 {
    let n = cluster.node(node);
    let mut s = 0.0f64;
    s += (n.cpu_free as f64 - d.cpu_milli as f64) / MAX_SPEC_CPU * 0.5;
    s += (n.gpu_milli_free() as f64 - d.gpu_milli() as f64) / MAX_SPEC_GPU * 0.5;
    ((1.0 - s) * MAX_SCORE as f64) as i64
}

impl Policy for BestFit {
    fn name(&self) -> &'static str {
        "bestfit"
    }
    fn version(&self) -> u32 {
        1
    }
    fn score(&mut self, cluster: &Cluster, node: usize, d: &Demand, _rng: &mut Rng) -> Scored {
        Scored::new(
            best_fit_score(cluster, node, d) as f64,
            pick_best(cluster, node, d),
        )
    }
}

/// Dot product of the free vector and the request (CPU, total GPU), both
/// normalised by the largest node; the smaller the product the higher the
/// score (the simulator's `DotProductScore` with `merge` and `max`).
#[derive(Debug, Clone, Default)]
pub struct DotProduct;

impl Policy for DotProduct {
    fn name(&self) -> &'static str {
        "dotprod"
    }
    fn version(&self) -> u32 {
        1
    }
    fn score(&mut self, cluster: &Cluster, node: usize, d: &Demand, _rng: &mut Rng) -> Scored {
        let n = cluster.node(node);
        let node_vec = [
            n.cpu_free as f64 / MAX_SPEC_CPU,
            n.gpu_milli_free() as f64 / MAX_SPEC_GPU,
        ];
        let pod_vec = [
            d.cpu_milli as f64 / MAX_SPEC_CPU,
            d.gpu_milli() as f64 / MAX_SPEC_GPU,
        ];
        let mut dot = 0.0;
        dot += node_vec[0] * pod_vec[0];
        dot += node_vec[1] * pod_vec[1];
        let s = 1.0 - dot / 2.0;
        Scored::new(
            (MAX_SCORE as f64 * s) as i64 as f64,
            pick_best(cluster, node, d),
        )
    }
}

/// GPU packing, from high to low: use shared GPUs (100 minus a tenth of the
/// free percent on them, at least 50); use free GPUs of a used node (50 minus
/// the number used, at least 33); use a node with every GPU free (33 minus
/// the node's GPUs, at least that number). CPU-only requests score 0.
#[derive(Debug, Clone, Default)]
pub struct GpuPacking;

fn gpu_packing_score(cluster: &Cluster, node: usize, d: &Demand) -> i64 {
    let (milli, count) = d.per_gpu();
    if milli == 0 {
        return 0;
    }
    let n = cluster.node(node);
    let fully_free = n.gpus.iter().filter(|g| g.milli_free == MILLI).count() as i64;
    if fully_free == n.gpus.len() as i64 {
        return (MAX_SCORE / 3 - fully_free).max(fully_free);
    }
    // GPUs by free milli ascending, index order among equals.
    let mut order: [(u16, u8); 32] = [(0, 0); 32];
    let k = n.gpus.len();
    for (j, g) in n.gpus.iter().enumerate() {
        order[j] = (g.milli_free, j as u8);
    }
    order[..k].sort_unstable();
    let mut need = count;
    let mut free_used = 0i64;
    let mut free_pct_on_used = 0i64;
    for &(left, _) in &order[..k] {
        if need == 0 {
            break;
        }
        if milli <= left {
            need -= 1;
            if left == MILLI {
                free_used += 1;
            }
            free_pct_on_used += i64::from(left) * 100 / i64::from(MILLI);
        }
    }
    if free_used > 0 {
        return (MAX_SCORE / 2 - free_used).max(MAX_SCORE / 3);
    }
    (MAX_SCORE - free_pct_on_used / 10).max(MAX_SCORE / 2)
}

impl Policy for GpuPacking {
    fn name(&self) -> &'static str {
        "gpupacking"
    }
    fn version(&self) -> u32 {
        1
    }
    fn score(&mut self, cluster: &Cluster, node: usize, d: &Demand, _rng: &mut Rng) -> Scored {
        Scored::new(
            gpu_packing_score(cluster, node, d) as f64,
            pick_best(cluster, node, d),
        )
    }
}

/// GPU clustering: keep leases of one kind (slices, 1-GPU, 2-GPU, ...)
/// together. Nodes holding only this kind score (75, 100], nodes holding it
/// among others (50, 75], empty nodes (25, 50], nodes of other kinds only
/// [0, 25]; within a band the fuller node scores higher.
#[derive(Debug, Clone, Default)]
pub struct GpuClustering;

fn gpu_clustering_score(cluster: &Cluster, node: usize, d: &Demand) -> i64 {
    let Some(tag) = d.tag() else {
        return 0;
    };
    let n = cluster.node(node);
    let left = n.gpu_milli_free() as i64;
    let spec = MAX_SPEC_GPU as i64;
    let fill = MAX_SCORE / 4 * (spec - left) / spec;
    let kinds = n.tags.iter().filter(|&&c| c > 0).count();
    if n.tags[tag] > 0 {
        if kinds == 1 {
            fill + MAX_SCORE * 3 / 4
        } else {
            fill + MAX_SCORE * 2 / 4
        }
    } else if kinds == 0 {
        fill + MAX_SCORE / 4
    } else {
        fill
    }
}

impl Policy for GpuClustering {
    fn name(&self) -> &'static str {
        "gpuclustering"
    }
    fn version(&self) -> u32 {
        1
    }
    fn score(&mut self, cluster: &Cluster, node: usize, d: &Demand, _rng: &mut Rng) -> Scored {
        Scored::new(
            gpu_clustering_score(cluster, node, d) as f64,
            pick_best(cluster, node, d),
        )
    }
}
