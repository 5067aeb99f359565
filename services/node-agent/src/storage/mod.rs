//! A lease's data on the node (docs/adr/031): the tenant's datasets staged
//! once into a cache shared by its leases here and mounted read-only, and
//! its workspaces restored before the workload starts and synced back to
//! the tenant's bucket while it runs and before it ends or moves.
//!
//! The node reaches the store with the tenant's own identity, which the
//! gateway gives it with the lease's environment and which may use that
//! tenant's bucket alone: a node can touch no other tenant's data for a
//! lease it runs.

pub mod cache;
pub mod workspace;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use lh_bus::{Bus, Expect};
use lh_events::{
    derived_id, Actor, Envelope, EventData, LeaseWorkspaceSynced, WorkloadSpec, WorkspaceSyncReason,
};
use lh_rpc::workload_env::StorageGrant;
use lh_storage::{Credentials, StoreConfig, TenantStore};
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::workload::Mount;
use cache::{CacheHold, DatasetCache};

/// How the node keeps leases' data.
#[derive(clap::Args, Debug, Clone)]
pub struct StorageArgs {
    /// Bytes the dataset cache may hold; the least recently used datasets
    /// no lease here mounts leave first.
    #[arg(long, env = "LH_DATA_CACHE_BYTES", default_value_t = 64 << 30)]
    pub data_cache_bytes: u64,
    /// Seconds between syncs of a running lease's workspaces: what a lease
    /// loses at most when its node is lost.
    #[arg(long, env = "LH_WORKSPACE_SYNC_INTERVAL_SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub workspace_sync_interval_secs: u64,
    /// Seconds a lease moved here waits for the node it left to sync its
    /// workspace a last time; past them it starts from the last sync (the
    /// node it left may be lost).
    #[arg(long, env = "LH_WORKSPACE_RELEASE_WAIT_SECS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(0..=3_600))]
    pub workspace_release_wait_secs: u64,
    /// Seconds one sync of a workspace may take before it is given up.
    #[arg(long, env = "LH_WORKSPACE_SYNC_TIMEOUT_SECS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub workspace_sync_timeout_secs: u64,
}

impl StorageArgs {
    pub fn for_test() -> Self {
        StorageArgs {
            data_cache_bytes: 1 << 30,
            workspace_sync_interval_secs: 300,
            workspace_release_wait_secs: 30,
            workspace_sync_timeout_secs: 120,
        }
    }
}

/// The node's data: its dataset cache and where workspaces live while
/// their leases run.
pub struct NodeStorage {
    pub cache: Arc<DatasetCache>,
    workspaces_dir: PathBuf,
    node_id: String,
    args: StorageArgs,
}

impl NodeStorage {
    /// Under `state_dir`: `data/cache` and `data/workspaces`, shut to all
    /// but the agent (a process lease runs as a user of the host).
    pub fn open(state_dir: &Path, node_id: &str, args: StorageArgs) -> anyhow::Result<NodeStorage> {
        let root = state_dir.join("data");
        crate::workload::create_private_dir(&root)?;
        let cache = DatasetCache::open(&root.join("cache"), args.data_cache_bytes)?;
        let workspaces_dir = root.join("workspaces");
        crate::workload::create_private_dir(&workspaces_dir)?;
        Ok(NodeStorage {
            cache: Arc::new(cache),
            workspaces_dir,
            node_id: node_id.to_string(),
            args,
        })
    }

    /// Stages the datasets and restores the workspaces of `spec`, the
    /// workload of `lease_id`'s placement `placement` here: what to mount,
    /// and the lease's storage while it runs.
    pub async fn prepare(
        &self,
        bus: &Bus,
        grant: &StorageGrant,
        tenant_id: Uuid,
        lease_id: Uuid,
        placement: u64,
        spec: &WorkloadSpec,
    ) -> Result<Prepared, String> {
        let store = store_of(grant).map_err(|e| format!("the tenant's storage: {e}"))?;
        let mut mounts = Vec::new();
        let mut holds = Vec::new();
        for dataset in &spec.datasets {
            let (dir, hold) = self
                .cache
                .stage(&store, tenant_id, &dataset.name, &dataset.version)
                .await?;
            mounts.push(Mount {
                host: dir,
                path: dataset.path.clone(),
                writable: false,
            });
            holds.push(hold);
        }
        let lease_dir = self.workspaces_dir.join(format!("{lease_id}-{placement}"));
        let mut workspaces = Vec::new();
        let mut live = Vec::new();
        if !spec.workspaces.is_empty() {
            remove_dir_if_any(&lease_dir).await?;
            crate::workload::create_private_dir(&lease_dir)
                .map_err(|e| format!("making {}: {e}", lease_dir.display()))?;
        }
        for mount in &spec.workspaces {
            let dir = lease_dir.join(&mount.name);
            let restored = workspace::restore(
                &store,
                &mount.name,
                &dir,
                workspace::Holder {
                    lease_id,
                    placement,
                    node_id: self.node_id.clone(),
                },
                Duration::from_secs(self.args.workspace_release_wait_secs),
            )
            .await?;
            tracing::info!(lease = %lease_id, workspace = %mount.name, files = restored.files,
                bytes = restored.bytes, waited_ms = restored.waited.as_millis() as u64,
                "workspace restored");
            mounts.push(Mount {
                host: dir.clone(),
                path: mount.path.clone(),
                writable: true,
            });
            workspaces.push((mount.name.clone(), dir));
            live.push(restored.chunks);
        }
        let session = (!workspaces.is_empty()).then(|| {
            self.session(
                bus,
                store,
                (lease_id, placement),
                workspaces,
                lease_dir,
                live,
            )
        });
        Ok(Prepared {
            mounts,
            object_store: spec.object_store.then(|| grant.clone()),
            session,
            _holds: holds,
        })
    }
}

impl NodeStorage {
    /// Holds the datasets of a workload a restarted agent adopted, as its
    /// start did: their directories are mounted into it. A version the
    /// cache does not hold (removed by hand) is left out.
    pub fn hold_datasets(&self, tenant_id: Uuid, spec: &WorkloadSpec) -> Vec<CacheHold> {
        spec.datasets
            .iter()
            .filter_map(|d| {
                let hold = self.cache.hold_staged(tenant_id, &d.version);
                if hold.is_none() {
                    tracing::warn!(dataset = %d.name, version = %d.version,
                        "an adopted workload's dataset is not in the cache");
                }
                hold
            })
            .collect()
    }

    /// The workspaces of a workload a restarted agent adopted, synced
    /// again from where its start left them on the node (nothing is
    /// restored: the workload has been writing them). A workspace whose
    /// directory is gone is left out. `None` without workspaces.
    pub async fn resume(
        &self,
        bus: &Bus,
        grant: &StorageGrant,
        lease_id: Uuid,
        placement: u64,
        spec: &WorkloadSpec,
    ) -> Result<Option<Arc<LeaseStorage>>, String> {
        if spec.workspaces.is_empty() {
            return Ok(None);
        }
        let store = store_of(grant).map_err(|e| format!("the tenant's storage: {e}"))?;
        let lease_dir = self.workspaces_dir.join(format!("{lease_id}-{placement}"));
        let mut workspaces = Vec::new();
        let mut live = Vec::new();
        for mount in &spec.workspaces {
            let dir = lease_dir.join(&mount.name);
            if !tokio::fs::metadata(&dir).await.is_ok_and(|m| m.is_dir()) {
                tracing::warn!(lease = %lease_id, workspace = %mount.name,
                    "an adopted workload's workspace is not on the node; it is not synced");
                continue;
            }
            // The chunks this lease's own last sync named are in the
            // bucket; after another holder's, the next sync checks them all.
            let chunks = match lh_storage::workspace::read_head(&store, &mount.name).await {
                Ok(Some(head))
                    if head.holder.lease_id == lease_id && head.holder.placement == placement =>
                {
                    lh_storage::workspace::head_manifest(&store, &mount.name, &head)
                        .await
                        .map(|m| lh_storage::workspace::chunks_of(&m))
                        .unwrap_or_default()
                }
                _ => HashSet::new(),
            };
            workspaces.push((mount.name.clone(), dir));
            live.push(chunks);
        }
        if workspaces.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.session(
            bus,
            store,
            (lease_id, placement),
            workspaces,
            lease_dir,
            live,
        )))
    }

    /// A lease's workspaces as this node syncs them.
    fn session(
        &self,
        bus: &Bus,
        store: TenantStore,
        (lease_id, placement): (Uuid, u64),
        workspaces: Vec<(String, PathBuf)>,
        lease_dir: PathBuf,
        live: Vec<HashSet<String>>,
    ) -> Arc<LeaseStorage> {
        Arc::new(LeaseStorage {
            bus: bus.clone(),
            store,
            lease_id,
            placement,
            node_id: self.node_id.clone(),
            workspaces,
            lease_dir,
            syncing: Mutex::new(live),
            interval: Duration::from_secs(self.args.workspace_sync_interval_secs),
            timeout: Duration::from_secs(self.args.workspace_sync_timeout_secs),
        })
    }
}

async fn remove_dir_if_any(dir: &Path) -> Result<(), String> {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", dir.display())),
    }
}

fn store_of(grant: &StorageGrant) -> lh_storage::Result<TenantStore> {
    let config = StoreConfig {
        endpoint: grant.endpoint.clone(),
        region: grant.region.clone(),
        allow_http: grant.allow_http,
    };
    TenantStore::new(
        &config,
        &grant.bucket,
        &Credentials::new(grant.access_key_id.clone(), grant.secret_access_key.clone()),
    )
}

/// What a start needs of a lease's data.
pub struct Prepared {
    pub mounts: Vec<Mount>,
    /// The tenant's store, for a workload that reaches it itself.
    pub object_store: Option<StorageGrant>,
    /// Its workspaces, synced while it runs; none without workspaces.
    pub session: Option<Arc<LeaseStorage>>,
    /// Its datasets stay in the cache while it holds them.
    _holds: Vec<CacheHold>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("mounts", &self.mounts)
            .finish_non_exhaustive()
    }
}

impl Prepared {
    /// Keeps the datasets held until `session`'s lease ends.
    pub fn into_parts(self) -> (Vec<Mount>, Option<Arc<LeaseStorage>>, Vec<CacheHold>) {
        (self.mounts, self.session, self._holds)
    }
}

/// A running lease's workspaces and the store they sync to.
pub struct LeaseStorage {
    bus: Bus,
    store: TenantStore,
    lease_id: Uuid,
    placement: u64,
    node_id: String,
    /// Each workspace's name and directory on the node.
    workspaces: Vec<(String, PathBuf)>,
    /// Where they all are; removed after the last sync.
    lease_dir: PathBuf,
    /// One sync at a time: the last one waits for a periodic one under way.
    /// Held with it, each workspace's chunks its last head named, which
    /// its next sync may take as the bucket holds them.
    syncing: Mutex<Vec<HashSet<String>>>,
    pub interval: Duration,
    timeout: Duration,
}

impl LeaseStorage {
    /// Copies every workspace to the store and records each copy. A last
    /// sync (`released`) tells a node the lease moves to that it may
    /// restore; after it the node's copy is removed. Failures are logged:
    /// the workload's end is never held up past the timeout.
    pub async fn sync(&self, reason: WorkspaceSyncReason, released: bool) {
        let mut live = self.syncing.lock().await;
        for ((name, dir), live) in self.workspaces.iter().zip(live.iter_mut()) {
            let holder = workspace::Holder {
                lease_id: self.lease_id,
                placement: self.placement,
                node_id: self.node_id.clone(),
            };
            let outcome = tokio::time::timeout(
                self.timeout,
                workspace::sync(&self.store, name, dir, holder, released, live),
            )
            .await;
            let mut synced = match outcome {
                Ok(Ok(synced)) => synced,
                Ok(Err(why)) => {
                    metrics::counter!("lh_node_workspace_syncs_total", "result" => "failed")
                        .increment(1);
                    tracing::warn!(lease = %self.lease_id, workspace = %name, why, "workspace sync failed");
                    continue;
                }
                Err(_) => {
                    metrics::counter!("lh_node_workspace_syncs_total", "result" => "timed_out")
                        .increment(1);
                    tracing::warn!(lease = %self.lease_id, workspace = %name,
                        timeout_s = self.timeout.as_secs(), "workspace sync timed out");
                    continue;
                }
            };
            metrics::counter!("lh_node_workspace_syncs_total", "result" => "synced").increment(1);
            *live = std::mem::take(&mut synced.chunks);
            metrics::counter!("lh_node_workspace_bytes_sent_total").increment(synced.bytes_sent);
            tracing::info!(lease = %self.lease_id, workspace = %name, reason = reason.as_str(),
                files = synced.files, bytes = synced.bytes, bytes_sent = synced.bytes_sent,
                "workspace synced");
            self.record(name, &synced, reason).await;
        }
        if released {
            if let Err(why) = remove_dir_if_any(&self.lease_dir).await {
                tracing::warn!(lease = %self.lease_id, why, "a synced workspace stays on the node");
            }
        }
    }

    /// `lease.workspace_synced`, for the trail. A node moved away no
    /// longer holds the lease and its report would be refused: the head it
    /// wrote on the store is the record then.
    async fn record(&self, name: &str, synced: &workspace::Synced, reason: WorkspaceSyncReason) {
        if reason == WorkspaceSyncReason::Move {
            return;
        }
        let envelope = Envelope::new(
            Actor::Node(self.node_id.clone()),
            Utc::now(),
            EventData::LeaseWorkspaceSynced(LeaseWorkspaceSynced {
                lease_id: self.lease_id,
                node_id: self.node_id.clone(),
                workspace: name.to_string(),
                manifest: synced.manifest.clone(),
                bytes: synced.bytes,
                files: synced.files,
                bytes_sent: synced.bytes_sent,
                reason,
                synced_at: synced.at,
            }),
        )
        .with_id(derived_id(&[
            "lease.workspace_synced",
            &self.lease_id.to_string(),
            &self.placement.to_string(),
            name,
            &synced.manifest,
            reason.as_str(),
        ]));
        if let Err(e) = self.bus.publish(&envelope, Expect::Any).await {
            tracing::warn!(lease = %self.lease_id, workspace = name, error = %e,
                "the workspace's sync is not on the log");
        }
    }
}
