//! The link between the containers of a gang: one private layer-2 segment
//! per lease, across its members' nodes, so that a distributed job's ranks
//! reach `MASTER_ADDR` and each other while every container keeps no
//! network of its own (`--network none`) or only its tenant's.
//!
//! On each member's host the segment is a bridge in a network namespace of
//! its own, `lhg-<vni>`: the host's own stack never sees it, so nothing on
//! it can reach the host, its services or anything the host routes to.
//! Each member's container gets one end of a veth pair as
//! [`LINK_IN_CONTAINER`] with the address `10.127.0.<node rank + 1>/24`;
//! the other end is a port of the bridge. Members on other hosts are
//! joined by a VXLAN device (its id the lease's [`GangLink::vni`], UDP port
//! [`VXLAN_PORT`]) made in the host's namespace, so that it sends over the
//! host's network, and then moved into the segment's; it floods to every
//! other host's member. Members on one host (`make up`, the tests) share
//! the one bridge.
//!
//! Whether a member is on another host is read from its address (its
//! node's registered host name): the same name as this member's, or a
//! name that resolves to an address of this host, is this host; one that
//! resolves elsewhere is reached over VXLAN (IPv4); one that does not
//! resolve is left out with a warning (a simulated fleet's names).
//!
//! The container runs before its link is there; the gang's launcher waits
//! for [`LINK_IN_CONTAINER`] to be up, at most [`LINK_WAIT_SECS`], and
//! fails the part if it never is. A segment whose bridge has no member's
//! port left is removed by the last member of the host that leaves it.
//! Changes take a host-wide lock, as several agents may share a host.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;

use uuid::Uuid;

use super::engine::Engine;
use super::engine_state;
use super::gang::GangPart;
use super::host_calls::{install_chain, run_bounded, HostLock};

/// The interface a gang's container reaches the other members on.
pub const LINK_IN_CONTAINER: &str = "lhgang0";
/// The first three octets of every gang's /24: the same for every gang,
/// as each segment is private to its lease and no host routes it.
pub const SUBNET_PREFIX: [u8; 3] = [10, 127, 0];
/// The UDP port the links' VXLAN uses between hosts: one of their own,
/// not IANA's 4789, so that [`VXLAN_GUARD_CHAIN`] drops nothing of another
/// VXLAN user of the host (Docker's overlay networks, flannel).
pub const VXLAN_PORT: u16 = 47_890;
/// The host firewall's chain that lets the links' VXLAN in from the hosts
/// of this host's gangs' members only: anyone else who can send to the
/// port, and guesses a 24-bit id, could otherwise put frames on a segment.
pub const VXLAN_GUARD_CHAIN: &str = "LH-GANG-VXLAN";
/// What VXLAN adds to a frame over IPv4: a link across hosts carries
/// frames this much smaller than the underlay's.
pub const VXLAN_OVERHEAD_BYTES: u32 = 50;
/// The underlay's MTU assumed for a link across hosts.
pub const UNDERLAY_MTU_BYTES: u32 = 1500;
/// How long the launcher waits for the link before it fails the part.
pub const LINK_WAIT_SECS: u32 = 60;
/// The lock the agents of one host take around a change of the links.
pub const DEFAULT_LOCK_FILE: &str = "/run/lock/leasehold-gang-links.lock";
/// Where `ip netns` keeps the named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// Most segments of a host looked at by one release.
const MOST_SEGMENTS_SWEPT: usize = 4096;
/// Most members on one link: one address each in its /24, and a port
/// name that tells them apart (a gang has at most 16).
pub const MOST_MEMBERS: usize = 253;
/// How long a release waits for the port of a member whose container
/// ended to go by itself.
const PORT_GONE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A member's link to the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangLink {
    pub lease_id: Uuid,
    pub node_rank: u32,
    /// Every member's address (host name), in node-rank order.
    pub members: Vec<String>,
}

/// Where another member is, seen from this one's host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    ThisHost,
    Remote(Ipv4Addr),
    /// Its name does not resolve to an IPv4 address.
    Unknown,
}

impl GangLink {
    pub fn of(lease_id: Uuid, part: &GangPart) -> Self {
        GangLink {
            lease_id,
            node_rank: part.node_rank,
            members: part.members.iter().map(|(a, _)| a.clone()).collect(),
        }
    }

    /// The segment's VXLAN id: 1 to 2^24 - 1, from the lease's id. Two
    /// gangs with one id on one host are refused, not joined (the bridge
    /// names its lease).
    pub fn vni(&self) -> u32 {
        (self.lease_id.as_u128() % 0xFF_FFFF) as u32 + 1
    }

    fn tag(&self) -> String {
        format!("{:06x}", self.vni())
    }

    /// The segment's network namespace on each member's host.
    pub fn namespace(&self) -> String {
        format!("lhg-{}", self.tag())
    }

    fn bridge(&self) -> String {
        format!("lhg{}", self.tag())
    }

    fn vxlan(&self) -> String {
        format!("lhx{}", self.tag())
    }

    /// The bridge's end of this member's veth pair.
    fn port(&self) -> String {
        format!("lhv{}{:02x}", self.tag(), self.node_rank.min(0xff))
    }

    /// What the bridge's alias says: the lease it belongs to.
    fn alias(&self) -> String {
        format!("leasehold-gang-{}", self.lease_id)
    }

    /// The container address of the member of rank `rank`.
    pub fn address(rank: u32) -> Ipv4Addr {
        let [a, b, c] = SUBNET_PREFIX;
        Ipv4Addr::new(a, b, c, (rank + 1).min(254) as u8)
    }

    /// The rendezvous as a container sees it, over the link: what replaces
    /// the members' host names in the part's variables, and the interface
    /// NCCL and Gloo are to use.
    pub fn env(&self) -> BTreeMap<String, String> {
        let addresses: Vec<String> = (0..self.members.len() as u32)
            .map(|rank| Self::address(rank).to_string())
            .collect();
        [
            ("MASTER_ADDR", Self::address(0).to_string()),
            ("LEASEHOLD_GANG_MEMBERS", addresses.join(",")),
            ("LEASEHOLD_GANG_LINK", LINK_IN_CONTAINER.to_string()),
            ("NCCL_SOCKET_IFNAME", LINK_IN_CONTAINER.to_string()),
            ("GLOO_SOCKET_IFNAME", LINK_IN_CONTAINER.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Where each other member is. Blocks (name resolution).
    pub fn peers(&self) -> Vec<(u32, Peer)> {
        let own = self
            .members
            .get(self.node_rank as usize)
            .map_or("", String::as_str);
        self.members
            .iter()
            .enumerate()
            .filter(|(rank, _)| *rank as u32 != self.node_rank)
            .map(|(rank, address)| (rank as u32, where_is(own, address)))
            .collect()
    }

    /// Gives the container whose first process is `pid` its end of the
    /// link, making the segment on this host if it is not there yet.
    /// Blocks: a few `ip` runs under the host's lock.
    pub fn attach(&self, pid: u32, lock_file: &Path) -> Result<(), String> {
        if self.members.len() > MOST_MEMBERS {
            return Err(format!(
                "{} members: a link holds at most {MOST_MEMBERS}",
                self.members.len()
            ));
        }
        let mut remotes: Vec<Ipv4Addr> = Vec::new();
        for (rank, peer) in self.peers() {
            match peer {
                Peer::ThisHost => {}
                Peer::Remote(ip) => remotes.push(ip),
                Peer::Unknown => tracing::warn!(lease = %self.lease_id, rank,
                    address = %self.members[rank as usize],
                    "a gang member's address does not resolve: it is reached only if it is on this host"),
            }
        }
        let mtu = if remotes.is_empty() {
            UNDERLAY_MTU_BYTES
        } else {
            UNDERLAY_MTU_BYTES - VXLAN_OVERHEAD_BYTES
        };
        let _host = HostLock::take(lock_file).map_err(|e| e.to_string())?;
        // The pid was the container's when the engine said so; a process
        // that took it since could be the host's own.
        let container_ns = format!("/proc/{pid}/ns/net");
        let theirs =
            std::fs::read_link(&container_ns).map_err(|e| format!("{container_ns}: {e}"))?;
        let ours = std::fs::read_link("/proc/self/ns/net").map_err(|e| e.to_string())?;
        if theirs == ours {
            return Err(format!(
                "process {pid} is in the agent's own network namespace"
            ));
        }
        let ns = self.namespace();
        let (bridge, vxlan, port) = (self.bridge(), self.vxlan(), self.port());
        if !Path::new(NETNS_DIR).join(&ns).exists() {
            ip(&["netns", "add", &ns])?;
        }
        match self.bridge_alias()? {
            None => {
                ip(&["-n", &ns, "link", "add", &bridge, "type", "bridge"])?;
                ip(&["-n", &ns, "link", "set", &bridge, "alias", &self.alias()])?;
            }
            Some(alias) if alias == self.alias() => {}
            // Made by an agent stopped before it named it, and unused.
            Some(alias) if alias.is_empty() && member_ports(&ns, &bridge, &vxlan)? == 0 => {
                ip(&["-n", &ns, "link", "set", &bridge, "alias", &self.alias()])?;
            }
            Some(other) => {
                return Err(format!(
                    "the segment {ns} on this host is another lease's ({other}): the two \
                     gangs' VXLAN ids are the same"
                ))
            }
        }
        // A port left by this member's earlier container, if any.
        let _ = run("ip", &["-n", &ns, "link", "del", &port]);
        // The host's first member of this placement: a VXLAN device left
        // from an earlier one may flood to hosts the gang has left.
        if member_ports(&ns, &bridge, &vxlan)? == 0 && ip_ok(&["-n", &ns, "link", "show", &vxlan]) {
            ip(&["-n", &ns, "link", "del", &vxlan])?;
        }
        if !remotes.is_empty() {
            if !ip_ok(&["-n", &ns, "link", "show", &vxlan]) {
                let vni = self.vni().to_string();
                let port = VXLAN_PORT.to_string();
                // One left in the host's namespace by an agent stopped
                // between making and moving it.
                if ip_ok(&["link", "show", &vxlan]) {
                    ip(&["link", "del", &vxlan])?;
                }
                // No learning: a frame for a member it does not know goes
                // to every member's host, never to where a forged frame
                // claimed that member was.
                ip(&[
                    "link",
                    "add",
                    &vxlan,
                    "type",
                    "vxlan",
                    "id",
                    &vni,
                    "dstport",
                    &port,
                    "nolearning",
                ])?;
                if let Err(e) = ip(&["link", "set", &vxlan, "netns", &ns]) {
                    let _ = ip(&["link", "del", &vxlan]);
                    return Err(e);
                }
            }
            for remote in &remotes {
                let remote = remote.to_string();
                let flood = [
                    "-n",
                    &ns,
                    "fdb",
                    "append",
                    "00:00:00:00:00:00",
                    "dev",
                    &vxlan,
                    "dst",
                    &remote,
                ];
                if let Err(e) = run("bridge", &flood) {
                    if !e.contains("exists") {
                        return Err(e);
                    }
                }
            }
            guard_vxlan()?;
            let mtu = mtu.to_string();
            ip(&[
                "-n", &ns, "link", "set", &vxlan, "master", &bridge, "mtu", &mtu, "up",
            ])?;
        }
        ip(&["-n", &ns, "link", "set", &bridge, "up"])?;
        let (mtu, pid) = (mtu.to_string(), pid.to_string());
        ip(&[
            "-n",
            &ns,
            "link",
            "add",
            &port,
            "mtu",
            &mtu,
            "type",
            "veth",
            "peer",
            "name",
            LINK_IN_CONTAINER,
            "netns",
            &pid,
        ])?;
        ip(&["-n", &ns, "link", "set", &port, "master", &bridge, "up"])?;
        let address = format!("{}/24", Self::address(self.node_rank));
        in_container(&pid, &["addr", "add", &address, "dev", LINK_IN_CONTAINER])?;
        // Up last: the launcher starts the ranks once it sees it up.
        in_container(&pid, &["link", "set", LINK_IN_CONTAINER, "mtu", &mtu, "up"])?;
        Ok(())
    }

    /// Takes this member's port off the segment (its container is gone,
    /// and its end with it) and removes the segment once no member of
    /// this host is on it; and any other segment of this host left with
    /// no member (an agent killed while its gang ran, whose containers
    /// ended under the next). Blocks; what fails is logged.
    pub fn release(&self, lock_file: &Path) {
        let _host = match HostLock::take(lock_file) {
            Ok(lock) => lock,
            Err(e) => {
                tracing::warn!(lease = %self.lease_id, error = %e, "gang link left as it is");
                return;
            }
        };
        // The port goes with its container's namespace, which the kernel
        // tears down a moment after the container ends. Not removed by
        // name: a later placement's member of the same rank has that name.
        let ns = self.namespace();
        let deadline = std::time::Instant::now() + PORT_GONE_WAIT;
        while Path::new(NETNS_DIR).join(&ns).exists()
            && ip_ok(&["-n", &ns, "link", "show", &self.port()])
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
            return;
        };
        let segments = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|name| Some(name.strip_prefix("lhg-")?.to_string()))
            .filter(|tag| tag.len() == 6 && tag.chars().all(|c| c.is_ascii_hexdigit()))
            .take(MOST_SEGMENTS_SWEPT);
        let mut across_hosts = false;
        for tag in segments {
            remove_if_unused(&tag);
            across_hosts |= ip_ok(&[
                "-n",
                &format!("lhg-{tag}"),
                "link",
                "show",
                &format!("lhx{tag}"),
            ]);
        }
        // The hosts of the gangs that left no longer get in.
        if across_hosts || firewall_has_guard() {
            if let Err(e) = guard_vxlan() {
                tracing::warn!(lease = %self.lease_id, error = %e, "VXLAN guard left as it was");
            }
        }
    }
    /// The alias of the segment's bridge; `None` when there is no bridge.
    fn bridge_alias(&self) -> Result<Option<String>, String> {
        let out = match ip(&[
            "-n",
            &self.namespace(),
            "-o",
            "link",
            "show",
            &self.bridge(),
        ]) {
            Ok(out) => out,
            Err(e) if e.contains("does not exist") => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(
            out.split(" alias ")
                .nth(1)
                .map(|a| a.split_whitespace().next().unwrap_or("").to_string())
                .unwrap_or_default(),
        ))
    }
}

/// The task that links a gang member's container once it runs.
pub struct LinkTask {
    pub link: GangLink,
    pub lock_file: PathBuf,
    _task: lh_service::AbortOnDrop<()>,
}

impl std::fmt::Debug for LinkTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkTask")
            .field("link", &self.link)
            .finish()
    }
}

/// Whether the network namespace of process `pid` has a gang's link. Its
/// other end is on the segment: a port goes with its pair.
pub fn linked(pid: u32) -> bool {
    in_container(&pid.to_string(), &["-o", "link", "show", LINK_IN_CONTAINER]).is_ok()
}

/// Links the container `name` in a task of its own, once the engine says
/// it runs (by `deadline`), unless it is linked already (a container a
/// restarted agent adopted). A failure is logged; the launcher then fails
/// the part when the link is not up in time.
pub fn spawn_attach(
    engine: Engine,
    name: String,
    link: GangLink,
    lock_file: PathBuf,
    deadline: tokio::time::Instant,
) -> LinkTask {
    let (task_link, task_lock) = (link.clone(), lock_file.clone());
    let task = tokio::spawn(async move {
        if !engine_state::until_running(&engine, &name, deadline).await {
            return;
        }
        let Some(pid) = engine_state::container_pid(&engine, &name).await else {
            tracing::warn!(container = %name, "no gang link: the container ended before it was linked");
            return;
        };
        let lease = task_link.lease_id;
        let attached = tokio::task::spawn_blocking(move || match linked(pid) {
            true => Ok(false),
            false => task_link.attach(pid, &task_lock).map(|()| true),
        });
        match attached.await {
            Ok(Ok(true)) => tracing::info!(lease = %lease, container = %name, "gang link up"),
            Ok(Ok(false)) => tracing::info!(lease = %lease, container = %name, "gang link kept"),
            Ok(Err(why)) => {
                tracing::error!(lease = %lease, container = %name, why, "no gang link")
            }
            Err(e) => {
                tracing::error!(lease = %lease, container = %name, error = %e, "no gang link")
            }
        }
    });
    LinkTask {
        link,
        lock_file,
        _task: lh_service::AbortOnDrop(task),
    }
}

impl LinkTask {
    /// Stops linking, if it still is, and takes the member off the segment.
    pub async fn release(self) {
        let LinkTask {
            link,
            lock_file,
            _task,
        } = self;
        drop(_task);
        let _ = tokio::task::spawn_blocking(move || link.release(&lock_file)).await;
    }
}

/// Removes the segment `lhg-<tag>` when no member's port is left on its
/// bridge. Under the host's lock.
fn remove_if_unused(tag: &str) {
    let ns = format!("lhg-{tag}");
    let members_left = match member_ports(&ns, &format!("lhg{tag}"), &format!("lhx{tag}")) {
        Ok(count) => count,
        Err(e) => {
            tracing::warn!(segment = %ns, error = %e, "gang segment left");
            return;
        }
    };
    if members_left == 0 {
        if let Err(e) = ip(&["netns", "del", &ns]) {
            tracing::warn!(segment = %ns, error = %e, "gang segment left");
        }
    }
}

/// How many members' ports the segment's bridge has (its VXLAN device is
/// not one); 0 when there is no bridge (a segment whose making failed
/// midway).
fn member_ports(ns: &str, bridge: &str, vxlan: &str) -> Result<usize, String> {
    let ports = match run("ip", &["-n", ns, "-o", "link", "show", "master", bridge]) {
        Ok(out) => out,
        Err(e) if e.contains("does not exist") => return Ok(0),
        Err(e) => return Err(e),
    };
    let vxlan = format!(": {vxlan}");
    Ok(ports
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains(&vxlan))
        .count())
}

/// Every other host a segment of this host floods to.
fn flood_peers() -> BTreeSet<Ipv4Addr> {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return BTreeSet::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| Some(name.strip_prefix("lhg-")?.to_string()))
        .take(MOST_SEGMENTS_SWEPT)
        .filter_map(|tag| {
            run(
                "bridge",
                &[
                    "-n",
                    &format!("lhg-{tag}"),
                    "fdb",
                    "show",
                    "dev",
                    &format!("lhx{tag}"),
                ],
            )
            .ok()
        })
        .flat_map(|out| {
            out.lines()
                .filter_map(|l| {
                    l.split(" dst ")
                        .nth(1)?
                        .split_whitespace()
                        .next()?
                        .parse()
                        .ok()
                })
                .collect::<Vec<Ipv4Addr>>()
        })
        .collect()
}

/// The `iptables-restore --noflush` input that replaces
/// [`VXLAN_GUARD_CHAIN`]: `peers` return to `INPUT`, the rest is dropped.
pub fn vxlan_guard_rules(peers: &BTreeSet<Ipv4Addr>) -> String {
    let mut rules = format!("*filter\n:{VXLAN_GUARD_CHAIN} - [0:0]\n");
    for peer in peers {
        rules.push_str(&format!("-A {VXLAN_GUARD_CHAIN} -s {peer}/32 -j RETURN\n"));
    }
    rules.push_str(&format!("-A {VXLAN_GUARD_CHAIN} -j DROP\nCOMMIT\n"));
    rules
}

/// Rewrites [`VXLAN_GUARD_CHAIN`] from the flood entries of every segment
/// of this host, and makes sure `INPUT` sends the links' port to it. Under
/// the host's lock.
fn guard_vxlan() -> Result<(), String> {
    let rules = vxlan_guard_rules(&flood_peers());
    let port = VXLAN_PORT.to_string();
    install_chain(
        Path::new("iptables"),
        &rules,
        &["-p", "udp", "--dport", &port, "-j", VXLAN_GUARD_CHAIN],
    )
    .map_err(|e| format!("cannot guard the links' VXLAN port: {e}"))
}

/// Whether the host's firewall has the guard (made by an earlier link).
fn firewall_has_guard() -> bool {
    run("iptables", &["--wait", "-S", VXLAN_GUARD_CHAIN]).is_ok()
}

/// Where the member at `address` is, seen from the member at `own`.
pub fn where_is(own: &str, address: &str) -> Peer {
    if address == own {
        return Peer::ThisHost;
    }
    let Ok(resolved) = (address, 0).to_socket_addrs() else {
        return Peer::Unknown;
    };
    let Some(ip) = resolved
        .filter_map(|a| match a.ip() {
            std::net::IpAddr::V4(ip) => Some(ip),
            std::net::IpAddr::V6(_) => None,
        })
        .next()
    else {
        return Peer::Unknown;
    };
    // Only an address of this host can be bound.
    if ip.is_loopback() || UdpSocket::bind((ip, 0)).is_ok() {
        Peer::ThisHost
    } else {
        Peer::Remote(ip)
    }
}

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    run_bounded(Command::new(program).args(args), None)
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))
}

fn ip(args: &[&str]) -> Result<String, String> {
    run("ip", args)
}

fn ip_ok(args: &[&str]) -> bool {
    run("ip", args).is_ok()
}

/// `ip` in the network namespace of process `pid`.
fn in_container(pid: &str, args: &[&str]) -> Result<String, String> {
    let mut full = vec!["-t", pid, "-n", "ip"];
    full.extend_from_slice(args);
    run("nsenter", &full)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(rank: u32) -> GangLink {
        GangLink {
            lease_id: Uuid::from_u128(0x1234_5678),
            node_rank: rank,
            members: vec!["gpu-a".into(), "gpu-e".into(), "gpu-a".into()],
        }
    }

    #[test]
    fn names_fit_an_interface_and_tell_leases_and_members_apart() {
        let (a, b) = (link(0), link(1));
        assert_eq!(a.bridge(), b.bridge());
        assert_ne!(a.port(), b.port());
        for name in [a.bridge(), a.vxlan(), a.port(), b.port()] {
            assert!(
                super::super::tenant_network::is_interface_name(&name),
                "{name}"
            );
        }
        let other = GangLink {
            lease_id: Uuid::from_u128(0x1234_5679),
            ..link(0)
        };
        assert_ne!(other.vni(), a.vni());
        assert!((1..=0xFF_FFFF).contains(&a.vni()));
        let top = GangLink {
            lease_id: Uuid::from_u128(0xFF_FFFE),
            ..link(0)
        };
        assert_eq!(top.vni(), 0xFF_FFFF);
    }

    #[test]
    fn only_the_members_hosts_get_through_the_guard() {
        let peers: BTreeSet<Ipv4Addr> =
            ["10.0.0.7".parse().unwrap(), "10.0.0.9".parse().unwrap()].into();
        assert_eq!(
            vxlan_guard_rules(&peers),
            "*filter\n:LH-GANG-VXLAN - [0:0]\n\
             -A LH-GANG-VXLAN -s 10.0.0.7/32 -j RETURN\n\
             -A LH-GANG-VXLAN -s 10.0.0.9/32 -j RETURN\n\
             -A LH-GANG-VXLAN -j DROP\nCOMMIT\n"
        );
    }

    #[test]
    fn the_rendezvous_is_the_first_members_link_address() {
        let env = link(1).env();
        assert_eq!(env["MASTER_ADDR"], "10.127.0.1");
        assert_eq!(
            env["LEASEHOLD_GANG_MEMBERS"],
            "10.127.0.1,10.127.0.2,10.127.0.3"
        );
        assert_eq!(env["NCCL_SOCKET_IFNAME"], LINK_IN_CONTAINER);
        assert_eq!(env["GLOO_SOCKET_IFNAME"], LINK_IN_CONTAINER);
    }

    #[test]
    fn members_of_this_host_are_told_from_the_others() {
        assert_eq!(where_is("gpu-a", "gpu-a"), Peer::ThisHost);
        assert_eq!(where_is("gpu-a", "127.0.0.1"), Peer::ThisHost);
        assert_eq!(where_is("gpu-a", "localhost"), Peer::ThisHost);
        // TEST-NET-3: routable on paper, never an address of this host.
        assert_eq!(
            where_is("gpu-a", "203.0.113.9"),
            Peer::Remote(Ipv4Addr::new(203, 0, 113, 9))
        );
        assert_eq!(where_is("gpu-a", "gpu-e.invalid"), Peer::Unknown);
        let peers = link(0).peers();
        assert_eq!(peers.len(), 2);
        assert_eq!(peers[1], (2, Peer::ThisHost));
    }
}
