use super::*;
use lh_events::fixtures;

fn workloads(kind: RuntimeKind, hami_core_lib: Option<PathBuf>) -> Workloads {
    let marks = HostMarks {
        node_id: "a".into(),
        state_dir: std::env::temp_dir().join("lh-declare-test"),
    };
    Workloads::with_hami_core(
        kind,
        engine_answering_info(),
        Duration::from_secs(1),
        marks,
        hami_core_lib,
    )
    .unwrap()
    .0
}

/// A CLI that answers `info` as an engine on systemd's cgroups would: an
/// agent refuses a container runtime whose engine does not answer.
fn engine_answering_info() -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("lh-engine-info-{}", std::process::id()));
    if !path.exists() {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, "#!/bin/sh\necho systemd\n").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    Some(path)
}

fn declared(w: &Workloads, mig: bool, fleet: (Isolation, GpuSharing)) -> (Isolation, GpuSharing) {
    let mut r = fixtures::node("a", "z", 2, fixtures::MODEL, 40);
    r.gpus[1].mig = mig;
    (r.isolation, r.gpu_sharing) = fleet;
    w.declare(&mut r);
    (r.isolation, r.gpu_sharing)
}

#[tokio::test]
async fn given_a_runtime_when_the_node_registers_then_it_declares_what_the_runtime_enforces() {
    let fleet = (Isolation::Container, GpuSharing::HamiCore);
    let none = (Isolation::None, GpuSharing::None);
    // The simulated runtime: what the fleet file's node says.
    assert_eq!(
        declared(&workloads(RuntimeKind::Sim, None), false, fleet),
        fleet
    );
    assert_eq!(
        declared(&workloads(RuntimeKind::Sim, None), false, none),
        none
    );
    // docker: a container, whatever the fleet file says.
    let docker = workloads(RuntimeKind::Docker, None);
    assert_eq!(
        declared(&docker, false, none),
        (Isolation::Container, GpuSharing::None)
    );
    assert_eq!(
        declared(&docker, true, fleet),
        (Isolation::Container, GpuSharing::Mig)
    );
    // process: cgroup only where cgroup v2 works, which this host may
    // not have; never a container.
    let process = workloads(RuntimeKind::Process, None);
    let (isolation, sharing) = declared(&process, false, fleet);
    assert_ne!(isolation, Isolation::Container);
    assert_eq!(
        sharing,
        GpuSharing::None,
        "shares' caps would be env vars only"
    );
}

#[tokio::test]
async fn given_a_hami_core_library_when_the_node_registers_then_it_enforces_shares() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libvgpu.so");
    std::fs::write(&lib, b"").unwrap();
    let docker = workloads(RuntimeKind::Docker, Some(lib.clone()));
    let none = (Isolation::None, GpuSharing::None);
    assert_eq!(
        declared(&docker, true, none),
        (Isolation::Container, GpuSharing::HamiCore)
    );
    let marks = HostMarks {
        node_id: "a".into(),
        state_dir: dir.path().into(),
    };
    let missing = Workloads::with_hami_core(
        RuntimeKind::Docker,
        None,
        Duration::from_secs(1),
        marks,
        Some(dir.path().join("nowhere.so")),
    );
    assert!(
        missing.is_err(),
        "a library that is not there enforces nothing"
    );
}
