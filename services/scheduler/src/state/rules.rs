//! The knobs of the queueing rules and the limits the scheduler keeps.

use chrono::Duration;

/// Milli-GPU in one whole GPU.
pub const MILLI_PER_GPU: u64 = 1000;
/// Queue positions are kept exact (re-announced when they move) this far
/// down the queue; beyond it a position is announced once.
pub const EXACT_POSITIONS: u32 = 100;
/// Most spot leases on one node considered as preemption victims at once
/// (the search tries every subset).
pub const MAX_VICTIMS_PER_NODE: usize = 12;

/// Knobs of the queueing rules.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// A spot lease younger than this is never preempted.
    pub preemption_min_runtime: Duration,
    /// Time a preempted spot lease gets between notice and eviction.
    pub preemption_notice: Duration,
    /// A waiting lease older than this stops smaller ones of its model from
    /// jumping ahead.
    pub backfill_starvation: Duration,
    /// A node silent this long is lost: its leases move elsewhere.
    pub node_lost_after: Duration,
    /// A silence of the whole fleet (two nodes or more) means the scheduler
    /// cannot hear, not that every node died: no node is lost for it until
    /// it has lasted this long.
    pub fleet_silence_grace: Duration,
    /// How far a node's clock may be from the scheduler's and the log
    /// server's: the time a heartbeat says it was sent (which ends a lost
    /// node's bill) is held to within this of when it arrived, and a node's
    /// times in the log to within this of when the log stored them.
    pub node_clock_skew: Duration,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            preemption_min_runtime: Duration::minutes(10),
            preemption_notice: Duration::seconds(120),
            backfill_starvation: Duration::minutes(5),
            node_lost_after: Duration::seconds(3),
            fleet_silence_grace: Duration::seconds(60),
            node_clock_skew: Duration::seconds(lh_events::node_time::DEFAULT_NODE_CLOCK_SKEW_SECS),
        }
    }
}
