//! The workload side's own task: it owns [`Workloads`], carries out the
//! starts and stops the agent decides on, in the order decided, and reports
//! back what came of them. Starting a workload spawns a process or a
//! container, which the agent's decisions never wait on; reading a moved
//! lease's request back from the log, and fetching a workload's
//! environment from the gateway, is a task of its own again, so that a
//! slow log or gateway never holds a stop back. A MIG lease's instances
//! are created the same way, before its workload starts, and destroyed
//! once its workload has ended or was stopped ([`MigInstances`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lh_bus::Bus;
use lh_events::{AssignedGpu, StartedMigDevice, WorkloadSpec, WorkspaceSyncReason};
use lh_rpc::workload_env::{StorageGrant, WorkloadEnvReply};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::gang::GangPart;
use super::supervisor::{Finished, Workloads};
use crate::gpu::mig::{MigInstances, MigPlaced};
use crate::state::Workload;
use crate::storage::NodeStorage;

/// Waits between tries at fetching a workload's environment while the
/// gateway does not answer: the first, and the longest.
const ENV_FETCH_WAIT_MIN: Duration = Duration::from_millis(500);
const ENV_FETCH_WAIT_MAX: Duration = Duration::from_secs(5);
/// How long one request for a workload's environment waits for the gateway.
const ENV_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a workload waits for its environment (the gateway out of reach,
/// or not yet showing the lease here) before its lease fails: a workload
/// started without the values it was given would run wrong.
const ENV_FETCH_GIVE_UP_AFTER: Duration = Duration::from_secs(300);

/// What the agent asks of the workload side.
#[derive(Debug, Clone)]
pub(crate) enum Command {
    /// Run the lease's workload for `placement` (a workload still running
    /// for an earlier placement of the lease stops first).
    Start {
        lease_id: Uuid,
        placement: u64,
        gpus: Vec<AssignedGpu>,
        workload: Workload,
        /// Whose lease it is: a container on its tenant's network joins
        /// that one.
        tenant_id: Option<Uuid>,
        /// Its part of a gang: its command runs once per GPU, with the
        /// rendezvous in its environment.
        gang: Option<GangPart>,
    },
    /// Stop the lease's workload: SIGTERM, the grace period, then SIGKILL;
    /// `reason` is what its workspaces' last sync records.
    Stop {
        lease_id: Uuid,
        reason: WorkspaceSyncReason,
    },
    /// Tell the lease's workload its spot preemption comes at `deadline`:
    /// a signal and a file, so that it can checkpoint first.
    Notice {
        lease_id: Uuid,
        deadline: chrono::DateTime<chrono::Utc>,
        reason: lh_events::PreemptionReason,
    },
    /// Stop the lease's workload if it runs for another placement than
    /// this one (the lease moved to other GPUs of the node).
    StopStale { lease_id: Uuid, placement: u64 },
    /// The lease's run here is over (reported ended or suspended): what it
    /// held on the host goes, its MIG instances once no workload of it
    /// runs on them.
    Release { lease_id: Uuid },
    /// Adopt what a previous agent left running for these leases (with
    /// their placement here); stop and remove everything else it left.
    /// The MIG instances of `mig_placed` are adopted too, those in the
    /// slots of `mig_over` (leases moved away from here) destroyed; other
    /// instances are reported, never touched.
    Reconcile {
        placed_here: HashMap<Uuid, u64>,
        /// The GPU of each memory-sliced share placed here.
        share_gpus: HashMap<Uuid, AssignedGpu>,
        mig_placed: Vec<MigPlaced>,
        mig_over: Vec<MigPlaced>,
        /// The tenant and request of each lease placed here whose workload
        /// has data (datasets, workspaces, the store): an adopted one's is
        /// found again.
        with_data: HashMap<Uuid, (Uuid, WorkloadSpec)>,
        /// The link of each gang member placed here: an adopted one is
        /// linked again, and its link released at its end.
        gang_links: HashMap<Uuid, super::gang_link::GangLink>,
    },
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
        /// The MIG devices the lease runs on (a MIG lease only).
        mig_devices: Vec<StartedMigDevice>,
        /// A container still to be run by its engine (its image being
        /// pulled): [`Report::Running`] tells when it runs. The lease starts,
        /// and is billed, from then.
        not_yet_running: bool,
    },
    /// The container of a [`Report::Started`] with `not_yet_running` runs.
    Running { lease_id: Uuid, placement: u64 },
    /// A workload ended, on its own or stopped.
    Ended(Finished),
    /// What a [`Command::Reconcile`] adopted: these leases' workloads run,
    /// for these placements.
    Reconciled { adopted: Vec<(Uuid, u64)> },
}

/// A lease's request, read back from the log for a start.
struct Resolved {
    lease_id: Uuid,
    placement: u64,
    gpus: Vec<AssignedGpu>,
    tenant_id: Option<Uuid>,
    workload: Result<Option<WorkloadSpec>, String>,
    /// Its datasets staged and workspaces restored, when it has any.
    storage: Option<crate::storage::Prepared>,
    /// The MIG instances created for it, or why they could not be.
    mig: Result<Vec<StartedMigDevice>, String>,
}

/// An adopted workload's data, found again after the adoption.
struct Resumed {
    lease_id: Uuid,
    placement: u64,
    session: Option<Arc<crate::storage::LeaseStorage>>,
    holds: Vec<crate::storage::cache::CacheHold>,
    relay: Option<super::store_relay::RelayTask>,
}

/// Starts the task; it ends when the agent drops its command sender.
/// How often the workload side looks for workloads of this node that it
/// does not supervise, and stops them.
pub const ORPHAN_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

pub(crate) fn spawn(
    bus: Bus,
    node_id: String,
    workloads: Workloads,
    storage: Option<Arc<NodeStorage>>,
    mut finished: mpsc::UnboundedReceiver<Finished>,
) -> (
    mpsc::UnboundedSender<Command>,
    mpsc::UnboundedReceiver<Report>,
) {
    let (command_tx, mut commands) = mpsc::unbounded_channel::<Command>();
    let (report_tx, reports) = mpsc::unbounded_channel::<Report>();
    let (resolved_tx, mut resolved) = mpsc::unbounded_channel::<Resolved>();
    let (running_tx, mut running) = mpsc::unbounded_channel::<(Uuid, u64)>();
    let (resumed_tx, mut resumed) = mpsc::unbounded_channel::<Resumed>();
    let mig = MigInstances::new(workloads.gpu_backend());
    let mut side = WorkloadSide {
        bus,
        node_id,
        mig,
        workloads,
        storage,
        looking_up: HashMap::new(),
        resolved_tx,
        after_stop: HashMap::new(),
        gangs: HashMap::new(),
        starting: HashMap::new(),
        running_tx,
        resumed_tx,
    };
    tokio::spawn(async move {
        let mut sweep = tokio::time::interval(ORPHAN_SWEEP_EVERY);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reconciled_once = false;
        loop {
            let report = tokio::select! {
                command = commands.recv() => match command {
                    None => return,
                    // Once, at start, before any other command: nothing
                    // else waits on the workload side meanwhile.
                    Some(Command::Reconcile { placed_here, share_gpus, mig_placed, mig_over, with_data, gang_links }) => {
                        let reconciled = side.workloads.reconcile_gangs(&placed_here, &gang_links).await;
                        side.workloads.reconcile_shares(&reconciled.adopted, &share_gpus);
                        side.resume_data(&reconciled.adopted, with_data);
                        side.mig.adopt(mig_placed, mig_over).await;
                        reconciled_once = true;
                        Some(Report::Reconciled { adopted: reconciled.adopted })
                    }
                    Some(command) => side.carry_out(command),
                },
                // In the one task that starts workloads: a start is
                // supervised before the sweep can look.
                _ = sweep.tick(), if reconciled_once => {
                    side.workloads.sweep_orphans().await;
                    None
                }
                Some(r) = resolved.recv() => side.resolved(r),
                Some(r) = resumed.recv() => {
                    side.workloads.attach_data(r.lease_id, r.placement, r.session, r.holds, r.relay);
                    None
                }
                Some((lease_id, placement)) = running.recv() => side.now_running(lease_id, placement),
                Some(f) = finished.recv() => {
                    // It ran (its running may be told here first, as the
                    // two come on different channels), or it ended before
                    // it ran: the image missing, stopped while pulling.
                    let running = side.now_running(f.lease_id, f.placement);
                    if let Some(running) = running.filter(|_| f.ran) {
                        if report_tx.send(running).is_err() {
                            return;
                        }
                    }
                    side.workloads.forget(f.lease_id, f.placement);
                    side.mig.release(f.lease_id, |p| p != f.placement);
                    let lease_id = f.lease_id;
                    if report_tx.send(Report::Ended(f)).is_err() {
                        return;
                    }
                    // Its successor on this node starts now.
                    side.after_stop.remove(&lease_id).and_then(|start| side.carry_out(start))
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

struct WorkloadSide {
    bus: Bus,
    node_id: String,
    workloads: Workloads,
    /// Leases' datasets and workspaces; `None` where the node keeps none.
    storage: Option<Arc<NodeStorage>>,
    mig: MigInstances,
    /// Leases whose request is being read back, with the placement it is
    /// for: a stop, or a newer start, makes the answer moot.
    looking_up: HashMap<Uuid, u64>,
    resolved_tx: mpsc::UnboundedSender<Resolved>,
    /// Starts that wait for the lease's previous workload (an earlier
    /// placement on this node) to end: the two would share its marks on
    /// the host (a container's name, its cgroups).
    after_stop: HashMap<Uuid, Command>,
    /// The gang part of each lease started as one.
    gangs: HashMap<Uuid, GangPart>,
    /// Containers started and not yet running (their image being pulled),
    /// with their placement: a lease starts, and is billed, from when its
    /// container runs.
    starting: HashMap<Uuid, u64>,
    running_tx: mpsc::UnboundedSender<(Uuid, u64)>,
    resumed_tx: mpsc::UnboundedSender<Resumed>,
}

impl WorkloadSide {
    /// Finds the data of the adopted workloads of `adopted` that have any
    /// again: their datasets held in the cache at once, then, with the
    /// tenant's storage from the gateway, their workspaces' syncs and their
    /// way to the store. A failure is logged; the workload runs on.
    fn resume_data(
        &mut self,
        adopted: &[(Uuid, u64)],
        mut with_data: HashMap<Uuid, (Uuid, WorkloadSpec)>,
    ) {
        let Some(storage) = self.storage.clone() else {
            return;
        };
        for &(lease_id, placement) in adopted {
            let Some((tenant_id, spec)) = with_data.remove(&lease_id) else {
                continue;
            };
            if !self.workloads.awaits_data(lease_id, placement) {
                continue;
            }
            let holds = storage.hold_datasets(tenant_id, &spec);
            let engine = self.workloads.container_engine();
            let (bus, node_id, resumed) = (
                self.bus.clone(),
                self.node_id.clone(),
                self.resumed_tx.clone(),
            );
            let storage = storage.clone();
            tokio::spawn(async move {
                let mut asked = spec.clone();
                let grant = match fetch_env(&bus, &node_id, lease_id, &mut asked).await {
                    Ok(Some(grant)) => Some(grant),
                    Ok(None) => None,
                    Err(why) => {
                        tracing::warn!(lease = %lease_id, why,
                            "an adopted workload's storage is not given: its workspaces are not synced");
                        None
                    }
                };
                let session = match &grant {
                    Some(grant) => storage
                        .resume(&bus, grant, lease_id, placement, &spec)
                        .await
                        .unwrap_or_else(|why| {
                            tracing::warn!(lease = %lease_id, why,
                                "an adopted workload's workspaces are not synced");
                            None
                        }),
                    None => None,
                };
                let relay = match (&grant, engine) {
                    (Some(grant), Some(engine)) if spec.object_store => {
                        match super::store_relay::Target::of(grant) {
                            Ok(target) => Some(super::store_relay::spawn_reopen(
                                engine,
                                super::container::container_name(lease_id),
                                target,
                            )),
                            Err(why) => {
                                tracing::warn!(lease = %lease_id, why, "no store relay");
                                None
                            }
                        }
                    }
                    _ => None,
                };
                if session.is_some() {
                    tracing::info!(lease = %lease_id, "an adopted workload's workspaces are synced again");
                }
                let _ = resumed.send(Resumed {
                    lease_id,
                    placement,
                    session,
                    holds,
                    relay,
                });
            });
        }
    }

    /// The container started for `placement` runs now, if that is still
    /// to be told.
    fn now_running(&mut self, lease_id: Uuid, placement: u64) -> Option<Report> {
        match self.starting.get(&lease_id) {
            Some(p) if *p == placement => {
                self.starting.remove(&lease_id);
                Some(Report::Running {
                    lease_id,
                    placement,
                })
            }
            _ => None,
        }
    }

    /// Carries out `command` at once (reading a request back is left to a
    /// task of its own, so a slow log holds no stop back).
    fn carry_out(&mut self, command: Command) -> Option<Report> {
        let waits = match &command {
            Command::Start {
                lease_id,
                placement,
                ..
            } => {
                self.workloads.stop_stale(*lease_id, *placement);
                self.workloads.is_stopping(*lease_id)
            }
            _ => false,
        };
        if let (true, Command::Start { lease_id, .. }) = (waits, &command) {
            self.looking_up.remove(lease_id);
            self.after_stop.insert(*lease_id, command);
            return None;
        }
        match command {
            Command::Start {
                lease_id,
                placement,
                gpus,
                workload,
                tenant_id,
                gang,
            } => {
                match gang {
                    Some(part) => self.gangs.insert(lease_id, part),
                    None => self.gangs.remove(&lease_id),
                };
                self.release_mig(lease_id, |p| p == placement);
                self.workloads.stop_stale(lease_id, placement);
                self.looking_up.remove(&lease_id);
                // Started before, and the report did not get through: it
                // keeps running.
                if self.workloads.is_running(lease_id, placement) {
                    return Some(Report::Started {
                        lease_id,
                        placement,
                        outcome: Ok(true),
                        mig_devices: self.mig.held(lease_id, placement),
                        not_yet_running: false,
                    });
                }
                if self.mig.to_create(lease_id, placement, &gpus) {
                    let known = match workload {
                        _ if !self.workloads.runs_workloads() => Some(None),
                        Workload::Known(spec) => Some(spec),
                        Workload::Unknown => None,
                    };
                    self.look_up(lease_id, placement, gpus, tenant_id, known);
                    return None;
                }
                if !self.workloads.runs_workloads() {
                    return self.start(lease_id, placement, &gpus, tenant_id, Ok(None));
                }
                let spec = match workload {
                    Workload::Known(spec) if !spec.as_ref().is_some_and(needs_look_up) => spec,
                    Workload::Known(spec) => {
                        self.look_up(lease_id, placement, gpus, tenant_id, Some(spec));
                        return None;
                    }
                    Workload::Unknown => {
                        self.look_up(lease_id, placement, gpus, tenant_id, None);
                        return None;
                    }
                };
                self.start(lease_id, placement, &gpus, tenant_id, Ok(spec))
            }
            Command::Stop { lease_id, reason } => {
                self.gangs.remove(&lease_id);
                // A start waiting for an earlier workload is moot: nothing
                // runs for it.
                if let Some(Command::Start { placement, .. }) = self.after_stop.remove(&lease_id) {
                    self.workloads.stop(lease_id);
                    return Some(Report::Started {
                        lease_id,
                        placement,
                        outcome: Ok(false),
                        mig_devices: Vec::new(),
                        not_yet_running: false,
                    });
                }
                self.looking_up.remove(&lease_id);
                self.release_mig(lease_id, |_| false);
                self.workloads.stop_because(lease_id, reason);
                None
            }
            Command::StopStale {
                lease_id,
                placement,
            } => {
                self.release_mig(lease_id, |p| p == placement);
                self.workloads.stop_stale(lease_id, placement);
                None
            }
            Command::Release { lease_id } => {
                self.release_mig(lease_id, |_| false);
                self.gangs.remove(&lease_id);
                None
            }
            Command::Notice {
                lease_id,
                deadline,
                reason,
            } => {
                self.workloads.notify(lease_id, deadline, reason);
                None
            }
            Command::Reconcile { .. } => unreachable!("reconciled in the task's loop"),
        }
    }

    /// Starts the workload; its start is told now, or, for a container,
    /// once the engine runs it.
    fn start(
        &mut self,
        lease_id: Uuid,
        placement: u64,
        gpus: &[AssignedGpu],
        tenant_id: Option<Uuid>,
        spec: Result<Option<WorkloadSpec>, String>,
    ) -> Option<Report> {
        self.start_with(lease_id, placement, gpus, tenant_id, spec, None)
    }

    /// [`WorkloadSide::start`] with its data staged and restored; a gang's
    /// part with its command run once per GPU (see [`super::gang`]).
    fn start_with(
        &mut self,
        lease_id: Uuid,
        placement: u64,
        gpus: &[AssignedGpu],
        tenant_id: Option<Uuid>,
        spec: Result<Option<WorkloadSpec>, String>,
        storage: Option<crate::storage::Prepared>,
    ) -> Option<Report> {
        let mig_devices = self.mig.held(lease_id, placement);
        let gang = self.gangs.get(&lease_id);
        let outcome = spec.and_then(|spec| {
            self.workloads
                .start_with_storage(
                    storage,
                    tenant_id,
                    lease_id,
                    placement,
                    gpus,
                    &mig_devices,
                    spec.as_ref(),
                    gang,
                )
                .map_err(|e| e.to_string())
        });
        if outcome.is_err() {
            // The lease fails here: nothing will run on its instances.
            self.mig.release(lease_id, |p| p != placement);
        }
        let mut not_yet_running = false;
        if outcome == Ok(true) {
            if let Some(running) = self.workloads.when_running(lease_id, placement) {
                not_yet_running = true;
                self.starting.insert(lease_id, placement);
                let told = self.running_tx.clone();
                tokio::spawn(async move {
                    // Closed unanswered: it ended first, and its end tells.
                    if running.await.is_ok() {
                        let _ = told.send((lease_id, placement));
                    }
                });
            }
        }
        Some(Report::Started {
            lease_id,
            placement,
            outcome,
            mig_devices,
            not_yet_running,
        })
    }

    /// Destroys the instances of the lease's placements that are not
    /// `kept` and have no workload running on them; a workload being
    /// stopped still holds its instances until its end is heard (a GPU
    /// instance in use cannot be destroyed).
    fn release_mig(&mut self, lease_id: Uuid, kept: impl Fn(u64) -> bool) {
        let workloads = &self.workloads;
        self.mig.release(lease_id, |placement| {
            kept(placement) || workloads.is_running(lease_id, placement)
        });
    }

    /// Fetches the environment of the lease's workload if it has one
    /// (`known` is `None` where its request never came: the start fails).
    fn look_up(
        &mut self,
        lease_id: Uuid,
        placement: u64,
        gpus: Vec<AssignedGpu>,
        tenant_id: Option<Uuid>,
        known: Option<Option<WorkloadSpec>>,
    ) {
        self.looking_up.insert(lease_id, placement);
        let (bus, resolved) = (self.bus.clone(), self.resolved_tx.clone());
        let node_id = self.node_id.clone();
        let storage = self.storage.clone();
        let create_mig = self
            .mig
            .to_create(lease_id, placement, &gpus)
            .then(|| self.mig.creator(&gpus));
        tokio::spawn(async move {
            let mig = match create_mig {
                Some(create) => create.await,
                None => Ok(Vec::new()),
            };
            let workload = async {
                let spec = match known {
                    Some(spec) => spec,
                    // Its request comes with its placement in the node's
                    // view; a node reads nothing else of the log.
                    None => {
                        return Err(
                            "the lease's request did not reach this node with its placement"
                                .to_string(),
                        )
                    }
                };
                match spec {
                    Some(mut spec) if needs_look_up(&spec) => {
                        let grant = fetch_env(&bus, &node_id, lease_id, &mut spec).await?;
                        let prepared = match (grant, spec.uses_storage()) {
                            (_, false) => None,
                            (Some(grant), true) => {
                                let (Some(storage), Some(tenant_id)) = (&storage, tenant_id) else {
                                    return Err("this node keeps no leases' data".to_string());
                                };
                                Some(
                                    storage
                                        .prepare(
                                            &bus, &grant, tenant_id, lease_id, placement, &spec,
                                        )
                                        .await?,
                                )
                            }
                            (None, true) => {
                                return Err(
                                    "the gateway gave no storage for the lease's data".to_string()
                                )
                            }
                        };
                        Ok((Some(spec), prepared))
                    }
                    spec => Ok((spec, None)),
                }
            }
            .await;
            let (workload, storage) = match workload {
                Ok((spec, prepared)) => (Ok(spec), prepared),
                Err(why) => (Err(why), None),
            };
            let _ = resolved.send(Resolved {
                lease_id,
                placement,
                gpus,
                tenant_id,
                workload,
                storage,
                mig,
            });
        });
    }

    fn resolved(&mut self, r: Resolved) -> Option<Report> {
        if self.looking_up.get(&r.lease_id) != Some(&r.placement) {
            // Stopped, or placed anew, meanwhile: nothing to run for it,
            // and nothing to keep its instances for.
            if let Ok(made) = r.mig {
                self.mig.destroy(made);
            }
            return Some(Report::Started {
                lease_id: r.lease_id,
                placement: r.placement,
                outcome: Ok(false),
                mig_devices: Vec::new(),
                not_yet_running: false,
            });
        }
        self.looking_up.remove(&r.lease_id);
        match r.mig {
            Ok(made) => self.mig.keep(r.lease_id, r.placement, made),
            Err(why) => {
                return Some(Report::Started {
                    lease_id: r.lease_id,
                    placement: r.placement,
                    outcome: Err(why),
                    mig_devices: Vec::new(),
                    not_yet_running: false,
                })
            }
        }
        self.start_with(
            r.lease_id,
            r.placement,
            &r.gpus,
            r.tenant_id,
            r.workload,
            r.storage,
        )
    }
}

/// Whether the workload needs the gateway before it starts: for its
/// environment (the log carries only where the values are, never the
/// values), or for its tenant's storage.
fn needs_look_up(spec: &WorkloadSpec) -> bool {
    spec.env_ref.is_some() || spec.uses_storage()
}

/// Fetches the environment `spec` refers to from the gateway, as this
/// node, checks it against the hash the request carries and puts it into
/// `spec`. Asked again while the gateway is out of reach or does not show
/// the lease here yet, up to [`ENV_FETCH_GIVE_UP_AFTER`].
async fn fetch_env(
    bus: &Bus,
    node_id: &str,
    lease_id: Uuid,
    spec: &mut WorkloadSpec,
) -> Result<Option<StorageGrant>, String> {
    let env_ref = spec.env_ref.clone();
    let storage = spec.uses_storage();
    let give_up_at = Instant::now() + ENV_FETCH_GIVE_UP_AFTER;
    let mut wait = ENV_FETCH_WAIT_MIN;
    loop {
        let fetched =
            lh_rpc::workload_env::fetch(bus, node_id, lease_id, storage, ENV_FETCH_TIMEOUT).await;
        let why = match fetched {
            Ok(WorkloadEnvReply::Values {
                values,
                salt,
                storage: grant,
            }) => {
                if let Some(env_ref) = &env_ref {
                    let salt: [u8; lh_domain::workload::ENV_SALT_BYTES] = hex::decode(&salt)
                        .ok()
                        .and_then(|bytes| bytes.try_into().ok())
                        .ok_or("the gateway's salt for the environment is malformed")?;
                    lh_domain::workload::check_fetched_env(env_ref, &salt, &values)?;
                    spec.env.extend(values);
                }
                return Ok(grant);
            }
            Ok(WorkloadEnvReply::Refused { why }) => {
                return Err(format!(
                    "the gateway refuses the lease's environment: {why}"
                ));
            }
            Ok(WorkloadEnvReply::NotYet { why }) => why,
            Err(e) => e.to_string(),
        };
        if Instant::now() >= give_up_at {
            return Err(format!(
                "no environment for the lease within {} s: {why}",
                ENV_FETCH_GIVE_UP_AFTER.as_secs()
            ));
        }
        tracing::warn!(lease = %lease_id, why, retry_in_ms = wait.as_millis() as u64,
            "the lease's environment is not given yet");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(ENV_FETCH_WAIT_MAX);
    }
}
