//! The node's dataset cache: each version of a tenant's dataset staged
//! once, into `<root>/<tenant>/<version>/`, and shared read-only by the
//! tenant's leases here. A version is content-addressed (the SHA-256 of its
//! manifest), so a staged copy never goes stale. The cache holds at most
//! its capacity in bytes: before a version is staged, the least recently
//! used ones no lease holds leave until it fits.
//!
//! A version is staged into a directory of its own and renamed into place
//! once complete, with its manifest beside it (`<version>.json`): what a
//! restarted agent finds there is whole, and its size and last use are read
//! back from the manifest and its modification time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::SystemTime;

use lh_storage::{Manifest, NoProgress, TenantStore};
use tokio::sync::Mutex;
use uuid::Uuid;

type Key = (Uuid, String);

#[derive(Debug, Clone)]
struct Entry {
    bytes: u64,
    last_used: SystemTime,
    /// Leases holding it now: it cannot leave while any does.
    holders: u32,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<Key, Entry>,
    /// One staging of a version at a time: a second lease waits for the
    /// first's copy instead of making its own.
    staging: HashMap<Key, Arc<Mutex<()>>>,
}

#[derive(Debug)]
pub struct DatasetCache {
    root: PathBuf,
    capacity_bytes: u64,
    state: SyncMutex<State>,
}

/// A lease's hold on a staged version: while it lives the version stays.
#[derive(Debug)]
pub struct CacheHold {
    cache: Arc<DatasetCache>,
    key: Key,
}

impl Drop for CacheHold {
    fn drop(&mut self) {
        let mut state = self.cache.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = state.entries.get_mut(&self.key) {
            entry.holders = entry.holders.saturating_sub(1);
            entry.last_used = SystemTime::now();
        }
    }
}

impl DatasetCache {
    /// Opens the cache at `root`, finding what an earlier agent staged and
    /// removing what it left half done.
    pub fn open(root: &Path, capacity_bytes: u64) -> anyhow::Result<DatasetCache> {
        crate::workload::create_private_dir(root)?;
        let mut entries = HashMap::new();
        for tenant_dir in std::fs::read_dir(root)? {
            let tenant_dir = tenant_dir?;
            let Some(tenant) = tenant_dir
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<Uuid>().ok())
            else {
                continue;
            };
            for item in std::fs::read_dir(tenant_dir.path())? {
                let item = item?;
                let name = item.file_name().to_string_lossy().into_owned();
                if name.starts_with(".staging-") {
                    let _ = std::fs::remove_dir_all(item.path());
                    continue;
                }
                let Some(version) = name.strip_suffix(".json") else {
                    continue;
                };
                let dir = tenant_dir.path().join(version);
                let manifest = std::fs::read(item.path())
                    .ok()
                    .and_then(|json| Manifest::from_json(&json).ok());
                match manifest {
                    Some(m) if dir.is_dir() && m.digest() == version => {
                        let last_used = item
                            .metadata()
                            .and_then(|m| m.modified())
                            .unwrap_or(SystemTime::UNIX_EPOCH);
                        entries.insert(
                            (tenant, version.to_string()),
                            Entry {
                                bytes: m.total_bytes(),
                                last_used,
                                holders: 0,
                            },
                        );
                    }
                    _ => {
                        let _ = std::fs::remove_file(item.path());
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                }
            }
        }
        Ok(DatasetCache {
            root: root.to_path_buf(),
            capacity_bytes,
            state: SyncMutex::new(State {
                entries,
                staging: HashMap::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes the cache holds now.
    pub fn bytes(&self) -> u64 {
        self.lock().entries.values().map(|e| e.bytes).sum()
    }

    /// Whether `version` of `tenant_id` is staged here.
    pub fn holds(&self, tenant_id: Uuid, version: &str) -> bool {
        self.lock()
            .entries
            .contains_key(&(tenant_id, version.to_string()))
    }

    fn dir_of(&self, key: &Key) -> PathBuf {
        self.root.join(key.0.to_string()).join(&key.1)
    }

    /// A hold on `version` of `tenant_id`'s dataset if it is staged here:
    /// what a restarted agent takes for the workloads it adopts, whose
    /// mounts are still in use.
    pub fn hold_staged(self: &Arc<Self>, tenant_id: Uuid, version: &str) -> Option<CacheHold> {
        self.hold(&(tenant_id, version.to_string()))
    }

    /// Takes a hold on `key` if it is staged.
    fn hold(self: &Arc<Self>, key: &Key) -> Option<CacheHold> {
        let mut state = self.lock();
        let entry = state.entries.get_mut(key)?;
        entry.holders += 1;
        entry.last_used = SystemTime::now();
        let manifest = self
            .root
            .join(key.0.to_string())
            .join(format!("{}.json", key.1));
        let _ = std::fs::File::options()
            .append(true)
            .open(manifest)
            .and_then(|f| f.set_modified(SystemTime::now()));
        Some(CacheHold {
            cache: self.clone(),
            key: key.clone(),
        })
    }

    /// The directory holding `version` of the tenant's dataset `name`,
    /// staged from `store` unless it is here already, and a hold that keeps
    /// it here.
    pub async fn stage(
        self: &Arc<Self>,
        store: &TenantStore,
        tenant_id: Uuid,
        name: &str,
        version: &str,
    ) -> Result<(PathBuf, CacheHold), String> {
        if !lh_domain::storage::is_version(version) {
            return Err(format!("dataset {name:?}: {version:?} is not a version"));
        }
        let key: Key = (tenant_id, version.to_string());
        let turn = self.lock().staging.entry(key.clone()).or_default().clone();
        let _turn = turn.lock().await;
        if let Some(hold) = self.hold(&key) {
            metrics::counter!("lh_node_dataset_stagings_total", "result" => "cached").increment(1);
            tracing::info!(tenant = %tenant_id, dataset = name, version, "dataset found in the node's cache");
            return Ok((self.dir_of(&key), hold));
        }
        let manifest_key = format!("datasets/{name}/{version}.json");
        let manifest = store
            .get_manifest(&manifest_key)
            .await
            .map_err(|e| format!("dataset {name:?} {version}: {e}"))?
            .ok_or_else(|| format!("dataset {name:?} has no version {version} (removed?)"))?;
        if manifest.digest() != version {
            return Err(format!(
                "dataset {name:?} {version}: the stored manifest hashes otherwise"
            ));
        }
        let bytes = manifest.total_bytes();
        self.make_room(bytes)?;
        let tenant_dir = self.root.join(tenant_id.to_string());
        crate::workload::create_private_dir(&tenant_dir)
            .map_err(|e| format!("making {}: {e}", tenant_dir.display()))?;
        let staging = tenant_dir.join(format!(".staging-{version}-{}", Uuid::new_v4().simple()));
        std::fs::create_dir(&staging).map_err(|e| format!("making {}: {e}", staging.display()))?;
        // Read-only mounts are read as "others" from a container's user
        // namespace: the tree is readable by all, as a dataset is.
        set_mode(&staging, 0o755)?;
        let started = std::time::Instant::now();
        let staged = lh_storage::download(store, &manifest, &staging, &NoProgress).await;
        if let Err(e) = staged {
            let _ = std::fs::remove_dir_all(&staging);
            metrics::counter!("lh_node_dataset_stagings_total", "result" => "failed").increment(1);
            return Err(format!("staging dataset {name:?} {version}: {e}"));
        }
        let dir = self.dir_of(&key);
        std::fs::rename(&staging, &dir).map_err(|e| format!("placing {}: {e}", dir.display()))?;
        std::fs::write(
            tenant_dir.join(format!("{version}.json")),
            manifest.canonical_json(),
        )
        .map_err(|e| format!("recording dataset {name:?}: {e}"))?;
        self.lock().entries.insert(
            key.clone(),
            Entry {
                bytes,
                last_used: SystemTime::now(),
                holders: 0,
            },
        );
        let seconds = started.elapsed().as_secs_f64();
        metrics::counter!("lh_node_dataset_stagings_total", "result" => "copied").increment(1);
        metrics::counter!("lh_node_dataset_staged_bytes_total").increment(bytes);
        tracing::info!(tenant = %tenant_id, dataset = name, version, bytes,
            seconds, "dataset staged into the node's cache");
        let hold = self
            .hold(&key)
            .ok_or_else(|| format!("dataset {name:?} left the cache as it was staged"))?;
        Ok((dir, hold))
    }

    /// Removes the least recently used versions nobody holds until `bytes`
    /// more fit.
    fn make_room(&self, bytes: u64) -> Result<(), String> {
        let mut state = self.lock();
        let mut held: u64 = state.entries.values().map(|e| e.bytes).sum();
        if bytes > self.capacity_bytes {
            return Err(format!(
                "a dataset of {bytes} bytes is larger than this node's dataset cache \
                 ({} bytes, LH_DATA_CACHE_BYTES)",
                self.capacity_bytes
            ));
        }
        while held + bytes > self.capacity_bytes {
            let oldest = state
                .entries
                .iter()
                .filter(|(_, e)| e.holders == 0)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, e)| (k.clone(), e.bytes));
            let Some((key, size)) = oldest else {
                return Err(format!(
                    "this node's dataset cache ({} bytes) is full of datasets in use; \
                     {bytes} bytes more do not fit",
                    self.capacity_bytes
                ));
            };
            state.entries.remove(&key);
            let tenant_dir = self.root.join(key.0.to_string());
            let _ = std::fs::remove_file(tenant_dir.join(format!("{}.json", key.1)));
            let _ = std::fs::remove_dir_all(tenant_dir.join(&key.1));
            metrics::counter!("lh_node_dataset_evictions_total").increment(1);
            tracing::info!(tenant = %key.0, version = %key.1, bytes = size, "dataset left the node's cache");
            held -= size;
        }
        Ok(())
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", path.display()))
}
