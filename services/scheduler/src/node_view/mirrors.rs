//! The mirror of each node's view (docs/adr/028): a node reads its view in
//! a stream of its own, where its consumers are capped, never in the log.
//! Every node the log holds relays to gets its mirror when the scheduler
//! starts, and a node gets one as the first relay to it appears or its
//! first heartbeat is heard (an agent reads an empty view until its mirror
//! is there, and sends heartbeats from its start). A mirror copies from
//! the start of the log, so one made late misses nothing.

use std::collections::HashSet;
use std::time::Duration;

use lh_bus::{Bus, BusError};
use lh_events::subject;
use lh_service::CancellationToken;

/// Most nodes whose mirrors one run remembers having made; past it a relay
/// to a node not remembered costs a look at whether its mirror exists.
const MAX_NODES_REMEMBERED: usize = 65_536;
/// First wait after a failure before starting over; it doubles up to the max.
const RETRY_MIN_WAIT: Duration = Duration::from_millis(200);
const RETRY_MAX_WAIT: Duration = Duration::from_secs(5);

/// Keeps every node's mirror until `shutdown`, starting over after a
/// failure (the server away, a mirror refused).
pub async fn keep(bus: Bus, shutdown: CancellationToken) {
    let mut wait = RETRY_MIN_WAIT;
    while !shutdown.is_cancelled() {
        match keep_once(&bus, &shutdown).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64,
                    "keeping the nodes' view mirrors stopped; starting again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(RETRY_MAX_WAIT);
            }
        }
    }
}

async fn keep_once(bus: &Bus, shutdown: &CancellationToken) -> Result<(), BusError> {
    use futures::StreamExt as _;
    // Heard from now on; relays stored after this are read below, those
    // before by subject.
    let mut heartbeats = bus
        .client()
        .subscribe(subject::HEARTBEATS_ALL)
        .await
        .map_err(|e| BusError::JetStream(format!("subscribing to heartbeats: {e}")))?;
    let head = bus.last_sequence().await?;
    let mut kept = HashSet::new();
    for node in bus.nodes_with_views().await? {
        bus.ensure_node_view_stream(&node).await?;
        remember(&mut kept, node);
    }
    let mut relays = bus
        .reread(&[subject::NODE_VIEW_RELAYS_ALL], head + 1)
        .await?;
    loop {
        let node = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            relay = relays.next() => {
                let relay = relay.ok_or_else(|| BusError::JetStream("the relays' feed ended".into()))??;
                subject::node_of_view(&relay.subject).map(str::to_string)
            }
            heartbeat = heartbeats.next() => {
                let heartbeat = heartbeat.ok_or_else(|| BusError::JetStream("the heartbeats ended".into()))?;
                subject::node_of_heartbeat(&heartbeat.subject).map(str::to_string)
            }
        };
        let Some(node) = node else {
            continue;
        };
        let node = node.as_str();
        if !kept.contains(node) {
            bus.ensure_node_view_stream(node).await?;
            tracing::info!(node, "made the mirror of a node's view");
            remember(&mut kept, node.to_string());
        }
    }
}

fn remember(kept: &mut HashSet<String>, node: String) {
    if kept.len() < MAX_NODES_REMEMBERED {
        kept.insert(node);
    }
}
