//! A network per tenant on the node, for the containers that ask for one
//! (`workload.network: tenant`); every other container has none.
//!
//! The network is the engine's internal bridge `lh-tenant-<tenant>-<node>`:
//! the tenant's containers on this node reach each other on it, and
//! nothing else. An internal bridge gives its containers a route to their
//! own subnet only, so no other tenant's bridge, no address of the host's
//! other interfaces and no metadata address (169.254.169.254) is reachable
//! from it; podman's `isolate` option also drops what would be forwarded
//! between bridges. One door is left open by the engine: the host's own
//! address on the bridge (its gateway), where every service of the host
//! that listens on all addresses answers. The agent shuts it with the
//! host's firewall: the chain [`GUARD_CHAIN`], jumped to first from
//! `INPUT` (IPv4 and IPv6), drops everything that comes in from a tenant
//! bridge. The engine's DNS server would listen on that address too, so
//! the networks have none: containers find each other by address.
//!
//! The chain is rebuilt whole from the engine's list of tenant networks
//! (`iptables-restore --noflush` replaces it in one transaction) each
//! time a network is made or removed, under a lock file every agent of the
//! host takes, so two agents on one host never undo each other's rules.
//!
//! A network lives while a container of this agent's uses it: the agent
//! counts the containers it starts on each, makes the network for the
//! first and removes it after the last. The engine refuses to remove a
//! network a container still uses, which keeps the networks of containers
//! adopted from a previous agent; those go when they end, or at the next
//! start.
//!
//! Every call here blocks: a few CLI runs, some hundred milliseconds on
//! this kind of host, each bounded by [`CALL_TIMEOUT`], and the host's lock,
//! waited for at most [`LOCK_WAIT`]. It is made once per tenant while the
//! tenant has no container on the node, and after its last one.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use super::engine::{CliFlavor, Engine};
use super::host_calls::{install_chain, run_bounded, HostLock};
pub use super::host_calls::{CALL_TIMEOUT, LOCK_WAIT};
use super::{RuntimeError, LABEL_NODE};

/// The label that marks a tenant network, and a container on one, with
/// the tenant.
pub const LABEL_TENANT: &str = "leasehold.tenant";
/// Every tenant network's name starts so.
pub const NETWORK_PREFIX: &str = "lh-tenant-";
/// The host firewall's chain that drops what tenant bridges send the host.
pub const GUARD_CHAIN: &str = "LH-TENANT-INPUT";
/// The lock file the agents of one host take around a change of the
/// tenant networks and the chain.
pub const DEFAULT_LOCK_FILE: &str = "/run/lock/leasehold-tenant-networks.lock";
/// Most tenant networks the chain is rebuilt from; the engine's default
/// address pool holds 256 /24 networks.
pub const MOST_TENANT_NETWORKS: usize = 4096;

/// `lh-tenant-<tenant>-<node>`; without a node, `lh-tenant-<tenant>`. A
/// node id that is not letters, digits, `.`, `_` and `-` is left out
/// (node ids are checked long before; this name reaches a CLI).
pub fn network_name(tenant: Uuid, node_id: Option<&str>) -> String {
    let safe = |n: &&str| {
        !n.is_empty()
            && n.len() <= 64
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    match node_id.filter(safe) {
        Some(node) => format!("{NETWORK_PREFIX}{}-{node}", tenant.simple()),
        None => format!("{NETWORK_PREFIX}{}", tenant.simple()),
    }
}

/// The firewall tools the guard is written with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firewall {
    /// `iptables` and, where the host has IPv6, `ip6tables`; each has its
    /// `-restore` beside it.
    pub tools: Vec<PathBuf>,
}

impl Firewall {
    /// `iptables`, and `ip6tables` where the kernel has IPv6.
    pub fn host() -> Self {
        let mut tools = vec![PathBuf::from("iptables")];
        if Path::new("/proc/sys/net/ipv6").exists() {
            tools.push(PathBuf::from("ip6tables"));
        }
        Firewall { tools }
    }
}

/// The tenant networks of one agent, and the host's guard against them.
#[derive(Debug, Clone)]
pub struct TenantNetworks {
    pub(crate) engine: Engine,
    pub(crate) node_id: Option<String>,
    firewall: Firewall,
    lock_file: PathBuf,
    /// Containers this agent started on each tenant's network and has not
    /// seen removed.
    joined: Arc<Mutex<HashMap<Uuid, usize>>>,
}

impl TenantNetworks {
    pub fn new(engine: Engine, node_id: Option<String>) -> Self {
        TenantNetworks {
            engine,
            node_id,
            firewall: Firewall::host(),
            lock_file: PathBuf::from(DEFAULT_LOCK_FILE),
            joined: Arc::default(),
        }
    }

    pub fn network_name(&self, tenant: Uuid) -> String {
        network_name(tenant, self.node_id.as_deref())
    }

    /// Counts one more container on `tenant`'s network, making it (and
    /// guarding the host against it) for the first. Blocks.
    pub fn join(&self, tenant: Uuid) -> Result<String, RuntimeError> {
        let name = self.network_name(tenant);
        let mut joined = self.joined.lock().unwrap_or_else(|e| e.into_inner());
        let count = joined.get(&tenant).copied().unwrap_or(0);
        if count == 0 {
            let _host = HostLock::take(&self.lock_file)?;
            self.make(tenant, &name)?;
            self.guard()?;
        }
        joined.insert(tenant, count + 1);
        Ok(name)
    }

    /// Counts one container fewer on `tenant`'s network; after the last,
    /// removes the network if no container of another life of the agent
    /// uses it. Blocks.
    pub fn leave(&self, tenant: Uuid) {
        let mut joined = self.joined.lock().unwrap_or_else(|e| e.into_inner());
        match joined.get(&tenant).copied() {
            Some(count) if count > 1 => {
                joined.insert(tenant, count - 1);
                return;
            }
            Some(_) => {
                joined.remove(&tenant);
            }
            None => {
                tracing::warn!(tenant = %tenant, "left a tenant network it had not joined");
            }
        }
        self.remove_unused(&joined, Some(tenant));
    }

    /// Removes every tenant network of this node that no container of
    /// this agent's was started on and none uses: at start, and when a
    /// container adopted from a previous agent ends. Blocks.
    pub fn remove_all_unused(&self) {
        let joined = self.joined.lock().unwrap_or_else(|e| e.into_inner());
        self.remove_unused(&joined, None);
    }

    /// Writes the guard again while this agent has a container on a
    /// tenant network: a firewall reloaded meanwhile (its rules flushed)
    /// is guarded again within a sweep. Blocks.
    pub fn guard_again(&self) {
        let joined = self.joined.lock().unwrap_or_else(|e| e.into_inner());
        if joined.is_empty() {
            return;
        }
        let written = HostLock::take(&self.lock_file).and_then(|_host| self.guard());
        if let Err(e) = written {
            tracing::warn!(error = %e, "cannot write the host's guard against tenant networks");
        }
    }

    fn remove_unused(&self, joined: &HashMap<Uuid, usize>, only: Option<Uuid>) {
        let host = match HostLock::take(&self.lock_file) {
            Ok(lock) => lock,
            Err(e) => {
                tracing::warn!(error = %e, "tenant networks left as they are");
                return;
            }
        };
        let mine = match self.list(self.node_id.as_deref()) {
            Ok(networks) => networks,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the tenant networks");
                return;
            }
        };
        // A sweep rewrites the guard even when it removes nothing: the
        // networks of adopted containers are guarded afresh.
        let mut rewrite = only.is_none() && !mine.is_empty();
        for network in mine {
            let Some(tenant) = network.tenant else {
                continue;
            };
            if joined.contains_key(&tenant) || only.is_some_and(|t| t != tenant) {
                continue;
            }
            if network.name != self.network_name(tenant) {
                // Another agent's on this host.
                continue;
            }
            // Refused while a container uses it: it stays for that one.
            match self.engine_run(&["network", "rm", "--", &network.name], None) {
                Ok(_) => {
                    tracing::info!(network = %network.name, "tenant network removed");
                    rewrite = true;
                }
                Err(e) if is_in_use(&e) => {
                    tracing::debug!(network = %network.name, "tenant network kept: a container uses it");
                }
                Err(e) => {
                    tracing::warn!(network = %network.name, error = %e, "cannot remove the tenant network");
                }
            }
        }
        if rewrite {
            if let Err(e) = self.guard() {
                tracing::warn!(error = %e, "cannot rewrite the host's guard against tenant networks");
            }
        }
        drop(host);
    }

    fn make(&self, tenant: Uuid, name: &str) -> Result<(), RuntimeError> {
        let exists = match self.engine.flavor {
            CliFlavor::Podman => self.engine_run(&["network", "exists", "--", name], None),
            CliFlavor::Docker => self.engine_run(
                &["network", "inspect", "--format", "{{.Id}}", "--", name],
                None,
            ),
        };
        if exists.is_ok() {
            // Only a network made as this module makes it is joined: one of
            // the name that reaches further (left by another version, or
            // made by hand) is made again.
            if self.is_internal(name) {
                return Ok(());
            }
            tracing::warn!(
                network = name,
                "a tenant network that is not internal is made again"
            );
            self.engine_run(&["network", "rm", "--", name], None)
                .map_err(|e| {
                    RuntimeError::InvalidConfig(format!(
                        "cannot remove the tenant network {name}, which is not internal: {e}"
                    ))
                })?;
        }
        let args = create_args(self.engine.flavor, tenant, self.node_id.as_deref(), name);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.engine_run(&args, None).map_err(|e| {
            RuntimeError::InvalidConfig(format!("cannot make the tenant network {name}: {e}"))
        })?;
        tracing::info!(network = name, tenant = %tenant, "tenant network made");
        Ok(())
    }

    /// Whether the engine says `name` is internal (and, with podman,
    /// without DNS).
    fn is_internal(&self, name: &str) -> bool {
        let format = match self.engine.flavor {
            CliFlavor::Podman => "{{.Internal}} {{.DNSEnabled}}",
            CliFlavor::Docker => "{{.Internal}} false",
        };
        self.engine_run(
            &["network", "inspect", "--format", format, "--", name],
            None,
        )
        .is_ok_and(|out| out.trim() == "true false")
    }

    /// The tenant networks on the host (of `node`, when named).
    fn list(&self, node: Option<&str>) -> io::Result<Vec<ListedNetwork>> {
        let mut args = vec![
            "network".to_string(),
            "ls".into(),
            "--filter".into(),
            format!("label={LABEL_TENANT}"),
        ];
        if let Some(node) = node {
            args.extend(["--filter".into(), format!("label={LABEL_NODE}={node}")]);
        }
        args.extend(["--format".into(), list_format(self.engine.flavor).into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = self.engine_run(&args, None)?;
        Ok(parse_network_list(self.engine.flavor, &output))
    }

    /// Rewrites [`GUARD_CHAIN`] to drop what comes in from every tenant
    /// bridge of the host, and makes sure `INPUT` jumps to it first.
    fn guard(&self) -> Result<(), RuntimeError> {
        let cannot = |e: io::Error| {
            RuntimeError::InvalidConfig(format!(
                "cannot guard the host against the tenant networks: {e}"
            ))
        };
        let bridges: Vec<String> = self
            .list(None)
            .map_err(cannot)?
            .into_iter()
            .filter_map(|n| n.bridge)
            .collect();
        let rules = guard_rules(&bridges);
        for tool in &self.firewall.tools {
            install_chain(tool, &rules, &["-j", GUARD_CHAIN]).map_err(cannot)?;
        }
        Ok(())
    }

    fn engine_run(&self, args: &[&str], input: Option<&[u8]>) -> io::Result<String> {
        let mut command = self.engine.blocking_command();
        command.args(args);
        run_bounded(&mut command, input)
    }
}

/// A tenant network as the engine lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedNetwork {
    pub name: String,
    pub tenant: Option<Uuid>,
    /// Its bridge interface on the host; `None` when the name could not be
    /// one (the guard never writes it).
    pub bridge: Option<String>,
}

fn list_format(flavor: CliFlavor) -> &'static str {
    match flavor {
        CliFlavor::Podman => "{{.Name}} {{.NetworkInterface}}",
        // docker names a bridge `br-` and the first 12 digits of its id.
        CliFlavor::Docker => "{{.Name}} {{.ID}}",
    }
}

/// The lines of [`list_format`]'s output, at most [`MOST_TENANT_NETWORKS`].
pub fn parse_network_list(flavor: CliFlavor, output: &str) -> Vec<ListedNetwork> {
    output
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next()?.to_string();
            let second = fields.next().unwrap_or("");
            let bridge = match flavor {
                CliFlavor::Podman => second.to_string(),
                CliFlavor::Docker => format!("br-{}", second.get(..12).unwrap_or("")),
            };
            let tenant = name
                .strip_prefix(NETWORK_PREFIX)
                .and_then(|rest| rest.get(..32))
                .and_then(|hex| Uuid::try_parse(hex).ok());
            Some(ListedNetwork {
                bridge: is_interface_name(&bridge).then_some(bridge),
                tenant,
                name,
            })
        })
        .take(MOST_TENANT_NETWORKS)
        .collect()
}

/// A Linux interface name: 1 to 15 of letters, digits, `-`, `_` and `.`,
/// the first a letter or digit, so it cannot carry anything else (an
/// option, a second rule) into the firewall's input.
pub fn is_interface_name(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `network create` of a tenant's network: internal (no route out of its
/// subnet), no DNS server on the host, and with podman isolated from the
/// other bridges.
pub fn create_args(
    flavor: CliFlavor,
    tenant: Uuid,
    node_id: Option<&str>,
    name: &str,
) -> Vec<String> {
    let mut args: Vec<String> = ["network", "create", "--internal"].map(String::from).into();
    if flavor == CliFlavor::Podman {
        args.extend(["--disable-dns", "--opt", "isolate=true"].map(String::from));
    }
    args.extend(["--label".into(), format!("{LABEL_TENANT}={tenant}")]);
    if let Some(node) = node_id {
        args.extend(["--label".into(), format!("{LABEL_NODE}={node}")]);
    }
    args.extend(["--".into(), name.into()]);
    args
}

/// The `iptables-restore --noflush` input that replaces [`GUARD_CHAIN`]
/// with a drop of everything from each of `bridges`.
pub fn guard_rules(bridges: &[String]) -> String {
    let mut rules = format!("*filter\n:{GUARD_CHAIN} - [0:0]\n");
    for bridge in bridges.iter().filter(|b| is_interface_name(b)) {
        rules.push_str(&format!("-A {GUARD_CHAIN} -i {bridge} -j DROP\n"));
    }
    rules.push_str("COMMIT\n");
    rules
}

/// Whether the engine refused to remove a network because a container
/// uses it.
fn is_in_use(e: &io::Error) -> bool {
    let text = e.to_string();
    text.contains("in use") || text.contains("being used") || text.contains("active endpoints")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TENANT: Uuid = Uuid::from_u128(0x1234);

    #[test]
    fn a_network_is_named_by_its_tenant_and_node() {
        assert_eq!(
            network_name(TENANT, Some("node-a")),
            "lh-tenant-00000000000000000000000000001234-node-a"
        );
        assert_eq!(
            network_name(TENANT, Some("a b")),
            "lh-tenant-00000000000000000000000000001234"
        );
    }

    #[test]
    fn a_tenant_network_is_internal_without_dns_and_isolated() {
        let args = create_args(CliFlavor::Podman, TENANT, Some("node-a"), "lh-tenant-x");
        assert_eq!(
            args.join(" "),
            format!(
                "network create --internal --disable-dns --opt isolate=true \
                 --label leasehold.tenant={TENANT} --label leasehold.node=node-a -- lh-tenant-x"
            )
        );
        let docker = create_args(CliFlavor::Docker, TENANT, None, "lh-tenant-x");
        assert_eq!(
            docker.join(" "),
            format!("network create --internal --label leasehold.tenant={TENANT} -- lh-tenant-x")
        );
    }

    #[test]
    fn the_guard_drops_what_each_bridge_sends_and_nothing_else() {
        let rules = guard_rules(&["podman3".into(), "bad if;x".into(), "podman12".into()]);
        assert_eq!(
            rules,
            "*filter\n:LH-TENANT-INPUT - [0:0]\n\
             -A LH-TENANT-INPUT -i podman3 -j DROP\n\
             -A LH-TENANT-INPUT -i podman12 -j DROP\nCOMMIT\n"
        );
        assert_eq!(
            guard_rules(&[]),
            "*filter\n:LH-TENANT-INPUT - [0:0]\nCOMMIT\n"
        );
    }

    #[test]
    fn the_engine_list_gives_names_tenants_and_bridges() {
        let name = network_name(TENANT, Some("node-a"));
        let listed = parse_network_list(
            CliFlavor::Podman,
            &format!("{name} podman4\nlh-tenant-junk podman5\nother -j\n"),
        );
        assert_eq!(
            listed,
            [
                ListedNetwork {
                    name: name.clone(),
                    tenant: Some(TENANT),
                    bridge: Some("podman4".into()),
                },
                ListedNetwork {
                    name: "lh-tenant-junk".into(),
                    tenant: None,
                    bridge: Some("podman5".into()),
                },
                ListedNetwork {
                    name: "other".into(),
                    tenant: None,
                    bridge: None,
                },
            ]
        );
        let docker = parse_network_list(CliFlavor::Docker, &format!("{name} 0123456789abcdef\n"));
        assert_eq!(docker[0].bridge.as_deref(), Some("br-0123456789ab"));
    }
}
