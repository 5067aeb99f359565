//! The engine: filter every node, let the policy score the feasible ones,
//! take the best (ties by a seeded draw), and say why.

use std::collections::BTreeMap;
use std::fmt;

mod gang;
mod index;

pub use gang::GangShortfall;
use index::{Index, MAX_INDEXED_DEMANDS};

use crate::cluster::{gpu_indices, AllocError, AllocId, Cluster, Demand, GpuSet, Kind, Reject};
use crate::model::Request;
use crate::policy::{Policy, Scored};
use crate::rng::Rng;

/// Where a request goes, and why there.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Node index in the cluster.
    pub node: usize,
    /// Chosen GPUs of that node.
    pub gpus: GpuSet,
    pub provenance: Provenance,
}

impl Decision {
    pub fn gpu_indices(&self) -> Vec<u8> {
        gpu_indices(self.gpus).collect()
    }
}

/// "Why here": enough to explain a decision from the log later.
#[derive(Debug, Clone, PartialEq)]
pub struct Provenance {
    pub policy: &'static str,
    pub policy_version: u32,
    /// Nodes that could take the request and were scored.
    pub candidates: u32,
    /// Candidates sharing the winner's score (one was drawn with the seed).
    pub tied: u32,
    pub winner_score: f64,
    /// Best score among the other candidates (equal to the winner's on a tie).
    pub runner_up_score: Option<f64>,
    pub seed: u64,
    /// Index of this decision in the engine's sequence (with the seed, it
    /// fixes every random draw of the decision).
    pub sequence: u64,
}

/// "Why pending": no node can take the request now; how many failed on which
/// check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub policy: &'static str,
    pub policy_version: u32,
    pub nodes: u32,
    pub rejected: BTreeMap<String, u32>,
    /// For a lease spanning nodes: what its best region holds for it.
    pub gang: Option<GangShortfall>,
}

impl Pending {
    /// Nodes that refused for `reason`.
    pub fn count(&self, reason: Reject) -> u32 {
        self.rejected.get(&reason.to_string()).copied().unwrap_or(0)
    }

    /// Some node could take the request once leases on it end: waiting (or
    /// preempting) can help. `false`: no node ever could, as the nodes are.
    pub fn busy(&self) -> bool {
        match &self.gang {
            Some(g) => g.capacity >= g.gpus,
            None => self.count(Reject::GpuBusy) > 0 || self.count(Reject::ShareSize) > 0,
        }
    }
}

impl fmt::Display for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nodes == 0 {
            return f.write_str("no nodes");
        }
        if let Some(g) = &self.gang {
            return match g.region.as_str() {
                "" => write!(
                    f,
                    "{} GPUs span nodes, and no node of {} can take any of them",
                    g.gpus, self.nodes
                ),
                region => write!(
                    f,
                    "{} GPUs span nodes of one region: {region} has {} of them free now, {} with every lease there ended",
                    g.gpus, g.free, g.capacity
                ),
            };
        }
        write!(f, "no node of {} fits:", self.nodes)?;
        for (k, v) in &self.rejected {
            write!(f, " {k} {v};")?;
        }
        Ok(())
    }
}

/// What places MIG instances, whatever the policy: the trace-driven policies
/// score shares and whole GPUs; a MIG instance goes to the GPU it fits most
/// tightly (see [`crate::cluster::Node::pick_mig`]).
pub const MIG_POLICY: &str = "mig-best-fit";
pub const MIG_POLICY_VERSION: u32 = 1;

fn mig_score(cluster: &Cluster, i: usize, profile: u16, models: u64) -> Scored {
    match cluster.node(i).pick_mig(profile, models) {
        Some((j, _, left)) => Scored::new(-f64::from(left), 1 << j),
        None => Scored::new(f64::NEG_INFINITY, 0),
    }
}

/// Placement engine over a cluster with one policy. Pure and deterministic:
/// the same cluster, policy, seed and sequence give the same decision.
pub struct Engine {
    cluster: Cluster,
    policy: Box<dyn Policy>,
    seed: u64,
    sequence: u64,
    ties: Ties,
    /// Kept verdicts for the demands decided most recently, newest first
    /// (see [`index`]); empty while [`Engine::without_index`].
    indexes: Vec<Index>,
    indexed: bool,
}

/// How the engine chooses among candidates with equal scores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ties {
    /// A fresh uniform draw for every decision (reservoir sampling over the
    /// tied candidates), as stock Kubernetes does.
    Draw,
    /// A fixed order of nodes drawn once from the seed: the tied node that
    /// comes first wins. This is what the published simulator does (it
    /// renames the nodes with a random prefix per seed and keeps the first
    /// best node in name order).
    Ranked(Vec<u32>),
}

impl Engine {
    pub fn new(cluster: Cluster, policy: Box<dyn Policy>, seed: u64) -> Self {
        Engine {
            cluster,
            policy,
            seed,
            sequence: 0,
            ties: Ties::Draw,
            indexes: Vec::new(),
            indexed: true,
        }
    }

    /// Scores every node at every decision, as the engine did before it
    /// kept verdicts between decisions: the same decisions, slower (for
    /// tests that hold the two to each other).
    pub fn without_index(mut self) -> Self {
        self.indexed = false;
        self.indexes.clear();
        self
    }

    /// Breaks ties by a node order drawn once from the seed (see
    /// [`Ties::Ranked`]).
    pub fn with_ranked_ties(mut self) -> Self {
        let mut order: Vec<u32> = (0..self.cluster.len() as u32).collect();
        Rng::new(self.seed ^ 0x005E_ED0F_0DE5).shuffle(&mut order);
        let mut rank = vec![0u32; order.len()];
        for (r, &n) in order.iter().enumerate() {
            rank[n as usize] = r as u32;
        }
        self.ties = Ties::Ranked(rank);
        self
    }

    pub fn ties(&self) -> &Ties {
        &self.ties
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }

    /// Tells the policy whether leases of whole GPUs wait for room now.
    pub fn set_whole_waiting(&mut self, waiting: bool) {
        self.policy.set_whole_waiting(waiting);
    }

    /// Decides with `policy` from now on; the verdicts kept under the old
    /// one are dropped.
    pub fn set_policy(&mut self, policy: Box<dyn Policy>) {
        self.policy = policy;
        self.indexes.clear();
    }

    /// The cluster, to change directly (nodes cleared and loaded again). Every
    /// change moves the node's generation, so the verdicts kept stay right.
    pub fn cluster_mut(&mut self) -> &mut Cluster {
        &mut self.cluster
    }

    /// Numbers the next decision `sequence` (which, with the seed, fixes its
    /// random draws): an engine kept from an earlier run of decisions decides
    /// the next run as a fresh one would, from 0.
    pub fn set_sequence(&mut self, sequence: u64) {
        self.sequence = sequence;
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Decides where `request` goes (without taking anything).
    pub fn decide(&mut self, request: &Request) -> Result<Decision, Pending> {
        let d = self.cluster.demand(request);
        self.decide_demand(&d)
    }

    /// Decides for an already compiled demand.
    pub fn decide_demand(&mut self, d: &Demand) -> Result<Decision, Pending> {
        let seq = self.sequence;
        self.sequence += 1;
        let mig = match d.kind {
            Kind::Mig(p) => Some(p),
            _ => None,
        };
        if mig.is_none() {
            self.policy.begin(&self.cluster, d);
        }
        // A MIG instance's score depends on the node alone.
        let epoch = match mig {
            Some(_) => Some(0),
            None => self.policy.scores_by_node(),
        };
        if let (Some(epoch), true, Ties::Draw) = (epoch, self.indexed, &self.ties) {
            if let Some(decided) = self.decide_indexed(d, seq, epoch) {
                return decided;
            }
        }
        self.decide_scanning(d, seq)
    }

    fn names(&self, d: &Demand) -> (&'static str, u32) {
        match d.kind {
            Kind::Mig(_) => (MIG_POLICY, MIG_POLICY_VERSION),
            _ => (self.policy.name(), self.policy.version()),
        }
    }

    fn pending(&self, d: &Demand, rejects: &[u32; Reject::ALL.len()]) -> Pending {
        let (policy, policy_version) = self.names(d);
        Pending {
            policy,
            policy_version,
            nodes: self.cluster.len() as u32,
            rejected: Reject::ALL
                .iter()
                .zip(rejects)
                .filter(|(_, c)| **c > 0)
                .map(|(r, c)| (r.to_string(), *c))
                .collect(),
            gang: None,
        }
    }

    /// [`Engine::decide_demand`] from the verdicts kept for `d`, refreshed
    /// where a node changed; `None` where the kept verdicts cannot order the
    /// candidates as the scan does (the caller scans).
    fn decide_indexed(
        &mut self,
        d: &Demand,
        seq: u64,
        epoch: u64,
    ) -> Option<Result<Decision, Pending>> {
        let mut index = match self.indexes.iter().position(|ix| ix.demand == *d) {
            Some(at) => self.indexes.remove(at),
            None => Index::new(*d),
        };
        let cluster = &self.cluster;
        let policy = self.policy.as_mut();
        // No policy that scores by node draws: this one is never read.
        let mut unused = Rng::new(self.seed);
        index.refresh(
            cluster.len(),
            epoch,
            (cluster.change_mark(), |mark| cluster.changed_since(mark)),
            |i| cluster.node(i).generation,
            |i| {
                cluster.check(i, d)?;
                Ok(match d.kind {
                    Kind::Mig(p) => mig_score(cluster, i, p, d.models),
                    _ => policy.score(cluster, i, d, &mut unused),
                })
            },
        );
        let decided = if !index.ordered() {
            None
        } else {
            let (policy, policy_version) = self.names(d);
            Some(match index.choose(Rng::stream(self.seed, seq)) {
                Some(c) => Ok(Decision {
                    node: c.node,
                    gpus: c.scored.gpus,
                    provenance: Provenance {
                        policy,
                        policy_version,
                        candidates: c.candidates,
                        tied: c.tied,
                        winner_score: c.scored.score,
                        runner_up_score: c.runner_up,
                        seed: self.seed,
                        sequence: seq,
                    },
                }),
                None => Err(self.pending(d, index.rejects())),
            })
        };
        self.indexes.insert(0, index);
        self.indexes.truncate(MAX_INDEXED_DEMANDS);
        decided
    }

    /// Every node checked and scored, in order.
    fn decide_scanning(&mut self, d: &Demand, seq: u64) -> Result<Decision, Pending> {
        let mut rng = Rng::stream(self.seed, seq);
        let (policy_name, policy_version) = self.names(d);
        let cluster = &self.cluster;
        let policy = self.policy.as_mut();
        let mig = match d.kind {
            Kind::Mig(p) => Some(p),
            _ => None,
        };
        let mut best: Option<(usize, Scored)> = None;
        let mut runner_up: Option<f64> = None;
        let mut tied = 0u32;
        let mut candidates = 0u32;
        let mut rejects = [0u32; Reject::ALL.len()];
        for i in 0..cluster.len() {
            if let Err(r) = cluster.check(i, d) {
                rejects[r as usize] += 1;
                continue;
            }
            candidates += 1;
            let s = match mig {
                Some(p) => mig_score(cluster, i, p, d.models),
                None => policy.score(cluster, i, d, &mut rng),
            };
            match &best {
                None => {
                    best = Some((i, s));
                    tied = 1;
                }
                Some((_, b)) => {
                    let (k, bk) = (s.key(), b.key());
                    if k > bk {
                        runner_up = Some(b.score);
                        best = Some((i, s));
                        tied = 1;
                    } else if k == bk {
                        runner_up = Some(b.score);
                        tied += 1;
                        let take = match &self.ties {
                            Ties::Draw => rng.below(u64::from(tied)) == 0,
                            Ties::Ranked(rank) => rank[i] < rank[best.as_ref().map_or(0, |b| b.0)],
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
        match best {
            Some((node, s)) => Ok(Decision {
                node,
                gpus: s.gpus,
                provenance: Provenance {
                    policy: policy_name,
                    policy_version,
                    candidates,
                    tied,
                    winner_score: s.score,
                    runner_up_score: runner_up,
                    seed: self.seed,
                    sequence: seq,
                },
            }),
            None => Err(self.pending(d, &rejects)),
        }
    }

    /// Takes what `decision` chose for `request`.
    pub fn place(&mut self, request: &Request, decision: &Decision) -> Result<AllocId, AllocError> {
        let d = self.cluster.demand(request);
        self.place_demand(&d, decision)
    }

    pub fn place_demand(&mut self, d: &Demand, decision: &Decision) -> Result<AllocId, AllocError> {
        self.cluster.allocate(decision.node, d, decision.gpus)
    }

    /// Decides and takes in one step.
    pub fn schedule(&mut self, request: &Request) -> Result<(Decision, AllocId), Pending> {
        let d = self.cluster.demand(request);
        self.schedule_demand(&d)
    }

    pub fn schedule_demand(&mut self, d: &Demand) -> Result<(Decision, AllocId), Pending> {
        let decision = self.decide_demand(d)?;
        let id = self
            .cluster
            .allocate(decision.node, d, decision.gpus)
            .expect("a policy chose GPUs that do not fit its own candidate");
        Ok((decision, id))
    }

    pub fn release(&mut self, id: AllocId) -> Result<(), AllocError> {
        self.cluster.release(id).map(|_| ())
    }
}
