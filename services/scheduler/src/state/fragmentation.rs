//! Fragmentation: idle GPU capacity that no waiting lease can use. Idle
//! milli-GPU is spread over GPUs and nodes; when what waits is bigger than
//! any idle piece (four whole GPUs while four nodes each have one free, a
//! 600-milli share while two GPUs each have 500 free), the fleet looks half
//! empty and the queue still does not move. That is what an operator wants
//! to see beside `lh_scheduler_waiting_leases`.
//!
//! A waiting lease fits an idle piece by GPU model and size only: zones,
//! isolation, quotas and MIG slice geometry (nor MIG instances that no
//! lease owns) are not asked, so some capacity counted as usable may still
//! be out of its reach, and the figure is a lower bound of what is stranded.

use std::collections::BTreeMap;

use lh_domain::fleet::{Fleet, Gpu};
use lh_events::{GpuAsk, GpuHealth};

use super::rules::MILLI_PER_GPU;

/// What one waiting lease needs: its GPU model, its ask, and its footprint
/// in milli-GPU and VRAM GB (per GPU).
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub gpu_model: &'a str,
    pub ask: &'a GpuAsk,
    pub milli: u64,
    pub vram_gb: u32,
}

/// Idle milli-GPU on schedulable nodes' healthy GPUs that none of `waiting`
/// fits. With nothing waiting it is all the idle milli-GPU.
pub fn fragmented_milli(fleet: &Fleet, waiting: &[Want<'_>]) -> u64 {
    let mut stranded = 0;
    for node in fleet.nodes.values().filter(|n| n.is_schedulable()) {
        let usable: Vec<&Gpu> = node
            .gpus
            .iter()
            .filter(|g| g.health == GpuHealth::Healthy)
            .collect();
        // Whole free GPUs per model: what a lease of several GPUs needs on
        // one node.
        let mut whole_free: BTreeMap<&str, u32> = BTreeMap::new();
        for gpu in usable.iter().filter(|g| g.is_free() && !g.mig) {
            *whole_free.entry(gpu.model.as_str()).or_default() += 1;
        }
        for gpu in usable {
            let idle = MILLI_PER_GPU.saturating_sub(u64::from(gpu.used_milli()));
            if idle == 0 {
                continue;
            }
            let free_vram = gpu.vram_gb.saturating_sub(gpu.used_vram_gb());
            let fits = |want: &Want<'_>| {
                want.gpu_model == gpu.model
                    && match want.ask {
                        GpuAsk::Whole(n) => {
                            gpu.is_free()
                                && !gpu.mig
                                && whole_free.get(gpu.model.as_str()).copied().unwrap_or(0) >= *n
                        }
                        GpuAsk::Fraction(_) => {
                            !gpu.mig
                                && gpu.held_by.is_none()
                                && idle >= want.milli
                                && free_vram >= want.vram_gb
                        }
                        GpuAsk::Mig(_) => {
                            gpu.mig && idle >= want.milli && free_vram >= want.vram_gb
                        }
                    }
            };
            if !waiting.iter().any(fits) {
                stranded += idle;
            }
        }
    }
    stranded
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_domain::fleet::{Node, Share};
    use lh_events::GpuFraction;
    use uuid::Uuid;

    const MODEL: &str = "A100-80GB";

    fn gpu(index: u32) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index}"),
            model: MODEL.into(),
            vram_gb: 80,
            held_by: None,
            shares: Vec::new(),
            mig: false,
            unowned_mig: Vec::new(),
            health: GpuHealth::Healthy,
            health_since: None,
        }
    }

    fn held(index: u32) -> Gpu {
        Gpu {
            held_by: Some(Uuid::from_u128(u128::from(index) + 1)),
            ..gpu(index)
        }
    }

    fn shared(index: u32, milli: u32, vram_gb: u32) -> Gpu {
        Gpu {
            shares: vec![Share {
                lease_id: Uuid::from_u128(u128::from(index) + 100),
                milli,
                vram_gb,
                mig: None,
            }],
            ..gpu(index)
        }
    }

    fn node(id: &str, gpus: Vec<Gpu>) -> Node {
        Node {
            id: id.into(),
            zone: "z".into(),
            gpus,
            lost: None,
            cordoned: None,
            isolation: Default::default(),
            gpu_sharing: Default::default(),
            hostname: String::new(),
            fabric: None,
        }
    }

    fn fleet(nodes: Vec<Node>) -> Fleet {
        Fleet {
            nodes: nodes.into_iter().map(|n| (n.id.clone(), n)).collect(),
            ..Fleet::default()
        }
    }

    fn whole(ask: &GpuAsk) -> Want<'_> {
        Want {
            gpu_model: MODEL,
            ask,
            milli: MILLI_PER_GPU,
            vram_gb: 80,
        }
    }

    fn share(ask: &GpuAsk) -> Want<'_> {
        let GpuAsk::Fraction(f) = ask else {
            unreachable!()
        };
        Want {
            gpu_model: MODEL,
            ask,
            milli: u64::from(f.milli),
            vram_gb: f.vram_gb,
        }
    }

    #[test]
    fn one_free_gpu_on_each_of_two_nodes_is_stranded_for_a_lease_of_two() {
        let fleet = fleet(vec![
            node("a", vec![gpu(0), held(1)]),
            node("b", vec![held(0), gpu(1)]),
        ]);
        let two = GpuAsk::Whole(2);
        assert_eq!(fragmented_milli(&fleet, &[whole(&two)]), 2000);
        let one = GpuAsk::Whole(1);
        assert_eq!(fragmented_milli(&fleet, &[whole(&two), whole(&one)]), 0);
    }

    #[test]
    fn half_gpus_are_stranded_for_a_bigger_share_and_usable_by_a_smaller_one() {
        let fleet = fleet(vec![node(
            "a",
            vec![shared(0, 500, 40), shared(1, 500, 40), held(2)],
        )]);
        let big = GpuAsk::Fraction(GpuFraction {
            milli: 600,
            vram_gb: 10,
        });
        assert_eq!(fragmented_milli(&fleet, &[share(&big)]), 1000);
        let small = GpuAsk::Fraction(GpuFraction {
            milli: 400,
            vram_gb: 40,
        });
        assert_eq!(fragmented_milli(&fleet, &[share(&small)]), 0);
        // Enough compute but not enough memory is no fit either.
        let hungry = GpuAsk::Fraction(GpuFraction {
            milli: 100,
            vram_gb: 41,
        });
        assert_eq!(fragmented_milli(&fleet, &[share(&hungry)]), 1000);
    }

    #[test]
    fn nothing_waiting_strands_all_idle_capacity_and_a_lost_node_none() {
        let mut lost = node("b", vec![gpu(0), gpu(1)]);
        lost.lost = Some(chrono::Utc::now());
        let mut unhealthy = gpu(1);
        unhealthy.health = GpuHealth::Unhealthy;
        let fleet = fleet(vec![node("a", vec![shared(0, 250, 20), unhealthy]), lost]);
        assert_eq!(fragmented_milli(&fleet, &[]), 750);
    }

    #[test]
    fn another_model_never_fits() {
        let fleet = fleet(vec![node("a", vec![gpu(0)])]);
        let one = GpuAsk::Whole(1);
        let other = Want {
            gpu_model: "H100-80GB",
            ..whole(&one)
        };
        assert_eq!(fragmented_milli(&fleet, &[other]), 1000);
        assert_eq!(fragmented_milli(&fleet, &[whole(&one)]), 0);
    }
}
