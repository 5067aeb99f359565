//! MIG instances that belong to no lease (an operator's, or left by an agent
//! whose log was lost): whatever the policy, no lease's instance is placed
//! over one, none is handed to a lease, and a GPU holding one is never
//! re-sliced; a node they leave no room on says so.

use lh_placement::mig::{self, MigLayout};
use lh_placement::{
    AllocError, Cluster, Engine, GpuDemand, GpuSpec, NodeSpec, Reject, Request, ShapeMix,
    ShapeMixConfig, SharingMode,
};
use lh_placement_lab::policy::{self, POLICY_NAMES};

const MODEL: &str = "A100-40GB";

fn node(id: &str, gpus: usize) -> NodeSpec {
    NodeSpec::uniform(
        id,
        "z",
        64_000,
        1 << 20,
        gpus,
        GpuSpec {
            model: MODEL.into(),
            vram_gb: 40,
            mode: SharingMode::Mig,
        },
    )
}

fn mig(profile: &str) -> Request {
    Request {
        gpu: GpuDemand::Mig {
            profile: profile.into(),
        },
        ..Request::cpu_only(0, 0)
    }
    .with_models([MODEL])
}

fn engine(cluster: Cluster, policy_name: &str) -> Engine {
    let w = ShapeMix::from_requests(
        &[mig("1g.5gb"), mig("3g.20gb"), Request::whole(1, 0, 0)],
        ShapeMixConfig {
            popularity: 1.0,
            include_cpu_only: false,
            with_memory: false,
        },
    );
    Engine::new(cluster, policy::by_name(policy_name, &w).unwrap(), 7)
}

/// Memory slices of the instances leases hold on GPU `j` of node `i`, and
/// of the unowned ones.
fn masks(c: &Cluster, i: usize, j: usize) -> (u16, u16) {
    let layout = c.node(i).mig[j].as_ref().unwrap();
    let mut held = 0;
    let mut unowned = 0;
    for inst in layout.instances() {
        let m = inst.profile.memory_mask(inst.start);
        if inst.unowned {
            unowned |= m;
        } else {
            held |= m;
        }
    }
    (held, unowned)
}

#[test]
fn no_policy_places_an_instance_over_an_unowned_one() {
    let profiles = [
        "1g.5gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
        "1g.5gb+me",
    ];
    for p in POLICY_NAMES {
        let mut c = Cluster::new(&[node("m", 2), node("n", 1)]);
        c.add_unowned_mig(0, 0, "3g.20gb", 4).unwrap();
        c.add_unowned_mig(0, 1, "1g.5gb", 0).unwrap();
        c.add_unowned_mig(1, 0, "2g.10gb", 2).unwrap();
        let before: Vec<(u16, u16)> = [(0, 0), (0, 1), (1, 0)]
            .iter()
            .map(|&(i, j)| masks(&c, i, j))
            .collect();
        let mut e = engine(c, p);
        let mut live = Vec::new();
        for k in 0..120usize {
            if k % 4 == 3 && !live.is_empty() {
                let id = live.remove((k * 5) % live.len());
                e.release(id).unwrap();
            }
            let profile = profiles[(k * 7 + k / 5) % profiles.len()];
            if let Ok((_, id)) = e.schedule(&mig(profile)) {
                live.push(id);
            }
            for (n, &(i, j)) in [(0, 0), (0, 1), (1, 0)].iter().enumerate() {
                let (held, unowned) = masks(e.cluster(), i, j);
                assert_eq!(unowned, before[n].1, "{p}: an unowned instance went");
                assert_eq!(held & unowned, 0, "{p}: a lease over an unowned instance");
            }
        }
        assert!(!live.is_empty(), "{p} placed nothing");
    }
}

#[test]
fn a_gpu_with_an_unowned_instance_is_neither_resliced_nor_handed_out() {
    let mut l = MigLayout::<u32>::new(MODEL).unwrap();
    l.add_unowned("1g.5gb", 6).unwrap();
    assert!(!l.is_idle(), "it holds an instance");
    // Not handed to a lease of its profile: a new one is made elsewhere.
    let p = mig::place(&mut l, "1g.5gb", 1).unwrap();
    assert!(p.created && p.instance.start != 6, "{p:?}");
    mig::release(&mut l, &1);
    // A GPU-wide profile would need it destroyed: refused.
    assert_eq!(mig::plan(&l, "7g.40gb"), None);
    assert_eq!(mig::placeable(&l, "7g.40gb"), 0);
    // An idle GPU with a free provisioned instance in the way is re-sliced;
    // with an unowned one beside it, it is not.
    let mut provisioned = MigLayout::<u32>::new(MODEL).unwrap();
    provisioned.provision("3g.20gb", 0).unwrap();
    assert!(mig::plan(&provisioned, "4g.20gb").is_some());
    provisioned.add_unowned("1g.5gb", 6).unwrap();
    assert_eq!(mig::plan(&provisioned, "4g.20gb"), None);
    // Overlapping a lease's instance, or another unowned one: refused.
    assert!(l.add_unowned("1g.5gb", 6).is_err());
    assert!(l.add_unowned("9g.99gb", 0).is_err());
}

#[test]
fn a_node_unowned_instances_leave_no_room_on_says_so() {
    let mut c = Cluster::new(&[node("m", 1)]);
    let check = |c: &Cluster, r: &Request| c.check(0, &c.demand(r));
    c.add_unowned_mig(0, 0, "1g.5gb", 0).unwrap();
    assert_eq!(check(&c, &mig("4g.20gb")), Err(Reject::MigUnowned));
    assert_eq!(check(&c, &mig("7g.40gb")), Err(Reject::MigUnowned));
    assert_eq!(check(&c, &mig("3g.20gb")), Ok(()));
    // Busy while a lease's end would make room.
    let d = c.demand(&mig("3g.20gb"));
    c.allocate_mig_at(0, &d, 0, 4).unwrap();
    assert_eq!(check(&c, &mig("3g.20gb")), Err(Reject::GpuBusy));
    assert_eq!(check(&c, &mig("2g.10gb")), Ok(()));
    assert_eq!(
        c.add_unowned_mig(0, 0, "1g.5gb", 4),
        Err(AllocError::Mig(mig::MigError::Invalid(
            "1g.5gb at 4 overlaps another instance".into()
        )))
    );
    let mut two = Cluster::new(&[node("m", 1)]);
    let d = two.demand(&mig("4g.20gb"));
    two.allocate_mig_at(0, &d, 0, 0).unwrap();
    two.add_unowned_mig(0, 0, "3g.20gb", 4).unwrap();
    assert_eq!(check(&two, &mig("4g.20gb")), Err(Reject::GpuBusy));
    assert_eq!(check(&two, &mig("7g.40gb")), Err(Reject::MigUnowned));
}
