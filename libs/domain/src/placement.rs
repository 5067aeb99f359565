//! Placement of whole-GPU leases: best fit on the requested model.
//!
//! Best fit picks the node whose free GPUs of the model exceed the request
//! by the least, so large free blocks stay whole for large requests. Ties go
//! to the node id that sorts first, so a decision is the same for the same
//! state on every scheduler replica.

use std::collections::BTreeMap;

pub const POLICY_BEST_FIT: &str = "best_fit";
pub const POLICY_VERSION: u32 = 1;

/// One GPU as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub vram_gb: u32,
    /// Lease holding it whole, if any.
    pub held_by: Option<uuid::Uuid>,
    /// Fractional or MIG leases sharing it.
    pub shares: Vec<Share>,
    /// In MIG mode: only MIG leases, each in its own GPU instance.
    pub mig: bool,
    /// As its node-agent judges it; only a healthy GPU takes new leases.
    pub health: lh_events::GpuHealth,
    /// When it last changed health (the node's clock).
    pub health_since: Option<chrono::DateTime<chrono::Utc>>,
}

/// One fractional or MIG lease's share of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub lease_id: uuid::Uuid,
    pub milli: u32,
    pub vram_gb: u32,
    /// The GPU instance of a MIG lease.
    pub mig: Option<lh_events::MigInstance>,
}

impl Gpu {
    /// Neither held whole nor shared.
    pub fn is_free(&self) -> bool {
        self.held_by.is_none() && self.shares.is_empty()
    }

    /// Milli-GPU in use (1000 when held whole).
    pub fn used_milli(&self) -> u32 {
        if self.held_by.is_some() {
            1000
        } else {
            self.shares.iter().map(|s| s.milli).sum()
        }
    }

    /// VRAM GB in use (all of it when held whole).
    pub fn used_vram_gb(&self) -> u32 {
        if self.held_by.is_some() {
            self.vram_gb
        } else {
            self.shares.iter().map(|s| s.vram_gb).sum()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: String,
    pub zone: String,
    pub gpus: Vec<Gpu>,
    /// Set while the node is lost: when it was last heard from (its own
    /// clock). A lost node takes no leases.
    pub lost: Option<chrono::DateTime<chrono::Utc>>,
    /// Set while an operator has cordoned it: no new leases; with
    /// `Some(Move)` its leases are moved away too.
    pub cordoned: Option<Option<lh_events::DrainMode>>,
}

impl Node {
    /// Takes new leases: heard from and not cordoned.
    pub fn is_schedulable(&self) -> bool {
        self.lost.is_none() && self.cordoned.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub gpus: u32,
    pub gpu_model: String,
}

/// Where a request goes and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub node_id: String,
    pub zone: String,
    /// Chosen GPUs, by index order.
    pub gpus: Vec<Gpu>,
    pub candidates: u32,
    pub winner_score: f64,
    pub runner_up_score: Option<f64>,
}

/// Why a request could not be placed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unplaceable {
    /// No node has this model at all.
    NoSuchModel,
    /// The request is larger than any node of the model could ever hold.
    TooLarge { largest_node_gpus: u32 },
    /// Enough GPUs exist but are busy now.
    Busy { free_max: u32 },
}

impl Unplaceable {
    pub fn reason(&self, request: &Request) -> String {
        match self {
            Unplaceable::NoSuchModel => {
                format!("no node offers {} yet", request.gpu_model)
            }
            Unplaceable::TooLarge { largest_node_gpus } => format!(
                "{} x {} requested but the largest node has {}",
                request.gpus, request.gpu_model, largest_node_gpus
            ),
            Unplaceable::Busy { free_max } => format!(
                "waiting for capacity: {} x {} requested, at most {} free on one node",
                request.gpus, request.gpu_model, free_max
            ),
        }
    }
}

/// Best-fit placement of `request` (whole GPUs) on `nodes`. GPUs in MIG
/// mode take no whole-GPU lease, so they do not count.
pub fn best_fit<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    request: &Request,
) -> Result<Placement, Unplaceable> {
    // score = free GPUs left over on the node after placing; lower is better.
    let mut scored: BTreeMap<(u32, &str), (&Node, Vec<&Gpu>)> = BTreeMap::new();
    let mut seen_model = false;
    let mut largest = 0;
    let mut free_max = 0;
    for node in nodes {
        let of_model: Vec<&Gpu> = node
            .gpus
            .iter()
            .filter(|g| g.model == request.gpu_model && !g.mig)
            .collect();
        if of_model.is_empty() {
            continue;
        }
        seen_model = true;
        largest = largest.max(of_model.len() as u32);
        let mut free: Vec<&Gpu> = of_model.into_iter().filter(|g| g.is_free()).collect();
        free.sort_by_key(|g| g.index);
        let free_count = free.len() as u32;
        free_max = free_max.max(free_count);
        if free_count >= request.gpus {
            scored.insert((free_count - request.gpus, node.id.as_str()), (node, free));
        }
    }
    if !seen_model {
        return Err(Unplaceable::NoSuchModel);
    }
    if request.gpus > largest {
        return Err(Unplaceable::TooLarge {
            largest_node_gpus: largest,
        });
    }
    let candidates = scored.len() as u32;
    let mut ranked = scored.into_iter();
    let Some(((leftover, _), (node, free))) = ranked.next() else {
        return Err(Unplaceable::Busy { free_max });
    };
    let runner_up_score = ranked.next().map(|((l, _), _)| -f64::from(l));
    Ok(Placement {
        node_id: node.id.clone(),
        zone: node.zone.clone(),
        gpus: free
            .into_iter()
            .take(request.gpus as usize)
            .cloned()
            .collect(),
        candidates,
        winner_score: -f64::from(leftover),
        runner_up_score,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, model: &str, n: u32, busy: u32) -> Node {
        Node {
            id: id.into(),
            zone: "z".into(),
            lost: None,
            cordoned: None,
            gpus: (0..n)
                .map(|i| Gpu {
                    index: i,
                    uuid: format!("GPU-{id}-{i}"),
                    model: model.into(),
                    vram_gb: 40,
                    held_by: (i < busy).then(uuid::Uuid::nil),
                    shares: Vec::new(),
                    mig: false,
                    health: lh_events::GpuHealth::Healthy,
                    health_since: None,
                })
                .collect(),
        }
    }

    fn req(gpus: u32, model: &str) -> Request {
        Request {
            gpus,
            gpu_model: model.into(),
        }
    }

    #[test]
    fn picks_the_tightest_node_and_free_gpus() {
        let nodes = [node("a", "A100-40GB", 8, 0), node("b", "A100-40GB", 8, 5)];
        let p = best_fit(&nodes, &req(2, "A100-40GB")).unwrap();
        assert_eq!(p.node_id, "b");
        assert_eq!(
            p.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            vec![5, 6]
        );
        assert_eq!(p.candidates, 2);
        assert_eq!(p.winner_score, -1.0);
        assert_eq!(p.runner_up_score, Some(-6.0));
    }

    #[test]
    fn ties_go_to_the_first_node_id() {
        let nodes = [node("b", "A100-40GB", 4, 0), node("a", "A100-40GB", 4, 0)];
        assert_eq!(best_fit(&nodes, &req(1, "A100-40GB")).unwrap().node_id, "a");
    }

    #[test]
    fn says_why_it_cannot_place() {
        let nodes = [node("a", "A100-40GB", 4, 3)];
        assert_eq!(
            best_fit(&nodes, &req(1, "H100-80GB")),
            Err(Unplaceable::NoSuchModel)
        );
        assert_eq!(
            best_fit(&nodes, &req(5, "A100-40GB")),
            Err(Unplaceable::TooLarge {
                largest_node_gpus: 4
            })
        );
        assert_eq!(
            best_fit(&nodes, &req(2, "A100-40GB")),
            Err(Unplaceable::Busy { free_max: 1 })
        );
    }
}
