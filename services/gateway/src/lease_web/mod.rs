//! A lease's web pages in the browser (a notebook, a dashboard): each
//! port of each lease at an origin of its own, `<lease>-<port>.` before
//! the configured domain (`http://<lease>-8888.localhost:8090/`), so that
//! no tenant's page shares an origin, and so storage, with the console,
//! the API or another lease. The gateway carries each request to the port
//! inside the lease over port-forward sessions to its node, kept open
//! across requests, as `lh lease open` does from a terminal.
//!
//! A browser gets in with a ticket ([`access`]): the console asks for one
//! with the tenant's key (`POST /v1/leases/{id}/web`), a single use within
//! a minute, which the origin trades for a cookie of its own naming that
//! lease's port and the key that asked; it stops working within seconds of
//! that key's revocation or the tenant's suspension. The cookie never
//! reaches the tenant's program. Seen from inside, requests come as they
//! do through `lh lease open`: to `127.0.0.1:<port>` ([`proxy`]).
//!
//! Leases' origins share a site (the domain), so a page of one lease could
//! send requests to another's with the browser's cookie: a request that
//! says it comes from another origin or site is refused, but for a
//! top-level navigation, which a link makes. Deployments put the domain on
//! the Public Suffix List, so that browsers keep even cookies apart.

pub mod access;
pub mod proxy;
pub mod stream_client;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use uuid::Uuid;

use crate::poison_free::PoisonFreeRwLock;
use crate::read_model::lease::Lease;

pub use access::{next_path_ok, MAX_NEXT_PATH_BYTES};
pub use proxy::serve;

/// Idle connections to one lease's port kept for the next requests: each
/// holds a session, which counts against the lease's.
pub const MOST_IDLE_PER_PORT: usize = 2;
/// How long an idle connection to a lease's port is kept.
pub const IDLE_SECS: u64 = 60;
/// Browser connections one replica serves at once (upgraded ones too).
pub const MAX_CONNECTIONS: usize = 1024;
/// Browser connections one address holds at once: a browser opens six per
/// origin, and a tenant's pages of several leases and kernels a few origins
/// more; no one address takes every place of the replica.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 128;
/// How often idle connections past their time are let go.
const SWEEP_EVERY: Duration = Duration::from_secs(15);

/// What the lease web pages reach of the rest of the gateway: its
/// database, its bus, its sessions into leases, tenants' write budgets,
/// and its read of a tenant's lease (`lease_of(tenant, lease)`, none when
/// the lease is not that tenant's).
#[derive(Clone)]
pub struct Reach {
    pub pool: sqlx::PgPool,
    pub bus: lh_bus::Bus,
    pub sessions: Arc<crate::sessions::Sessions>,
    pub write_budgets: Arc<crate::http::limits::WriteBudgets>,
    pub lease_of: LeaseOf,
}

/// A tenant's lease, as the API would show it to that tenant.
pub type LeaseOf =
    Arc<dyn Fn(Uuid, Uuid) -> futures::future::BoxFuture<'static, Option<Lease>> + Send + Sync>;

/// Where leases' web pages are served, from the gateway's configuration.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LeaseWebArgs {
    /// Where the gateway serves leases' web pages, e.g. 127.0.0.1:8090;
    /// none unless set (with LH_LEASE_WEB_BASE).
    #[arg(long, env = "LH_LEASE_WEB_ADDR", requires = "lease_web_base")]
    pub lease_web_addr: Option<String>,
    /// How browsers reach that address: scheme, domain and port. Each
    /// lease's port is at the host `<lease>-<port>.` before the domain:
    /// `http://localhost:8090` (browsers take any `*.localhost` for
    /// loopback), or `https://leases.example.com` behind a wildcard name
    /// and certificate.
    #[arg(long, env = "LH_LEASE_WEB_BASE", requires = "lease_web_addr")]
    pub lease_web_base: Option<String>,
}

/// The lease web origins, checked, and what they keep in memory.
pub struct LeaseWeb {
    scheme: String,
    /// The domain and port after `<lease>-<port>.`.
    domain: String,
    pool: PoisonFreeRwLock<HashMap<(Uuid, u16), Vec<Idle>>>,
    sessions: access::SessionCache,
    connections: Arc<tokio::sync::Semaphore>,
    by_address: Arc<OpenByAddress>,
}

/// Connections open from each address.
#[derive(Default)]
struct OpenByAddress(PoisonFreeRwLock<HashMap<std::net::IpAddr, usize>>);

/// One connection from an address, counted while it lives.
struct AddressSlot {
    open: Arc<OpenByAddress>,
    address: std::net::IpAddr,
}

impl OpenByAddress {
    /// A place for one more connection from `address`, unless it holds
    /// `most` already.
    fn take(self: &Arc<Self>, address: std::net::IpAddr, most: usize) -> Option<AddressSlot> {
        let mut open = self.0.write();
        let count = open.entry(address).or_insert(0);
        if *count >= most {
            return None;
        }
        *count += 1;
        Some(AddressSlot {
            open: self.clone(),
            address,
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.open.0.write();
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.address);
            }
        }
    }
}

struct Idle {
    sender: SendRequest<Incoming>,
    since: Instant,
}

impl LeaseWebArgs {
    pub fn config(&self) -> anyhow::Result<Option<LeaseWeb>> {
        let Some(base) = &self.lease_web_base else {
            return Ok(None);
        };
        let url: reqwest::Url = base
            .parse()
            .map_err(|e| anyhow::anyhow!("LH_LEASE_WEB_BASE {base:?} is not a URL: {e}"))?;
        anyhow::ensure!(
            ["http", "https"].contains(&url.scheme()) && url.path() == "/" && url.query().is_none(),
            "LH_LEASE_WEB_BASE is a scheme, a domain and a port, e.g. http://localhost:8090"
        );
        let host = url
            .host_str()
            .ok_or_else(|| anyhow::anyhow!("LH_LEASE_WEB_BASE names no domain"))?;
        anyhow::ensure!(
            host.parse::<std::net::IpAddr>().is_err() && !host.starts_with('['),
            "LH_LEASE_WEB_BASE needs a domain, not an address: each lease gets a name under it"
        );
        let domain = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        };
        Ok(Some(LeaseWeb {
            scheme: url.scheme().to_string(),
            domain,
            pool: PoisonFreeRwLock::default(),
            sessions: access::SessionCache::default(),
            connections: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
            by_address: Arc::default(),
        }))
    }
}

impl LeaseWeb {
    /// The origin of `lease`'s `port`.
    pub fn origin(&self, lease: Uuid, port: u16) -> String {
        format!("{}://{lease}-{port}.{}", self.scheme, self.domain)
    }

    /// The lease and port a request's `Host` names, in the one spelling
    /// [`LeaseWeb::origin`] writes: one origin per lease port.
    fn named(&self, host: &str) -> Option<(Uuid, u16)> {
        let label = host.strip_suffix(&self.domain)?.strip_suffix('.')?;
        let (lease, port) = label.rsplit_once('-')?;
        let (lease, port): (Uuid, u16) = (lease.parse().ok()?, port.parse().ok()?);
        (port > 0 && label == format!("{lease}-{port}")).then_some((lease, port))
    }

    fn secure(&self) -> bool {
        self.scheme == "https"
    }

    fn take_idle(&self, key: (Uuid, u16)) -> Option<SendRequest<Incoming>> {
        let mut pool = self.pool.write();
        let idle = pool.get_mut(&key)?;
        idle.retain(|i| !i.sender.is_closed() && i.since.elapsed().as_secs() < IDLE_SECS);
        let at = idle.iter().position(|i| i.sender.is_ready())?;
        Some(idle.swap_remove(at).sender)
    }

    fn keep_idle(&self, key: (Uuid, u16), sender: SendRequest<Incoming>) {
        let mut pool = self.pool.write();
        let idle = pool.entry(key).or_default();
        idle.retain(|i| !i.sender.is_closed());
        if idle.len() < MOST_IDLE_PER_PORT {
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    /// Lets go of connections idle past their time (their sessions end),
    /// and of ports with none left.
    fn sweep(&self) {
        let mut pool = self.pool.write();
        for idle in pool.values_mut() {
            idle.retain(|i| !i.sender.is_closed() && i.since.elapsed().as_secs() < IDLE_SECS);
        }
        pool.retain(|_, idle| !idle.is_empty());
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_address_holds_at_most_its_share_of_connections_and_gives_them_back() {
        let open = std::sync::Arc::new(OpenByAddress::default());
        let one: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        let two: std::net::IpAddr = "192.0.2.2".parse().unwrap();
        let held: Vec<_> = (0..3).map(|_| open.take(one, 3).unwrap()).collect();
        assert!(open.take(one, 3).is_none());
        let other = open
            .take(two, 3)
            .expect("another address has its own share");
        drop(held);
        assert!(open.take(one, 3).is_some());
        drop(other);
        assert!(
            open.0.read().get(&two).is_none(),
            "an address without connections is forgotten"
        );
    }

    use super::*;

    pub(super) fn web() -> LeaseWeb {
        LeaseWebArgs {
            lease_web_addr: Some("127.0.0.1:0".into()),
            lease_web_base: Some("http://localhost:8090".into()),
        }
        .config()
        .unwrap()
        .unwrap()
    }

    #[test]
    fn each_lease_port_has_one_name_of_its_own_and_nothing_else_is_one() {
        let web = web();
        let lease = Uuid::from_u128(7);
        let origin = web.origin(lease, 8888);
        assert_eq!(origin, format!("http://{lease}-8888.localhost:8090"));
        assert_eq!(
            web.named(&format!("{lease}-8888.localhost:8090")),
            Some((lease, 8888))
        );
        for host in [
            format!("{lease}-8888.localhost:8091"),
            format!("{lease}-0.localhost:8090"),
            format!("{lease}-99999.localhost:8090"),
            format!("x{lease}-8888.localhost:8090"),
            "localhost:8090".into(),
            format!("{lease}-8888.evil.localhost:8090"),
            format!("{}-8888.localhost:8090", lease.simple()),
            format!("{lease}-08888.localhost:8090"),
            format!("{lease}-+8888.localhost:8090"),
        ] {
            assert_eq!(web.named(&host), None, "{host}");
        }
        assert!(LeaseWebArgs {
            lease_web_addr: Some("127.0.0.1:0".into()),
            lease_web_base: Some("http://127.0.0.1:8090".into()),
        }
        .config()
        .is_err());
    }
}
