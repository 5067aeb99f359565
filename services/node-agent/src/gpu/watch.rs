//! The thread that reads the GPU backend: events as they come, a sample
//! every period, and the MIG instances on the GPUs in MIG mode every MIG
//! period (nothing else re-reads them: an operator may make or destroy
//! one at any time). Backend calls block (NVML's event wait does), so they run
//! on their own thread and reach the agent's loop over a bounded channel.
//! The agent hears them only once it has caught up with the log; until then
//! the thread waits on the channel, and what it read is judged in order
//! afterwards, against the health the log recorded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lh_service::clock::{Clock, SharedClock};
use tokio::sync::mpsc;

use super::backend::{GpuBackend, GpuDevice, GpuEvent, GpuSample};

/// Longest a single event wait may block, so the thread notices the agent
/// is gone and keeps sampling on time.
const LONGEST_WAIT: Duration = Duration::from_millis(250);

#[derive(Debug)]
pub enum Observation {
    Events(Vec<GpuEvent>),
    Samples {
        at: DateTime<Utc>,
        samples: Vec<GpuSample>,
    },
    /// The host stopped answering (the simulated power-off): the agent goes
    /// silent, as a dead host would.
    NodeStopped,
    /// It answers again.
    NodeBack,
    /// The GPUs in MIG mode with the instances on them now.
    MigDevices(Vec<GpuDevice>),
    /// A backend call failed; the reason is for the log.
    Failed(String),
}

/// Starts the thread; it ends when the receiver is dropped. The MIG
/// instances are read every `mig_period`, first at once; never when it is
/// zero or once a read finds no GPU in MIG mode (switching it takes a GPU
/// reset, and the agent's restart).
pub fn spawn(
    backend: Arc<dyn GpuBackend>,
    period: Duration,
    mig_period: Duration,
    clock: SharedClock,
) -> mpsc::Receiver<Observation> {
    let (tx, rx) = mpsc::channel(64);
    std::thread::Builder::new()
        .name(format!("gpu-watch-{}", backend.name()))
        .spawn(move || watch(backend.as_ref(), period, mig_period, clock.as_ref(), &tx))
        .expect("the GPU watch thread starts");
    rx
}

fn watch(
    backend: &dyn GpuBackend,
    period: Duration,
    mig_period: Duration,
    clock: &dyn Clock,
    tx: &mpsc::Sender<Observation>,
) {
    let mut stopped = false;
    let mut next_sample = Instant::now();
    let mut next_mig_read = (!mig_period.is_zero()).then(Instant::now);
    let send = |o: Observation| tx.blocking_send(o).is_ok();
    loop {
        if let Some(due) = next_mig_read.filter(|&due| Instant::now() >= due) {
            next_mig_read = Some((due + mig_period).max(Instant::now()));
            match backend.inventory() {
                Ok(gpus) => {
                    let in_mig: Vec<GpuDevice> =
                        gpus.into_iter().filter(|g| g.mig_enabled).collect();
                    if in_mig.is_empty() {
                        next_mig_read = None;
                    } else if !send(Observation::MigDevices(in_mig)) {
                        return;
                    }
                }
                // Told by the samples below.
                Err(e) if e.is_node_stopped() => {}
                Err(e) => {
                    if !send(Observation::Failed(e.to_string())) {
                        return;
                    }
                }
            }
        }
        let wait = next_sample
            .saturating_duration_since(Instant::now())
            .min(LONGEST_WAIT);
        let mut answered = true;
        match backend.wait_events(wait) {
            Ok(events) if events.is_empty() => {}
            Ok(events) => {
                if !send(Observation::Events(events)) {
                    return;
                }
            }
            Err(e) if e.is_node_stopped() => answered = false,
            Err(e) => {
                if !send(Observation::Failed(e.to_string())) {
                    return;
                }
                std::thread::sleep(wait);
            }
        }
        if Instant::now() >= next_sample {
            // Late (a slow call): the next one is a period from now, not a burst.
            next_sample = (next_sample + period).max(Instant::now());
            let at = clock.now();
            match backend.sample(at) {
                Ok(samples) => {
                    if !send(Observation::Samples { at, samples }) {
                        return;
                    }
                }
                Err(e) if e.is_node_stopped() => answered = false,
                Err(e) => {
                    if !send(Observation::Failed(e.to_string())) {
                        return;
                    }
                }
            }
        }
        if answered == stopped {
            stopped = !answered;
            let o = match stopped {
                true => Observation::NodeStopped,
                false => Observation::NodeBack,
            };
            if !send(o) {
                return;
            }
        }
        if !answered {
            std::thread::sleep(wait.max(Duration::from_millis(20)));
        }
        if tx.is_closed() {
            return;
        }
    }
}
