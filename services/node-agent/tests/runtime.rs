//! The workload runtimes against real processes: the environment a child
//! sees, exit codes, graceful stops of whole process groups, cgroup files
//! (in a directory that mimics cgroupfs, and the real one where the host has
//! it), and the container runtime driving a fake docker CLI that records its
//! arguments (no container engine runs here).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lh_node_agent::workload::lease_user::LeaseUsers;
use lh_node_agent::workload::{
    Assignment, CgroupConfig, ContainerRuntime, Exit, ProcessRuntime, RunningWorkload, Runtime,
    RuntimeError, StopOutcome, Workload,
};
use uuid::Uuid;

const MIB: u64 = 1 << 20;
/// How long a test waits for something a child should do at once.
const PATIENCE: Duration = Duration::from_secs(10);

fn assignment() -> Assignment {
    Assignment {
        lease_id: Uuid::new_v4(),
        device_uuids: vec!["GPU-5f0c1a2b".into(), "MIG-7d3e9f10".into()],
        vram_limit_mib: None,
        compute_milli: None,
        memory_share_bytes: None,
        cpu_milli: None,
        mps_pipe_dir: None,
        mps_server_uid: None,
        log_file: None,
        tenant_id: None,
        gang_env: Default::default(),
        part: None,
        gang_link: None,
    }
}

/// Lease users whose homes are in a directory kept for the test run.
fn lease_users() -> LeaseUsers {
    let state = lh_testkit::shared_tempdir().keep();
    LeaseUsers::for_node(&state).expect("the tests run as root, as CI does")
}

fn sh(script: &str) -> Workload {
    Workload {
        command: vec!["sh".into(), "-c".into(), script.into()],
        image: None,
        env: BTreeMap::new(),
        network: Default::default(),
        mounts: Vec::new(),
        store: None,
    }
}

fn start(runtime: &impl Runtime, a: &Assignment, w: &Workload) -> RunningWorkload {
    runtime.start(a, w).expect("workload starts")
}

/// Polls until `path` holds a pid (written by the child once it is ready).
async fn read_pid(path: &Path) -> i32 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(pid) = fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A process is dead when it is gone or a zombie (its new parent, pid 1,
/// may not reap it in a container).
fn is_dead(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            matches!(state.and_then(|s| s.chars().next()), Some('Z' | 'X'))
        }
    }
}

async fn assert_dies(pid: i32) {
    let deadline = Instant::now() + PATIENCE;
    while !is_dead(pid) {
        assert!(Instant::now() < deadline, "process {pid} still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn env_file(path: &Path) -> BTreeMap<String, String> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// ---- process runtime -------------------------------------------------------

#[tokio::test]
async fn the_child_sees_the_lease_environment_and_not_the_agents() {
    let dir = lh_testkit::shared_tempdir();
    let out = dir.path().join("env");
    let a = Assignment {
        vram_limit_mib: Some(5 * 1024),
        compute_milli: Some(250),
        ..assignment()
    };
    let mut w = sh(&format!("env > '{}'", out.display()));
    w.env.insert("MY_VAR".into(), "hello world".into());
    w.env.insert("CUDA_VISIBLE_DEVICES".into(), "all".into());
    // A forged event's: the gateway refuses it, the agent drops it.
    w.env.insert("LD_PRELOAD".into(), "/tmp/evil.so".into());

    let exit = start(&ProcessRuntime::without_cgroups(lease_users()), &a, &w)
        .wait()
        .await
        .unwrap();

    assert_eq!(
        exit,
        Exit {
            code: Some(0),
            signal: None
        }
    );
    let env = env_file(&out);
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-5f0c1a2b,MIG-7d3e9f10");
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "GPU-5f0c1a2b,MIG-7d3e9f10");
    assert_eq!(env["CUDA_DEVICE_MEMORY_LIMIT"], "5120m");
    assert_eq!(env["CUDA_DEVICE_SM_LIMIT"], "25");
    assert_eq!(env["LEASEHOLD_LEASE_ID"], a.lease_id.to_string());
    assert_eq!(env["MY_VAR"], "hello world");
    assert!(!env.contains_key("LD_PRELOAD"));
    assert!(env.contains_key("PATH"));
    // A home of its own, its working directory.
    assert!(
        env["HOME"].ends_with(&a.lease_id.to_string()),
        "{}",
        env["HOME"]
    );
    assert_eq!(env["PWD"], env["HOME"]);
    assert_ne!(std::env::var("HOME").ok().as_ref(), Some(&env["HOME"]));
    // Nothing of the agent's own environment (cargo sets CARGO* for tests).
    let shell_own = ["PATH", "PWD", "OLDPWD", "SHLVL", "_", "HOME"];
    let agents: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| !shell_own.contains(&k.as_str()) && !w.env.contains_key(k))
        .collect();
    assert!(
        !agents.is_empty(),
        "the test process has no environment to leak"
    );
    let leaked: Vec<&String> = agents.iter().filter(|k| env.contains_key(*k)).collect();
    assert!(leaked.is_empty(), "agent variables leaked: {leaked:?}");
}

#[tokio::test]
async fn each_lease_runs_as_its_own_user_and_reads_nothing_of_the_agent() {
    let dir = lh_testkit::shared_tempdir();
    // The agent's seed, 0600 as the agent requires, beside the marks.
    let seed = dir.path().join("node.nk");
    fs::write(&seed, "SUANOTAREALSEED\n").unwrap();
    fs::set_permissions(&seed, fs::Permissions::from_mode(0o600)).unwrap();
    let state = lh_testkit::shared_tempdir();
    let users = LeaseUsers::for_node(state.path()).unwrap();
    let log = state.path().join("logs");
    fs::create_dir(&log).unwrap();
    fs::set_permissions(&log, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(log.join("other-lease.log"), "secret output").unwrap();
    let runtime = ProcessRuntime::without_cgroups(users);
    let probe = |name: &str| {
        let out = dir.path().join(name);
        sh(&format!(
            "{{ id -u; id -G; cat '{seed}' && echo READ-SEED; ls '{state}' && echo LISTED-STATE; \
             cat '{log}/other-lease.log' && echo READ-LOG; kill -0 1 && echo SIGNALS-INIT; \
             echo x > mine && echo HOME-WRITABLE; sleep 2; }} > '{out}' 2>/dev/null",
            seed = seed.display(),
            state = state.path().display(),
            log = log.display(),
            out = out.display()
        ))
    };
    let (a, b) = (assignment(), assignment());
    let mut first = start(&runtime, &a, &probe("a"));
    let mut second = start(&runtime, &b, &probe("b"));
    let home_a = state.path().join("leases").join(a.lease_id.to_string());
    assert!(home_a.is_dir());
    assert_eq!(first.wait().await.unwrap().code, Some(0));
    assert_eq!(second.wait().await.unwrap().code, Some(0));
    let read = |name: &str| fs::read_to_string(dir.path().join(name)).unwrap();
    let (a_out, b_out) = (read("a"), read("b"));
    let uid = |out: &str| out.lines().next().unwrap().parse::<u32>().unwrap();
    for out in [&a_out, &b_out] {
        assert!(
            uid(out) >= lh_node_agent::workload::lease_user::FIRST_LEASE_UID,
            "{out}"
        );
        // No supplementary group: the agent's (root's) groups are gone.
        assert_eq!(
            out.lines().nth(1).unwrap(),
            out.lines().next().unwrap(),
            "{out}"
        );
        assert!(out.contains("HOME-WRITABLE"), "{out}");
        for never in ["READ-SEED", "LISTED-STATE", "READ-LOG", "SIGNALS-INIT"] {
            assert!(!out.contains(never), "{never}: {out}");
        }
    }
    assert_ne!(uid(&a_out), uid(&b_out), "two leases share a user");
    // Ended: its home is gone.
    assert!(!home_a.exists());
}

#[tokio::test]
async fn a_lease_users_processes_end_with_its_lease_even_outside_its_group() {
    let dir = lh_testkit::shared_tempdir();
    let pid_file = dir.path().join("escaped");
    let runtime = ProcessRuntime::without_cgroups(lease_users());
    // setsid: the child leaves the lease's process group, as a daemon would;
    // and it leaves a file in /tmp, where every user may write.
    let a = assignment();
    let scratch = std::path::PathBuf::from(format!("/tmp/lh-lease-scratch-{}", a.lease_id));
    let w = sh(&format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 60' & echo left > {}; sleep 0.5; exit 0",
        pid_file.display(),
        scratch.display()
    ));
    let mut run = start(&runtime, &a, &w);
    let escaped = read_pid(&pid_file).await;
    assert_eq!(run.wait().await.unwrap().code, Some(0));
    assert!(!scratch.exists(), "what the lease left in /tmp outlived it");
    let deadline = Instant::now() + PATIENCE;
    while lh_node_agent::workload::reconcile::process_start_ticks(escaped).is_some() {
        assert!(
            Instant::now() < deadline,
            "pid {escaped} outlived its lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_whole_gpu_lease_gets_no_share_caps() {
    let dir = lh_testkit::shared_tempdir();
    let out = dir.path().join("env");
    let w = sh(&format!("env > '{}'", out.display()));
    start(
        &ProcessRuntime::without_cgroups(lease_users()),
        &assignment(),
        &w,
    )
    .wait()
    .await
    .unwrap();
    let env = env_file(&out);
    assert!(!env.contains_key("CUDA_DEVICE_MEMORY_LIMIT"));
    assert!(!env.contains_key("CUDA_DEVICE_SM_LIMIT"));
}

#[tokio::test]
async fn the_exit_code_and_a_killing_signal_propagate() {
    let runtime = ProcessRuntime::without_cgroups(lease_users());
    let exit = start(&runtime, &assignment(), &sh("exit 7"))
        .wait()
        .await
        .unwrap();
    assert_eq!(
        exit,
        Exit {
            code: Some(7),
            signal: None
        }
    );

    let exit = start(&runtime, &assignment(), &sh("kill -KILL $$"))
        .wait()
        .await
        .unwrap();
    assert_eq!(
        exit,
        Exit {
            code: None,
            signal: Some(libc::SIGKILL)
        }
    );
}

#[tokio::test]
async fn a_missing_program_is_an_error() {
    let w = Workload {
        command: vec!["/nonexistent/leasehold-workload".into()],
        ..Workload::default()
    };
    let err = ProcessRuntime::without_cgroups(lease_users())
        .start(&assignment(), &w)
        .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/leasehold-workload"));
}

#[tokio::test]
async fn sigterm_stops_a_child_that_handles_it_and_its_children() {
    let dir = lh_testkit::shared_tempdir();
    let pid_file = dir.path().join("grandchild");
    let script = format!(
        "trap 'exit 0' TERM; sleep 60 & echo $! > '{}'; wait",
        pid_file.display()
    );
    let mut running = start(
        &ProcessRuntime::without_cgroups(lease_users()),
        &assignment(),
        &sh(&script),
    );
    let grandchild = read_pid(&pid_file).await;
    assert!(!is_dead(grandchild));

    let grace = Duration::from_secs(10);
    let began = Instant::now();
    let stopped = running.stop(grace).await.unwrap();

    assert_eq!(stopped.outcome, StopOutcome::Terminated);
    assert_eq!(stopped.exit.code, Some(0), "{stopped:?}");
    assert!(began.elapsed() < grace / 2, "took {:?}", began.elapsed());
    assert!(is_dead(running.pid() as i32));
    assert_dies(grandchild).await;
}

#[tokio::test]
async fn a_child_that_ignores_sigterm_is_killed_after_the_grace() {
    let dir = lh_testkit::shared_tempdir();
    let pid_file = dir.path().join("grandchild");
    // The ignored TERM is inherited by the background sleep too.
    let script = format!(
        "trap '' TERM; sleep 60 & echo $! > '{}'; wait",
        pid_file.display()
    );
    let mut running = start(
        &ProcessRuntime::without_cgroups(lease_users()),
        &assignment(),
        &sh(&script),
    );
    let grandchild = read_pid(&pid_file).await;

    let grace = Duration::from_millis(500);
    let began = Instant::now();
    let stopped = running.stop(grace).await.unwrap();

    assert_eq!(stopped.outcome, StopOutcome::Killed);
    assert_eq!(
        stopped.exit,
        Exit {
            code: None,
            signal: Some(libc::SIGKILL)
        }
    );
    assert!(began.elapsed() >= grace);
    assert!(began.elapsed() < PATIENCE);
    assert_dies(grandchild).await;
}

#[tokio::test]
async fn what_a_workload_leaves_behind_dies_with_it() {
    let dir = lh_testkit::shared_tempdir();
    let pid_file = dir.path().join("grandchild");
    let script = format!("sleep 60 & echo $! > '{}'; exit 0", pid_file.display());
    let mut running = start(
        &ProcessRuntime::without_cgroups(lease_users()),
        &assignment(),
        &sh(&script),
    );
    let exit = running.wait().await.unwrap();
    assert_eq!(exit.code, Some(0));
    let grandchild = read_pid(&pid_file).await;
    assert_dies(grandchild).await;
}

#[tokio::test]
async fn stopping_an_exited_workload_reports_its_exit() {
    let dir = lh_testkit::shared_tempdir();
    let done = dir.path().join("done");
    let script = format!("echo 1 > '{}'; exit 3", done.display());
    let mut running = start(
        &ProcessRuntime::without_cgroups(lease_users()),
        &assignment(),
        &sh(&script),
    );
    read_pid(&done).await;
    let deadline = Instant::now() + PATIENCE;
    while !is_dead(running.pid() as i32) {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped = running.stop(Duration::from_secs(5)).await.unwrap();
    assert_eq!(stopped.outcome, StopOutcome::AlreadyExited);
    assert_eq!(stopped.exit.code, Some(3));
    // And waiting afterwards gives the same exit.
    assert_eq!(running.wait().await.unwrap().code, Some(3));
}

// ---- cgroups ---------------------------------------------------------------

/// A directory that looks like a cgroup v2 root to the runtime.
fn fake_cgroup_root(controllers: &str) -> tempfile::TempDir {
    let root = lh_testkit::shared_tempdir();
    fs::write(root.path().join("cgroup.controllers"), controllers).unwrap();
    fs::write(root.path().join("cgroup.subtree_control"), "cpu\n").unwrap();
    fs::write(root.path().join("cgroup.procs"), "").unwrap();
    root
}

fn read(path: PathBuf) -> String {
    fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

async fn check_cgroup_files(hard_pct: u8, soft_pct: u8, expect_max: u64, expect_high: u64) {
    let root = fake_cgroup_root("cpuset cpu io memory hugetlb pids rdma misc\n");
    let runtime = ProcessRuntime::new(
        CgroupConfig {
            root: root.path().to_path_buf(),
            hard_limit_pct: hard_pct,
            soft_limit_pct: soft_pct,
        },
        lease_users(),
    )
    .unwrap();
    assert!(runtime.uses_cgroups());
    let a = Assignment {
        memory_share_bytes: Some(1000 * MIB),
        ..assignment()
    };
    let mut running = start(&runtime, &a, &sh("sleep 60"));

    let parent = root.path().join("leasehold");
    let lease = parent.join(format!("lh-{}", a.lease_id));
    assert_eq!(read(lease.join("memory.max")), expect_max.to_string());
    assert_eq!(read(lease.join("memory.high")), expect_high.to_string());
    assert_eq!(read(lease.join("cgroup.procs")), running.pid().to_string());
    assert!(read(root.path().join("cgroup.subtree_control")).contains("memory"));
    assert!(read(parent.join("cgroup.subtree_control")).contains("memory"));

    let stopped = running.stop(Duration::from_secs(5)).await.unwrap();
    assert_eq!(stopped.outcome, StopOutcome::Terminated);
    assert_eq!(stopped.exit.signal, Some(libc::SIGTERM));
    assert!(!lease.exists(), "lease cgroup not removed");
    assert!(parent.is_dir());
}

#[tokio::test]
async fn cgroup_limits_default_to_80_percent_hard_and_soft_capped_at_hard() {
    let max = 1000 * MIB * 80 / 100;
    check_cgroup_files(80, 90, max, max).await;
}

#[tokio::test]
async fn cgroup_soft_limit_below_the_hard_one_is_written() {
    check_cgroup_files(90, 80, 1000 * MIB * 90 / 100, 1000 * MIB * 80 / 100).await;
}

#[tokio::test]
async fn the_cgroup_goes_when_the_workload_exits() {
    let root = fake_cgroup_root("cpu memory\n");
    let runtime = ProcessRuntime::new(
        CgroupConfig {
            root: root.path().to_path_buf(),
            ..CgroupConfig::default()
        },
        lease_users(),
    )
    .unwrap();
    let a = Assignment {
        memory_share_bytes: Some(64 * MIB),
        ..assignment()
    };
    let lease = root
        .path()
        .join("leasehold")
        .join(format!("lh-{}", a.lease_id));
    // The child reads its own cgroup file: it was in before it ran.
    let script = format!(
        "test \"$(cat '{}')\" = $$",
        lease.join("cgroup.procs").display()
    );
    let exit = start(&runtime, &a, &sh(&script)).wait().await.unwrap();
    assert_eq!(exit.code, Some(0));
    assert!(!lease.exists());
}

#[tokio::test]
async fn a_share_runs_with_hami_core_preloaded_by_the_agent() {
    let dir = lh_testkit::shared_tempdir();
    let lib = dir.path().join("libvgpu.so");
    fs::write(&lib, b"").unwrap();
    let out = dir.path().join("env");
    let runtime = ProcessRuntime::without_cgroups(lease_users()).with_hami_core_lib(lib.clone());
    let share = Assignment {
        vram_limit_mib: Some(1024),
        compute_milli: Some(100),
        ..assignment()
    };
    let mut w = sh(&format!("env > '{}'", out.display()));
    w.env.insert("LD_PRELOAD".into(), "/tmp/evil.so".into());
    start(&runtime, &share, &w).wait().await.unwrap();
    assert_eq!(env_file(&out)["LD_PRELOAD"], lib.display().to_string());
    // A whole GPU: nothing preloaded, and the tenant's is dropped.
    let out = dir.path().join("env-whole");
    let w = Workload {
        env: w.env.clone(),
        ..sh(&format!("env > '{}'", out.display()))
    };
    start(&runtime, &assignment(), &w).wait().await.unwrap();
    assert!(!env_file(&out).contains_key("LD_PRELOAD"));
}

#[tokio::test]
async fn a_lease_without_a_ram_share_still_gets_its_own_cgroup() {
    let root = fake_cgroup_root("cpu memory\n");
    let runtime = ProcessRuntime::new(
        CgroupConfig {
            root: root.path().to_path_buf(),
            ..CgroupConfig::default()
        },
        lease_users(),
    )
    .unwrap();
    let a = assignment();
    assert_eq!(a.memory_share_bytes, None);
    let lease = root
        .path()
        .join("leasehold")
        .join(format!("lh-{}", a.lease_id));
    let mut running = start(&runtime, &a, &sh("sleep 60"));
    assert_eq!(read(lease.join("cgroup.procs")), running.pid().to_string());
    assert!(!lease.join("memory.max").exists(), "no share, no limit");
    running.stop(Duration::from_secs(5)).await.unwrap();
    assert!(!lease.exists(), "lease cgroup not removed");
}

#[tokio::test]
async fn no_memory_controller_means_no_cgroup_but_the_workload_runs() {
    let root = fake_cgroup_root("cpu io pids\n");
    let runtime = ProcessRuntime::new(
        CgroupConfig {
            root: root.path().to_path_buf(),
            ..CgroupConfig::default()
        },
        lease_users(),
    )
    .unwrap();
    assert!(!runtime.uses_cgroups());
    let a = Assignment {
        memory_share_bytes: Some(64 * MIB),
        ..assignment()
    };
    let exit = start(&runtime, &a, &sh("exit 0")).wait().await.unwrap();
    assert_eq!(exit.code, Some(0));
    assert!(!root.path().join("leasehold").exists());
}

#[tokio::test]
async fn a_cgroup_that_cannot_be_made_or_entered_does_not_stop_the_workload() {
    // `leasehold` is a file: the cgroup cannot be made.
    let root = fake_cgroup_root("memory\n");
    fs::write(root.path().join("leasehold"), "").unwrap();
    let runtime = ProcessRuntime::new(
        CgroupConfig {
            root: root.path().to_path_buf(),
            ..CgroupConfig::default()
        },
        lease_users(),
    )
    .unwrap();
    let a = Assignment {
        memory_share_bytes: Some(64 * MIB),
        ..assignment()
    };
    let exit = start(&runtime, &a, &sh("exit 4")).wait().await.unwrap();
    assert_eq!(exit.code, Some(4));

    // `cgroup.procs` is a directory: the child cannot enter the cgroup.
    let root = fake_cgroup_root("memory\n");
    let runtime = ProcessRuntime::new(
        CgroupConfig {
            root: root.path().to_path_buf(),
            ..CgroupConfig::default()
        },
        lease_users(),
    )
    .unwrap();
    let lease = root
        .path()
        .join("leasehold")
        .join(format!("lh-{}", a.lease_id));
    fs::create_dir_all(lease.join("cgroup.procs")).unwrap();
    let exit = start(&runtime, &a, &sh("exit 5")).wait().await.unwrap();
    assert_eq!(exit.code, Some(5));
    assert!(!lease.exists(), "unused cgroup not removed");
}

/// Uses the host's cgroup v2 memory controller when there is a writable one
/// (root on a unified-hierarchy host); skips, saying why, anywhere else.
#[tokio::test]
async fn real_cgroup_v2_limits_when_the_host_has_them() {
    let config = CgroupConfig::default();
    if let Err(why) = lh_node_agent::workload::cgroup::probe(&config.root) {
        eprintln!("skipped: {why}");
        return;
    }
    let runtime = ProcessRuntime::new(config.clone(), lease_users()).unwrap();
    let share = 256 * MIB;
    let a = Assignment {
        memory_share_bytes: Some(share),
        ..assignment()
    };
    let mut running = start(&runtime, &a, &sh("sleep 60"));
    let lease = config.lease_dir(a.lease_id);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let expect = share * 80 / 100 / page * page;
    assert_eq!(read(lease.join("memory.max")), expect.to_string());
    assert_eq!(read(lease.join("memory.high")), expect.to_string());
    let own = read(PathBuf::from(format!("/proc/{}/cgroup", running.pid())));
    assert!(
        own.contains(&format!("/leasehold/lh-{}", a.lease_id)),
        "child cgroup: {own}"
    );
    running.stop(Duration::from_secs(5)).await.unwrap();
    assert!(!lease.exists(), "lease cgroup not removed");
}

// ---- container runtime, against a fake CLI ----------------------------------

/// Writes `dir/docker`: appends its arguments, tab-separated, one line per
/// invocation to `dir/calls` (looks at the engine's state, `container`,
/// `image` and `rm`, to `dir/looks` instead); `run` saves its environment to `dir/run.env`
/// and its pid to `dir/run.pid`, then does `run_body`; `stop` does
/// `stop_body`.
fn fake_cli(dir: &Path, run_body: &str, stop_body: &str) -> PathBuf {
    let d = dir.display();
    let script = format!(
        r#"#!/bin/sh
tab=$(printf '\t')
line=''
for arg in "$@"; do line="$line$arg$tab"; done
case "$1" in
container|image|rm) printf '%s\n' "$line" >> '{d}/looks'; exit 0 ;;
esac
printf '%s\n' "$line" >> '{d}/calls'
case "$1" in
run)
  env > '{d}/run.env'
  echo $$ > '{d}/run.pid.tmp' && mv '{d}/run.pid.tmp' '{d}/run.pid'
  {run_body}
  ;;
stop)
  {stop_body}
  ;;
esac
"#
    );
    let cli = dir.join("docker");
    fs::write(&cli, script).unwrap();
    fs::set_permissions(&cli, fs::Permissions::from_mode(0o755)).unwrap();
    cli
}

/// Runs until SIGTERM, then exits 143 as a container stopped by it would.
const RUN_UNTIL_STOPPED: &str = "trap 'exit 143' TERM; sleep 60 & wait";
const STOP_BY_SIGTERM: &str = "kill -TERM \"$(cat \"$(dirname \"$0\")/run.pid\")\"";

fn calls(dir: &Path) -> Vec<Vec<String>> {
    fs::read_to_string(dir.join("calls"))
        .unwrap()
        .lines()
        .map(|line| {
            let line = line.strip_suffix('\t').unwrap_or(line);
            line.split('\t').map(String::from).collect()
        })
        .collect()
}

fn container_workload() -> Workload {
    Workload {
        command: vec!["python".into(), "train.py".into(), "--epochs=3".into()],
        image: Some("registry.example/team/trainer:1.2".into()),
        env: BTreeMap::from([("HF_TOKEN".to_string(), "s3cret-value".to_string())]),
        network: Default::default(),
        mounts: Vec::new(),
        store: None,
    }
}

#[tokio::test]
async fn docker_run_and_stop_arguments_and_the_stop_exit() {
    let dir = lh_testkit::shared_tempdir();
    let cli = fake_cli(dir.path(), RUN_UNTIL_STOPPED, STOP_BY_SIGTERM);
    let a = Assignment {
        vram_limit_mib: Some(20 * 1024),
        compute_milli: Some(500),
        memory_share_bytes: Some(4096 * MIB),
        ..assignment()
    };
    let env_dir = dir.path().join("state").join("env");
    let runtime = ContainerRuntime::docker(&cli).env_files_in(&env_dir);
    let mut running = start(&runtime, &a, &container_workload());
    read_pid(&dir.path().join("run.pid")).await;
    let tenant_env_file = env_dir.join(format!("lh-{}.env", a.lease_id));
    assert_eq!(
        fs::read_to_string(&tenant_env_file).unwrap(),
        "HF_TOKEN=s3cret-value\n"
    );
    assert_eq!(
        fs::metadata(&tenant_env_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let stopped = running.stop(Duration::from_millis(1500)).await.unwrap();

    let name = format!("lh-{}", a.lease_id);
    let devices = "GPU-5f0c1a2b,MIG-7d3e9f10";
    let limit = (4096 * MIB * 80 / 100).to_string();
    let run: Vec<String> = [
        "run",
        "--name",
        &name,
        "--pull",
        "missing",
        "--read-only",
        "--tmpfs",
        &format!("/scratch:rw,nosuid,nodev,size={limit},mode=1777"),
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--network",
        "none",
        "--log-driver",
        "none",
        "--pids-limit",
        "4096",
        "--ulimit",
        "nofile=16384:16384",
        "--ulimit",
        "nproc=4096:4096",
        "--memory",
        &limit,
        "--memory-reservation",
        &limit,
        "--memory-swap",
        &limit,
        "--gpus",
        &format!("\"device={devices}\""),
        "--env-file",
        &tenant_env_file.display().to_string(),
        "-e",
        &format!("CUDA_DEVICE_MEMORY_LIMIT={}m", 20 * 1024),
        "-e",
        "CUDA_DEVICE_SM_LIMIT=50",
        "-e",
        &format!("CUDA_VISIBLE_DEVICES={devices}"),
        "-e",
        &format!("LEASEHOLD_LEASE_ID={}", a.lease_id),
        "-e",
        &format!("NVIDIA_VISIBLE_DEVICES={devices}"),
        "--label",
        &format!("leasehold.lease={}", a.lease_id),
        "--",
        "registry.example/team/trainer:1.2",
        "python",
        "train.py",
        "--epochs=3",
    ]
    .map(String::from)
    .into();
    let stop: Vec<String> = ["stop", "--timeout", "2", &name].map(String::from).into();
    assert_eq!(calls(dir.path()), vec![run, stop]);
    assert_eq!(
        stopped.exit,
        Exit {
            code: Some(143),
            signal: None
        }
    );
    assert_eq!(stopped.outcome, StopOutcome::Terminated);
    // The secret reaches the container through the env file: neither the
    // CLI's argv nor its own environment holds it, and the file is gone.
    assert!(!env_file(&dir.path().join("run.env")).contains_key("HF_TOKEN"));
    assert!(!fs::read_to_string(dir.path().join("calls"))
        .unwrap()
        .contains("s3cret"));
    assert!(!tenant_env_file.exists(), "env file left behind");
    // The container is removed once the agent knows how it ended.
    let looks = fs::read_to_string(dir.path().join("looks")).unwrap();
    assert!(
        looks.ends_with(&format!("rm\t--force\t{name}\t\n")),
        "{looks}"
    );
}

#[tokio::test]
async fn a_forged_workload_cannot_reconfigure_the_cli_nor_reach_it_with_a_flag() {
    let dir = lh_testkit::shared_tempdir();
    let copy = dir.path().join("env-file.copy");
    let copy_env_file = format!(
        r#"prev=''; for arg in "$@"; do [ "$prev" = --env-file ] && cp "$arg" '{}'; prev=$arg; done"#,
        copy.display()
    );
    let cli = fake_cli(dir.path(), &copy_env_file, "exit 0");
    let env_dir = dir.path().join("env");
    let forged = Workload {
        command: vec!["--privileged".into()],
        image: Some("ubuntu:22.04".into()),
        env: BTreeMap::from([
            ("DOCKER_HOST".to_string(), "tcp://evil:2375".to_string()),
            ("HTTPS_PROXY".to_string(), "http://evil:3128".to_string()),
            ("LD_PRELOAD".to_string(), "/tmp/evil.so".to_string()),
            ("CUDA_VISIBLE_DEVICES".to_string(), "all".to_string()),
            ("EPOCHS".to_string(), "3".to_string()),
        ]),
        network: Default::default(),
        mounts: Vec::new(),
        store: None,
    };
    let a = assignment();
    let runtime = ContainerRuntime::docker(&cli).env_files_in(&env_dir);
    let exit = start(&runtime, &a, &forged).wait().await.unwrap();
    assert_eq!(exit.code, Some(0));

    let run = &calls(dir.path())[0];
    let dashes = run.iter().position(|arg| arg == "--").expect("no --");
    assert_eq!(&run[dashes + 1..], ["ubuntu:22.04", "--privileged"]);
    assert!(
        run[..dashes].iter().all(|arg| !arg.contains("evil")),
        "{run:?}"
    );
    let cli_env = env_file(&dir.path().join("run.env"));
    for name in ["DOCKER_HOST", "HTTPS_PROXY", "LD_PRELOAD", "EPOCHS"] {
        assert!(
            !cli_env.contains_key(name),
            "{name} reached the CLI's environment"
        );
    }
    assert_eq!(cli_env.get("CUDA_VISIBLE_DEVICES"), None);
    assert_eq!(fs::read_to_string(&copy).unwrap(), "EPOCHS=3\n");
    assert!(!env_dir.join(format!("lh-{}.env", a.lease_id)).exists());
}

#[tokio::test]
async fn the_run_exit_code_is_the_workloads() {
    let dir = lh_testkit::shared_tempdir();
    let cli = fake_cli(dir.path(), "exit 42", "exit 0");
    let a = Assignment {
        device_uuids: vec!["GPU-5f0c1a2b".into()],
        ..assignment()
    };
    let exit = start(&ContainerRuntime::podman(&cli), &a, &container_workload())
        .wait()
        .await
        .unwrap();
    assert_eq!(exit.code, Some(42));
    let calls = calls(dir.path());
    assert_eq!(calls.len(), 1);
    let run = calls[0].join(" ");
    assert!(
        run.starts_with(&format!(
            "run --name lh-{} --pull missing --read-only --tmpfs /scratch:rw,nosuid,nodev,size=1073741824,mode=1777 \
             --cap-drop ALL --security-opt no-new-privileges --userns auto:size=65536 --network none \
             --log-driver none --pids-limit 4096 --ulimit nofile=16384:16384 --ulimit nproc=4096:4096 \
             --device nvidia.com/gpu=GPU-5f0c1a2b --env-file ",
            a.lease_id
        )),
        "{run}"
    );
}

#[tokio::test]
async fn a_container_that_does_not_stop_gets_its_cli_killed() {
    let dir = lh_testkit::shared_tempdir();
    let cli = fake_cli(
        dir.path(),
        "trap '' TERM; sleep 60 & wait",
        "echo 'Error response from daemon: timeout' >&2; exit 1",
    );
    let mut runtime = ContainerRuntime::docker(&cli);
    runtime.stop_margin = Duration::from_millis(300);
    let mut running = start(&runtime, &assignment(), &container_workload());
    let run_pid = read_pid(&dir.path().join("run.pid")).await;

    let began = Instant::now();
    let stopped = running.stop(Duration::from_secs(1)).await.unwrap();

    assert_eq!(stopped.outcome, StopOutcome::Killed);
    assert_eq!(stopped.exit.signal, Some(libc::SIGKILL));
    assert!(began.elapsed() >= runtime.stop_margin);
    assert!(began.elapsed() < PATIENCE);
    assert_dies(run_pid).await;
    assert_eq!(calls(dir.path())[1][0], "stop");
}

#[tokio::test]
async fn a_container_workload_needs_an_image() {
    let dir = lh_testkit::shared_tempdir();
    let cli = fake_cli(dir.path(), "exit 0", "exit 0");
    let w = Workload {
        image: None,
        ..container_workload()
    };
    assert!(ContainerRuntime::docker(&cli)
        .start(&assignment(), &w)
        .is_err());
    assert!(!dir.path().join("calls").exists());
}

#[tokio::test]
async fn an_image_that_reads_as_a_flag_never_reaches_the_cli() {
    let dir = lh_testkit::shared_tempdir();
    let cli = fake_cli(dir.path(), "exit 0", "exit 0");
    for image in [
        "--volume=/:/host",
        "-v",
        "--privileged",
        "ubuntu --gpus=all",
        "Ubuntu",
    ] {
        let w = Workload {
            image: Some(image.into()),
            ..container_workload()
        };
        let refused = ContainerRuntime::docker(&cli).start(&assignment(), &w);
        assert!(
            matches!(refused, Err(RuntimeError::InvalidWorkload(_))),
            "{image}: {refused:?}"
        );
    }
    assert!(!dir.path().join("calls").exists(), "the CLI ran");
}

/// After a restart the agent adopts a workload whose user it holds no
/// claim on; a stale home of the same user (a lease of that user that
/// ended while the agent was down) must not end it.
#[tokio::test]
async fn a_stale_home_never_ends_a_kept_lease_of_the_same_user() {
    use std::os::unix::process::CommandExt;
    let state = lh_testkit::shared_tempdir();
    let users = LeaseUsers::for_node(state.path()).unwrap();
    let uid = lh_node_agent::workload::lease_user::FIRST_LEASE_UID + 54_321;
    let (kept, stale) = (Uuid::new_v4(), Uuid::new_v4());
    for lease in [kept, stale] {
        let home = users.homes().join(lease.to_string());
        fs::create_dir(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
    }
    // The adopted workload: running as that user, claimed by nobody.
    let mut adopted = std::process::Command::new("sleep")
        .arg("30")
        .uid(uid)
        .gid(uid)
        .spawn()
        .unwrap();
    let removed = users.remove_homes_except(&|lease| lease == kept);
    assert_eq!(removed, 1);
    assert!(!users.homes().join(stale.to_string()).exists());
    assert!(users.homes().join(kept.to_string()).exists());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        adopted.try_wait().unwrap().is_none(),
        "the kept lease's workload was killed"
    );
    adopted.kill().unwrap();
    adopted.wait().unwrap();
}

/// Loaded into every share: a library another user may rewrite would run
/// that user's code in all of them.
#[test]
fn a_hami_core_library_others_may_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libvgpu.so");
    fs::write(&lib, b"").unwrap();
    fs::set_permissions(&lib, fs::Permissions::from_mode(0o666)).unwrap();
    let err = lh_node_agent::workload::check_hami_core_lib(&lib).unwrap_err();
    assert!(err.to_string().contains("writable by other users"), "{err}");
    fs::set_permissions(&lib, fs::Permissions::from_mode(0o644)).unwrap();
    lh_node_agent::workload::check_hami_core_lib(&lib).unwrap();
}
