//! Deleting the chunks no manifest names any more.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{stream, StreamExt};

use crate::error::{Error, Result};
use crate::manifest::is_chunk_name;
use crate::tenant::{TenantStore, CHUNK_PREFIX};

/// Chunk deletions in flight at once.
pub const GC_DELETES_IN_FLIGHT: usize = 8;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Manifests read.
    pub manifests: u64,
    /// Chunks some manifest names.
    pub chunks_live: u64,
    /// Chunks no manifest names, spared as younger than the grace period.
    pub chunks_young: u64,
    pub chunks_deleted: u64,
    pub bytes_deleted: u64,
}

/// Deletes the chunks of `store` that no manifest under any of
/// `live_manifest_prefixes` names and that are older than `grace`. Every
/// object under those prefixes must be a manifest: one that does not read
/// as one stops the collection before anything is deleted.
///
/// Chunks are listed before manifests are read, so a chunk sent after the
/// listing is never a candidate, and `grace` spares the ones sent shortly
/// before it whose manifest is not written yet. Each chunk is looked at
/// again right before it is deleted, and spared if it was stored again
/// since the listing. One race is the caller's to rule out: an upload that
/// finds an old unnamed chunk already there and does not send it again
/// (`Reuse::Any`), if it is deleted here before that upload's manifest is
/// written, leaves the manifest naming a missing chunk. Collect only while
/// nothing uploads to the bucket that way, or only while every upload
/// reuses with `Reuse::LiveOrFresh` and a window shorter than `grace`
/// less the upload's length.
pub async fn garbage_collect(
    store: &TenantStore,
    live_manifest_prefixes: &[&str],
    grace: Duration,
) -> Result<GcStats> {
    let chunks = store.list(CHUNK_PREFIX).await?;
    let mut stats = GcStats::default();
    let mut live = BTreeSet::new();
    for prefix in live_manifest_prefixes {
        let trimmed = prefix.trim_end_matches('/');
        if trimmed.is_empty()
            || CHUNK_PREFIX.starts_with(&format!("{trimmed}/"))
            || trimmed.starts_with(CHUNK_PREFIX.trim_end_matches('/'))
        {
            return Err(Error::Invalid(format!(
                "manifest prefix {prefix:?} would take chunks for manifests"
            )));
        }
        for object in store.list(prefix).await? {
            let manifest = store
                .get_manifest(&object.key)
                .await?
                .ok_or_else(|| Error::Invalid(format!("{} vanished while read", object.key)))?;
            stats.manifests += 1;
            live.extend(manifest.chunk_set().into_iter().map(str::to_owned));
        }
    }
    let grace = chrono::Duration::from_std(grace)
        .map_err(|_| Error::Invalid("a grace period past chrono's range".into()))?;
    let cutoff = chrono::Utc::now() - grace;
    let mut doomed = Vec::new();
    for chunk in chunks {
        let name = chunk.key.strip_prefix(CHUNK_PREFIX).unwrap_or_default();
        if !is_chunk_name(name) || live.contains(name) {
            stats.chunks_live += u64::from(live.contains(name));
            continue;
        }
        if chunk.last_modified > cutoff {
            stats.chunks_young += 1;
            continue;
        }
        doomed.push(chunk);
    }
    let mut deletions = stream::iter(doomed)
        .map(|chunk| async move {
            // An upload may have stored it again since it was listed.
            match store.info(&chunk.key).await? {
                Some(now) if now.last_modified <= cutoff => {}
                Some(_) => return Ok(Fate::StoredAgain),
                None => return Ok(Fate::Gone),
            }
            store.delete(&chunk.key).await?;
            Ok::<_, Error>(Fate::Deleted(chunk.bytes))
        })
        .buffer_unordered(GC_DELETES_IN_FLIGHT);
    while let Some(fate) = deletions.next().await {
        match fate? {
            Fate::Deleted(bytes) => {
                stats.chunks_deleted += 1;
                stats.bytes_deleted += bytes;
            }
            Fate::StoredAgain => stats.chunks_young += 1,
            Fate::Gone => {}
        }
    }
    Ok(stats)
}

/// What became of a chunk found unnamed and old.
enum Fate {
    Deleted(u64),
    /// Young when looked at again.
    StoredAgain,
    /// Deleted meanwhile by another collector.
    Gone,
}
