//! A restarted node-agent and the workloads its previous incarnation left,
//! with real processes: the previous agent is this test binary run again
//! as [`previous_agent`], which starts a workload through the process
//! runtime and is then killed with SIGKILL, leaving its workload running as
//! a crashed agent would. The restarted agent's workload side
//! ([`Workloads::reconcile`]) then adopts or stops what it finds.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lh_events::{AssignedGpu, WorkloadSpec};
use lh_node_agent::workload::reconcile::{self, ProcessRecord};
use lh_node_agent::workload::supervisor::{Finished, HostMarks, Workloads};
use lh_node_agent::RuntimeKind;
use tokio::sync::mpsc::UnboundedReceiver;
use uuid::Uuid;

const NODE: &str = "node-a";
const PLACEMENT: u64 = 10;
const ENV_STATE_DIR: &str = "LH_TEST_PREVIOUS_AGENT_STATE_DIR";
const ENV_LEASE: &str = "LH_TEST_PREVIOUS_AGENT_LEASE";
const ENV_COMMAND: &str = "LH_TEST_PREVIOUS_AGENT_COMMAND";
/// How long anything awaited here may take.
const PATIENCE: Duration = Duration::from_secs(10);

fn gpus() -> Vec<AssignedGpu> {
    vec![AssignedGpu {
        index: 0,
        uuid: "GPU-0".into(),
        milli: None,
        vram_gb: None,
        mig_instance: None,
    }]
}

fn workloads(state_dir: &Path) -> (Workloads, UnboundedReceiver<Finished>) {
    let marks = HostMarks {
        node_id: NODE.into(),
        state_dir: state_dir.to_path_buf(),
    };
    Workloads::new(RuntimeKind::Process, None, Duration::from_secs(2), marks).unwrap()
}

/// The previous agent: starts the lease's workload and runs until killed.
/// Only run by [`kill_agent_after_start`].
#[test]
#[ignore = "the agent the other tests kill; they run it"]
fn previous_agent() {
    let state_dir = PathBuf::from(std::env::var(ENV_STATE_DIR).unwrap());
    let lease_id: Uuid = std::env::var(ENV_LEASE).unwrap().parse().unwrap();
    let command = std::env::var(ENV_COMMAND).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (mut workloads, _finished) = workloads(&state_dir);
        let spec = WorkloadSpec {
            command: vec!["sh".into(), "-c".into(), command],
            image: None,
            env: Default::default(),
            env_ref: None,
            network: Default::default(),
            template: None,
            datasets: Vec::new(),
            workspaces: Vec::new(),
            object_store: false,
        };
        assert!(workloads
            .start(lease_id, PLACEMENT, &gpus(), &[], Some(&spec))
            .unwrap());
        std::future::pending::<()>().await
    });
}

/// Runs [`previous_agent`] with `command` as the lease's workload, waits
/// for its record, kills the agent with SIGKILL and returns the record.
fn kill_agent_after_start(state_dir: &Path, lease_id: Uuid, command: &str) -> ProcessRecord {
    let mut agent: Child = Command::new(std::env::current_exe().unwrap())
        .args(["previous_agent", "--exact", "--ignored", "--nocapture"])
        .env(ENV_STATE_DIR, state_dir)
        .env(ENV_LEASE, lease_id.to_string())
        .env(ENV_COMMAND, command)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let record = loop {
        if let Some(record) = records(state_dir).into_iter().next() {
            break record;
        }
        assert!(
            Instant::now() < deadline,
            "the previous agent recorded nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    agent.kill().unwrap();
    agent.wait().unwrap();
    record
}

fn records(state_dir: &Path) -> Vec<ProcessRecord> {
    let Ok(entries) = fs::read_dir(state_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| serde_json::from_slice(&fs::read(e.path()).ok()?).ok())
        .collect()
}

/// Pids of the processes whose environment names `lease_id`.
fn processes_of(lease_id: Uuid) -> Vec<i32> {
    let mark = format!("LEASEHOLD_LEASE_ID={lease_id}");
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let live = reconcile::process_start_ticks(*pid).is_some();
            let environ = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            live && environ.split(|b| *b == 0).any(|v| v == mark.as_bytes())
        })
        .collect()
}

async fn assert_gone(record: &ProcessRecord) {
    let deadline = Instant::now() + PATIENCE;
    while reconcile::is_alive(record.pid, record.start_ticks) {
        assert!(Instant::now() < deadline, "pid {} still runs", record.pid);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn next_finished(finished: &mut UnboundedReceiver<Finished>) -> Finished {
    tokio::time::timeout(PATIENCE, finished.recv())
        .await
        .expect("a workload ended in time")
        .unwrap()
}

#[tokio::test]
async fn the_workload_of_a_lease_still_placed_here_is_adopted_not_started_again() {
    let state = lh_testkit::shared_tempdir();
    let lease_id = Uuid::new_v4();
    let record = kill_agent_after_start(state.path(), lease_id, "exec sleep 300");
    assert_eq!(
        processes_of(lease_id),
        [record.pid],
        "it outlived its agent"
    );

    let (mut workloads, mut finished) = workloads(state.path());
    let reconciled = workloads
        .reconcile(&HashMap::from([(lease_id, PLACEMENT)]))
        .await;
    assert_eq!(reconciled.adopted, [(lease_id, PLACEMENT)]);
    assert_eq!(reconciled.reaped, 0);
    // What the workload side asks before it starts a lease's workload.
    assert!(workloads.is_running(lease_id, PLACEMENT));
    assert_eq!(processes_of(lease_id), [record.pid], "no second copy");

    // Supervised again: a stop reaches it, and its end is reported.
    assert!(workloads.stop(lease_id));
    let ended = next_finished(&mut finished).await;
    assert_eq!((ended.lease_id, ended.placement), (lease_id, PLACEMENT));
    assert_gone(&record).await;
    assert!(records(state.path()).is_empty(), "its record went with it");
}

/// Processes whose real uid is `uid`.
fn processes_of_uid(uid: u32) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            reconcile::process_start_ticks(*pid).is_some()
                && fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == uid)
        })
        .collect()
}

/// Whether another agent could claim `uid` now.
fn claimable(uid: u32) -> bool {
    use std::os::fd::AsRawFd;
    let path =
        Path::new(lh_node_agent::workload::lease_user::LEASE_USER_CLAIMS_DIR).join(uid.to_string());
    let Ok(file) = fs::OpenOptions::new().write(true).open(path) else {
        return true;
    };
    // SAFETY: flock(2) on a descriptor this function owns.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// An adopted workload holds its lease user as a started one does: no
/// other lease may take it while it runs, and its end kills every process
/// of it (one that left its process group too) and removes its home.
#[tokio::test]
async fn an_adopted_workload_keeps_its_user_until_it_ends_and_takes_all_of_it_along() {
    use std::os::unix::fs::MetadataExt;
    let state = lh_testkit::shared_tempdir();
    let lease_id = Uuid::new_v4();
    let record = kill_agent_after_start(
        state.path(),
        lease_id,
        "setsid sleep 300 </dev/null >/dev/null 2>&1 & exec sleep 300",
    );
    let uid = fs::metadata(format!("/proc/{}", record.pid)).unwrap().uid();
    assert!(uid >= lh_node_agent::workload::lease_user::FIRST_LEASE_UID);
    let home = state
        .path()
        .join(lh_node_agent::workload::lease_user::LEASE_HOMES_DIR)
        .join(lease_id.to_string());
    assert!(home.is_dir());
    let deadline = Instant::now() + PATIENCE;
    while processes_of_uid(uid).len() < 2 {
        assert!(Instant::now() < deadline, "the escaped child never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(claimable(uid), "the killed agent let go of its claim");

    let (mut workloads, mut finished) = workloads(state.path());
    let reconciled = workloads
        .reconcile(&HashMap::from([(lease_id, PLACEMENT)]))
        .await;
    assert_eq!(reconciled.adopted, [(lease_id, PLACEMENT)]);
    assert!(
        !claimable(uid),
        "an adopted workload's user is claimed again"
    );

    assert!(workloads.stop(lease_id));
    next_finished(&mut finished).await;
    assert_gone(&record).await;
    let deadline = Instant::now() + PATIENCE;
    while !processes_of_uid(uid).is_empty() || home.exists() {
        assert!(
            Instant::now() < deadline,
            "left of uid {uid}: {:?}, home {}",
            processes_of_uid(uid),
            home.exists()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(claimable(uid), "free again once nothing of it is left");
}

#[tokio::test]
async fn an_adopted_workload_that_exits_by_itself_is_reported() {
    let state = lh_testkit::shared_tempdir();
    let lease_id = Uuid::new_v4();
    let record = kill_agent_after_start(state.path(), lease_id, "sleep 1");
    let (mut workloads, mut finished) = workloads(state.path());
    let reconciled = workloads
        .reconcile(&HashMap::from([(lease_id, PLACEMENT)]))
        .await;
    assert_eq!(reconciled.adopted, [(lease_id, PLACEMENT)]);
    let ended = next_finished(&mut finished).await;
    assert_eq!(ended.lease_id, lease_id);
    // Not the agent's child any more: how it ended cannot be known.
    assert_eq!((ended.exit.code, ended.exit.signal), (None, None));
    assert!(!reconcile::is_alive(record.pid, record.start_ticks));
}

#[tokio::test]
async fn the_workload_of_a_lease_ended_or_moved_away_is_stopped() {
    let state = lh_testkit::shared_tempdir();
    let lease_id = Uuid::new_v4();
    let record = kill_agent_after_start(state.path(), lease_id, "exec sleep 300");
    let (mut workloads, _finished) = workloads(state.path());
    // The fold holds no lease placed here: it ended, or moved to another
    // node, while the agent was down.
    let reconciled = workloads.reconcile(&HashMap::new()).await;
    assert!(reconciled.adopted.is_empty());
    assert_eq!(reconciled.reaped, 1);
    assert!(!workloads.is_running(lease_id, PLACEMENT));
    assert_gone(&record).await;
    assert!(processes_of(lease_id).is_empty());
    let deadline = Instant::now() + PATIENCE;
    while !records(state.path()).is_empty() {
        assert!(Instant::now() < deadline, "the record stays");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_orphan_of_no_known_lease_or_an_old_placement_is_stopped() {
    let state = lh_testkit::shared_tempdir();
    let (orphan, moved) = (Uuid::new_v4(), Uuid::new_v4());
    let orphan_record = kill_agent_after_start(state.path(), orphan, "exec sleep 300");
    let moved_dir = lh_testkit::shared_tempdir();
    let moved_record = kill_agent_after_start(moved_dir.path(), moved, "exec sleep 300");
    // Both records in the one state directory.
    fs::rename(
        moved_dir.path().join(moved_record.file_name()),
        state.path().join(moved_record.file_name()),
    )
    .unwrap();
    let (mut workloads, _finished) = workloads(state.path());
    // `moved` is placed here again, on other GPUs (a later placement).
    let placed_here = HashMap::from([(moved, PLACEMENT + 5), (Uuid::new_v4(), 3)]);
    let reconciled = workloads.reconcile(&placed_here).await;
    assert!(reconciled.adopted.is_empty());
    assert_eq!(reconciled.reaped, 2);
    assert_gone(&orphan_record).await;
    assert_gone(&moved_record).await;
}

#[tokio::test]
async fn a_sweep_stops_what_the_agent_does_not_supervise_and_nothing_it_does() {
    let state = lh_testkit::shared_tempdir();
    let kept = Uuid::new_v4();
    // It ignores SIGTERM (an ignored signal stays ignored across exec), so
    // that it is still there, stopping, through its grace.
    let kept_record = kill_agent_after_start(state.path(), kept, "trap '' TERM; exec sleep 300");
    let (mut workloads, _finished) = workloads(state.path());
    let reconciled = workloads
        .reconcile(&HashMap::from([(kept, PLACEMENT)]))
        .await;
    assert_eq!(reconciled.adopted, [(kept, PLACEMENT)]);
    assert_eq!(
        workloads.sweep_orphans().await,
        0,
        "nothing unsupervised yet"
    );

    // A workload of this node appears that the agent never started or was
    // told to forget (its lease ended by a report it obeyed while it
    // could not stop it): the next sweep stops it, and only it.
    let stray = Uuid::new_v4();
    let stray_dir = lh_testkit::shared_tempdir();
    let stray_record = kill_agent_after_start(stray_dir.path(), stray, "exec sleep 300");
    fs::rename(
        stray_dir.path().join(stray_record.file_name()),
        state.path().join(stray_record.file_name()),
    )
    .unwrap();
    assert_eq!(workloads.sweep_orphans().await, 1);
    assert_gone(&stray_record).await;
    assert!(workloads.is_running(kept, PLACEMENT));
    assert_eq!(
        processes_of(kept),
        [kept_record.pid],
        "the supervised one runs on"
    );
    // Within its stop's grace it is still the agent's: a sweep leaves it.
    assert!(workloads.stop(kept));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        processes_of(kept),
        [kept_record.pid],
        "it outlives SIGTERM through its grace"
    );
    assert_eq!(
        workloads.sweep_orphans().await,
        0,
        "a stopping workload was swept"
    );
    // A reap kills in the background: give one the time it would take.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        processes_of(kept),
        [kept_record.pid],
        "the sweep killed a workload the agent is stopping"
    );
    assert_gone(&kept_record).await;
}

#[tokio::test]
async fn a_recorded_pid_now_held_by_an_unrelated_process_is_not_killed() {
    let state = lh_testkit::shared_tempdir();
    let mut unrelated = Command::new("sleep").arg("300").spawn().unwrap();
    let pid = unrelated.id() as i32;
    let ticks = reconcile::process_start_ticks(pid).unwrap();
    // The recorded workload ran under this pid before: it started earlier.
    let lease_id = Uuid::new_v4();
    let stale = ProcessRecord {
        node_id: NODE.into(),
        lease_id,
        placement: PLACEMENT,
        pid,
        start_ticks: ticks - 1,
    };
    let (mut workloads, _finished) = workloads(state.path());
    for placed_here in [HashMap::new(), HashMap::from([(lease_id, PLACEMENT)])] {
        stale.write(state.path()).unwrap();
        let reconciled = workloads.reconcile(&placed_here).await;
        assert_eq!(reconciled, Default::default(), "{placed_here:?}");
        assert!(records(state.path()).is_empty(), "the record is forgotten");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        unrelated.try_wait().unwrap().is_none(),
        "the unrelated process was killed"
    );
    assert!(reconcile::is_alive(pid, ticks));
    unrelated.kill().unwrap();
    unrelated.wait().unwrap();
}

// ---- containers, against a fake CLI (no container engine runs here) -------

/// Writes `dir/docker`, which appends each call's arguments to `dir/calls`;
/// `ps` prints `dir/ps.out`; `wait <name>` waits for `dir/exit-<name>` and
/// prints it; `stop` writes 143 there.
fn fake_cli(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = dir.display();
    let script = format!(
        r#"#!/bin/sh
echo "$*" >> '{d}/calls'
case "$1" in
  info) echo systemd ;;
  ps) cat '{d}/ps.out' ;;
  wait) while [ ! -e "{d}/exit-$2" ]; do sleep 0.02; done; cat "{d}/exit-$2" ;;
  stop) echo 143 > "{d}/exit-$4" ;;
esac
"#
    );
    let path = dir.join("docker");
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn containers_of_this_node_are_adopted_or_stopped_and_removed() {
    let dir = lh_testkit::shared_tempdir();
    let cli = fake_cli(dir.path());
    let (kept, gone) = (Uuid::new_v4(), Uuid::new_v4());
    fs::write(dir.path().join("ps.out"), format!("lh-{kept}\nlh-{gone}\n")).unwrap();
    let marks = HostMarks {
        node_id: NODE.into(),
        state_dir: dir.path().join("state"),
    };
    let (mut workloads, mut finished) = Workloads::new(
        RuntimeKind::Docker,
        Some(cli),
        Duration::from_secs(2),
        marks,
    )
    .unwrap();
    // The previous agent's env files, one per container.
    let env_dir = dir.path().join("state").join("env");
    fs::create_dir_all(&env_dir).unwrap();
    let env_file = |lease: Uuid| env_dir.join(format!("lh-{lease}.env"));
    for lease in [kept, gone] {
        fs::write(env_file(lease), "TOKEN=x\n").unwrap();
    }
    let reconciled = workloads
        .reconcile(&HashMap::from([(kept, PLACEMENT)]))
        .await;
    assert_eq!(reconciled.adopted, [(kept, PLACEMENT)]);
    assert_eq!(reconciled.reaped, 1);
    assert!(workloads.is_running(kept, PLACEMENT));
    let calls = || fs::read_to_string(dir.path().join("calls")).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while !calls().contains(&format!("rm --force lh-{gone}")) {
        assert!(Instant::now() < deadline, "{}", calls());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls = calls();
    let lines: Vec<&str> = calls.lines().collect();
    assert_eq!(lines[0], "info --format {{.CgroupDriver}}");
    assert_eq!(
        lines[1],
        "ps --all --filter label=leasehold.node=node-a --filter label=leasehold.lease --format {{.Names}}"
    );
    assert!(lines.contains(&format!("stop --timeout 2 lh-{gone}").as_str()));
    assert!(!calls.contains(&format!("stop --timeout 2 lh-{kept}")));
    // The adopted container's exit code comes through `wait`.
    fs::write(dir.path().join(format!("exit-lh-{kept}")), "3\n").unwrap();
    let ended = next_finished(&mut finished).await;
    assert_eq!((ended.lease_id, ended.exit.code), (kept, Some(3)));
    // Neither container's tenant variables stay on the host.
    let deadline = Instant::now() + PATIENCE;
    while env_file(gone).exists() {
        assert!(
            Instant::now() < deadline,
            "the stopped container's env file"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!env_file(kept).exists(), "the adopted container's env file");
}

// ---- the whole agent, on a real log --------------------------------------

const FLEET: &str = "[[node]]\nid = \"node-a\"\nzone = \"z\"\nhostname = \"a\"\ngpu_model = \"A100-40GB\"\ngpu_count = 2\nvram_gb = 40\n";

struct OnLog {
    nats: lh_testkit::Nats,
    bus: lh_bus::Bus,
    dir: tempfile::TempDir,
    lease_id: Uuid,
    /// The scheduler's writer of the nodes' views: all an agent reads.
    _views: lh_service::AbortOnDrop<()>,
}

impl OnLog {
    /// A log on a nats-server of its own, the scheduler's views writer on
    /// it, `fleet` (one node) written beside, and a new lease id.
    async fn start(fleet: &str) -> OnLog {
        let nats = lh_testkit::Nats::start().await.unwrap();
        let bus = lh_bus::Bus::connect(&lh_bus::BusConfig::new(nats.url(), "test"))
            .await
            .unwrap();
        let views = tokio::spawn(lh_scheduler::node_view::run(
            bus.clone(),
            chrono::Duration::seconds(30),
            lh_service::CancellationToken::new(),
        ));
        let on_log = OnLog {
            nats,
            bus,
            dir: lh_testkit::shared_tempdir(),
            lease_id: Uuid::now_v7(),
            _views: lh_service::AbortOnDrop(views),
        };
        fs::write(on_log.fleet(), fleet).unwrap();
        on_log
    }

    /// The agent binary of node `node` on podman, its output in `log`
    /// beside the fleet: one the test kills with SIGKILL.
    fn podman_agent(&self, node: &str, log: &str) -> Command {
        let mut agent = Command::new(env!("CARGO_BIN_EXE_lh-node-agent"));
        agent
            .arg("--nats-url")
            .arg(self.nats.url())
            .args([
                "--http-addr",
                "127.0.0.1:0",
                "--node-id",
                node,
                "--runtime",
                "podman",
            ])
            .args(PODMAN_ARGS.iter().flat_map(|a| ["--container-cli-arg", a]))
            .arg("--fleet-file")
            .arg(self.fleet())
            .arg("--state-dir")
            .arg(self.state_dir())
            .stdout(fs::File::create(self.dir.path().join(log)).unwrap())
            .stderr(Stdio::null());
        agent
    }

    /// The settings of an agent of node `node` on podman, started in this
    /// process.
    fn podman_config(&self, node: &str) -> lh_node_agent::Config {
        lh_node_agent::Config {
            runtime: RuntimeKind::Podman,
            container_cli_args: PODMAN_ARGS.map(String::from).into(),
            state_dir: self.state_dir(),
            stop_grace_secs: 2,
            ..lh_node_agent::Config::for_test(&self.nats.url(), self.fleet(), node)
        }
    }

    fn fleet(&self) -> PathBuf {
        self.dir.path().join("fleet.toml")
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    async fn publish(&self, data: lh_events::EventData) {
        let envelope = lh_events::fixtures::by_owner(data);
        self.bus
            .publish(&envelope, lh_bus::Expect::Any)
            .await
            .unwrap();
    }

    /// The lease's events on the log, oldest first.
    async fn lease_events(&self) -> Vec<lh_events::EventData> {
        let head = self.bus.last_sequence().await.unwrap();
        let subject = lh_events::subject::guarded(&lh_events::subject::lease(self.lease_id));
        let mut feed = self.bus.feed(&[subject.as_str()], 1).await.unwrap();
        let mut events = Vec::new();
        while let Some(Ok(e)) = feed.next_within(Duration::from_millis(300)).await {
            events.push(e.envelope.data);
            if e.sequence >= head {
                break;
            }
        }
        events
    }

    async fn wait_for_event(&self, event_type: &str) -> lh_events::EventData {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let events = self.lease_events().await;
            if let Some(e) = events.into_iter().find(|e| e.event_type() == event_type) {
                return e;
            }
            assert!(Instant::now() < deadline, "no {event_type} on the log");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A log with a lease that runs `exec sleep 300` placed on node-a, whose
/// agent (the binary, a process of its own) started it and was then killed
/// with SIGKILL. Returns the workload's record.
async fn killed_agent_with_a_running_lease() -> (OnLog, ProcessRecord) {
    let on_log = killed_agent_running("exec sleep 300").await;
    let record = records(&on_log.state_dir()).pop().expect("a record");
    assert_eq!(
        processes_of(on_log.lease_id),
        [record.pid],
        "it outlived its agent"
    );
    (on_log, record)
}

/// A log with a lease that runs `sh -c command` placed on node-a, whose
/// agent started it and was then killed with SIGKILL.
async fn killed_agent_running(command: &str) -> OnLog {
    let on_log = OnLog::start(FLEET).await;
    let request = lh_events::LeaseRequested {
        workload: Some(WorkloadSpec {
            command: ["sh", "-c", command].map(String::from).into(),
            image: None,
            env: Default::default(),
            env_ref: None,
            network: Default::default(),
            template: None,
            datasets: Vec::new(),
            workspaces: Vec::new(),
            object_store: false,
        }),
        ..lh_events::fixtures::whole_request(on_log.lease_id, Uuid::now_v7(), 1, "A100-40GB")
    };
    on_log
        .publish(lh_events::EventData::LeaseRequested(request))
        .await;
    let placed = lh_events::fixtures::placed(on_log.lease_id, NODE, "z", "A100-40GB", 40, &[0]);
    on_log
        .publish(lh_events::EventData::LeasePlaced(placed))
        .await;
    let mut agent = Command::new(env!("CARGO_BIN_EXE_lh-node-agent"))
        .arg("--nats-url")
        .arg(on_log.nats.url())
        .args([
            "--http-addr",
            "127.0.0.1:0",
            "--node-id",
            NODE,
            "--runtime",
            "process",
        ])
        .arg("--fleet-file")
        .arg(on_log.fleet())
        .arg("--state-dir")
        .arg(on_log.state_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    on_log.wait_for_event("lease.started").await;
    agent.kill().unwrap();
    agent.wait().unwrap();
    on_log
}

async fn restarted_agent(on_log: &OnLog) -> (lh_service::CancellationToken, lh_service::Running) {
    let token = lh_service::CancellationToken::new();
    let config = lh_node_agent::Config {
        runtime: RuntimeKind::Process,
        state_dir: on_log.state_dir(),
        stop_grace_secs: 2,
        ..lh_node_agent::Config::for_test(&on_log.nats.url(), on_log.fleet(), NODE)
    };
    let running = lh_node_agent::start(config, token.clone()).await.unwrap();
    (token, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_adopts_its_lease_s_workload_and_a_stop_reaches_it() {
    let (on_log, record) = killed_agent_with_a_running_lease().await;
    let (token, running) = restarted_agent(&on_log).await;
    // Running for a while, it starts no second copy.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(processes_of(on_log.lease_id), [record.pid]);
    }
    let stop = lh_events::LeaseStopRequested {
        lease_id: on_log.lease_id,
    };
    on_log
        .publish(lh_events::EventData::LeaseStopRequested(stop))
        .await;
    match on_log.wait_for_event("lease.ended").await {
        lh_events::EventData::LeaseEnded(e) => {
            assert_eq!(e.reason, lh_events::EndReason::Stopped)
        }
        other => panic!("{other:?}"),
    }
    assert_gone(&record).await;
    token.cancel();
    running.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_stops_the_workload_of_a_lease_moved_away() {
    let (on_log, record) = killed_agent_with_a_running_lease().await;
    let moved = lh_events::LeaseMigrated {
        lease_id: on_log.lease_id,
        reason: "node lost".into(),
        from_node_id: NODE.into(),
        from_gpu_indices: vec![0],
        billing_ends_at: chrono::Utc::now(),
        to: None,
    };
    on_log
        .publish(lh_events::EventData::LeaseMigrated(moved))
        .await;
    let (token, running) = restarted_agent(&on_log).await;
    assert_gone(&record).await;
    assert!(processes_of(on_log.lease_id).is_empty());
    token.cancel();
    running.wait().await.unwrap();
    let ended = on_log.lease_events().await;
    assert!(
        !ended.iter().any(|e| e.event_type() == "lease.ended"),
        "the lease goes on elsewhere"
    );
}

/// On the process runtime, a NATS seed that leases could read is refused
/// before anything runs (nextest runs each test in a process of its own,
/// so the variable is this test's alone).
#[tokio::test]
async fn an_agent_on_the_process_runtime_refuses_a_seed_others_may_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = lh_testkit::shared_tempdir();
    fs::write(dir.path().join("fleet.toml"), FLEET).unwrap();
    let seed = dir.path().join("node.nk");
    fs::write(&seed, "SUAX\n").unwrap();
    fs::set_permissions(&seed, fs::Permissions::from_mode(0o644)).unwrap();
    std::env::set_var(lh_bus::ENV_NATS_NKEY_SEED_FILE, &seed);
    let config = lh_node_agent::Config {
        runtime: RuntimeKind::Process,
        state_dir: dir.path().join("state"),
        ..lh_node_agent::Config::for_test("nats://127.0.0.1:1", dir.path().join("fleet.toml"), NODE)
    };
    let err = lh_node_agent::start(config.clone(), lh_service::CancellationToken::new())
        .await
        .err()
        .expect("a readable seed is refused")
        .to_string();
    assert!(err.contains("chmod 600"), "{err}");
    assert!(err.contains(lh_bus::ENV_NATS_NKEY_SEED_FILE), "{err}");
    // The simulated runtime runs no workload: nothing to keep it from.
    let sim = lh_node_agent::Config {
        runtime: RuntimeKind::Sim,
        ..config
    };
    let started = tokio::time::timeout(
        Duration::from_millis(500),
        lh_node_agent::start(sim, lh_service::CancellationToken::new()),
    )
    .await;
    if let Ok(Err(e)) = started {
        assert!(!e.to_string().contains("chmod 600"), "{e}");
    }
}

#[tokio::test]
async fn a_node_id_that_is_not_its_own_subject_token_is_refused_at_start() {
    for id in ["gpu.1", "gpu 1", "gpu*", ""] {
        let config = lh_node_agent::Config::for_test(
            "nats://127.0.0.1:1",
            std::path::PathBuf::from("dev/fleet.toml"),
            id,
        );
        let err = lh_node_agent::start(config, lh_service::CancellationToken::new())
            .await
            .err()
            .unwrap_or_else(|| panic!("{id:?} started"))
            .to_string();
        assert!(err.contains("--node-id"), "{id:?}: {err}");
    }
}

/// Reads the lease's whole log from node-a over the bus, as the gateway
/// does.
async fn read_log_of(on_log: &OnLog) -> lh_rpc::lease_logs::LeaseLogs {
    let request = lh_rpc::lease_logs::LeaseLogsRequest {
        lease_id: on_log.lease_id,
        offset: 0,
        tail: None,
        max_bytes: None,
        placement: None,
    };
    // A restarted agent answers once it has subscribed, a moment after it
    // started: until then the request finds no responder.
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        match lh_rpc::lease_logs::fetch(&on_log.bus, NODE, &request, PATIENCE).await {
            Ok(lh_rpc::lease_logs::LeaseLogsReply::Logs(logs)) => return logs,
            Ok(other) => panic!("{other:?}"),
            Err(e)
                if e.to_string().contains("no responders")
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// The numbers of the whole `tick N` lines of a log.
fn ticks(data: &str) -> Vec<u64> {
    data.split_inclusive('\n')
        .filter_map(|l| l.strip_prefix("tick ")?.strip_suffix('\n')?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_s_log_survives_its_agent_s_restart_and_the_new_agent_serves_it() {
    let on_log =
        killed_agent_running("i=0; while true; do i=$((i+1)); echo \"tick $i\"; sleep 0.05; done")
            .await;
    // It writes on while no agent runs.
    let log = lh_node_agent::workload::lease_log::path(
        &on_log.state_dir(),
        on_log.lease_id,
        // The placement of `fixtures::placed`, as the records name it.
        records(&on_log.state_dir())
            .pop()
            .expect("a record")
            .placement,
    );
    let while_dead = fs::read_to_string(&log).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while fs::read_to_string(&log).unwrap().len() <= while_dead.len() {
        assert!(Instant::now() < deadline, "the workload stopped writing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (token, running) = restarted_agent(&on_log).await;
    let deadline = Instant::now() + PATIENCE;
    let served = loop {
        let logs = read_log_of(&on_log).await;
        if ticks(&logs.data).len() > ticks(&while_dead).len() + 5 {
            break logs;
        }
        assert!(Instant::now() < deadline, "{logs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let numbers = ticks(&served.data);
    assert_eq!(numbers, (1..=numbers.len() as u64).collect::<Vec<_>>());
    assert!(!served.finished);
    on_log
        .publish(lh_events::EventData::LeaseStopRequested(
            lh_events::LeaseStopRequested {
                lease_id: on_log.lease_id,
            },
        ))
        .await;
    on_log.wait_for_event("lease.ended").await;
    let deadline = Instant::now() + PATIENCE;
    while !read_log_of(&on_log).await.finished {
        assert!(Instant::now() < deadline, "the log is not marked ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(log.exists(), "kept after the workload ended");
    token.cancel();
    running.wait().await.unwrap();
}

#[test]
fn a_bad_setting_ends_the_agent_with_status_1_and_one_line_that_names_it() {
    let output = Command::new(env!("CARGO_BIN_EXE_lh-node-agent"))
        .args(["--nats-url", "nats://127.0.0.1:1", "--node-id", "gpu.1"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("lh-node-agent: "))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains("--node-id \"gpu.1\""), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
}

// ---- an adopted container's data, on podman and a real store -------------

/// Makes the image the container tests run, `localhost/leasehold/base`.
fn base_image() {
    let made = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/images.sh"
    ))
    .arg("base")
    .status()
    .unwrap();
    assert!(made.success(), "scripts/images.sh base");
}

/// What the container of the data test runs: every half second it counts
/// on in its workspace and puts the count to its tenant's bucket through
/// its relay (a put that fails, while no agent relays, is skipped).
const BEAT: &str = r#"n=0
while true; do
  n=$((n + 1)); echo "$n" > /workspace/ckpt
  curl -sS -m 2 -o /dev/null --aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
    -T /workspace/ckpt "$AWS_ENDPOINT_URL/$LH_BUCKET/beat.txt" 2>/dev/null
  sleep 0.5
done"#;

const PODMAN_ARGS: [&str; 4] = ["--cgroup-manager", "cgroupfs", "--runtime", "runc"];

/// The count the container last put, as the bucket holds it.
async fn beat(store: &lh_storage::TenantStore) -> u64 {
    match store.get("beat.txt").await {
        Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).trim().parse().unwrap_or(0),
        _ => 0,
    }
}

async fn wait_beat_over(store: &lh_storage::TenantStore, over: u64, what: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let n = beat(store).await;
        if n > over {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "never {what}: the beat stays at {n}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A container with a workspace and the store, started by an agent (the
/// binary, on podman) that is then killed with SIGKILL: its relay goes with
/// it, and nothing syncs its workspace. The restarted agent adopts the
/// container, asks the gateway (played here, on the bus) for the tenant's
/// storage again, opens the relay again and syncs the workspace at the
/// lease's end. Before, an agent's restart lost what the workload wrote
/// after the last periodic sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_agent_finds_an_adopted_containers_workspace_and_relay_again() {
    use lh_rpc::workload_env::{StorageGrant, WorkloadEnvReply, WorkloadEnvRequest};
    base_image();
    let s3 = lh_testkit::S3Store::start().await.unwrap();
    let config = lh_storage::StoreConfig::new(s3.endpoint());
    let (admin_key, admin_secret) = s3.admin_keys();
    let admin = lh_storage::Admin::new(
        &config,
        lh_storage::Credentials::new(admin_key, admin_secret),
    )
    .unwrap();
    let tenant_id = Uuid::now_v7();
    let bucket = format!("lh-t-{}", tenant_id.simple());
    admin.ensure_bucket(&bucket).await.unwrap();
    let credentials = admin
        .ensure_tenant_identity(&bucket, &bucket)
        .await
        .unwrap();
    let store = lh_storage::TenantStore::new(&config, &bucket, &credentials).unwrap();
    let grant = StorageGrant {
        endpoint: s3.endpoint(),
        region: config.region.clone(),
        bucket: bucket.clone(),
        access_key_id: credentials.access_key_id.clone(),
        secret_access_key: credentials.secret_access_key.clone(),
        allow_http: false,
    };

    let on_log = OnLog::start(FLEET).await;
    // The gateway's part: the tenant's storage to the node that asks.
    let answers = on_log.bus.clone();
    let gateway = lh_service::AbortOnDrop(tokio::spawn(async move {
        let _ = lh_bus::rpc::serve(
            &answers,
            &lh_events::subject::rpc_workload_env(NODE),
            "gateway",
            move |request: WorkloadEnvRequest| {
                let grant = grant.clone();
                async move {
                    Ok::<_, String>(WorkloadEnvReply::Values {
                        values: Default::default(),
                        salt: String::new(),
                        storage: request.storage.then_some(grant),
                    })
                }
            },
        )
        .await;
    }));
    let request = lh_events::LeaseRequested {
        workload: Some(WorkloadSpec {
            command: ["sh", "-c", BEAT].map(String::from).into(),
            image: Some("localhost/leasehold/base".into()),
            workspaces: vec![lh_events::WorkspaceMount {
                name: "ws".into(),
                path: "/workspace".into(),
            }],
            object_store: true,
            ..Default::default()
        }),
        ..lh_events::fixtures::whole_request(on_log.lease_id, tenant_id, 1, "A100-40GB")
    };
    on_log
        .publish(lh_events::EventData::LeaseRequested(request))
        .await;
    let placed = lh_events::fixtures::placed(on_log.lease_id, NODE, "z", "A100-40GB", 40, &[0]);
    // The node learns whose lease it is from its placement's envelope.
    let mut placed = lh_events::fixtures::by_owner(lh_events::EventData::LeasePlaced(placed));
    placed.tenant_id = Some(tenant_id);
    on_log
        .bus
        .publish(&placed, lh_bus::Expect::Any)
        .await
        .unwrap();
    let mut agent = on_log
        .podman_agent(NODE, "previous-agent.log")
        // No periodic sync comes in this test's time: only a last one.
        .env("LH_WORKSPACE_SYNC_INTERVAL_SECS", "3600")
        .spawn()
        .unwrap();
    let container = format!("lh-{}", on_log.lease_id);
    let _cleanup = RemoveOnDrop(container.clone());
    wait_beat_over(&store, 1, "a first put through the relay").await;
    agent.kill().unwrap();
    agent.wait().unwrap();
    // With its agent gone the relay is gone: the count in the bucket stops.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stalled = beat(&store).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(beat(&store).await, stalled, "no relay without an agent");

    let token = lh_service::CancellationToken::new();
    let config = lh_node_agent::Config {
        storage: lh_node_agent::storage::StorageArgs {
            workspace_sync_interval_secs: 3600,
            ..lh_node_agent::storage::StorageArgs::for_test()
        },
        ..on_log.podman_config(NODE)
    };
    let running = lh_node_agent::start(config, token.clone()).await.unwrap();
    // Adopted, its relay open again: the count goes on in the bucket.
    let resumed = wait_beat_over(&store, stalled + 2, "a put after the restart").await;

    // Stopped: the restarted agent syncs the workspace a last time.
    on_log
        .publish(lh_events::EventData::LeaseStopRequested(
            lh_events::LeaseStopRequested {
                lease_id: on_log.lease_id,
            },
        ))
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let synced = loop {
        let events = on_log.lease_events().await;
        let synced = events.into_iter().find_map(|e| match e {
            lh_events::EventData::LeaseWorkspaceSynced(s) => Some(s),
            _ => None,
        });
        if let Some(synced) = synced {
            break synced;
        }
        assert!(
            Instant::now() < deadline,
            "no last sync of the adopted workspace"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(synced.reason, lh_events::WorkspaceSyncReason::End);
    assert_eq!(synced.files, 1, "{synced:?}");
    // What it holds is the count the workload reached after the restart.
    let head = lh_storage::workspace::read_head(&store, "ws")
        .await
        .unwrap()
        .expect("a head");
    let manifest = lh_storage::workspace::head_manifest(&store, "ws", &head)
        .await
        .unwrap();
    let restored = tempfile::tempdir().unwrap();
    lh_storage::download(&store, &manifest, restored.path(), &lh_storage::NoProgress)
        .await
        .unwrap();
    let count: u64 = fs::read_to_string(restored.path().join("ckpt"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(count >= resumed, "synced {count}, the bucket saw {resumed}");
    on_log.wait_for_event("lease.ended").await;
    token.cancel();
    running.wait().await.unwrap();
    drop(gateway);
}

/// The first member of a gang in a container, started by an agent (the
/// binary, on podman) that is then killed with SIGKILL; its link is then
/// taken away, as if that agent had died between the container's start
/// and its link. The restarted agent adopts the container and links it
/// again, and at the lease's end releases the link: the host's segment
/// goes with it. Before, an adopted member stayed off its gang's link (its
/// ranks never met) and its segment outlived it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_agent_links_an_adopted_gang_member_again_and_releases_the_link() {
    use lh_node_agent::workload::gang_link::{linked, GangLink, LINK_IN_CONTAINER};
    base_image();
    // A node of its own: an agent sweeps the containers of its node id,
    // and the data test's agent runs on podman as node-a at the same time.
    const GANG_NODE: &str = "node-g";
    let on_log = OnLog::start(&FLEET.replace(NODE, GANG_NODE)).await;
    let request = lh_events::LeaseRequested {
        workload: Some(WorkloadSpec {
            command: ["sh", "-c", "sleep 600"].map(String::from).into(),
            image: Some("localhost/leasehold/base".into()),
            ..Default::default()
        }),
        ..lh_events::fixtures::whole_request(on_log.lease_id, Uuid::now_v7(), 2, "A100-40GB")
    };
    on_log
        .publish(lh_events::EventData::LeaseRequested(request))
        .await;
    // Two members: this node first, and one on another host whose agent
    // never comes (its name does not resolve: the link stays on this host).
    let mut placed =
        lh_events::fixtures::placed(on_log.lease_id, GANG_NODE, "z", "A100-40GB", 40, &[0]);
    placed.members = [(GANG_NODE, "a"), ("node-x", "gpu-x.sim")]
        .map(|(node_id, address)| lh_events::LeaseMember {
            node_id: node_id.into(),
            zone: "z".into(),
            address: address.into(),
            gpus: placed.gpus.clone(),
        })
        .into();
    let link = GangLink {
        lease_id: on_log.lease_id,
        node_rank: 0,
        members: vec!["a".into(), "gpu-x.sim".into()],
    };
    let segment = Path::new("/run/netns").join(link.namespace());
    let _segment = DeleteSegmentOnDrop(link.namespace());
    on_log
        .publish(lh_events::EventData::LeasePlaced(placed))
        .await;
    let mut agent = on_log
        .podman_agent(GANG_NODE, "first-agent.log")
        .spawn()
        .unwrap();
    let container = format!("lh-{}", on_log.lease_id);
    let _cleanup = RemoveOnDrop(container.clone());
    let pid_of = || -> Option<u32> {
        let out = Command::new("podman")
            .args(PODMAN_ARGS)
            .args(["inspect", "--format", "{{.State.Pid}}", &container])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .ok()
            .filter(|pid| *pid > 0)
    };
    let until = |what: &str, secs: u64, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    until("the first agent never linked its member", 90, &|| {
        pid_of().is_some_and(linked)
    });
    agent.kill().unwrap();
    agent.wait().unwrap();
    let pid = pid_of().expect("the container outlived its agent");
    let unlinked = Command::new("nsenter")
        .args([
            "-t",
            &pid.to_string(),
            "-n",
            "ip",
            "link",
            "del",
            LINK_IN_CONTAINER,
        ])
        .status()
        .unwrap();
    assert!(unlinked.success());
    assert!(!linked(pid));

    let mut agent = on_log
        .podman_agent(GANG_NODE, "second-agent.log")
        .spawn()
        .unwrap();
    tokio::task::spawn_blocking(move || {
        until("the adopted member was not linked again", 30, &|| {
            linked(pid)
        })
    })
    .await
    .unwrap();
    assert_eq!(pid_of(), Some(pid), "adopted, not started again");
    // Adopted while linked, a member keeps its link as it is: the same
    // interface, not one made again (which would cut the ranks' traffic).
    let interface = || {
        let out = Command::new("nsenter")
            .args([
                "-t",
                &pid.to_string(),
                "-n",
                "ip",
                "-o",
                "link",
                "show",
                LINK_IN_CONTAINER,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split(':')
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let before = interface();
    agent.kill().unwrap();
    agent.wait().unwrap();
    let token = lh_service::CancellationToken::new();
    let running = lh_node_agent::start(on_log.podman_config(GANG_NODE), token.clone())
        .await
        .unwrap();
    // Its link task runs once the adopted container is seen running.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(pid_of(), Some(pid), "adopted again");
    assert!(!before.is_empty());
    assert_eq!(interface(), before, "the link was made again");

    on_log
        .publish(lh_events::EventData::LeaseStopRequested(
            lh_events::LeaseStopRequested {
                lease_id: on_log.lease_id,
            },
        ))
        .await;
    let gone = segment.clone();
    tokio::task::spawn_blocking(move || {
        until("the adopted member's segment outlived it", 60, &|| {
            !gone.exists()
        })
    })
    .await
    .unwrap();
    token.cancel();
    running.wait().await.unwrap();
}

/// Deletes a gang's segment left by a test that failed half way.
struct DeleteSegmentOnDrop(String);

impl Drop for DeleteSegmentOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Removes the container of a test that failed half way.
struct RemoveOnDrop(String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(PODMAN_ARGS)
            .args(["rm", "--force", "--time", "0", &self.0])
            .output();
    }
}
