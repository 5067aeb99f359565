//! What a previous agent left on the host: found, adopted where its lease
//! is still placed here, stopped and removed otherwise; and the sweep that
//! stops every minute what this agent does not supervise.

use std::collections::HashMap;
use std::path::PathBuf;

use uuid::Uuid;

use crate::workload::gang_link::GangLink;

use super::*;

impl Workloads {
    /// The workloads of this node on the host: process records, lease
    /// cgroups, containers.
    async fn on_the_host(&self) -> Vec<Found> {
        let mut found = reconcile::list_process_records(
            &self.marks.state_dir,
            &self.marks.node_id,
            MOST_HOST_WORKLOADS,
        );
        if let Some(parent) = &self.cgroup_parent {
            found.extend(reconcile::list_cgroups(parent, MOST_HOST_WORKLOADS));
        }
        if let Some(c) = &self.container {
            found.extend(reconcile::list_containers(&c.engine, &self.marks.node_id).await);
        }
        found
    }

    /// Stops and removes every workload of this node on the host that
    /// this agent does not supervise: one whose lease it was told ended or
    /// moved while it could not stop it, or one started behind its back.
    /// Nothing else ends such a workload before the agent's next start,
    /// and meanwhile it holds GPUs the scheduler counts as free. Returns
    /// how many it reaped.
    pub async fn sweep_orphans(&mut self) -> usize {
        // Every mark of a lease it runs or is stopping is left alone, its
        // cgroup and an older placement's included: the supervisor (or a
        // stale stop) ends those, with their grace.
        let found: Vec<Found> = self
            .on_the_host()
            .await
            .into_iter()
            .filter(|f| {
                !self.running.contains_key(&f.lease_id()) && !self.stopping.contains(&f.lease_id())
            })
            .collect();
        let decisions = reconcile::decide(&found, &HashMap::new());
        // The host's firewall may have been reloaded since: the guard of
        // the tenant networks in use is written again.
        if let Some(c) = &self.container {
            let networks = c.networks.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || networks.guard_again()).await {
                tracing::warn!(error = %e, "the tenant networks' guard was not rewritten");
            }
        }
        let mut reaped = 0;
        let mut in_grace = std::collections::HashSet::new();
        for (f, decision) in found.into_iter().zip(decisions) {
            if let Decision::Reap { why } = decision {
                let (lease_id, kind) = (f.lease_id(), f.kind());
                tracing::warn!(lease = %lease_id, kind, why, "stopping a workload this agent does not supervise");
                metrics::counter!("lh_node_workloads_reaped_total", "kind" => kind).increment(1);
                self.reap(f);
                reaped += 1;
                in_grace.insert(lease_id);
            }
        }
        if let Some(users) = &self.lease_users {
            // A home outlives its workload only when the agent that ran it
            // died first. One reaped now keeps its user and home through
            // its grace: the next sweep removes them.
            let (running, stopping) = (&self.running, &self.stopping);
            let left = users.remove_homes_except(&|lease| {
                running.contains_key(&lease)
                    || stopping.contains(&lease)
                    || in_grace.contains(&lease)
            });
            if left > 0 {
                tracing::info!(
                    homes = left,
                    "removed the homes of leases that no longer run"
                );
            }
        }
        reaped
    }

    /// Finds what a previous agent left on the host (process records,
    /// cgroups, containers of this node), adopts the workloads of the
    /// leases in `placed_here` (lease and placement) and stops and removes
    /// the rest. Each decision is logged and counted.
    pub async fn reconcile(&mut self, placed_here: &HashMap<Uuid, u64>) -> Reconciled {
        self.reconcile_gangs(placed_here, &HashMap::new()).await
    }

    /// [`Workloads::reconcile`], where an adopted container of a gang in
    /// `gang_links` is linked to its gang again if the previous agent died
    /// before it was, and its link is released when it ends.
    pub async fn reconcile_gangs(
        &mut self,
        placed_here: &HashMap<Uuid, u64>,
        gang_links: &HashMap<Uuid, GangLink>,
    ) -> Reconciled {
        let found = self.on_the_host().await;
        let decisions = reconcile::decide(&found, placed_here);
        let adopted_cgroups: HashMap<Uuid, PathBuf> = found
            .iter()
            .zip(&decisions)
            .filter_map(|(f, d)| match (f, d) {
                (Found::Cgroup { lease_id, dir }, Decision::Adopt { .. }) => {
                    Some((*lease_id, dir.clone()))
                }
                _ => None,
            })
            .collect();
        let mut outcome = Reconciled::default();
        for (f, decision) in found.into_iter().zip(decisions) {
            let (lease_id, kind) = (f.lease_id(), f.kind());
            match decision {
                Decision::Forget => {
                    if let Found::Process { path, record, .. } = &f {
                        tracing::info!(lease = %lease_id, pid = record.pid, "recorded workload process is gone; its record goes");
                        remove_record(path);
                        // It ended while no agent ran: its log is kept from now.
                        lease_log::mark_ended(
                            &lease_log::path(&self.marks.state_dir, lease_id, record.placement),
                            std::time::SystemTime::now(),
                        );
                    }
                }
                Decision::Adopt { .. } if matches!(f, Found::Cgroup { .. }) => {
                    tracing::info!(lease = %lease_id, "lease cgroup kept with its adopted process");
                }
                Decision::Adopt { placement } => {
                    tracing::info!(lease = %lease_id, placement, kind, "adopting the workload a previous agent started");
                    metrics::counter!("lh_node_workloads_adopted_total", "kind" => kind)
                        .increment(1);
                    let (adopted, record) =
                        self.adopted(f, adopted_cgroups.get(&lease_id), gang_links.get(&lease_id));
                    // A container finds its notices where its start put
                    // them; a process lease is told none.
                    let notice_dir = matches!(adopted, Adopted::Container { .. })
                        .then(|| notice_dir(&self.marks.state_dir, lease_id, placement))
                        .filter(|dir| dir.is_dir());
                    // The tenant's storage came with the start, to the
                    // agent that is gone: the workload's data is found
                    // again once the gateway gives it (`attach_data`).
                    let (late_tx, late_rx) = tokio::sync::oneshot::channel();
                    self.late_data.insert(lease_id, (placement, late_tx));
                    self.supervise(
                        lease_id,
                        placement,
                        Supervised::Adopted(adopted),
                        record,
                        None,
                        Some(lease_log::path(&self.marks.state_dir, lease_id, placement)),
                        None,
                        Some(late_rx),
                        notice_dir,
                    );
                    outcome.adopted.push((lease_id, placement));
                }
                Decision::Reap { why } => {
                    tracing::info!(lease = %lease_id, kind, why, "stopping a workload left on the host");
                    metrics::counter!("lh_node_workloads_reaped_total", "kind" => kind)
                        .increment(1);
                    self.reap(f);
                    outcome.reaped += 1;
                }
            }
        }
        // Networks left by containers that are gone; those of adopted
        // containers stay, guarded again.
        if let Some(c) = &self.container {
            let networks = c.networks.clone();
            let _ = tokio::task::spawn_blocking(move || networks.remove_all_unused()).await;
        }
        // No workload starts before this returns: every log but the
        // adopted ones' is done, and its keep time runs from now.
        let marked = lease_log::mark_others_ended(
            &lease_log::dir(&self.marks.state_dir),
            &outcome.adopted,
            std::time::SystemTime::now(),
        );
        if marked > 0 {
            tracing::info!(
                logs = marked,
                "logs of workloads that ended while no agent ran are kept from now"
            );
        }
        outcome
    }

    /// After [`Workloads::reconcile`]: the MPS daemons take the shares
    /// whose workloads were adopted (`adopted`, lease and placement;
    /// `share_gpus`, the GPU each share lease placed here holds) back, and
    /// daemons left on GPUs without a share quit.
    pub fn reconcile_shares(
        &mut self,
        adopted: &[(Uuid, u64)],
        share_gpus: &HashMap<Uuid, AssignedGpu>,
    ) {
        let Some(mps) = &mut self.mps else {
            return;
        };
        let shares: Vec<_> = adopted
            .iter()
            .filter_map(|&(lease_id, placement)| {
                let gpu = share_gpus.get(&lease_id)?;
                let limits = MpsLimits::of_share(&assignment(
                    lease_id,
                    std::slice::from_ref(gpu),
                    &[],
                    None,
                ))?;
                Some(((lease_id, placement), gpu.index, gpu.uuid.clone(), limits))
            })
            .collect();
        mps.reconcile(&shares);
    }

    fn adopted(
        &self,
        found: Found,
        cgroup: Option<&PathBuf>,
        gang_link: Option<&GangLink>,
    ) -> (Adopted, Option<PathBuf>) {
        match found {
            Found::Process { record, path, .. } => {
                // Its user, as the kernel says: a record is only the
                // agent's word.
                let uid = std::fs::metadata(format!("/proc/{}", record.pid))
                    .ok()
                    .map(|m| std::os::unix::fs::MetadataExt::uid(&m));
                let user = match (&self.lease_users, uid) {
                    (Some(users), Some(uid)) => users.adopt(record.lease_id, uid),
                    _ => None,
                };
                (
                    Adopted::Process {
                        pid: record.pid,
                        start_ticks: record.start_ticks,
                        cgroup: cgroup.cloned(),
                        user: std::sync::Mutex::new(user),
                    },
                    Some(path),
                )
            }
            Found::Container { lease_id, name } => {
                let c = self
                    .container
                    .as_ref()
                    .expect("containers are listed with a CLI");
                // Linked again if the agent that started it died first;
                // kept as it is otherwise.
                let gang_link = gang_link.map(|link| {
                    crate::workload::gang_link::spawn_attach(
                        c.engine.clone(),
                        name.clone(),
                        link.clone(),
                        c.gang_link_lock_file.clone(),
                        tokio::time::Instant::now() + c.start_timeout,
                    )
                });
                (
                    Adopted::Container {
                        engine: c.engine.clone(),
                        lease_id,
                        gang_link: std::sync::Mutex::new(gang_link.map(Box::new)),
                        name,
                        stop_margin: DEFAULT_STOP_MARGIN,
                        memory_cgroups: c.memory_cgroups.clone(),
                        networks: Box::new(c.networks.clone()),
                        failure: Default::default(),
                    },
                    // Its env file goes when it ends, as its record would.
                    Some(c.env_file(lease_id)),
                )
            }
            Found::Cgroup { .. } => unreachable!("a cgroup is adopted with its process"),
        }
    }

    /// Stops and removes a workload no lease here owns, in a task of its
    /// own: a start does not wait for the grace periods.
    fn reap(&self, found: Found) {
        // At once, not in the task: a lease placed here again makes a
        // cgroup of the same name for its new workload.
        if let Found::Cgroup { dir, .. } = &found {
            reconcile::kill_cgroup(dir);
        }
        let grace = self.grace;
        let container = self.container.clone();
        let state_dir = self.marks.state_dir.clone();
        tokio::spawn(async move {
            match found {
                Found::Process { record, path, .. } => {
                    reconcile::stop_process(record.pid, record.start_ticks, grace).await;
                    remove_record(&path);
                    lease_log::mark_ended(
                        &lease_log::path(&state_dir, record.lease_id, record.placement),
                        std::time::SystemTime::now(),
                    );
                }
                Found::Container { lease_id, name } => {
                    if let Some(c) = container {
                        crate::workload::container::run_stop_command(
                            &c.engine,
                            &name,
                            grace,
                            DEFAULT_STOP_MARGIN,
                        )
                        .await;
                        reconcile::remove_container(&c.engine, &name).await;
                        if let Some(cgroups) = &c.memory_cgroups {
                            cgroups.remove(&name).await;
                        }
                        remove_record(&c.env_file(lease_id));
                        let networks = c.networks.clone();
                        let _ =
                            tokio::task::spawn_blocking(move || networks.remove_all_unused()).await;
                    }
                }
                Found::Cgroup { dir, .. } => reconcile::remove_cgroup(&dir).await,
            }
        });
    }
}
