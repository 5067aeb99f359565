//! Moving a scanned directory to a tenant's bucket and back.
//!
//! Up: each distinct chunk once, skipped when the bucket has it already
//! (so an upload that was cut short resumes where it stopped, with no
//! multipart state to keep), re-read from disk and checked against the
//! scan before it is sent. Down: a fresh tree, every chunk checked against
//! its name before it is written at its offset, many in flight.

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::{stream, StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::manifest::{chunk_len, EntryKind, Manifest, ManifestLimits, CHUNK_BYTES};
use crate::progress::{Phase, Progress, ProgressEvent};
use crate::safe_fs;
use crate::tenant::TenantStore;

/// Chunks being checked, read or sent at once by an upload: 8 × 8 MiB in
/// memory at most.
pub const UPLOAD_CHUNKS_IN_FLIGHT: usize = 8;
/// Chunks being fetched or written at once by a download: 16 × 8 MiB in
/// memory at most, enough requests in flight to keep a link full while
/// others are hashed and written.
pub const DOWNLOAD_CHUNKS_IN_FLIGHT: usize = 16;
/// Files a download creates ahead of the chunks that fill them.
const FILES_CREATED_AHEAD: usize = 4;
const FILE_MODE: libc::mode_t = 0o644;
const EXECUTABLE_MODE: libc::mode_t = 0o755;
const DIR_MODE: libc::mode_t = 0o755;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UploadStats {
    pub chunks_sent: u64,
    /// Chunks the bucket had already.
    pub chunks_skipped: u64,
    pub bytes_sent: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DownloadStats {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub chunks: u64,
    pub bytes: u64,
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Invalid(format!("a file system task failed: {e}")))?
}

/// Which chunks the bucket holds already an upload takes as they are.
#[derive(Debug, Clone, Copy)]
pub enum Reuse<'a> {
    /// Any of the right size: for an upload whose manifest is checked
    /// against the bucket before it counts (a dataset's version is).
    Any,
    /// The `live` ones (named by a manifest the collector keeps until this
    /// upload's is written), and others stored less than `fresh` ago. An
    /// older one is sent again, which makes it young: a collector deleting
    /// chunks no manifest names, older than a grace longer than `fresh`
    /// plus the upload, can then never take one this upload counted on.
    LiveOrFresh {
        live: &'a HashSet<String>,
        fresh: std::time::Duration,
    },
}

/// One distinct chunk to upload, where the scan found it first.
struct UploadJob {
    path: String,
    file_bytes: u64,
    index: usize,
    hash: String,
    bytes: u64,
    /// Taken as it is if the bucket holds it stored after this; `None`:
    /// whenever it holds it.
    reuse_after: Option<chrono::DateTime<chrono::Utc>>,
}

/// Sends the chunks of `manifest` (a scan of `root`) that the bucket lacks.
/// Put the manifest itself only after this succeeds: then no stored
/// manifest names a chunk that is not there.
pub async fn upload_dir(
    store: &TenantStore,
    root: &Path,
    manifest: &Manifest,
    progress: &dyn Progress,
) -> Result<UploadStats> {
    upload_dir_reusing(store, root, manifest, progress, Reuse::Any).await
}

/// [`upload_dir`], taking only the chunks `reuse` allows as they are.
pub async fn upload_dir_reusing(
    store: &TenantStore,
    root: &Path,
    manifest: &Manifest,
    progress: &dyn Progress,
    reuse: Reuse<'_>,
) -> Result<UploadStats> {
    manifest.validate(&ManifestLimits::default())?;
    let fresh_since = match reuse {
        Reuse::Any => None,
        Reuse::LiveOrFresh { fresh, .. } => Some(
            chrono::Utc::now()
                - chrono::Duration::from_std(fresh)
                    .map_err(|_| Error::Invalid("a reuse window past chrono's range".into()))?,
        ),
    };
    let root_fd = Arc::new(safe_fs::open_root(root).map_err(|e| Error::io(root.display(), e))?);
    let mut seen = HashSet::new();
    let mut jobs = Vec::new();
    for entry in &manifest.files {
        if let EntryKind::File { bytes, chunks, .. } = &entry.kind {
            for (index, hash) in chunks.iter().enumerate() {
                if seen.insert(hash.as_str()) {
                    let live = match reuse {
                        Reuse::Any => true,
                        Reuse::LiveOrFresh { live, .. } => live.contains(hash),
                    };
                    jobs.push(UploadJob {
                        path: entry.path.clone(),
                        file_bytes: *bytes,
                        index,
                        hash: hash.clone(),
                        bytes: chunk_len(*bytes, index),
                        reuse_after: if live { None } else { fresh_since },
                    });
                }
            }
        }
    }
    let total: u64 = jobs.iter().map(|j| j.bytes).sum();
    let mut stats = UploadStats::default();
    let mut done = 0u64;
    let mut results = stream::iter(jobs)
        .map(|job| upload_chunk(store, root_fd.clone(), job))
        .buffer_unordered(UPLOAD_CHUNKS_IN_FLIGHT);
    while let Some(result) = results.next().await {
        let (sent, bytes) = result?;
        if sent {
            stats.chunks_sent += 1;
            stats.bytes_sent += bytes;
        } else {
            stats.chunks_skipped += 1;
        }
        done += bytes;
        progress.report(ProgressEvent {
            phase: Phase::Upload,
            bytes_done: done,
            bytes_total: Some(total),
            files_done: 0,
        });
    }
    Ok(stats)
}

/// Whether the chunk was sent (or found there), and its size.
async fn upload_chunk(
    store: &TenantStore,
    root: Arc<OwnedFd>,
    job: UploadJob,
) -> Result<(bool, u64)> {
    // One of another size is not this chunk (a write cut short): replace it.
    let stored = store.info(&crate::tenant::chunk_key(&job.hash)).await?;
    if let Some(stored) = stored {
        let recent = job
            .reuse_after
            .is_none_or(|after| stored.last_modified > after);
        if stored.bytes == job.bytes && recent {
            return Ok((false, job.bytes));
        }
    }
    let bytes = job.bytes;
    let hash = job.hash.clone();
    let data = blocking(move || read_chunk(&root, &job)).await?;
    store.put_chunk(&hash, data).await?;
    Ok((true, bytes))
}

/// The chunk as the file holds it now, if it is still what was scanned.
fn read_chunk(root: &OwnedFd, job: &UploadJob) -> Result<Bytes> {
    let changed = |what: String| Error::Changed {
        path: job.path.clone(),
        what,
    };
    let (file, st) = safe_fs::open_file_beneath(root.as_fd(), &job.path).map_err(|e| {
        match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR | libc::ENOENT) => {
                changed(format!("it can no longer be opened as scanned ({e})"))
            }
            _ if e.kind() == std::io::ErrorKind::InvalidData => changed(e.to_string()),
            _ => Error::io(&job.path, e),
        }
    })?;
    let now = u64::try_from(st.st_size).unwrap_or(0);
    if now != job.file_bytes {
        return Err(changed(format!(
            "{now} bytes now, {} when scanned",
            job.file_bytes
        )));
    }
    let mut buf = vec![0u8; job.bytes as usize];
    file.read_exact_at(&mut buf, job.index as u64 * CHUNK_BYTES)
        .map_err(|e| Error::io(&job.path, e))?;
    if hex::encode(Sha256::digest(&buf)) != job.hash {
        return Err(changed(format!(
            "chunk {} no longer hashes to {}",
            job.index, job.hash
        )));
    }
    Ok(Bytes::from(buf))
}

/// A file being written, and how many of its chunks are still to come.
struct Target {
    file: std::fs::File,
    remaining: AtomicUsize,
}

/// Owned, not borrowed from the manifest: a stream of borrowed jobs makes
/// the download's future `Send` for some lifetimes only, and a task
/// spawned with it fails to compile.
struct ChunkJob {
    target: Arc<Target>,
    path: Arc<str>,
    hash: String,
    offset: u64,
    bytes: u64,
}

/// Writes the tree of `manifest` into `dest`, an empty directory the
/// caller made: directories (0755), symlinks as recorded (their targets
/// are not looked at), files (0644, or 0755 if executable) filled from
/// their chunks, each checked against its name first. Nothing is written
/// outside `dest`: every path is reached one directory at a time without
/// following a symlink. On an error, what was written stays for the
/// caller to remove.
pub async fn download(
    store: &TenantStore,
    manifest: &Manifest,
    dest: &Path,
    progress: &dyn Progress,
) -> Result<DownloadStats> {
    manifest.validate(&ManifestLimits::default())?;
    let root = Arc::new(safe_fs::open_root(dest).map_err(|e| Error::io(dest.display(), e))?);
    let mut sorted: Vec<_> = manifest.files.iter().collect();
    // Parents sort before their children.
    sorted.sort_by(|a, b| a.path.cmp(&b.path));

    let mut stats = DownloadStats::default();
    let mut structure = Vec::new();
    let mut files = Vec::new();
    for entry in sorted {
        match &entry.kind {
            EntryKind::Dir => {
                stats.dirs += 1;
                structure.push((entry.path.clone(), None));
            }
            EntryKind::Symlink { target } => {
                stats.symlinks += 1;
                structure.push((entry.path.clone(), Some(target.clone())));
            }
            EntryKind::File {
                bytes,
                executable,
                chunks,
            } => {
                stats.files += 1;
                files.push((
                    Arc::<str>::from(entry.path.as_str()),
                    *bytes,
                    *executable,
                    chunks.clone(),
                ));
            }
        }
    }
    let dest_shown = dest.display().to_string();
    let tree_root = root.clone();
    blocking(move || make_structure(&tree_root, &dest_shown, structure)).await?;

    let total = manifest.total_bytes();
    let files_done = AtomicU64::new(0);
    let files_done = &files_done;
    let created = stream::iter(files)
        .map(
            |(path, bytes, executable, chunks): (Arc<str>, u64, bool, Vec<String>)| {
                let root = root.clone();
                let owned_path = path.to_string();
                async move {
                    let file = blocking(move || create_file(&root, &owned_path, executable, bytes))
                        .await?;
                    if chunks.is_empty() {
                        files_done.fetch_add(1, Ordering::Relaxed);
                    }
                    let target = Arc::new(Target {
                        file,
                        remaining: AtomicUsize::new(chunks.len()),
                    });
                    Ok::<_, Error>((target, path, bytes, chunks))
                }
            },
        )
        .buffered(FILES_CREATED_AHEAD);
    let jobs = created
        .map_ok(|(target, path, bytes, chunks)| {
            stream::iter(chunks.into_iter().enumerate().map(move |(index, hash)| {
                Ok(ChunkJob {
                    target: target.clone(),
                    path: path.clone(),
                    hash,
                    offset: index as u64 * CHUNK_BYTES,
                    bytes: chunk_len(bytes, index),
                })
            }))
        })
        .try_flatten();
    let mut writes = jobs
        .map_ok(|job| fetch_and_write(store, job, files_done))
        .try_buffer_unordered(DOWNLOAD_CHUNKS_IN_FLIGHT);
    while let Some(bytes) = writes.try_next().await? {
        stats.chunks += 1;
        stats.bytes += bytes;
        progress.report(ProgressEvent {
            phase: Phase::Download,
            bytes_done: stats.bytes,
            bytes_total: Some(total),
            files_done: files_done.load(Ordering::Relaxed),
        });
    }
    Ok(stats)
}

/// Directories and symlinks, parents first; `dest` must be empty.
fn make_structure(
    root: &OwnedFd,
    dest: &str,
    entries: Vec<(String, Option<String>)>,
) -> Result<()> {
    if !safe_fs::is_empty_dir(root.as_fd()).map_err(|e| Error::io(dest, e))? {
        return Err(Error::Invalid(format!(
            "{dest} is not empty: a download writes a fresh tree"
        )));
    }
    for (path, target) in entries {
        let (parent, name) = safe_fs::split_parent(&path);
        let made = safe_fs::open_dir_beneath(root.as_fd(), parent).and_then(|dir| {
            let name = safe_fs::c_name(name.as_bytes())?;
            match &target {
                None => safe_fs::mkdir_at(dir.as_fd(), &name, DIR_MODE),
                Some(target) => {
                    safe_fs::symlink_at(&safe_fs::c_name(target.as_bytes())?, dir.as_fd(), &name)
                }
            }
        });
        made.map_err(|e| Error::io(&path, e))?;
    }
    Ok(())
}

fn create_file(root: &OwnedFd, path: &str, executable: bool, bytes: u64) -> Result<std::fs::File> {
    let (parent, name) = safe_fs::split_parent(path);
    let mode = if executable {
        EXECUTABLE_MODE
    } else {
        FILE_MODE
    };
    let file = safe_fs::open_dir_beneath(root.as_fd(), parent)
        .and_then(|dir| {
            safe_fs::create_file_at(dir.as_fd(), &safe_fs::c_name(name.as_bytes())?, mode)
        })
        .map_err(|e| Error::io(path, e))?;
    // Full size at once: chunks land at their offsets in any order.
    file.set_len(bytes).map_err(|e| Error::io(path, e))?;
    Ok(file)
}

/// Fetches a chunk, checks it, writes it at its offset; its size.
async fn fetch_and_write(
    store: &TenantStore,
    job: ChunkJob,
    files_done: &AtomicU64,
) -> Result<u64> {
    let (frames, actual) = store.fetch_chunk(&job.hash, job.bytes).await?;
    if actual != job.hash {
        return Err(Error::ChunkMismatch {
            chunk: job.hash.clone(),
            why: format!("its bytes hash to {actual} (for {})", job.path),
        });
    }
    let path = job.path.to_string();
    let target = job.target.clone();
    let mut offset = job.offset;
    blocking(move || {
        for frame in frames {
            target
                .file
                .write_all_at(&frame, offset)
                .map_err(|e| Error::io(&path, e))?;
            offset += frame.len() as u64;
        }
        Ok(())
    })
    .await?;
    if job.target.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
        files_done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(job.bytes)
}
