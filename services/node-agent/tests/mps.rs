//! Shares enforced through CUDA MPS (ADR 016), against a fake
//! `nvidia-cuda-mps-control` and a fake `nvidia-smi` that record what they
//! are told, in order, into one file the workloads also write to: so the
//! order of limits and starts is what the file says. No GPU here.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lh_events::{fixtures, AssignedGpu, GpuSharing, Isolation, WorkloadSpec};
use lh_node_agent::workload::mps::{self, Mps, MpsConfig, MpsLimits};
use lh_node_agent::workload::supervisor::{Finished, HostMarks, RuntimeKind, Workloads};
use tokio::sync::mpsc;
use uuid::Uuid;

const PATIENCE: Duration = Duration::from_secs(10);

fn script(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// A control binary that keeps its daemon as a file in the pipe
/// directory, answers `get_server_list` from `servers` there, and refuses
/// every command while no daemon runs (as the real one does); and an
/// `nvidia-smi` beside it. `broken`: every call fails.
fn fake_binaries(dir: &Path, broken: bool) -> PathBuf {
    let d = dir.display();
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let fail = if broken { "exit 1" } else { ":" };
    script(
        &bin.join("nvidia-cuda-mps-control"),
        &format!(
            r#"#!/bin/sh
umask 000
{fail}
where="gpu=$CUDA_VISIBLE_DEVICES pipe=${{CUDA_MPS_PIPE_DIRECTORY#{d}/}} log=${{CUDA_MPS_LOG_DIRECTORY#{d}/}}"
if [ "$1" = "-d" ]; then
  echo "control -d $where" >> '{d}/calls'
  touch "$CUDA_MPS_PIPE_DIRECTORY/daemon"
  exit 0
fi
read -r cmd
echo "control $cmd $where" >> '{d}/calls'
[ -e "$CUDA_MPS_PIPE_DIRECTORY/daemon" ] || {{ echo "Cannot find MPS control daemon process" >&2; exit 1; }}
case "$cmd" in
  quit) rm -f "$CUDA_MPS_PIPE_DIRECTORY/daemon" ;;
  get_server_list) cat "$CUDA_MPS_PIPE_DIRECTORY/servers" 2>/dev/null || true ;;
  start_server*) echo 4242 > "$CUDA_MPS_PIPE_DIRECTORY/servers" ;;
  get_client_list*) cat "$CUDA_MPS_PIPE_DIRECTORY/clients" 2>/dev/null || true ;;
  get_default_active_thread_percentage) echo 100.0 ;;
esac
"#
        ),
    );
    script(
        &bin.join("nvidia-smi"),
        &format!("#!/bin/sh\numask 000\n{fail}\necho \"nvidia-smi $*\" >> '{d}/calls'\n"),
    );
    bin.join("nvidia-cuda-mps-control")
}

fn calls(dir: &Path) -> Vec<String> {
    fs::read_to_string(dir.join("calls"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

fn mps_in(dir: &Path, broken: bool) -> Option<Mps> {
    let control = fake_binaries(dir, broken);
    mps::for_node(Some(control), &dir.join("state"))
}

fn share(index: u32, uuid: &str, milli: u32, vram_gb: u32) -> AssignedGpu {
    AssignedGpu {
        index,
        uuid: uuid.into(),
        milli: Some(milli),
        vram_gb: Some(vram_gb),
        mig_instance: None,
    }
}

fn command(line: &str) -> WorkloadSpec {
    WorkloadSpec {
        command: vec!["sh".into(), "-c".into(), line.into()],
        image: None,
        env: BTreeMap::new(),
        env_ref: None,
        network: Default::default(),
        template: None,
        datasets: Vec::new(),
        workspaces: Vec::new(),
        object_store: false,
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "waited for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn finished(rx: &mut mpsc::UnboundedReceiver<Finished>) -> Finished {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("a workload ended")
        .expect("the channel is open")
}

#[tokio::test]
async fn given_two_shares_of_one_gpu_when_they_start_then_limits_are_set_before_each_and_the_daemon_quits_after_the_last(
) {
    let dir = lh_testkit::shared_tempdir();
    let d = dir.path().display().to_string();
    let mps = mps_in(dir.path(), false).expect("the probe works");
    let probe = calls(dir.path());
    assert!(
        probe.contains(&"control -d gpu= pipe=state/mps/probe/pipe log=state/mps/probe/log".into())
            && probe.contains(
                &"control get_default_active_thread_percentage gpu= pipe=state/mps/probe/pipe log=state/mps/probe/log"
                    .into()
            )
            && probe.last().unwrap() == "nvidia-smi -L",
        "{probe:?}"
    );
    fs::remove_file(dir.path().join("calls")).unwrap();
    let marks = HostMarks {
        node_id: "node-a".into(),
        state_dir: dir.path().join("state"),
    };
    let (mut workloads, mut ended) =
        Workloads::new(RuntimeKind::Process, None, Duration::from_secs(2), marks).unwrap();
    assert!(workloads.enforce_shares_with_mps(mps));
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());

    // A: 10 GB and 300 milli; it runs until told to end.
    let started = workloads
        .start(
            a,
            1,
            &[share(3, "GPU-a", 300, 10)],
            &[],
            Some(&command(&format!(
                "echo \"workload a $CUDA_MPS_PIPE_DIRECTORY $CUDA_VISIBLE_DEVICES\" >> '{d}/calls'; \
                 while [ ! -e '{d}/end-a' ]; do sleep 0.02; done"
            ))),
        )
        .unwrap();
    assert!(started);
    until("workload a", || {
        calls(dir.path())
            .iter()
            .any(|l| l.starts_with("workload a"))
    })
    .await;
    let w = "gpu=GPU-a pipe=state/mps/gpu3/pipe log=state/mps/gpu3/log";
    // The process runtime runs the shares of GPU 3 as its share user.
    let uid = lh_node_agent::workload::lease_user::gpu_share_uid(3);
    assert_eq!(
        calls(dir.path()),
        [
            "nvidia-smi -i GPU-a -c EXCLUSIVE_PROCESS".to_string(),
            // Nothing answers on the pipe directory: nothing to adopt.
            format!("control get_server_list {w}"),
            format!("control -d {w}"),
            format!("control set_default_device_pinned_mem_limit 0 10G {w}"),
            format!("control set_default_active_thread_percentage 30 {w}"),
            format!("control get_server_list {w}"),
            // No server yet: one is started, so that it holds the GPU first.
            format!("control start_server -uid {uid} {w}"),
            format!("workload a {d}/state/mps/gpu3/pipe GPU-a"),
        ]
    );

    // The server started for A runs. B is smaller in both.
    fs::remove_file(dir.path().join("calls")).unwrap();
    workloads
        .start(
            b,
            1,
            &[share(3, "GPU-a", 250, 4)],
            &[],
            Some(&command(&format!(
                "echo \"workload b $CUDA_MPS_PIPE_DIRECTORY\" >> '{d}/calls'"
            ))),
        )
        .unwrap();
    let end_b = finished(&mut ended).await;
    assert_eq!((end_b.lease_id, end_b.exit.code), (b, Some(0)));
    assert_eq!(
        calls(dir.path()),
        [
            format!("control set_default_device_pinned_mem_limit 0 4G {w}"),
            format!("control set_default_active_thread_percentage 25 {w}"),
            format!("control get_server_list {w}"),
            format!("control set_device_pinned_mem_limit 4242 0 4G {w}"),
            format!("control set_active_thread_percentage 4242 25 {w}"),
            format!("workload b {d}/state/mps/gpu3/pipe"),
        ]
    );

    // B ends: A still holds the GPU, the daemon stays.
    workloads.forget(b, 1);
    assert_eq!(calls(dir.path()).len(), 6, "{:?}", calls(dir.path()));
    fs::write(dir.path().join("end-a"), "").unwrap();
    let end_a = finished(&mut ended).await;
    assert_eq!(end_a.lease_id, a);
    workloads.forget(a, 1);
    assert_eq!(
        calls(dir.path())[6..],
        [
            // No client left on its server: nothing a quit would end.
            format!("control get_server_list {w}"),
            format!("control get_client_list 4242 {w}"),
            format!("control quit {w}"),
            "nvidia-smi -i GPU-a -c DEFAULT".to_string(),
        ]
    );
}

#[tokio::test]
async fn a_whole_gpu_gets_no_mps() {
    let dir = lh_testkit::shared_tempdir();
    let d = dir.path().display().to_string();
    let mps = mps_in(dir.path(), false).unwrap();
    fs::remove_file(dir.path().join("calls")).unwrap();
    let marks = HostMarks {
        node_id: "node-a".into(),
        state_dir: dir.path().join("state"),
    };
    let (mut workloads, mut ended) =
        Workloads::new(RuntimeKind::Process, None, Duration::from_secs(2), marks).unwrap();
    workloads.enforce_shares_with_mps(mps);
    let whole = AssignedGpu {
        milli: None,
        vram_gb: None,
        ..share(0, "GPU-a", 1, 1)
    };
    workloads
        .start(
            Uuid::new_v4(),
            1,
            &[whole],
            &[],
            Some(&command(&format!(
                "echo \"workload [$CUDA_MPS_PIPE_DIRECTORY]\" >> '{d}/calls'"
            ))),
        )
        .unwrap();
    finished(&mut ended).await;
    assert_eq!(calls(dir.path()), ["workload []"]);
}

#[tokio::test]
async fn given_a_daemon_that_answers_when_a_share_starts_then_it_is_adopted_limited_and_not_quit_under_a_client(
) {
    let dir = lh_testkit::shared_tempdir();
    let mut mps = mps_in(dir.path(), false).unwrap();
    // A previous agent's daemon, with a server.
    let pipe = dir.path().join("state/mps/gpu0/pipe");
    fs::create_dir_all(&pipe).unwrap();
    fs::write(pipe.join("daemon"), "").unwrap();
    fs::write(pipe.join("servers"), "77\n").unwrap();
    fs::remove_file(dir.path().join("calls")).unwrap();
    let wants = MpsLimits {
        vram_mib: 1536,
        thread_pct: 12,
    };
    let first = (Uuid::new_v4(), 1);
    let got = mps.prepare(first, 0, "GPU-b", wants).unwrap();
    assert_eq!(got, pipe);
    let calls = calls(dir.path());
    assert!(
        !calls.iter().any(|c| c.starts_with("control -d")),
        "{calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("control set_device_pinned_mem_limit 77 0 1536M")),
        "{calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("control set_active_thread_percentage 77 12")),
        "{calls:?}"
    );
    assert_eq!(mps.limits("GPU-b"), Some(wants));

    // The adopted daemon's server still has a client nobody here started
    // (a share the previous agent ran): the last share's end leaves it be.
    fs::write(pipe.join("clients"), "5150\n").unwrap();
    fs::remove_file(dir.path().join("calls")).unwrap();
    mps.release(first);
    assert_eq!(mps.limits("GPU-b"), None, "no share of ours is left");
    assert!(pipe.join("daemon").exists(), "not quit under a client");
    let calls = self::calls(dir.path());
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("control get_client_list 77")),
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c.starts_with("control quit")),
        "{calls:?}"
    );
    assert!(!calls.iter().any(|c| c.contains("-c DEFAULT")), "{calls:?}");
}

#[tokio::test]
async fn given_a_daemon_that_will_not_start_when_a_share_starts_then_it_does_not_run() {
    let dir = lh_testkit::shared_tempdir();
    let mut mps = mps_in(dir.path(), false).unwrap();
    // nvidia-smi now refuses (not root, say): the GPU cannot be made exclusive.
    script(&dir.path().join("bin/nvidia-smi"), "#!/bin/sh\nexit 9\n");
    let wants = MpsLimits {
        vram_mib: 4096,
        thread_pct: 25,
    };
    let err = mps
        .prepare((Uuid::new_v4(), 1), 0, "GPU-a", wants)
        .unwrap_err();
    assert!(err.to_string().contains("EXCLUSIVE_PROCESS"), "{err}");
    assert_eq!(mps.limits("GPU-a"), None, "nothing hosted");
}

fn declared(workloads: &Workloads) -> GpuSharing {
    let mut r = fixtures::node("a", "z", 2, fixtures::MODEL, 40);
    (r.isolation, r.gpu_sharing) = (Isolation::None, GpuSharing::None);
    workloads.declare(&mut r);
    r.gpu_sharing
}

#[tokio::test]
async fn given_the_control_binary_when_the_node_registers_then_it_declares_mps_only_if_its_probe_works(
) {
    let dir = lh_testkit::shared_tempdir();
    let marks = HostMarks {
        node_id: "node-a".into(),
        state_dir: dir.path().join("state"),
    };
    let new = || {
        Workloads::new(
            RuntimeKind::Process,
            None,
            Duration::from_secs(2),
            marks.clone(),
        )
        .unwrap()
        .0
    };
    let mut working = new();
    assert!(working.enforce_shares_with_mps(mps_in(dir.path(), false).unwrap()));
    assert_eq!(declared(&working), GpuSharing::Mps);

    let missing = MpsConfig::find(Some(dir.path().join("nowhere")), dir.path()).unwrap();
    assert!(Mps::probe(missing).is_err());
    let broken = lh_testkit::shared_tempdir();
    assert!(mps_in(broken.path(), true).is_none());
    assert_eq!(declared(&new()), GpuSharing::None);

    // Nothing runs on a simulated node: it keeps what its fleet file says.
    let (mut sim, _) = Workloads::new(
        RuntimeKind::Sim,
        None,
        Duration::from_secs(2),
        marks.clone(),
    )
    .unwrap();
    assert!(!sim.enforce_shares_with_mps(mps_in(dir.path(), false).unwrap()));
}

/// Starts `lease`'s workload, placement 1, on a share of `gpu`.
fn start_share(workloads: &mut Workloads, lease: Uuid, gpu: AssignedGpu, script: &str) {
    let started = workloads
        .start(lease, 1, &[gpu], &[], Some(&command(script)))
        .unwrap();
    assert!(started);
}

/// The simulated fleet's MPS (`gpu::backend::sim::mps`): what the agent
/// sets is what its clients get. A share's client over its limit gets the
/// allocation error and its lease the cause; the share beside it keeps its
/// memory; a process that skips MPS gets no GPU; a smaller share lowers
/// the limit for clients that connect later only.
#[tokio::test]
async fn given_the_simulated_mps_when_shares_allocate_then_each_gets_its_own_limit_only() {
    use lh_events::LeaseFailure;
    use lh_node_agent::gpu::backend::sim::mps as sim_mps;

    let dir = lh_testkit::shared_tempdir();
    let tools = sim_mps::install(&dir.path().join("tools")).unwrap();
    let mps = mps::for_node(Some(tools.control.clone()), &dir.path().join("state"))
        .expect("the simulated daemon passes the probe");
    let marks = HostMarks {
        node_id: "node-a".into(),
        state_dir: dir.path().join("state"),
    };
    let (mut workloads, mut ended) =
        Workloads::new(RuntimeKind::Process, None, Duration::from_secs(2), marks).unwrap();
    assert!(workloads.enforce_shares_with_mps(mps));
    let alloc = tools.alloc.display().to_string();
    let mode = || fs::read_to_string(tools.compute_modes.join("GPU-s")).unwrap_or_default();
    let (neighbour, greedy, bypass, late) = (
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
    );
    let d = dir.path().display();

    // The neighbour takes 8 of its 10 GiB and holds them while the rest runs.
    start_share(
        &mut workloads,
        neighbour,
        share(0, "GPU-s", 250, 10),
        &format!(
            "'{alloc}' 8192 0.1 && while [ ! -e '{d}/end' ]; do sleep 0.02; done && '{alloc}' 8192"
        ),
    );
    assert_eq!(mode().trim(), "EXCLUSIVE_PROCESS");
    // Asks for 12 GiB of a 10 GiB share.
    start_share(
        &mut workloads,
        greedy,
        share(0, "GPU-s", 250, 10),
        &format!("'{alloc}' 12288"),
    );
    let end = finished(&mut ended).await;
    assert_eq!(
        (end.lease_id, end.exit.code, end.failure),
        (
            greedy,
            Some(sim_mps::OUT_OF_MEMORY_EXIT_CODE),
            Some(LeaseFailure::GpuMemoryExceeded)
        )
    );
    workloads.forget(greedy, 1);
    assert!(
        !dir.path()
            .join(format!("state/stderr/{greedy}-1.log"))
            .exists(),
        "its stderr file went with it"
    );

    // Unsets the pipe directory to get the GPU without limits: no context.
    start_share(
        &mut workloads,
        bypass,
        share(0, "GPU-s", 250, 10),
        &format!("unset CUDA_MPS_PIPE_DIRECTORY; '{alloc}' 1024"),
    );
    let end = finished(&mut ended).await;
    assert_eq!(
        (end.lease_id, end.exit.code, end.failure),
        (
            bypass,
            Some(sim_mps::NO_CONTEXT_EXIT_CODE),
            Some(LeaseFailure::ExitCode)
        )
    );
    workloads.forget(bypass, 1);

    // A smaller share lowers the limit: its own client gets 4 GiB, and so
    // does the neighbour's next client, while its first keeps its 8.
    start_share(
        &mut workloads,
        late,
        share(0, "GPU-s", 100, 4),
        &format!("'{alloc}' 4096 && ! '{alloc}' 4097"),
    );
    let end = finished(&mut ended).await;
    assert_eq!((end.lease_id, end.exit.code), (late, Some(0)));
    workloads.forget(late, 1);
    fs::write(dir.path().join("end"), "").unwrap();
    let end = finished(&mut ended).await;
    assert_eq!(
        (end.lease_id, end.failure),
        (neighbour, Some(LeaseFailure::GpuMemoryExceeded)),
        "its second client connected under the lowered limit"
    );
    workloads.forget(neighbour, 1);
    assert_eq!(mode().trim(), "DEFAULT", "the last share ended");
}

/// A restarted agent takes the daemon of an adopted share back, so that
/// the daemon quits after that share as after any other, and quits a
/// daemon its predecessor left on a GPU with no share.
#[tokio::test]
async fn given_a_restart_when_shares_are_adopted_then_their_daemon_is_taken_back_and_one_left_without_shares_quits(
) {
    use lh_node_agent::gpu::backend::sim::mps as sim_mps;

    let dir = lh_testkit::shared_tempdir();
    let tools = sim_mps::install(&dir.path().join("tools")).unwrap();
    let state = dir.path().join("state");
    let agent = || {
        let mps = mps::for_node(Some(tools.control.clone()), &state).unwrap();
        let marks = HostMarks {
            node_id: "node-a".into(),
            state_dir: state.clone(),
        };
        let (mut workloads, ended) =
            Workloads::new(RuntimeKind::Process, None, Duration::from_secs(2), marks).unwrap();
        assert!(workloads.enforce_shares_with_mps(mps));
        (workloads, ended)
    };
    let mode = |gpu: &str| {
        fs::read_to_string(tools.compute_modes.join(gpu))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let clients = state.join("mps/gpu0/pipe/clients");
    let (kept, left) = (Uuid::new_v4(), Uuid::new_v4());
    let (kept_gpu, left_gpu) = (share(0, "GPU-s", 250, 10), share(1, "GPU-t", 250, 10));

    let (mut before, mut ended_before) = agent();
    let alloc = tools.alloc.display().to_string();
    before
        .start(
            kept,
            1,
            std::slice::from_ref(&kept_gpu),
            &[],
            Some(&command(&format!("'{alloc}' 1024 600"))),
        )
        .unwrap();
    before
        .start(left, 1, &[left_gpu], &[], Some(&command("true")))
        .unwrap();
    // The share on GPU-t ends, but its agent dies before it hears so.
    assert_eq!(finished(&mut ended_before).await.lease_id, left);
    until("the kept share's client", || {
        fs::read_dir(&clients).is_ok_and(|mut d| d.next().is_some())
    })
    .await;
    assert_eq!(
        (mode("GPU-s").as_str(), mode("GPU-t").as_str()),
        ("EXCLUSIVE_PROCESS", "EXCLUSIVE_PROCESS")
    );
    // Dropped, it would stop its workloads: an agent killed does not.
    std::mem::forget(before);

    let (mut after, mut ended) = agent();
    let reconciled = after.reconcile(&HashMap::from([(kept, 1)])).await;
    assert_eq!(reconciled.adopted, [(kept, 1)]);
    after.reconcile_shares(&reconciled.adopted, &HashMap::from([(kept, kept_gpu)]));
    assert_eq!(mode("GPU-t"), "DEFAULT", "no share is left on GPU-t");
    assert!(!state.join("mps/gpu1/pipe/daemon").exists());
    assert_eq!(mode("GPU-s"), "EXCLUSIVE_PROCESS", "the kept share runs");
    assert_eq!(
        after.mps_limits("GPU-s"),
        Some(MpsLimits {
            vram_mib: 10 * 1024,
            thread_pct: 25
        })
    );

    assert!(after.stop(kept));
    assert_eq!(finished(&mut ended).await.lease_id, kept);
    after.forget(kept, 1);
    assert_eq!(mode("GPU-s"), "DEFAULT", "its last share ended");
    assert!(!state.join("mps/gpu0/pipe/daemon").exists());
}
