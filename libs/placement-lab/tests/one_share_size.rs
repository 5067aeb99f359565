//! A node whose GPUs take shares of one size at a time (CUDA MPS holds every
//! client of a GPU to its smallest share): a share goes only on an empty GPU
//! or beside shares of its own size, whatever the policy; a node without the
//! rule mixes sizes freely.

use lh_placement::{
    Cluster, Engine, GpuSpec, NodeSpec, Reject, Request, ShapeMix, ShapeMixConfig, SharingMode,
};
use lh_placement_lab::policy::{self, POLICY_NAMES};

const MODEL: &str = "H100-80GB";

fn node(id: &str, gpus: usize, one_share_size_per_gpu: bool) -> NodeSpec {
    NodeSpec {
        one_share_size_per_gpu,
        ..NodeSpec::uniform(
            id,
            "z",
            64_000,
            1 << 20,
            gpus,
            GpuSpec {
                model: MODEL.into(),
                vram_gb: 80,
                mode: SharingMode::VGpu,
            },
        )
    }
}

fn share(milli: u16, vram_gb: u32) -> Request {
    Request::fraction(milli, vram_gb, 0, 0).with_models([MODEL])
}

fn mix(requests: &[Request]) -> ShapeMix {
    ShapeMix::from_requests(
        requests,
        ShapeMixConfig {
            popularity: 1.0,
            include_cpu_only: false,
            with_memory: false,
        },
    )
}

fn engine(nodes: &[NodeSpec], policy_name: &str) -> Engine {
    let w = mix(&[share(250, 20), share(500, 40), Request::whole(1, 0, 0)]);
    Engine::new(
        Cluster::new(nodes),
        policy::by_name(policy_name, &w).expect("a known policy"),
        7,
    )
}

/// `(milli, vram_gb)` of every share on each GPU of node `i`.
fn sizes_per_gpu(e: &Engine, i: usize) -> Vec<Vec<(u16, u32)>> {
    let mut out = vec![Vec::new(); e.cluster().node(i).gpus.len()];
    for (_, a) in e.cluster().allocations() {
        if a.node as usize != i {
            continue;
        }
        if let lh_placement::Kind::Frac { milli, vram_gb } = a.demand.kind {
            out[a.gpus.trailing_zeros() as usize].push((milli, vram_gb));
        }
    }
    out
}

#[test]
fn shares_of_one_size_share_a_gpu() {
    let mut c = Cluster::new(&[node("m", 1, true)]);
    let d = c.demand(&share(250, 20));
    c.allocate(0, &d, 1).unwrap();
    assert_eq!(c.check(0, &d), Ok(()));
    c.allocate(0, &d, 1).unwrap();
    assert_eq!(c.node(0).gpus[0].leases, 2);
}

#[test]
fn a_share_of_another_size_waits_beside_them_and_an_emptied_gpu_takes_it() {
    let mut e = engine(&[node("m", 1, true)], policy::DEFAULT_POLICY);
    let (_, small) = e.schedule(&share(250, 20)).unwrap();
    let pending = e.decide(&share(500, 40)).unwrap_err();
    assert_eq!(pending.count(Reject::ShareSize), 1, "{pending}");
    assert!(
        pending.busy(),
        "it waits: the GPU takes any size once empty"
    );
    e.release(small).unwrap();
    assert!(e.schedule(&share(500, 40)).is_ok());
}

#[test]
fn a_share_of_another_size_goes_to_another_gpu() {
    for p in POLICY_NAMES {
        let mut e = engine(&[node("m", 2, true)], p);
        let (d, _) = e.schedule(&share(250, 20)).unwrap();
        let first = d.gpu_indices();
        let (d, _) = e.schedule(&share(500, 40)).unwrap();
        assert_ne!(d.gpu_indices(), first, "{p}");
    }
}

#[test]
fn an_empty_gpu_takes_any_size() {
    for size in [(1, 0), (250, 20), (1000, 80)] {
        let c = Cluster::new(&[node("m", 1, true)]);
        assert_eq!(c.check(0, &c.demand(&share(size.0, size.1))), Ok(()));
    }
}

#[test]
fn a_node_without_the_rule_mixes_sizes_on_one_gpu() {
    let mut c = Cluster::new(&[node("h", 1, false)]);
    let small = c.demand(&share(250, 20));
    let large = c.demand(&share(500, 40));
    c.allocate(0, &small, 1).unwrap();
    c.allocate(0, &large, 1).unwrap();
    assert_eq!(c.node(0).gpus[0].leases, 2);
}

#[test]
fn shares_restored_in_two_sizes_keep_their_gpu_from_either_until_it_empties() {
    let mut c = Cluster::new(&[node("m", 1, true)]);
    let small = c.demand(&share(100, 10));
    let large = c.demand(&share(200, 20));
    let a = c.allocate_existing_share(0, &small, 0).unwrap();
    let b = c.allocate_existing_share(0, &large, 0).unwrap();
    assert_eq!(c.check(0, &small), Err(Reject::ShareSize));
    assert_eq!(c.check(0, &large), Err(Reject::ShareSize));
    c.release(a).unwrap();
    // Its enforcement's limits stay at the smallest share until the GPU empties.
    assert_eq!(c.check(0, &large), Err(Reject::ShareSize));
    c.release(b).unwrap();
    assert_eq!(c.check(0, &large), Ok(()));
}

#[test]
fn no_policy_ever_mixes_sizes_on_a_gpu_of_such_a_node() {
    let sizes = [(125, 10), (250, 20), (500, 40), (250, 10)];
    for p in POLICY_NAMES {
        let nodes = [node("m", 4, true), node("h", 2, false)];
        let mut e = engine(&nodes, p);
        let mut live = Vec::new();
        for k in 0..200usize {
            let (milli, vram_gb) = sizes[(k * 7 + k / 3) % sizes.len()];
            if k % 5 == 4 && !live.is_empty() {
                let id = live.remove((k * 3) % live.len());
                e.release(id).unwrap();
            }
            if let Ok((_, id)) = e.schedule(&share(milli, vram_gb)) {
                live.push(id);
            }
            for sizes in sizes_per_gpu(&e, 0) {
                assert!(sizes.windows(2).all(|w| w[0] == w[1]), "{p}: {sizes:?}");
            }
        }
        let mixed = sizes_per_gpu(&e, 1)
            .iter()
            .any(|s| s.windows(2).any(|w| w[0] != w[1]));
        assert!(mixed, "{p}: the node without the rule mixes sizes");
    }
}
