//! Given a lease placed on one node, when each principal reports on it,
//! then only the one that holds it is obeyed.

use chrono::{DateTime, Duration, Utc};
use lh_events::{
    fixtures, Actor, EndReason, Envelope, EventData, LeaseMigrated, LeaseRestated,
    LeaseStopRequested, LeaseSuspended, Relocation, StatedEvent,
};
use uuid::Uuid;

use super::*;
use lh_events::SkipReason;

const LEASE: Uuid = Uuid::from_u128(0x1ea5e);
const TENANT: Uuid = Uuid::from_u128(0x7e4a47);
const OTHER_TENANT: Uuid = Uuid::from_u128(0x0dd);

fn t(secs: i64) -> DateTime<Utc> {
    "2026-12-06T10:00:00Z".parse::<DateTime<Utc>>().unwrap() + Duration::seconds(secs)
}

fn by(actor: Actor, data: EventData) -> Envelope {
    Envelope::new(actor, t(0), data)
}

fn node(id: &str) -> Actor {
    Actor::Node(id.into())
}

fn scheduler() -> Actor {
    Actor::Service("lh-scheduler".into())
}

fn requested() -> Envelope {
    by(
        Actor::Tenant(TENANT),
        EventData::LeaseRequested(fixtures::whole_request(LEASE, TENANT, 1, fixtures::MODEL)),
    )
}

fn placed_on(node_id: &str) -> Envelope {
    by(
        scheduler(),
        EventData::LeasePlaced(fixtures::placed(
            LEASE,
            node_id,
            "zone-a",
            fixtures::MODEL,
            80,
            &[0],
        )),
    )
}

fn started_by(node_id: &str, at: i64) -> Envelope {
    by(
        node(node_id),
        EventData::LeaseStarted(fixtures::started(LEASE, node_id, t(at))),
    )
}

fn ended_by(node_id: &str, at: i64) -> Envelope {
    by(
        node(node_id),
        EventData::LeaseEnded(fixtures::ended(LEASE, node_id, t(at), EndReason::Completed)),
    )
}

fn stop_by(actor: Actor) -> Envelope {
    by(
        actor,
        EventData::LeaseStopRequested(LeaseStopRequested { lease_id: LEASE }),
    )
}

/// A lease requested and placed on `node-c`.
fn placed_on_c() -> Authority {
    let mut authority = Authority::default();
    authority.admit(&requested()).unwrap();
    authority.admit(&placed_on("node-c")).unwrap();
    authority
}

#[test]
fn only_the_node_a_lease_is_placed_on_may_report_on_it() {
    let mut authority = placed_on_c();
    for forged in [
        ended_by("node-a", 10),
        started_by("node-a", 10),
        stop_by(node("node-a")),
    ] {
        let refused = authority.admit(&forged).unwrap_err();
        assert!(
            refused.detail.contains("placed on node \"node-c\""),
            "{refused}"
        );
    }
    assert_eq!(
        authority.lease(LEASE).unwrap().node_id.as_deref(),
        Some("node-c")
    );
    authority.admit(&started_by("node-c", 10)).unwrap();
    authority.admit(&ended_by("node-c", 20)).unwrap();
    assert_eq!(authority.lease(LEASE), None);
    // Ended: no node holds it any more, its own neither.
    let late = authority.admit(&ended_by("node-c", 30)).unwrap_err();
    assert!(late.detail.contains("unknown or has ended"), "{late}");
    // Late, not hostile: counted apart, no page.
    assert_eq!(late.reason, SkipReason::StaleReport, "{late}");
    assert_eq!(authority.held_leases(), 0);
}

#[test]
fn a_node_reports_only_as_itself() {
    let mut authority = placed_on_c();
    // node-a's credential, the lease's node in the payload.
    let mut forged = ended_by("node-c", 10);
    forged.actor = node("node-a");
    assert!(authority.admit(&forged).is_err());
    // The holder's credential, another node in the payload.
    let mut aliased = ended_by("node_c", 10);
    aliased.actor = node("node-c");
    assert!(authority.admit(&aliased).is_err());
    // An end that names no node would be dated by nobody's clock.
    let mut unnamed = ended_by("node-c", 10);
    if let EventData::LeaseEnded(e) = &mut unnamed.data {
        e.node_id = None;
    }
    let refused = authority.admit(&unnamed).unwrap_err();
    assert!(refused.detail.contains("naming no node"), "{refused}");
    // A registration of another node's name: the alias `gpu.1` of `gpu_1`
    // shares its subject token, never its identity.
    let mut alias = EventData::NodeRegistered(fixtures::node(
        "gpu.1",
        "z",
        8,
        fixtures::MODEL,
        fixtures::MODEL_VRAM_GB,
    ));
    assert!(authority.admit(&by(node("gpu_1"), alias.clone())).is_err());
    if let EventData::NodeRegistered(n) = &mut alias {
        n.node_id = "gpu_1".into();
    }
    let mut enrollment = enrolled("gpu_1");
    enrollment.gpu_models = vec![fixtures::MODEL.into()];
    authority
        .admit(&by(Actor::Admin, EventData::NodeEnrolled(enrollment)))
        .unwrap();
    assert!(authority.admit(&by(node("gpu_1"), alias)).is_ok());
    // `gpu.1` itself was never enrolled: its own registration is refused too.
    let own = EventData::NodeRegistered(fixtures::node(
        "gpu.1",
        "z",
        1,
        fixtures::MODEL,
        fixtures::MODEL_VRAM_GB,
    ));
    assert!(authority.admit(&by(node("gpu.1"), own)).is_err());
    assert_eq!(
        authority.lease(LEASE).unwrap().node_id.as_deref(),
        Some("node-c")
    );
}

#[test]
fn a_suspended_or_moved_lease_leaves_its_node() {
    let mut authority = placed_on_c();
    authority.admit(&started_by("node-c", 0)).unwrap();
    let suspended = by(
        node("node-c"),
        EventData::LeaseSuspended(LeaseSuspended {
            lease_id: LEASE,
            node_id: "node-c".into(),
            gpu_indices: vec![0],
            suspended_at: t(60),
            reason: "idle".into(),
        }),
    );
    authority.admit(&suspended).unwrap();
    assert!(authority.admit(&started_by("node-c", 70)).is_err());
    authority.admit(&placed_on("node-c")).unwrap();
    authority.admit(&started_by("node-c", 80)).unwrap();
    let moved = by(
        scheduler(),
        EventData::LeaseMigrated(LeaseMigrated {
            lease_id: LEASE,
            reason: "node lost".into(),
            from_node_id: "node-c".into(),
            from_gpu_indices: vec![0],
            billing_ends_at: t(90),
            to: Some(Relocation {
                node_id: "node-b".into(),
                zone: "zone-a".into(),
                vram_gb_per_gpu: 80,
                gpus: fixtures::placed(LEASE, "node-b", "zone-a", fixtures::MODEL, 80, &[1]).gpus,
                decision: fixtures::placed(LEASE, "node-b", "zone-a", fixtures::MODEL, 80, &[1])
                    .decision,
            }),
        }),
    );
    authority.admit(&moved).unwrap();
    // The lost node comes back and reports what it ran: no longer its, and
    // counted as stale, not as an attack. Another node is an attack still.
    let late = authority.admit(&ended_by("node-c", 100)).unwrap_err();
    assert_eq!(late.reason, SkipReason::StaleReport, "{late}");
    let foreign = authority.admit(&ended_by("node-x", 100)).unwrap_err();
    assert_eq!(foreign.reason, SkipReason::NotAuthorized, "{foreign}");
    authority.admit(&started_by("node-b", 100)).unwrap();
    assert_eq!(authority.lease(LEASE).unwrap().started_at, Some(t(100)));
}

#[test]
fn an_end_before_its_start_is_held_to_the_start() {
    let mut authority = placed_on_c();
    authority.admit(&started_by("node-c", 50)).unwrap();
    let early = ended_by("node-c", 20);
    let taken = authority.admit(&early).unwrap();
    match &taken.data {
        EventData::LeaseEnded(e) => assert_eq!(e.ended_at, t(50)),
        other => panic!("{other:?}"),
    }
    // In order, the event is taken as it is.
    let mut authority = placed_on_c();
    authority.admit(&started_by("node-c", 50)).unwrap();
    let end = ended_by("node-c", 60);
    assert!(matches!(authority.admit(&end).unwrap(), Cow::Borrowed(_)));
}

#[test]
fn a_tenant_acts_only_on_its_own_leases() {
    let mut authority = placed_on_c();
    let refused = authority
        .admit(&stop_by(Actor::Tenant(OTHER_TENANT)))
        .unwrap_err();
    assert!(refused.detail.contains("another tenant"), "{refused}");
    authority.admit(&stop_by(Actor::Tenant(TENANT))).unwrap();
    // A request in another tenant's name.
    let other_lease = Uuid::from_u128(99);
    let mut forged = by(
        Actor::Tenant(OTHER_TENANT),
        EventData::LeaseRequested(fixtures::whole_request(
            other_lease,
            TENANT,
            1,
            fixtures::MODEL,
        )),
    );
    assert!(authority.admit(&forged).is_err());
    // A request under an id another tenant holds.
    forged = by(
        Actor::Tenant(OTHER_TENANT),
        EventData::LeaseRequested(fixtures::whole_request(
            LEASE,
            OTHER_TENANT,
            1,
            fixtures::MODEL,
        )),
    );
    assert!(authority.admit(&forged).is_err());
    // Operators and the services act on any lease.
    for actor in [Actor::Admin, Actor::Service("lh-pricing".into())] {
        authority.admit(&stop_by(actor)).unwrap();
    }
    // A stop that arrives after the lease ended changes nothing and is let by.
    authority.admit(&started_by("node-c", 0)).unwrap();
    authority.admit(&ended_by("node-c", 5)).unwrap();
    authority.admit(&stop_by(Actor::Tenant(TENANT))).unwrap();
}

#[test]
fn a_restatement_carries_only_what_was_obeyed() {
    let history: Vec<StatedEvent> = [
        requested(),
        placed_on("node-c"),
        ended_by("node-a", 5),
        started_by("node-c", 10),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, envelope)| StatedEvent {
        sequence: i as u64 + 1,
        stored_at: t(i as i64),
        envelope: Box::new(envelope),
    })
    .collect();
    let restated = by(
        scheduler(),
        EventData::LeaseRestated(LeaseRestated {
            lease_id: LEASE,
            tenant_id: TENANT,
            history,
        }),
    );
    let mut authority = Authority::default();
    let taken = authority.admit(&restated).unwrap();
    let EventData::LeaseRestated(taken) = &taken.data else {
        panic!("not a restatement");
    };
    let kept: Vec<&str> = taken
        .history
        .iter()
        .map(|e| e.envelope.event_type.as_str())
        .collect();
    assert_eq!(kept, ["lease.requested", "lease.placed", "lease.started"]);
    assert_eq!(
        authority.lease(LEASE),
        Some(&LeaseHold {
            tenant_id: Some(TENANT),
            node_id: Some("node-c".into()),
            started_at: Some(t(10)),
            previous_node: None,
            members: Vec::new(),
            previous_members: Vec::new(),
        })
    );
    // A reader that read it all before gets the same holds.
    let mut read_through = Authority::default();
    for e in [requested(), placed_on("node-c"), started_by("node-c", 10)] {
        read_through.admit(&e).unwrap();
    }
    assert_eq!(read_through, authority);
}

#[test]
fn the_scheduler_ends_what_no_node_runs() {
    let mut authority = placed_on_c();
    let mut end = ended_by("node-c", 10);
    end.actor = scheduler();
    if let EventData::LeaseEnded(e) = &mut end.data {
        e.node_id = None;
    }
    authority.admit(&end).unwrap();
    assert_eq!(authority.held_leases(), 0);
}

#[test]
fn holds_survive_a_snapshot() {
    let mut authority = placed_on_c();
    authority.admit(&started_by("node-c", 1)).unwrap();
    let json = serde_json::to_string(&authority).unwrap();
    let back: Authority = serde_json::from_str(&json).unwrap();
    assert_eq!(back, authority);
}

fn enrolled(node_id: &str) -> lh_events::NodeEnrolled {
    lh_events::NodeEnrolled {
        node_id: node_id.into(),
        zone: "z".into(),
        max_gpus: 8,
        gpu_models: vec![fixtures::MODEL.into()],
        max_isolation: lh_events::Isolation::Container,
        gpu_sharing: vec![lh_events::GpuSharing::HamiCore],
    }
}

fn registration(node_id: &str, gpus: u32) -> lh_events::NodeRegistered {
    fixtures::node(node_id, "z", gpus, fixtures::MODEL, fixtures::MODEL_VRAM_GB)
}

#[test]
fn a_node_registers_only_within_its_enrollment() {
    let mut authority = Authority::default();
    let register = |authority: &mut Authority, r: lh_events::NodeRegistered| {
        let envelope = by(node(&r.node_id.clone()), EventData::NodeRegistered(r));
        authority.admit(&envelope).map(|_| ())
    };
    let refused = register(&mut authority, registration("gpu-1", 8)).unwrap_err();
    assert!(refused.detail.contains("no operator enrolled"), "{refused}");
    assert_eq!(refused.reason, SkipReason::NotEnrolled);
    authority
        .admit(&by(
            Actor::Admin,
            EventData::NodeEnrolled(enrolled("gpu-1")),
        ))
        .unwrap();
    register(&mut authority, registration("gpu-1", 8)).unwrap();
    register(&mut authority, registration("gpu-1", 4)).unwrap();
    type Spoil = fn(&mut lh_events::NodeRegistered);
    let beyond: [(Spoil, &str); 7] = [
        (|r| r.gpus.push(r.gpus[0].clone()), "9 GPUs"),
        (|r| r.zone = "residency-zone".into(), "zone"),
        (
            |r| r.gpus[1].model = "H100-80GB".into(),
            "not an enrolled model",
        ),
        (|r| r.gpus[1].vram_gb = 4096, "GB"),
        (|r| r.gpus[1].index = 0, "twice"),
        (|r| r.gpu_sharing = lh_events::GpuSharing::Mps, "sharing"),
        (|r| r.gpus[1].uuid = r.gpus[0].uuid.clone(), "twice"),
    ];
    for (spoil, why) in beyond {
        let mut r = registration("gpu-1", 8);
        spoil(&mut r);
        let refused = register(&mut authority, r).unwrap_err();
        assert!(refused.detail.contains(why), "{why}: {refused}");
        assert_eq!(refused.reason, SkipReason::NotAuthorized);
    }
    // Within a narrower enrollment, the same claim is refused.
    let mut narrow = enrolled("gpu-1");
    narrow.max_isolation = lh_events::Isolation::Cgroup;
    authority
        .admit(&by(Actor::Admin, EventData::NodeEnrolled(narrow)))
        .unwrap();
    let mut r = registration("gpu-1", 8);
    r.isolation = lh_events::Isolation::Container;
    assert!(register(&mut authority, r).is_err());
}

#[test]
fn a_node_restatement_keeps_its_enrollment_and_drops_what_it_did_not_allow() {
    let stated = |sequence: u64, envelope: Envelope| StatedEvent {
        sequence,
        stored_at: t(sequence as i64),
        envelope: Box::new(envelope),
    };
    let mut forged = registration("gpu-1", 8);
    forged.zone = "elsewhere".into();
    let history = vec![
        stated(
            1,
            by(Actor::Admin, EventData::NodeEnrolled(enrolled("gpu-1"))),
        ),
        stated(2, by(node("gpu-1"), EventData::NodeRegistered(forged))),
        stated(
            3,
            by(
                node("gpu-1"),
                EventData::NodeRegistered(registration("gpu-1", 2)),
            ),
        ),
    ];
    let restated = by(
        scheduler(),
        EventData::NodeRestated(lh_events::NodeRestated {
            node_id: "gpu-1".into(),
            history,
        }),
    );
    let mut authority = Authority::default();
    let taken = authority.admit(&restated).unwrap();
    let EventData::NodeRestated(taken) = &taken.data else {
        panic!()
    };
    let kept: Vec<u64> = taken.history.iter().map(|e| e.sequence).collect();
    assert_eq!(kept, [1, 3]);
    assert_eq!(authority.enrollment("gpu-1"), Some(&enrolled("gpu-1")));
}

#[test]
fn a_node_restatement_counts_registrations_within_the_newest_enrollment_a_reader_has() {
    let stated = |sequence: u64, envelope: Envelope| StatedEvent {
        sequence,
        stored_at: t(sequence as i64),
        envelope: Box::new(envelope),
    };
    let wide = enrolled("gpu-1");
    let mut narrow = enrolled("gpu-1");
    narrow.max_gpus = 4;
    let history = vec![
        stated(1, by(Actor::Admin, EventData::NodeEnrolled(wide))),
        stated(
            2,
            by(
                node("gpu-1"),
                EventData::NodeRegistered(registration("gpu-1", 8)),
            ),
        ),
        stated(
            3,
            by(
                node("gpu-1"),
                EventData::NodeRegistered(registration("gpu-1", 2)),
            ),
        ),
    ];
    let restated = by(
        scheduler(),
        EventData::NodeRestated(lh_events::NodeRestated {
            node_id: "gpu-1".into(),
            history,
        }),
    );
    // A reader that read the narrower enrollment since.
    let mut reader = Authority::default();
    let narrower = by(Actor::Admin, EventData::NodeEnrolled(narrow.clone()));
    reader.admit(&narrower).unwrap();
    let taken = reader.admit(&restated).unwrap();
    let EventData::NodeRestated(taken) = &taken.data else {
        panic!()
    };
    let kept: Vec<u64> = taken.history.iter().map(|e| e.sequence).collect();
    assert_eq!(kept, [1, 3], "eight GPUs are beyond the newest enrollment");
    assert_eq!(reader.enrollment("gpu-1"), Some(&narrow));
    // One new to the node takes the restatement's.
    let mut fresh = Authority::default();
    let taken = fresh.admit(&restated).unwrap();
    let EventData::NodeRestated(taken) = &taken.data else {
        panic!()
    };
    assert_eq!(taken.history.len(), 3);
    assert_eq!(fresh.enrollment("gpu-1").map(|e| e.max_gpus), Some(8));
}

#[test]
fn a_restatement_that_left_out_the_placement_keeps_the_hold_a_reader_has() {
    let mut authority = placed_on_c();
    authority.admit(&started_by("node-c", 1)).unwrap();
    // History cut to its request and the newest events: no placement.
    let history: Vec<StatedEvent> = [requested(), started_by("node-c", 1)]
        .into_iter()
        .enumerate()
        .map(|(i, envelope)| StatedEvent {
            sequence: i as u64 + 1,
            stored_at: t(i as i64),
            envelope: Box::new(envelope),
        })
        .collect();
    let restated = by(
        scheduler(),
        EventData::LeaseRestated(LeaseRestated {
            lease_id: LEASE,
            tenant_id: TENANT,
            history,
        }),
    );
    authority.admit(&restated).unwrap();
    assert_eq!(
        authority.lease(LEASE).unwrap().node_id.as_deref(),
        Some("node-c")
    );
    authority.admit(&ended_by("node-c", 9)).unwrap();
}

/// A lease requested and placed as a gang on `node-c` and `node-d`.
fn gang_on_c_and_d() -> Authority {
    let mut authority = Authority::default();
    authority.admit(&requested()).unwrap();
    let EventData::LeasePlaced(mut p) = placed_on("node-c").data else {
        unreachable!()
    };
    p.members = ["node-c", "node-d"]
        .into_iter()
        .map(|n| lh_events::LeaseMember {
            node_id: n.into(),
            zone: "zone-a".into(),
            address: n.into(),
            gpus: p.gpus.clone(),
        })
        .collect();
    authority
        .admit(&by(scheduler(), EventData::LeasePlaced(p)))
        .unwrap();
    authority
}

#[test]
fn every_member_of_a_gang_reports_on_its_part_and_no_other_node_does() {
    let mut authority = gang_on_c_and_d();
    assert_eq!(
        authority.lease(LEASE).map(|h| h.members.clone()),
        Some(vec!["node-d".to_string()])
    );
    assert!(authority.admit(&started_by("node-c", 1)).is_ok());
    assert!(authority.admit(&started_by("node-d", 2)).is_ok());
    let refused = authority.admit(&started_by("node-e", 3)).unwrap_err();
    assert_eq!(refused.reason, SkipReason::NotAuthorized);
    // A member's failure ends the gang; nothing holds it after.
    assert!(authority.admit(&ended_by("node-d", 4)).is_ok());
    assert_eq!(authority.lease(LEASE), None);
    let late = authority.admit(&ended_by("node-c", 5)).unwrap_err();
    assert_eq!(late.reason, SkipReason::StaleReport);
}

#[test]
fn a_late_report_of_a_gangs_former_member_is_stale_not_an_attack() {
    let mut authority = gang_on_c_and_d();
    // node-c is lost: the whole gang goes back to the queue.
    authority
        .admit(&by(
            scheduler(),
            EventData::LeaseMigrated(lh_events::LeaseMigrated {
                lease_id: LEASE,
                reason: "node node-c lost".into(),
                from_node_id: "node-c".into(),
                from_gpu_indices: vec![0],
                billing_ends_at: chrono::Utc::now(),
                to: None,
            }),
        ))
        .unwrap();
    // node-d's report, sent before it heard of the move, comes after it.
    let late = authority.admit(&started_by("node-d", 1)).unwrap_err();
    assert_eq!(late.reason, SkipReason::StaleReport, "{late}");
    // Placed again on node-e alone: node-d's late word is still stale, and
    // a node that never held it is still refused as an attack.
    authority
        .admit(&by(
            scheduler(),
            EventData::LeasePlaced(match placed_on("node-e").data {
                EventData::LeasePlaced(p) => p,
                _ => unreachable!(),
            }),
        ))
        .unwrap();
    let late = authority.admit(&started_by("node-d", 2)).unwrap_err();
    assert_eq!(late.reason, SkipReason::StaleReport, "{late}");
    let forged = authority.admit(&started_by("node-f", 3)).unwrap_err();
    assert_eq!(forged.reason, SkipReason::NotAuthorized, "{forged}");
    assert!(authority.admit(&started_by("node-e", 4)).is_ok());
}
