use chrono::TimeZone;
use lh_events::{fixtures, EndReason, IdleAction, LeaseStopRequested, Relocation};

use super::*;

fn at(s: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap()
}

/// A view writer fed a log, event by event at consecutive sequences.
struct Log {
    views: NodeViews,
    next: u64,
}

impl Log {
    fn new() -> Self {
        Log {
            views: NodeViews::new(chrono::Duration::seconds(30)),
            next: 1,
        }
    }

    fn append(&mut self, data: EventData) -> u64 {
        let sequence = self.next;
        self.next += 1;
        let envelope = fixtures::by_owner(data);
        self.views
            .apply_stored(sequence, at(sequence as i64), &envelope);
        sequence
    }

    /// Writes what is due, as the loop would, and folds it back.
    fn relay(&mut self) -> Vec<NodeViewRelayed> {
        let relays = self.views.decide(at(1_000));
        let mut out = Vec::new();
        for batch in relays {
            for (envelope, _) in batch {
                let sequence = self.next;
                self.next += 1;
                self.views.apply(sequence, &envelope);
                let EventData::NodeViewRelayed(r) = envelope.data else {
                    panic!("not a relay: {envelope:?}")
                };
                out.push(r);
            }
        }
        out
    }
}

fn sequences(r: &NodeViewRelayed) -> Vec<u64> {
    r.events.iter().map(|e| e.sequence).collect()
}

fn types(r: &NodeViewRelayed) -> Vec<String> {
    r.events
        .iter()
        .map(|e| e.envelope.event_type.clone())
        .collect()
}

fn request_of(lease: Uuid, tenant: Uuid) -> EventData {
    EventData::LeaseRequested(fixtures::whole_request(lease, tenant, 1, fixtures::MODEL))
}

/// `lease` moved from `from` to GPU 0 of `to`.
fn move_of(lease: Uuid, from: &str, to: &str) -> EventData {
    let EventData::LeasePlaced(p) = placed(lease, to) else {
        unreachable!()
    };
    EventData::LeaseMigrated(lh_events::LeaseMigrated {
        lease_id: lease,
        reason: "moved".into(),
        from_node_id: from.into(),
        from_gpu_indices: vec![0],
        billing_ends_at: at(3),
        to: Some(Relocation {
            node_id: to.into(),
            zone: p.zone,
            vram_gb_per_gpu: p.vram_gb_per_gpu,
            gpus: p.gpus,
            decision: p.decision,
        }),
    })
}

fn placed(lease: Uuid, node: &str) -> EventData {
    EventData::LeasePlaced(fixtures::placed(
        lease,
        node,
        "z",
        fixtures::MODEL,
        40,
        &[0],
    ))
}

#[test]
fn a_node_gets_its_leases_from_the_request_on_and_nothing_of_other_nodes() {
    let mut log = Log::new();
    let tenant = Uuid::now_v7();
    let mut created = fixtures::tenant(tenant, 8);
    created.idle_policy = Some(IdlePolicy {
        window_seconds: 60,
        action: IdleAction::Suspend,
    });
    log.append(EventData::TenantCreated(created));
    let (mine, theirs) = (Uuid::now_v7(), Uuid::now_v7());
    let requested = log.append(request_of(mine, tenant));
    log.append(request_of(theirs, tenant));
    let place = log.append(placed(mine, "n1"));
    log.append(placed(theirs, "n2"));
    let started = log.append(EventData::LeaseStarted(fixtures::started(
        mine,
        "n1",
        at(5),
    )));
    let relays = log.relay();
    let to_n1: Vec<&NodeViewRelayed> = relays.iter().filter(|r| r.node_id == "n1").collect();
    assert_eq!(to_n1.len(), 1);
    assert_eq!(sequences(to_n1[0]), [requested, place, started]);
    assert_eq!(
        to_n1[0].idle_policies,
        [TenantIdlePolicy {
            tenant_id: tenant,
            policy: IdlePolicy {
                window_seconds: 60,
                action: IdleAction::Suspend
            }
        }]
    );
    assert!(to_n1[0]
        .events
        .iter()
        .all(|e| e.envelope.data.lease_id() == Some(mine)));
    // Relayed once: read back, nothing waits.
    assert!(log.relay().is_empty());
    assert_eq!(log.views.waiting_events(), 0);

    let stop = log.append(EventData::LeaseStopRequested(LeaseStopRequested {
        lease_id: mine,
    }));
    let ended = log.append(EventData::LeaseEnded(fixtures::ended(
        mine,
        "n1",
        at(9),
        EndReason::Stopped,
    )));
    // After its end, nothing more of it goes anywhere.
    log.append(EventData::LeaseStopRequested(LeaseStopRequested {
        lease_id: mine,
    }));
    let relays = log.relay();
    assert_eq!(relays.len(), 1);
    assert_eq!(relays[0].node_id, "n1");
    assert_eq!(sequences(&relays[0]), [stop, ended]);
    assert!(relays[0].idle_policies.is_empty());
}

#[test]
fn a_moved_lease_goes_to_its_new_node_with_its_request_and_its_old_node_hears_it_left() {
    let mut log = Log::new();
    let (tenant, lease) = (Uuid::now_v7(), Uuid::now_v7());
    let requested = log.append(request_of(lease, tenant));
    let place = log.append(placed(lease, "n1"));
    assert_eq!(log.relay().len(), 1);
    let moved = log.append(move_of(lease, "n1", "n2"));
    let started = log.append(EventData::LeaseStarted(fixtures::started(
        lease,
        "n2",
        at(4),
    )));
    let relays = log.relay();
    let of = |node: &str| {
        relays
            .iter()
            .find(|r| r.node_id == node)
            .map(sequences)
            .unwrap_or_default()
    };
    assert_eq!(of("n1"), [moved]);
    assert_eq!(of("n2"), [requested, moved, started]);
    assert!(place < moved);
}

#[test]
fn a_lease_that_leaves_before_its_placement_was_relayed_is_never_relayed_there() {
    let mut log = Log::new();
    let (tenant, lease) = (Uuid::now_v7(), Uuid::now_v7());
    log.append(request_of(lease, tenant));
    log.append(placed(lease, "n1"));
    log.append(EventData::LeaseStarted(fixtures::started(
        lease,
        "n1",
        at(4),
    )));
    log.append(EventData::LeaseEnded(fixtures::ended(
        lease,
        "n1",
        at(9),
        EndReason::Completed,
    )));
    assert!(log.relay().is_empty(), "a replay of history relays nothing");
}

#[test]
fn a_node_gets_its_own_node_events_and_not_another_nodes() {
    let mut log = Log::new();
    let n1 = fixtures::node("n1", "z", 2, fixtures::MODEL, 80);
    let n2 = fixtures::node("n2", "z", 2, fixtures::MODEL, 80);
    let enrolled = log.append(EventData::NodeEnrolled(fixtures::enrollment_of(&n1)));
    log.append(EventData::NodeEnrolled(fixtures::enrollment_of(&n2)));
    let registered = log.append(EventData::NodeRegistered(n1));
    let relays = log.relay();
    let to_n1 = relays.iter().find(|r| r.node_id == "n1").unwrap();
    assert_eq!(sequences(to_n1), [enrolled, registered]);
    assert_eq!(types(to_n1), ["node.enrolled", "node.registered"]);
}

#[test]
fn relays_wait_in_the_snapshot_and_are_written_once_after_a_restart() {
    let mut log = Log::new();
    let (tenant, lease) = (Uuid::now_v7(), Uuid::now_v7());
    log.append(request_of(lease, tenant));
    log.append(placed(lease, "n1"));
    let snapshot = log.views.snapshot().unwrap();
    let mut restarted = NodeViews::new(chrono::Duration::seconds(30));
    assert!(restarted.restore(&snapshot));
    assert_eq!(restarted.waiting_events(), 2);
    let first = log.relay();
    // The restarted writer reads the relay the first one wrote.
    let written = Envelope::new(
        Actor::Service(SERVICE.into()),
        at(1_000),
        EventData::NodeViewRelayed(first[0].clone()),
    );
    restarted.apply_stored(99, at(1_000), &written);
    assert!(restarted.relays(at(1_001)).is_empty());
}

#[test]
fn a_long_view_is_relayed_in_several_bounded_relays_in_order() {
    let mut log = Log::new();
    let (tenant, lease) = (Uuid::now_v7(), Uuid::now_v7());
    log.append(request_of(lease, tenant));
    log.append(placed(lease, "n1"));
    for _ in 0..(MAX_RELAY_EVENTS + 10) {
        log.append(EventData::LeaseStopRequested(LeaseStopRequested {
            lease_id: lease,
        }));
    }
    let relays = log.relay();
    assert_eq!(relays.len(), 2);
    assert_eq!(relays[0].events.len(), MAX_RELAY_EVENTS);
    let all: Vec<u64> = relays.iter().flat_map(sequences).collect();
    let mut sorted = all.clone();
    sorted.sort_unstable();
    assert_eq!(all, sorted);
    assert_eq!(all.len(), MAX_RELAY_EVENTS + 12);
}

#[test]
fn a_lease_moved_to_other_gpus_of_its_node_reaches_it_once_and_its_end_reaches_it_too() {
    let mut log = Log::new();
    let (tenant, lease) = (Uuid::now_v7(), Uuid::now_v7());
    let requested = log.append(request_of(lease, tenant));
    log.append(placed(lease, "n1"));
    assert_eq!(log.relay().len(), 1);
    let moved = log.append(move_of(lease, "n1", "n1"));
    // Ended before the move was relayed: the node, which runs it, still
    // hears of the move and the end.
    let ended = log.append(EventData::LeaseEnded(fixtures::ended(
        lease,
        "n1",
        at(9),
        EndReason::Stopped,
    )));
    let relays = log.relay();
    assert_eq!(relays.len(), 1);
    assert_eq!(sequences(&relays[0]), [requested, moved, ended]);
}

#[test]
fn every_member_of_a_gang_reads_its_lease_and_every_members_reports() {
    let mut log = Log::new();
    let tenant = Uuid::now_v7();
    let lease = Uuid::now_v7();
    let request = log.append(request_of(lease, tenant));
    let EventData::LeasePlaced(mut gang) = placed(lease, "a") else {
        unreachable!()
    };
    gang.members = ["a", "b"]
        .into_iter()
        .map(|n| lh_events::LeaseMember {
            node_id: n.into(),
            zone: "z".into(),
            address: n.into(),
            gpus: gang.gpus.clone(),
        })
        .collect();
    let placement = log.append(EventData::LeasePlaced(gang));
    let started_b = log.append(EventData::LeaseStarted(fixtures::started(
        lease,
        "b",
        at(5),
    )));
    let mut by_node: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    let mut relay = |log: &mut Log| {
        for r in log.relay() {
            by_node
                .entry(r.node_id.clone())
                .or_default()
                .extend(sequences(&r));
        }
    };
    relay(&mut log);
    let ended = log.append(EventData::LeaseEnded(fixtures::ended(
        lease,
        "a",
        at(9),
        EndReason::Completed,
    )));
    relay(&mut log);
    let every_event = vec![request, placement, started_b, ended];
    assert_eq!(by_node.get("a"), Some(&every_event));
    assert_eq!(by_node.get("b"), Some(&every_event));
    assert_eq!(by_node.len(), 2, "{by_node:?}");
}
