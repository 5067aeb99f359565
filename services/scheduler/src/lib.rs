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

pub mod planner;
pub mod state;

use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use lh_bus::{Bus, BusError};
use lh_events::subject;
use lh_events::telemetry::Heartbeat;
use lh_service::{CancellationToken, CommonArgs, Readiness, Running};

pub use state::State;

pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9101";
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
}

impl Config {
    pub fn for_test(nats_url: &str) -> Self {
        Self {
            common: CommonArgs::for_test(nats_url),
            preemption_min_runtime_secs: 600,
            preemption_notice_secs: 120,
            backfill_starvation_secs: 300,
            node_lost_after_ms: 3_000,
        }
    }

    pub fn rules(&self) -> state::Rules {
        state::Rules {
            preemption_min_runtime: chrono::Duration::seconds(self.preemption_min_runtime_secs),
            preemption_notice: chrono::Duration::seconds(self.preemption_notice_secs),
            backfill_starvation: chrono::Duration::seconds(self.backfill_starvation_secs),
            node_lost_after: chrono::Duration::milliseconds(self.node_lost_after_ms as i64),
        }
    }
}

pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    let bus = config.common.connect_bus(state::SERVICE).await?;
    let readiness = Readiness::default();
    let ready = readiness.clone();
    let rules = config.rules();
    Running::spawn(
        config.common.http_addr_or(DEFAULT_HTTP_ADDR),
        axum::Router::new(),
        readiness,
        shutdown,
        async move { schedule(bus, rules, ready).await },
    )
    .await
}

/// How often node silence is checked (the liveness window is 3 s by
/// default; this keeps the detection within a fifth of a second of it).
const LIVENESS_CHECK: Duration = Duration::from_millis(200);

async fn schedule(bus: Bus, rules: state::Rules, ready: Readiness) -> anyhow::Result<()> {
    let mut state = State::default();
    if rules.node_lost_after > chrono::Duration::zero() {
        state.liveness_since = Some(Utc::now());
    }
    // Subscribed before reading the log, so no heartbeat falls in between.
    let mut heartbeats = bus.subscribe_telemetry(subject::HEARTBEATS_ALL).await?;
    let mut last_heartbeats_read = false;
    let mut liveness = tokio::time::interval(LIVENESS_CHECK);
    let mut feed = bus
        .feed(
            &[
                subject::LEASES_ALL,
                subject::NODES_ALL,
                subject::TENANTS_ALL,
            ],
            1,
        )
        .await?;
    let mut caught_up = false;
    let mut dirty = true;
    let mut tick = tokio::time::interval(REEVALUATE_INTERVAL);
    loop {
        tokio::select! {
            next = feed.next_within(QUIET) => match next {
                Some(event) => {
                    let event = event?;
                    state.apply(event.sequence, &event.envelope);
                    dirty = true;
                    caught_up = event.pending == 0;
                }
                None => caught_up = true,
            },
            _ = tick.tick() => dirty = true,
            Some(message) = heartbeats.next() => {
                match serde_json::from_slice::<Heartbeat>(&message.payload) {
                    Ok(hb) => state.heard(&hb.node_id, hb.at, Utc::now()),
                    Err(e) => tracing::debug!(error = %e, "unreadable heartbeat"),
                }
            }
            _ = liveness.tick() => {
                if caught_up && !state.liveness_changes(Utc::now(), &rules).is_empty() {
                    dirty = true;
                }
            }
        }
        if caught_up && !last_heartbeats_read {
            // A node that died while no scheduler ran is judged by its last
            // heartbeat still in the telemetry stream.
            last_heartbeats_read = true;
            read_last_heartbeats(&bus, &mut state).await;
        }
        if caught_up && dirty {
            ready.set(true);
            dirty = false;
            if !decide_and_append(&bus, &mut state, &rules).await {
                // Someone else appended first: read their events, then retry.
                caught_up = false;
                dirty = true;
            }
            metrics::gauge!("lh_scheduler_waiting_leases").set(state.waiting_count() as f64);
        }
    }
}

async fn read_last_heartbeats(bus: &Bus, state: &mut State) {
    let nodes: Vec<String> = state.fleet.nodes.keys().cloned().collect();
    for node_id in nodes {
        match bus.last_telemetry(&subject::heartbeat(&node_id)).await {
            Ok(Some(payload)) => {
                if let Ok(hb) = serde_json::from_slice::<Heartbeat>(&payload) {
                    state.heard(&hb.node_id, hb.at, hb.at.min(Utc::now()));
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, node = %node_id, "cannot read the last heartbeat"),
        }
    }
}

/// Appends one pass of decisions. False when a conflict cut it short.
///
/// An atomic batch costs milliseconds whatever its size, so decisions are
/// packed into batches of up to [`lh_bus::MAX_BATCH_MESSAGES`] messages,
/// each subject at most once per batch (a second write to a node expects
/// the sequence of the first, known only once that is stored).
async fn decide_and_append(bus: &Bus, state: &mut State, rules: &state::Rules) -> bool {
    let decisions = state.decide(Utc::now(), rules);
    for mut batch in pack(decisions.batches) {
        state.expect_current(&mut batch);
        match bus.publish_atomic(&batch).await {
            Ok(appended) => {
                // Apply our own events at once so the rest of the pass and
                // the next one see them; the feed repeats them harmlessly.
                let first = appended.sequence + 1 - batch.len() as u64;
                for (i, (envelope, _)) in batch.iter().enumerate() {
                    state.apply(first + i as u64, envelope);
                    metrics::counter!("lh_scheduler_decisions_total", "type" => envelope.event_type.clone())
                        .increment(1);
                }
                tracing::debug!(events = batch.len(), "decisions appended");
            }
            Err(BusError::Conflict(why)) | Err(BusError::DuplicateBatch(why)) => {
                metrics::counter!("lh_scheduler_conflicts_total").increment(1);
                tracing::debug!(%why, "lost a race; re-reading the log");
                return false;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot append decision; will retry");
                return false;
            }
        }
    }
    true
}

/// Packs decisions, in order, into as few atomic batches as the rules allow:
/// each subject is written once per batch, so allocations on one node merge
/// into one `node.gpus_allocated`.
pub fn pack(decisions: Vec<state::Batch>) -> Vec<state::Batch> {
    use lh_events::EventData;
    use std::collections::HashMap;
    let mut out: Vec<state::Batch> = Vec::new();
    // subject -> index of its message in the current batch
    let mut subjects: HashMap<String, usize> = HashMap::new();
    for decision in decisions {
        let mergeable = |(e, _): &(lh_events::Envelope, lh_bus::Expect)| {
            matches!(e.data, EventData::NodeGpusAllocated(_))
        };
        let fits = out.last().is_some_and(|b| {
            b.len() + decision.len() <= lh_bus::MAX_BATCH_MESSAGES
                && decision
                    .iter()
                    .all(|m| mergeable(m) || !subjects.contains_key(&m.0.data.subject()))
        });
        if !fits {
            out.push(Vec::new());
            subjects.clear();
        }
        let batch = out.last_mut().expect("a batch");
        for (envelope, expect) in decision {
            let subject = envelope.data.subject();
            match (subjects.get(&subject), &envelope.data) {
                (Some(&at), EventData::NodeGpusAllocated(more)) => {
                    if let EventData::NodeGpusAllocated(first) = &mut batch[at].0.data {
                        first.allocations.extend(more.allocations.iter().cloned());
                    }
                }
                _ => {
                    subjects.insert(subject, batch.len());
                    batch.push((envelope, expect));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_bus::Expect;
    use lh_events::*;

    fn placement(lease: u128, node: &str) -> state::Batch {
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
        let subjects: std::collections::HashSet<_> =
            batch.iter().map(|(e, _)| e.data.subject()).collect();
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
