//! Given samples and events, when the tracker judges them, then these
//! transitions.

use super::*;

const INDEX: u32 = 0;

fn t(s: u64) -> DateTime<Utc> {
    "2026-12-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + chrono::Duration::seconds(s as i64)
}

fn sample(temperature_c: u32, memory_pct: u64, ecc: u64) -> GpuSample {
    GpuSample {
        index: INDEX,
        utilization_pct: Some(50),
        memory_used_mib: 40 * 1024 * memory_pct / 100,
        memory_total_mib: 40 * 1024,
        temperature_c,
        power_w: 300.0,
        ecc_double_bit_total: Some(ecc),
        processes: Vec::new(),
    }
}

fn cool() -> GpuSample {
    sample(50, 10, 0)
}

fn rules() -> HealthRules {
    HealthRules {
        recover_after_clean_samples: 5,
        ..HealthRules::default()
    }
}

fn tracker() -> GpuTracker {
    GpuTracker::new(INDEX, rules())
}

fn event(kind: GpuEventKind, at: u64) -> GpuEvent {
    GpuEvent {
        index: INDEX,
        kind,
        at: t(at),
    }
}

/// Feeds one sample a second from `from` to `to` (inclusive) and
/// returns the transitions with the second they happened at.
fn feed(
    tr: &mut GpuTracker,
    from: u64,
    to: u64,
    s: &GpuSample,
) -> Vec<(u64, GpuHealth, GpuHealth)> {
    (from..=to)
        .filter_map(|sec| tr.observe(s, t(sec)).map(|x| (sec, x.from, x.to)))
        .collect()
}

fn unhealthy_by_xid(tr: &mut GpuTracker) {
    match tr.fault(&event(GpuEventKind::Xid(79), 0), None, t(0)) {
        Outcome::Transition(x) => assert_eq!(x.to, GpuHealth::Unhealthy),
        other => panic!("{other:?}"),
    }
}

#[test]
fn defaults_are_nvidias_thresholds_and_xid_classes() {
    let r = HealthRules::default();
    assert_eq!(r.degraded_temperature_c, 85);
    assert_eq!(r.degraded_memory_pct, 95.0);
    assert_eq!(r.degraded_window, Duration::from_secs(30));
    assert_eq!(r.recover_after_clean_samples, 30);
    assert_eq!(r.application_xids, [13, 31, 43, 45, 68]);
    assert!(r.critical_xids.contains(&79) && r.critical_xids.contains(&48));
    r.validate().unwrap();
    let bad = HealthRules {
        application_xids: vec![79],
        ..HealthRules::default()
    };
    assert!(bad.validate().unwrap_err().contains("79"));
    let bad = HealthRules {
        recover_after_clean_samples: 0,
        ..HealthRules::default()
    };
    assert!(bad.validate().is_err());
}

#[test]
fn hot_degrades_only_after_the_whole_window() {
    let mut tr = tracker();
    // 85 °C is the threshold itself: hot from second 0; the window of
    // 30 s has held at second 30, not before.
    assert_eq!(feed(&mut tr, 0, 29, &sample(85, 10, 0)), []);
    assert_eq!(tr.health(), GpuHealth::Healthy);
    let x = tr.observe(&sample(85, 10, 0), t(30)).unwrap();
    assert_eq!((x.from, x.to), (GpuHealth::Healthy, GpuHealth::Degraded));
    assert_eq!(x.evidence.temperature_c, Some(85));
    assert_eq!(x.evidence.window_seconds, Some(30.0));
    assert_eq!(x.at, t(30));
    assert!(
        x.reason.contains("temperature 85 °C ≥ 85 °C for 30 s"),
        "{}",
        x.reason
    );
}

#[test]
fn just_under_the_threshold_is_cool() {
    let mut tr = tracker();
    assert_eq!(feed(&mut tr, 0, 120, &sample(84, 94, 0)), []);
}

#[test]
fn a_dip_restarts_the_window() {
    let mut tr = tracker();
    assert_eq!(feed(&mut tr, 0, 25, &sample(90, 10, 0)), []);
    assert_eq!(tr.observe(&sample(80, 10, 0), t(26)), None);
    // Hot again from 27: degraded at 27 + 30, not at 30.
    let hot = feed(&mut tr, 27, 60, &sample(90, 10, 0));
    assert_eq!(hot, [(57, GpuHealth::Healthy, GpuHealth::Degraded)]);
}

#[test]
fn full_memory_degrades() {
    let mut tr = tracker();
    let got = feed(&mut tr, 100, 140, &sample(50, 95, 0));
    assert_eq!(got, [(130, GpuHealth::Healthy, GpuHealth::Degraded)]);
    let mut tr = tracker();
    let x = (0..=30)
        .filter_map(|s| tr.observe(&sample(50, 97, 0), t(s)))
        .next()
        .unwrap();
    assert_eq!(x.evidence.memory_used_pct, Some(97.0));
    assert!(
        x.reason.starts_with("memory 97 % used ≥ 95 %"),
        "{}",
        x.reason
    );
}

#[test]
fn hot_then_full_is_one_unbroken_stretch() {
    let mut tr = tracker();
    assert_eq!(feed(&mut tr, 0, 14, &sample(90, 10, 0)), []);
    let got = feed(&mut tr, 15, 40, &sample(50, 99, 0));
    assert_eq!(got, [(30, GpuHealth::Healthy, GpuHealth::Degraded)]);
}

#[test]
fn degraded_recovers_after_exactly_n_clean_samples() {
    let mut tr = tracker();
    feed(&mut tr, 0, 30, &sample(90, 10, 0));
    assert_eq!(tr.health(), GpuHealth::Degraded);
    // N - 1 = 4 clean samples: still degraded.
    assert_eq!(feed(&mut tr, 31, 34, &cool()), []);
    assert_eq!(tr.clean_samples(), 4);
    // A hot one breaks the run.
    assert_eq!(tr.observe(&sample(90, 10, 0), t(35)), None);
    assert_eq!(tr.clean_samples(), 0);
    assert_eq!(feed(&mut tr, 36, 39, &cool()), []);
    let x = tr.observe(&cool(), t(40)).unwrap();
    assert_eq!((x.from, x.to), (GpuHealth::Degraded, GpuHealth::Healthy));
    assert_eq!(x.evidence.clean_samples, Some(5));
    assert_eq!(x.reason, "5 clean samples in a row");
    // Back to healthy, a new hot stretch needs its own whole window.
    assert_eq!(feed(&mut tr, 41, 70, &sample(90, 10, 0)), []);
    assert_eq!(
        tr.observe(&sample(90, 10, 0), t(71)).unwrap().to,
        GpuHealth::Degraded
    );
}

#[test]
fn critical_xid_makes_unhealthy_from_any_state() {
    let mut tr = tracker();
    match tr.fault(&event(GpuEventKind::Xid(48), 3), Some(Uuid::nil()), t(3)) {
        Outcome::Transition(x) => {
            assert_eq!((x.from, x.to), (GpuHealth::Healthy, GpuHealth::Unhealthy));
            assert_eq!(x.evidence.xid, Some(48));
            assert_eq!(x.reason, "critical XID 48 (double-bit ECC error)");
        }
        other => panic!("{other:?}"),
    }
    // A second one: no transition, the clean run restarts.
    feed(&mut tr, 4, 6, &cool());
    assert_eq!(tr.clean_samples(), 3);
    assert!(matches!(
        tr.fault(&event(GpuEventKind::Xid(79), 7), None, t(7)),
        Outcome::AlreadyUnhealthy { .. }
    ));
    assert_eq!(tr.clean_samples(), 0);

    let mut tr = tracker();
    feed(&mut tr, 0, 30, &sample(99, 10, 0));
    match tr.fault(&event(GpuEventKind::Xid(79), 31), None, t(31)) {
        Outcome::Transition(x) => {
            assert_eq!((x.from, x.to), (GpuHealth::Degraded, GpuHealth::Unhealthy))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn non_critical_xid_is_ignored() {
    let mut tr = tracker();
    match tr.fault(&event(GpuEventKind::Xid(8), 0), None, t(0)) {
        Outcome::Ignored { reason, .. } => assert_eq!(reason, "XID 8 is not critical"),
        other => panic!("{other:?}"),
    }
    assert_eq!(tr.health(), GpuHealth::Healthy);
}

#[test]
fn double_bit_ecc_event_makes_unhealthy() {
    let mut tr = tracker();
    tr.observe(&sample(50, 10, 2), t(0));
    match tr.fault(&event(GpuEventKind::EccDoubleBit, 1), None, t(1)) {
        Outcome::Transition(x) => {
            assert_eq!(x.to, GpuHealth::Unhealthy);
            assert_eq!(x.evidence.ecc_double_bit_total, Some(2));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn double_bit_ecc_counter_delta_makes_unhealthy() {
    let mut tr = tracker();
    assert_eq!(feed(&mut tr, 0, 5, &sample(50, 10, 7)), []);
    let x = tr.observe(&sample(50, 10, 8), t(6)).unwrap();
    assert_eq!((x.from, x.to), (GpuHealth::Healthy, GpuHealth::Unhealthy));
    assert_eq!(x.evidence.ecc_double_bit_total, Some(8));
    assert_eq!(x.reason, "double-bit ECC errors: counter 7 → 8");
    // The steady counter afterwards is clean: 5 of them bring it back.
    let got = feed(&mut tr, 7, 11, &sample(50, 10, 8));
    assert_eq!(got, [(11, GpuHealth::Unhealthy, GpuHealth::Healthy)]);
}

#[test]
fn a_counter_reset_or_a_missing_reading_is_not_an_error() {
    let mut tr = tracker();
    tr.observe(&sample(50, 10, 7), t(0));
    // Driver reloaded: volatile counter back to 0.
    assert_eq!(tr.observe(&sample(50, 10, 0), t(1)), None);
    // ECC unreadable for a sample, then readable at the same total.
    let mut unreadable = sample(50, 10, 0);
    unreadable.ecc_double_bit_total = None;
    assert_eq!(tr.observe(&unreadable, t(2)), None);
    assert_eq!(tr.observe(&sample(50, 10, 0), t(3)), None);
    assert_eq!(tr.health(), GpuHealth::Healthy);
    // The first reading ever is a baseline, whatever its value.
    let mut fresh = tracker();
    assert_eq!(fresh.observe(&sample(50, 10, 42), t(0)), None);
}

#[test]
fn application_xid_is_charged_to_the_lease() {
    let lease = Uuid::from_u128(7);
    for xid in [13, 31, 43, 45, 68] {
        let mut tr = tracker();
        let got = tr.fault(&event(GpuEventKind::Xid(xid), 5), Some(lease), t(5));
        assert_eq!(
            got,
            Outcome::ChargedToLease {
                lease_id: lease,
                gpu_index: INDEX,
                xid,
                at: t(5)
            }
        );
        assert_eq!(tr.health(), GpuHealth::Healthy);
    }
}

#[test]
fn application_xid_without_a_lease_is_ignored() {
    let mut tr = tracker();
    match tr.fault(&event(GpuEventKind::Xid(13), 5), None, t(5)) {
        Outcome::Ignored { reason, gpu_index } => {
            assert_eq!(gpu_index, INDEX);
            assert!(
                reason.contains("XID 13") && reason.contains("no lease"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(tr.health(), GpuHealth::Healthy);
}

#[test]
fn application_xid_does_not_break_a_recovery() {
    let mut tr = tracker();
    unhealthy_by_xid(&mut tr);
    feed(&mut tr, 1, 3, &cool());
    tr.fault(&event(GpuEventKind::Xid(13), 4), Some(Uuid::nil()), t(4));
    assert_eq!(tr.clean_samples(), 3);
}

#[test]
fn unhealthy_recovers_after_exactly_n_clean_samples() {
    let mut tr = tracker();
    unhealthy_by_xid(&mut tr);
    assert_eq!(feed(&mut tr, 1, 4, &cool()), []);
    assert_eq!(tr.health(), GpuHealth::Unhealthy);
    // Hot is not clean, even for an unhealthy GPU.
    assert_eq!(tr.observe(&sample(90, 10, 0), t(5)), None);
    assert_eq!(feed(&mut tr, 6, 9, &cool()), []);
    let x = tr.observe(&cool(), t(10)).unwrap();
    assert_eq!((x.from, x.to), (GpuHealth::Unhealthy, GpuHealth::Healthy));
    assert_eq!(x.evidence.clean_samples, Some(5));
}

#[test]
fn a_restarted_agent_keeps_the_health_the_log_recorded() {
    let mut node = NodeHealth::new([INDEX], rules());
    node.assume(INDEX, GpuHealth::Unhealthy);
    assert_eq!(node.health(INDEX), Some(GpuHealth::Unhealthy));
    // Clean samples bring it back as they would have before the restart.
    let mut back = Vec::new();
    for s in 0..5 {
        back.extend(node.observe(&[cool()], t(s)));
    }
    assert_eq!(back.len(), 1);
    assert_eq!(
        (back[0].from, back[0].to),
        (GpuHealth::Unhealthy, GpuHealth::Healthy)
    );
}

#[test]
fn a_lost_gpu_comes_back_only_through_samples_or_a_self_test() {
    let mut tr = tracker();
    match tr.fault(&event(GpuEventKind::Lost, 0), None, t(0)) {
        Outcome::Transition(x) => assert_eq!(x.to, GpuHealth::Unhealthy),
        other => panic!("{other:?}"),
    }
    // No samples arrive while it is lost: time alone changes nothing.
    assert_eq!(tr.health(), GpuHealth::Unhealthy);
    let got = feed(&mut tr, 100, 104, &cool());
    assert_eq!(got, [(104, GpuHealth::Unhealthy, GpuHealth::Healthy)]);
}

#[test]
fn passing_self_test_brings_it_back_at_once() {
    let mut tr = tracker();
    unhealthy_by_xid(&mut tr);
    let x = tr.self_test(true, t(9)).unwrap();
    assert_eq!((x.from, x.to), (GpuHealth::Unhealthy, GpuHealth::Healthy));
    assert_eq!(x.evidence.self_test_passed, Some(true));
    assert_eq!(x.reason, "self-test passed");
    // Passing again changes nothing.
    assert_eq!(tr.self_test(true, t(10)), None);

    let mut tr = tracker();
    feed(&mut tr, 0, 30, &sample(90, 10, 0));
    assert_eq!(tr.self_test(true, t(31)).unwrap().from, GpuHealth::Degraded);
}

#[test]
fn failed_self_test_makes_unhealthy() {
    let mut tr = tracker();
    let x = tr.self_test(false, t(1)).unwrap();
    assert_eq!((x.from, x.to), (GpuHealth::Healthy, GpuHealth::Unhealthy));
    assert_eq!(x.evidence.self_test_passed, Some(false));
    feed(&mut tr, 2, 4, &cool());
    assert_eq!(tr.self_test(false, t(5)), None);
    assert_eq!(tr.clean_samples(), 0);
}

#[test]
fn transitions_serialise_with_their_evidence() {
    let mut tr = tracker();
    let x = tr.self_test(false, t(1)).unwrap();
    let json = serde_json::to_value(&x).unwrap();
    assert_eq!(json["to"], "unhealthy");
    assert_eq!(json["evidence"]["self_test_passed"], false);
    assert_eq!(serde_json::from_value::<Transition>(json).unwrap(), x);
}

#[test]
fn node_health_routes_by_gpu() {
    let mut node = NodeHealth::new(0..2, rules());
    let mut hot = sample(95, 10, 0);
    hot.index = 1;
    let mut got = Vec::new();
    for s in 0..=30 {
        let mut cool0 = cool();
        cool0.index = 0;
        got.extend(node.observe(&[cool0, hot.clone()], t(s)));
    }
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].gpu_index, 1);
    assert_eq!(node.health(0), Some(GpuHealth::Healthy));
    assert_eq!(node.health(1), Some(GpuHealth::Degraded));
    assert_eq!(node.health(5), None);
}
