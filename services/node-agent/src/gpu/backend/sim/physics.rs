//! The simulated GPUs' readings: each value ramps linearly to where a
//! fault sends it and stays there until a recover. The state at any
//! instant is a pure function of the script and the time since start.

use std::time::Duration;

use super::script::{FaultAction, FaultScript};
use crate::gpu::xid;

/// What an idle, healthy simulated GPU reads.
const IDLE_TEMPERATURE_C: f64 = 40.0;
pub(super) const IDLE_POWER_W: f64 = 60.0;
/// Share of memory a held GPU reads in use without a memory fault.
const BUSY_MEMORY_PCT: f64 = 25.0;

/// A value moving linearly from `from` to `to` over `over`, from `start`.
#[derive(Debug, Clone, Copy)]
struct Ramp {
    from: f64,
    to: f64,
    start: Duration,
    over: Duration,
}

impl Ramp {
    fn at(&self, t: Duration) -> f64 {
        let done = t.saturating_sub(self.start);
        if done >= self.over {
            return self.to;
        }
        self.from + (self.to - self.from) * done.as_secs_f64() / self.over.as_secs_f64()
    }
}

#[derive(Debug, Clone, Default)]
pub(super) struct GpuState {
    temperature: Option<Ramp>,
    memory_pct: Option<Ramp>,
    utilization_pct: Option<Ramp>,
    pub(super) off_the_bus: bool,
    pub(super) ecc_double_bit_total: u64,
}

impl GpuState {
    pub(super) fn temperature_at(&self, t: Duration) -> f64 {
        self.temperature.map_or(IDLE_TEMPERATURE_C, |r| r.at(t))
    }

    pub(super) fn memory_pct_at(&self, t: Duration, busy: bool) -> f64 {
        let unscripted = if busy { BUSY_MEMORY_PCT } else { 0.0 };
        self.memory_pct.map_or(unscripted, |r| r.at(t))
    }

    pub(super) fn utilization_pct_at(&self, t: Duration, busy_pct: Option<f64>) -> f64 {
        self.utilization_pct
            .map_or(busy_pct.unwrap_or(0.0), |r| r.at(t))
    }
}

/// What the faults due so far made of the node.
#[derive(Debug, Clone)]
pub(super) struct HostState {
    pub(super) stopped: bool,
    pub(super) gpus: Vec<GpuState>,
}

impl GpuState {
    pub(super) fn recover(&mut self) {
        self.temperature = None;
        self.memory_pct = None;
        self.utilization_pct = None;
        self.off_the_bus = false;
    }
}

impl HostState {
    /// Folds every fault of `script` due by `t` into the state of a node
    /// with `gpu_count` GPUs.
    pub(super) fn at(script: &FaultScript, gpu_count: u32, t: Duration) -> Self {
        let mut node = HostState {
            stopped: false,
            gpus: vec![GpuState::default(); gpu_count as usize],
        };
        for fault in script.faults.iter().take_while(|f| f.after <= t) {
            let at = fault.after;
            let gpu = fault.gpu.map(|g| &mut node.gpus[g as usize]);
            match (&fault.action, gpu) {
                (FaultAction::Temperature { to_c, over }, Some(g)) => {
                    g.temperature = Some(Ramp {
                        from: g.temperature_at(at),
                        to: f64::from(*to_c),
                        start: at,
                        over: *over,
                    });
                }
                (FaultAction::Memory { to_pct, over }, Some(g)) => {
                    g.memory_pct = Some(Ramp {
                        from: g.memory_pct_at(at, false),
                        to: *to_pct,
                        start: at,
                        over: *over,
                    });
                }
                (FaultAction::Utilization { to_pct, over }, Some(g)) => {
                    g.utilization_pct = Some(Ramp {
                        from: g.utilization_pct_at(at, None),
                        to: *to_pct,
                        start: at,
                        over: *over,
                    });
                }
                (FaultAction::Xid { code }, Some(g)) => {
                    g.off_the_bus |= *code == xid::FALLEN_OFF_THE_BUS;
                }
                (FaultAction::EccDoubleBit, Some(g)) => g.ecc_double_bit_total += 1,
                (FaultAction::NodeStop, _) => node.stopped = true,
                (FaultAction::Recover, Some(g)) => g.recover(),
                (FaultAction::Recover, None) => {
                    node.stopped = false;
                    node.gpus.iter_mut().for_each(GpuState::recover);
                }
                // Validation gives every other kind a GPU.
                (_, None) => {}
            }
        }
        node
    }
}
