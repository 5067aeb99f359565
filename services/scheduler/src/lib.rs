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

pub mod state;

use std::time::Duration;

use chrono::Utc;
use lh_bus::{Bus, BusError};
use lh_events::subject;
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
}

impl Config {
    pub fn for_test(nats_url: &str) -> Self {
        Self {
            common: CommonArgs::for_test(nats_url),
            preemption_min_runtime_secs: 600,
            preemption_notice_secs: 120,
            backfill_starvation_secs: 300,
        }
    }

    pub fn rules(&self) -> state::Rules {
        state::Rules {
            preemption_min_runtime: chrono::Duration::seconds(self.preemption_min_runtime_secs),
            preemption_notice: chrono::Duration::seconds(self.preemption_notice_secs),
            backfill_starvation: chrono::Duration::seconds(self.backfill_starvation_secs),
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

async fn schedule(bus: Bus, rules: state::Rules, ready: Readiness) -> anyhow::Result<()> {
    let mut state = State::default();
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

/// Appends decisions until there are none left. False when a conflict
/// cut it short.
async fn decide_and_append(bus: &Bus, state: &mut State, rules: &state::Rules) -> bool {
    loop {
        let decisions = state.decide(Utc::now(), rules);
        if !append_all(bus, state, decisions.batches).await {
            return false;
        }
        if !decisions.more {
            return true;
        }
    }
}

async fn append_all(bus: &Bus, state: &mut State, batches: Vec<state::Batch>) -> bool {
    for batch in batches {
        match bus.publish_atomic(&batch).await {
            Ok(appended) => {
                // Apply our own events at once so the rest of the pass and
                // the next one see them; the feed repeats them harmlessly.
                let first = appended.sequence + 1 - batch.len() as u64;
                for (i, (envelope, _)) in batch.iter().enumerate() {
                    state.apply(first + i as u64, envelope);
                }
                metrics::counter!("lh_scheduler_decisions_total", "type" => batch[0].0.event_type.clone())
                    .increment(1);
                tracing::info!(
                    event = %batch[0].0.event_type,
                    lease = ?batch[0].0.data.subject(),
                    "decision appended"
                );
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
