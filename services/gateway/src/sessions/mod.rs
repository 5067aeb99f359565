//! Sessions into a lease (docs/adr/030): who may open one, how many each
//! lease and tenant may hold at this replica, and the relay between the
//! client's WebSocket and the lease's node ([`relay`]).

pub mod lane;
pub mod open;
pub mod relay;
pub mod websocket;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

/// What the API shows of the SSH endpoint: how to reach it and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshEndpoint {
    pub host: String,
    pub port: u16,
    /// `SHA256:...`, as `ssh` prints it on a first connection.
    pub host_key_fingerprint: String,
}

/// How long a node may take to answer an opening.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct SessionArgs {
    /// Sessions (exec, shell, each forwarded connection) one lease may
    /// hold at once through this replica.
    #[arg(long, env = "LH_SESSIONS_PER_LEASE", default_value_t = 8)]
    pub sessions_per_lease: u32,
    /// Sessions one tenant may hold at once through this replica.
    #[arg(long, env = "LH_SESSIONS_PER_TENANT", default_value_t = 32)]
    pub sessions_per_tenant: u32,
    /// A session with no bytes either way for this long is closed.
    #[arg(long, env = "LH_SESSION_IDLE_TIMEOUT_SECS", default_value_t = 1800)]
    pub session_idle_timeout_secs: u64,
    /// Most bytes per second a session carries each way (more waits).
    #[arg(long, env = "LH_SESSION_BYTES_PER_S", default_value_t = 64 * 1024 * 1024)]
    pub session_bytes_per_s: u64,
    /// A client that takes longer than this to take a message is closed.
    #[arg(
        long,
        env = "LH_SESSION_CLIENT_READ_TIMEOUT_SECS",
        default_value_t = 30
    )]
    pub session_client_read_timeout_secs: u64,
    /// Whether an admin may open a session into a tenant's lease (with a
    /// `reason`, which the trail keeps). Off: only the lease's tenant.
    #[arg(long, env = "LH_OPERATOR_SESSIONS", default_value_t = false)]
    pub operator_sessions: bool,
    /// Where nodes dial this replica for a session's lane, which carries
    /// its frames instead of the bus (`off`: every session on the bus).
    /// Nodes whose bus is TLS never take a lane: it is plaintext.
    #[arg(long, env = "LH_SESSION_LANE_ADDR", default_value = "off")]
    pub session_lane_addr: String,
    /// Where nodes reach the lane listener, when not its bound address
    /// (this replica's own address: a lane must reach the replica that
    /// opened its session, not any behind a balancer).
    #[arg(long, env = "LH_SESSION_LANE_PUBLIC_ADDR")]
    pub session_lane_public_addr: Option<String>,
}

impl Default for SessionArgs {
    fn default() -> Self {
        SessionArgs {
            sessions_per_lease: 8,
            sessions_per_tenant: 32,
            session_idle_timeout_secs: 1800,
            session_bytes_per_s: 64 * 1024 * 1024,
            session_client_read_timeout_secs: 30,
            operator_sessions: false,
            session_lane_addr: "off".into(),
            session_lane_public_addr: None,
        }
    }
}

/// The sessions this replica relays: its settings and its counts.
#[derive(Debug)]
pub struct Sessions {
    pub args: SessionArgs,
    /// This replica's name in the trail.
    pub replica: String,
    counts: Arc<Mutex<Counts>>,
    /// The lanes this replica offers nodes, when it listens for them.
    pub lanes: Option<Arc<lane::Lanes>>,
}

#[derive(Debug, Default)]
struct Counts {
    per_lease: HashMap<Uuid, u32>,
    per_tenant: HashMap<Uuid, u32>,
}

/// One session's place in the counts, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    counts: Arc<Mutex<Counts>>,
    tenant_id: Uuid,
    lease_id: Uuid,
}

/// Which limit a session would pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverLimit {
    Lease(u32),
    Tenant(u32),
}

impl Sessions {
    pub fn new(args: SessionArgs) -> Self {
        let replica = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "gateway".to_string());
        Sessions {
            args,
            replica,
            counts: Default::default(),
            lanes: None,
        }
    }

    /// Offers nodes `lanes` for the sessions' frames.
    pub fn with_lanes(mut self, lanes: Option<Arc<lane::Lanes>>) -> Self {
        self.lanes = lanes;
        self
    }

    /// A place for one more session of `tenant_id` into `lease_id`.
    pub fn take(&self, tenant_id: Uuid, lease_id: Uuid) -> Result<Slot, OverLimit> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let lease = counts.per_lease.get(&lease_id).copied().unwrap_or(0);
        if lease >= self.args.sessions_per_lease {
            return Err(OverLimit::Lease(self.args.sessions_per_lease));
        }
        let tenant = counts.per_tenant.get(&tenant_id).copied().unwrap_or(0);
        if tenant >= self.args.sessions_per_tenant {
            return Err(OverLimit::Tenant(self.args.sessions_per_tenant));
        }
        *counts.per_lease.entry(lease_id).or_default() += 1;
        *counts.per_tenant.entry(tenant_id).or_default() += 1;
        metrics::gauge!("lh_gateway_sessions_open").increment(1.0);
        Ok(Slot {
            counts: self.counts.clone(),
            tenant_id,
            lease_id,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let counts = &mut *counts;
        for (map, key) in [
            (&mut counts.per_lease, self.lease_id),
            (&mut counts.per_tenant, self.tenant_id),
        ] {
            if let Some(n) = map.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&key);
                }
            }
        }
        metrics::gauge!("lh_gateway_sessions_open").decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_counted_per_lease_and_per_tenant_and_given_back() {
        let sessions = Sessions::new(SessionArgs {
            sessions_per_lease: 2,
            sessions_per_tenant: 3,
            ..SessionArgs::default()
        });
        let (tenant, a, b) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let one = sessions.take(tenant, a).unwrap();
        let _two = sessions.take(tenant, a).unwrap();
        assert_eq!(sessions.take(tenant, a).unwrap_err(), OverLimit::Lease(2));
        let _three = sessions.take(tenant, b).unwrap();
        assert_eq!(sessions.take(tenant, b).unwrap_err(), OverLimit::Tenant(3));
        // Another tenant is not held back by the first.
        let _other = sessions.take(Uuid::from_u128(9), b).unwrap();
        drop(one);
        let _four = sessions.take(tenant, a).unwrap();
    }
}
