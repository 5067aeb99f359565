//! A three-node JetStream cluster of nats-servers, for tests of what a
//! leader change does to clients.
//!
//! Each member is a [`Nats`] with its own temporary store and a `cluster`
//! block routing to the others on 127.0.0.1. The route and monitoring ports
//! are picked before any member starts, because every config names every
//! route; a member's client port is picked when it starts, as for a single
//! server. Leaders are read from each member's monitoring endpoint (`/jsz`),
//! which needs no client library and answers while JetStream elects.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::nats::{Nats, Peering};

/// Members of the cluster: the smallest that survives losing one.
pub const CLUSTER_MEMBERS: usize = 3;
/// How long the members may take to elect a leader (meta or stream).
const LEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two looks at the leaders.
const LEADER_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Timeout of one monitoring request.
const MONITOR_TIMEOUT: Duration = Duration::from_secs(2);
/// The most of a monitoring answer read (a `/jsz` of a test account is a
/// few KiB).
const MONITOR_RESPONSE_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// Three nats-servers with JetStream (`sync_interval: always`) in one
/// cluster on 127.0.0.1. Members are numbered 0..3; [`NatsCluster::kill`]
/// and [`NatsCluster::restart`] crash and revive one by index, on the same
/// ports and store. Dropping the value kills every member and removes their
/// directories.
pub struct NatsCluster {
    members: Vec<Nats>,
}

impl NatsCluster {
    /// Starts three members and waits until they agree on a JetStream meta
    /// leader (before that, creating a stream fails).
    pub async fn start() -> anyhow::Result<NatsCluster> {
        let cluster_name = format!("lh-test-{}", uuid::Uuid::new_v4().simple());
        let mut route_ports = Vec::with_capacity(CLUSTER_MEMBERS);
        let mut http_ports = Vec::with_capacity(CLUSTER_MEMBERS);
        // Held open together so that the kernel hands out distinct ports.
        let mut held = Vec::with_capacity(2 * CLUSTER_MEMBERS);
        for _ in 0..CLUSTER_MEMBERS {
            for ports in [&mut route_ports, &mut http_ports] {
                let listener =
                    std::net::TcpListener::bind(("127.0.0.1", 0)).context("picking a free port")?;
                ports.push(listener.local_addr()?.port());
                held.push(listener);
            }
        }
        drop(held);
        let mut members = Vec::with_capacity(CLUSTER_MEMBERS);
        for (index, (cluster_port, http_port)) in route_ports.iter().zip(&http_ports).enumerate() {
            let peering = Peering {
                cluster_name: cluster_name.clone(),
                cluster_port: *cluster_port,
                http_port: *http_port,
                route_ports: route_ports.clone(),
            };
            let name = format!("{cluster_name}-n{}", index + 1);
            members.push(
                Nats::start_as(name, Some(peering))
                    .await
                    .with_context(|| format!("starting cluster member {index}"))?,
            );
        }
        let cluster = NatsCluster { members };
        cluster.wait_for_meta_leader().await?;
        tracing::info!(urls = %cluster.urls(), "nats cluster started");
        Ok(cluster)
    }

    /// Every member's client URL, comma-separated: what `LH_NATS_URL`
    /// holds for a cluster.
    pub fn urls(&self) -> String {
        self.members
            .iter()
            .map(Nats::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// How many members the cluster has.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// One member's client URL.
    pub fn url(&self, index: usize) -> String {
        self.members[index].url()
    }

    /// One member, e.g. for its log file.
    pub fn member(&self, index: usize) -> &Nats {
        &self.members[index]
    }

    /// Kills member `index` with SIGKILL (a crash).
    pub fn kill(&mut self, index: usize) {
        self.members[index].kill();
    }

    /// Starts member `index` again on its ports and store and waits until
    /// it follows the meta leader again.
    pub async fn restart(&mut self, index: usize) -> anyhow::Result<()> {
        self.members[index].restart().await?;
        self.wait_for_meta_leader().await.map(drop)
    }

    /// The member that leads stream `stream` now, once the running members
    /// agree on a running one; waits through an election.
    pub async fn stream_leader(&mut self, stream: &str) -> anyhow::Result<usize> {
        self.wait_for_leader(&format!("stream {stream}"), |jsz| {
            stream_leader_name(jsz, stream)
        })
        .await
    }

    /// The member that leads the JetStream meta group now.
    pub async fn meta_leader(&mut self) -> anyhow::Result<usize> {
        self.wait_for_meta_leader().await
    }

    async fn wait_for_meta_leader(&self) -> anyhow::Result<usize> {
        self.wait_for_leader("the JetStream meta group", |jsz| {
            jsz["meta_cluster"]["leader"].as_str().map(str::to_string)
        })
        .await
    }

    /// Polls `/jsz` of every running member until all of them name the same
    /// running member as the leader `leader_of` reads.
    async fn wait_for_leader(
        &self,
        what: &str,
        leader_of: impl Fn(&serde_json::Value) -> Option<String>,
    ) -> anyhow::Result<usize> {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        let mut last_seen = Vec::new();
        loop {
            last_seen.clear();
            for member in self.members.iter().filter(|m| m.is_started()) {
                let port = member.http_port().expect("cluster members have monitoring");
                let leader = match monitor_json(port, "/jsz?accounts=true&streams=true").await {
                    Ok(jsz) => leader_of(&jsz),
                    Err(_) => None,
                };
                last_seen.push(leader);
            }
            let agreed = match last_seen.first() {
                Some(Some(first)) if last_seen.iter().all(|l| l.as_ref() == Some(first)) => self
                    .members
                    .iter()
                    .position(|m| m.is_started() && m.server_name() == first),
                _ => None,
            };
            if let Some(index) = agreed {
                return Ok(index);
            }
            if Instant::now() >= deadline {
                return Err(anyhow!(
                    "no agreed leader of {what} within {LEADER_TIMEOUT:?}; running members say {last_seen:?}"
                ));
            }
            tokio::time::sleep(LEADER_POLL_INTERVAL).await;
        }
    }
}

impl std::fmt::Debug for NatsCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsCluster")
            .field("members", &self.members)
            .finish()
    }
}

/// The leader the `/jsz` answer names for `stream` (any account).
fn stream_leader_name(jsz: &serde_json::Value, stream: &str) -> Option<String> {
    jsz["account_details"]
        .as_array()?
        .iter()
        .filter_map(|account| account["stream_detail"].as_array())
        .flatten()
        .find(|detail| detail["name"].as_str() == Some(stream))
        .and_then(|detail| detail["cluster"]["leader"].as_str())
        .filter(|leader| !leader.is_empty())
        .map(str::to_string)
}

/// GETs a monitoring path of the server on `port` and parses its JSON.
async fn monitor_json(port: u16, path: &str) -> anyhow::Result<serde_json::Value> {
    let exchange = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        // HTTP/1.0: the server closes the connection after its answer.
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream
            .take(MONITOR_RESPONSE_MAX_BYTES)
            .read_to_end(&mut response)
            .await?;
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(MONITOR_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow!("no answer within {MONITOR_TIMEOUT:?}"))??;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("not an HTTP answer"))?;
    let status = head.lines().next().unwrap_or_default();
    anyhow::ensure!(status.contains(" 200 "), "{path}: {status}");
    serde_json::from_str(body).with_context(|| format!("{path}: not JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_leader_is_read_from_any_account() {
        let jsz = serde_json::json!({
            "account_details": [
                {"name": "$SYS"},
                {"name": "$G", "stream_detail": [
                    {"name": "OTHER", "cluster": {"leader": "n1"}},
                    {"name": "LH_EVENTS", "cluster": {"leader": "n2"}},
                ]},
            ]
        });
        assert_eq!(stream_leader_name(&jsz, "LH_EVENTS").as_deref(), Some("n2"));
        assert_eq!(stream_leader_name(&jsz, "MISSING"), None);
        let electing = serde_json::json!({"account_details": [{"stream_detail": [
            {"name": "LH_EVENTS", "cluster": {"leader": ""}}
        ]}]});
        assert_eq!(stream_leader_name(&electing, "LH_EVENTS"), None);
    }
}
