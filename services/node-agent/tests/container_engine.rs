//! The container runtime on a real engine: podman with runc, as `make deps`
//! installs it, and the base image `scripts/images.sh base` makes. Each
//! test proves one confinement the runtime promises (docs/workloads.md,
//! "Container runtime") by looking from inside the container, and from
//! the host where the host is what must not be reached. Addresses are this
//! machine's loopback only.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lh_events::{AssignedGpu, LeaseFailure, WorkloadSpec};
use lh_node_agent::workload::container_cgroup::{ContainerCgroups, CGROUP_MOUNT};
use lh_node_agent::workload::supervisor::{ContainerSettings, Finished, HostMarks, Workloads};
use lh_node_agent::workload::{
    Assignment, ContainerRuntime, GpuDevices, PullPolicy, RunningWorkload, Runtime, Workload,
};
use lh_node_agent::RuntimeKind;
use uuid::Uuid;

/// What this kind of host needs (no systemd; crun refuses its cgroups).
const PODMAN_ARGS: [&str; 4] = ["--cgroup-manager", "cgroupfs", "--runtime", "runc"];
const BASE: &str = "localhost/leasehold/base";
const PATIENCE: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The base image, made once for all tests of this binary (the script
/// locks against other binaries).
fn base_image() {
    static MADE: OnceLock<()> = OnceLock::new();
    MADE.get_or_init(|| {
        let status = Command::new(repo_root().join("scripts/images.sh"))
            .arg("base")
            .status()
            .expect("scripts/images.sh runs");
        assert!(status.success(), "scripts/images.sh base: {status}");
    });
}

fn podman(args: &[&str]) -> String {
    let output = Command::new("podman")
        .args(PODMAN_ARGS)
        .args(args)
        .output()
        .expect("podman runs");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// A test's own node: its stand-in GPUs and its containers' label.
struct Node {
    id: String,
    devices: PathBuf,
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        base_image();
        let id = format!("test-{}", Uuid::new_v4().simple());
        Node {
            devices: PathBuf::from("/dev/leasehold-sim").join(&id),
            id,
            dir: lh_testkit::shared_tempdir(),
        }
    }

    fn runtime(&self) -> ContainerRuntime {
        let mut runtime = ContainerRuntime::podman("podman")
            .with_global_args(PODMAN_ARGS.map(String::from).into())
            .on_node(self.id.clone())
            .env_files_in(self.dir.path().join("env"));
        runtime.pull = PullPolicy::Never;
        runtime.gpu_devices = GpuDevices::StandIn {
            dir: self.devices.clone(),
        };
        runtime.memory_cgroups = Some(ContainerCgroups::detect(Path::new(CGROUP_MOUNT)).unwrap());
        runtime
    }

    fn assignment(&self, devices: &[&str]) -> Assignment {
        let lease_id = Uuid::new_v4();
        Assignment {
            lease_id,
            device_uuids: devices.iter().map(|d| d.to_string()).collect(),
            vram_limit_mib: None,
            compute_milli: None,
            memory_share_bytes: Some(256 * MIB),
            cpu_milli: Some(500),
            mps_pipe_dir: None,
            mps_server_uid: None,
            log_file: Some(self.dir.path().join(format!("{lease_id}.log"))),
            tenant_id: None,
            gang_env: Default::default(),
            part: None,
            gang_link: None,
        }
    }

    fn start(&self, runtime: &ContainerRuntime, a: &Assignment, script: &str) -> RunningWorkload {
        self.start_image(runtime, a, BASE, script, BTreeMap::new())
    }

    fn start_image(
        &self,
        runtime: &ContainerRuntime,
        a: &Assignment,
        image: &str,
        script: &str,
        env: BTreeMap<String, String>,
    ) -> RunningWorkload {
        let workload = Workload {
            command: vec!["sh".into(), "-c".into(), script.into()],
            image: Some(image.into()),
            env,
            network: Default::default(),
            mounts: Vec::new(),
            store: None,
        };
        runtime.start(a, &workload).expect("the container starts")
    }

    /// Runs `script` to its end: exit code, the runtime's failure, the log.
    async fn run(&self, script: &str) -> (Option<i32>, Option<LeaseFailure>, String) {
        let a = self.assignment(&["GPU-0"]);
        self.run_as(&self.runtime(), &a, script).await
    }

    async fn run_as(
        &self,
        runtime: &ContainerRuntime,
        a: &Assignment,
        script: &str,
    ) -> (Option<i32>, Option<LeaseFailure>, String) {
        let mut running = self.start(runtime, a, script);
        let exit = tokio::time::timeout(PATIENCE, running.wait())
            .await
            .expect("the container ends")
            .unwrap();
        let log = fs::read_to_string(a.log_file.as_ref().unwrap()).unwrap_or_default();
        (exit.code, running.failure(), log)
    }

    fn containers(&self) -> Vec<String> {
        podman(&[
            "ps",
            "--all",
            "--filter",
            &format!("label=leasehold.node={}", self.id),
            "--format",
            "{{.Names}}",
        ])
        .lines()
        .map(String::from)
        .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for name in self.containers() {
            podman(&["rm", "--force", &name]);
        }
        // A test that failed midway leaves its tenants' networks.
        let networks = podman(&[
            "network",
            "ls",
            "--filter",
            &format!("label=leasehold.node={}", self.id),
            "--format",
            "{{.Name}}",
        ]);
        for name in networks.lines() {
            podman(&["network", "rm", "--force", name]);
        }
        let _ = fs::remove_dir_all(&self.devices);
    }
}

/// The value of `key:` in a `/proc/<pid>/status`-style text.
fn status_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

#[tokio::test]
async fn the_root_is_read_only_and_scratch_is_writable() {
    let node = Node::new();
    // /root is root's own (0755): only a read-only root refuses it.
    let (code, _, log) = node
        .run(
            "touch /root/x && echo root-written; touch /scratch/y && echo scratch-written; \
             grep ' / / ' /proc/self/mountinfo | cut -d' ' -f6 | sed 's/^/root-mount=/'",
        )
        .await;
    assert_eq!(code, Some(0), "{log}");
    assert!(
        !log.contains("root-written"),
        "the root took a write: {log}"
    );
    assert!(log.contains("Read-only file system"), "{log}");
    assert!(log.contains("scratch-written"), "{log}");
    let options = log
        .lines()
        .find_map(|l| l.strip_prefix("root-mount="))
        .unwrap();
    assert!(options.split(',').any(|o| o == "ro"), "{log}");
}

#[tokio::test]
async fn no_capability_no_new_privileges_and_the_default_seccomp_filter() {
    let node = Node::new();
    let (code, _, log) = node.run("cat /proc/self/status").await;
    assert_eq!(code, Some(0), "{log}");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            status_field(&log, cap),
            Some("0000000000000000"),
            "{cap}: {log}"
        );
    }
    assert_eq!(status_field(&log, "NoNewPrivs"), Some("1"), "{log}");
    // 2: a filter (the engine's default profile); 0 would be none.
    assert_eq!(status_field(&log, "Seccomp"), Some("2"), "{log}");
}

#[tokio::test]
async fn no_host_path_is_mounted() {
    let node = Node::new();
    let (code, _, log) = node.run("cat /proc/self/mountinfo").await;
    assert_eq!(code, Some(0), "{log}");
    // The engine's own per-container files are the only mounts from a
    // host filesystem; everything else is the image's root or virtual.
    const ENGINE_FILES: [&str; 4] = [
        "/etc/hosts",
        "/etc/hostname",
        "/etc/resolv.conf",
        "/run/.containerenv",
    ];
    const VIRTUAL: [&str; 8] = [
        "proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "devtmpfs",
    ];
    let mut checked = 0;
    for line in log.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (mount_point, fs_type) = (fields[4], fields[dash + 1]);
        checked += 1;
        if VIRTUAL.contains(&fs_type) || (mount_point == "/" && fs_type == "overlay") {
            continue;
        }
        assert!(
            ENGINE_FILES.contains(&mount_point),
            "a host filesystem ({fs_type}) at {mount_point}: {line}"
        );
    }
    assert!(checked > 5, "{log}");
}

#[tokio::test]
async fn root_inside_is_an_unprivileged_id_outside_and_each_container_has_its_own() {
    let node = Node::new();
    let runtime = node.runtime();
    let (a, b) = (node.assignment(&["GPU-0"]), node.assignment(&["GPU-1"]));
    let mut first = node.start(&runtime, &a, "id -u; cat /proc/self/uid_map; sleep 30");
    let mut second = node.start(&runtime, &b, "cat /proc/self/uid_map; sleep 30");
    let host_uid = |lease: Uuid| -> u32 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let pid = podman(&[
                "inspect",
                "--format",
                "{{.State.Pid}}",
                &format!("lh-{lease}"),
            ]);
            if let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) {
                if pid != "0" && !pid.is_empty() {
                    let uids = status_field(&status, "Uid").unwrap().to_string();
                    return uids.split_whitespace().next().unwrap().parse().unwrap();
                }
            }
            assert!(Instant::now() < deadline, "lh-{lease} never ran");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let (uid_a, uid_b) = (host_uid(a.lease_id), host_uid(b.lease_id));
    first.stop(Duration::ZERO).await.unwrap();
    second.stop(Duration::ZERO).await.unwrap();
    let log = fs::read_to_string(a.log_file.as_ref().unwrap()).unwrap();
    assert_eq!(log.lines().next(), Some("0"), "root inside: {log}");
    assert!(uid_a >= 65_536, "root inside is uid {uid_a} outside");
    assert!(uid_b >= 65_536, "root inside is uid {uid_b} outside");
    assert!(
        uid_a.abs_diff(uid_b) >= 65_536,
        "two containers share ids: {uid_a} and {uid_b}"
    );
}

#[tokio::test]
async fn limits_of_processes_files_and_cpu_come_from_the_lease() {
    let node = Node::new();
    let mut runtime = node.runtime();
    runtime.pids_max = 64;
    let a = node.assignment(&["GPU-0"]);
    let (code, _, log) = node
        .run_as(
            &runtime,
            &a,
            "echo nofile=$(ulimit -n); echo nproc=$(ulimit -u); \
             cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max 2>/dev/null | sed 's/^/pids=/'; \
             cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null | sed 's/^/quota=/'; \
             cat /sys/fs/cgroup/cpu.max 2>/dev/null | sed 's/^/quota=/'; \
             (i=0; while [ $i -lt 100 ]; do sleep 5 & i=$((i+1)); echo spawned=$i; done) 2>/dev/null; \
             true",
        )
        .await;
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("nofile=16384"), "{log}");
    assert!(log.contains("nproc=64"), "{log}");
    assert!(log.contains("pids=64"), "{log}");
    assert!(
        log.contains("quota=50000") || log.contains("quota=50000 100000"),
        "half a core: {log}"
    );
    let spawned: u32 = log
        .lines()
        .filter_map(|l| l.strip_prefix("spawned="))
        .next_back()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (32..64).contains(&spawned),
        "{spawned} processes started under a limit of 64"
    );
}

/// The memory cgroup `pid` is in (v1 `memory:` or the v2 line).
fn memory_cgroup_of(pid: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let line = text
        .lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "memory"))
        })
        .or_else(|| text.lines().find(|l| l.starts_with("0::")))?;
    Some(line.rsplit(':').next()?.to_string())
}

#[tokio::test]
async fn the_engine_s_monitor_is_not_under_the_lease_s_memory_limit() {
    let node = Node::new();
    let runtime = node.runtime();
    let a = node.assignment(&["GPU-0"]);
    let mut running = node.start(&runtime, &a, "sleep 30");
    let lease_parent = format!("/leasehold/lh-{}", a.lease_id);
    let deadline = Instant::now() + PATIENCE;
    let (workload, monitor) = loop {
        let pids = podman(&[
            "inspect",
            "--format",
            "{{.State.Pid}} {{.State.ConmonPid}}",
            &format!("lh-{}", a.lease_id),
        ]);
        if let Some((pid, conmon)) = pids.split_once(' ') {
            if let (Some(w), Some(m)) = (memory_cgroup_of(pid), memory_cgroup_of(conmon)) {
                if pid != "0" && conmon != "0" {
                    break (w, m);
                }
            }
        }
        assert!(Instant::now() < deadline, "lh-{} never ran", a.lease_id);
        std::thread::sleep(Duration::from_millis(100));
    };
    running.stop(Duration::ZERO).await.unwrap();
    assert!(
        workload.starts_with(&lease_parent),
        "the workload is charged to its lease: {workload}"
    );
    // A workload at its limit would starve or kill the process that
    // records how it ended.
    assert!(
        !monitor.starts_with(&lease_parent),
        "conmon is under the lease's limit: {monitor}"
    );
}

#[tokio::test]
async fn over_its_memory_the_workload_is_oom_killed_and_the_lease_says_so() {
    let node = Node::new();
    let mut a = node.assignment(&["GPU-0"]);
    // 80 % of 40 MiB: a 100 MB string does not fit.
    a.memory_share_bytes = Some(40 * MIB);
    let (code, failure, log) = node
        .run_as(
            &node.runtime(),
            &a,
            "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo survived",
        )
        .await;
    assert_eq!(code, Some(137), "{log}");
    assert_eq!(failure, Some(LeaseFailure::OutOfMemory), "{log}");
    assert!(!log.contains("survived"));
    // Within its limit the same lease lives.
    let small = node.assignment(&["GPU-0"]);
    let (code, failure, log) = node
        .run_as(
            &node.runtime(),
            &small,
            "x=$(head -c 1000000 /dev/zero | tr '\\0' a); echo survived",
        )
        .await;
    assert_eq!((code, failure), (Some(0), None), "{log}");
    assert!(
        !Path::new(CGROUP_MOUNT)
            .join("memory/leasehold")
            .join(format!("lh-{}", a.lease_id))
            .exists(),
        "the lease's parent cgroup is removed"
    );
}

#[tokio::test]
async fn no_network_reaches_the_host_or_anything_else() {
    let node = Node::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (code, _, log) = node
        .run(&format!(
            "cat /proc/net/dev | sed 1,2d | cut -d: -f1 | sed 's/^ */iface=/'; \
             echo routes=$(ip route | wc -l); \
             nc -w 2 127.0.0.1 {port} </dev/null && echo host-reached; \
             nc -w 2 169.254.169.254 80 </dev/null && echo metadata-reached; echo done"
        ))
        .await;
    assert_eq!(code, Some(0), "{log}");
    let ifaces: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("iface="))
        .collect();
    assert_eq!(ifaces, ["lo"], "{log}");
    assert!(log.contains("routes=0"), "{log}");
    assert!(!log.contains("reached"), "{log}");
    assert!(
        listener.accept().is_err(),
        "the host's listener was reached"
    );
}

/// Runs `ip` with `args`, which must succeed.
fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("ip runs");
    assert!(status.success(), "ip {args:?}: {status}");
}

/// A metadata address on the host, as a cloud node has one: an interface
/// of the test's own (a bridge: this kernel has no dummy interfaces) with
/// 169.254.169.254, removed on drop.
struct MetadataAddress {
    iface: String,
    listener: TcpListener,
}

impl MetadataAddress {
    fn new() -> Self {
        let iface = format!("lhmd{}", &Uuid::new_v4().simple().to_string()[..8]);
        ip(&["link", "add", &iface, "type", "bridge"]);
        MetadataAddress {
            listener: {
                ip(&["addr", "add", "169.254.169.254/32", "dev", &iface]);
                ip(&["link", "set", &iface, "up"]);
                let listener =
                    TcpListener::bind("169.254.169.254:80").expect("bind the metadata address");
                listener.set_nonblocking(true).unwrap();
                listener
            },
            iface,
        }
    }
}

impl Drop for MetadataAddress {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.iface])
            .status();
    }
}

/// A network outside the node that the test makes: a namespace behind a
/// veth pair, 198.51.100.2 (TEST-NET-2) listening on port 9, reached from
/// the host at 198.51.100.1. Removed on drop.
struct Outside {
    namespace: String,
    host_end: String,
    listener: Child,
}

const OUTSIDE_ADDRESS: &str = "198.51.100.2";

impl Outside {
    fn new() -> Self {
        let tag = &Uuid::new_v4().simple().to_string()[..8];
        let (namespace, host_end, far_end) = (
            format!("lhout{tag}"),
            format!("lho{tag}"),
            format!("lhi{tag}"),
        );
        ip(&["netns", "add", &namespace]);
        ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", &far_end,
        ]);
        ip(&["link", "set", &far_end, "netns", &namespace]);
        ip(&["addr", "add", "198.51.100.1/24", "dev", &host_end]);
        ip(&["link", "set", &host_end, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &namespace, "ip"];
            all.extend(args);
            ip(&all);
        };
        inside(&["addr", "add", "198.51.100.2/24", "dev", &far_end]);
        inside(&["link", "set", &far_end, "up"]);
        inside(&["link", "set", "lo", "up"]);
        inside(&["route", "add", "default", "via", "198.51.100.1"]);
        let listener = Command::new("ip")
            .args(["netns", "exec", &namespace, "python3", "-c"])
            .arg(
                "import socket,time\n\
                 s=socket.socket(); s.bind(('0.0.0.0', 9)); s.listen(64)\n\
                 while True: s.accept()[0].close()",
            )
            .spawn()
            .expect("the outside listener starts");
        Outside {
            namespace,
            host_end,
            listener,
        }
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.listener.kill();
        let _ = self.listener.wait();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_end])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.namespace])
            .status();
    }
}

/// The host's firewall drops what `bridge` sends it, IPv4 and IPv6: the
/// tenant networks' chain has the rule, and `INPUT` jumps to the chain.
fn assert_guarded(bridge: &str) {
    for tool in ["iptables", "ip6tables"] {
        let rules = |chain: &str| {
            let output = Command::new(tool).args(["-S", chain]).output().unwrap();
            assert!(output.status.success(), "{tool} -S {chain}");
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        assert!(
            rules("LH-TENANT-INPUT").contains(&format!("-A LH-TENANT-INPUT -i {bridge} -j DROP")),
            "{tool}: {}",
            rules("LH-TENANT-INPUT")
        );
        assert!(
            rules("INPUT").contains("-j LH-TENANT-INPUT"),
            "{tool}: {}",
            rules("INPUT")
        );
    }
}

/// The address `name` has on its network, once it has one.
async fn container_address(name: &str) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let ip = podman(&[
            "container",
            "inspect",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            name,
        ]);
        if !ip.is_empty() {
            return ip;
        }
        assert!(Instant::now() < deadline, "{name} has no address");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_tenant_network_reaches_the_tenants_containers_and_nothing_else() {
    let node = Node::new();
    let runtime = node.runtime();
    let (tenant_a, tenant_b) = (Uuid::new_v4(), Uuid::new_v4());
    let on_network = |script: String| Workload {
        command: vec!["sh".into(), "-c".into(), script],
        image: Some(BASE.into()),
        env: BTreeMap::new(),
        network: lh_events::WorkloadNetwork::Tenant,
        mounts: Vec::new(),
        store: None,
    };
    // The host's services listen on all addresses, IPv4 and IPv6.
    let host_service = TcpListener::bind("[::]:0").unwrap();
    host_service.set_nonblocking(true).unwrap();
    let port = host_service.local_addr().unwrap().port();
    let metadata = MetadataAddress::new();
    let _outside = Outside::new();

    let mut a1_lease = node.assignment(&["GPU-0"]);
    a1_lease.tenant_id = Some(tenant_a);
    let mut a1 = runtime
        .start(
            &a1_lease,
            &on_network("while true; do echo a1-answers | nc -l -p 8000; done".into()),
        )
        .expect("the container starts");
    let a1_address = container_address(&format!("lh-{}", a1_lease.lease_id)).await;
    let network = runtime.tenant_networks.network_name(tenant_a);
    let a_bridge = podman(&[
        "network",
        "inspect",
        "--format",
        "{{.NetworkInterface}}",
        &network,
    ]);
    assert!(!a_bridge.is_empty(), "{network}");
    assert_guarded(&a_bridge);
    let host_v6 = fs::read_to_string("/proc/net/if_inet6")
        .unwrap_or_default()
        .lines()
        .find(|l| l.ends_with(&format!(" {a_bridge}")) && l.starts_with("fe80"))
        .map(|l| {
            let hex = l.split_whitespace().next().unwrap();
            (0..8)
                .map(|i| &hex[i * 4..i * 4 + 4])
                .collect::<Vec<_>>()
                .join(":")
        });
    // Every address of the host (the other bridges' among them), and the
    // tenant's network's gateway if the engine gave the host one.
    let mut host_addresses: Vec<String> =
        String::from_utf8_lossy(&Command::new("hostname").arg("-I").output().unwrap().stdout)
            .split_whitespace()
            .take(16)
            .map(String::from)
            .collect();
    let gateway = podman(&[
        "network",
        "inspect",
        "--format",
        "{{range .Subnets}}{{.Gateway}}{{end}}",
        &network,
    ]);
    if gateway.parse::<std::net::IpAddr>().is_ok() {
        host_addresses.push(gateway);
    }
    assert!(!host_addresses.is_empty());
    // What a container tries: the tenant's other container, then every
    // address of the host and the metadata address (`-e true`: a
    // connection made ends at once, and counts).
    let probe = || {
        // The tenant's first container first, one connection at a time (it
        // answers one after the other), the form that counts a connection
        // as made included; then everything else at once, each in the
        // background, so that the dropped ones wait their 3 s together.
        let mut script = format!(
            "nc -w 3 {a1_address} 8000 </dev/null | sed 's/^/got=/'; sleep 0.3; \
             nc -w 3 {a1_address} 8000 -e true && echo connected-a1; \
             (nc -w 3 169.254.169.254 80 -e true && echo reached-metadata) & \
             (nc -w 3 {OUTSIDE_ADDRESS} 9 -e true && echo reached-outside) & "
        );
        for address in &host_addresses {
            script.push_str(&format!(
                "(nc -w 3 {address} {port} -e true && echo reached-host-{address}) & "
            ));
        }
        if let Some(v6) = &host_v6 {
            // Link-local addresses answer once duplicate detection is
            // over, here and on the host's new bridge: wait for both.
            script.push_str(&format!(
                "(for i in $(seq 50); do ip -6 addr show dev eth0 | grep -q tentative || break; \
                 sleep 0.1; done; sleep 2; \
                 nc -w 3 {v6}%eth0 {port} -e true && echo reached-ipv6) & "
            ));
        }
        script.push_str(&format!(
            "wait; echo probed-ipv6={}; echo done",
            host_v6.is_some()
        ));
        script
    };

    // Tenant B, on its own network: nothing.
    let mut b1_lease = node.assignment(&["GPU-1"]);
    b1_lease.tenant_id = Some(tenant_b);
    let b_network = runtime.tenant_networks.network_name(tenant_b);
    let mut b1 = runtime
        .start(&b1_lease, &on_network(probe()))
        .expect("the container starts");
    tokio::time::timeout(PATIENCE, b1.wait())
        .await
        .expect("b1 ends")
        .unwrap();
    let b_log = fs::read_to_string(b1_lease.log_file.as_ref().unwrap()).unwrap();
    assert!(b_log.contains("done"), "{b_log}");
    assert!(
        !b_log.contains("got=") && !b_log.contains("reached"),
        "tenant B: {b_log}"
    );
    assert!(
        !podman(&["network", "ls", "--format", "{{.Name}}"]).contains(&b_network),
        "tenant B's network goes with its last container"
    );

    // Tenant A's second container reaches the first, and nothing else.
    let mut a2_lease = node.assignment(&["GPU-2"]);
    a2_lease.tenant_id = Some(tenant_a);
    let mut a2 = runtime
        .start(&a2_lease, &on_network(probe()))
        .expect("the container starts");
    tokio::time::timeout(PATIENCE, a2.wait())
        .await
        .expect("a2 ends")
        .unwrap();
    let a_log = fs::read_to_string(a2_lease.log_file.as_ref().unwrap()).unwrap();
    assert!(
        a_log.contains("got=a1-answers"),
        "tenant A's own container: {a_log}"
    );
    assert!(
        a_log.contains("connected-a1"),
        "the probe's form connects: {a_log}"
    );
    if Path::new("/proc/net/if_inet6").exists() {
        assert!(a_log.contains("probed-ipv6=true"), "{a_log}");
    }
    assert!(!a_log.contains("reached"), "tenant A: {a_log}");
    assert!(
        host_service.accept().is_err(),
        "the host's service was reached"
    );
    assert!(
        metadata.listener.accept().is_err(),
        "the metadata address was reached"
    );

    // The network stays while A1 runs, and goes with it.
    assert!(podman(&["network", "ls", "--format", "{{.Name}}"]).contains(&network));
    a1.stop(Duration::from_secs(1)).await.unwrap();
    assert!(
        !podman(&["network", "ls", "--format", "{{.Name}}"]).contains(&network),
        "tenant A's network goes with its last container"
    );
}

#[tokio::test]
async fn only_the_leased_gpus_device_nodes_are_inside() {
    let node = Node::new();
    let runtime = node.runtime();
    // The node's two GPUs, as the agent makes their stand-ins.
    lh_node_agent::workload::container::make_stand_in_devices(
        &node.devices,
        &node.assignment(&["GPU-0", "GPU-1"]),
    )
    .unwrap();
    let a = node.assignment(&["GPU-1"]);
    let dir = node.devices.display();
    let (code, _, log) = node
        .run_as(
            &runtime,
            &a,
            &format!("ls {dir}/ | sed 's/^/device=/'; echo x > {dir}/GPU-1 && echo written; ls /dev | sed 's/^/dev=/'"),
        )
        .await;
    assert_eq!(code, Some(0), "{log}");
    let devices: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("device="))
        .collect();
    assert_eq!(devices, ["GPU-1"], "{log}");
    assert!(log.contains("written"), "{log}");
    assert!(!log.contains("dev=nvidia"), "{log}");
}

#[tokio::test]
async fn the_tenants_values_are_inside_only() {
    let node = Node::new();
    let runtime = node.runtime();
    let a = node.assignment(&["GPU-0"]);
    let secret = format!("s3cret-{}", Uuid::new_v4().simple());
    let env = BTreeMap::from([("HF_TOKEN".to_string(), secret.clone())]);
    let mut running = node.start_image(&runtime, &a, BASE, "echo token=$HF_TOKEN; sleep 30", env);
    let log_file = a.log_file.clone().unwrap();
    let deadline = Instant::now() + PATIENCE;
    while !fs::read_to_string(&log_file)
        .unwrap_or_default()
        .contains("token=")
    {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // No process of the host's own (one pid namespace deep) shows it in
    // its arguments or environment: the CLI, conmon, the runtime.
    let mut looked = 0;
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        if status_field(&status, "NSpid").is_some_and(|ids| ids.split_whitespace().count() > 1) {
            continue; // inside a container
        }
        for file in ["cmdline", "environ"] {
            if let Ok(bytes) = fs::read(entry.path().join(file)) {
                looked += 1;
                assert!(
                    !String::from_utf8_lossy(&bytes).contains(&secret),
                    "host process {pid} holds the value in its {file}"
                );
            }
        }
    }
    running.stop(Duration::ZERO).await.unwrap();
    assert!(looked > 10);
    let log = fs::read_to_string(&log_file).unwrap();
    assert!(log.contains(&format!("token={secret}")), "{log}");
}

#[tokio::test]
async fn a_missing_image_a_start_timeout_and_an_exit_code_are_told_apart() {
    let node = Node::new();
    let runtime = node.runtime();
    let a = node.assignment(&["GPU-0"]);
    let absent = format!("localhost/leasehold/absent-{}:1", Uuid::new_v4().simple());
    let mut missing = node.start_image(&runtime, &a, &absent, "true", BTreeMap::new());
    let exit = missing.wait().await.unwrap();
    assert_eq!(exit.code, Some(125));
    assert_eq!(missing.failure(), Some(LeaseFailure::ImageMissing));

    // A registry that takes the connection and never answers: the pull
    // hangs, and the start deadline ends it.
    let registry = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = registry.local_addr().unwrap().port();
    let _held = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in registry.incoming().flatten() {
            held.push(stream);
        }
    });
    let mut stuck_runtime = node.runtime();
    stuck_runtime.pull = PullPolicy::Always;
    stuck_runtime.start_timeout = Duration::from_secs(2);
    let b = node.assignment(&["GPU-0"]);
    let began = Instant::now();
    let mut stuck = node.start_image(
        &stuck_runtime,
        &b,
        &format!("127.0.0.1:{port}/leasehold/stuck:1"),
        "true",
        BTreeMap::new(),
    );
    tokio::time::timeout(PATIENCE, stuck.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stuck.failure(), Some(LeaseFailure::StartTimeout));
    assert!(began.elapsed() >= Duration::from_secs(2));

    let (code, failure, log) = node.run("echo before; exit 3").await;
    assert_eq!(
        (code, failure),
        (Some(3), None),
        "the workload's own: {log}"
    );
    assert!(log.contains("before"));
    assert!(node.containers().is_empty(), "{:?}", node.containers());
}

// ---- the host reconciled after the agent is killed ---------------------------

const ENV_NODE: &str = "LH_TEST_ENGINE_NODE";
const ENV_STATE_DIR: &str = "LH_TEST_ENGINE_STATE_DIR";
const ENV_LEASES: &str = "LH_TEST_ENGINE_LEASES";
const PLACEMENT: u64 = 7;

fn gpus(index: u32) -> Vec<AssignedGpu> {
    vec![AssignedGpu {
        index,
        uuid: format!("GPU-{index}"),
        milli: None,
        vram_gb: None,
        mig_instance: None,
    }]
}

fn workloads(
    node: &str,
    state_dir: &Path,
) -> (Workloads, tokio::sync::mpsc::UnboundedReceiver<Finished>) {
    let marks = HostMarks {
        node_id: node.into(),
        state_dir: state_dir.to_path_buf(),
    };
    let settings = ContainerSettings {
        global_args: PODMAN_ARGS.map(String::from).into(),
        pull: PullPolicy::Never,
        stand_in_devices: Some(PathBuf::from("/dev/leasehold-sim").join(node)),
        ..Default::default()
    };
    let (mut workloads, finished) = Workloads::with_settings(
        RuntimeKind::Podman,
        Some("podman".into()),
        Duration::from_secs(2),
        marks,
        None,
        settings,
    )
    .unwrap();
    // 64 MiB a lease: over it, a workload is OOM-killed.
    workloads.share_out(lh_node_agent::workload::assignment::Host {
        memory_bytes: 8 * 64 * MIB,
        gpu_count: 8,
        cpu_milli: Some(2000),
        per_gpu: None,
    });
    (workloads, finished)
}

#[test]
#[ignore = "the agent the reconcile test kills; it runs it"]
fn previous_agent_with_containers() {
    let node = std::env::var(ENV_NODE).unwrap();
    let state_dir = PathBuf::from(std::env::var(ENV_STATE_DIR).unwrap());
    let leases: Vec<Uuid> = std::env::var(ENV_LEASES)
        .unwrap()
        .split(',')
        .map(|l| l.parse().unwrap())
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (mut workloads, _finished) = workloads(&node, &state_dir);
        for (i, lease) in leases.iter().enumerate() {
            // The second outgrows its memory once told to (after the
            // agent's successor adopted it); the first and third are on
            // their tenants' networks.
            let script = match i {
                1 => {
                    "echo up; while [ ! -e /scratch/go ]; do sleep 0.1; done; \
                      x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo survived"
                }
                _ => "echo up; sleep 300",
            };
            let spec = WorkloadSpec {
                command: vec!["sh".into(), "-c".into(), script.into()],
                image: Some(BASE.into()),
                env: Default::default(),
                env_ref: None,
                network: match i {
                    0 | 2 => lh_events::WorkloadNetwork::Tenant,
                    _ => lh_events::WorkloadNetwork::None,
                },
                template: None,
                datasets: Vec::new(),
                workspaces: Vec::new(),
                object_store: false,
            };
            let tenant = Uuid::from_u128(i as u128 + 1);
            assert!(workloads
                .start_for(
                    Some(tenant),
                    *lease,
                    PLACEMENT,
                    &gpus(i as u32),
                    &[],
                    Some(&spec)
                )
                .unwrap());
        }
        println!("started");
        std::future::pending::<()>().await
    });
}

#[tokio::test]
async fn after_a_kill_9_of_the_agent_its_successor_adopts_what_is_placed_and_removes_the_rest() {
    let node = Node::new();
    let state_dir = node.dir.path().join("state");
    let leases: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
    let mut agent: Child = Command::new(std::env::current_exe().unwrap())
        .args([
            "previous_agent_with_containers",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(ENV_NODE, &node.id)
        .env(ENV_STATE_DIR, &state_dir)
        .env(
            ENV_LEASES,
            leases
                .iter()
                .map(Uuid::to_string)
                .collect::<Vec<_>>()
                .join(","),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Under load: every container running before the kill.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let running = podman(&[
            "ps",
            "--filter",
            &format!("label=leasehold.node={}", node.id),
            "--filter",
            "status=running",
            "--format",
            "{{.Names}}",
        ]);
        if running.lines().count() == leases.len() {
            break;
        }
        assert!(Instant::now() < deadline, "running: {running}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agent.kill().unwrap();
    agent.wait().unwrap();

    // Two leases are still placed here; the other four ended meanwhile.
    let placed: HashMap<Uuid, u64> = leases[..2].iter().map(|l| (*l, PLACEMENT)).collect();
    let (mut successor, mut finished) = workloads(&node.id, &state_dir);
    let reconciled = successor.reconcile(&placed).await;
    let mut adopted: Vec<Uuid> = reconciled.adopted.iter().map(|(l, _)| *l).collect();
    adopted.sort();
    let mut expected = leases[..2].to_vec();
    expected.sort();
    assert_eq!(adopted, expected);
    assert_eq!(reconciled.reaped, 4);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut left = node.containers();
        left.sort();
        let mut wanted: Vec<String> = expected.iter().map(|l| format!("lh-{l}")).collect();
        wanted.sort();
        if left == wanted {
            break;
        }
        assert!(Instant::now() < deadline, "left: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The reaped container's network went with it; the adopted one's
    // stays while it runs.
    let networks = || {
        podman(&[
            "network",
            "ls",
            "--filter",
            &format!("label=leasehold.node={}", node.id),
            "--format",
            "{{.Name}}",
        ])
    };
    let deadline = Instant::now() + PATIENCE;
    while networks().lines().count() != 1 {
        assert!(Instant::now() < deadline, "networks: {}", networks());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(networks().contains(&Uuid::from_u128(1).simple().to_string()));
    let adopted_bridge = podman(&[
        "network",
        "inspect",
        "--format",
        "{{.NetworkInterface}}",
        networks().trim(),
    ]);
    assert_guarded(&adopted_bridge);
    // An adopted container that outgrows its memory fails as a started
    // one does.
    podman(&["exec", &format!("lh-{}", leases[1]), "touch", "/scratch/go"]);
    let ended = tokio::time::timeout(PATIENCE, finished.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ended.lease_id, leases[1]);
    assert_eq!(ended.failure, Some(LeaseFailure::OutOfMemory));
    successor.forget(ended.lease_id, ended.placement);
    // The other is stopped, and removed with its parent cgroup and its
    // network.
    assert!(successor.stop(leases[0]));
    let ended = tokio::time::timeout(PATIENCE, finished.recv())
        .await
        .unwrap()
        .unwrap();
    successor.forget(ended.lease_id, ended.placement);
    assert_eq!(networks(), "");
    let deadline = Instant::now() + PATIENCE;
    while !node.containers().is_empty() {
        assert!(Instant::now() < deadline, "{:?}", node.containers());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for lease in &leases {
        assert!(
            !Path::new(CGROUP_MOUNT)
                .join("memory/leasehold")
                .join(format!("lh-{lease}"))
                .exists(),
            "lh-{lease}'s parent cgroup is left"
        );
    }
}
