//! The workloads running on this node: one supervisor task per lease that
//! owns its [`RunningWorkload`](super::RunningWorkload), reports its exit,
//! and stops it gracefully when the agent asks.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lh_events::{AssignedGpu, WorkloadSpec};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::{Assignment, CgroupConfig, ContainerRuntime, Exit, ProcessRuntime, Runtime, Workload};

/// How leases run on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeKind {
    /// Nothing runs: a lease "runs" from start until it is stopped.
    Sim,
    /// The lease's `workload.command` as a process group.
    Process,
    /// The lease's `workload.image` through the docker CLI.
    Docker,
    /// The lease's `workload.image` through the podman CLI.
    Podman,
}

/// A workload that ended: on its own, or because the agent stopped it.
#[derive(Debug, Clone, Copy)]
pub struct Finished {
    pub lease_id: Uuid,
    /// The placement it ran for (a lease moved to other GPUs of the same
    /// node runs anew there).
    pub placement: u64,
    pub exit: Exit,
}

/// Starts, watches and stops the workloads of the leases on this node.
pub struct Workloads {
    runtime: Option<Arc<dyn Runtime>>,
    grace: Duration,
    /// Running workloads: the placement each runs for, and its stop handle
    /// (send the grace period).
    running: HashMap<Uuid, (u64, oneshot::Sender<Duration>)>,
    finished_tx: mpsc::UnboundedSender<Finished>,
}

impl Workloads {
    /// `None` runtime: every lease is simulated.
    pub fn new(
        kind: RuntimeKind,
        container_cli: Option<PathBuf>,
        grace: Duration,
    ) -> anyhow::Result<(Self, mpsc::UnboundedReceiver<Finished>)> {
        let runtime: Option<Arc<dyn Runtime>> = match kind {
            RuntimeKind::Sim => None,
            RuntimeKind::Process => Some(Arc::new(ProcessRuntime::new(CgroupConfig::default())?)),
            RuntimeKind::Docker => Some(Arc::new(ContainerRuntime::docker(
                container_cli.unwrap_or_else(|| "docker".into()),
            ))),
            RuntimeKind::Podman => Some(Arc::new(ContainerRuntime::podman(
                container_cli.unwrap_or_else(|| "podman".into()),
            ))),
        };
        let (finished_tx, finished_rx) = mpsc::unbounded_channel();
        Ok((
            Workloads {
                runtime,
                grace,
                running: HashMap::new(),
                finished_tx,
            },
            finished_rx,
        ))
    }

    /// Starts the workload of `lease_id` on `gpus`. `Ok(false)` when there
    /// is nothing to run (simulated node, or a lease without a workload).
    pub fn start(
        &mut self,
        lease_id: Uuid,
        placement: u64,
        gpus: &[AssignedGpu],
        spec: Option<&WorkloadSpec>,
    ) -> Result<bool, super::RuntimeError> {
        let (Some(runtime), Some(spec)) = (&self.runtime, spec) else {
            return Ok(false);
        };
        let assignment = assignment(lease_id, gpus);
        let workload = Workload {
            command: spec.command.clone(),
            image: spec.image.clone(),
            env: spec.env.clone(),
        };
        let mut handle = runtime.start(&assignment, &workload)?;
        tracing::info!(lease = %lease_id, pid = handle.pid(), "workload started");
        let (stop_tx, stop_rx) = oneshot::channel::<Duration>();
        let finished = self.finished_tx.clone();
        tokio::spawn(async move {
            let stop = tokio::select! {
                exit = handle.wait() => Err(exit),
                grace = stop_rx => Ok(grace.unwrap_or(Duration::ZERO)),
            };
            let exit = match stop {
                Err(exit) => exit,
                Ok(grace) => handle.stop(grace).await.map(|s| s.exit),
            };
            let exit = exit.unwrap_or_else(|e| {
                tracing::warn!(lease = %lease_id, error = %e, "cannot tell how the workload ended");
                Exit {
                    code: None,
                    signal: None,
                }
            });
            let _ = finished.send(Finished {
                lease_id,
                placement,
                exit,
            });
        });
        self.running.insert(lease_id, (placement, stop_tx));
        Ok(true)
    }

    /// Stops, without a report that counts, a workload of `lease_id` that
    /// runs for another placement than `placement`.
    pub fn stop_stale(&mut self, lease_id: Uuid, placement: u64) {
        if self
            .running
            .get(&lease_id)
            .is_some_and(|(p, _)| *p != placement)
        {
            self.stop(lease_id);
        }
    }

    /// Asks the workload of `lease_id` to stop (SIGTERM, then SIGKILL after
    /// the grace period); its [`Finished`] follows. False when none runs.
    pub fn stop(&mut self, lease_id: Uuid) -> bool {
        match self.running.remove(&lease_id) {
            Some((_, stop)) => {
                let _ = stop.send(self.grace);
                true
            }
            None => false,
        }
    }

    /// The workload of `lease_id` for `placement` reported its end.
    pub fn forget(&mut self, lease_id: Uuid, placement: u64) {
        if self
            .running
            .get(&lease_id)
            .is_some_and(|(p, _)| *p == placement)
        {
            self.running.remove(&lease_id);
        }
    }

    /// Whether leases run anything here (false on a simulated node).
    pub fn runs_workloads(&self) -> bool {
        self.runtime.is_some()
    }

    pub fn is_running(&self, lease_id: Uuid, placement: u64) -> bool {
        self.running
            .get(&lease_id)
            .is_some_and(|(p, _)| *p == placement)
    }
}

/// What a lease holds on this node, as the runtime needs it: device UUIDs
/// (a MIG instance by NVIDIA's `MIG-<GPU-UUID>/<GI>/<CI>` form, with the
/// placement start standing for the GPU instance until the NVML backend
/// reports the real MIG UUID), and a share's VRAM and compute caps.
pub fn assignment(lease_id: Uuid, gpus: &[AssignedGpu]) -> Assignment {
    let device_uuids = gpus
        .iter()
        .map(|g| match &g.mig_instance {
            Some(m) => format!("MIG-{}/{}/0", g.uuid, m.start),
            None => g.uuid.clone(),
        })
        .collect();
    let share = gpus
        .first()
        .filter(|g| g.mig_instance.is_none())
        .and_then(|g| g.milli.zip(g.vram_gb));
    Assignment {
        lease_id,
        device_uuids,
        vram_limit_mib: share.map(|(_, v)| u64::from(v) * 1024),
        compute_milli: share.map(|(m, _)| m),
        memory_share_bytes: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::MigInstance;

    fn gpu(uuid: &str) -> AssignedGpu {
        AssignedGpu {
            index: 0,
            uuid: uuid.into(),
            milli: None,
            vram_gb: None,
            mig_instance: None,
        }
    }

    #[test]
    fn assignments_name_devices_and_cap_shares() {
        let l = Uuid::nil();
        let whole = assignment(l, &[gpu("GPU-a"), gpu("GPU-b")]);
        assert_eq!(whole.device_uuids, ["GPU-a", "GPU-b"]);
        assert_eq!((whole.vram_limit_mib, whole.compute_milli), (None, None));
        let share = assignment(
            l,
            &[AssignedGpu {
                milli: Some(300),
                vram_gb: Some(10),
                ..gpu("GPU-a")
            }],
        );
        assert_eq!(
            (share.vram_limit_mib, share.compute_milli),
            (Some(10 * 1024), Some(300))
        );
        let mig = assignment(
            l,
            &[AssignedGpu {
                milli: Some(428),
                vram_gb: Some(20),
                mig_instance: Some(MigInstance {
                    profile: "3g.20gb".into(),
                    start: 4,
                }),
                ..gpu("GPU-a")
            }],
        );
        assert_eq!(mig.device_uuids, ["MIG-GPU-a/4/0"]);
        assert_eq!(mig.vram_limit_mib, None, "MIG isolates memory itself");
    }
}
