//! GPU health that goes both ways: a pure state machine per GPU.
//!
//! ```text
//!            hot or full for the whole window
//!   Healthy ─────────────────────────────────▶ Degraded
//!      ▲ ▲                                       │
//!      │ └──── N clean samples in a row ─────────┘
//!      │       or a passing self-test            │ critical XID, double-bit ECC
//!      │                                         ▼ (event or counter), lost,
//!      └──── N clean samples in a row ────── Unhealthy    failed self-test
//!            or a passing self-test          (from any state)
//! ```
//!
//! The NVIDIA device plugin marks a GPU unhealthy and never brings it back
//! (NVIDIA/k8s-device-plugin#234); here a GPU earns its way back with a run
//! of clean samples or a passing self-test.
//!
//! * A sample is *clean* when the temperature and the memory in use are
//!   both under their thresholds and the double-bit ECC counter has not
//!   moved since the previous sample.
//! * Degraded needs the condition to hold continuously for
//!   `degraded_window`: one cool or emptier sample restarts the window.
//! * ECC is caught twice: from the driver's event and from the counter in
//!   samples, so a missed event (no event set, a lost wake-up) still counts.
//!   A counter that goes *down* was reset by a driver reload: rebased, not
//!   an error.
//! * A lost GPU (XID 79, NVML `GPU_IS_LOST`) produces no samples, so it
//!   cannot accumulate clean ones while lost: it comes back only when
//!   samples reappear and N of them in a row are clean, or when a
//!   self-test passes.
//! * Application XIDs (13, 31, 43, 45, 68) are the workload's doing: they
//!   are charged to the lease on the GPU and the GPU stays as it is. With no
//!   lease on the GPU there is no one to charge and no evidence against the
//!   hardware (a stray CUDA program of the operator's, say), so the XID is
//!   ignored with a reason the agent logs.
//!
//! The tracker does no I/O and reads no clock: samples, events and `now`
//! come in, transitions with their evidence come out.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::backend::{GpuEvent, GpuEventKind, GpuSample};

pub use lh_events::{GpuHealth, HealthEvidence as Evidence};

/// Thresholds and XID classes. The XID lists follow NVIDIA's XID catalogue
/// (<https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html>,
/// and for 48/63/64 the page-retirement guide
/// <https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html>).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthRules {
    /// At or above this, a GPU is hot (°C). Data-centre GPUs start to
    /// slow down for heat in the high 80s.
    pub degraded_temperature_c: u32,
    /// At or above this share of VRAM in use, a GPU is full (percent).
    pub degraded_memory_pct: f64,
    /// How long hot or full must last, without a break, to degrade.
    pub degraded_window: Duration,
    /// Clean samples in a row that bring a GPU back to healthy.
    pub recover_after_clean_samples: u32,
    /// XIDs that mean the hardware (or its driver state) is bad:
    /// 48 double-bit ECC error, 61 internal micro-controller breakpoint,
    /// 62 internal micro-controller halt, 63 ECC page retirement / row
    /// remapping event, 64 page retirement / row remapping failure,
    /// 74 NVLink error, 79 GPU has fallen off the bus, 92 high single-bit
    /// ECC error rate, 94 contained ECC error, 95 uncontained ECC error,
    /// 119 GSP RPC timeout, 120 GSP error.
    pub critical_xids: Vec<u64>,
    /// XIDs the workload causes, charged to its lease; the same list the
    /// NVIDIA device plugin skips (`applicationErrorXids` in its health
    /// check): 13 graphics engine exception, 31 GPU memory page fault,
    /// 43 GPU stopped processing, 45 preemptive cleanup, 68 video
    /// processor exception.
    pub application_xids: Vec<u64>,
}

impl Default for HealthRules {
    fn default() -> Self {
        Self {
            degraded_temperature_c: 85,
            degraded_memory_pct: 95.0,
            degraded_window: Duration::from_secs(30),
            recover_after_clean_samples: 30,
            critical_xids: vec![48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120],
            application_xids: vec![13, 31, 43, 45, 68],
        }
    }
}

impl HealthRules {
    /// Rejects rules the state machine cannot honour.
    pub fn validate(&self) -> Result<(), String> {
        if self.recover_after_clean_samples == 0 {
            return Err("recover_after_clean_samples must be at least 1".into());
        }
        if !(0.0..=100.0).contains(&self.degraded_memory_pct) {
            return Err(format!(
                "degraded_memory_pct must be within 0..=100, got {}",
                self.degraded_memory_pct
            ));
        }
        if let Some(x) = self
            .critical_xids
            .iter()
            .find(|x| self.application_xids.contains(x))
        {
            return Err(format!("XID {x} is both critical and an application error"));
        }
        Ok(())
    }
}

/// A change of one GPU's health, with what it rests on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub gpu_index: u32,
    pub from: GpuHealth,
    pub to: GpuHealth,
    pub reason: String,
    pub evidence: Evidence,
    pub at: DateTime<Utc>,
}

/// What a fault event came to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Outcome {
    Transition(Transition),
    /// An application XID, charged to the lease that holds the GPU; the
    /// GPU's health does not change.
    ChargedToLease {
        lease_id: Uuid,
        gpu_index: u32,
        xid: u64,
        at: DateTime<Utc>,
    },
    /// Nothing to do: a non-critical XID, or an application XID on a GPU
    /// no lease holds. The reason is for the log.
    Ignored {
        gpu_index: u32,
        reason: String,
    },
    /// A critical fault on a GPU that is already unhealthy: no transition,
    /// but its run of clean samples starts again.
    AlreadyUnhealthy {
        gpu_index: u32,
        reason: String,
    },
}

/// The health of one GPU and what it needs to remember between samples.
#[derive(Debug, Clone)]
pub struct GpuTracker {
    gpu_index: u32,
    rules: HealthRules,
    health: GpuHealth,
    /// First sample of the current unbroken hot-or-full stretch.
    over_since: Option<DateTime<Utc>>,
    /// Clean samples in a row while degraded or unhealthy.
    clean_run: u32,
    /// Last double-bit ECC total read; `None` until one is read.
    ecc_double_bit_total: Option<u64>,
}

impl GpuTracker {
    /// A GPU starts healthy: nothing is known against it.
    pub fn new(gpu_index: u32, rules: HealthRules) -> Self {
        Self {
            gpu_index,
            rules,
            health: GpuHealth::Healthy,
            over_since: None,
            clean_run: 0,
            ecc_double_bit_total: None,
        }
    }

    pub fn gpu_index(&self) -> u32 {
        self.gpu_index
    }

    pub fn health(&self) -> GpuHealth {
        self.health
    }

    /// Clean samples in a row so far while degraded or unhealthy.
    pub fn clean_samples(&self) -> u32 {
        self.clean_run
    }

    /// Judges one sample of this GPU taken at `now`.
    pub fn observe(&mut self, sample: &GpuSample, now: DateTime<Utc>) -> Option<Transition> {
        debug_assert_eq!(sample.index, self.gpu_index, "sample of another GPU");
        let previous_total = self.ecc_double_bit_total;
        if sample.ecc_double_bit_total.is_some() {
            self.ecc_double_bit_total = sample.ecc_double_bit_total;
        }
        let new_double_bit = match (previous_total, sample.ecc_double_bit_total) {
            (Some(before), Some(after)) => after > before,
            _ => false,
        };
        let memory_used_pct = round_2(sample.memory_used_pct());
        let hot = sample.temperature_c >= self.rules.degraded_temperature_c;
        let full = memory_used_pct >= self.rules.degraded_memory_pct;
        self.over_since = if hot || full {
            Some(self.over_since.unwrap_or(now))
        } else {
            None
        };
        let evidence = Evidence {
            temperature_c: Some(sample.temperature_c),
            memory_used_pct: Some(memory_used_pct),
            ecc_double_bit_total: sample.ecc_double_bit_total,
            ..Evidence::default()
        };

        if new_double_bit {
            let reason = format!(
                "double-bit ECC errors: counter {} → {}",
                previous_total.unwrap_or_default(),
                sample.ecc_double_bit_total.unwrap_or_default()
            );
            self.clean_run = 0;
            return self.go(GpuHealth::Unhealthy, reason, evidence, now);
        }
        let clean = !hot && !full;
        match self.health {
            GpuHealth::Healthy => {
                let since = self.over_since?;
                let held = (now - since).to_std().unwrap_or_default();
                if held < self.rules.degraded_window {
                    return None;
                }
                let mut why = Vec::new();
                if hot {
                    why.push(format!(
                        "temperature {} °C ≥ {} °C",
                        sample.temperature_c, self.rules.degraded_temperature_c
                    ));
                }
                if full {
                    why.push(format!(
                        "memory {memory_used_pct} % used ≥ {} %",
                        self.rules.degraded_memory_pct
                    ));
                }
                let reason = format!("{} for {} s", why.join(" and "), held.as_secs_f64());
                let evidence = Evidence {
                    window_s: Some(held.as_secs_f64()),
                    ..evidence
                };
                self.go(GpuHealth::Degraded, reason, evidence, now)
            }
            GpuHealth::Degraded | GpuHealth::Unhealthy => {
                if !clean {
                    self.clean_run = 0;
                    return None;
                }
                self.clean_run += 1;
                if self.clean_run < self.rules.recover_after_clean_samples {
                    return None;
                }
                let n = self.clean_run;
                let evidence = Evidence {
                    clean_samples: Some(n),
                    ..evidence
                };
                self.go(
                    GpuHealth::Healthy,
                    format!("{n} clean samples in a row"),
                    evidence,
                    now,
                )
            }
        }
    }

    /// Judges a fault event on this GPU. `lease_on_gpu` is the lease that
    /// holds it now, if any, to charge application XIDs to.
    pub fn fault(
        &mut self,
        event: &GpuEvent,
        lease_on_gpu: Option<Uuid>,
        now: DateTime<Utc>,
    ) -> Outcome {
        debug_assert_eq!(event.index, self.gpu_index, "event of another GPU");
        let gpu_index = self.gpu_index;
        let (reason, evidence) = match event.kind {
            GpuEventKind::Xid(xid) if self.rules.application_xids.contains(&xid) => {
                return match lease_on_gpu {
                    Some(lease_id) => Outcome::ChargedToLease {
                        lease_id,
                        gpu_index,
                        xid,
                        at: now,
                    },
                    None => Outcome::Ignored {
                        gpu_index,
                        reason: format!(
                            "application {} with no lease on the GPU: nothing to charge, GPU unaffected",
                            describe_xid(xid)
                        ),
                    },
                };
            }
            GpuEventKind::Xid(xid) if !self.rules.critical_xids.contains(&xid) => {
                return Outcome::Ignored {
                    gpu_index,
                    reason: format!("{} is not critical", describe_xid(xid)),
                };
            }
            GpuEventKind::Xid(xid) => (
                format!("critical {}", describe_xid(xid)),
                Evidence {
                    xid: Some(xid),
                    ..Evidence::default()
                },
            ),
            GpuEventKind::EccDoubleBit => (
                "double-bit ECC error reported by the driver".to_string(),
                Evidence {
                    ecc_double_bit_total: self.ecc_double_bit_total,
                    ..Evidence::default()
                },
            ),
            GpuEventKind::Lost => (
                "GPU lost: it stopped answering the driver".to_string(),
                Evidence::default(),
            ),
        };
        self.clean_run = 0;
        match self.go(GpuHealth::Unhealthy, reason.clone(), evidence, now) {
            Some(t) => Outcome::Transition(t),
            None => Outcome::AlreadyUnhealthy { gpu_index, reason },
        }
    }

    /// A self-test finished: passing brings the GPU back at once, failing
    /// makes it unhealthy.
    pub fn self_test(&mut self, passed: bool, now: DateTime<Utc>) -> Option<Transition> {
        let evidence = Evidence {
            self_test_passed: Some(passed),
            ..Evidence::default()
        };
        if passed {
            self.go(GpuHealth::Healthy, "self-test passed".into(), evidence, now)
        } else {
            self.clean_run = 0;
            self.go(
                GpuHealth::Unhealthy,
                "self-test failed".into(),
                evidence,
                now,
            )
        }
    }

    fn go(
        &mut self,
        to: GpuHealth,
        reason: String,
        evidence: Evidence,
        now: DateTime<Utc>,
    ) -> Option<Transition> {
        if self.health == to {
            return None;
        }
        let from = self.health;
        self.health = to;
        // Each state starts its own count.
        self.clean_run = 0;
        if to == GpuHealth::Healthy {
            // A GPU that is back must stay hot or full a whole window again.
            self.over_since = None;
        }
        Some(Transition {
            gpu_index: self.gpu_index,
            from,
            to,
            reason,
            evidence,
            at: now,
        })
    }
}

/// The trackers of every GPU of a node, keyed by index.
#[derive(Debug, Clone)]
pub struct NodeHealth {
    rules: HealthRules,
    gpus: BTreeMap<u32, GpuTracker>,
}

impl NodeHealth {
    pub fn new(gpu_indices: impl IntoIterator<Item = u32>, rules: HealthRules) -> Self {
        let gpus = gpu_indices
            .into_iter()
            .map(|i| (i, GpuTracker::new(i, rules.clone())))
            .collect();
        Self { rules, gpus }
    }

    fn tracker(&mut self, index: u32) -> &mut GpuTracker {
        let rules = &self.rules;
        self.gpus
            .entry(index)
            .or_insert_with(|| GpuTracker::new(index, rules.clone()))
    }

    /// Judges one round of samples; GPUs missing from it are not judged.
    pub fn observe(&mut self, samples: &[GpuSample], now: DateTime<Utc>) -> Vec<Transition> {
        samples
            .iter()
            .filter_map(|s| self.tracker(s.index).observe(s, now))
            .collect()
    }

    pub fn fault(
        &mut self,
        event: &GpuEvent,
        lease_on_gpu: Option<Uuid>,
        now: DateTime<Utc>,
    ) -> Outcome {
        self.tracker(event.index).fault(event, lease_on_gpu, now)
    }

    pub fn self_test(
        &mut self,
        index: u32,
        passed: bool,
        now: DateTime<Utc>,
    ) -> Option<Transition> {
        self.tracker(index).self_test(passed, now)
    }

    pub fn health(&self, index: u32) -> Option<GpuHealth> {
        self.gpus.get(&index).map(GpuTracker::health)
    }

    /// Takes the health the log last recorded for a GPU (an agent that
    /// restarts must not forget an unhealthy GPU), with no transition.
    pub fn assume(&mut self, index: u32, health: GpuHealth) {
        let tracker = self.tracker(index);
        tracker.health = health;
        tracker.clean_run = 0;
        tracker.over_since = None;
    }
}

/// `XID 79 (GPU has fallen off the bus)`, for reasons and logs.
pub fn describe_xid(xid: u64) -> String {
    let name = match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup",
        48 => "double-bit ECC error",
        61 => "internal micro-controller breakpoint",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping event",
        64 => "ECC page retirement or row remapping failure",
        68 => "video processor exception",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        _ => return format!("XID {xid}"),
    };
    format!("XID {xid} ({name})")
}

fn round_2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const INDEX: u32 = 0;

    fn t(s: u64) -> DateTime<Utc> {
        "2026-12-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap()
            + chrono::Duration::seconds(s as i64)
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
    fn defaults_match_the_issue() {
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
        assert_eq!(x.evidence.window_s, Some(30.0));
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
}
