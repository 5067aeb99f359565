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

use super::backend::{GpuEvent, GpuEventKind, GpuSample};
use super::xid::{self, describe_xid};

pub use lh_events::{GpuHealth, HealthEvidence as Evidence};

/// Thresholds and XID classes (the classes of [`xid`] by default).
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
    /// XIDs that mean the hardware (or its driver state) is bad
    /// (default [`xid::CRITICAL`]).
    pub critical_xids: Vec<u64>,
    /// XIDs the workload causes, charged to its lease (default
    /// [`xid::APPLICATION`]).
    pub application_xids: Vec<u64>,
}

impl Default for HealthRules {
    fn default() -> Self {
        Self {
            degraded_temperature_c: 85,
            degraded_memory_pct: 95.0,
            degraded_window: Duration::from_secs(30),
            recover_after_clean_samples: 30,
            critical_xids: xid::CRITICAL.to_vec(),
            application_xids: xid::APPLICATION.to_vec(),
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
                    window_seconds: Some(held.as_secs_f64()),
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

    /// The GPUs unhealthy now.
    pub fn unhealthy_gpus(&self) -> std::collections::BTreeSet<u32> {
        self.gpus
            .values()
            .filter(|t| t.health == GpuHealth::Unhealthy)
            .map(|t| t.gpu_index)
            .collect()
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

fn round_2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests;
