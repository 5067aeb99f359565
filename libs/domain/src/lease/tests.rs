//! Given a tenant and a request, when it is decided, then the lease or the
//! field at fault.

use lh_events::{GpuFraction, Tier, WorkloadSpec};
use uuid::Uuid;

use super::*;

const UNKEYED: Uuid = Uuid::from_u128(7);

fn tenant() -> Tenant {
    Tenant {
        id: Uuid::from_u128(1),
        max_gpus: 8,
        pending_leases: 0,
        max_pending_leases: 100,
    }
}

fn whole(gpus: u32) -> LeaseBody {
    LeaseBody {
        gpus: Some(gpus),
        fraction: None,
        mig_profile: None,
        gpu_model: "A100-40GB".into(),
        tier: Tier::Basic,
        priority: 0,
        workload: None,
        max_price_cny_per_gpu_hour: None,
        zones: Vec::new(),
        regions: Vec::new(),
        recovery: None,
    }
}

fn spot() -> LeaseBody {
    LeaseBody {
        tier: Tier::Spot,
        ..whole(1)
    }
}

#[test]
fn given_a_bid_when_decided_then_only_a_spot_request_within_bounds_carries_it() {
    let bid = |b: &str| Some(b.parse::<Decimal>().unwrap());
    let (field, detail) = refused(LeaseBody {
        max_price_cny_per_gpu_hour: bid("4"),
        ..whole(1)
    });
    assert_eq!(field, "max_price_cny_per_gpu_hour");
    assert_eq!(detail, "a maximum price is for tier spot only");
    for bad in ["0", "-1", "100001", "0.00001"] {
        let (field, _) = refused(LeaseBody {
            max_price_cny_per_gpu_hour: bid(bad),
            ..spot()
        });
        assert_eq!(field, "max_price_cny_per_gpu_hour", "{bad}");
    }
    let lease = decide(LeaseBody {
        max_price_cny_per_gpu_hour: bid("4.50"),
        ..spot()
    })
    .unwrap();
    assert_eq!(lease.max_price_cny_per_gpu_hour, bid("4.5"));
}

#[test]
fn given_a_recovery_policy_when_decided_then_it_is_spot_only_and_bounded() {
    let recovery = |max_retries| {
        Some(SpotRecovery {
            max_retries,
            zone_first: Default::default(),
        })
    };
    let (field, _) = refused(LeaseBody {
        recovery: recovery(1),
        ..whole(1)
    });
    assert_eq!(field, "recovery");
    let (field, _) = refused(LeaseBody {
        recovery: recovery(crate::spot::MAX_RECOVERY_RETRIES + 1),
        ..spot()
    });
    assert_eq!(field, "recovery.max_retries");
    let lease = decide(LeaseBody {
        recovery: recovery(3),
        ..spot()
    })
    .unwrap();
    assert_eq!(lease.recovery.unwrap().max_retries, 3);
}

#[test]
fn given_zones_and_regions_when_decided_then_each_name_is_checked() {
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let lease = decide(LeaseBody {
        zones: names(&["cn-north.1", "cn-east.2"]),
        regions: names(&["cn-north"]),
        ..whole(1)
    })
    .unwrap();
    assert_eq!(lease.zones, names(&["cn-north.1", "cn-east.2"]));
    assert_eq!(lease.regions, names(&["cn-north"]));
    for bad in [
        names(&[""]),
        names(&["a b"]),
        names(&["a", "a"]),
        vec!["z".into(); 17],
    ] {
        let (field, _) = refused(LeaseBody {
            zones: bad.clone(),
            ..whole(1)
        });
        assert_eq!(field, "zones", "{bad:?}");
    }
    let (field, _) = refused(LeaseBody {
        regions: names(&["x".repeat(65).as_str()]),
        ..whole(1)
    });
    assert_eq!(field, "regions");
}

fn share(milli: u32, vram_gb: u32) -> LeaseBody {
    LeaseBody {
        gpus: None,
        fraction: Some(GpuFraction { milli, vram_gb }),
        ..whole(1)
    }
}

fn mig(profile: &str) -> LeaseBody {
    LeaseBody {
        gpus: None,
        mig_profile: Some(profile.into()),
        ..whole(1)
    }
}

fn with_workload(command: &[&str], image: Option<&str>, env: &[&str]) -> LeaseBody {
    LeaseBody {
        workload: Some(WorkloadSpec {
            command: command.iter().map(|s| s.to_string()).collect(),
            image: image.map(str::to_string),
            env: env.iter().map(|k| (k.to_string(), "v".into())).collect(),
            env_ref: None,
            network: Default::default(),
            template: None,
            datasets: Vec::new(),
            workspaces: Vec::new(),
            object_store: false,
        }),
        ..whole(1)
    }
}

fn decide(body: LeaseBody) -> Result<LeaseRequested, Invalid> {
    request(tenant(), body, None, UNKEYED)
}

/// The field a refused request names; panics when it is accepted.
fn refused(body: LeaseBody) -> (String, String) {
    let e = decide(body).unwrap_err();
    assert_eq!(e.kind, InvalidKind::Unacceptable, "{e}");
    (e.field.into_owned(), e.detail)
}

#[test]
fn given_whole_gpus_when_decided_then_the_lease_asks_for_them() {
    let lease = decide(whole(2)).unwrap();
    assert_eq!(lease.ask(), GpuAsk::Whole(2));
    assert_eq!(lease.lease_id, UNKEYED);
    assert_eq!(lease.tenant_id, tenant().id);
    assert_eq!(lease.idempotency_key, None);
}

#[test]
fn given_a_share_or_a_mig_profile_when_decided_then_the_lease_spans_one_gpu() {
    let lease = decide(share(250, 10)).unwrap();
    assert_eq!(
        lease.ask(),
        GpuAsk::Fraction(GpuFraction {
            milli: 250,
            vram_gb: 10
        })
    );
    assert_eq!(lease.gpus, 1);
    let lease = decide(mig("3g.20gb")).unwrap();
    assert_eq!(lease.ask(), GpuAsk::Mig("3g.20gb".into()));
    assert_eq!(lease.gpus, 1);
}

#[test]
fn given_two_ways_of_asking_when_decided_then_the_second_is_named() {
    let both = LeaseBody {
        gpus: Some(1),
        ..share(100, 1)
    };
    assert_eq!(refused(both).0, "gpu_fraction");
    let share_and_mig = LeaseBody {
        mig_profile: Some("1g.5gb".into()),
        ..share(100, 1)
    };
    assert_eq!(refused(share_and_mig).0, "gpu_fraction");
    let gpus_and_mig = LeaseBody {
        gpus: Some(1),
        ..mig("1g.5gb")
    };
    let (field, detail) = refused(gpus_and_mig);
    assert_eq!(field, "mig_profile");
    assert_eq!(detail, "give one of gpus, gpu_fraction and mig_profile");
}

#[test]
fn given_no_ask_when_decided_then_gpus_is_required() {
    let none = LeaseBody {
        gpus: None,
        ..whole(1)
    };
    assert_eq!(refused(none).0, "gpus");
}

#[test]
fn given_a_gpu_count_out_of_range_when_decided_then_gpus_is_named() {
    let words = "gpus must be 1 to 16, or a multiple of 8 up to 128";
    assert_eq!(refused(whole(0)), ("gpus".into(), words.into()));
    // Beyond 16, whole nodes of 8 only, and at most 16 of them.
    assert_eq!(refused(whole(17)), ("gpus".into(), words.into()));
    assert_eq!(refused(whole(20)).0, "gpus");
    assert_eq!(refused(whole(136)).0, "gpus");
}

#[test]
fn given_any_count_to_sixteen_or_whole_nodes_beyond_when_decided_then_it_is_a_lease() {
    let big = Tenant {
        max_gpus: 128,
        ..tenant()
    };
    for gpus in (1..=16).chain([24, 32, 64, 128]) {
        assert!(
            super::request(big, whole(gpus), None, Uuid::nil()).is_ok(),
            "{gpus} GPUs"
        );
    }
    // A lease across nodes runs its command on each: an image's own
    // command cannot be run once per GPU.
    let image_only = LeaseBody {
        workload: Some(lh_events::WorkloadSpec {
            image: Some("localhost/leasehold/base".into()),
            ..Default::default()
        }),
        ..whole(16)
    };
    let e = super::request(big, image_only, None, Uuid::nil()).unwrap_err();
    assert_eq!(e.field, "workload.command", "{e}");
}

#[test]
fn given_an_unknown_model_when_decided_then_the_known_ones_are_listed() {
    let (field, detail) = refused(LeaseBody {
        gpu_model: "Z80".into(),
        ..whole(1)
    });
    assert_eq!(field, "gpu_model");
    assert!(detail.starts_with("unknown GPU model \"Z80\"; known: A100-40GB, "));
}

#[test]
fn given_a_share_out_of_range_when_decided_then_its_part_is_named() {
    assert_eq!(refused(share(0, 1)).0, "gpu_fraction.milli");
    assert_eq!(refused(share(1001, 1)).0, "gpu_fraction.milli");
    assert_eq!(refused(share(500, 0)).0, "gpu_fraction.vram_gb");
    assert_eq!(
        refused(share(500, 41)),
        (
            "gpu_fraction.vram_gb".into(),
            "gpu_fraction.vram_gb must be 1 to 40 (the VRAM of one A100-40GB)".into()
        )
    );
}

#[test]
fn given_a_mig_profile_the_model_lacks_when_decided_then_mig_profile_is_named() {
    let (field, detail) = refused(mig("9g.99gb"));
    assert_eq!(field, "mig_profile");
    assert!(detail.starts_with("A100-40GB has no MIG profile \"9g.99gb\"; its profiles: 1g.5gb"));
    let (field, detail) = refused(LeaseBody {
        gpu_model: "L4-24GB".into(),
        ..mig("1g.5gb")
    });
    assert_eq!(field, "mig_profile");
    assert!(detail.starts_with("L4-24GB has no MIG mode; MIG models: A100-40GB"));
}

#[test]
fn given_a_bad_workload_when_decided_then_its_part_is_named() {
    assert_eq!(refused(with_workload(&[], None, &[])).0, "workload.command");
    assert_eq!(
        refused(with_workload(&[""], None, &[])).0,
        "workload.command"
    );
    let long: Vec<&str> = vec!["x"; MAX_WORKLOAD_ITEMS + 1];
    assert_eq!(
        refused(with_workload(&long, None, &[])).0,
        "workload.command"
    );
    assert_eq!(
        refused(with_workload(&["x"], Some(""), &[])).0,
        "workload.image"
    );
    assert_eq!(
        refused(with_workload(&[], Some("a b"), &[])).0,
        "workload.image"
    );
    assert_eq!(
        refused(with_workload(&["x"], None, &["1X"])).0,
        "workload.env"
    );
    assert_eq!(
        refused(with_workload(&["x"], None, &["A-B"])).0,
        "workload.env"
    );
    decide(with_workload(&[], Some("python:3"), &["_A1"])).unwrap();
}

#[test]
fn given_a_denied_env_name_when_decided_then_that_variable_is_named() {
    for name in [
        "LD_PRELOAD",
        "ld_library_path",
        "DOCKER_HOST",
        "CONTAINER_HOST",
        "HTTPS_PROXY",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_MPS_PIPE_DIRECTORY",
    ] {
        let (field, _) = refused(with_workload(&["sh"], None, &[name]));
        assert_eq!(field, format!("workload.env.{name}"));
    }
}

#[test]
fn given_an_env_value_with_a_line_break_when_decided_then_that_variable_is_named() {
    let mut body = with_workload(&["sh"], None, &[]);
    body.workload
        .as_mut()
        .unwrap()
        .env
        .insert("A".into(), "x\nLD_PRELOAD=/evil.so".into());
    assert_eq!(refused(body).0, "workload.env.A");
}

#[test]
fn given_an_image_that_reads_as_a_cli_flag_when_decided_then_workload_image_is_named() {
    for image in [
        "--volume=/:/host",
        "-v",
        "--privileged",
        "ubuntu --gpus=all",
        "Ubuntu",
    ] {
        let (field, detail) = refused(with_workload(&["sh"], Some(image), &[]));
        assert_eq!(field, "workload.image", "{image}");
        assert!(detail.contains("OCI image reference"), "{detail}");
    }
}

#[test]
fn given_a_priority_out_of_range_when_decided_then_priority_is_named() {
    for priority in [-1001, 1001, i32::MIN, i32::MAX] {
        let (field, detail) = refused(LeaseBody {
            priority,
            ..whole(1)
        });
        assert_eq!(field, "priority");
        assert_eq!(detail, "priority must be -1000 to 1000");
    }
    decide(LeaseBody {
        priority: -1000,
        ..whole(1)
    })
    .unwrap();
}

#[test]
fn given_more_gpus_than_the_quota_when_decided_then_gpus_is_named() {
    let small = Tenant {
        max_gpus: 2,
        ..tenant()
    };
    let e = request(small, whole(3), None, UNKEYED).unwrap_err();
    assert_eq!(e.field, "gpus");
    assert_eq!(e.detail, "3 GPUs requested but the tenant's quota is 2");
    request(small, whole(2), None, UNKEYED).unwrap();
}

#[test]
fn given_a_body_error_and_a_bad_key_when_decided_then_the_body_is_named_first() {
    let e = request(tenant(), whole(0), Some(b""), UNKEYED).unwrap_err();
    assert_eq!(e.field, "gpus");
}

#[test]
fn given_an_idempotency_key_when_decided_then_the_id_is_derived_from_tenant_and_key() {
    let a = request(tenant(), whole(1), Some(b"k-1"), UNKEYED).unwrap();
    let b = request(tenant(), whole(2), Some(b"k-1"), Uuid::from_u128(8)).unwrap();
    assert_eq!(a.lease_id, b.lease_id);
    assert_ne!(a.lease_id, UNKEYED);
    assert_eq!(a.idempotency_key.as_deref(), Some("k-1"));
    let other = Tenant {
        id: Uuid::from_u128(2),
        ..tenant()
    };
    let c = request(other, whole(1), Some(b"k-1"), UNKEYED).unwrap();
    assert_ne!(a.lease_id, c.lease_id);
}

#[test]
fn given_a_bad_idempotency_key_when_decided_then_it_is_malformed() {
    let long = vec![b'k'; MAX_IDEMPOTENCY_KEY_LEN + 1];
    for key in [&b""[..], &long, b"caf\xc3\xa9", b"a\x01b"] {
        let e = request(tenant(), whole(1), Some(key), UNKEYED).unwrap_err();
        assert_eq!(e.kind, InvalidKind::Malformed);
        assert_eq!(e.field, "Idempotency-Key");
        assert_eq!(
            e.detail,
            "Idempotency-Key must be 1 to 200 visible characters"
        );
    }
    let longest = vec![b'k'; MAX_IDEMPOTENCY_KEY_LEN];
    request(tenant(), whole(1), Some(&longest), UNKEYED).unwrap();
}

fn lease_in(state: LeaseState) -> LeaseNow {
    LeaseNow {
        id: Uuid::from_u128(3),
        state,
        suspended_at: None,
    }
}

#[test]
fn given_a_live_lease_when_stopped_then_the_stop_is_one_event() {
    for state in LeaseState::ALL.into_iter().filter(|s| !s.is_final()) {
        let (event, id) = stop(lease_in(state)).unwrap();
        assert_eq!(event.lease_id, Uuid::from_u128(3));
        assert_eq!(id, stop(lease_in(LeaseState::Running)).unwrap().1);
    }
}

#[test]
fn given_a_finished_lease_when_stopped_then_it_is_already_over() {
    let e = stop(lease_in(LeaseState::Ended)).unwrap_err();
    assert_eq!(
        e.0,
        "lease 00000000-0000-0000-0000-000000000003 is already ended"
    );
    assert!(stop(lease_in(LeaseState::Rejected)).is_err());
}

#[test]
fn given_a_suspended_lease_when_resumed_then_each_suspension_has_its_own_resume() {
    let at = |secs| chrono::DateTime::from_timestamp(secs, 0);
    let first = LeaseNow {
        suspended_at: at(100),
        ..lease_in(LeaseState::Suspended)
    };
    let second = LeaseNow {
        suspended_at: at(200),
        ..first
    };
    let (event, id) = resume(first).unwrap();
    assert_eq!(event.lease_id, first.id);
    assert_eq!(id, resume(first).unwrap().1);
    assert_ne!(id, resume(second).unwrap().1);
}

#[test]
fn given_a_lease_not_suspended_when_resumed_then_its_state_is_named() {
    let e = resume(lease_in(LeaseState::Running)).unwrap_err();
    assert_eq!(
        e.0,
        "lease 00000000-0000-0000-0000-000000000003 is running, not suspended"
    );
}

#[test]
fn lease_states_read_back_from_their_names() {
    for state in LeaseState::ALL {
        assert_eq!(LeaseState::try_from(state.as_str().to_string()), Ok(state));
        assert_eq!(
            serde_json::to_string(&state).unwrap(),
            format!("\"{state}\"")
        );
    }
    assert!(LeaseState::try_from("gone".to_string()).is_err());
}

#[test]
fn given_a_tenant_at_its_pending_limit_when_decided_then_it_is_over_limit() {
    let full = Tenant {
        pending_leases: 100,
        ..tenant()
    };
    let e = request(full, whole(1), Some(b"k-1"), UNKEYED).unwrap_err();
    assert_eq!(
        (e.kind, e.field.as_ref()),
        (InvalidKind::OverLimit, "tenant")
    );
    // A bad body is named first: the limit is not what the caller must fix.
    let e = request(full, whole(0), None, UNKEYED).unwrap_err();
    assert_eq!(e.field, "gpus");
    let room = Tenant {
        pending_leases: 99,
        ..tenant()
    };
    request(room, whole(1), None, UNKEYED).unwrap();
}

#[test]
fn given_a_workload_over_its_byte_bound_when_decided_then_workload_is_named() {
    let sized = |bytes: usize| LeaseBody {
        workload: Some(WorkloadSpec {
            command: vec!["sh".into(), "-c".into(), "x".repeat(bytes - 4)],
            image: None,
            env: Default::default(),
            env_ref: None,
            network: Default::default(),
            template: None,
            datasets: Vec::new(),
            workspaces: Vec::new(),
            object_store: false,
        }),
        ..whole(1)
    };
    request(tenant(), sized(MAX_WORKLOAD_BYTES), None, UNKEYED).unwrap();
    let e = request(tenant(), sized(MAX_WORKLOAD_BYTES + 1), None, UNKEYED).unwrap_err();
    assert_eq!(
        (e.kind, e.field.as_ref()),
        (InvalidKind::Unacceptable, "workload")
    );
}

#[test]
fn each_step_moves_a_lease_only_from_the_states_it_applies_in() {
    use LeaseState::{Ended, Placed, Queued, Rejected, Requested, Running, Suspended};
    let waiting = vec![Requested, Queued];
    let on_gpus = vec![Placed, Running];
    for (step, from, to) in [
        (LeaseStep::Queue, waiting.clone(), Queued),
        (LeaseStep::Place, waiting, Placed),
        (LeaseStep::Start, vec![Placed], Running),
        (LeaseStep::Migrate, on_gpus.clone(), Placed),
        (LeaseStep::Requeue, on_gpus.clone(), Queued),
        (LeaseStep::Suspend, on_gpus, Suspended),
        (LeaseStep::RequestResume, vec![Suspended], Requested),
        (LeaseStep::Reject, LeaseState::ALL.to_vec(), Rejected),
        (LeaseStep::End, LeaseState::ALL.to_vec(), Ended),
    ] {
        assert_eq!(LeaseState::before(step), from, "{step:?}");
        for state in LeaseState::ALL {
            let expected = from.contains(&state).then_some(to);
            assert_eq!(state.after(step), expected, "{step:?} from {state}");
        }
    }
}

#[test]
fn given_a_tenant_network_without_an_image_when_decided_then_workload_network_is_named() {
    let mut body = with_workload(&["sh"], None, &[]);
    body.workload.as_mut().unwrap().network = lh_events::WorkloadNetwork::Tenant;
    let (field, _) = refused(body);
    assert_eq!(field, "workload.network");
    let mut body = with_workload(&["sh"], Some("localhost/leasehold/base"), &[]);
    body.workload.as_mut().unwrap().network = lh_events::WorkloadNetwork::Tenant;
    let lease = decide(body).unwrap();
    assert_eq!(
        lease.workload.map(|w| w.network),
        Some(lh_events::WorkloadNetwork::Tenant)
    );
}

fn with_mounts(datasets: &[(&str, &str, &str)], workspaces: &[(&str, &str)]) -> LeaseBody {
    let mut body = with_workload(&["sh"], Some("localhost/leasehold/base"), &[]);
    let w = body.workload.as_mut().unwrap();
    w.datasets = datasets
        .iter()
        .map(|(name, version, path)| lh_events::DatasetMount {
            name: name.to_string(),
            version: version.to_string(),
            bytes: 0,
            path: path.to_string(),
        })
        .collect();
    w.workspaces = workspaces
        .iter()
        .map(|(name, path)| lh_events::WorkspaceMount {
            name: name.to_string(),
            path: path.to_string(),
        })
        .collect();
    body
}

#[test]
fn given_datasets_and_a_workspace_at_good_paths_when_decided_then_they_are_kept() {
    let version = "0f".repeat(32);
    let lease = decide(with_mounts(
        &[("mnist", "", "/data"), ("imagenet", &version, "/mnt/in")],
        &[("ws", "/workspace")],
    ))
    .unwrap();
    let w = lease.workload.unwrap();
    assert_eq!(w.datasets.len(), 2);
    assert_eq!(w.workspaces[0].path, "/workspace");
    assert!(w.uses_storage());
}

#[test]
fn given_a_bad_mount_when_decided_then_its_part_is_named() {
    let cases: Vec<(LeaseBody, &str)> = vec![
        (
            with_mounts(&[("MNIST", "", "/data")], &[]),
            "workload.datasets[0].name",
        ),
        (
            with_mounts(&[("mnist", "", "data")], &[]),
            "workload.datasets[0].path",
        ),
        (
            with_mounts(&[("mnist", "", "/etc/x")], &[]),
            "workload.datasets[0].path",
        ),
        (
            with_mounts(&[("mnist", "v1", "/data")], &[]),
            "workload.datasets[0].version",
        ),
        (
            with_mounts(&[], &[("ws", "/proc")]),
            "workload.workspaces[0].path",
        ),
        (
            with_mounts(&[], &[("ws", "/a"), ("ws", "/b")]),
            "workload.workspaces",
        ),
        (
            with_mounts(&[("d", "", "/w/data")], &[("ws", "/w")]),
            "workload",
        ),
        (
            with_mounts(&[("d", "", "/a"); 9].map(|_| ("d", "", "/a")), &[]),
            "workload.datasets",
        ),
    ];
    for (body, field) in cases {
        assert_eq!(refused(body).0, field);
    }
    // A process lease shares the host's tree: nothing is mounted into it.
    let mut body = with_mounts(&[], &[("ws", "/workspace")]);
    body.workload.as_mut().unwrap().image = None;
    assert_eq!(refused(body).0, "workload.workspaces");
}
