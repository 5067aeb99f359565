use super::given::*;

#[test]
fn a_silent_node_is_lost_and_its_leases_move_where_there_is_room() {
    let t = Uuid::from_u128(1);
    let (l1, l2) = (Uuid::from_u128(2), Uuid::from_u128(3));
    let t0 = Utc::now();
    let mut s = given(vec![node("a", 2), node("b", 1), tenant(t, 8)]);
    s.apply(10, &env(request(l1, t, 2)));
    settle(&mut s, t0, &Rules::default());
    s.apply(5000, &env(request(l2, t, 1)));
    settle(&mut s, t0, &Rules::default());
    assert_eq!(where_is(&s, l1).0, "a");
    assert_eq!(where_is(&s, l2).0, "b");
    let rules = Rules::default();
    s.liveness_since = Some(t0);
    let s_ago = |secs: i64| t0 + Duration::seconds(secs);
    s.heard("a", s_ago(1) - Duration::milliseconds(7), s_ago(1));
    s.heard("b", s_ago(5), s_ago(5));
    // 3 s of silence is not yet lost.
    assert!(s.liveness_changes(s_ago(4), &rules).is_empty());
    let d = decide_at(&s, s_ago(5), &rules);
    let events = events_of(&d);
    match events[0] {
        EventData::NodeLost(n) => {
            assert_eq!(n.node_id, "a");
            assert_eq!(n.last_heard_at, s_ago(1) - Duration::milliseconds(7));
            assert_eq!(n.silence_ms, 4000);
        }
        other => panic!("{other:?}"),
    }
    // b is full: the 2-GPU lease goes back to the queue, billed until
    // the node's last heartbeat.
    match events[1] {
        EventData::LeaseMigrated(m) => {
            assert_eq!((m.lease_id, m.from_node_id.as_str()), (l1, "a"));
            assert_eq!(m.from_gpu_indices, vec![0, 1]);
            assert_eq!(m.billing_ends_at, s_ago(1) - Duration::milliseconds(7));
            assert!(m.to.is_none());
        }
        other => panic!("{other:?}"),
    }
    settle(&mut s, s_ago(5), &rules);
    assert!(s.fleet.nodes["a"].lost.is_some());
    assert!(!s.fleet.holdings.contains_key(&l1));
    // Back in the queue, announced on the next pass like any request.
    assert_eq!(s.leases[&l1].status, Status::Requested);
    settle(&mut s, s_ago(5), &rules);
    assert!(
        matches!(&s.leases[&l1].status, Status::Queued { reason, .. } if reason.contains("largest node has 1")),
        "{:?}",
        s.leases[&l1].status
    );

    // A new node with room: the lease is placed there, never on a.
    s.apply(9000, &env(node("c", 2)));
    s.heard("b", s_ago(6), s_ago(6));
    s.heard("c", s_ago(6), s_ago(6));
    settle(&mut s, s_ago(6), &rules);
    assert_eq!(where_is(&s, l1).0, "c");

    // a is heard again: it rejoins and takes leases again.
    s.heard("a", s_ago(7), s_ago(7));
    let d = decide_at(&s, s_ago(7), &rules);
    assert!(matches!(events_of(&d)[0], EventData::NodeRejoined(n) if n.node_id == "a"));
    settle(&mut s, s_ago(7), &rules);
    assert!(s.fleet.nodes["a"].lost.is_none());
}

#[test]
fn unhealthy_gpus_shed_their_leases_and_degraded_ones_take_nothing_new() {
    let t = Uuid::from_u128(1);
    let (l1, l2) = (Uuid::from_u128(2), Uuid::from_u128(3));
    let t0 = Utc::now();
    let mut s = given(vec![node("a", 3), tenant(t, 8), request(l1, t, 1)]);
    settle(&mut s, t0, &Rules::default());
    let gpu = where_is(&s, l1).1[0];
    // Another GPU turns degraded: the next lease avoids it and l1's.
    let other = (0..3).find(|g| *g != gpu).unwrap();
    s.apply(9000, &env(health("a", other, GpuHealth::Degraded, t0)));
    s.apply(9001, &env(request(l2, t, 1)));
    settle(&mut s, t0, &Rules::default());
    let free = (0..3).find(|g| *g != gpu && *g != other).unwrap();
    assert_eq!(where_is(&s, l2).1, vec![free]);
    // l1's GPU fails: l1 must move, but the only healthy free GPU is
    // taken and the degraded one takes nothing: back to the queue.
    let failed_at = t0 + Duration::seconds(5);
    s.apply(
        9100,
        &env(health("a", gpu, GpuHealth::Unhealthy, failed_at)),
    );
    let d = decide_at(&s, t0 + Duration::seconds(6), &Rules::default());
    match events_of(&d)[0] {
        EventData::LeaseMigrated(m) => {
            assert_eq!(m.lease_id, l1);
            assert_eq!(m.reason, format!("GPU {gpu} of node a unhealthy"));
            assert_eq!(m.billing_ends_at, failed_at);
            assert!(m.to.is_none());
        }
        other => panic!("{other:?}"),
    }
    settle(&mut s, t0 + Duration::seconds(6), &Rules::default());
    // The degraded GPU recovers: l1 goes there.
    s.apply(9200, &env(health("a", other, GpuHealth::Healthy, t0)));
    settle(&mut s, t0 + Duration::seconds(7), &Rules::default());
    assert_eq!(where_is(&s, l1).1, vec![other]);
}

#[test]
fn a_cordoned_node_takes_nothing_new_and_a_drain_moves_its_leases() {
    let t = Uuid::from_u128(1);
    let (l1, l2) = (Uuid::from_u128(2), Uuid::from_u128(3));
    let t0 = Utc::now();
    let mut s = given(vec![node("a", 1), tenant(t, 8), request(l1, t, 1)]);
    settle(&mut s, t0, &Rules::default());
    s.apply(8000, &env(node("b", 2)));
    let cordon = |drain| {
        EventData::NodeCordoned(NodeCordoned {
            node_id: "b".into(),
            drain,
            reason: "maintenance".into(),
        })
    };
    s.apply(8001, &env(cordon(None)));
    s.apply(8002, &env(request(l2, t, 1)));
    settle(&mut s, t0, &Rules::default());
    assert!(
        !s.fleet.holdings.contains_key(&l2),
        "b is cordoned, a is full"
    );
    s.apply(
        8100,
        &env(EventData::NodeUncordoned(NodeUncordoned {
            node_id: "b".into(),
        })),
    );
    settle(&mut s, t0, &Rules::default());
    assert_eq!(where_is(&s, l2).0, "b");
    // Draining a with `move` sends l1 to b, billed until now.
    s.apply(
        8200,
        &env(EventData::NodeCordoned(NodeCordoned {
            node_id: "a".into(),
            drain: Some(DrainMode::Move),
            reason: "kernel upgrade".into(),
        })),
    );
    let now = t0 + Duration::seconds(9);
    let d = decide_at(&s, now, &Rules::default());
    match events_of(&d)[0] {
        EventData::LeaseMigrated(m) => {
            assert_eq!((m.lease_id, m.reason.as_str()), (l1, "node a drained"));
            assert_eq!(m.billing_ends_at, now);
            assert_eq!(m.to.as_ref().unwrap().node_id, "b");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_lost_node_s_lease_is_placed_again_in_the_same_decision() {
    let t = Uuid::from_u128(1);
    let l1 = Uuid::from_u128(2);
    let t0 = Utc::now();
    let mut s = given(vec![node("a", 1), tenant(t, 8), request(l1, t, 1)]);
    settle(&mut s, t0, &Rules::default());
    s.apply(8000, &env(node("b", 1)));
    s.liveness_since = Some(t0);
    s.heard("b", t0 + Duration::seconds(4), t0 + Duration::seconds(4));
    // a was never heard since the scheduler started.
    let d = decide_at(&s, t0 + Duration::seconds(4), &Rules::default());
    let batch = &d.batches[1];
    match (&batch[0].0.data, &batch[1].0.data) {
        (EventData::LeaseMigrated(m), EventData::NodeGpusAllocated(n)) => {
            assert_eq!(
                m.billing_ends_at, t0,
                "never heard: billed until we started"
            );
            let to = m.to.as_ref().expect("room on b");
            assert_eq!((to.node_id.as_str(), n.node_id.as_str()), ("b", "b"));
            assert_eq!(to.gpus[0].uuid, "GPU-b-0");
        }
        other => panic!("{other:?}"),
    }
    settle(&mut s, t0 + Duration::seconds(4), &Rules::default());
    assert_eq!(where_is(&s, l1).0, "b");
    assert_eq!(s.leases[&l1].status, Status::Holding);
    // Nothing more to do: no second migration, no placement twice.
    let again = decide_at(&s, t0 + Duration::seconds(4), &Rules::default());
    assert!(events_of(&again).is_empty(), "{:?}", events_of(&again));
}

/// Two nodes, one lease on each, both heard live at `t0`.
fn two_busy_nodes(t0: chrono::DateTime<Utc>, rules: &Rules) -> Given {
    let t = Uuid::from_u128(1);
    let mut s = given(vec![
        node("a", 1),
        node("b", 1),
        tenant(t, 8),
        request(Uuid::from_u128(2), t, 1),
        request(Uuid::from_u128(3), t, 1),
    ]);
    settle(&mut s, t0, rules);
    s.liveness_since = Some(t0);
    s.heard_live("a", t0, t0, rules);
    s.heard_live("b", t0, t0, rules);
    s
}

fn lost_nodes(s: &State, now: chrono::DateTime<Utc>, rules: &Rules) -> Vec<String> {
    let mut lost: Vec<String> = s
        .liveness_changes(now, rules)
        .into_iter()
        .filter(|(_, lost)| *lost)
        .map(|(node, _)| node)
        .collect();
    lost.sort();
    lost
}

#[test]
fn a_fleet_wide_silence_is_the_scheduler_s_own_deafness() {
    let rules = Rules::default();
    let t0 = Utc::now();
    let at = |ms: i64| t0 + Duration::milliseconds(ms);
    let mut s = two_busy_nodes(t0, &rules);
    // NATS is down: nobody is heard for 20 s, and nobody is lost.
    assert!(lost_nodes(&s, at(20_000), &rules).is_empty());
    // It is back: a's heartbeat arrives first. b's comes within its
    // period; until the loss window has passed since a's, b is not lost.
    s.heard_live("a", at(20_000), at(20_000), &rules);
    assert!(lost_nodes(&s, at(22_900), &rules).is_empty());
    s.heard_live("b", at(20_800), at(20_800), &rules);
    s.heard_live("a", at(23_000), at(23_000), &rules);
    assert!(lost_nodes(&s, at(23_000), &rules).is_empty());
    // A node that stays silent once the others are heard again is lost.
    s.heard_live("a", at(25_000), at(25_000), &rules);
    assert_eq!(lost_nodes(&s, at(25_000), &rules), ["b"]);
}

#[test]
fn a_fleet_silent_past_the_grace_is_lost_and_a_lone_node_is_judged_alone() {
    let rules = Rules::default();
    let t0 = Utc::now();
    let s = two_busy_nodes(t0, &rules);
    let past_grace = t0 + rules.fleet_silence_grace + Duration::seconds(1);
    assert_eq!(lost_nodes(&s, past_grace, &rules), ["a", "b"]);
    // With one node there is no one else to tell deafness from death.
    let mut lone = given(vec![node("a", 1)]);
    lone.liveness_since = Some(t0);
    lone.heard_live("a", t0, t0, &rules);
    assert_eq!(lost_nodes(&lone, t0 + Duration::seconds(4), &rules), ["a"]);
}

#[test]
fn a_lost_node_is_billed_until_a_heartbeat_time_held_to_its_arrival() {
    let rules = Rules::default();
    let t0 = Utc::now();
    let mut s = two_busy_nodes(t0, &rules);
    // a's clock runs an hour ahead; b's is right.
    let arrived = t0 + Duration::seconds(1);
    s.heard_live("a", arrived + Duration::hours(1), arrived, &rules);
    for second in 2..=5 {
        let at = t0 + Duration::seconds(second);
        s.heard_live("b", at, at, &rules);
    }
    let d = decide_at(&s, t0 + Duration::seconds(5), &rules);
    let lost = events_of(&d)
        .into_iter()
        .find_map(|e| match e {
            EventData::NodeLost(n) => Some(n.clone()),
            _ => None,
        })
        .expect("a is lost");
    assert_eq!(lost.last_heard_at, arrived, "not an hour in the future");
}

#[test]
fn one_flapping_node_does_not_shield_the_dead_ones() {
    let rules = Rules::default();
    let t0 = Utc::now();
    let mut s = given(vec![node("a", 1), node("b", 1), node("c", 1)]);
    settle(&mut s, t0, &rules);
    s.liveness_since = Some(t0);
    for n in ["a", "b", "c"] {
        s.heard_live(n, t0, t0, &rules);
    }
    let at = |secs: i64| t0 + Duration::seconds(secs);
    // b and c died at t0; a's host flaps: heard again at 10 s, alone.
    s.heard_live("a", at(10), at(10), &rules);
    assert!(
        lost_nodes(&s, at(12), &rules).is_empty(),
        "a moment to hear the others"
    );
    s.heard_live("a", at(14), at(14), &rules);
    assert_eq!(lost_nodes(&s, at(14), &rules), ["b", "c"]);
    // An unknown node's heartbeat says nothing about the fleet.
    let mut quiet = given(vec![node("a", 1), node("b", 1)]);
    settle(&mut quiet, t0, &rules);
    quiet.liveness_since = Some(t0);
    quiet.heard_live("a", t0, t0, &rules);
    quiet.heard_live("b", t0, t0, &rules);
    quiet.heard_live("ghost", at(10), at(10), &rules);
    assert!(
        lost_nodes(&quiet, at(10), &rules).is_empty(),
        "still deaf: NATS is out"
    );
}

#[test]
fn a_lease_moved_off_a_lost_node_is_counted_interrupted_until_it_runs_again() {
    let t = Uuid::from_u128(1);
    let l1 = Uuid::from_u128(2);
    let t0: chrono::DateTime<Utc> = "2026-12-03T10:00:00Z".parse().unwrap();
    let rules = Rules::default();
    let mut s = given(vec![node("a", 1), tenant(t, 8), request(l1, t, 1)]);
    settle(&mut s, t0, &rules);
    s.apply(7000, &env(started(l1, t0)));
    // Applied twice (a writer and the feed): counted once.
    s.apply(7000, &env(started(l1, t0)));
    s.apply(8000, &env(node("b", 1)));
    s.liveness_since = Some(t0);
    s.heard("a", t0 + Duration::seconds(60), t0 + Duration::seconds(60));
    s.heard("b", t0 + Duration::seconds(70), t0 + Duration::seconds(70));
    let lost_at = t0 + Duration::seconds(70);
    settle(&mut s, lost_at, &rules);
    assert_eq!(where_is(&s, l1).0, "b");
    // Served a minute, then interrupted from a's last heartbeat on.
    let time = s.availability.up_to(lost_at)[&t];
    assert_eq!((time.owed_ms, time.interrupted_ms), (70_000, 10_000));
    // Runs again on b 20 s after it was last served, then ends.
    s.apply(9000, &env(started(l1, t0 + Duration::seconds(80))));
    s.apply(
        9001,
        &env(EventData::LeaseEnded(LeaseEnded {
            lease_id: l1,
            node_id: Some("b".into()),
            ended_at: t0 + Duration::seconds(180),
            reason: EndReason::Completed,
            exit_code: Some(0),
            failure: None,
        })),
    );
    let time = s.availability.up_to(t0 + Duration::seconds(3600))[&t];
    assert_eq!((time.owed_ms, time.interrupted_ms), (180_000, 20_000));

    // A restart from a snapshot folds on from the same totals.
    let mut restored = State::default();
    assert!(restored.restore(s.snapshot()));
    assert_eq!(restored.availability, s.availability);
}

#[test]
fn a_snapshot_from_before_availability_counts_its_running_leases_from_their_start() {
    let t = Uuid::from_u128(1);
    let l1 = Uuid::from_u128(2);
    let t0: chrono::DateTime<Utc> = "2026-12-03T10:00:00Z".parse().unwrap();
    let mut s = given(vec![node("a", 1), tenant(t, 8), request(l1, t, 1)]);
    settle(&mut s, t0, &Rules::default());
    s.apply(7000, &env(started(l1, t0)));
    let mut old = s.snapshot();
    old.as_object_mut().unwrap().remove("availability");
    let mut restored = State::default();
    assert!(restored.restore(old));
    let time = restored.availability.up_to(t0 + Duration::seconds(60))[&t];
    assert_eq!((time.owed_ms, time.interrupted_ms), (60_000, 0));
}
