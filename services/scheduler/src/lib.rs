//! Scheduler: places leases on GPUs, queues what does not fit, enforces
//! quotas.
//!
//! It rebuilds its state from the log at start (an ordered feed from
//! sequence 1) and then follows live. Whenever it is caught up it asks the
//! pure [`state::State::decide`] what to do and appends each decision as
//! one atomic batch with an expected-last-subject-sequence on every
//! aggregate it touches. Replicas run active-active: the loser of a race
//! gets a conflict, waits for the winner's events to arrive and decides
//! again. No leader election is needed for safety.

pub mod node_view;
pub mod planner;
pub mod state;

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};
use lh_bus::Bus;
use lh_events::telemetry::Heartbeat;
use lh_events::{subject, Envelope, EventData};
use lh_service::clock::{Clock, SystemClock};
use lh_service::decider::{self, Batch, Decider, Pace};
use lh_service::restate::Family;
use lh_service::{CancellationToken, CommonArgs, Running};

pub use state::State;

pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9101";

/// Metrics this service records, with their `# HELP` text.
pub const METRICS: &[lh_service::MetricHelp] = &[
    (
        "lh_heartbeats_refused_total",
        "Heartbeats refused because their payload named another node than their subject.",
    ),
    (
        "lh_scheduler_node_view_waiting_events",
        "Events waiting to be relayed to nodes' views; it stays high while the log cannot be written.",
    ),
    (
        "lh_scheduler_node_view_relays_total",
        "Relays this replica wrote to nodes' views.",
    ),
    (
        "lh_scheduler_waiting_leases",
        "Leases waiting for GPUs (requested, queued or back in the queue).",
    ),
    (
        "lh_scheduler_decisions_total",
        "Decision events this replica appended, by event type.",
    ),
    (
        "lh_scheduler_placements_total",
        "Leases this replica placed on GPUs (one per lease in each allocation).",
    ),
    (
        "lh_scheduler_queue_wait_seconds",
        "Seconds from a lease's request (or resume) until the log stored its start, for starts heard since this replica started.",
    ),
    (
        "lh_scheduler_decision_pass_seconds",
        "Seconds one decision pass took to decide (liveness, migrations and the queue), without appending.",
    ),
    (
        "lh_scheduler_fragmented_gpu_milli",
        "Idle milli-GPU on schedulable nodes that no waiting lease fits (model and size; all idle milli when nothing waits).",
    ),
    (
        "lh_scheduler_lost_nodes",
        "Nodes the scheduler holds lost (silent past the liveness window); their leases are moved.",
    ),
    (
        "lh_tenant_lease_seconds_total",
        "Lease-seconds the tenant's started leases should have run (from the first start to the end or a suspension), since the log began.",
    ),
    (
        "lh_tenant_interrupted_lease_seconds_total",
        "Of lh_tenant_lease_seconds_total, lease-seconds the platform had the tenant's leases interrupted (moved off a lost, drained or unhealthy node until they ran again).",
    ),
    (
        "lh_spot_leases_requested_total",
        "Spot leases requested, since the log began.",
    ),
    (
        "lh_spot_leases_accepted_total",
        "Spot leases placed at least once, since the log began.",
    ),
    (
        "lh_spot_leases_ended_total",
        "Spot leases that ended, since the log began, by outcome (succeeded: ran to its own end or to a notice's deadline; failed: failed, or evicted without a notice).",
    ),
    (
        "lh_spot_preemptions_total",
        "Preemption notices to spot leases, since the log began, by reason.",
    ),
    (
        "lh_spot_acceptance_ratio",
        "Accepted over requested spot leases, since the log began.",
    ),
    (
        "lh_spot_success_ratio",
        "Succeeded over ended spot leases, since the log began.",
    ),
];

/// How often waiting leases are looked at even when nothing arrives.
pub const REEVALUATE_INTERVAL: Duration = Duration::from_secs(1);
/// A feed silent this long has delivered everything there is.
const QUIET: Duration = Duration::from_millis(100);

#[derive(clap::Parser, Debug, Clone)]
#[command(name = "lh-scheduler", about = "Leasehold scheduler")]
pub struct Config {
    #[command(flatten)]
    pub common: CommonArgs,
    /// A spot lease younger than this is never preempted.
    #[arg(long, env = "LH_PREEMPTION_MIN_RUNTIME_SECS", default_value_t = 600)]
    pub preemption_min_runtime_secs: i64,
    /// Notice a preempted spot lease gets before the node-agent ends it.
    #[arg(long, env = "LH_PREEMPTION_NOTICE_SECS", default_value_t = 120)]
    pub preemption_notice_secs: i64,
    /// A lease waiting longer than this stops smaller ones from backfilling
    /// around it.
    #[arg(long, env = "LH_BACKFILL_STARVATION_SECS", default_value_t = 300)]
    pub backfill_starvation_secs: i64,
    /// A node-agent silent this long (no heartbeat) is lost: its leases are
    /// placed elsewhere. 0 turns node liveness off (nodes without agents,
    /// as in the lease-rate load test).
    #[arg(long, env = "LH_NODE_LOST_AFTER_MS", default_value_t = 3_000)]
    pub node_lost_after_ms: u64,
    /// While the whole fleet (two nodes or more) is silent, the scheduler
    /// takes it that it cannot hear (NATS is down or restarting) and
    /// declares no node lost, up to this many seconds.
    #[arg(long, env = "LH_FLEET_SILENCE_GRACE_SECS", default_value_t = 60)]
    pub fleet_silence_grace_secs: i64,
    /// How far, in seconds, a node's clock may be from the log's: the times
    /// a node writes are held to within this of when the log stored them,
    /// and a heartbeat's own time to within this of its arrival.
    #[arg(long, env = "LH_NODE_CLOCK_SKEW_SECS", default_value_t = lh_events::node_time::DEFAULT_NODE_CLOCK_SKEW_SECS)]
    pub node_clock_skew_secs: i64,
}

impl Config {
    pub fn for_test(nats_url: &str) -> Self {
        Self {
            common: CommonArgs::for_test(nats_url),
            preemption_min_runtime_secs: 600,
            preemption_notice_secs: 120,
            backfill_starvation_secs: 300,
            node_lost_after_ms: 3_000,
            fleet_silence_grace_secs: 60,
            node_clock_skew_secs: lh_events::node_time::DEFAULT_NODE_CLOCK_SKEW_SECS,
        }
    }

    pub fn rules(&self) -> state::Rules {
        state::Rules {
            preemption_min_runtime: chrono::Duration::seconds(self.preemption_min_runtime_secs),
            preemption_notice: chrono::Duration::seconds(self.preemption_notice_secs),
            backfill_starvation: chrono::Duration::seconds(self.backfill_starvation_secs),
            node_lost_after: chrono::Duration::milliseconds(self.node_lost_after_ms as i64),
            fleet_silence_grace: chrono::Duration::seconds(self.fleet_silence_grace_secs),
            node_clock_skew: chrono::Duration::seconds(self.node_clock_skew_secs),
        }
    }
}

impl lh_service::Service for Config {
    const NAME: &'static str = "lh-scheduler";

    async fn start(self, shutdown: CancellationToken) -> anyhow::Result<Running> {
        start(self, shutdown).await
    }
}

pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    lh_service::describe_metrics(METRICS);
    let bus = config.common.connect_bus(state::SERVICE).await?;
    lh_service::restate::spawn(
        &bus,
        &config.common,
        state::SERVICE,
        &[Family::Lease, Family::Node],
        shutdown.clone(),
    )?;
    tokio::spawn(node_view::run(
        bus.clone(),
        config.rules().node_clock_skew,
        shutdown.clone(),
    ));
    // Subscribed before reading the log, so no heartbeat falls in between.
    let live = bus.subscribe_telemetry(subject::HEARTBEATS_ALL).await?;
    let signals = signals(bus.clone(), live);
    let scheduling = Scheduling::new(config.rules(), SystemClock.now());
    tokio::spawn(answer_fleet(
        bus.clone(),
        scheduling.fleet_board(),
        shutdown.clone(),
    ));
    decider::serve(
        config.common.http_addr_or(DEFAULT_HTTP_ADDR),
        bus,
        scheduling,
        signals,
        shutdown,
    )
    .await
}

/// Answers fleet requests from `board` until `shutdown`.
async fn answer_fleet(bus: Bus, board: FleetBoard, shutdown: CancellationToken) {
    let serving = lh_bus::rpc::serve(
        &bus,
        subject::RPC_SCHEDULER_FLEET,
        state::SERVICE,
        |request: lh_rpc::fleet::FleetRequest| {
            let board = board.clone();
            async move {
                let board = board.read().map_err(|_| "the fleet view is unreadable")?;
                let mut view = board.clone();
                if let Some(node_id) = &request.node_id {
                    view.nodes.retain(|n| &n.id == node_id);
                }
                Ok::<_, String>(view)
            }
        },
    );
    tokio::select! {
        _ = shutdown.cancelled() => {}
        result = serving => {
            if let Err(e) = result {
                tracing::error!(error = %e, "fleet requests are not answered");
            }
        }
    }
}

/// How often node silence is checked (the liveness window is 3 s by
/// default; this keeps the detection within a fifth of a second of it).
const LIVENESS_CHECK: Duration = Duration::from_millis(200);
/// Most nodes whose last heartbeat is read back at start.
const MAX_NODES_READ_BACK: usize = 100_000;

/// What the scheduler hears besides the log.
#[derive(Debug)]
pub enum Signal {
    /// A node's heartbeat, as it arrives.
    Heartbeat(Heartbeat),
    /// A node's last heartbeat still in the telemetry stream, read once the
    /// log is replayed: a node that died while no scheduler ran is judged
    /// by it.
    LastHeartbeat(Heartbeat),
    /// Time to look for nodes that fell silent or came back.
    LivenessCheck,
}

/// A heartbeat as sent on `subject`, when it is one and speaks for the
/// node whose subject it is on: the server lets each node publish only on
/// its own, so the subject, not the payload, says who is alive.
fn heartbeat_on(subject: &str, payload: &[u8]) -> Option<Heartbeat> {
    let heartbeat: Heartbeat = match serde_json::from_slice(payload) {
        Ok(heartbeat) => heartbeat,
        Err(e) => {
            tracing::debug!(error = %e, subject, "unreadable heartbeat");
            return None;
        }
    };
    if subject != lh_events::subject::heartbeat(&heartbeat.node_id) {
        metrics::counter!("lh_heartbeats_refused_total").increment(1);
        tracing::warn!(
            subject,
            node = heartbeat.node_id,
            "refusing a heartbeat that names another node than its subject's"
        );
        return None;
    }
    Some(heartbeat)
}

/// The last heartbeats (read only when first polled: the decide loop polls
/// signals once caught up), then live heartbeats and liveness checks.
fn signals(bus: Bus, live: lh_bus::async_nats::Subscriber) -> impl Stream<Item = Signal> {
    let last = futures::stream::once(async move {
        match bus
            .last_telemetry_each(subject::HEARTBEATS_ALL, MAX_NODES_READ_BACK)
            .await
        {
            Ok(samples) => samples,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the last heartbeats");
                Vec::new()
            }
        }
    })
    .flat_map(futures::stream::iter)
    .filter_map(|(subject, payload)| async move { heartbeat_on(&subject, &payload) })
    .map(Signal::LastHeartbeat);
    let live = live.filter_map(|message| async move {
        heartbeat_on(&message.subject, &message.payload).map(Signal::Heartbeat)
    });
    let checks =
        futures::stream::unfold(tokio::time::interval(LIVENESS_CHECK), |mut every| async {
            every.tick().await;
            Some((Signal::LivenessCheck, every))
        });
    last.chain(futures::stream::select(live, checks))
}

/// The scheduler on the decide loop: the pure [`State`], its rules, and
/// the placement engine each decision pass leaves for the next.
pub struct Scheduling {
    pub(crate) state: State,
    rules: state::Rules,
    engine: state::PlacementEngineCache,
    /// Starts the log stored before this are not timed: the replica (or
    /// the one before a restart) that heard them live already did, and a
    /// replay must not count them again.
    started: DateTime<Utc>,
    /// The lease-seconds last exported per tenant: a counter never goes
    /// back, even where node clocks disagree about an open interval.
    availability_exported: HashMap<uuid::Uuid, (u64, u64)>,
    availability_exported_at: Option<DateTime<Utc>>,
    fragmentation_exported_at: Option<DateTime<Utc>>,
    /// The fleet as requests are answered (`lh_rpc::fleet`), renewed at
    /// most every [`lh_rpc::fleet::FLEET_VIEW_EVERY_MS`] of the passes.
    fleet_board: FleetBoard,
    fleet_board_at: Option<DateTime<Utc>>,
    /// Each node's GPU readings from its last heartbeat: what the fleet
    /// view shows, never decided on (a node's word about itself).
    gpu_readings: HashMap<String, Vec<lh_events::telemetry::GpuReading>>,
}

/// Most nodes whose GPU readings are kept: past it, those of nodes the
/// fleet does not hold are dropped.
const MOST_NODES_READ: usize = 100_000;

/// The fleet view requests are answered from, shared with the task that
/// answers them.
pub type FleetBoard = std::sync::Arc<std::sync::RwLock<lh_rpc::fleet::FleetView>>;

/// How often the per-tenant lease-seconds are exported: every decision pass
/// would walk every tenant, and a scrape comes far less often.
const AVAILABILITY_EXPORT_EVERY_MS: i64 = 5_000;
/// How often the fragmented milli-GPU is measured: every decision pass would
/// walk every node and GPU of the fleet, and a scrape comes far less often.
const FRAGMENTATION_EXPORT_EVERY_MS: i64 = 1_000;

impl Scheduling {
    /// `now` starts the liveness clock of nodes never heard from.
    pub fn new(rules: state::Rules, now: DateTime<Utc>) -> Self {
        let mut state = State::default();
        if rules.node_lost_after > chrono::Duration::zero() {
            state.liveness_since = Some(now);
        }
        Self {
            state,
            rules,
            engine: state::PlacementEngineCache::default(),
            started: now,
            availability_exported: HashMap::new(),
            availability_exported_at: None,
            fragmentation_exported_at: None,
            fleet_board: FleetBoard::default(),
            fleet_board_at: None,
            gpu_readings: HashMap::new(),
        }
    }

    /// The view the fleet requests are answered from.
    pub fn fleet_board(&self) -> FleetBoard {
        self.fleet_board.clone()
    }

    /// Renews the fleet view when it is older than its period.
    fn renew_fleet_board(&mut self, now: DateTime<Utc>) {
        let due = self.fleet_board_at.is_none_or(|at| {
            now - at >= chrono::Duration::milliseconds(lh_rpc::fleet::FLEET_VIEW_EVERY_MS)
        });
        if !due {
            return;
        }
        let view = self.state.fleet_view(now, &self.gpu_readings);
        if let Ok(mut board) = self.fleet_board.write() {
            *board = view;
        }
        self.fleet_board_at = Some(now);
    }

    /// How long a lease waited to start, when `envelope` is its start
    /// arriving live (`None` for anything else, and for a start replayed
    /// from before this replica began). Measured on the log's clock (when
    /// it stored the start) from the request's own time, so node clocks do
    /// not enter it; read before the start is folded in.
    fn queue_wait(&self, stored_at: DateTime<Utc>, envelope: &Envelope) -> Option<Duration> {
        let EventData::LeaseStarted(started) = &envelope.data else {
            return None;
        };
        if stored_at < self.started {
            return None;
        }
        let since = self.state.leases.get(&started.lease_id)?.waiting_since?;
        Some((stored_at - since).to_std().unwrap_or_default())
    }
}

impl Decider for Scheduling {
    type Signal = Signal;

    fn name(&self) -> &'static str {
        state::SERVICE
    }

    fn filters(&self) -> &[&'static str] {
        &[
            subject::LEASES_ALL,
            subject::NODES_ALL,
            subject::TENANTS_ALL,
            // Spot leases are placed and outbid by the published price.
            subject::SPOT_ALL,
        ]
    }

    fn pace(&self) -> Pace {
        Pace {
            quiet: QUIET,
            tick: REEVALUATE_INTERVAL,
            ..Pace::default()
        }
    }

    fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        self.state.apply(sequence, envelope);
    }

    /// Times the queue wait by when the log stored a start; a node's
    /// times come held to that by the loop.
    fn apply_stored(&mut self, sequence: u64, stored_at: DateTime<Utc>, envelope: &Envelope) {
        if let Some(waited) = self.queue_wait(stored_at, envelope) {
            metrics::histogram!("lh_scheduler_queue_wait_seconds").record(waited.as_secs_f64());
        }
        self.state.apply(sequence, envelope);
    }

    /// A GPU's health change and a lease's start, end and suspension carry
    /// the node's own time, which dates a move's last billed instant and
    /// the lease-time counted for availability.
    fn node_clock_skew(&self) -> Option<chrono::Duration> {
        Some(self.rules.node_clock_skew)
    }

    fn signal(&mut self, signal: Signal, now: DateTime<Utc>) -> bool {
        // Heartbeats come every second: the view is renewed with them too,
        // not only at decision passes, which a quiet fleet seldom has.
        self.renew_fleet_board(now);
        match signal {
            Signal::Heartbeat(mut hb) => {
                self.state.heard_live(&hb.node_id, hb.at, now, &self.rules);
                hb.gpus.truncate(lh_events::telemetry::MOST_GPU_READINGS);
                if self.gpu_readings.len() >= MOST_NODES_READ {
                    let fleet = &self.state.fleet.nodes;
                    self.gpu_readings.retain(|node, _| fleet.contains_key(node));
                }
                if self.gpu_readings.len() < MOST_NODES_READ
                    || self.gpu_readings.contains_key(&hb.node_id)
                {
                    self.gpu_readings.insert(hb.node_id, hb.gpus);
                }
                false
            }
            Signal::LastHeartbeat(hb) => {
                // Read back, not heard: its own time is all there is, but
                // never later than now.
                let at = hb.at.min(now);
                self.state.heard(&hb.node_id, at, at);
                false
            }
            Signal::LivenessCheck => !self.state.liveness_changes(now, &self.rules).is_empty(),
        }
    }

    fn snapshot(&self) -> Option<Box<serde_json::value::RawValue>> {
        lh_service::decider::snapshot_of(&self.state.snapshot())
    }

    fn restore(&mut self, state: &serde_json::value::RawValue) -> bool {
        let restored =
            lh_service::decider::restored(state).is_some_and(|state| self.state.restore(state));
        if restored {
            // The engine held the fleet the snapshot replaced.
            self.engine.clear();
        }
        restored
    }

    fn decide(&mut self, now: DateTime<Utc>) -> Vec<Batch> {
        let began = std::time::Instant::now();
        let batches = self
            .state
            .decide(now, &self.rules, &mut self.engine)
            .batches;
        let took = began.elapsed();
        metrics::histogram!("lh_scheduler_decision_pass_seconds").record(took.as_secs_f64());
        // The histogram's buckets are too coarse for passes of milliseconds:
        // each pass is logged too (the scale harness reads these).
        tracing::debug!(
            target: "lh_scheduler::pass",
            pass_us = took.as_micros() as u64,
            waiting = self.state.waiting_count(),
            decisions = batches.len(),
            "decision pass"
        );
        metrics::gauge!("lh_scheduler_waiting_leases").set(self.state.waiting_count() as f64);
        self.fragmentation_metric(now);
        self.renew_fleet_board(now);
        metrics::gauge!("lh_scheduler_lost_nodes").set(self.state.lost_count() as f64);
        spot_metrics(&self.state.spot_stats);
        self.availability_metrics(now);
        batches
    }

    /// Allocations of several leases on one node merge into one
    /// `node.gpus_allocated` (it carries a list).
    fn can_merge(&self, first: &Envelope, more: &Envelope) -> bool {
        matches!(
            (&first.data, &more.data),
            (
                EventData::NodeGpusAllocated(_),
                EventData::NodeGpusAllocated(_)
            )
        )
    }

    fn merge(&self, first: &mut Envelope, more: &Envelope) {
        if let (EventData::NodeGpusAllocated(first), EventData::NodeGpusAllocated(more)) =
            (&mut first.data, &more.data)
        {
            first.allocations.extend(more.allocations.iter().cloned());
        }
    }

    fn appended(&mut self, batch: &Batch) {
        for (envelope, _) in batch {
            metrics::counter!("lh_scheduler_decisions_total", "type" => envelope.event_type.clone())
                .increment(1);
            if let EventData::NodeGpusAllocated(allocated) = &envelope.data {
                metrics::counter!("lh_scheduler_placements_total")
                    .increment(allocated.allocations.len() as u64);
            }
        }
        tracing::debug!(events = batch.len(), "decisions appended");
    }
}

impl Scheduling {
    /// The idle milli-GPU no waiting lease fits, at most once per
    /// [`FRAGMENTATION_EXPORT_EVERY_MS`].
    fn fragmentation_metric(&mut self, now: DateTime<Utc>) {
        if self.fragmentation_exported_at.is_some_and(|at| {
            now >= at && (now - at).num_milliseconds() < FRAGMENTATION_EXPORT_EVERY_MS
        }) {
            return;
        }
        self.fragmentation_exported_at = Some(now);
        metrics::gauge!("lh_scheduler_fragmented_gpu_milli")
            .set(self.state.fragmented_milli() as f64);
    }

    /// Each tenant's owed and interrupted lease-seconds up to `now`.
    fn availability_metrics(&mut self, now: DateTime<Utc>) {
        if self.availability_exported_at.is_some_and(|at| {
            now >= at && (now - at).num_milliseconds() < AVAILABILITY_EXPORT_EVERY_MS
        }) {
            return;
        }
        self.availability_exported_at = Some(now);
        let through = state::availability::AvailabilityStats::counted_through(
            now,
            self.rules.node_clock_skew,
        );
        for (tenant, time) in self.state.availability.up_to(through) {
            let exported = self.availability_exported.entry(tenant).or_default();
            exported.0 = exported.0.max(time.owed_ms / 1000);
            exported.1 = exported.1.max(time.interrupted_ms / 1000);
            let label = if tenant == state::availability::OTHER_TENANTS {
                "other".to_string()
            } else {
                tenant.to_string()
            };
            metrics::counter!("lh_tenant_lease_seconds_total", "tenant" => label.clone())
                .absolute(exported.0);
            metrics::counter!("lh_tenant_interrupted_lease_seconds_total", "tenant" => label)
                .absolute(exported.1);
        }
    }
}

/// The spot market's figures as the log tells them: totals since the log
/// began (so every replica and every restart reports the same), and the
/// ratios the spot SLO is read from.
fn spot_metrics(stats: &state::SpotStats) {
    metrics::counter!("lh_spot_leases_requested_total").absolute(stats.requested);
    metrics::counter!("lh_spot_leases_accepted_total").absolute(stats.accepted);
    metrics::counter!("lh_spot_leases_ended_total", "outcome" => "succeeded")
        .absolute(stats.succeeded);
    metrics::counter!("lh_spot_leases_ended_total", "outcome" => "failed").absolute(stats.failed);
    for reason in [
        lh_events::PreemptionReason::Capacity,
        lh_events::PreemptionReason::Outbid,
        lh_events::PreemptionReason::Priority,
    ] {
        let noticed = stats.preemptions.get(reason.as_str()).copied().unwrap_or(0);
        metrics::counter!("lh_spot_preemptions_total", "reason" => reason.as_str())
            .absolute(noticed);
    }
    metrics::gauge!("lh_spot_acceptance_ratio").set(stats.acceptance_ratio());
    metrics::gauge!("lh_spot_success_ratio").set(stats.success_ratio());
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_bus::Expect;
    use lh_events::*;

    #[test]
    fn a_heartbeat_speaks_only_for_its_subject() {
        let beat = |node: &str| {
            serde_json::to_vec(&lh_events::telemetry::Heartbeat {
                node_id: node.into(),
                at: Utc::now(),
                running_leases: 0,
                gpus: Vec::new(),
            })
            .unwrap()
        };
        let own = heartbeat_on(&subject::heartbeat("node-a"), &beat("node-a")).unwrap();
        assert_eq!(own.node_id, "node-a");
        // node-a's credential may publish only on its own subject: naming
        // node-c there keeps nobody alive.
        assert!(heartbeat_on(&subject::heartbeat("node-a"), &beat("node-c")).is_none());
        assert!(heartbeat_on(&subject::heartbeat("node-a"), b"junk").is_none());
    }

    #[test]
    fn nodes_heard_without_a_registration_are_bounded() {
        let now: DateTime<Utc> = "2026-12-06T10:00:00Z".parse().unwrap();
        let mut scheduling = Scheduling::new(state::Rules::default(), now);
        for i in 0..(state::MAX_UNREGISTERED_NODES_HEARD + 500) {
            scheduling.state.heard(&format!("ghost-{i}"), now, now);
        }
        assert_eq!(
            scheduling.state.heard_nodes(),
            state::MAX_UNREGISTERED_NODES_HEARD
        );
    }

    #[test]
    fn a_gpu_failure_is_dated_by_the_log_within_the_skew() {
        let stored: DateTime<Utc> = "2026-12-03T10:00:00Z".parse().unwrap();
        let mut scheduling = Scheduling::new(state::Rules::default(), stored);
        let node = fixtures::node("a", "z", 1, fixtures::MODEL, fixtures::MODEL_VRAM_GB);
        let env = |d| Envelope::new(Actor::Node("a".into()), stored, d);
        let mut fold = |sequence, envelope: &Envelope| {
            lh_service::decider::fold_stored(&mut scheduling, sequence, stored, envelope)
        };
        fold(1, &env(EventData::NodeRegistered(node)));
        let failed = NodeGpuHealthChanged {
            node_id: "a".into(),
            gpu_index: 0,
            gpu_uuid: "GPU-a-0".into(),
            from: GpuHealth::Healthy,
            to: GpuHealth::Unhealthy,
            reason: "lost".into(),
            evidence: HealthEvidence::default(),
            // The node's clock is an hour behind.
            at: stored - chrono::Duration::hours(1),
        };
        fold(2, &env(EventData::NodeGpuHealthChanged(failed)));
        let gpu = &scheduling.state.fleet.nodes["a"].gpus[0];
        assert_eq!(
            gpu.health_since,
            Some(stored - chrono::Duration::seconds(30))
        );
    }

    #[test]
    fn a_queue_wait_is_timed_once_from_the_request_to_the_stored_start_heard_live() {
        let began: DateTime<Utc> = "2026-12-03T10:00:00Z".parse().unwrap();
        let secs = chrono::Duration::seconds;
        let mut scheduling = Scheduling::new(state::Rules::default(), began);
        let tenant = uuid::Uuid::from_u128(100);
        let request = |n: u128| {
            EventData::LeaseRequested(fixtures::whole_request(
                uuid::Uuid::from_u128(n),
                tenant,
                1,
                fixtures::MODEL,
            ))
        };
        let start = |n: u128| {
            EventData::LeaseStarted(LeaseStarted {
                lease_id: uuid::Uuid::from_u128(n),
                node_id: "a".into(),
                // The node's clock, an hour off: not what is measured.
                started_at: began - chrono::Duration::hours(1),
                mig_devices: Vec::new(),
            })
        };
        let at = |t, d| Envelope::new(Actor::Admin, t, d);
        let mut sequence = 0;
        let mut feed = |scheduling: &mut Scheduling, stored, envelope: Envelope| {
            sequence += 1;
            let waited = scheduling.queue_wait(stored, &envelope);
            lh_service::decider::fold_stored(scheduling, sequence, stored, &envelope);
            waited
        };

        // Started before this replica began: replayed, not timed again.
        let t = began - secs(60);
        assert_eq!(feed(&mut scheduling, t, at(t, request(1))), None);
        let t = began - secs(10);
        assert_eq!(feed(&mut scheduling, t, at(t, start(1))), None);

        // Requested now, its start stored 12 s later.
        assert_eq!(feed(&mut scheduling, began, at(began, request(2))), None);
        let t = began + secs(12);
        assert_eq!(
            feed(&mut scheduling, t, at(t, start(2))),
            Some(Duration::from_secs(12))
        );
        // Started again (moved to another node): it did not wait in the queue.
        let t = began + secs(100);
        assert_eq!(feed(&mut scheduling, t, at(t, start(2))), None);
    }

    /// What a pass decided, to compare across schedulers: each event's data
    /// and guard.
    fn decided(batches: &[Batch]) -> Vec<(serde_json::Value, String)> {
        batches
            .iter()
            .flatten()
            .map(|(e, expect)| {
                let data = serde_json::to_value(&e.data).expect("events serialise");
                (data, format!("{expect:?}"))
            })
            .collect()
    }

    #[test]
    fn a_snapshot_restored_over_another_fleet_is_decided_as_by_a_fresh_scheduler() {
        let now: DateTime<Utc> = "2026-12-03T10:00:00Z".parse().unwrap();
        let tenant = uuid::Uuid::from_u128(100);
        let node = |id: &str, gpus| {
            EventData::NodeRegistered(fixtures::node(
                id,
                "z",
                gpus,
                fixtures::MODEL,
                fixtures::MODEL_VRAM_GB,
            ))
        };
        let request = |n: u128, gpus| {
            EventData::LeaseRequested(fixtures::whole_request(
                uuid::Uuid::from_u128(n),
                tenant,
                gpus,
                fixtures::MODEL,
            ))
        };
        let mut sequence = 0;
        let mut feed = |scheduling: &mut Scheduling, data: EventData| {
            sequence += 1;
            scheduling.apply(sequence, &Envelope::new(Actor::Admin, now, data));
        };

        // One node's two GPUs free, and a lease too large for them: the
        // pass leaves an engine that holds them free.
        let mut scheduling = Scheduling::new(state::Rules::default(), now);
        feed(
            &mut scheduling,
            EventData::TenantCreated(fixtures::tenant(tenant, 8)),
        );
        feed(&mut scheduling, node("a", 2));
        feed(&mut scheduling, request(1, 3));
        assert!(!scheduling.decide(now).is_empty());

        // Another fleet of the same node, both its GPUs held, and a
        // second node.
        let mut other = Scheduling::new(state::Rules::default(), now);
        feed(
            &mut other,
            EventData::TenantCreated(fixtures::tenant(tenant, 8)),
        );
        feed(&mut other, node("a", 2));
        feed(&mut other, node("c", 1));
        feed(&mut other, request(2, 2));
        for batch in other.decide(now) {
            for (envelope, _) in batch {
                feed(&mut other, envelope.data);
            }
        }
        feed(&mut other, request(3, 1));
        let snapshot = other.snapshot().expect("a state snapshots");

        // Both take it back, and hear the second node cordoned.
        let mut fresh = Scheduling::new(state::Rules::default(), now);
        let cordoned = EventData::NodeCordoned(NodeCordoned {
            node_id: "c".into(),
            drain: None,
            reason: "test".into(),
        });
        for s in [&mut scheduling, &mut fresh] {
            assert!(s.restore(&snapshot));
            feed(s, cordoned.clone());
        }
        let restored = scheduling.decide(now);
        let placed = |batches: &[Batch]| {
            batches
                .iter()
                .flatten()
                .any(|(e, _)| matches!(e.data, EventData::NodeGpusAllocated(_)))
        };
        assert!(!placed(&restored), "node a's GPUs are held: {restored:?}");
        assert_eq!(decided(&restored), decided(&fresh.decide(now)));
    }

    /// Packs as the decide loop does, with the scheduler's merge rule.
    fn pack(decisions: Vec<Batch>) -> Vec<Batch> {
        let scheduling = Scheduling::new(Config::for_test("nats://unused").rules(), Utc::now());
        decider::pack(
            decisions,
            |first, more| scheduling.can_merge(first, more),
            |first, more| scheduling.merge(first, more),
        )
    }

    fn placement(lease: u128, node: &str) -> Batch {
        let id = uuid::Uuid::from_u128(lease);
        let env = |d| Envelope::new(Actor::Admin, Utc::now(), d);
        vec![
            (
                env(EventData::LeaseStopRequested(LeaseStopRequested {
                    lease_id: id,
                })),
                Expect::Any,
            ),
            (
                env(EventData::NodeGpusAllocated(NodeGpusAllocated::one(
                    node,
                    id,
                    vec![lease as u32],
                ))),
                Expect::Any,
            ),
        ]
    }

    #[test]
    fn allocations_on_one_node_merge_and_subjects_never_repeat() {
        let packed = pack(vec![
            placement(1, "a"),
            placement(2, "a"),
            placement(3, "b"),
        ]);
        assert_eq!(packed.len(), 1);
        let batch = &packed[0];
        assert_eq!(batch.len(), 5, "3 lease messages, 2 node messages");
        let subjects: std::collections::HashSet<_> = batch
            .iter()
            .map(|(e, _)| e.data.aggregate_subject())
            .collect();
        assert_eq!(subjects.len(), batch.len());
        match &batch[1].0.data {
            EventData::NodeGpusAllocated(a) => assert_eq!(a.allocations.len(), 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_repeated_lease_subject_starts_a_new_batch_and_size_is_capped() {
        let packed = pack(vec![placement(1, "a"), placement(1, "b")]);
        assert_eq!(packed.len(), 2);
        let many: Vec<_> = (0..100).map(|i| placement(i, &format!("n{i}"))).collect();
        let packed = pack(many);
        assert!(packed.iter().all(|b| b.len() <= lh_bus::MAX_BATCH_MESSAGES));
        assert_eq!(packed.iter().map(Vec::len).sum::<usize>(), 200);
    }
}
