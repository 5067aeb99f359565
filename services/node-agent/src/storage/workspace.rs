//! A workspace restored onto the node and synced back (its layout on the
//! tenant's bucket is `lh_storage::workspace`): every sync stores the
//! directory's manifest and then the head, which says which manifest is
//! current and who wrote it.
//!
//! A workspace belongs to one lease at a time (the gateway refuses a second
//! while one holds it). When that lease moves, the node it left syncs a
//! last time and marks the head released; the node it moves to waits for
//! that, for a bounded time: the node left may be lost, and then the last
//! sync is what there is.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use lh_storage::workspace::{self as layout, Head};
use lh_storage::{Manifest, NoProgress, TenantStore};

pub use lh_storage::workspace::{Holder, Synced};

/// How often a node waiting for a workspace's release looks at its head.
const RELEASE_POLL_INTERVAL: Duration = Duration::from_millis(500);

async fn head(store: &TenantStore, name: &str) -> Result<Option<Head>, String> {
    layout::read_head(store, name)
        .await
        .map_err(|e| format!("workspace {name:?}: reading its head: {e}"))
}

/// What a restore found.
#[derive(Debug, Clone, Default)]
pub struct Restored {
    pub files: u64,
    pub bytes: u64,
    /// How long it waited for the node the lease left.
    pub waited: Duration,
    /// The chunks of the manifest restored: the first sync's `live`.
    pub chunks: HashSet<String>,
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
            let manifest = layout::head_manifest(store, name, current)
                .await
                .map_err(|e| e.to_string())?;
            lh_storage::download(store, &manifest, dir, &NoProgress)
                .await
                .map_err(|e| format!("restoring workspace {name:?}: {e}"))?;
            manifest
        }
    };
    // Claimed before the workload starts: a node the lease moves to next
    // waits for this run's last sync, even if none came before it.
    layout::commit(store, name, &manifest, me, false)
        .await
        .map_err(|e| format!("workspace {name:?}: {e}"))?;
    Ok(Restored {
        files: lh_storage::file_count(&manifest),
        bytes: manifest.total_bytes(),
        waited,
        chunks: layout::chunks_of(&manifest),
    })
}

/// Copies `dir` to workspace `name` as `me`, and makes it current. The
/// directory is the workload's: it is read without following any link.
/// `live`: the chunks of the head this run wrote last.
pub async fn sync(
    store: &TenantStore,
    name: &str,
    dir: &Path,
    me: Holder,
    released: bool,
    live: &HashSet<String>,
) -> Result<Synced, String> {
    let synced = layout::sync(store, name, dir, me, released, live)
        .await
        .map_err(|e| format!("workspace {name:?}: {e}"))?;
    if synced.skipped > 0 {
        tracing::info!(
            workspace = name,
            skipped = synced.skipped,
            "sockets, pipes and devices in a workspace are not kept"
        );
    }
    Ok(synced)
}
