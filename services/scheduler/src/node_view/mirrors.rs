//! The mirror of each node's view (docs/adr/028): a node reads its view in
//! a stream of its own, where its consumers are capped, never in the log.
//! Every node the log holds relays to gets its mirror when the scheduler
//! starts, and a node gets one as the first relay to it appears or its
//! first heartbeat is heard (an agent reads an empty view until its mirror
//! is there, and sends heartbeats from its start). A mirror copies from
//! the start of the log, so one made late misses nothing.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use lh_bus::{Bus, BusError};
use lh_events::subject;
use lh_service::CancellationToken;

/// Most nodes whose mirrors one run remembers having made; past it a relay
/// to a node not remembered costs a look at whether its mirror exists.
const MAX_NODES_REMEMBERED: usize = 65_536;
/// How long after the log elects a leader the mirrors are watched.
const WATCH_AFTER_ELECTION: Duration = Duration::from_secs(120);
/// How often a watched mirror is looked at, and the log's leader when
/// nothing is watched.
const WATCH_INTERVAL: Duration = Duration::from_secs(2);
/// Longest a healthy mirror goes without word from the log: it hears a
/// heartbeat every second.
const MIRROR_SILENCE_MAX: Duration = Duration::from_secs(3);
/// Least time between two renewals of one mirror (an election takes a
/// few seconds).
const RENEWAL_MIN_INTERVAL: Duration = Duration::from_secs(10);

/// Keeps every node's mirror until `shutdown`, starting over after a
/// failure (the server away, a mirror refused).
pub async fn keep(bus: Bus, shutdown: CancellationToken) {
    super::restarted("keeping the nodes' view mirrors", &shutdown, || {
        keep_once(&bus, &shutdown)
    })
    .await
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
    // A mirror that lost the log's leader is retried by the server after a
    // growing wait; for a while after each election the mirrors are
    // watched, and one silent for long is renewed.
    let mut elections = bus
        .client()
        .subscribe(format!(
            "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{}",
            subject::EVENTS_STREAM
        ))
        .await
        .map_err(|e| BusError::JetStream(format!("subscribing to elections: {e}")))?;
    let mut watch_until: Option<Instant> = None;
    // The advisory of an election is lost when this client is reconnecting
    // as it comes (its server was the one that went): the log's leader is
    // also looked at, and a new one starts the watch as the advisory does.
    let mut log_leader = bus.log_leader().await.ok().flatten();
    let mut renewed: HashMap<String, Instant> = HashMap::new();
    let mut watch = tokio::time::interval(WATCH_INTERVAL);
    // Ticks missed are not made up.
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
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
            Some(_) = elections.next() => {
                watch_until = Some(Instant::now() + WATCH_AFTER_ELECTION);
                None
            }
            _ = watch.tick() => {
                if let Ok(Some(now_leading)) = bus.log_leader().await {
                    if log_leader.replace(now_leading.clone()).is_some_and(|was| was != now_leading) {
                        watch_until = Some(Instant::now() + WATCH_AFTER_ELECTION);
                    }
                }
                if watch_until.is_some_and(|until| Instant::now() < until) {
                    renew_silent(bus, &kept, &mut renewed).await;
                }
                None
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

/// Renews each kept mirror that has not heard from the log for longer
/// than a healthy one does, at most once per [`RENEWAL_MIN_INTERVAL`].
async fn renew_silent(bus: &Bus, kept: &HashSet<String>, renewed: &mut HashMap<String, Instant>) {
    for node in kept {
        let silence = match bus.node_view_silence(node).await {
            Ok(Some(silence)) => silence,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(node, error = %e, "cannot look at a node's view mirror");
                continue;
            }
        };
        let recently = renewed
            .get(node)
            .is_some_and(|at| at.elapsed() < RENEWAL_MIN_INTERVAL);
        if silence > MIRROR_SILENCE_MAX && !recently {
            tracing::warn!(
                node,
                silence_ms = silence.as_millis() as u64,
                "a node's view mirror has not heard from the log; renewing it"
            );
            if let Err(e) = bus.renew_node_view(node).await {
                tracing::warn!(node, error = %e, "cannot renew a node's view mirror");
            }
            renewed.insert(node.clone(), Instant::now());
        }
    }
}

fn remember(kept: &mut HashSet<String>, node: String) {
    if kept.len() < MAX_NODES_REMEMBERED {
        kept.insert(node);
    }
}
