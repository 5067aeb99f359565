//! Heartbeats and usage samples, sent from a task of their own: a slow
//! append or a busy decision pass never delays a heartbeat, and so never
//! makes a healthy node look lost.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use lh_bus::Bus;
use lh_events::subject;
use lh_events::telemetry::{Heartbeat, LeaseUsage};
use lh_service::clock::SharedClock;
use lh_service::CancellationToken;
use tokio::sync::mpsc;

use crate::agent::NodeStatus;

/// Usage reports waiting to be sent; past it new ones are dropped (usage is
/// sampled again at the next interval).
const MOST_WAITING_USAGE_REPORTS: usize = 16;

/// Starts the task; it ends with `shutdown`. Returns where usage reports go.
pub(crate) fn spawn(
    bus: Bus,
    node_id: String,
    period: Duration,
    status: Arc<NodeStatus>,
    clock: SharedClock,
    shutdown: CancellationToken,
) -> mpsc::Sender<Vec<LeaseUsage>> {
    let (usage_tx, mut usage) = mpsc::channel::<Vec<LeaseUsage>>(MOST_WAITING_USAGE_REPORTS);
    tokio::spawn(async move {
        let mut beat = tokio::time::interval(period);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = beat.tick() => {
                    // A host that does not answer sends nothing.
                    if status.silent.load(Ordering::Relaxed) {
                        continue;
                    }
                    let running_leases = status.running_leases.load(Ordering::Relaxed);
                    let gpus = status.gpus.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    let hb = Heartbeat { node_id: node_id.clone(), at: clock.now(), running_leases, gpus };
                    send(&bus, subject::heartbeat(&node_id), &hb, "heartbeat").await;
                    metrics::gauge!("lh_node_running_leases").set(running_leases as f64);
                }
                Some(report) = usage.recv() => {
                    for u in &report {
                        send(&bus, subject::usage(&node_id, u.lease_id), u, "usage sample").await;
                    }
                }
            }
        }
    });
    usage_tx
}

async fn send(bus: &Bus, subject: String, sample: &impl serde::Serialize, what: &str) {
    let payload = match serde_json::to_vec(sample) {
        Ok(payload) => payload,
        Err(e) => return tracing::warn!(error = %e, "{what} does not serialise"),
    };
    if let Err(e) = bus.publish_telemetry(subject, payload).await {
        tracing::warn!(error = %e, "{what} not sent");
    }
}
