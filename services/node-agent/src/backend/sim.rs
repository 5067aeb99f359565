//! The simulated backend: the GPUs of a fleet-file node, healthy and idle
//! unless a fault script says otherwise.
//!
//! A fault script is a TOML file of `[[fault]]` entries, each `after_s`
//! seconds from the backend's start (see `docs/gpu-backends.md` and
//! `dev/faults.toml`):
//!
//! ```toml
//! [[fault]]
//! after_s = 10
//! gpu = 0
//! kind = "temperature"   # ramps to to_c over over_s, stays there
//! to_c = 92
//! over_s = 5
//! ```
//!
//! Kinds: `temperature` (`to_c`, `over_s`), `memory` (`to_pct`, `over_s`),
//! `utilization` (`to_pct`, `over_s`: what the GPU reads whether or not a
//! lease holds it; `to_pct = 0` makes a held GPU look idle),
//! `xid` (`code`; 79 also makes the GPU fall off the bus: no more samples),
//! `ecc_double_bit` (the counter goes up by one and an event fires),
//! `node_stop` (no `gpu`: every call fails with
//! [`BackendError::NodeStopped`], so the agent stops heartbeating), and
//! `recover` (clears the GPU's faults, or with no `gpu` every GPU's and a
//! node stop; the ECC counter stays where it is, as a real one does).
//!
//! Without a script a GPU that a lease holds (the agent says which, through
//! [`GpuBackend::set_busy`]) reads the node's `busy_utilization_pct` (70 by
//! default) and a quarter of its memory in use; a free one reads zero.
//!
//! The state at any instant is a pure function of the script, the busy set
//! and the time since start, so tests drive the clock (a
//! [`lh_service::clock::ManualClock`]) instead of
//! sleeping. Samples take the caller's `now`; events are stamped with the
//! instant their fault was scheduled, and `wait_events` reads the injected
//! clock to know which faults are due.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_service::clock::{SharedClock, SystemClock};
use serde::Deserialize;

use super::{
    BackendError, GpuBackend, GpuDevice, GpuEvent, GpuEventKind, GpuSample, MAX_EVENTS_PER_WAIT,
};
use crate::fleet_file::SimNode;

/// What an idle, healthy simulated GPU reads.
const IDLE_TEMPERATURE_C: f64 = 40.0;
const IDLE_POWER_W: f64 = 60.0;
/// XID 79: "GPU has fallen off the bus". The GPU stops answering.
const XID_FALLEN_OFF_THE_BUS: u64 = 79;
/// Share of memory a held GPU reads in use without a memory fault.
const BUSY_MEMORY_PCT: f64 = 25.0;
/// Longest script the backend accepts; a limit on everything.
const MAX_FAULTS: usize = 10_000;

/// One scheduled fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Time from the backend's start.
    pub after: Duration,
    /// The GPU it hits; `None` for node-wide faults.
    pub gpu: Option<u32>,
    pub action: FaultAction,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Temperature goes linearly from where it is to `to_c` over `over`.
    Temperature { to_c: u32, over: Duration },
    /// Memory in use goes linearly to `to_pct` of the GPU's over `over`.
    Memory { to_pct: f64, over: Duration },
    /// Utilisation goes linearly to `to_pct` over `over`, busy or not.
    Utilization { to_pct: f64, over: Duration },
    /// The driver reports this XID; 79 also takes the GPU off the bus.
    Xid { code: u64 },
    /// One uncorrectable ECC error: event and counter.
    EccDoubleBit,
    /// The whole node stops: every backend call fails.
    NodeStop,
    /// Clean readings resume on the GPU (or everywhere, node included).
    Recover,
}

/// A parsed, validated fault script, ordered by time (ties keep file order).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultScript {
    pub faults: Vec<Fault>,
}

#[derive(Debug, thiserror::Error)]
pub enum FaultScriptError {
    #[error("cannot read fault script {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("fault script {path} is invalid: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
    #[error("fault script {path}, fault {number}: {why}")]
    Invalid {
        path: String,
        /// 1-based position in the file.
        number: usize,
        why: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    #[serde(default)]
    fault: Vec<RawFault>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    after_s: f64,
    gpu: Option<u32>,
    kind: RawKind,
    to_c: Option<u32>,
    to_pct: Option<f64>,
    over_s: Option<f64>,
    code: Option<u64>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Debug)]
#[serde(rename_all = "snake_case")]
enum RawKind {
    Temperature,
    Memory,
    Utilization,
    Xid,
    EccDoubleBit,
    NodeStop,
    Recover,
}

impl RawFault {
    fn validate(self) -> Result<Fault, String> {
        let seconds = |what: &str, s: f64| {
            Duration::try_from_secs_f64(s)
                .map_err(|_| format!("{what} must be a number ≥ 0, got {s}"))
        };
        let after = seconds("after_s", self.after_s)?;
        // Each kind takes exactly its own fields: a stray one is a typo.
        let allowed: &[&str] = match self.kind {
            RawKind::Temperature => &["to_c", "over_s"],
            RawKind::Memory | RawKind::Utilization => &["to_pct", "over_s"],
            RawKind::Xid => &["code"],
            RawKind::EccDoubleBit | RawKind::NodeStop | RawKind::Recover => &[],
        };
        let given = [
            ("to_c", self.to_c.is_some()),
            ("to_pct", self.to_pct.is_some()),
            ("over_s", self.over_s.is_some()),
            ("code", self.code.is_some()),
        ];
        if let Some((field, _)) = given.iter().find(|(f, set)| *set && !allowed.contains(f)) {
            return Err(format!("{field} does not apply to kind {:?}", self.kind));
        }
        match (self.kind, self.gpu) {
            (RawKind::NodeStop, Some(_)) => return Err("node_stop takes no gpu".into()),
            (RawKind::NodeStop | RawKind::Recover, _) => {}
            (kind, None) => return Err(format!("kind {kind:?} needs a gpu")),
            _ => {}
        }
        let over = seconds("over_s", self.over_s.unwrap_or(0.0))?;
        let action = match self.kind {
            RawKind::Temperature => FaultAction::Temperature {
                to_c: self.to_c.ok_or("temperature needs to_c")?,
                over,
            },
            RawKind::Memory => {
                let to_pct = self.to_pct.ok_or("memory needs to_pct")?;
                if !(0.0..=100.0).contains(&to_pct) {
                    return Err(format!("to_pct must be within 0..=100, got {to_pct}"));
                }
                FaultAction::Memory { to_pct, over }
            }
            RawKind::Utilization => {
                let to_pct = self.to_pct.ok_or("utilization needs to_pct")?;
                if !(0.0..=100.0).contains(&to_pct) {
                    return Err(format!("to_pct must be within 0..=100, got {to_pct}"));
                }
                FaultAction::Utilization { to_pct, over }
            }
            RawKind::Xid => FaultAction::Xid {
                code: self.code.ok_or("xid needs code")?,
            },
            RawKind::EccDoubleBit => FaultAction::EccDoubleBit,
            RawKind::NodeStop => FaultAction::NodeStop,
            RawKind::Recover => FaultAction::Recover,
        };
        Ok(Fault {
            after,
            gpu: self.gpu,
            action,
        })
    }
}

impl FaultScript {
    pub fn load(path: &Path) -> Result<Self, FaultScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| FaultScriptError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses a script; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, FaultScriptError> {
        let file: ScriptFile = toml::from_str(text).map_err(|source| FaultScriptError::Parse {
            path: origin.to_string(),
            source,
        })?;
        if file.fault.len() > MAX_FAULTS {
            return Err(FaultScriptError::Invalid {
                path: origin.to_string(),
                number: MAX_FAULTS + 1,
                why: format!("more than {MAX_FAULTS} faults"),
            });
        }
        let mut faults = file
            .fault
            .into_iter()
            .enumerate()
            .map(|(i, raw)| {
                raw.validate().map_err(|why| FaultScriptError::Invalid {
                    path: origin.to_string(),
                    number: i + 1,
                    why,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        faults.sort_by_key(|f| f.after);
        Ok(Self { faults })
    }

    /// Checks the GPU indices against a node with `gpu_count` GPUs.
    pub fn check_gpus(&self, gpu_count: u32, origin: &str) -> Result<(), FaultScriptError> {
        match self
            .faults
            .iter()
            .enumerate()
            .find(|(_, f)| f.gpu.is_some_and(|g| g >= gpu_count))
        {
            Some((i, f)) => Err(FaultScriptError::Invalid {
                path: origin.to_string(),
                number: i + 1,
                why: format!(
                    "gpu {} but the node has {gpu_count} GPUs",
                    f.gpu.unwrap_or_default()
                ),
            }),
            None => Ok(()),
        }
    }
}

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
struct GpuState {
    temperature: Option<Ramp>,
    memory_pct: Option<Ramp>,
    utilization_pct: Option<Ramp>,
    off_the_bus: bool,
    ecc_double_bit_total: u64,
}

impl GpuState {
    fn temperature_at(&self, t: Duration) -> f64 {
        self.temperature.map_or(IDLE_TEMPERATURE_C, |r| r.at(t))
    }

    fn memory_pct_at(&self, t: Duration, busy: bool) -> f64 {
        let unscripted = if busy { BUSY_MEMORY_PCT } else { 0.0 };
        self.memory_pct.map_or(unscripted, |r| r.at(t))
    }

    fn utilization_pct_at(&self, t: Duration, busy_pct: Option<f64>) -> f64 {
        self.utilization_pct
            .map_or(busy_pct.unwrap_or(0.0), |r| r.at(t))
    }
}

#[derive(Debug, Clone)]
struct NodeState {
    stopped: bool,
    gpus: Vec<GpuState>,
}

pub struct SimBackend {
    node: SimNode,
    script: FaultScript,
    start: DateTime<Utc>,
    clock: SharedClock,
    /// Index of the first fault whose event has not been delivered yet.
    next_event: Mutex<usize>,
    /// GPUs that leases hold now.
    busy: Mutex<BTreeSet<u32>>,
}

impl SimBackend {
    /// A backend for `node` whose time starts at `start`; `clock` is read
    /// by `wait_events` only.
    pub fn new(
        node: SimNode,
        script: FaultScript,
        start: DateTime<Utc>,
        clock: SharedClock,
    ) -> Result<Self, FaultScriptError> {
        script.check_gpus(node.gpu_count, &format!("for node {}", node.id))?;
        Ok(Self {
            node,
            script,
            start,
            clock,
            next_event: Mutex::new(0),
            busy: Mutex::new(BTreeSet::new()),
        })
    }

    /// The backend for a fleet-file node, with the fault script its
    /// `faults` names (relative to the fleet file), starting now.
    pub fn for_node(node: &SimNode, fleet_file: &Path) -> Result<Self, FaultScriptError> {
        let script = node.fault_script(fleet_file)?.unwrap_or_default();
        let clock = SystemClock::shared();
        let start = clock.now();
        Self::new(node.clone(), script, start, clock)
    }

    fn elapsed(&self, now: DateTime<Utc>) -> Duration {
        (now - self.start).to_std().unwrap_or(Duration::ZERO)
    }

    /// Folds every fault due by `t` into the node's state.
    fn state_at(&self, t: Duration) -> NodeState {
        let mut node = NodeState {
            stopped: false,
            gpus: vec![GpuState::default(); self.node.gpu_count as usize],
        };
        for fault in self.script.faults.iter().take_while(|f| f.after <= t) {
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
                    g.off_the_bus |= *code == XID_FALLEN_OFF_THE_BUS;
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

    /// The events of faults due by `now` that were not delivered yet.
    fn take_due_events(&self, t: Duration) -> Vec<GpuEvent> {
        let mut next = self.next_event.lock().expect("next event");
        let mut out = Vec::new();
        while let Some(fault) = self.script.faults.get(*next) {
            if fault.after > t || out.len() >= MAX_EVENTS_PER_WAIT {
                break;
            }
            *next += 1;
            let kind = match fault.action {
                FaultAction::Xid { code } => GpuEventKind::Xid(code),
                FaultAction::EccDoubleBit => GpuEventKind::EccDoubleBit,
                _ => continue,
            };
            out.push(GpuEvent {
                index: fault.gpu.unwrap_or_default(),
                kind,
                at: self.start + chrono::Duration::from_std(fault.after).unwrap_or_default(),
            });
        }
        out
    }

    /// Time until the next undelivered event, if any.
    fn next_event_after(&self, t: Duration) -> Option<Duration> {
        let next = *self.next_event.lock().expect("next event");
        self.script.faults[next.min(self.script.faults.len())..]
            .iter()
            .find(|f| {
                matches!(
                    f.action,
                    FaultAction::Xid { .. } | FaultAction::EccDoubleBit
                )
            })
            .map(|f| f.after.saturating_sub(t))
    }
}

impl GpuState {
    fn recover(&mut self) {
        self.temperature = None;
        self.memory_pct = None;
        self.utilization_pct = None;
        self.off_the_bus = false;
    }
}

impl GpuBackend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn inventory(&self) -> Result<Vec<GpuDevice>, BackendError> {
        if self.state_at(self.elapsed(self.clock.now())).stopped {
            return Err(BackendError::NodeStopped);
        }
        Ok(self
            .node
            .inventory()
            .gpus
            .into_iter()
            .map(|g| GpuDevice {
                index: g.index,
                uuid: g.uuid,
                model: g.model,
                vram_mib: u64::from(g.vram_gb) * 1024,
                mig_enabled: g.mig,
                // Instances are cut per lease by the agent; the simulated
                // GPU starts with none.
                mig_devices: Vec::new(),
                nvlink_peers: Vec::new(),
                numa_node: None,
            })
            .collect())
    }

    fn sample(&self, now: DateTime<Utc>) -> Result<Vec<GpuSample>, BackendError> {
        let t = self.elapsed(now);
        let state = self.state_at(t);
        if state.stopped {
            return Err(BackendError::NodeStopped);
        }
        let memory_total_mib = u64::from(self.node.vram_gb) * 1024;
        let busy = self.busy.lock().expect("busy GPUs").clone();
        let busy_pct = f64::from(self.node.busy_utilization_pct());
        Ok(state
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| !g.off_the_bus)
            .map(|(i, g)| {
                let held = busy.contains(&(i as u32));
                (i, g, held)
            })
            .map(|(i, g, held)| GpuSample {
                index: i as u32,
                utilization_pct: Some(
                    g.utilization_pct_at(t, held.then_some(busy_pct)).round() as u32
                ),
                memory_used_mib: (memory_total_mib as f64 * g.memory_pct_at(t, held) / 100.0)
                    .round() as u64,
                memory_total_mib,
                temperature_c: g.temperature_at(t).round() as u32,
                power_w: IDLE_POWER_W,
                ecc_double_bit_total: Some(g.ecc_double_bit_total),
                processes: Vec::new(),
            })
            .collect())
    }

    fn set_busy(&self, gpus: &BTreeSet<u32>) {
        *self.busy.lock().expect("busy GPUs") = gpus.clone();
    }

    /// Returns the events due by the injected clock's now. When none is due
    /// it sleeps (real time) until the next one or `timeout`, like NVML;
    /// tests on a `ManualClock` pass `Duration::ZERO` and never sleep.
    fn wait_events(&self, timeout: Duration) -> Result<Vec<GpuEvent>, BackendError> {
        let t = self.elapsed(self.clock.now());
        if self.state_at(t).stopped {
            return Err(BackendError::NodeStopped);
        }
        let due = self.take_due_events(t);
        if !due.is_empty() || timeout.is_zero() {
            return Ok(due);
        }
        let nap = self.next_event_after(t).map_or(timeout, |d| d.min(timeout));
        std::thread::sleep(nap);
        let t = self.elapsed(self.clock.now());
        if self.state_at(t).stopped {
            return Err(BackendError::NodeStopped);
        }
        Ok(self.take_due_events(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_service::clock::ManualClock;

    fn node(gpus: u32) -> SimNode {
        toml::from_str(&format!(
            "id = \"n\"\nzone = \"z\"\nhostname = \"h\"\ngpu_model = \"A100-40GB\"\ngpu_count = {gpus}\nvram_gb = 40\n"
        ))
        .unwrap()
    }

    fn t0() -> DateTime<Utc> {
        "2026-12-01T00:00:00Z".parse().unwrap()
    }

    fn at(s: f64) -> DateTime<Utc> {
        t0() + chrono::Duration::from_std(Duration::from_secs_f64(s)).unwrap()
    }

    fn backend(script: &str) -> (SimBackend, ManualClock) {
        let clock = ManualClock::new(t0());
        let script = FaultScript::parse(script, "test").unwrap();
        let b = SimBackend::new(node(2), script, t0(), clock.shared()).unwrap();
        (b, clock)
    }

    #[test]
    fn idle_node_reads_cool_and_empty() {
        let (b, _) = backend("");
        let s = b.sample(at(100.0)).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].temperature_c, 40);
        assert_eq!(s[0].memory_used_mib, 0);
        assert_eq!(s[0].memory_total_mib, 40 * 1024);
        assert_eq!(s[0].ecc_double_bit_total, Some(0));
        let inv = b.inventory().unwrap();
        assert_eq!(inv.len(), 2);
        assert_eq!(inv[1].uuid, node(2).inventory().gpus[1].uuid);
        assert_eq!(inv[1].vram_mib, 40 * 1024);
    }

    #[test]
    fn temperature_ramps_linearly_then_holds_until_recover() {
        let (b, _) = backend(
            r#"
            [[fault]]
            after_s = 10
            gpu = 1
            kind = "temperature"
            to_c = 90
            over_s = 5
            [[fault]]
            after_s = 30
            gpu = 1
            kind = "recover"
            "#,
        );
        let temp = |s: f64| b.sample(at(s)).unwrap()[1].temperature_c;
        assert_eq!(temp(9.0), 40);
        assert_eq!(temp(10.0), 40);
        assert_eq!(temp(12.5), 65);
        assert_eq!(temp(15.0), 90);
        assert_eq!(temp(29.0), 90);
        assert_eq!(temp(30.0), 40);
        assert_eq!(b.sample(at(12.5)).unwrap()[0].temperature_c, 40);
    }

    #[test]
    fn memory_goes_to_its_share_of_vram() {
        let (b, _) = backend("[[fault]]\nafter_s = 1\ngpu = 0\nkind = \"memory\"\nto_pct = 97\n");
        let s = b.sample(at(1.0)).unwrap();
        assert_eq!(
            s[0].memory_used_mib,
            (40.0 * 1024.0 * 0.97_f64).round() as u64
        );
        assert!(s[0].memory_used_pct() >= 96.99);
    }

    #[test]
    fn xid_79_takes_the_gpu_off_the_bus_until_recover() {
        let (b, clock) = backend(
            r#"
            [[fault]]
            after_s = 5
            gpu = 0
            kind = "xid"
            code = 79
            [[fault]]
            after_s = 20
            gpu = 0
            kind = "recover"
            "#,
        );
        clock.set(at(4.0));
        assert!(b.wait_events(Duration::ZERO).unwrap().is_empty());
        clock.set(at(6.0));
        let events = b.wait_events(Duration::ZERO).unwrap();
        assert_eq!(
            events,
            vec![GpuEvent {
                index: 0,
                kind: GpuEventKind::Xid(79),
                at: at(5.0)
            }]
        );
        // Delivered once.
        assert!(b.wait_events(Duration::ZERO).unwrap().is_empty());
        let indices = |s: f64| {
            b.sample(at(s))
                .unwrap()
                .iter()
                .map(|s| s.index)
                .collect::<Vec<_>>()
        };
        assert_eq!(indices(6.0), [1]);
        assert_eq!(indices(20.0), [0, 1]);
    }

    #[test]
    fn ecc_fault_fires_an_event_and_moves_the_counter() {
        let (b, clock) = backend("[[fault]]\nafter_s = 3\ngpu = 1\nkind = \"ecc_double_bit\"\n");
        clock.set(at(3.0));
        let e = b.wait_events(Duration::ZERO).unwrap();
        assert_eq!(e[0].kind, GpuEventKind::EccDoubleBit);
        assert_eq!(e[0].index, 1);
        assert_eq!(b.sample(at(2.0)).unwrap()[1].ecc_double_bit_total, Some(0));
        assert_eq!(b.sample(at(3.0)).unwrap()[1].ecc_double_bit_total, Some(1));
        // A recover does not rewind the counter.
    }

    #[test]
    fn node_stop_fails_every_call_until_recovered() {
        let (b, clock) = backend(
            "[[fault]]\nafter_s = 2\nkind = \"node_stop\"\n[[fault]]\nafter_s = 9\nkind = \"recover\"\n",
        );
        assert!(b.sample(at(1.0)).is_ok());
        let err = b.sample(at(2.0)).unwrap_err();
        assert!(err.is_node_stopped(), "{err}");
        clock.set(at(3.0));
        assert!(b.wait_events(Duration::ZERO).unwrap_err().is_node_stopped());
        assert!(b.inventory().unwrap_err().is_node_stopped());
        assert!(b.sample(at(9.0)).is_ok());
    }

    #[test]
    fn wait_events_sleeps_only_until_the_next_fault() {
        // On the wall clock, an event 50 ms out arrives well before a
        // 5-second timeout.
        let script = FaultScript::parse(
            "[[fault]]\nafter_s = 0.05\ngpu = 0\nkind = \"xid\"\ncode = 13\n",
            "test",
        )
        .unwrap();
        let clock = SystemClock::shared();
        let b = SimBackend::new(node(1), script, clock.now(), clock).unwrap();
        let started = std::time::Instant::now();
        let events = b.wait_events(Duration::from_secs(5)).unwrap();
        assert_eq!(events.len(), 1);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn scripts_are_checked() {
        let bad = |text: &str| FaultScript::parse(text, "f.toml").unwrap_err().to_string();
        let e = bad("[[fault]]\nafter_s = 1\nkind = \"xid\"\ncode = 79\n");
        assert!(e.contains("fault 1") && e.contains("needs a gpu"), "{e}");
        let e = bad("[[fault]]\nafter_s = 1\ngpu = 0\nkind = \"temperature\"\n");
        assert!(e.contains("to_c"), "{e}");
        let e = bad("[[fault]]\nafter_s = 1\ngpu = 0\nkind = \"xid\"\ncode = 1\nto_c = 3\n");
        assert!(e.contains("to_c does not apply"), "{e}");
        let e = bad("[[fault]]\nafter_s = 1\ngpu = 0\nkind = \"meltdown\"\n");
        assert!(e.contains("meltdown"), "{e}");
        let e = bad("[[fault]]\nafter_s = 1\ngpu = 0\nkind = \"memory\"\nto_pct = 120\n");
        assert!(e.contains("0..=100"), "{e}");
        let e = bad("[[fault]]\nafter_s = -1\ngpu = 0\nkind = \"ecc_double_bit\"\n");
        assert!(e.contains("after_s"), "{e}");
        let e = bad("[[fault]]\nafter_s = 1\ngpu = 0\nkind = \"node_stop\"\n");
        assert!(e.contains("takes no gpu"), "{e}");
        let e = bad("[[fault]]\nafter_s = 1\ngpu = 0\nkind = \"recover\"\ncolour = 1\n");
        assert!(e.contains("colour"), "{e}");

        let script =
            FaultScript::parse("[[fault]]\nafter_s = 1\ngpu = 2\nkind = \"recover\"\n", "f")
                .unwrap();
        let e = SimBackend::new(node(2), script, t0(), SystemClock::shared())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("gpu 2 but the node has 2 GPUs"), "{e}");
    }

    #[test]
    fn faults_are_ordered_by_time() {
        let s = FaultScript::parse(
            "[[fault]]\nafter_s = 9\ngpu = 0\nkind = \"recover\"\n[[fault]]\nafter_s = 1\ngpu = 0\nkind = \"ecc_double_bit\"\n",
            "f",
        )
        .unwrap();
        assert_eq!(s.faults[0].action, FaultAction::EccDoubleBit);
        assert_eq!(s.faults[1].after, Duration::from_secs(9));
    }

    #[test]
    fn the_example_script_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dev/faults.toml");
        let script = FaultScript::load(&path).unwrap();
        assert!(!script.faults.is_empty());
        script.check_gpus(8, "dev/faults.toml").unwrap();
    }
}
