//! The workload side's own task: it owns [`Workloads`], carries out the
//! starts and stops the agent decides on, in the order decided, and reports
//! back what came of them. Starting a workload spawns a process or a
//! container, which the agent's decisions never wait on.

use std::time::Duration;

use lh_bus::Bus;
use lh_events::{subject, AssignedGpu, EventData, WorkloadSpec};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::supervisor::{Finished, Workloads};
use crate::state::Workload;

/// Tries at reading a lease's request back from the log before the start
/// fails, and the wait between them.
const REQUEST_READ_TRIES: u32 = 10;
const REQUEST_READ_WAIT: Duration = Duration::from_millis(500);

/// What the agent asks of the workload side.
#[derive(Debug)]
pub(crate) enum Command {
    /// Run the lease's workload for `placement` (a workload still running
    /// for an earlier placement of the lease stops first).
    Start {
        lease_id: Uuid,
        placement: u64,
        gpus: Vec<AssignedGpu>,
        workload: Workload,
    },
    /// Stop the lease's workload: SIGTERM, the grace period, then SIGKILL.
    Stop { lease_id: Uuid },
    /// Stop the lease's workload if it runs for another placement than
    /// this one (the lease moved to other GPUs of the node).
    StopStale { lease_id: Uuid, placement: u64 },
}

/// What the workload side tells the agent.
#[derive(Debug)]
pub(crate) enum Report {
    /// What came of a [`Command::Start`]: whether a workload runs (false:
    /// nothing to run, a simulated node or a lease without a workload), or
    /// why it cannot run here.
    Started {
        lease_id: Uuid,
        placement: u64,
        outcome: Result<bool, String>,
    },
    /// A workload ended, on its own or stopped.
    Ended(Finished),
}

/// Starts the task; it ends when the agent drops its command sender.
pub(crate) fn spawn(
    bus: Bus,
    mut workloads: Workloads,
    mut finished: mpsc::UnboundedReceiver<Finished>,
) -> (
    mpsc::UnboundedSender<Command>,
    mpsc::UnboundedReceiver<Report>,
) {
    let (command_tx, mut commands) = mpsc::unbounded_channel::<Command>();
    let (report_tx, reports) = mpsc::unbounded_channel::<Report>();
    tokio::spawn(async move {
        loop {
            let report = tokio::select! {
                command = commands.recv() => match command {
                    None => return,
                    Some(command) => carry_out(&bus, &mut workloads, command).await,
                },
                Some(f) = finished.recv() => {
                    workloads.forget(f.lease_id, f.placement);
                    Some(Report::Ended(f))
                }
            };
            if let Some(report) = report {
                if report_tx.send(report).is_err() {
                    return;
                }
            }
        }
    });
    (command_tx, reports)
}

async fn carry_out(bus: &Bus, workloads: &mut Workloads, command: Command) -> Option<Report> {
    match command {
        Command::Start {
            lease_id,
            placement,
            gpus,
            workload,
        } => {
            workloads.stop_stale(lease_id, placement);
            // Started before, and the report did not get through: it keeps
            // running.
            let outcome = if workloads.is_running(lease_id, placement) {
                Ok(true)
            } else {
                match workload {
                    Workload::Known(spec) => Ok(spec),
                    Workload::Unknown if !workloads.runs_workloads() => Ok(None),
                    Workload::Unknown => requested_workload(bus, lease_id).await,
                }
                .and_then(|spec| {
                    workloads
                        .start(lease_id, placement, &gpus, spec.as_ref())
                        .map_err(|e| e.to_string())
                })
            };
            Some(Report::Started {
                lease_id,
                placement,
                outcome,
            })
        }
        Command::Stop { lease_id } => {
            workloads.stop(lease_id);
            None
        }
        Command::StopStale {
            lease_id,
            placement,
        } => {
            workloads.stop_stale(lease_id, placement);
            None
        }
    }
}

/// The workload the lease's request names, read back from the log.
async fn requested_workload(bus: &Bus, lease_id: Uuid) -> Result<Option<WorkloadSpec>, String> {
    let mut why = String::new();
    for _ in 0..REQUEST_READ_TRIES {
        match bus.first_event_on(&subject::lease(lease_id)).await {
            Ok(Some(envelope)) => {
                return match envelope.data {
                    EventData::LeaseRequested(r) => Ok(r.workload),
                    other => Err(format!(
                        "the lease's first event on the log is {}, not its request",
                        other.event_type()
                    )),
                }
            }
            Ok(None) => return Err("the log no longer holds the lease's request".into()),
            Err(e) => why = e.to_string(),
        }
        tokio::time::sleep(REQUEST_READ_WAIT).await;
    }
    Err(format!(
        "cannot read the lease's request from the log: {why}"
    ))
}
