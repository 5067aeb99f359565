//! Leases of more whole GPUs than any one node holds: placed all or nothing
//! across nodes, as a gang of members, each a node and the GPUs it takes
//! there.
//!
//! The fewest nodes come first: a lease that some node could hold alone is
//! never split (it waits for that node), and a gang takes as few nodes as
//! the free GPUs allow. Among placements on equally few nodes, nodes of one
//! fabric (one zone) come first, then one zone, then one region; a gang
//! never spans regions. Within that, the fullest nodes are taken whole and
//! the remainder goes where the policy scores it best, so the gang leaves
//! as few broken nodes as it can.

use std::collections::BTreeMap;

use super::{Decision, Engine, Pending, Provenance, Ties};
use crate::cluster::{AllocId, Cluster, Demand, Kind, Reject, NO_FABRIC};
use crate::model::{GpuDemand, Request, SharingMode};
use crate::policy::Scored;
use crate::rng::Rng;

/// Why a gang waits: what its best region holds for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangShortfall {
    /// GPUs the gang asks for.
    pub gpus: u32,
    /// The region where most of them are free now ("" where no node can
    /// take any of them).
    pub region: String,
    /// GPUs free there now that the gang could take.
    pub free: u32,
    /// GPUs there that the gang could take with every lease on them ended:
    /// waiting helps only where this reaches `gpus`.
    pub capacity: u32,
}

/// A group of nodes a gang may span, from the narrowest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Fabric,
    Zone,
    Region,
}

/// What one node can give a gang.
#[derive(Debug, Clone, Copy)]
struct Offer {
    node: usize,
    region: u16,
    zone: u16,
    fabric: u16,
    /// Whole GPUs it can take now, CPU and memory included.
    free: u32,
    /// Whole GPUs it could take with its leases ended.
    capacity: u32,
}

/// One GPU's part of `total`, a gang's demand of `gpus` GPUs.
fn per_gpu_demand(total: &Demand, gpus: u32) -> Demand {
    Demand {
        cpu_milli: total.cpu_milli.div_ceil(u64::from(gpus.max(1))),
        memory_mib: total.memory_mib.div_ceil(u64::from(gpus.max(1))),
        kind: Kind::Whole(1),
        ..*total
    }
}

/// The per-GPU part of a gang's demand, and what `gpus` of its GPUs need.
fn member_demand(per_gpu: &Demand, total: &Demand, gpus: u32, of: u32) -> Demand {
    let share = |x: u64| (x * u64::from(gpus)).div_ceil(u64::from(of));
    Demand {
        cpu_milli: share(total.cpu_milli),
        memory_mib: share(total.memory_mib),
        kind: Kind::Whole(gpus as u8),
        ..*per_gpu
    }
}

fn offer(cluster: &Cluster, i: usize, per_gpu: &Demand) -> Result<Offer, Reject> {
    let n = cluster.node(i);
    if per_gpu.needs_isolation && !n.isolates_workloads {
        return Err(Reject::Isolation);
    }
    if per_gpu.zones & (1u64 << n.zone) == 0 {
        return Err(Reject::Zone);
    }
    if per_gpu.models & n.model_mask == 0 {
        return Err(Reject::Model);
    }
    let per = |left: u64, need: u64| left.checked_div(need).unwrap_or(u64::MAX);
    let bound = |gpus: usize, cpu: u64, memory: u64| {
        (gpus as u64)
            .min(per(cpu, per_gpu.cpu_milli))
            .min(per(memory, per_gpu.memory_mib)) as u32
    };
    let usable = n
        .gpus
        .iter()
        .filter(|g| g.allowed(per_gpu.models) && g.mode != SharingMode::Mig)
        .count();
    if usable == 0 {
        return Err(Reject::GpuMode);
    }
    let capacity = bound(usable, n.cpu_total, n.memory_total);
    if capacity == 0 {
        return Err(if per(n.cpu_total, per_gpu.cpu_milli) == 0 {
            Reject::Cpu
        } else {
            Reject::Memory
        });
    }
    let idle = n
        .gpus
        .iter()
        .filter(|g| g.fits_whole(per_gpu.models))
        .count();
    Ok(Offer {
        node: i,
        region: cluster.region_of(n.zone),
        zone: n.zone,
        fabric: n.fabric,
        free: bound(idle, n.cpu_free, n.memory_free),
        capacity,
    })
}

/// How few of `offers` (sorted by free, most first) hold `gpus`, and how
/// many GPUs over `gpus` those few have free.
fn fewest(offers: &[Offer], gpus: u32) -> Option<(usize, u32)> {
    let mut sum = 0u32;
    for (k, o) in offers.iter().enumerate() {
        if o.free == 0 {
            break;
        }
        sum += o.free;
        if sum >= gpus {
            return Some((k + 1, sum - gpus));
        }
    }
    None
}

impl Engine {
    /// Places `request` as [`Engine::schedule`] does where one node could
    /// hold all its GPUs, and otherwise, for whole GPUs, as a gang across
    /// the fewest nodes that can take it now (see the module's rules),
    /// taking every member's GPUs or none. Every member has its own
    /// allocation, released like any other. A gang that cannot be placed
    /// now is a [`Pending`] whose `gang` says what its best region lacks.
    pub fn schedule_gang(
        &mut self,
        request: &Request,
    ) -> Result<Vec<(Decision, AllocId)>, Pending> {
        let total = self.cluster.demand(request);
        let gpus = match request.gpu {
            GpuDemand::Whole { count } => u32::from(count),
            _ => 0,
        };
        let per_gpu = per_gpu_demand(&total, gpus);
        let mut offers = Vec::new();
        let mut rejects = [0u32; Reject::ALL.len()];
        if gpus > 1 {
            for i in 0..self.cluster.len() {
                match offer(&self.cluster, i, &per_gpu) {
                    Ok(o) => offers.push(o),
                    Err(r) => rejects[r as usize] += 1,
                }
            }
        }
        let largest = offers.iter().map(|o| o.capacity).max().unwrap_or(0);
        if gpus <= largest.max(1) {
            return self.schedule_demand(&total).map(|one| vec![one]);
        }
        let seq = self.sequence;
        self.sequence += 1;
        let Some((counts, group)) = self.choose_gang(&offers, gpus) else {
            return Err(self.gang_pending(&total, &offers, gpus, rejects));
        };
        let mut rng = Rng::stream(self.seed, seq);
        let mut taken: Vec<(Decision, AllocId)> = Vec::new();
        let mut left = gpus;
        for (k, &count) in counts.iter().enumerate() {
            let d = member_demand(&per_gpu, &total, count, gpus);
            let last = k + 1 == counts.len();
            // The fullest nodes first: a member before the last takes all a
            // node has free, and nodes with more free than it took theirs.
            let candidates: Vec<usize> = group
                .iter()
                .filter(|o| o.free >= count && !taken.iter().any(|t| t.0.node == o.node))
                .map(|o| o.node)
                .collect();
            let allocated = self
                .best_of(&candidates, &d, &mut rng)
                .and_then(|chosen| self.take_member(chosen, &d, seq));
            match allocated {
                Some(member) => {
                    left -= count;
                    taken.push(member);
                }
                None => {
                    // Free GPUs the count saw that the policy's choice of
                    // GPUs could not take: nothing of the gang stays.
                    for (_, id) in taken {
                        let _ = self.cluster.release(id);
                    }
                    return Err(self.gang_pending(&total, &offers, gpus, rejects));
                }
            }
            debug_assert!(!last || left == 0);
        }
        Ok(taken)
    }

    /// Places gang `request` again on the nodes it ran on, `members` (engine
    /// node, GPUs there) in node-rank order: each member takes that many
    /// GPUs of its own node, chosen there by the policy, or nothing of the
    /// gang is taken. This is a gang's restart in place: its ranks keep
    /// their nodes, and with them what the nodes hold for it (its data
    /// cache, its fabric). `None` where a member's node cannot take its
    /// part now (lost, drained, short of healthy free GPUs, or outside the
    /// request's zones or models), or the counts do not add up to the ask.
    pub fn schedule_gang_on(
        &mut self,
        request: &Request,
        members: &[(usize, u32)],
    ) -> Option<Vec<(Decision, AllocId)>> {
        let total = self.cluster.demand(request);
        let gpus = match request.gpu {
            GpuDemand::Whole { count } => u32::from(count),
            _ => return None,
        };
        let distinct = members
            .iter()
            .enumerate()
            .all(|(k, (node, _))| members[..k].iter().all(|(n, _)| n != node));
        let counts: u32 = members.iter().map(|(_, count)| count).sum();
        if members.len() < 2 || counts != gpus || !distinct {
            return None;
        }
        let per_gpu = per_gpu_demand(&total, gpus);
        let seq = self.sequence;
        self.sequence += 1;
        let mut rng = Rng::stream(self.seed, seq);
        let mut taken: Vec<(Decision, AllocId)> = Vec::new();
        for &(node, count) in members {
            let fits = node < self.cluster.len()
                && offer(&self.cluster, node, &per_gpu).is_ok_and(|o| o.free >= count);
            let d = member_demand(&per_gpu, &total, count, gpus);
            let chosen = fits.then(|| self.best_of(&[node], &d, &mut rng)).flatten();
            match chosen.and_then(|chosen| self.take_member(chosen, &d, seq)) {
                Some(member) => taken.push(member),
                None => {
                    for (_, id) in taken {
                        let _ = self.cluster.release(id);
                    }
                    return None;
                }
            }
        }
        Some(taken)
    }

    /// Allocates member demand `d` where the policy `chosen` (node, the
    /// GPUs scored there), as decision `seq` of the engine.
    fn take_member(
        &mut self,
        (node, s, provenance): (usize, Scored, Provenance),
        d: &Demand,
        seq: u64,
    ) -> Option<(Decision, AllocId)> {
        let id = self.cluster.allocate(node, d, s.gpus).ok()?;
        let provenance = Provenance {
            sequence: seq,
            ..provenance
        };
        Some((
            Decision {
                node,
                gpus: s.gpus,
                provenance,
            },
            id,
        ))
    }

    /// The members' GPU counts and the nodes they may go to: the scope
    /// that needs the fewest nodes (then the narrowest, then the one with
    /// the fewest GPUs to spare), its fullest nodes taken whole, and the
    /// remainder on any of its nodes with room for it.
    fn choose_gang(&self, offers: &[Offer], gpus: u32) -> Option<(Vec<u32>, Vec<Offer>)> {
        let mut groups: BTreeMap<(Scope, u16, u16, u16), Vec<Offer>> = BTreeMap::new();
        for o in offers.iter().filter(|o| o.free > 0) {
            if o.fabric != NO_FABRIC {
                groups
                    .entry((Scope::Fabric, o.region, o.zone, o.fabric))
                    .or_default()
                    .push(*o);
            }
            groups
                .entry((Scope::Zone, o.region, o.zone, 0))
                .or_default()
                .push(*o);
            groups
                .entry((Scope::Region, o.region, 0, 0))
                .or_default()
                .push(*o);
        }
        let mut best: Option<((usize, Scope, u32), Vec<Offer>)> = None;
        for ((scope, ..), mut group) in groups {
            group.sort_by(|a, b| b.free.cmp(&a.free).then(a.node.cmp(&b.node)));
            let Some((nodes, spare)) = fewest(&group, gpus) else {
                continue;
            };
            let key = (nodes, scope, spare);
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((key, group));
            }
        }
        let ((nodes, ..), group) = best?;
        let mut counts: Vec<u32> = group[..nodes - 1].iter().map(|o| o.free).collect();
        counts.push(gpus - counts.iter().sum::<u32>());
        Some((counts, group))
    }

    /// The best of `candidates` for `d` by the policy, ties broken as the
    /// engine breaks them.
    fn best_of(
        &mut self,
        candidates: &[usize],
        d: &Demand,
        rng: &mut Rng,
    ) -> Option<(usize, Scored, Provenance)> {
        self.policy.begin(&self.cluster, d);
        let mut best: Option<(usize, Scored)> = None;
        let mut runner_up: Option<f64> = None;
        let (mut tied, mut scored) = (0u32, 0u32);
        for &i in candidates {
            if self.cluster.check(i, d).is_err() {
                continue;
            }
            scored += 1;
            let s = self.policy.score(&self.cluster, i, d, rng);
            match &best {
                None => {
                    best = Some((i, s));
                    tied = 1;
                }
                Some((b_node, b)) => {
                    if s.key() > b.key() {
                        runner_up = Some(b.score);
                        best = Some((i, s));
                        tied = 1;
                    } else if s.key() == b.key() {
                        runner_up = Some(b.score);
                        tied += 1;
                        let take = match &self.ties {
                            Ties::Draw => rng.below(u64::from(tied)) == 0,
                            Ties::Ranked(rank) => rank[i] < rank[*b_node],
                        };
                        if take {
                            best = Some((i, s));
                        }
                    } else if runner_up.is_none_or(|r| s.score > r) {
                        runner_up = Some(s.score);
                    }
                }
            }
        }
        let (node, s) = best?;
        Some((
            node,
            s,
            Provenance {
                policy: self.policy.name(),
                policy_version: self.policy.version(),
                candidates: scored,
                tied,
                winner_score: s.score,
                runner_up_score: runner_up,
                seed: self.seed,
                sequence: 0,
            },
        ))
    }

    fn gang_pending(
        &self,
        total: &Demand,
        offers: &[Offer],
        gpus: u32,
        mut rejects: [u32; Reject::ALL.len()],
    ) -> Pending {
        let mut regions: BTreeMap<u16, (u32, u32)> = BTreeMap::new();
        for o in offers {
            let r = regions.entry(o.region).or_default();
            r.0 += o.free;
            r.1 += o.capacity;
            if o.free == 0 {
                rejects[Reject::GpuBusy as usize] += 1;
            }
        }
        // The region closest to holding the gang: one it fits in once
        // leases end, then the most free, then the most capacity.
        let best = regions.iter().max_by_key(|(region, (free, capacity))| {
            (
                *capacity >= gpus,
                *free,
                *capacity,
                std::cmp::Reverse(**region),
            )
        });
        let shortfall = match best {
            Some((&region, &(free, capacity))) => GangShortfall {
                gpus,
                region: self.cluster.region_name(region).to_string(),
                free,
                capacity,
            },
            None => GangShortfall {
                gpus,
                region: String::new(),
                free: 0,
                capacity: 0,
            },
        };
        let mut p = self.pending(total, &rejects);
        p.gang = Some(shortfall);
        p
    }
}
