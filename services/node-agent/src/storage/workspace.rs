//! A workspace on the tenant's bucket: every sync stores the directory's
//! manifest (`workspaces/<name>/manifests/<digest>.json`, its chunks beside
//! the datasets') and then the head (`workspaces/<name>/head.json`), which
//! says which manifest is current and who wrote it. The head is written
//! last, so a sync cut short leaves the previous one current.
//!
//! A workspace belongs to one lease at a time (the gateway refuses a second
//! while one holds it). When that lease moves, the node it left syncs a
//! last time and marks the head released; the node it moves to waits for
//! that, for a bounded time: the node left may be lost, and then the last
//! sync is what there is.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use lh_storage::{Manifest, NoProgress, TenantStore};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// How often a node waiting for a workspace's release looks at its head.
const RELEASE_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// The largest head object read.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Which run of which lease writes a workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub lease_id: Uuid,
    pub placement: u64,
    pub node_id: String,
}

/// The current state of a workspace on the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    /// Lowercase hex SHA-256 of the current manifest.
    pub manifest: String,
    #[serde(flatten)]
    pub holder: Holder,
    /// The holder's last sync: nothing more comes from it.
    pub released: bool,
    pub synced_at: DateTime<Utc>,
}

fn head_key(name: &str) -> String {
    format!("workspaces/{name}/head.json")
}

fn manifest_key(name: &str, digest: &str) -> String {
    format!("workspaces/{name}/manifests/{digest}.json")
}

async fn head(store: &TenantStore, name: &str) -> Result<Option<Head>, String> {
    let Some(bytes) = store
        .get(&head_key(name))
        .await
        .map_err(|e| format!("workspace {name:?}: reading its head: {e}"))?
    else {
        return Ok(None);
    };
    if bytes.len() > MAX_HEAD_BYTES {
        return Err(format!(
            "workspace {name:?}: its head is over {MAX_HEAD_BYTES} bytes"
        ));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("workspace {name:?}: its head cannot be read: {e}"))
}

/// What a restore found.
#[derive(Debug, Clone, Default)]
pub struct Restored {
    pub files: u64,
    pub bytes: u64,
    /// How long it waited for the node the lease left.
    pub waited: Duration,
}

/// Restores workspace `name` into `dir` (made here; it must not exist) for
/// `me`: empty on first use, else as its last sync left it, after waiting
/// up to `release_wait` for another run of the same lease to release it.
pub async fn restore(
    store: &TenantStore,
    name: &str,
    dir: &Path,
    me: Holder,
    release_wait: Duration,
) -> Result<Restored, String> {
    let started = Instant::now();
    let current = loop {
        let current = head(store, name).await?;
        let waiting = current
            .as_ref()
            .is_some_and(|h| !h.released && h.holder.lease_id == me.lease_id && h.holder != me);
        if !waiting {
            break current;
        }
        if started.elapsed() >= release_wait {
            tracing::warn!(workspace = name, lease = %me.lease_id,
                waited_s = release_wait.as_secs(),
                "the node the lease left did not release its workspace; restoring its last sync");
            break current;
        }
        tokio::time::sleep(RELEASE_POLL_INTERVAL).await;
    };
    std::fs::create_dir(dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
    let waited = started.elapsed();
    let manifest = match &current {
        None => Manifest::default(),
        Some(current) => {
            let manifest = store
                .get_manifest(&manifest_key(name, &current.manifest))
                .await
                .map_err(|e| format!("workspace {name:?}: {e}"))?
                .ok_or_else(|| {
                    format!("workspace {name:?}: its head names a manifest that is gone")
                })?;
            if manifest.digest() != current.manifest {
                return Err(format!(
                    "workspace {name:?}: the stored manifest hashes otherwise than its head says"
                ));
            }
            lh_storage::download(store, &manifest, dir, &NoProgress)
                .await
                .map_err(|e| format!("restoring workspace {name:?}: {e}"))?;
            manifest
        }
    };
    // Claimed before the workload starts: a node the lease moves to next
    // waits for this run's last sync, even if none came before it.
    write_head(store, name, &manifest, me, false).await?;
    Ok(Restored {
        files: lh_storage::file_count(&manifest),
        bytes: manifest.total_bytes(),
        waited,
    })
}

/// Stores `manifest` (its chunks are there already) and makes it the
/// workspace's head, written by `me`.
async fn write_head(
    store: &TenantStore,
    name: &str,
    manifest: &Manifest,
    me: Holder,
    released: bool,
) -> Result<Head, String> {
    let digest = manifest.digest();
    store
        .put_manifest(&manifest_key(name, &digest), manifest)
        .await
        .map_err(|e| format!("workspace {name:?}: {e}"))?;
    let head = Head {
        manifest: digest,
        holder: me,
        released,
        synced_at: Utc::now(),
    };
    let json = serde_json::to_vec(&head).map_err(|e| e.to_string())?;
    store
        .put(&head_key(name), Bytes::from(json))
        .await
        .map_err(|e| format!("workspace {name:?}: writing its head: {e}"))?;
    Ok(head)
}

/// What a sync stored.
#[derive(Debug, Clone)]
pub struct Synced {
    pub manifest: String,
    pub files: u64,
    pub bytes: u64,
    pub bytes_sent: u64,
    pub at: DateTime<Utc>,
}

/// Copies `dir` to workspace `name` as `me`, and makes it current. The
/// directory is the workload's: it is read without following any link.
pub async fn sync(
    store: &TenantStore,
    name: &str,
    dir: &Path,
    me: Holder,
    released: bool,
) -> Result<Synced, String> {
    let root = dir.to_path_buf();
    let scan = tokio::task::spawn_blocking(move || lh_storage::scan_dir(&root, &NoProgress))
        .await
        .map_err(|e| format!("workspace {name:?}: the scan failed: {e}"))?
        .map_err(|e| format!("workspace {name:?}: {e}"))?;
    if scan.skipped_total > 0 {
        tracing::info!(
            workspace = name,
            skipped = scan.skipped_total,
            "sockets, pipes and devices in a workspace are not kept"
        );
    }
    let manifest = scan.manifest;
    let sent = lh_storage::upload_dir(store, dir, &manifest, &NoProgress)
        .await
        .map_err(|e| format!("workspace {name:?}: {e}"))?;
    let head = write_head(store, name, &manifest, me, released).await?;
    Ok(Synced {
        manifest: head.manifest,
        files: lh_storage::file_count(&manifest),
        bytes: manifest.total_bytes(),
        bytes_sent: sent.bytes_sent,
        at: head.synced_at,
    })
}
