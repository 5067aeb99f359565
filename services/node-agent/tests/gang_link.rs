//! The link between a gang's containers, on the real kernel: members on
//! one host share a bridge in the segment's own namespace; members on two
//! hosts meet over VXLAN; two gangs with the same addresses never meet; no
//! member reaches a host. "Hosts" are network namespaces this test makes,
//! joined by a veth pair; "containers" are processes in network namespaces
//! of their own. Each host's agent is this test binary run again inside
//! its host's namespace, with a `/run/netns` of its own (as a real host has).

use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lh_node_agent::workload::gang_link::{
    GangLink, DEFAULT_LOCK_FILE, LINK_IN_CONTAINER, VXLAN_PORT,
};
use uuid::Uuid;

/// Set in the run of this binary that plays one host's agent.
const HELPER_ENV: &str = "LH_TEST_GANG_LINK_HELPER";
/// What the helper's answer follows.
const SAID: &str = "gang-link: ";

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `pid`'s network namespace reaches `address` (two pings).
fn reaches(pid: u32, address: Ipv4Addr) -> bool {
    let pid = pid.to_string();
    let address = address.to_string();
    (0..3).any(|_| {
        Command::new("nsenter")
            .args(["-t", &pid, "-n", "busybox", "ping", "-c", "1", "-W", "2"])
            .arg(&address)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// `ip -o link show` of the link in `pid`'s namespace (its `/sys` is the
/// host's, so not read there).
fn link_line(pid: u32) -> String {
    run(
        "nsenter",
        &[
            "-t",
            &pid.to_string(),
            "-n",
            "ip",
            "-o",
            "link",
            "show",
            LINK_IN_CONTAINER,
        ],
    )
}

/// The link's MAC in `pid`'s namespace.
fn link_mac(pid: u32) -> String {
    let line = link_line(pid);
    line.split(" link/ether ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

/// The MAC `pid`'s namespace reached `address` at.
fn neighbour_mac(pid: u32, address: Ipv4Addr) -> String {
    let out = run(
        "nsenter",
        &[
            "-t",
            &pid.to_string(),
            "-n",
            "ip",
            "neigh",
            "show",
            &address.to_string(),
        ],
    );
    out.split(" lladdr ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

/// A process in a network namespace of its own: a container's stand-in.
/// `host`: the named namespace it is started from.
struct Container(Child);

impl Container {
    fn start(host: Option<&str>) -> Self {
        let mut command = match host {
            Some(host) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{host}")).arg("unshare");
                c
            }
            None => Command::new("unshare"),
        };
        let child = command
            .args(["--net", "sleep", "300"])
            .spawn()
            .expect("unshare runs");
        let container = Container(child);
        // Until the exec'd sleep has its own namespace.
        let own = std::fs::read_link("/proc/self/ns/net").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{}/ns/net", container.pid()))
            .ok()
            .is_none_or(|ns| ns == own || !Self::is_sleep(container.pid()))
        {
            assert!(
                Instant::now() < deadline,
                "the container never got its namespace"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        container
    }

    fn is_sleep(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two hosts: named namespaces joined by a veth pair, `10.251.<n>.1` and
/// `.2`; removed when dropped.
struct Hosts {
    names: [String; 2],
    addresses: [Ipv4Addr; 2],
    /// Each host's end of the veth pair between them.
    underlay: [String; 2],
}

impl Hosts {
    fn new() -> Self {
        let tag = &Uuid::new_v4().simple().to_string()[..6];
        let names = [format!("lht{tag}a"), format!("lht{tag}b")];
        let n = u8::from_str_radix(&tag[..2], 16).unwrap();
        let addresses = [Ipv4Addr::new(10, 251, n, 1), Ipv4Addr::new(10, 251, n, 2)];
        for name in &names {
            run("ip", &["netns", "add", name]);
            run("ip", &["-n", name, "link", "set", "lo", "up"]);
        }
        let (a, b) = (format!("lhu{tag}a"), format!("lhu{tag}b"));
        run(
            "ip",
            &[
                "-n", &names[0], "link", "add", &a, "type", "veth", "peer", "name", &b, "netns",
                &names[1],
            ],
        );
        for (i, (name, end)) in names.iter().zip([&a, &b]).enumerate() {
            run(
                "ip",
                &[
                    "-n",
                    name,
                    "addr",
                    "add",
                    &format!("{}/24", addresses[i]),
                    "dev",
                    end,
                ],
            );
            run("ip", &["-n", name, "link", "set", end, "up"]);
        }
        Hosts {
            names,
            addresses,
            underlay: [a, b],
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// One host's agent: this binary, in `host`'s namespace with a
/// `/run/netns` of its own, linking `container` as `link`'s member. It
/// holds its segment until dropped, then releases it.
struct Agent {
    child: Child,
    /// Read to its end when dropped, so the helper's last words have a
    /// reader.
    output: Option<std::io::Lines<BufReader<std::process::ChildStdout>>>,
}

impl Agent {
    fn link(host: &str, link: &GangLink, container: &Container, lock: &Path) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{host}"))
            .args(["unshare", "--mount", "--propagation", "private", "sh", "-c"])
            .arg("mkdir -p /run/netns && mount -t tmpfs lh-netns /run/netns && exec \"$0\" \"$@\"")
            .arg(&exe)
            .args([
                "--exact",
                "a_host_s_agent",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(HELPER_ENV, "1")
            .env("LH_TEST_LEASE", link.lease_id.to_string())
            .env("LH_TEST_RANK", link.node_rank.to_string())
            .env("LH_TEST_MEMBERS", link.members.join(","))
            .env("LH_TEST_PID", container.pid().to_string())
            .env("LH_TEST_LOCK", lock)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // The harness prints the test's name on the same line.
        let said = lines
            .find_map(|l| Some(l.ok()?.split_once(SAID)?.1.to_string()))
            .unwrap_or_default();
        assert_eq!(said, "linked", "the agent on {host}");
        Agent {
            child,
            output: Some(lines),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        if let Some(lines) = self.output.take() {
            lines.for_each(drop);
        }
        let _ = self.child.wait();
    }
}

/// The agent's side, run only by [`Agent::link`].
#[test]
fn a_host_s_agent() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap();
    let link = GangLink {
        lease_id: var("LH_TEST_LEASE").parse().unwrap(),
        node_rank: var("LH_TEST_RANK").parse().unwrap(),
        members: var("LH_TEST_MEMBERS")
            .split(',')
            .map(String::from)
            .collect(),
    };
    let lock = PathBuf::from(var("LH_TEST_LOCK"));
    match link.attach(var("LH_TEST_PID").parse().unwrap(), &lock) {
        Ok(()) => println!("{SAID}linked"),
        Err(why) => println!("{SAID}failed: {why}"),
    }
    std::io::stdout().flush().unwrap();
    // Held until the test closes the pipe.
    let _ = std::io::stdin().read_line(&mut String::new());
    link.release(&lock);
}

fn gang(members: &[String], rank: u32, lease: Uuid) -> GangLink {
    GangLink {
        lease_id: lease,
        node_rank: rank,
        members: members.to_vec(),
    }
}

#[test]
fn members_on_two_hosts_meet_over_vxlan_and_two_gangs_never_meet() {
    if std::env::var_os(HELPER_ENV).is_some() {
        return;
    }
    let hosts = Hosts::new();
    // The host's own lock: a release sweeps every empty segment of the
    // host, so it must not meet another test's half-made one.
    let lock = PathBuf::from(DEFAULT_LOCK_FILE);
    let members: Vec<String> = hosts.addresses.iter().map(|a| a.to_string()).collect();
    let (first, second) = (Uuid::new_v4(), Uuid::new_v4());
    let (a0, a1) = (
        Container::start(Some(&hosts.names[0])),
        Container::start(Some(&hosts.names[1])),
    );
    let (b0, b1) = (
        Container::start(Some(&hosts.names[0])),
        Container::start(Some(&hosts.names[1])),
    );
    let _agents = [
        Agent::link(&hosts.names[0], &gang(&members, 0, first), &a0, &lock),
        Agent::link(&hosts.names[1], &gang(&members, 1, first), &a1, &lock),
        Agent::link(&hosts.names[0], &gang(&members, 0, second), &b0, &lock),
        Agent::link(&hosts.names[1], &gang(&members, 1, second), &b1, &lock),
    ];
    let (rank0, rank1) = (GangLink::address(0), GangLink::address(1));
    // Each host's segment is its own (each agent has its own /run/netns):
    // the only way between them is the hosts' network.
    assert!(
        reaches(a0.pid(), rank1),
        "rank 0 reaches rank 1 across hosts"
    );
    assert!(
        reaches(a1.pid(), rank0),
        "rank 1 reaches rank 0 across hosts"
    );
    assert_eq!(neighbour_mac(a0.pid(), rank1), link_mac(a1.pid()));
    // The same addresses in the other gang are that gang's own members.
    assert!(reaches(b0.pid(), rank1));
    assert_eq!(neighbour_mac(b0.pid(), rank1), link_mac(b1.pid()));
    assert_ne!(link_mac(a1.pid()), link_mac(b1.pid()));
    // No host: neither its own nor the other.
    for host in hosts.addresses {
        assert!(!reaches(a0.pid(), host), "a member reaches host {host}");
        assert!(!reaches(b1.pid(), host), "a member reaches host {host}");
    }
    // A frame across hosts carries VXLAN's overhead.
    let line = link_line(a0.pid());
    assert!(line.contains(" mtu 1450 "), "{line}");

    // Frames forged onto the first gang's segment: from an address of
    // host b that is no member's host they are dropped at host a; from the
    // member's host's address they arrive.
    let [a, b, c, _] = hosts.addresses[1].octets();
    let stranger = Ipv4Addr::new(a, b, c, 3);
    run(
        "ip",
        &[
            "-n",
            &hosts.names[1],
            "addr",
            "add",
            &format!("{stranger}/24"),
            "dev",
            &hosts.underlay[1],
        ],
    );
    let vni = gang(&members, 0, first).vni();
    let forge = |from: Ipv4Addr| {
        let before = rx_packets(a0.pid());
        send_vxlan(
            &hosts.names[1],
            from,
            hosts.addresses[0],
            vni,
            FORGED_FRAMES,
        );
        std::thread::sleep(Duration::from_millis(300));
        rx_packets(a0.pid()) - before
    };
    let from_stranger = forge(stranger);
    assert!(
        from_stranger < FORGED_FRAMES,
        "{from_stranger} frames from {stranger}, no member's host, reached the segment"
    );
    let from_member = forge(hosts.addresses[1]);
    assert!(
        from_member >= FORGED_FRAMES,
        "only {from_member} of {FORGED_FRAMES} frames from the member's host arrived"
    );
}

/// How many frames each forging sends.
const FORGED_FRAMES: u64 = 20;

/// The packets the link of `pid`'s namespace has received.
fn rx_packets(pid: u32) -> u64 {
    let dev = run(
        "nsenter",
        &["-t", &pid.to_string(), "-n", "cat", "/proc/net/dev"],
    );
    dev.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(&format!("{LINK_IN_CONTAINER}:"))
                .map(str::to_string)
        })
        .and_then(|rest| rest.split_whitespace().nth(1)?.parse().ok())
        .expect("the link's counters")
}

/// Sends `frames` broadcast Ethernet frames in VXLAN with id `vni` from
/// `from` (an address of `host`) to `to`'s links' port.
fn send_vxlan(host: &str, from: Ipv4Addr, to: Ipv4Addr, vni: u32, frames: u64) {
    let script = format!(
        "import socket, struct\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.bind(('{from}', 0))\n\
         header = struct.pack('!B3xI', 0x08, {vni} << 8)\n\
         frame = b'\\xff' * 6 + b'\\x02\\x00\\x00\\x00\\x00\\x99' + b'\\x88\\xb5' + b'forged' * 10\n\
         for _ in range({frames}):\n\
         \x20   s.sendto(header + frame, ('{to}', {port}))\n",
        port = VXLAN_PORT
    );
    run("ip", &["netns", "exec", host, "python3", "-c", &script]);
}

#[test]
fn members_on_one_host_share_a_segment_that_goes_with_the_last() {
    if std::env::var_os(HELPER_ENV).is_some() {
        return;
    }
    // The host's own lock: a release sweeps every empty segment of the
    // host, so it must not meet another test's half-made one.
    let lock = PathBuf::from(DEFAULT_LOCK_FILE);
    // Two simulated nodes of one host: names that do not resolve.
    let members = vec!["gpu-a.sim".to_string(), "gpu-b.sim".to_string()];
    let lease = Uuid::new_v4();
    let (first, second) = (gang(&members, 0, lease), gang(&members, 1, lease));
    let namespace = Path::new("/run/netns").join(first.namespace());
    let (c0, c1) = (Container::start(None), Container::start(None));
    first.attach(c0.pid(), &lock).unwrap();
    second.attach(c1.pid(), &lock).unwrap();
    assert!(namespace.exists());
    assert!(reaches(c1.pid(), GangLink::address(0)));
    assert!(reaches(c0.pid(), GangLink::address(1)));
    let devices = run("ip", &["-n", &first.namespace(), "-o", "link", "show"]);
    assert!(
        !devices.contains(": lhx"),
        "no VXLAN within one host: {devices}"
    );
    // Not a host interface: the host's own stack never sees the segment.
    let host_devices = run("ip", &["-o", "link", "show"]);
    assert!(!host_devices.contains(": lhg"), "{host_devices}");
    // Another lease that happens to share the segment's VXLAN id is
    // refused, not joined.
    let clash = GangLink {
        lease_id: Uuid::from_u128(
            lease
                .as_u128()
                .checked_add(0xFF_FFFF)
                .unwrap_or(lease.as_u128() - 0xFF_FFFF),
        ),
        ..first.clone()
    };
    assert_eq!(clash.namespace(), first.namespace());
    let c2 = Container::start(None);
    let refused = clash.attach(c2.pid(), &lock).unwrap_err();
    assert!(refused.contains("another lease"), "{refused}");
    // A member whose agent died with it is never released: its segment
    // is swept by the next release on the host, once empty.
    let orphan = gang(&members, 0, Uuid::new_v4());
    let c3 = Container::start(None);
    orphan.attach(c3.pid(), &lock).unwrap();
    drop(c3);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !run(
        "ip",
        &[
            "-n",
            &orphan.namespace(),
            "-o",
            "link",
            "show",
            "type",
            "veth",
        ],
    )
    .is_empty()
    {
        assert!(Instant::now() < deadline, "the orphan's port outlived it");
        std::thread::sleep(Duration::from_millis(50));
    }
    let orphaned = Path::new("/run/netns").join(orphan.namespace());
    assert!(orphaned.exists());
    drop(c0);
    first.release(&lock);
    assert!(!orphaned.exists(), "an empty segment is swept");
    assert!(namespace.exists(), "the other member is still on it");
    drop(c1);
    second.release(&lock);
    assert!(!namespace.exists(), "the segment goes with its last member");
}
