//! The agent's GPU side: which backend it reads, what it makes of the
//! readings (health transitions, faults charged to leases, usage, idle
//! leases, self-tests) and the events and metrics that come of them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use lh_bus::{Bus, Expect};
use lh_events::{
    derived_id, subject, Actor, Envelope, EventData, GpuHealth, GpuInfo, IdleAction, IdlePolicy,
    LeaseGpuFault, LeaseIdleDetected, LeaseStopRequested, NodeGpuHealthChanged, NodeGpuSelfTested,
    NodeRegistered,
};
use lh_telemetry::MetricsSection;
use uuid::Uuid;

use crate::backend::nvml::NvmlBackend;
use crate::backend::sim::SimBackend;
use crate::backend::{BackendError, GpuBackend, GpuDevice, GpuEvent, GpuSample};
use crate::gpu_watch::{self, Observation};
use crate::health::{HealthRules, NodeHealth, Outcome, Transition};
use crate::self_test::{Finished, SelfTests, Step};
use crate::usage::{self, NodeGpu, RunningLease};
use crate::NodeState;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The GPUs of the fleet file's node, with its fault script.
    Sim,
    /// The host's NVIDIA GPUs through NVML.
    Nvml,
}

#[derive(clap::Args, Debug, Clone)]
pub struct GpuArgs {
    /// Where the GPUs are read from.
    #[arg(long, env = "LH_GPU_BACKEND", value_enum, default_value_t = BackendKind::Sim)]
    pub gpu_backend: BackendKind,
    /// With `--gpu-backend nvml`: play the fleet file's node instead when
    /// the NVIDIA library or driver is missing (otherwise the agent exits).
    #[arg(long, env = "LH_SIM_FALLBACK")]
    pub sim_fallback: bool,
    /// This host's zone (NVML backend; a simulated node's is in the fleet file).
    #[arg(long, env = "LH_ZONE")]
    pub zone: Option<String>,
    /// This host's name as registered (NVML backend; default: the OS's).
    #[arg(long, env = "LH_HOSTNAME")]
    pub hostname: Option<String>,
    /// How often the GPUs are sampled, for health and usage.
    #[arg(long, env = "LH_SAMPLE_MS", default_value_t = 1_000)]
    pub sample_ms: u64,
    /// How often each lease's usage goes to the telemetry stream.
    #[arg(long, env = "LH_USAGE_INTERVAL_SECS", default_value_t = 5)]
    pub usage_interval_secs: u64,
    /// At or above this temperature (°C) for the window, a GPU is degraded.
    #[arg(long, env = "LH_DEGRADED_TEMPERATURE_C", default_value_t = 85)]
    pub degraded_temperature_c: u32,
    /// At or above this share of VRAM in use for the window, degraded.
    #[arg(long, env = "LH_DEGRADED_MEMORY_PCT", default_value_t = 95.0)]
    pub degraded_memory_pct: f64,
    /// How long hot or full must last to degrade a GPU.
    #[arg(long, env = "LH_DEGRADED_WINDOW_SECS", default_value_t = 30)]
    pub degraded_window_secs: u64,
    /// Clean samples in a row that bring a GPU back to healthy.
    #[arg(long, env = "LH_RECOVER_AFTER_CLEAN_SAMPLES", default_value_t = 30)]
    pub recover_after_clean_samples: u32,
    /// Zero utilisation this long makes a lease idle, for tenants without
    /// an idle policy of their own.
    #[arg(long, env = "LH_IDLE_WINDOW_SECS", default_value_t = 300)]
    pub idle_window_secs: u64,
    /// What happens to an idle lease of such a tenant: notify, stop or
    /// suspend.
    #[arg(long, env = "LH_IDLE_ACTION", default_value = "notify", value_parser = parse_idle_action)]
    pub idle_action: IdleAction,
    /// A free GPU is self-tested this often (0: never).
    #[arg(long, env = "LH_SELF_TEST_EVERY_SECS", default_value_t = 7_200)]
    pub self_test_every_secs: u64,
    /// How long one self-test lasts.
    #[arg(long, env = "LH_SELF_TEST_SECS", default_value_t = 600)]
    pub self_test_secs: u64,
    /// A load test run on the GPU under test (`sh -c`, with
    /// CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES set to its UUID,
    /// LH_GPU_INDEX and LH_SELF_TEST_SECS), e.g. `dcgmi diag -r 3 -i
    /// $LH_GPU_INDEX`; the test passes only when it exits 0. Without one a
    /// self-test watches the idle GPU for the duration.
    #[arg(long, env = "LH_SELF_TEST_COMMAND")]
    pub self_test_command: Option<String>,
}

fn parse_idle_action(text: &str) -> Result<IdleAction, String> {
    match text {
        "notify" => Ok(IdleAction::Notify),
        "stop" => Ok(IdleAction::Stop),
        "suspend" => Ok(IdleAction::Suspend),
        other => Err(format!(
            "idle action must be notify, stop or suspend, not {other:?}"
        )),
    }
}

impl GpuArgs {
    pub fn for_test() -> Self {
        Self {
            gpu_backend: BackendKind::Sim,
            sim_fallback: false,
            zone: None,
            hostname: None,
            sample_ms: 200,
            usage_interval_secs: 1,
            degraded_temperature_c: 85,
            degraded_memory_pct: 95.0,
            degraded_window_secs: 30,
            recover_after_clean_samples: 30,
            idle_window_secs: 300,
            idle_action: IdleAction::Notify,
            self_test_every_secs: 0,
            self_test_secs: 600,
            self_test_command: None,
        }
    }

    pub fn rules(&self) -> HealthRules {
        HealthRules {
            degraded_temperature_c: self.degraded_temperature_c,
            degraded_memory_pct: self.degraded_memory_pct,
            degraded_window: Duration::from_secs(self.degraded_window_secs),
            recover_after_clean_samples: self.recover_after_clean_samples,
            ..HealthRules::default()
        }
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.rules().validate().map_err(anyhow::Error::msg)?;
        if self.sample_ms == 0 {
            anyhow::bail!("--sample-ms must be at least 1");
        }
        if self.idle_window_secs == 0 {
            anyhow::bail!("--idle-window-secs must be at least 1");
        }
        if self.self_test_every_secs > 0 && self.self_test_secs == 0 {
            anyhow::bail!("--self-test-secs must be at least 1");
        }
        const YEAR: u64 = 366 * 24 * 3600;
        if self.self_test_every_secs > YEAR || self.self_test_secs > YEAR {
            anyhow::bail!("--self-test-every-secs and --self-test-secs must be at most a year");
        }
        if self.idle_window_secs > YEAR {
            anyhow::bail!("--idle-window-secs must be at most a year");
        }
        Ok(())
    }
}

/// The backend the arguments ask for, and the inventory to register.
pub fn open(
    args: &GpuArgs,
    fleet_file: &Path,
    node_id: &str,
) -> anyhow::Result<(Arc<dyn GpuBackend>, NodeRegistered)> {
    if args.gpu_backend == BackendKind::Nvml {
        match NvmlBackend::new() {
            Ok(nvml) => {
                let zone = args
                    .zone
                    .clone()
                    .context("--zone (LH_ZONE) is needed with --gpu-backend nvml")?;
                let hostname = args.hostname.clone().unwrap_or_else(os_hostname);
                let devices = nvml.inventory()?;
                let inventory = nvml_inventory(node_id, &zone, &hostname, &devices);
                tracing::info!(gpus = devices.len(), "NVML backend");
                return Ok((Arc::new(nvml), inventory));
            }
            Err(e @ (BackendError::LibraryMissing { .. } | BackendError::DriverNotLoaded))
                if args.sim_fallback =>
            {
                tracing::warn!(error = %e, "falling back to the simulated backend (--sim-fallback)");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let fleet = crate::fleet_file::FleetFile::load(fleet_file)?;
    let node = fleet.node(node_id, fleet_file)?;
    let backend = SimBackend::for_node(node, fleet_file)?;
    Ok((Arc::new(backend), node.inventory()))
}

fn os_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The node as NVML sees it, with the models named as the catalogue names
/// them (`A100-40GB`), so price books and requests match real hosts.
pub fn nvml_inventory(
    node_id: &str,
    zone: &str,
    hostname: &str,
    devices: &[GpuDevice],
) -> NodeRegistered {
    NodeRegistered {
        node_id: node_id.to_string(),
        zone: zone.to_string(),
        hostname: hostname.to_string(),
        gpus: devices
            .iter()
            .map(|d| {
                let model = catalogue_model(&d.model, d.vram_mib);
                // The catalogue's VRAM, which prices and requests use: the
                // driver reports a little less (an H200 reads 140.4 GiB).
                let vram_gb = lh_domain::catalog::vram_gb(&model)
                    .unwrap_or_else(|| (d.vram_mib as f64 / 1024.0).round() as u32);
                GpuInfo {
                    index: d.index,
                    uuid: d.uuid.clone(),
                    model,
                    vram_gb,
                    mig: d.mig_enabled,
                }
            })
            .collect(),
    }
}

/// `NVIDIA A100-SXM4-40GB` → `A100-40GB`; a GPU the catalogue lacks keeps
/// its name with spaces as dashes (it registers, but nothing prices it).
pub fn catalogue_model(name: &str, vram_mib: u64) -> String {
    let upper = name.to_ascii_uppercase();
    let gb = (vram_mib as f64 / 1024.0).round() as u64;
    let known = if upper.contains("H200") {
        Some("H200-141GB")
    } else if upper.contains("H100") && gb <= 85 {
        // An H100 NVL (94 GB) is another product: it keeps its own name.
        Some("H100-80GB")
    } else if upper.contains("A100") && gb > 60 {
        Some("A100-80GB")
    } else if upper.contains("A100") {
        Some("A100-40GB")
    } else if upper.contains("A10G") {
        Some("A10G-24GB")
    } else if upper.contains("A30") {
        Some("A30-24GB")
    } else if upper.contains("L40S") {
        Some("L40S-48GB")
    } else if upper.contains("L4") && !upper.contains("L40") {
        Some("L4-24GB")
    } else if upper.contains("4090") {
        Some("RTX4090-24GB")
    } else {
        None
    };
    match known {
        Some(m) => m.to_string(),
        None => name.trim().trim_start_matches("NVIDIA ").replace(' ', "-"),
    }
}

/// What the agent knows and does about its GPUs between events.
pub struct GpuSide {
    backend: Arc<dyn GpuBackend>,
    period: Duration,
    health: NodeHealth,
    seeded: bool,
    stopped: bool,
    gpus: Vec<NodeGpu>,
    hostname: String,
    section: MetricsSection,
    usage_every: Duration,
    last_usage: Option<DateTime<Utc>>,
    idle_default: IdlePolicy,
    self_tests: Option<SelfTests>,
    self_test_command: Option<String>,
    self_test_secs: u64,
    /// The last transition of each GPU and when it was last sent, to send
    /// again until the log shows it (a publish that failed must not leave
    /// the scheduler placing on a GPU it thinks healthy).
    last_transition: BTreeMap<u32, (Transition, std::time::Instant)>,
    /// Load commands of the self-tests running now, by GPU.
    loads: BTreeMap<u32, std::process::Child>,
    busy: BTreeSet<u32>,
}

impl Drop for GpuSide {
    fn drop(&mut self) {
        for (_, mut child) in std::mem::take(&mut self.loads) {
            kill_load(&mut child);
        }
    }
}

impl GpuSide {
    pub fn new(
        args: &GpuArgs,
        backend: Arc<dyn GpuBackend>,
        inventory: &NodeRegistered,
        section: MetricsSection,
    ) -> Self {
        let rules = args.rules();
        let indices: Vec<u32> = inventory.gpus.iter().map(|g| g.index).collect();
        let self_tests = (args.self_test_every_secs > 0).then(|| {
            let tests = SelfTests::new(
                indices.iter().copied(),
                Duration::from_secs(args.self_test_every_secs),
                Duration::from_secs(args.self_test_secs),
                rules.clone(),
                Utc::now(),
            );
            match args.self_test_command {
                Some(_) => tests.with_command(),
                None => tests,
            }
        });
        Self {
            backend,
            period: Duration::from_millis(args.sample_ms),
            health: NodeHealth::new(indices, rules),
            seeded: false,
            stopped: false,
            gpus: inventory
                .gpus
                .iter()
                .map(|g| NodeGpu {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    model: g.model.clone(),
                })
                .collect(),
            hostname: inventory.hostname.clone(),
            section,
            usage_every: Duration::from_secs(args.usage_interval_secs),
            last_usage: None,
            idle_default: IdlePolicy {
                window_s: args.idle_window_secs,
                action: args.idle_action,
            },
            self_tests,
            self_test_command: args.self_test_command.clone(),
            self_test_secs: args.self_test_secs,
            loads: BTreeMap::new(),
            last_transition: BTreeMap::new(),
            busy: BTreeSet::new(),
        }
    }

    /// Starts reading the backend.
    pub fn watch(&self) -> tokio::sync::mpsc::Receiver<Observation> {
        gpu_watch::spawn(self.backend.clone(), self.period)
    }

    pub fn seeded(&self) -> bool {
        self.seeded
    }

    /// Takes the log's health of each GPU, once, before the first judgement.
    pub fn seed(&mut self, recorded: &BTreeMap<u32, GpuHealth>) {
        if std::mem::replace(&mut self.seeded, true) {
            return;
        }
        for (&index, &health) in recorded {
            self.health.assume(index, health);
        }
    }

    /// The host does not answer: no heartbeats, nothing published.
    pub fn node_stopped(&self) -> bool {
        self.stopped
    }

    /// Tells the backend which GPUs leases hold (the simulated one plays a
    /// load on them).
    pub(crate) fn set_busy(&mut self, state: &NodeState) {
        let busy: BTreeSet<u32> = state
            .running_here()
            .flat_map(|(_, l)| l.gpus.iter().map(|g| g.index))
            .collect();
        if busy != self.busy {
            self.backend.set_busy(&busy);
            self.busy = busy;
        }
    }

    /// Acts on one observation. True when the node's state may call for
    /// the agent to act (it came back).
    pub(crate) async fn observe(
        &mut self,
        bus: &Bus,
        node_id: &str,
        state: &mut NodeState,
        observation: Observation,
    ) -> bool {
        match observation {
            Observation::Events(events) => {
                for event in &events {
                    self.fault(bus, node_id, state, event).await;
                }
                false
            }
            Observation::Samples { at, samples } => {
                self.samples(bus, node_id, state, &samples, at).await
            }
            Observation::NodeStopped => {
                tracing::warn!(node = node_id, "the host stopped answering: going silent");
                self.stopped = true;
                // No readings: no series, rather than the last ones forever.
                self.section.set(String::new());
                false
            }
            Observation::NodeBack => {
                tracing::info!(node = node_id, "the host answers again");
                self.stopped = false;
                true
            }
            Observation::Failed(why) => {
                tracing::warn!(node = node_id, error = %why, "GPU backend call failed");
                false
            }
        }
    }

    async fn fault(&mut self, bus: &Bus, node_id: &str, state: &NodeState, event: &GpuEvent) {
        // An application XID is charged to the lease on the GPU; on a GPU
        // that several leases share, the driver's event does not say whose.
        let holders: Vec<Uuid> = state
            .running_here()
            .filter(|(_, l)| l.gpus.iter().any(|g| g.index == event.index))
            .map(|(id, _)| *id)
            .collect();
        let lease = match holders.as_slice() {
            [one] => Some(*one),
            _ => None,
        };
        match self.health.fault(event, lease, event.at) {
            Outcome::Transition(t) => self.publish_transition(bus, node_id, &t).await,
            Outcome::ChargedToLease {
                lease_id,
                gpu_index,
                xid,
                at,
            } => {
                let tenant_id = state.leases.get(&lease_id).and_then(|l| l.tenant_id);
                let id = derived_id(&[
                    "lease.gpu_fault",
                    &lease_id.to_string(),
                    &gpu_index.to_string(),
                    &xid.to_string(),
                    &at.to_rfc3339(),
                ]);
                let data = EventData::LeaseGpuFault(LeaseGpuFault {
                    lease_id,
                    node_id: node_id.to_string(),
                    gpu_index,
                    xid,
                    at,
                });
                tracing::info!(lease = %lease_id, gpu = gpu_index, xid, "application XID charged to the lease");
                publish(bus, node_id, id, data, tenant_id).await;
            }
            Outcome::Ignored { gpu_index, reason } => {
                let reason = if holders.len() > 1 {
                    format!("{reason}; the GPU is shared by {} leases", holders.len())
                } else {
                    reason
                };
                tracing::info!(gpu = gpu_index, %reason, "GPU event ignored");
            }
            Outcome::AlreadyUnhealthy { gpu_index, reason } => {
                tracing::info!(gpu = gpu_index, %reason, "fault on a GPU already unhealthy");
            }
        }
    }

    async fn samples(
        &mut self,
        bus: &Bus,
        node_id: &str,
        state: &mut NodeState,
        samples: &[GpuSample],
        at: DateTime<Utc>,
    ) -> bool {
        for t in self.health.observe(samples, at) {
            self.publish_transition(bus, node_id, &t).await;
        }
        self.resend_unrecorded(bus, node_id, state).await;
        let running: Vec<RunningLease> = state
            .running_here()
            .map(|(id, l)| RunningLease {
                lease_id: *id,
                tenant_id: l.tenant_id,
                gpus: l.gpus.clone(),
            })
            .collect();
        let leases_usage = usage::attribute(node_id, &running, samples, at);
        self.section.set(usage::render_dcgm(
            &self.hostname,
            &self.gpus,
            samples,
            &leases_usage,
        ));
        let due = self
            .last_usage
            .is_none_or(|last| (at - last).to_std().unwrap_or_default() >= self.usage_every);
        if due {
            self.last_usage = Some(at);
            for u in &leases_usage {
                match serde_json::to_vec(u) {
                    Ok(payload) => {
                        if let Err(e) = bus
                            .publish_telemetry(subject::usage(u.lease_id), payload)
                            .await
                        {
                            tracing::warn!(error = %e, "usage sample not sent");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "usage sample does not serialise"),
                }
            }
        }
        let mut suspend = false;
        for u in &leases_usage {
            suspend |= self.idle(bus, node_id, state, u, at).await;
        }
        let held: BTreeSet<u32> = state
            .holding()
            .flat_map(|(_, l)| l.gpus.iter().map(|g| g.index))
            .collect();
        let free: BTreeSet<u32> = self
            .gpus
            .iter()
            .map(|g| g.index)
            .filter(|i| !held.contains(i))
            .collect();
        let finished = self.run_self_tests(samples, &free, at);
        for f in finished {
            let id = derived_id(&[
                "node.gpu_self_tested",
                node_id,
                &f.gpu_index.to_string(),
                &f.at.to_rfc3339(),
            ]);
            tracing::info!(gpu = f.gpu_index, passed = f.passed, detail = %f.detail, "self-test finished");
            let data = EventData::NodeGpuSelfTested(NodeGpuSelfTested {
                node_id: node_id.to_string(),
                gpu_index: f.gpu_index,
                passed: f.passed,
                duration_s: f.duration.as_secs_f64(),
                detail: f.detail.clone(),
                at: f.at,
            });
            publish(bus, node_id, id, data, None).await;
            if let Some(t) = self.health.self_test(f.gpu_index, f.passed, f.at) {
                self.publish_transition(bus, node_id, &t).await;
            }
        }
        suspend
    }

    /// Advances the self-tests one round: starts and stops their load
    /// commands and collects the tests that ended.
    fn run_self_tests(
        &mut self,
        samples: &[GpuSample],
        free: &BTreeSet<u32>,
        at: DateTime<Utc>,
    ) -> Vec<Finished> {
        let Some(tests) = &mut self.self_tests else {
            return Vec::new();
        };
        let mut finished = Vec::new();
        for step in tests.observe(samples, free, at) {
            match step {
                Step::Started(gpu) => {
                    let Some(command) = &self.self_test_command else {
                        continue;
                    };
                    let Some(device) = self.gpus.iter().find(|g| g.index == gpu) else {
                        continue;
                    };
                    match spawn_load(command, device, self.self_test_secs) {
                        Ok(child) => {
                            self.loads.insert(gpu, child);
                        }
                        Err(e) => finished.extend(tests.command_exited(
                            gpu,
                            false,
                            format!("the load command does not start: {e}"),
                            at,
                        )),
                    }
                }
                Step::Aborted(gpu) => {
                    if let Some(mut child) = self.loads.remove(&gpu) {
                        kill_load(&mut child);
                    }
                }
                Step::Finished(f) => {
                    if let Some(mut child) = self.loads.remove(&f.gpu_index) {
                        kill_load(&mut child);
                    }
                    finished.push(f);
                }
            }
        }
        let exited: Vec<(u32, std::process::ExitStatus)> = self
            .loads
            .iter_mut()
            .filter_map(|(gpu, child)| child.try_wait().ok().flatten().map(|s| (*gpu, s)))
            .collect();
        for (gpu, status) in exited {
            self.loads.remove(&gpu);
            let detail = format!("the load command ended with {status}");
            finished.extend(tests.command_exited(gpu, status.success(), detail, at));
        }
        finished
    }

    async fn idle(
        &self,
        bus: &Bus,
        node_id: &str,
        state: &mut NodeState,
        usage: &lh_events::telemetry::LeaseUsage,
        at: DateTime<Utc>,
    ) -> bool {
        let policies = &state.idle_policies;
        let Some(lease) = state.leases.get_mut(&usage.lease_id) else {
            return false;
        };
        // NVML reads no utilisation on a GPU in MIG mode: a MIG lease would
        // always look idle, so it is not judged.
        if lease.gpus.iter().any(|g| g.mig_instance.is_some())
            || lease.stop_requested
            || lease.suspend_requested
        {
            return false;
        }
        let policy = lease
            .tenant_id
            .and_then(|t| policies.get(&t).copied())
            .unwrap_or(self.idle_default);
        let window = Duration::from_secs(policy.window_s);
        let Some(idle_since) = lease.idle.observe(usage, window, at) else {
            return false;
        };
        let lease_id = usage.lease_id;
        tracing::info!(lease = %lease_id, %idle_since, action = policy.action.as_str(), "lease idle");
        let id = derived_id(&[
            "lease.idle_detected",
            &lease_id.to_string(),
            &idle_since.to_rfc3339(),
        ]);
        let data = EventData::LeaseIdleDetected(LeaseIdleDetected {
            lease_id,
            node_id: node_id.to_string(),
            idle_since,
            window_s: policy.window_s,
            action: policy.action,
            at,
        });
        let tenant_id = lease.tenant_id;
        // Under `suspend` the loop stops the workload and reports it.
        lease.suspend_requested = policy.action == IdleAction::Suspend;
        publish(bus, node_id, id, data, tenant_id).await;
        if policy.action == IdleAction::Stop {
            // The same id as a tenant's stop: one stop, whoever asks first.
            let id = derived_id(&["lease.stop_requested", &lease_id.to_string()]);
            let data = EventData::LeaseStopRequested(LeaseStopRequested { lease_id });
            publish(bus, node_id, id, data, tenant_id).await;
        }
        policy.action == IdleAction::Suspend
    }

    /// Sends again, with the same id, a transition the log does not show
    /// after a while.
    async fn resend_unrecorded(&mut self, bus: &Bus, node_id: &str, state: &NodeState) {
        const RESEND_AFTER: Duration = Duration::from_secs(5);
        let due: Vec<Transition> = self
            .last_transition
            .values()
            .filter(|(t, sent)| {
                let recorded = state.gpu_health.get(&t.gpu_index).copied();
                recorded != Some(t.to) && sent.elapsed() >= RESEND_AFTER
            })
            .map(|(t, _)| t.clone())
            .collect();
        for t in due {
            tracing::info!(gpu = t.gpu_index, to = ?t.to, "health change not on the log yet: sending it again");
            self.publish_transition(bus, node_id, &t).await;
        }
    }

    async fn publish_transition(&mut self, bus: &Bus, node_id: &str, t: &Transition) {
        self.last_transition
            .insert(t.gpu_index, (t.clone(), std::time::Instant::now()));
        let gpu_uuid = self
            .gpus
            .iter()
            .find(|g| g.index == t.gpu_index)
            .map(|g| g.uuid.clone())
            .unwrap_or_default();
        tracing::info!(gpu = t.gpu_index, from = ?t.from, to = ?t.to, reason = %t.reason, "GPU health changed");
        metrics::counter!("lh_node_gpu_health_transitions_total", "to" => format!("{:?}", t.to).to_lowercase())
            .increment(1);
        let id = derived_id(&[
            "node.gpu_health_changed",
            node_id,
            &t.gpu_index.to_string(),
            &format!("{:?}", t.to),
            &t.at.to_rfc3339(),
        ]);
        let data = EventData::NodeGpuHealthChanged(NodeGpuHealthChanged {
            node_id: node_id.to_string(),
            gpu_index: t.gpu_index,
            gpu_uuid,
            from: t.from,
            to: t.to,
            reason: t.reason.clone(),
            evidence: t.evidence.clone(),
            at: t.at,
        });
        publish(bus, node_id, id, data, None).await;
    }
}

/// Starts a self-test's load command on one GPU, in its own process group
/// so that whatever it starts dies with it.
fn spawn_load(command: &str, gpu: &NodeGpu, secs: u64) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt as _;
    use std::process::Stdio;
    std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("CUDA_VISIBLE_DEVICES", &gpu.uuid)
        .env("NVIDIA_VISIBLE_DEVICES", &gpu.uuid)
        .env("LH_GPU_INDEX", gpu.index.to_string())
        .env("LH_SELF_TEST_SECS", secs.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
}

fn kill_load(child: &mut std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) with a negative pid signals that process group; the
        // group is the child's own (process_group(0)), so nothing else is hit.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.wait();
}

/// Appends one of the agent's observations; a failure is logged, not fatal
/// (the next observation says the same again, or the GPU's state moved on).
async fn publish(bus: &Bus, node_id: &str, id: Uuid, data: EventData, tenant: Option<Uuid>) {
    let mut envelope =
        Envelope::new(Actor::Node(node_id.to_string()), Utc::now(), data).with_id(id);
    envelope.tenant_id = tenant;
    if let Err(e) = bus.publish(&envelope, Expect::Any).await {
        tracing::warn!(error = %e, event = envelope.data.event_type(), "cannot publish");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_names_map_to_the_catalogue() {
        assert_eq!(
            catalogue_model("NVIDIA A100-SXM4-40GB", 40_960),
            "A100-40GB"
        );
        assert_eq!(
            catalogue_model("NVIDIA A100 80GB PCIe", 81_920),
            "A100-80GB"
        );
        assert_eq!(
            catalogue_model("NVIDIA H100 80GB HBM3", 81_559),
            "H100-80GB"
        );
        assert_eq!(catalogue_model("NVIDIA H200", 143_771), "H200-141GB");
        assert_eq!(catalogue_model("NVIDIA A10G", 23_028), "A10G-24GB");
        assert_eq!(catalogue_model("NVIDIA L40S", 46_068), "L40S-48GB");
        assert_eq!(catalogue_model("NVIDIA H100 NVL", 95_830), "H100-NVL");
        assert_eq!(catalogue_model("NVIDIA B200", 183_359), "B200");
    }

    #[test]
    fn nvml_inventory_rounds_vram_and_keeps_mig_mode() {
        let d = GpuDevice {
            index: 3,
            uuid: "GPU-x".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            vram_mib: 81_559,
            mig_enabled: true,
            mig_devices: Vec::new(),
            nvlink_peers: Vec::new(),
            numa_node: None,
        };
        let h200 = GpuDevice {
            model: "NVIDIA H200".into(),
            vram_mib: 143_771,
            ..d.clone()
        };
        let inv = nvml_inventory("n", "z", "h", &[d, h200]);
        assert_eq!(inv.gpus[0].vram_gb, 80);
        assert_eq!(
            (inv.gpus[1].model.as_str(), inv.gpus[1].vram_gb),
            ("H200-141GB", 141)
        );
        assert!(inv.gpus[0].mig);
        assert_eq!(inv.gpus[0].model, "H100-80GB");
    }

    #[test]
    fn without_nvml_the_agent_refuses_unless_told_to_fall_back() {
        if NvmlBackend::new().is_ok() {
            eprintln!("NVML is here: nothing to fall back from");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let fleet = dir.path().join("fleet.toml");
        std::fs::write(
            &fleet,
            "[[node]]\nid = \"n\"\nzone = \"z\"\nhostname = \"h\"\ngpu_model = \"A100-40GB\"\ngpu_count = 2\nvram_gb = 40\n",
        )
        .unwrap();
        let mut args = GpuArgs::for_test();
        args.gpu_backend = BackendKind::Nvml;
        let err = open(&args, &fleet, "n")
            .err()
            .expect("no NVML, no fallback");
        let line = format!("{err:#}");
        assert!(
            line.contains("libnvidia-ml.so.1") && !line.contains('\n'),
            "{line}"
        );
        args.sim_fallback = true;
        let (backend, inventory) = open(&args, &fleet, "n").unwrap();
        assert_eq!(backend.name(), "sim");
        assert_eq!(inventory.gpus.len(), 2);
    }

    #[test]
    fn idle_actions_parse() {
        assert_eq!(parse_idle_action("stop"), Ok(IdleAction::Stop));
        assert_eq!(parse_idle_action("suspend"), Ok(IdleAction::Suspend));
        assert!(parse_idle_action("hibernate").is_err());
    }
}
