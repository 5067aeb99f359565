//! The simulated backend: the GPUs of a fleet-file node, healthy and idle
//! unless a fault script says otherwise.
//!
//! A fault script is a TOML file of `[[fault]]` entries, each `after_secs`
//! seconds from the backend's start (see `docs/gpu-backends.md` and
//! `dev/faults.toml`):
//!
//! ```toml
//! [[fault]]
//! after_secs = 10
//! gpu = 0
//! kind = "temperature"   # ramps to to_c over over_secs, stays there
//! to_c = 92
//! over_secs = 5
//! ```
//!
//! Kinds: `temperature` (`to_c`, `over_secs`), `memory` (`to_pct`, `over_secs`),
//! `utilization` (`to_pct`, `over_secs`: what the GPU reads whether or not a
//! lease holds it; `to_pct = 0` makes a held GPU look idle),
//! `xid` (`code`; 79 also makes the GPU fall off the bus: no more samples),
//! `ecc_double_bit` (the counter goes up by one and an event fires),
//! `node_stop` (no `gpu`: every call fails with
//! [`BackendError::NodeStopped`], so the agent stops heartbeating), and
//! `recover` (clears the GPU's faults, or with no `gpu` every GPU's and a
//! node stop; the ECC counter stays where it is, as a real one does).
//! An `xid` or `ecc_double_bit` fault with `kills_workloads = true` also
//! kills (SIGKILL, the whole process group) the workloads running on the
//! GPU, as a real fault kills the CUDA programs on it: the workload side
//! tells the backend which process groups run on which GPUs
//! ([`GpuBackend::workload_started`]), with the `process` runtime.
//!
//! Without a script a GPU that a lease holds (the agent says which, through
//! [`GpuBackend::set_busy`]) reads the node's `busy_utilization_pct` (70 by
//! default) and a quarter of its memory in use; a free one reads zero.
//!
//! GPUs in MIG mode (the node's `mig_gpus`) start without instances; the
//! agent creates and destroys them per lease, and they follow NVIDIA's
//! placement rules (`mig.rs`). [`SimBackend::for_node`] keeps them in a file
//! of their own, so a restarted agent finds what the last one left.
//!
//! The state at any instant is a pure function of the script, the busy set
//! and the time since start (`physics.rs`), so tests drive the clock (a
//! [`lh_service::clock::ManualClock`]) instead of sleeping. Samples take
//! the caller's `now`; events are stamped with the instant their fault was
//! scheduled, and `wait_events` reads the injected clock to know which
//! faults are due.

pub mod fleet;
mod mig;
pub mod mps;
mod physics;
pub mod script;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_service::clock::{SharedClock, SystemClock};

use super::{
    BackendError, GpuBackend, GpuDevice, GpuEvent, GpuEventKind, GpuSample, MigDevice,
    MAX_EVENTS_PER_WAIT,
};
use fleet::SimNode;
use physics::{HostState, IDLE_POWER_W};
pub use script::{Fault, FaultAction, FaultScript, FaultScriptError};

pub struct SimBackend {
    node: SimNode,
    script: FaultScript,
    start: DateTime<Utc>,
    clock: SharedClock,
    /// Index of the first fault whose event has not been delivered yet.
    next_event: Mutex<usize>,
    /// GPUs that leases hold now.
    busy: Mutex<BTreeSet<u32>>,
    /// Process groups of the workloads running now, with their GPUs.
    workloads: Mutex<BTreeMap<u32, Vec<u32>>>,
    /// The MIG instances of the GPUs in MIG mode.
    mig: Mutex<mig::SimMig>,
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
        let mig = mig::SimMig::new(&node.gpu_model, &node.mig_gpus, None);
        Ok(Self {
            mig: Mutex::new(mig),
            node,
            script,
            start,
            clock,
            next_event: Mutex::new(0),
            busy: Mutex::new(BTreeSet::new()),
            workloads: Mutex::new(BTreeMap::new()),
        })
    }

    /// The backend for a fleet-file node, with the fault script its
    /// `faults` names (relative to the fleet file), starting now.
    pub fn for_node(node: &SimNode, fleet_file: &Path) -> Result<Self, FaultScriptError> {
        let script = node.fault_script(fleet_file)?.unwrap_or_default();
        let clock = SystemClock::shared();
        let start = clock.now();
        let backend = Self::new(node.clone(), script, start, clock)?;
        let file = mig::state_file(fleet_file, &node.id);
        *backend.mig.lock().expect("MIG instances") =
            mig::SimMig::new(&node.gpu_model, &node.mig_gpus, Some(file));
        Ok(backend)
    }

    fn elapsed(&self, now: DateTime<Utc>) -> Duration {
        (now - self.start).to_std().unwrap_or(Duration::ZERO)
    }

    /// The node as the faults due by `t` left it.
    fn state_at(&self, t: Duration) -> HostState {
        HostState::at(&self.script, self.node.gpu_count, t)
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
            if fault.kills_workloads {
                self.kill_workloads_on(fault.gpu.unwrap_or_default());
            }
            out.push(GpuEvent {
                index: fault.gpu.unwrap_or_default(),
                kind,
                at: self.start + chrono::Duration::from_std(fault.after).unwrap_or_default(),
            });
        }
        out
    }

    /// What the driver does to the processes on a GPU that faults: they
    /// die (SIGKILL here; a real CUDA program mostly exits on the error).
    fn kill_workloads_on(&self, gpu: u32) {
        let workloads = self.workloads.lock().expect("workloads");
        for (&pgid, _) in workloads.iter().filter(|(_, gpus)| gpus.contains(&gpu)) {
            let Ok(group) = i32::try_from(pgid) else {
                continue;
            };
            if group <= 1 {
                continue;
            }
            tracing::info!(gpu, pgid, "simulated GPU fault kills the workload on it");
            // SAFETY: killpg(2) has no memory-safety preconditions; a group
            // that has just ended is ESRCH, which is fine.
            unsafe {
                libc::killpg(group, libc::SIGKILL);
            }
        }
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

impl GpuBackend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn inventory(&self) -> Result<Vec<GpuDevice>, BackendError> {
        if self.state_at(self.elapsed(self.clock.now())).stopped {
            return Err(BackendError::NodeStopped);
        }
        let mut mig = self.mig.lock().expect("MIG instances");
        mig.reload();
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
                mig_devices: mig.devices(g.index),
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

    fn workload_started(&self, gpus: &[u32], pgid: u32) {
        self.workloads
            .lock()
            .expect("workloads")
            .insert(pgid, gpus.to_vec());
    }

    fn workload_ended(&self, pgid: u32) {
        self.workloads.lock().expect("workloads").remove(&pgid);
    }

    fn create_mig_instance(
        &self,
        gpu: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigDevice, BackendError> {
        if self.state_at(self.elapsed(self.clock.now())).stopped {
            return Err(BackendError::NodeStopped);
        }
        self.mig
            .lock()
            .expect("MIG instances")
            .create(gpu, profile, start)
    }

    fn destroy_mig_instance(&self, gpu: u32, uuid: &str) -> Result<(), BackendError> {
        if self.state_at(self.elapsed(self.clock.now())).stopped {
            return Err(BackendError::NodeStopped);
        }
        self.mig.lock().expect("MIG instances").destroy(gpu, uuid);
        Ok(())
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
    fn the_inventory_lists_the_mig_instances_made() {
        let clock = ManualClock::new(t0());
        let mut n = node(2);
        n.mig_gpus = vec![1];
        let b = SimBackend::new(n, FaultScript::default(), t0(), clock.shared()).unwrap();
        assert!(
            b.create_mig_instance(0, "1g.5gb", 0).is_err(),
            "GPU 0 is not in MIG mode"
        );
        let made = b.create_mig_instance(1, "3g.20gb", 4).unwrap();
        let inv = b.inventory().unwrap();
        assert!(inv[1].mig_enabled && !inv[0].mig_enabled);
        assert_eq!(inv[1].mig_devices, std::slice::from_ref(&made));
        assert!(
            b.create_mig_instance(1, "4g.20gb", 4).is_err(),
            "slot taken"
        );
        b.destroy_mig_instance(1, &made.uuid).unwrap();
        assert!(b.inventory().unwrap()[1].mig_devices.is_empty());
    }

    #[test]
    fn temperature_ramps_linearly_then_holds_until_recover() {
        let (b, _) = backend(
            r#"
            [[fault]]
            after_secs = 10
            gpu = 1
            kind = "temperature"
            to_c = 90
            over_secs = 5
            [[fault]]
            after_secs = 30
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
        let (b, _) =
            backend("[[fault]]\nafter_secs = 1\ngpu = 0\nkind = \"memory\"\nto_pct = 97\n");
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
            after_secs = 5
            gpu = 0
            kind = "xid"
            code = 79
            [[fault]]
            after_secs = 20
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
        let (b, clock) = backend("[[fault]]\nafter_secs = 3\ngpu = 1\nkind = \"ecc_double_bit\"\n");
        clock.set(at(3.0));
        let e = b.wait_events(Duration::ZERO).unwrap();
        assert_eq!(e[0].kind, GpuEventKind::EccDoubleBit);
        assert_eq!(e[0].index, 1);
        assert_eq!(b.sample(at(2.0)).unwrap()[1].ecc_double_bit_total, Some(0));
        assert_eq!(b.sample(at(3.0)).unwrap()[1].ecc_double_bit_total, Some(1));
        // A recover does not rewind the counter.
    }

    #[test]
    fn a_fault_that_kills_workloads_kills_those_on_its_gpu_only() {
        use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
        let (b, clock) = backend(
            "[[fault]]\nafter_secs = 3\ngpu = 1\nkind = \"xid\"\ncode = 79\nkills_workloads = true\n",
        );
        let spawn = || {
            std::process::Command::new("sleep")
                .arg("30")
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let (mut on_0, mut on_1) = (spawn(), spawn());
        b.workload_started(&[0], on_0.id());
        b.workload_started(&[1], on_1.id());
        clock.set(at(3.0));
        assert_eq!(b.wait_events(Duration::ZERO).unwrap().len(), 1);
        assert_eq!(on_1.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(on_0.try_wait().unwrap().is_none(), "GPU 0 did not fault");
        on_0.kill().unwrap();
        on_0.wait().unwrap();
    }

    #[test]
    fn node_stop_fails_every_call_until_recovered() {
        let (b, clock) = backend(
            "[[fault]]\nafter_secs = 2\nkind = \"node_stop\"\n[[fault]]\nafter_secs = 9\nkind = \"recover\"\n",
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
            "[[fault]]\nafter_secs = 0.05\ngpu = 0\nkind = \"xid\"\ncode = 13\n",
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
        let e = bad("[[fault]]\nafter_secs = 1\nkind = \"xid\"\ncode = 79\n");
        assert!(e.contains("fault 1") && e.contains("needs a gpu"), "{e}");
        let e = bad("[[fault]]\nafter_secs = 1\ngpu = 0\nkind = \"temperature\"\n");
        assert!(e.contains("to_c"), "{e}");
        let e = bad("[[fault]]\nafter_secs = 1\ngpu = 0\nkind = \"xid\"\ncode = 1\nto_c = 3\n");
        assert!(e.contains("to_c does not apply"), "{e}");
        let e = bad("[[fault]]\nafter_secs = 1\ngpu = 0\nkind = \"meltdown\"\n");
        assert!(e.contains("meltdown"), "{e}");
        let e = bad("[[fault]]\nafter_secs = 1\ngpu = 0\nkind = \"memory\"\nto_pct = 120\n");
        assert!(e.contains("0..=100"), "{e}");
        let e = bad("[[fault]]\nafter_secs = -1\ngpu = 0\nkind = \"ecc_double_bit\"\n");
        assert!(e.contains("after_secs"), "{e}");
        let e = bad("[[fault]]\nafter_secs = 1\ngpu = 0\nkind = \"node_stop\"\n");
        assert!(e.contains("takes no gpu"), "{e}");
        let e = bad("[[fault]]\nafter_secs = 1\ngpu = 0\nkind = \"recover\"\ncolour = 1\n");
        assert!(e.contains("colour"), "{e}");

        let script = FaultScript::parse(
            "[[fault]]\nafter_secs = 1\ngpu = 2\nkind = \"recover\"\n",
            "f",
        )
        .unwrap();
        let e = SimBackend::new(node(2), script, t0(), SystemClock::shared())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("gpu 2 but the node has 2 GPUs"), "{e}");
    }
}
