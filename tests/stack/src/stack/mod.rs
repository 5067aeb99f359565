//! A stack: its servers, its temporary directory (fleet file, keys), and
//! the services running on them, which a test starts, kills and restarts by
//! name. How each service is configured, how a tenant talks to the gateway
//! and how a stack checks its bills and rebuilds sit in rooms beside this.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use lh_bus::{Bus, BusConfig, Stored};
use lh_service::{CancellationToken, CommonArgs, Running};
use lh_testkit::{wait_ready, Nats, NatsCluster, Postgres};

use crate::fleets::{enforcing, toml_node_ids};
use crate::log::read_log;

mod billing;
mod client;
mod rebuild;
mod services;

pub use services::{test_front, write_master_key_file, ADMIN_TOKEN, AUDITOR_TOKEN};

/// How long a started service may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// A change a test makes to the gateway's configuration.
pub type GatewayConfigChange = std::sync::Arc<dyn Fn(&mut lh_gateway::Config) + Send + Sync>;

/// The NATS a stack runs on.
pub enum StackNats {
    Server(Nats),
    /// Three members; the streams are created with 3 replicas.
    Cluster(NatsCluster),
}

impl StackNats {
    /// What services get as their NATS URL: the server's, or every
    /// member's, comma-separated.
    pub fn url(&self) -> String {
        match self {
            StackNats::Server(nats) => nats.url(),
            StackNats::Cluster(cluster) => cluster.urls(),
        }
    }

    /// The single server; panics on a cluster.
    pub fn server(&mut self) -> &mut Nats {
        match self {
            StackNats::Server(nats) => nats,
            StackNats::Cluster(_) => panic!("this stack runs on a NATS cluster"),
        }
    }

    /// The cluster; panics on a single server.
    pub fn cluster(&mut self) -> &mut NatsCluster {
        match self {
            StackNats::Cluster(cluster) => cluster,
            StackNats::Server(_) => panic!("this stack runs on a single nats-server"),
        }
    }
}

pub struct Stack {
    pub nats: StackNats,
    pub database_url: String,
    /// The gateway's TLS, timeouts and request budgets, for gateways
    /// started from now on ([`test_front`] unless a test changes it).
    pub gateway_front: lh_gateway::http::front::FrontArgs,
    /// A service's own database URL (its role), where a test gives one;
    /// services without one use `database_url`.
    pub service_database_urls: HashMap<&'static str, String>,
    pub fleet_file: PathBuf,
    /// The gateway's master keys (mode 0600), one throwaway key.
    pub master_key_file: PathBuf,
    _dir: tempfile::TempDir,
    running: HashMap<String, (CancellationToken, Running)>,
    pub gateway_url: String,
    pub http: reqwest::Client,
    /// Scheduler knobs for schedulers started from now on.
    pub preemption_min_runtime_secs: i64,
    pub preemption_notice_secs: i64,
    /// How node-agents run leases (`Sim` unless a test runs workloads).
    pub node_runtime: lh_node_agent::RuntimeKind,
    /// The container engine's global flags and start deadline (seconds)
    /// of node-agents started from now on, on a container runtime.
    pub node_container_args: Vec<String>,
    pub node_container_start_timeout_secs: u64,
    /// The MPS control binary of node-agents started from now on (a fake
    /// one in tests); `None`: whatever is on `PATH`.
    pub node_mps_control: Option<PathBuf>,
    /// A smaller limit of one workload log file and a quicker check of it,
    /// for node-agents started from now on; `None`: 64 MiB every 30 s.
    pub node_lease_log_limits: Option<(u64, Duration)>,
    /// GPU knobs (health rules, idle default, self-tests) of node-agents
    /// started from now on.
    pub node_gpus: lh_node_agent::GpuArgs,
    /// How node-agents started from now on keep leases' data (their sync
    /// interval, how long a moved lease waits for its workspace).
    pub node_storage: lh_node_agent::storage::StorageArgs,
    /// What each tenant may do at the gateway (the defaults unless a test
    /// sets them before the gateway starts).
    pub gateway_limits: lh_gateway::TenantLimits,
    /// A PostgreSQL cluster of this stack's own, which the test may kill and
    /// restart ([`Stack::start_with_own_postgres`]); `None` on the shared one.
    pub own_postgres: Option<Postgres>,
    /// A log that keeps events this many seconds, and restates what lives
    /// on after the second number of seconds (tests that run past expiry);
    /// `None`: the production 365 days.
    pub short_retention: Option<(u64, u64)>,
    /// Changes to the gateway's configuration (named keys, OIDC) made
    /// before each start of the gateway.
    pub gateway_config: Option<GatewayConfigChange>,
    /// Nodes enrolled on this stack's log.
    enrolled: std::collections::HashSet<String>,
    /// Whether a node-agent's start enrolls its node first (as an operator
    /// would have); a test of enrollment itself turns it off.
    pub auto_enroll: bool,
}

/// The containers a stack's node agents started outlive those agents,
/// which run in the test's process: they are removed with the stack, so
/// that the suite leaves no workload running behind it.
impl Drop for Stack {
    fn drop(&mut self) {
        if self.node_runtime != lh_node_agent::RuntimeKind::Podman {
            return;
        }
        let fleet = std::fs::read_to_string(&self.fleet_file).unwrap_or_default();
        for node in toml_node_ids(&fleet) {
            let listed = std::process::Command::new("podman")
                .args(&self.node_container_args)
                .args(["ps", "--all", "--quiet", "--filter"])
                .arg(format!(
                    "label={}={node}",
                    lh_node_agent::workload::LABEL_NODE
                ))
                .output();
            let Ok(listed) = listed else { return };
            let ids: Vec<String> = String::from_utf8_lossy(&listed.stdout)
                .split_whitespace()
                .map(String::from)
                .collect();
            if ids.is_empty() {
                continue;
            }
            let _ = std::process::Command::new("podman")
                .args(&self.node_container_args)
                .args(["rm", "--force", "--time", "0"])
                .args(&ids)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

impl Stack {
    /// Starts everything: scheduler, pricing, spot-broker, audit, gateway
    /// and one node-agent per node of `fleet`.
    pub async fn start(fleet: &str) -> Stack {
        Self::start_configured(fleet, |_| {}).await
    }

    /// [`Stack::start`] with knobs set before any service starts.
    pub async fn start_configured(fleet: &str, configure: impl FnOnce(&mut Stack)) -> Stack {
        let mut stack = Self::bare(fleet).await;
        configure(&mut stack);
        stack.start_all(fleet).await;
        stack
    }

    async fn start_all(&mut self, fleet: &str) {
        for name in ["scheduler", "pricing", "spot-broker", "audit", "gateway"] {
            self.start_service(name).await;
        }
        for node in toml_node_ids(fleet) {
            self.start_service(&format!("node-agent:{node}")).await;
        }
        self.wait_ready().await;
    }

    /// [`Stack::start`] on a PostgreSQL cluster of its own, for tests that
    /// take the database away.
    pub async fn start_with_own_postgres(fleet: &str) -> Stack {
        let postgres = Postgres::start().await.expect("PostgreSQL starts");
        let database_url = postgres.create_database().await.expect("a database");
        let nats = Nats::start().await.expect("nats-server starts");
        let mut stack = Self::bare_on(fleet, StackNats::Server(nats), database_url);
        stack.own_postgres = Some(postgres);
        stack.start_all(fleet).await;
        stack
    }

    /// [`Stack::start`] on a three-node NATS cluster, the streams created
    /// with 3 replicas before any service starts, for tests that kill a
    /// stream leader.
    pub async fn start_on_nats_cluster(fleet: &str) -> Stack {
        let cluster = NatsCluster::start().await.expect("the NATS cluster starts");
        let mut config = BusConfig::new(cluster.urls(), "test");
        config.replicas = lh_testkit::CLUSTER_MEMBERS;
        Bus::connect(&config)
            .await
            .expect("the streams are created on the cluster");
        let database_url = lh_testkit::shared_postgres()
            .await
            .create_database()
            .await
            .expect("a fresh database");
        let mut stack = Self::bare_on(fleet, StackNats::Cluster(cluster), database_url);
        stack.start_all(fleet).await;
        stack
    }

    /// Panics naming every service that has stopped.
    pub fn assert_none_stopped(&self) {
        let stopped = self.exited_services();
        assert!(stopped.is_empty(), "stopped: {stopped:?}");
    }

    /// Servers only; start services with [`Stack::start_service`].
    pub async fn bare(fleet: &str) -> Stack {
        let (nats, database_url) = lh_testkit::nats_and_database().await;
        Self::bare_on(fleet, StackNats::Server(nats), database_url)
    }

    fn bare_on(fleet: &str, nats: StackNats, database_url: String) -> Stack {
        let dir = tempfile::tempdir().unwrap();
        // Traversable, as /var/lib is: the process runtime's lease users
        // reach their homes and the MPS pipes in node state under it.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .unwrap();
        let fleet_file = dir.path().join("fleet.toml");
        std::fs::write(&fleet_file, enforcing(fleet)).unwrap();
        let master_key_file = dir.path().join("master.keys");
        write_master_key_file(&master_key_file);
        Stack {
            nats,
            database_url,
            service_database_urls: HashMap::new(),
            gateway_front: test_front(),
            fleet_file,
            master_key_file,
            _dir: dir,
            running: HashMap::new(),
            gateway_url: String::new(),
            http: reqwest::Client::new(),
            preemption_min_runtime_secs: 600,
            preemption_notice_secs: 120,
            node_runtime: lh_node_agent::RuntimeKind::Sim,
            node_container_args: Vec::new(),
            node_container_start_timeout_secs: 900,
            node_mps_control: None,
            node_lease_log_limits: None,
            node_gpus: lh_node_agent::GpuArgs::for_test(),
            node_storage: lh_node_agent::storage::StorageArgs::for_test(),
            own_postgres: None,
            gateway_limits: lh_gateway::TenantLimits::default(),
            short_retention: None,
            gateway_config: None,
            enrolled: Default::default(),
            auto_enroll: true,
        }
    }

    /// The database URL `service` connects with.
    pub fn database_url_for(&self, service: &str) -> String {
        self.service_database_urls
            .get(service)
            .unwrap_or(&self.database_url)
            .clone()
    }

    /// The flags every service of this stack shares.
    pub fn common(&self) -> CommonArgs {
        let mut common = CommonArgs::for_test(&self.nats.url());
        if let Some((max_age_secs, restate_after_secs)) = self.short_retention {
            common.events_max_age_secs = Some(max_age_secs);
            common.allow_short_retention = true;
            common.restate_after_secs = Some(restate_after_secs);
        }
        common
    }

    pub async fn bus(&self) -> Bus {
        let mut config = BusConfig::new(self.nats.url(), "test");
        if let Some((max_age_secs, _)) = self.short_retention {
            config.events_max_age = Duration::from_secs(max_age_secs);
            config.allow_short_retention = true;
        }
        Bus::connect(&config).await.expect("bus connects")
    }

    /// Ends a service abruptly, the way kill -9 would (as near as one
    /// process gets): it finishes nothing it was doing.
    pub async fn kill_service(&mut self, name: &str) {
        let (token, running) = self.running.remove(name).expect("service is running");
        running.abort();
        token.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), running.wait()).await;
    }

    /// Stops a service the way SIGTERM would and waits for it to end.
    pub async fn stop_service(&mut self, name: &str) {
        let (token, running) = self.running.remove(name).expect("service is running");
        token.cancel();
        tokio::time::timeout(Duration::from_secs(10), running.wait())
            .await
            .unwrap_or_else(|_| panic!("{name} did not stop"))
            .unwrap_or_else(|e| panic!("{name} failed: {e:#}"));
    }

    pub fn http_addr(&self, name: &str) -> std::net::SocketAddr {
        self.running[name].1.http_addr
    }

    /// Where `name` serves /metrics (the gateway: its internal listener).
    pub fn metrics_addr(&self, name: &str) -> std::net::SocketAddr {
        self.running[name].1.metrics_addr
    }

    /// The text of the stack's one metrics recorder (every service in
    /// this process shares it), as the gateway's /metrics serves it;
    /// empty while it does not answer.
    pub async fn metrics_text(&self) -> String {
        let answer = self
            .http
            .get(format!("http://{}/metrics", self.metrics_addr("gateway")))
            .send()
            .await
            .and_then(|r| r.error_for_status());
        match answer {
            Ok(answer) => answer.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    pub fn service_names(&self) -> Vec<String> {
        self.running.keys().cloned().collect()
    }

    /// Services whose work has ended although nobody stopped them.
    pub fn exited_services(&self) -> Vec<String> {
        self.running
            .iter()
            .filter(|(_, (_, running))| running.is_finished())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Waits until every running service reports ready.
    pub async fn wait_ready(&self) {
        for (name, (_, running)) in &self.running {
            wait_ready(name, running, READY_TIMEOUT).await;
        }
    }

    /// Writes a file beside the fleet file (a fault script it names).
    pub fn write_beside_fleet(&self, name: &str, text: &str) {
        std::fs::write(self.fleet_file.parent().unwrap().join(name), text).unwrap();
    }

    /// Polls the log until `pred` finds what it needs (`secs` at most).
    pub async fn wait_log<T>(&self, secs: u64, pred: impl Fn(&[Stored]) -> Option<T>) -> T {
        let bus = self.bus().await;
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let log = read_log(&bus).await;
            if let Some(found) = pred(&log) {
                return found;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the log never showed it in {secs} s; types: {:?}",
                log.iter()
                    .map(|e| e.envelope.data.event_type())
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
