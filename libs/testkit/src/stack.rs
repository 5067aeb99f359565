//! The whole platform in one test process: a real nats-server (or a
//! three-node cluster of them) and a real PostgreSQL started by the test
//! kit, and every service started through the same `start` its binary calls.
//!
//! Behind the `stack` feature because it links every service crate; only the
//! system tests (`tests/system`) turn it on.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use lh_bus::{Bus, BusConfig, FeedItem, Stored};
use lh_events::subject;
use lh_service::{CancellationToken, CommonArgs, Running};
use serde_json::{json, Value};

use crate::{wait_ready, Nats, NatsCluster, Postgres};

/// How long a started service may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef0123456789";
pub const AUDITOR_TOKEN: &str = "test-auditor-token-0123456789abcdef012345678";

/// Three nodes of three models in three zones.
pub const FLEET: &str = r#"
[[node]]
id = "node-a"
zone = "cn-north-1a"
hostname = "gpu-a.sim"
gpu_model = "A100-40GB"
gpu_count = 8
vram_gb = 40

[[node]]
id = "node-b"
zone = "cn-east-1b"
hostname = "gpu-b.sim"
gpu_model = "A10G-24GB"
gpu_count = 4
vram_gb = 24

[[node]]
id = "node-c"
zone = "cn-south-1c"
hostname = "gpu-c.sim"
gpu_model = "H100-80GB"
gpu_count = 8
vram_gb = 80
"#;

/// One node with two A100-40GB.
pub const TWO_A100: &str = r#"
[[node]]
id = "node-a"
zone = "cn-north-1a"
hostname = "gpu-a.sim"
gpu_model = "A100-40GB"
gpu_count = 2
vram_gb = 40
"#;

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
    /// The MPS control binary of node-agents started from now on (a fake
    /// one in tests); `None`: whatever is on `PATH`.
    pub node_mps_control: Option<PathBuf>,
    /// A smaller limit of one workload log file and a quicker check of it,
    /// for node-agents started from now on; `None`: 64 MiB every 30 s.
    pub node_lease_log_limits: Option<(u64, Duration)>,
    /// GPU knobs (health rules, idle default, self-tests) of node-agents
    /// started from now on.
    pub node_gpus: lh_node_agent::GpuArgs,
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
        config.replicas = crate::CLUSTER_MEMBERS;
        Bus::connect(&config)
            .await
            .expect("the streams are created on the cluster");
        let database_url = crate::shared_postgres()
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
        let (nats, database_url) = crate::nats_and_database().await;
        Self::bare_on(fleet, StackNats::Server(nats), database_url)
    }

    fn bare_on(fleet: &str, nats: StackNats, database_url: String) -> Stack {
        let dir = tempfile::tempdir().unwrap();
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
            node_mps_control: None,
            node_lease_log_limits: None,
            node_gpus: lh_node_agent::GpuArgs::for_test(),
            own_postgres: None,
            gateway_limits: lh_gateway::TenantLimits::default(),
            short_retention: None,
            gateway_config: None,
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

    pub async fn start_service(&mut self, name: &str) {
        let common = self.common();
        let token = CancellationToken::new();
        let running = match name.split_once(':').map(|(a, _)| a).unwrap_or(name) {
            "scheduler" => {
                let mut config = lh_scheduler::Config::for_test(&self.nats.url());
                config.preemption_min_runtime_secs = self.preemption_min_runtime_secs;
                config.preemption_notice_secs = self.preemption_notice_secs;
                config.common = common;
                Box::pin(lh_scheduler::start(config, token.clone())).await
            }
            "pricing" => {
                Box::pin(lh_pricing::start(
                    lh_pricing::Config {
                        common,
                        ..lh_pricing::Config::for_test(
                            &self.nats.url(),
                            &self.database_url_for("pricing"),
                        )
                    },
                    token.clone(),
                ))
                .await
            }
            "spot-broker" => {
                Box::pin(lh_spot_broker::start(
                    lh_spot_broker::Config::for_test(common),
                    token.clone(),
                ))
                .await
            }
            "audit" => {
                Box::pin(lh_audit::start(
                    lh_audit::Config {
                        common,
                        database_url: self.database_url_for("audit"),
                        schema: "audit".into(),
                        // Kept across restarts: checkpoints an earlier run
                        // signed must still verify against the trusted key.
                        signing_key_file: Some(self._dir.path().join("audit-signing.key")),
                        checkpoint_every_events: 50,
                        // A log that expires in seconds needs checkpoints as
                        // often, to verify from after expiry.
                        checkpoint_every_secs: if self.short_retention.is_some() {
                            1
                        } else {
                            3600
                        },
                        // A stack on a log that expires in seconds prunes in step.
                        prune_every_secs: 1,
                        trusted_public_keys: Vec::new(),
                        trusted_public_keys_file: None,
                        verify_token_file: None,
                    },
                    token.clone(),
                ))
                .await
            }
            "gateway" => {
                // A restarted gateway comes back where clients knew it.
                let gateway_addr = self
                    .gateway_url
                    .strip_prefix("http://")
                    .unwrap_or("127.0.0.1:0")
                    .to_string();
                let mut config = lh_gateway::Config {
                    common,
                    gateway_addr,
                    database_url: self.database_url_for("gateway"),
                    schema: "gateway".into(),
                    admin_token: Some(ADMIN_TOKEN.into()),
                    admin_token_file: None,
                    auditor_token: Some(AUDITOR_TOKEN.into()),
                    auditor_token_file: None,
                    admin_keys_file: None,
                    oidc: Default::default(),
                    master_key_file: self.master_key_file.clone(),
                    front: self.gateway_front.clone(),
                    limits: self.gateway_limits,
                    usage: Default::default(),
                };
                if let Some(change) = &self.gateway_config {
                    change(&mut config);
                }
                Box::pin(lh_gateway::start(config, token.clone())).await
            }
            "node-agent" => {
                let node_id = name.split_once(':').unwrap().1.to_string();
                Box::pin(lh_node_agent::start(
                    lh_node_agent::Config {
                        runtime: self.node_runtime,
                        mps_control: self.node_mps_control.clone(),
                        lease_log_test_limits: self.node_lease_log_limits,
                        stop_grace_secs: 2,
                        gpus: self.node_gpus.clone(),
                        common,
                        ..lh_node_agent::Config::for_test(
                            &self.nats.url(),
                            self.fleet_file.clone(),
                            &node_id,
                        )
                    },
                    token.clone(),
                ))
                .await
            }
            other => panic!("unknown service {other}"),
        }
        .unwrap_or_else(|e| panic!("{name} starts: {e:#}"));
        if name == "gateway" {
            self.gateway_url = format!("http://{}", running.http_addr);
        }
        self.running.insert(name.to_string(), (token, running));
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

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.gateway_url, path))
            .bearer_auth(key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("gateway answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn create_tenant(&self, name: &str, max_gpus: u32) -> (String, String) {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                "/v1/tenants",
                ADMIN_TOKEN,
                Some(json!({"name": name, "email": format!("ops@{name}.example"), "quota": {"max_gpus": max_gpus}})),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        (
            body["id"].as_str().unwrap().to_string(),
            body["api_key"].as_str().unwrap().to_string(),
        )
    }

    /// Asks for a lease; its id once the gateway accepted it (202).
    pub async fn lease(&self, key: &str, body: Value) -> String {
        let (status, lease) = self
            .call(reqwest::Method::POST, "/v1/leases", key, Some(body))
            .await;
        assert_eq!(status, 202, "{lease}");
        lease["id"].as_str().unwrap().to_string()
    }

    /// Asks for a lease and waits until it runs; the running lease.
    pub async fn running(&self, key: &str, body: Value) -> Value {
        let id = self.lease(key, body).await;
        self.wait_lease(key, &id, |l| l["state"] == "running").await
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

    /// Polls a lease until `pred` holds (10 s at most).
    pub async fn wait_lease(&self, key: &str, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        for _ in 0..200 {
            let (status, body) = self
                .call(reqwest::Method::GET, &format!("/v1/leases/{id}"), key, None)
                .await;
            // A lease written to the log directly is not in the gateway's
            // read model until its projection catches up: the gateway waits
            // for it a while, then says 503 with a Retry-After, as a
            // client would be told on a loaded machine.
            if status == 404 || status == 503 {
                last = body;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            assert_eq!(status, 200, "{body}");
            if pred(&body) {
                return body;
            }
            last = body;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("lease {id} never reached the expected state; last: {last}");
    }
}

/// `fleet` with every node that does not say otherwise declaring what a
/// production node enforces (containers, HAMi-core), as `dev/fleet.toml`
/// does: the tests of other rules place untrusted tenants' leases and GPU
/// shares on it. A test of those rules names `isolation` or `gpu_sharing`
/// on its nodes; a real runtime (`node_runtime`) declares its own anyway.
pub fn enforcing(fleet: &str) -> String {
    let mut out = String::with_capacity(fleet.len());
    let mut blocks = fleet.split("[[node]]");
    out.push_str(blocks.next().unwrap_or_default());
    for block in blocks {
        out.push_str("[[node]]\n");
        let names = |key: &str| {
            block
                .lines()
                .any(|l| l.trim_start().starts_with(key) && l.contains('='))
        };
        if !names("isolation") {
            out.push_str("isolation = \"container\"\n");
        }
        if !names("gpu_sharing") {
            out.push_str("gpu_sharing = \"hami-core\"\n");
        }
        out.push_str(block.strip_prefix('\n').unwrap_or(block));
    }
    out
}

fn toml_node_ids(fleet: &str) -> Vec<String> {
    fleet
        .lines()
        .filter_map(|l| l.trim().strip_prefix("id = \""))
        .map(|rest| rest.trim_end_matches('"').to_string())
        .collect()
}

/// Every event in the log, in order (messages that do not decode left out).
pub async fn read_log(bus: &Bus) -> Vec<Stored> {
    let head = bus.last_sequence().await.unwrap();
    let mut out = Vec::new();
    if head == 0 {
        return out;
    }
    let mut feed = bus.reread(&[subject::EVENTS_ALL], 1).await.unwrap();
    while let Some(item) = feed.next_item_within(Duration::from_secs(5)).await {
        let item = item.unwrap();
        let done = item.sequence() >= head;
        if let FeedItem::Event(event) = item {
            out.push(event);
        }
        if done {
            break;
        }
    }
    out
}

/// `(node, started_at)` of every `lease.started`, in log order.
pub fn starts(log: &[Stored]) -> Vec<(String, chrono::DateTime<chrono::Utc>)> {
    log.iter()
        .filter_map(|e| match &e.envelope.data {
            lh_events::EventData::LeaseStarted(s) => Some((s.node_id.clone(), s.started_at)),
            _ => None,
        })
        .collect()
}

pub fn of_type<'a>(log: &'a [Stored], event_type: &str) -> Vec<&'a Stored> {
    log.iter()
        .filter(|e| e.envelope.event_type == event_type)
        .collect()
}

/// What the invoice line of lease `id` must say when it held `vram_gb`:
/// `(billed seconds, amount, started_at)` from the node-agent's own
/// timestamps, at the default price of 0.5 CNY per GB-hour, seconds rounded
/// up and the amount to the cent (half away from zero).
pub fn expected_charge(
    log: &[Stored],
    id: &str,
    vram_gb: u32,
) -> (i64, rust_decimal::Decimal, chrono::DateTime<chrono::Utc>) {
    use lh_events::EventData;
    let start = of_type(log, "lease.started")
        .into_iter()
        .find_map(|e| match &e.envelope.data {
            EventData::LeaseStarted(s) if s.lease_id.to_string() == id => Some(s.started_at),
            _ => None,
        })
        .expect("the lease started");
    let end = of_type(log, "lease.ended")
        .into_iter()
        .find_map(|e| match &e.envelope.data {
            EventData::LeaseEnded(s) if s.lease_id.to_string() == id => Some(s.ended_at),
            _ => None,
        })
        .expect("the lease ended");
    let (seconds, amount) = billed(vram_gb, start, end);
    (seconds, amount, start)
}

/// `(billed seconds, amount)` of holding `vram_gb` from `from` to `to` at
/// the default price of 0.5 CNY per GB-hour: seconds rounded up, the amount
/// to the cent (half away from zero).
fn billed(
    vram_gb: u32,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> (i64, rust_decimal::Decimal) {
    use rust_decimal::{Decimal, RoundingStrategy};
    let micros = (to - from).num_microseconds().unwrap();
    let seconds = (micros + 999_999) / 1_000_000;
    let amount = (Decimal::from(vram_gb) * Decimal::new(5, 1) * Decimal::from(seconds)
        / Decimal::from(3600))
    .round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero);
    (seconds, amount)
}

impl Stack {
    /// The tenant's charges of `period` (`/v1/charges`, one line per
    /// charge) once there are `lines` of them.
    pub async fn wait_invoice(&self, key: &str, period: &str, lines: usize) -> Value {
        self.invoice_when(key, period, |l| l == lines)
            .await
            .unwrap_or_else(|| panic!("the invoice for {period} never had {lines} lines"))
    }

    /// The tenant's invoice for `period` once its number of lines passes
    /// `enough` (10 s at most).
    async fn invoice_when(
        &self,
        key: &str,
        period: &str,
        enough: impl Fn(usize) -> bool,
    ) -> Option<Value> {
        for _ in 0..200 {
            let (s, body) = self
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/charges?period={period}"),
                    key,
                    None,
                )
                .await;
            assert_eq!(s, 200, "{body}");
            if body["lines"].as_array().map(Vec::len).is_some_and(&enough) {
                return Some(body);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Creates a tenant from a whole request body; the 201 answer.
    pub async fn create_tenant_from(&self, body: Value) -> Value {
        let (status, tenant) = self
            .call(
                reqwest::Method::POST,
                "/v1/tenants",
                ADMIN_TOKEN,
                Some(body),
            )
            .await;
        assert_eq!(status, 201, "{tenant}");
        tenant
    }

    /// The tenant's invoice bills exactly the runs, `(started, billed
    /// until)`, of its one lease, each for `vram_gb` at the default 0.5 CNY
    /// per GB-hour: as many seconds as the runs have (each rounded up),
    /// nothing between them, and in all the rounded cost of those seconds
    /// to the cent, from the first run's start to the last one's end (its
    /// lines are one per UTC hour, so a line may span a gap between runs
    /// without billing it).
    pub async fn assert_runs_billed(
        &self,
        key: &str,
        vram_gb: u32,
        runs: &[(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)],
    ) {
        use chrono::SubsecRound;
        use rust_decimal::{Decimal, RoundingStrategy};
        for pair in runs.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "runs do not overlap");
        }
        let period = runs[0].0.format("%Y-%m").to_string();
        let seconds: i64 = runs
            .iter()
            .map(|(from, to)| billed(vram_gb, *from, *to).0)
            .sum();
        let amount = (Decimal::from(vram_gb) * Decimal::new(5, 1) * Decimal::from(seconds)
            / Decimal::from(3600))
        .round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero);
        let at = |v: &Value| {
            v.as_str()
                .unwrap()
                .parse::<chrono::DateTime<chrono::Utc>>()
                .unwrap()
        };
        let billed_seconds = |invoice: &Value| -> i64 {
            invoice["lines"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["billed_seconds"].as_i64().unwrap())
                .sum()
        };
        let mut invoice = self.wait_invoice_lines(key, &period).await;
        for _ in 0..200 {
            if billed_seconds(&invoice) >= seconds {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            invoice = self.wait_invoice_lines(key, &period).await;
        }
        assert_eq!(billed_seconds(&invoice), seconds, "{invoice}");
        let mut lines = invoice["lines"].as_array().unwrap().clone();
        lines.sort_by_key(|l| l["from"].as_str().unwrap().to_string());
        // The invoice keeps microseconds (PostgreSQL timestamptz).
        assert_eq!(
            at(&lines[0]["from"]),
            runs[0].0.trunc_subsecs(6),
            "{invoice}"
        );
        let last = runs[runs.len() - 1].1;
        assert_eq!(
            at(&lines[lines.len() - 1]["to"]),
            last.trunc_subsecs(6),
            "{invoice}"
        );
        let total: Decimal = lines
            .iter()
            .map(|l| l["amount"].as_str().unwrap().parse::<Decimal>().unwrap())
            .sum();
        assert_eq!(total, amount, "{invoice}");
    }

    /// The tenant's invoice for `period` once it has a line.
    async fn wait_invoice_lines(&self, key: &str, period: &str) -> Value {
        self.invoice_when(key, period, |l| l > 0)
            .await
            .unwrap_or_else(|| panic!("the invoice for {period} never had a line"))
    }

    /// The gateway's tables are what a replay of the log gives.
    pub async fn assert_gateway_rebuilds_identically(&self) {
        let report =
            lh_gateway::rebuild(&self.gateway_config(), "gateway_rebuild", false, |_, _| {})
                .await
                .unwrap();
        for c in report.tables {
            assert_eq!(c.live, c.rebuilt, "table {} differs in a rebuild", c.table);
        }
    }

    /// How many tables of the gateway's and pricing's projections differ
    /// from a replay of the log (once both have reached its head).
    pub async fn rebuild_differences(&self) -> usize {
        let head = self.bus().await.last_sequence().await.unwrap_or(0);
        let pool = sqlx::PgPool::connect(&self.database_url)
            .await
            .expect("the database answers");
        // A projection reads only its own subjects, so it may stop short of
        // the head: it has caught up once its offset holds still.
        let offsets = "SELECT coalesce(sum(sequence), 0)::BIGINT FROM (
            SELECT sequence FROM gateway.projection_offsets WHERE name = 'gateway'
            UNION ALL SELECT sequence FROM pricing.projection_offsets) o";
        let mut last = -1i64;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now: i64 = sqlx::query_scalar(offsets)
                .fetch_one(&pool)
                .await
                .unwrap_or(-2);
            if now == last && head > 0 {
                break;
            }
            last = now;
        }
        pool.close().await;
        let gateway =
            lh_gateway::rebuild(&self.gateway_config(), "gateway_rebuild", false, |_, _| {})
                .await
                .expect("the gateway's projection rebuilds");
        let pricing = lh_pricing::rebuild(
            &lh_pricing::Config::for_test(&self.nats.url(), &self.database_url),
            "pricing_rebuild",
            false,
            |_, _| {},
        )
        .await
        .expect("pricing's projection rebuilds");
        gateway
            .tables
            .iter()
            .chain(&pricing.tables)
            .filter(|c| c.live != c.rebuilt)
            .count()
    }

    /// A gateway's configuration on this stack (port 0, the test admin
    /// token), for tests that start or rebuild one themselves.
    pub fn gateway_config(&self) -> lh_gateway::Config {
        lh_gateway::Config {
            common: self.common(),
            gateway_addr: "127.0.0.1:0".into(),
            database_url: self.database_url.clone(),
            schema: "gateway".into(),
            admin_token: Some(ADMIN_TOKEN.into()),
            admin_token_file: None,
            auditor_token: None,
            auditor_token_file: None,
            admin_keys_file: None,
            oidc: Default::default(),
            master_key_file: self.master_key_file.clone(),
            front: test_front(),
            limits: Default::default(),
            usage: Default::default(),
        }
    }
}

/// A master-key file as an operator would write one: a random key, 0600.
pub fn write_master_key_file(path: &std::path::Path) {
    use rand::RngCore as _;
    let mut key = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut key);
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(path, format!("test-1 {hex}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}

/// The gateway's front door for tests: metrics on a free port, and request
/// budgets far above what a test sends (a test of the budgets sets its own).
pub fn test_front() -> lh_gateway::http::front::FrontArgs {
    lh_gateway::http::front::FrontArgs {
        metrics_addr: "127.0.0.1:0".into(),
        requests_per_s_per_key: 100_000.0,
        request_burst_per_key: 100_000,
        anonymous_requests_per_s_per_ip: 100_000.0,
        anonymous_request_burst_per_ip: 100_000,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_declare_full_enforcement_unless_they_say_otherwise() {
        let fleet = "# two\n[[node]]\nid = \"a\"\n\n[[node]]\nid = \"b\"\nisolation = \"none\"\n";
        assert_eq!(
            enforcing(fleet),
            "# two\n[[node]]\nisolation = \"container\"\ngpu_sharing = \"hami-core\"\nid = \"a\"\n\n\
             [[node]]\ngpu_sharing = \"hami-core\"\nid = \"b\"\nisolation = \"none\"\n"
        );
    }
}
