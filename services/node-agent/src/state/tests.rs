//! Given what the log says about a lease on this node, when the agent
//! decides at some instant, then these steps.

use super::*;
use lh_events::{Actor, LeasePreemptionNoticed, LeaseStopRequested, StatedEvent, WorkloadSpec};

const NODE: &str = "node-a";

fn t(s: i64) -> DateTime<Utc> {
    "2026-12-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + chrono::Duration::seconds(s)
}

fn lease_id() -> Uuid {
    Uuid::from_u128(7)
}

fn given(lease: LocalLease) -> NodeState {
    let mut state = NodeState::default();
    state.leases.insert(lease_id(), lease);
    state
}

/// Placed here at sequence 10, not started yet.
fn placed() -> LocalLease {
    LocalLease {
        subject_sequence: 10,
        placement_sequence: 10,
        ..LocalLease::default()
    }
}

/// Placed and started, its workload running.
fn running() -> LocalLease {
    LocalLease {
        started: true,
        workload_running: true,
        subject_sequence: 11,
        ..placed()
    }
}

fn exited(code: i32) -> Option<Exit> {
    Some(Exit {
        code: Some(code),
        signal: None,
    })
}

fn when(state: &mut NodeState, sequence: u64, data: EventData) {
    let envelope = Envelope::new(Actor::Admin, t(0), data);
    state.apply(NODE, sequence, &envelope);
}

fn end(reason: EndReason, exit_code: Option<i32>) -> Vec<LeaseStep> {
    vec![LeaseStep::End {
        lease_id: lease_id(),
        reason,
        exit_code,
    }]
}

#[test]
fn a_lease_placed_here_starts() {
    let state = given(placed());
    assert_eq!(
        state.decide(t(0)),
        [LeaseStep::Start {
            lease_id: lease_id()
        }]
    );
}

#[test]
fn a_running_lease_with_nothing_asked_needs_nothing() {
    assert_eq!(given(running()).decide(t(0)), []);
}

#[test]
fn a_stop_request_stops_a_running_workload_first() {
    let mut state = given(running());
    when(
        &mut state,
        12,
        EventData::LeaseStopRequested(LeaseStopRequested {
            lease_id: lease_id(),
        }),
    );
    assert_eq!(state.leases[&lease_id()].subject_sequence, 12);
    assert_eq!(
        state.decide(t(0)),
        [LeaseStep::StopWorkload {
            lease_id: lease_id()
        }]
    );
}

#[test]
fn a_stopped_workload_is_waited_for_then_the_lease_ends_stopped() {
    let stopping = LocalLease {
        stop_requested: true,
        stopping: true,
        workload_running: false,
        ..running()
    };
    assert_eq!(given(stopping.clone()).decide(t(0)), []);
    let gone = LocalLease {
        exit: Some(Exit {
            code: None,
            signal: Some(15),
        }),
        ..stopping
    };
    assert_eq!(given(gone).decide(t(0)), end(EndReason::Stopped, None));
}

#[test]
fn a_stop_request_without_a_workload_ends_the_lease_at_once() {
    let simulated = LocalLease {
        stop_requested: true,
        workload_running: false,
        ..running()
    };
    assert_eq!(given(simulated).decide(t(0)), end(EndReason::Stopped, None));
}

#[test]
fn a_lease_stopped_before_it_started_is_cancelled() {
    let state = given(LocalLease {
        stop_requested: true,
        ..placed()
    });
    assert_eq!(state.decide(t(0)), end(EndReason::Cancelled, None));
}

#[test]
fn a_preemption_ends_the_lease_once_its_deadline_has_passed() {
    let mut state = given(LocalLease {
        workload_running: false,
        ..running()
    });
    when(
        &mut state,
        12,
        EventData::LeasePreemptionNoticed(LeasePreemptionNoticed {
            lease_id: lease_id(),
            node_id: NODE.into(),
            preempted_for: Uuid::from_u128(8),
            deadline: t(30),
            reason: Default::default(),
        }),
    );
    assert_eq!(state.decide(t(29)), []);
    assert_eq!(state.decide(t(30)), end(EndReason::Preempted, None));
    assert_eq!(state.decide(t(31)), end(EndReason::Preempted, None));
}

#[test]
fn a_preemption_due_stops_a_running_workload_first() {
    let state = given(LocalLease {
        preemption_deadline: Some(t(30)),
        ..running()
    });
    assert_eq!(
        state.decide(t(30)),
        [LeaseStep::StopWorkload {
            lease_id: lease_id()
        }]
    );
}

#[test]
fn a_workload_that_exits_on_its_own_ends_the_lease_by_its_code() {
    let done = |code| LocalLease {
        exit: exited(code),
        workload_running: false,
        ..running()
    };
    assert_eq!(
        given(done(0)).decide(t(0)),
        end(EndReason::Completed, Some(0))
    );
    // A failure waits out the hold: a GPU fault may yet explain it.
    let failed = given(LocalLease {
        exited_at: Some(t(0)),
        ..done(3)
    });
    assert_eq!(failed.decide(t(0)), []);
    assert_eq!(failed.decide(t(4)), []);
    assert_eq!(failed.decide(t(5)), end(EndReason::Failed, Some(3)));
}

/// Placed and started on GPU 0, its workload just killed (SIGKILL, heard
/// at `t(0)`); the hold is 5 s, the wait for a move 120 s.
fn killed() -> LocalLease {
    LocalLease {
        gpus: vec![AssignedGpu {
            index: 0,
            uuid: "GPU-0".into(),
            milli: None,
            vram_gb: None,
            mig_instance: None,
        }],
        exit: Some(Exit {
            code: None,
            signal: Some(9),
        }),
        exited_at: Some(t(0)),
        workload_running: false,
        ..running()
    }
}

fn health_of_gpu_0(state: &mut NodeState, sequence: u64, to: GpuHealth) {
    when(
        state,
        sequence,
        EventData::NodeGpuHealthChanged(lh_events::NodeGpuHealthChanged {
            node_id: NODE.into(),
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            from: GpuHealth::Healthy,
            to,
            reason: "critical XID 79".into(),
            evidence: Default::default(),
            at: t(0),
        }),
    );
}

fn moved_off_gpu_0(state: &mut NodeState, sequence: u64) {
    when(
        state,
        sequence,
        EventData::LeaseMigrated(lh_events::LeaseMigrated {
            lease_id: lease_id(),
            reason: lh_domain::moves::gpu_unhealthy(0, NODE),
            from_node_id: NODE.into(),
            from_gpu_indices: vec![0],
            billing_ends_at: t(0),
            to: None,
        }),
    );
}

#[test]
fn a_workload_killed_on_a_gpu_the_tracker_holds_unhealthy_is_held_for_the_move() {
    let mut state = given(killed());
    state.unhealthy_gpus.insert(0);
    // Not failed, however long the scheduler takes within the wait.
    assert_eq!(state.decide(t(0)), []);
    assert_eq!(state.decide(t(60)), []);
    assert!(
        state.holding().any(|(id, _)| *id == lease_id()),
        "its GPUs stay its own"
    );
    // The scheduler's move ends it here, with nothing reported.
    moved_off_gpu_0(&mut state, 12);
    assert_eq!(
        state.decide(t(61)),
        [LeaseStep::Leave {
            lease_id: lease_id()
        }]
    );
}

#[test]
fn a_gpu_turning_unhealthy_within_the_hold_after_the_exit_holds_the_lease() {
    let mut state = given(killed());
    assert_eq!(state.decide(t(1)), []);
    // The log's health counts as well as the tracker's.
    health_of_gpu_0(&mut state, 12, GpuHealth::Unhealthy);
    assert_eq!(state.decide(t(6)), [], "held past the hold");
    assert_eq!(state.decide(t(119)), []);
    moved_off_gpu_0(&mut state, 13);
    assert_eq!(
        state.decide(t(120)),
        [LeaseStep::Leave {
            lease_id: lease_id()
        }]
    );
}

#[test]
fn a_killed_workload_whose_gpus_stay_healthy_through_the_hold_fails() {
    let state = given(killed());
    assert_eq!(state.decide(t(4)), []);
    assert_eq!(state.decide(t(5)), end(EndReason::Failed, None));
    // Degraded is not a fault that kills.
    let mut state = given(killed());
    health_of_gpu_0(&mut state, 12, GpuHealth::Degraded);
    assert_eq!(state.decide(t(5)), end(EndReason::Failed, None));
}

#[test]
fn a_lease_held_for_a_gpu_fault_fails_when_no_move_comes_in_time() {
    let mut state = given(killed());
    state.unhealthy_gpus.insert(0);
    assert_eq!(state.decide(t(119)), []);
    assert_eq!(
        state.decide(t(120)),
        [LeaseStep::EndUnmoved {
            lease_id: lease_id(),
            exit_code: None,
        }]
    );
    // The limits are the agent's flags.
    state.fault_hold.move_wait = std::time::Duration::from_secs(10);
    assert!(matches!(
        state.decide(t(10))[..],
        [LeaseStep::EndUnmoved { .. }]
    ));
}

#[test]
fn an_application_xid_is_the_workloads_own_failure() {
    let mut state = given(LocalLease {
        exit: exited(1),
        ..killed()
    });
    when(
        &mut state,
        12,
        EventData::LeaseGpuFault(lh_events::LeaseGpuFault {
            lease_id: lease_id(),
            node_id: NODE.into(),
            gpu_index: 0,
            xid: 13,
            at: t(0),
        }),
    );
    // No hold: the XID says whose fault it was.
    assert_eq!(state.decide(t(0)), end(EndReason::Failed, Some(1)));
}

#[test]
fn a_stop_while_held_for_a_gpu_fault_ends_the_lease_stopped() {
    let mut state = given(killed());
    state.unhealthy_gpus.insert(0);
    when(
        &mut state,
        12,
        EventData::LeaseStopRequested(LeaseStopRequested {
            lease_id: lease_id(),
        }),
    );
    assert_eq!(state.decide(t(1)), end(EndReason::Stopped, None));
}

#[test]
fn a_workload_that_completes_on_an_unhealthy_gpu_completes() {
    let mut state = given(LocalLease {
        exit: exited(0),
        ..killed()
    });
    state.unhealthy_gpus.insert(0);
    assert_eq!(state.decide(t(0)), end(EndReason::Completed, Some(0)));
}

#[test]
fn an_idle_lease_under_suspend_stops_its_workload_then_is_suspended() {
    let idle = LocalLease {
        suspend_requested: true,
        ..running()
    };
    assert_eq!(
        given(idle.clone()).decide(t(0)),
        [LeaseStep::StopWorkload {
            lease_id: lease_id()
        }]
    );
    let stopped = LocalLease {
        workload_running: false,
        stopping: true,
        exit: exited(143),
        ..idle
    };
    assert_eq!(
        given(stopped).decide(t(0)),
        [LeaseStep::Suspend {
            lease_id: lease_id()
        }]
    );
}

#[test]
fn a_workload_that_finished_before_its_suspension_ends_the_lease() {
    let state = given(LocalLease {
        suspend_requested: true,
        workload_running: false,
        exit: exited(0),
        ..running()
    });
    assert_eq!(state.decide(t(0)), end(EndReason::Completed, Some(0)));
}

#[test]
fn a_lease_moved_away_leaves_without_a_report() {
    let state = given(LocalLease {
        moved_away: true,
        ..running()
    });
    assert_eq!(
        state.decide(t(0)),
        [LeaseStep::Leave {
            lease_id: lease_id()
        }]
    );
}

#[test]
fn ended_leases_need_nothing_but_a_workload_still_running_stops() {
    let state = given(LocalLease {
        ended: true,
        stop_requested: true,
        workload_running: false,
        ..running()
    });
    assert_eq!(state.decide(t(0)), []);
    // Ended by another (a gang's other member, the scheduler) while its
    // workload runs here: it stops, and nothing more is reported.
    let state = given(LocalLease {
        ended: true,
        ..running()
    });
    assert_eq!(
        state.decide(t(0)),
        [LeaseStep::Leave {
            lease_id: lease_id()
        }]
    );
}

fn requested_with_workload(lease: Uuid) -> EventData {
    let mut r = lh_events::fixtures::whole_request(lease, Uuid::from_u128(1), 1, "A100-40GB");
    r.workload = Some(WorkloadSpec {
        command: vec!["train".into()],
        image: None,
        env: Default::default(),
        env_ref: None,
        network: Default::default(),
        template: None,
        datasets: Vec::new(),
        workspaces: Vec::new(),
        object_store: false,
    });
    EventData::LeaseRequested(r)
}

#[test]
fn the_fold_keeps_workloads_of_waiting_leases_and_of_its_own_only() {
    let (here, elsewhere, stopped) = (Uuid::from_u128(7), Uuid::from_u128(8), Uuid::from_u128(9));
    let mut state = NodeState::default();
    for (i, lease) in [here, elsewhere, stopped].into_iter().enumerate() {
        when(&mut state, 1 + i as u64, requested_with_workload(lease));
    }
    assert_eq!(state.waiting.len(), 3);
    let placed = |lease, node| {
        EventData::LeasePlaced(lh_events::fixtures::placed(
            lease,
            node,
            "z",
            "A100-40GB",
            40,
            &[0],
        ))
    };
    when(&mut state, 10, placed(here, NODE));
    when(&mut state, 11, placed(elsewhere, "node-b"));
    let ended = lh_events::fixtures::ended(stopped, "-", t(0), EndReason::Cancelled);
    when(&mut state, 12, EventData::LeaseEnded(ended));
    assert!(state.waiting.is_empty(), "{:?}", state.waiting.keys());
    match &state.leases[&here].workload {
        Workload::Known(Some(w)) => assert_eq!(w.command, ["train"]),
        other => panic!("{other:?}"),
    }
}

fn moved_to(lease: Uuid, from: &str, to: &str, gpu: u32) -> EventData {
    let placed = lh_events::fixtures::placed(lease, to, "z", "A100-40GB", 40, &[gpu]);
    EventData::LeaseMigrated(lh_events::LeaseMigrated {
        lease_id: lease,
        reason: "node lost".into(),
        from_node_id: from.into(),
        from_gpu_indices: vec![0],
        billing_ends_at: t(0),
        to: Some(lh_events::Relocation {
            node_id: to.into(),
            zone: "z".into(),
            vram_gb_per_gpu: 40,
            gpus: placed.gpus,
            decision: placed.decision,
        }),
    })
}

/// In the node's view, a lease moved here comes after its request, relayed
/// again: it starts with its workload.
#[test]
fn a_lease_that_comes_here_by_migration_runs_its_relayed_request() {
    let lease = lease_id();
    let mut state = NodeState::default();
    when(&mut state, 1, requested_with_workload(lease));
    when(&mut state, 3, moved_to(lease, "node-b", NODE, 1));
    match &state.leases[&lease].workload {
        Workload::Known(Some(w)) => assert_eq!(w.command, ["train"]),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        state.decide(t(0)),
        vec![LeaseStep::Start { lease_id: lease }]
    );
}

/// Moved to other GPUs of this node, relayed twice (a second replica of
/// the view writer): it stays, placed anew once.
#[test]
fn a_move_within_this_node_folded_twice_leaves_the_lease_here() {
    let lease = lease_id();
    let mut state = NodeState::default();
    when(&mut state, 1, requested_with_workload(lease));
    when(
        &mut state,
        2,
        EventData::LeasePlaced(lh_events::fixtures::placed(
            lease,
            NODE,
            "z",
            "A100-40GB",
            40,
            &[0],
        )),
    );
    let moved = moved_to(lease, NODE, NODE, 1);
    when(&mut state, 3, moved.clone());
    when(&mut state, 3, moved);
    let l = &state.leases[&lease];
    assert!(!l.moved_away);
    assert_eq!((l.placement_sequence, l.gpus[0].index), (3, 1));
    assert_eq!(
        state.decide(t(0)),
        vec![LeaseStep::Start { lease_id: lease }]
    );
}

#[test]
fn a_lease_known_only_from_its_restatement_is_known_here_with_its_workload() {
    let lease = lease_id();
    let placed = EventData::LeasePlaced(lh_events::fixtures::placed(
        lease,
        NODE,
        "z",
        "A100-40GB",
        40,
        &[0],
    ));
    let history: Vec<StatedEvent> = [requested_with_workload(lease), placed.clone()]
        .into_iter()
        .enumerate()
        .map(|(i, data)| StatedEvent {
            sequence: 1 + i as u64,
            stored_at: t(0),
            envelope: Box::new(Envelope::new(Actor::Admin, t(0), data)),
        })
        .collect();
    let restated = lh_domain::restate::restatement(&history).unwrap();
    // An agent that started after the request expired.
    let mut fresh = NodeState::default();
    when(&mut fresh, 40, restated.clone());
    let l = &fresh.leases[&lease];
    assert_eq!(l.subject_sequence, 40);
    match &l.workload {
        Workload::Known(Some(w)) => assert_eq!(w.command, ["train"]),
        other => panic!("{other:?}"),
    }
    // One that folded the history takes only the sequence.
    let mut known = NodeState::default();
    when(&mut known, 1, requested_with_workload(lease));
    when(&mut known, 2, placed);
    let before = known.leases[&lease].clone();
    when(&mut known, 40, restated);
    assert_eq!(known.leases[&lease].subject_sequence, 40);
    assert_eq!(
        known.leases[&lease].placement_sequence,
        before.placement_sequence
    );
}

#[test]
fn a_snapshot_taken_back_knows_what_the_log_said_and_nothing_this_process_did() {
    let lease = lease_id();
    let mut state = NodeState::default();
    when(&mut state, 1, requested_with_workload(lease));
    when(
        &mut state,
        2,
        EventData::LeasePlaced(lh_events::fixtures::placed(
            lease,
            NODE,
            "z",
            "A100-40GB",
            40,
            &[0],
        )),
    );
    when(
        &mut state,
        3,
        EventData::LeaseStarted(lh_events::fixtures::started(lease, NODE, t(0))),
    );
    state.leases.get_mut(&lease).unwrap().workload_running = true;
    let bytes = serde_json::to_vec(&state.snapshot().unwrap()).unwrap();
    let mut restored = NodeState::default();
    assert!(restored.restore(serde_json::from_slice(&bytes).unwrap()));
    let (was, is) = (&state.leases[&lease], &restored.leases[&lease]);
    assert!(is.started && !is.ended);
    assert_eq!(
        (
            is.subject_sequence,
            is.placement_sequence,
            &is.gpus,
            &is.workload
        ),
        (
            was.subject_sequence,
            was.placement_sequence,
            &was.gpus,
            &was.workload
        )
    );
    assert!(!is.workload_running, "what a process did is not kept");
    assert!(!NodeState::default().restore(serde_json::json!({"leases": 1})));
}

/// A gang of two placed on `node-e` (first) and this node, at sequence 10.
fn gang_member() -> NodeState {
    gang_of(&["node-e", NODE], 10)
}

/// A gang placed on `nodes`, in that order, at `sequence`.
fn gang_of(nodes: &[&str], sequence: u64) -> NodeState {
    let mut state = NodeState::default();
    gang_placed(&mut state, nodes, sequence);
    state
}

fn gang_placed(state: &mut NodeState, nodes: &[&str], sequence: u64) {
    let mut placed = lh_events::fixtures::placed(lease_id(), nodes[0], "z", "A100-40GB", 40, &[0]);
    placed.members = nodes
        .iter()
        .map(|n| lh_events::LeaseMember {
            node_id: n.to_string(),
            zone: "z".into(),
            address: format!("{n}.example"),
            gpus: placed.gpus.clone(),
        })
        .collect();
    when(state, sequence, EventData::LeasePlaced(placed));
}

fn part_completed_on(node: &str) -> EventData {
    EventData::LeaseMemberCompleted(lh_events::LeaseMemberCompleted {
        lease_id: lease_id(),
        node_id: node.into(),
    })
}

fn started_on(node: &str) -> EventData {
    EventData::LeaseStarted(lh_events::fixtures::started(lease_id(), node, t(1)))
}

#[test]
fn a_gangs_member_starts_its_own_part_whatever_the_others_did() {
    let mut state = gang_member();
    let part = state.leases[&lease_id()]
        .gang
        .clone()
        .expect("a gang's part");
    assert_eq!((part.node_rank, part.members.len()), (1, 2));
    assert_eq!(
        state.decide(t(1)),
        [LeaseStep::Start {
            lease_id: lease_id()
        }]
    );
    // The first member's start is not this one's.
    when(&mut state, 11, started_on("node-e"));
    assert!(!state.leases[&lease_id()].started);
    when(&mut state, 12, started_on(NODE));
    assert!(state.leases[&lease_id()].started);
}

#[test]
fn a_gangs_later_member_reports_only_its_failure_and_stops_when_the_gang_ends() {
    let mut state = gang_member();
    when(&mut state, 11, started_on(NODE));
    let lease = state.leases.get_mut(&lease_id()).unwrap();
    lease.exit = exited(0);
    // Its part completed: it says so, once, and its GPUs stay the gang's
    // until the first ends it.
    assert_eq!(
        state.decide(t(2)),
        [LeaseStep::PartCompleted {
            lease_id: lease_id()
        }]
    );
    when(&mut state, 12, part_completed_on(NODE));
    assert_eq!(state.decide(t(2)), []);
    state.leases.get_mut(&lease_id()).unwrap().exit = exited(3);
    assert_eq!(state.decide(t(2)), end(EndReason::Failed, Some(3)));

    // Running when another member ends the gang: it stops, unreported.
    let mut state = gang_member();
    when(&mut state, 11, started_on(NODE));
    state.leases.get_mut(&lease_id()).unwrap().workload_running = true;
    when(
        &mut state,
        13,
        EventData::LeaseEnded(lh_events::fixtures::ended(
            lease_id(),
            "node-e",
            t(3),
            EndReason::Completed,
        )),
    );
    assert_eq!(
        state.decide(t(3)),
        [LeaseStep::Leave {
            lease_id: lease_id()
        }]
    );
}

#[test]
fn a_gang_moved_away_from_another_member_leaves_this_one_too() {
    let mut state = gang_member();
    when(&mut state, 11, started_on(NODE));
    state.leases.get_mut(&lease_id()).unwrap().workload_running = true;
    when(
        &mut state,
        12,
        EventData::LeaseMigrated(lh_events::LeaseMigrated {
            lease_id: lease_id(),
            reason: "node node-e lost".into(),
            from_node_id: "node-e".into(),
            from_gpu_indices: vec![0],
            billing_ends_at: t(2),
            to: None,
        }),
    );
    assert_eq!(
        state.decide(t(3)),
        [LeaseStep::Leave {
            lease_id: lease_id()
        }]
    );
}

#[test]
fn a_gangs_first_member_completes_it_only_once_every_part_has() {
    let mut state = gang_of(&[NODE, "node-b", "node-c"], 10);
    when(&mut state, 11, started_on(NODE));
    state.leases.get_mut(&lease_id()).unwrap().exit = exited(0);
    // Its own part is done; the others still run.
    assert_eq!(state.decide(t(2)), []);
    when(&mut state, 12, part_completed_on("node-c"));
    assert_eq!(state.decide(t(3)), []);
    when(&mut state, 13, part_completed_on("node-b"));
    assert_eq!(state.decide(t(4)), end(EndReason::Completed, Some(0)));

    // A later part failing ends it; the first's part, still running, stops.
    let mut state = gang_of(&[NODE, "node-b"], 10);
    when(&mut state, 11, started_on(NODE));
    state.leases.get_mut(&lease_id()).unwrap().workload_running = true;
    when(
        &mut state,
        12,
        EventData::LeaseEnded(lh_events::fixtures::ended(
            lease_id(),
            "node-b",
            t(3),
            EndReason::Failed,
        )),
    );
    assert_eq!(
        state.decide(t(4)),
        [LeaseStep::Leave {
            lease_id: lease_id()
        }]
    );
}

#[test]
fn a_parts_completion_counts_for_its_placement_only() {
    let mut state = gang_of(&[NODE, "node-b"], 10);
    when(&mut state, 11, part_completed_on("node-b"));
    // Placed afresh (the gang moved whole and came back): node-b's part of
    // the new placement has not completed.
    gang_placed(&mut state, &[NODE, "node-b"], 20);
    when(&mut state, 21, started_on(NODE));
    state.leases.get_mut(&lease_id()).unwrap().exit = exited(0);
    assert_eq!(state.decide(t(5)), []);
    when(&mut state, 22, part_completed_on("node-b"));
    assert_eq!(state.decide(t(6)), end(EndReason::Completed, Some(0)));
}

fn idle_reported_by(node: &str, action: lh_events::IdleAction) -> EventData {
    EventData::LeaseIdleDetected(lh_events::LeaseIdleDetected {
        lease_id: lease_id(),
        node_id: node.into(),
        idle_since: t(0),
        window_seconds: 60,
        action,
        at: t(60),
    })
}

#[test]
fn a_gang_is_suspended_by_its_first_members_report_and_by_that_member_alone() {
    use lh_events::IdleAction::Suspend;
    // This node is the later member: its own report is an observation.
    let mut state = gang_member();
    when(&mut state, 11, started_on(NODE));
    state.leases.get_mut(&lease_id()).unwrap().workload_running = true;
    when(&mut state, 12, idle_reported_by(NODE, Suspend));
    let lease = &state.leases[&lease_id()];
    assert!(!lease.suspend_requested);
    assert_eq!(lease.members_idle.get(NODE), Some(&t(60)));
    assert_eq!(state.decide(t(61)), []);
    // The first member's report suspends the gang: this part stops, and
    // the suspension is the first member's to report.
    when(&mut state, 13, idle_reported_by("node-e", Suspend));
    assert_eq!(
        state.decide(t(62)),
        [LeaseStep::StopWorkload {
            lease_id: lease_id()
        }]
    );
    let lease = state.leases.get_mut(&lease_id()).unwrap();
    lease.workload_running = false;
    lease.stopping = true;
    lease.exit = exited(143);
    assert_eq!(state.decide(t(63)), []);

    // The first member reports it.
    let mut state = gang_of(&[NODE, "node-b"], 10);
    when(&mut state, 11, started_on(NODE));
    when(&mut state, 12, idle_reported_by("node-b", Suspend));
    assert!(!state.leases[&lease_id()].suspend_requested);
    when(&mut state, 13, idle_reported_by(NODE, Suspend));
    assert_eq!(
        state.decide(t(64)),
        [LeaseStep::Suspend {
            lease_id: lease_id()
        }]
    );
}

#[test]
fn a_later_part_done_before_its_start_was_on_the_log_reports_the_start_first() {
    let mut state = gang_member();
    state.leases.get_mut(&lease_id()).unwrap().exit = exited(0);
    assert_eq!(
        state.decide(t(1)),
        [LeaseStep::Start {
            lease_id: lease_id()
        }]
    );
    when(&mut state, 11, started_on(NODE));
    assert_eq!(
        state.decide(t(2)),
        [LeaseStep::PartCompleted {
            lease_id: lease_id()
        }]
    );
}
