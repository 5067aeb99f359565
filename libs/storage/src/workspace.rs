//! A workspace on its tenant's bucket (docs/adr/031), laid out as the node
//! that syncs it and the gateway that lists, snapshots and collects it both
//! read it:
//!
//! - `workspaces/<name>/head.json`: the [`Head`], which manifest is current
//!   and which run of which lease wrote it. A sync writes it last, so a
//!   sync cut short leaves the previous one current.
//! - `workspaces/<name>/manifests/<digest>.json`: each sync's manifest; the
//!   chunks it names are beside the datasets' under `chunks/sha256/`.
//! - `workspaces/<name>/snapshots/<YYYY-MM-DD>.json`: a copy of the head's
//!   manifest as it was that day (UTC). Only the manifest is copied: the
//!   chunks are shared, so a snapshot stores no data of its own.
//!
//! A per-sync manifest matters only while it is the head's (a snapshot
//! holds its own copy): [`collect`] deletes the others once they are older
//! than its grace, snapshots past their retention, and then the chunks no
//! manifest left names.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, NaiveDate, Utc};
use futures::{stream, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::gc::{garbage_collect, GcStats};
use crate::manifest::{file_count, Manifest};
use crate::progress::NoProgress;
use crate::tenant::{ObjectInfo, TenantStore};
use crate::transfer::{upload_dir_reusing, Reuse};

/// Where every workspace of a bucket lives.
pub const WORKSPACES_PREFIX: &str = "workspaces/";
/// The largest head read.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How recently a chunk the bucket holds must have been stored for a sync
/// to take it as it is when the workspace's last manifest does not name
/// it; an older one is sent again. A collection's grace must be longer
/// than this plus the longest sync, or it may delete a chunk a sync
/// counted on.
pub const CHUNK_REUSE_FRESH: Duration = Duration::from_secs(3600);
/// Snapshots or manifests read at once.
const READS_IN_FLIGHT: usize = 8;
/// Deletions at once.
const DELETES_IN_FLIGHT: usize = 8;
/// How a snapshot's date is written in its key.
const DATE_FORMAT: &str = "%Y-%m-%d";

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
    /// Set when a snapshot was put back since the holder's last sync; the
    /// next sync leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<HeadRestored>,
}

/// A snapshot put back as a workspace's head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadRestored {
    pub snapshot: NaiveDate,
    pub at: DateTime<Utc>,
}

/// `workspaces/<name>/`
pub fn prefix(name: &str) -> String {
    format!("{WORKSPACES_PREFIX}{name}/")
}

pub fn head_key(name: &str) -> String {
    format!("{WORKSPACES_PREFIX}{name}/head.json")
}

pub fn manifests_prefix(name: &str) -> String {
    format!("{WORKSPACES_PREFIX}{name}/manifests/")
}

pub fn manifest_key(name: &str, digest: &str) -> String {
    format!("{}{digest}.json", manifests_prefix(name))
}

pub fn snapshots_prefix(name: &str) -> String {
    format!("{WORKSPACES_PREFIX}{name}/snapshots/")
}

pub fn snapshot_key(name: &str, date: NaiveDate) -> String {
    format!(
        "{}{}.json",
        snapshots_prefix(name),
        date.format(DATE_FORMAT)
    )
}

/// A snapshot's date as its key and the API write it: `YYYY-MM-DD`,
/// nothing else.
pub fn parse_date(text: &str) -> Option<NaiveDate> {
    let date = NaiveDate::parse_from_str(text, DATE_FORMAT).ok()?;
    (date.format(DATE_FORMAT).to_string() == text).then_some(date)
}

/// The date of the snapshot at `key` of workspace `name`, if it is one.
fn snapshot_date(name: &str, key: &str) -> Option<NaiveDate> {
    let stem = key
        .strip_prefix(&snapshots_prefix(name))?
        .strip_suffix(".json")?;
    parse_date(stem)
}

/// The workspace's head, `None` before its first sync (or after its
/// deletion). The bucket is the tenant's to write: a head is read like
/// any input.
pub async fn read_head(store: &TenantStore, name: &str) -> Result<Option<Head>> {
    let key = head_key(name);
    let Some(bytes) = store.get(&key).await? else {
        return Ok(None);
    };
    if bytes.len() > MAX_HEAD_BYTES {
        return Err(Error::Limit(format!(
            "{key} holds {} bytes, more than {MAX_HEAD_BYTES}",
            bytes.len()
        )));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::Invalid(format!("{key} cannot be read: {e}")))
}

pub async fn write_head(store: &TenantStore, name: &str, head: &Head) -> Result<()> {
    let json = serde_json::to_vec(head).map_err(|e| Error::Invalid(e.to_string()))?;
    store.put(&head_key(name), Bytes::from(json)).await
}

/// The manifest `head` names, checked against its digest.
pub async fn head_manifest(store: &TenantStore, name: &str, head: &Head) -> Result<Manifest> {
    let key = manifest_key(name, &head.manifest);
    let manifest = store.get_manifest(&key).await?.ok_or_else(|| {
        Error::Invalid(format!(
            "workspace {name:?}: its head names a manifest that is gone"
        ))
    })?;
    if manifest.digest() != head.manifest {
        return Err(Error::Invalid(format!(
            "workspace {name:?}: the stored manifest hashes otherwise than its head says"
        )));
    }
    Ok(manifest)
}

/// Stores `manifest` (its chunks are there already) and makes it the
/// workspace's head, written by `holder`.
pub async fn commit(
    store: &TenantStore,
    name: &str,
    manifest: &Manifest,
    holder: Holder,
    released: bool,
) -> Result<Head> {
    let digest = store
        .put_manifest(&manifest_key(name, &manifest.digest()), manifest)
        .await?;
    let head = Head {
        manifest: digest,
        holder,
        released,
        synced_at: Utc::now(),
        restored: None,
    };
    write_head(store, name, &head).await?;
    Ok(head)
}

/// The chunks a manifest names, owned: what the next sync of a workspace
/// may take as they are (see [`sync`]).
pub fn chunks_of(manifest: &Manifest) -> HashSet<String> {
    manifest
        .chunk_set()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// What a sync stored.
#[derive(Debug, Clone)]
pub struct Synced {
    /// The digest of the manifest now current.
    pub manifest: String,
    pub files: u64,
    pub bytes: u64,
    pub bytes_sent: u64,
    pub at: DateTime<Utc>,
    /// Every chunk that manifest names: the next sync's `live`.
    pub chunks: HashSet<String>,
    /// Sockets, pipes and devices left out.
    pub skipped: u64,
}

/// Copies `dir` to workspace `name` as `holder`, and makes it current. The
/// directory is read without following any link. `live` are the chunks of
/// the head this holder wrote or restored last: they stay named while the
/// sync runs, so they are taken as the bucket holds them; another chunk
/// the bucket holds is taken only if stored within [`CHUNK_REUSE_FRESH`],
/// since a collection may be about to delete an old one no manifest names.
pub async fn sync(
    store: &TenantStore,
    name: &str,
    dir: &Path,
    holder: Holder,
    released: bool,
    live: &HashSet<String>,
) -> Result<Synced> {
    let root = dir.to_path_buf();
    let scan = tokio::task::spawn_blocking(move || crate::scan_dir(&root, &NoProgress))
        .await
        .map_err(|e| Error::Invalid(format!("the scan failed: {e}")))??;
    let manifest = scan.manifest;
    let reuse = Reuse::LiveOrFresh {
        live,
        fresh: CHUNK_REUSE_FRESH,
    };
    let sent = upload_dir_reusing(store, dir, &manifest, &NoProgress, reuse).await?;
    let head = commit(store, name, &manifest, holder, released).await?;
    Ok(Synced {
        manifest: head.manifest,
        files: file_count(&manifest),
        bytes: manifest.total_bytes(),
        bytes_sent: sent.bytes_sent,
        at: head.synced_at,
        chunks: chunks_of(&manifest),
        skipped: scan.skipped_total,
    })
}

/// Every object under [`WORKSPACES_PREFIX`], by workspace name.
pub async fn objects_by_name(store: &TenantStore) -> Result<BTreeMap<String, Vec<ObjectInfo>>> {
    let mut by_name: BTreeMap<String, Vec<ObjectInfo>> = BTreeMap::new();
    for object in store.list(WORKSPACES_PREFIX).await? {
        let Some((name, _)) = object
            .key
            .strip_prefix(WORKSPACES_PREFIX)
            .and_then(|rest| rest.split_once('/'))
        else {
            continue;
        };
        by_name.entry(name.to_owned()).or_default().push(object);
    }
    Ok(by_name)
}

/// One snapshot of a workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub date: NaiveDate,
    /// The digest of the manifest it copies.
    pub manifest: String,
    pub bytes: u64,
    pub files: u64,
    /// When it was last written.
    pub taken_at: DateTime<Utc>,
}

fn snapshot_of(date: NaiveDate, manifest: &Manifest, taken_at: DateTime<Utc>) -> Snapshot {
    Snapshot {
        date,
        manifest: manifest.digest(),
        bytes: manifest.total_bytes(),
        files: file_count(manifest),
        taken_at,
    }
}

/// The workspace's snapshots, newest first. `objects` is its listing
/// ([`objects_by_name`]); one that has gone since is left out.
pub async fn snapshots(
    store: &TenantStore,
    name: &str,
    objects: &[ObjectInfo],
) -> Result<Vec<Snapshot>> {
    let dated: Vec<(NaiveDate, ObjectInfo)> = objects
        .iter()
        .filter_map(|o| snapshot_date(name, &o.key).map(|d| (d, o.clone())))
        .collect();
    let mut found: Vec<Snapshot> = stream::iter(dated)
        .map(|(date, object)| async move {
            let manifest = store.get_manifest(&object.key).await?;
            Ok::<_, Error>(manifest.map(|m| snapshot_of(date, &m, object.last_modified)))
        })
        .buffer_unordered(READS_IN_FLIGHT)
        .try_filter_map(|s| async move { Ok(s) })
        .try_collect()
        .await?;
    found.sort_by_key(|s| std::cmp::Reverse(s.date));
    Ok(found)
}

/// What taking a snapshot did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub snapshot: Snapshot,
    /// Whether it was written now: `false` when that day's snapshot held
    /// this manifest already.
    pub written: bool,
}

/// Copies the head's manifest of workspace `name` to its snapshot of
/// `date`, replacing an earlier one of that day; `None` when there is no
/// such workspace. Taking it again with the head unchanged writes nothing.
pub async fn take_snapshot(
    store: &TenantStore,
    name: &str,
    date: NaiveDate,
) -> Result<Option<Taken>> {
    let Some(head) = read_head(store, name).await? else {
        return Ok(None);
    };
    let manifest = match head_manifest(store, name, &head).await {
        Ok(manifest) => manifest,
        // A sync may have moved the head on, and a collection deleted the
        // manifest read here, in between: the head read again is current.
        Err(_) => {
            let Some(head) = read_head(store, name).await? else {
                return Ok(None);
            };
            head_manifest(store, name, &head).await?
        }
    };
    let key = snapshot_key(name, date);
    let digest = manifest.digest();
    if let Some(earlier) = store.get_manifest(&key).await? {
        if earlier.digest() == digest {
            let taken_at = store
                .info(&key)
                .await?
                .map_or_else(Utc::now, |o| o.last_modified);
            return Ok(Some(Taken {
                snapshot: snapshot_of(date, &manifest, taken_at),
                written: false,
            }));
        }
    }
    store.put_manifest(&key, &manifest).await?;
    Ok(Some(Taken {
        snapshot: snapshot_of(date, &manifest, Utc::now()),
        written: true,
    }))
}

/// Makes snapshot `date` of workspace `name` its head again, as released
/// by the holder it had: the next lease that mounts the workspace starts
/// from it. `None` when there is no such workspace or snapshot. The caller
/// makes sure no lease holds the workspace: a holder's next sync would
/// write over it.
pub async fn restore_snapshot(
    store: &TenantStore,
    name: &str,
    date: NaiveDate,
) -> Result<Option<(Head, Snapshot)>> {
    let Some(head) = read_head(store, name).await? else {
        return Ok(None);
    };
    let key = snapshot_key(name, date);
    let Some(manifest) = store.get_manifest(&key).await? else {
        return Ok(None);
    };
    let taken_at = store
        .info(&key)
        .await?
        .map_or_else(Utc::now, |o| o.last_modified);
    // The per-sync copy may have been collected: the head needs its own.
    let digest = store
        .put_manifest(&manifest_key(name, &manifest.digest()), &manifest)
        .await?;
    let restored = Head {
        manifest: digest,
        released: true,
        restored: Some(HeadRestored {
            snapshot: date,
            at: Utc::now(),
        }),
        ..head
    };
    write_head(store, name, &restored).await?;
    Ok(Some((restored, snapshot_of(date, &manifest, taken_at))))
}

/// Deletes workspace `name`: its head first, so that a lease mounting it
/// from then on starts empty, then its manifests and snapshots; the chunks
/// go at the next collection. How many objects were deleted.
pub async fn delete(store: &TenantStore, name: &str) -> Result<u64> {
    store.delete(&head_key(name)).await?;
    let rest = store.list(&prefix(name)).await?;
    delete_all(store, rest).await
}

async fn delete_all(store: &TenantStore, objects: Vec<ObjectInfo>) -> Result<u64> {
    stream::iter(objects)
        .map(|o| async move { store.delete(&o.key).await })
        .buffer_unordered(DELETES_IN_FLIGHT)
        .try_fold(0u64, |n, ()| async move { Ok(n + 1) })
        .await
}

/// What a collection deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Collected {
    pub workspaces: u64,
    pub snapshots_deleted: u64,
    pub manifests_deleted: u64,
    /// Objects of a workspace with no head (a deletion cut short).
    pub leftovers_deleted: u64,
    pub chunks: GcStats,
}

/// Deletes every workspace's snapshots dated before `keep_from`, its
/// manifests that are not its head's and are older than `grace`, the
/// objects of a workspace with no head that are all older than `grace`,
/// and then the chunks that no manifest under `other_live_prefixes` (the
/// datasets') or of a workspace names, older than `grace` (see
/// [`garbage_collect`]; `grace` must be longer than
/// [`CHUNK_REUSE_FRESH`] plus the longest sync).
pub async fn collect(
    store: &TenantStore,
    keep_from: NaiveDate,
    grace: Duration,
    other_live_prefixes: &[&str],
) -> Result<Collected> {
    let cutoff = Utc::now()
        - chrono::Duration::from_std(grace)
            .map_err(|_| Error::Invalid("a grace period past chrono's range".into()))?;
    let mut collected = Collected::default();
    let mut live = Vec::new();
    // Listed before any head is read: a manifest a sync writes after the
    // listing is not a candidate, and one listed before its head moved on
    // is the head's or younger than the grace.
    for (name, objects) in objects_by_name(store).await? {
        let head_listed = objects.iter().any(|o| o.key == head_key(&name));
        let head = if head_listed {
            read_head(store, &name).await?
        } else {
            None
        };
        let Some(head) = head else {
            if objects.iter().all(|o| o.last_modified <= cutoff) {
                collected.leftovers_deleted += delete_all(store, objects).await?;
            } else {
                live.push(manifests_prefix(&name));
                live.push(snapshots_prefix(&name));
            }
            continue;
        };
        collected.workspaces += 1;
        let head_manifest = manifest_key(&name, &head.manifest);
        let mut doomed = Vec::new();
        for object in objects {
            if let Some(date) = snapshot_date(&name, &object.key) {
                if date < keep_from {
                    collected.snapshots_deleted += 1;
                    doomed.push(object);
                }
            } else if object.key.starts_with(&manifests_prefix(&name))
                && object.key != head_manifest
                && object.last_modified <= cutoff
            {
                collected.manifests_deleted += 1;
                doomed.push(object);
            }
        }
        delete_all(store, doomed).await?;
        live.push(manifests_prefix(&name));
        live.push(snapshots_prefix(&name));
    }
    let mut prefixes: Vec<&str> = other_live_prefixes.to_vec();
    prefixes.extend(live.iter().map(String::as_str));
    collected.chunks = garbage_collect(store, &prefixes, grace).await?;
    Ok(collected)
}
