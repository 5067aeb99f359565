//! A node that refuses a demand says whether its GPUs are busy now or could
//! never take it as the node is.

use lh_placement::{Cluster, GpuDemand, GpuSpec, NodeSpec, Reject, Request, SharingMode};

/// Node "a": two shareable A100-40GB and one in MIG mode; node "b": one
/// shareable A100-40GB.
fn cluster() -> Cluster {
    let plain = GpuSpec {
        model: "A100-40GB".into(),
        vram_gb: 40,
        mode: SharingMode::VGpu,
    };
    let in_mig = GpuSpec {
        mode: SharingMode::Mig,
        ..plain.clone()
    };
    let node = |id: &str, gpus: Vec<GpuSpec>| NodeSpec {
        id: id.into(),
        zone: "z".into(),
        cpu_milli: 1000,
        memory_mib: 1000,
        gpus,
        domains: Vec::new(),
        isolates_workloads: id != "b",
        one_share_size_per_gpu: false,
        fabric: String::new(),
    };
    Cluster::new(&[
        node("a", vec![plain.clone(), plain.clone(), in_mig]),
        node("b", vec![plain]),
    ])
}

fn mig(profile: &str) -> Request {
    Request {
        gpu: GpuDemand::Mig {
            profile: profile.into(),
        },
        ..Request::cpu_only(0, 0)
    }
}

#[test]
fn a_refusal_tells_gpus_busy_now_from_gpus_that_never_fit() {
    let mut c = cluster();
    let check = |c: &Cluster, node: usize, r: &Request| c.check(node, &c.demand(r));
    assert_eq!(check(&c, 0, &Request::whole(2, 0, 0)), Ok(()));
    // A GPU in MIG mode takes no whole-GPU lease.
    assert_eq!(
        check(&c, 0, &Request::whole(3, 0, 0)),
        Err(Reject::GpuTooSmall)
    );
    assert_eq!(
        check(&c, 0, &Request::fraction(500, 41, 0, 0)),
        Err(Reject::GpuTooSmall)
    );
    assert_eq!(
        check(&c, 0, &Request::whole(1, 0, 0).with_models(["H100-80GB"])),
        Err(Reject::Model)
    );
    assert_eq!(check(&c, 1, &mig("1g.5gb")), Err(Reject::GpuMode));
    assert_eq!(check(&c, 0, &mig("9g.99gb")), Err(Reject::MigProfile));
    // A profile of another model's geometry.
    assert_eq!(check(&c, 0, &mig("1g.10gb")), Err(Reject::MigProfile));
    assert_eq!(check(&c, 0, &mig("7g.40gb")), Ok(()));

    let whole = c.demand(&Request::whole(2, 0, 0));
    c.allocate(0, &whole, 0b011).expect("two idle GPUs");
    let instance = c.demand(&mig("7g.40gb"));
    c.allocate_mig_at(0, &instance, 2, 0)
        .expect("an idle MIG GPU");
    assert_eq!(check(&c, 0, &Request::whole(1, 0, 0)), Err(Reject::GpuBusy));
    assert_eq!(
        check(&c, 0, &Request::fraction(500, 10, 0, 0)),
        Err(Reject::GpuBusy)
    );
    assert_eq!(check(&c, 0, &mig("1g.5gb")), Err(Reject::GpuBusy));
}

#[test]
fn given_a_request_that_needs_isolation_when_a_node_does_not_isolate_then_it_refuses_first() {
    let c = cluster();
    let check = |node: usize, r: &Request| c.check(node, &c.demand(r));
    let isolated = Request::whole(1, 0, 0).isolated();
    assert_eq!(check(1, &isolated), Err(Reject::Isolation));
    assert_eq!(check(0, &isolated), Ok(()));
    // Without the need, the node that does not isolate takes it.
    assert_eq!(check(1, &Request::whole(1, 0, 0)), Ok(()));
    // Before any GPU check: waiting for GPUs there would not help.
    assert_eq!(
        check(1, &Request::whole(8, 0, 0).isolated()),
        Err(Reject::Isolation)
    );
}
