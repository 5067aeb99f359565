//! A lease's workload log: its standard output and standard error, both
//! opened for appending on one file of the agent's state directory
//! (`<state>/logs/<lease>-<placement>.log`, 0600), so that their lines
//! interleave in the order written. Kept after the workload ends for the
//! keep time, so that a tenant can read why a job failed; the gateway reads
//! it through this node ([`serve`]), the only place that holds it.
//!
//! A file rather than a pipe to the agent: a workload outlives a restart
//! of its agent, and a pipe whose reader died would kill it with SIGPIPE
//! at its next line. An adopted workload keeps writing to the same file.
//!
//! Offsets count bytes since the workload started. A file past its limit
//! keeps its newer half behind a marker line; how many bytes went before
//! what the file holds is kept beside it (`<lease>-<placement>.meta`), so a
//! cut shifts no offset and a reader that follows never reads a byte twice.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lh_bus::Bus;
use lh_events::subject;
use lh_rpc::lease_logs::{LeaseLogs, LeaseLogsReply, LeaseLogsRequest};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A file past this keeps only its newer half.
pub const MAX_LEASE_LOG_BYTES: u64 = 64 * 1024 * 1024;
/// The least a file may be limited to: its kept half must hold more than
/// the marker line.
pub const MIN_LEASE_LOG_BYTES: u64 = 1024;
/// How often a running workload's file is checked against its limit, and
/// the ended ones against their keep time.
pub const LEASE_LOG_CHECK_SECS: u64 = 30;
/// How often, at the least, a running workload's file is held to its size
/// limit: a workload writing as fast as the disk takes can outgrow the limit
/// by what it writes in this time, not by half a minute of it.
pub const LEASE_LOG_BOUND_CHECK_MILLIS: u64 = 1000;
/// The quickest check a policy may ask for (a timer cannot tick at zero).
pub const MIN_LEASE_LOG_CHECK_MILLIS: u64 = 10;
/// How long a log is kept after its workload ended, by default.
pub const DEFAULT_LEASE_LOG_KEEP_SECS: u64 = 7 * 24 * 3600;
/// The longest an operator may keep them.
pub const MAX_LEASE_LOG_KEEP_SECS: u64 = 90 * 24 * 3600;
/// What all the logs of a node may hold together, by default; past it the
/// oldest ended ones go first.
pub const DEFAULT_LEASE_LOG_MAX_TOTAL_MIB: u64 = 10 * 1024;
/// Most log files one sweep or lookup lists.
pub const MOST_LEASE_LOG_FILES: usize = 100_000;
/// Queue group the agent answers in (one agent per node).
const QUEUE_GROUP: &str = "node-agent";

/// How the logs of a node are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseLogPolicy {
    /// A file past this keeps its newer half (at least
    /// [`MIN_LEASE_LOG_BYTES`]).
    pub max_file_bytes: u64,
    /// How often files are checked against their limits.
    pub check_every: Duration,
    /// How long a log is kept after its workload ended.
    pub keep_for: Duration,
    /// What all logs may hold together.
    pub max_total_bytes: u64,
}

impl Default for LeaseLogPolicy {
    fn default() -> Self {
        LeaseLogPolicy {
            max_file_bytes: MAX_LEASE_LOG_BYTES,
            check_every: Duration::from_secs(LEASE_LOG_CHECK_SECS),
            keep_for: Duration::from_secs(DEFAULT_LEASE_LOG_KEEP_SECS),
            max_total_bytes: DEFAULT_LEASE_LOG_MAX_TOTAL_MIB * 1024 * 1024,
        }
    }
}

impl LeaseLogPolicy {
    /// The operator's keep time and total, within their limits.
    pub fn new(keep_secs: u64, max_total_mib: u64) -> Self {
        LeaseLogPolicy {
            keep_for: Duration::from_secs(keep_secs.min(MAX_LEASE_LOG_KEEP_SECS)),
            max_total_bytes: max_total_mib.saturating_mul(1024 * 1024),
            ..LeaseLogPolicy::default()
        }
    }

    /// How often to check, never quicker than
    /// [`MIN_LEASE_LOG_CHECK_MILLIS`].
    pub fn check_interval(&self) -> Duration {
        self.check_every
            .max(Duration::from_millis(MIN_LEASE_LOG_CHECK_MILLIS))
    }

    /// How often a running workload's file is held to its limit: the
    /// policy's check, at least every [`LEASE_LOG_BOUND_CHECK_MILLIS`].
    pub fn bound_check_interval(&self) -> Duration {
        self.check_interval()
            .min(Duration::from_millis(LEASE_LOG_BOUND_CHECK_MILLIS))
    }

    fn file_limit(&self) -> u64 {
        self.max_file_bytes
            .clamp(MIN_LEASE_LOG_BYTES, MAX_LEASE_LOG_BYTES)
    }
}

/// What is kept beside a log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct LogMeta {
    /// Bytes written before the first one the file holds.
    dropped_bytes: u64,
    /// When the workload ended (seconds since the epoch); `None` while it
    /// runs.
    ended_at_unix_secs: Option<u64>,
}

/// Cuts, reads and marks of a log each see it whole: the file and its
/// meta change together. They all run in the agent's one process.
static LOG_LOCK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    LOG_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The directory of a node's lease logs.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("logs")
}

/// The log of `lease_id`'s workload for `placement`: a lease moved to
/// other GPUs of the node runs anew, while its old workload may still be
/// stopping.
pub fn path(state_dir: &Path, lease_id: Uuid, placement: u64) -> PathBuf {
    file_in(&dir(state_dir), lease_id, placement)
}

/// The log of `lease_id` for `placement` in the logs directory `dir`.
fn file_in(dir: &Path, lease_id: Uuid, placement: u64) -> PathBuf {
    dir.join(format!("{lease_id}-{placement}.log"))
}

fn meta_path(log: &Path) -> PathBuf {
    log.with_extension("meta")
}

/// Opens (creating it, readable by the agent's user only) the file a new
/// workload writes to; a second handle of it serves as the other stream.
pub fn open(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        super::create_private_dir(dir)?;
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    // The same placement started again (after an agent restart) writes on:
    // its log is no longer ended, so readers follow it and no sweep takes it.
    let mut meta = read_meta(path);
    if meta.ended_at_unix_secs.take().is_some() {
        write_meta(path, &meta)?;
    }
    Ok(file)
}

fn read_meta(log: &Path) -> LogMeta {
    std::fs::read(meta_path(log))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Replaces the meta whole (a crash leaves the old one or the new one).
fn write_meta(log: &Path, meta: &LogMeta) -> io::Result<()> {
    let path = meta_path(log);
    let tmp = path.with_extension("meta.tmp");
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(&serde_json::to_vec(meta).map_err(io::Error::other)?)?;
    std::fs::rename(&tmp, &path)
}

/// The marker that stands where `bytes` of older output were.
pub fn dropped_marker(bytes: u64) -> String {
    format!("[leasehold: {bytes} bytes of older output dropped]\n")
}

/// Keeps the newer half of a file past the limit, behind a marker line;
/// the workload's next line lands at the new end. A line written in the
/// instant the file is shortened may be lost. The bytes cut, when it was cut.
pub fn keep_bounded(path: &Path, policy: &LeaseLogPolicy) -> Option<u64> {
    let limit = policy.file_limit();
    if std::fs::metadata(path).ok()?.len() <= limit {
        return None;
    }
    let _held = lock();
    match cut(path, limit) {
        Ok(cut) => cut,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot cut back a lease log");
            None
        }
    }
}

/// Most rounds of moving down what a workload appends while its log is cut.
const MAX_CUT_CATCH_UPS: usize = 16;

fn cut(path: &Path, limit: u64) -> io::Result<Option<u64>> {
    let mut file = OpenOptions::new().read(true).write(true).open(path)?;
    let len = file.metadata()?.len();
    if len <= limit {
        return Ok(None);
    }
    let keep_from = len - limit / 2;
    file.seek(SeekFrom::Start(keep_from))?;
    let mut kept = Vec::new();
    // What the workload appended meanwhile comes along, up to the limit.
    Read::by_ref(&mut file).take(limit).read_to_end(&mut kept)?;
    // From the start of a line, where one starts in the kept half.
    let line_start = match kept.iter().position(|&b| b == b'\n') {
        Some(nl) if nl + 1 < kept.len() => nl + 1,
        _ => 0,
    };
    let cut_bytes = keep_from + line_start as u64;
    let marker = dropped_marker(cut_bytes);
    file.seek(SeekFrom::Start(0))?;
    file.write_all(marker.as_bytes())?;
    file.write_all(&kept[line_start..])?;
    let mut new_len = (marker.len() + kept.len() - line_start) as u64;
    // What the workload appended while this was written lies past what was
    // read (the new content ends well before it): moved down too, until
    // nothing more came, so that only a write in the last instant before
    // the file is shortened can be lost.
    let mut read_to = keep_from + kept.len() as u64;
    let mut more = Vec::new();
    for _ in 0..MAX_CUT_CATCH_UPS {
        let end = file.metadata()?.len();
        if end <= read_to {
            break;
        }
        more.clear();
        file.seek(SeekFrom::Start(read_to))?;
        Read::by_ref(&mut file)
            .take(end - read_to)
            .read_to_end(&mut more)?;
        file.seek(SeekFrom::Start(new_len))?;
        file.write_all(&more)?;
        new_len += more.len() as u64;
        read_to += more.len() as u64;
    }
    file.set_len(new_len)?;
    let mut meta = read_meta(path);
    // The kept bytes keep their offsets; the marker takes some of the cut's.
    meta.dropped_bytes += cut_bytes - marker.len() as u64;
    write_meta(path, &meta)?;
    Ok(Some(cut_bytes))
}

fn unix_secs(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Records that the workload of the log ended at `at`: nothing more is
/// written, and its keep time runs from then. A file that is not there
/// (the workload never started) gets no mark.
pub fn mark_ended(path: &Path, at: SystemTime) {
    let _held = lock();
    if !path.exists() {
        return;
    }
    let mut meta = read_meta(path);
    if meta.ended_at_unix_secs.is_some() {
        return;
    }
    meta.ended_at_unix_secs = Some(unix_secs(at));
    if let Err(e) = write_meta(path, &meta) {
        tracing::warn!(file = %path.display(), error = %e, "cannot mark a lease log ended");
    }
}

/// Removes a log and its meta; one already gone is fine.
pub fn remove(path: &Path) {
    let _held = lock();
    for file in [path.to_path_buf(), meta_path(path)] {
        if let Err(e) = std::fs::remove_file(&file) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(file = %file.display(), error = %e, "cannot remove a lease log");
            }
        }
    }
}

/// After a restart: marks ended at `at` every log in `dir` not marked yet
/// whose workload is not among `running` (lease and placement): it ended
/// while no agent ran, or with an agent that died before marking it, and
/// would otherwise never be swept. How many were marked.
pub fn mark_others_ended(dir: &Path, running: &[(Uuid, u64)], at: SystemTime) -> usize {
    let mut marked = 0;
    for (lease, placement, path) in list(dir) {
        if running.contains(&(lease, placement)) || read_meta(&path).ended_at_unix_secs.is_some() {
            continue;
        }
        mark_ended(&path, at);
        marked += 1;
    }
    marked
}

/// The logs in `dir`: lease, placement and path, at most
/// [`MOST_LEASE_LOG_FILES`].
fn list(dir: &Path) -> Vec<(Uuid, u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let stem = name.to_str()?.strip_suffix(".log")?;
            let (lease, placement) = stem.rsplit_once('-')?;
            Some((lease.parse().ok()?, placement.parse().ok()?, entry.path()))
        })
        .take(MOST_LEASE_LOG_FILES)
        .collect()
}

/// The log of the lease's latest placement on this node.
fn latest(dir: &Path, lease_id: Uuid) -> Option<PathBuf> {
    list(dir)
        .into_iter()
        .filter(|(lease, _, _)| *lease == lease_id)
        .max_by_key(|(_, placement, _)| *placement)
        .map(|(_, _, path)| path)
}

/// The part of `request.lease_id`'s log the request asks for; `None` when
/// this node keeps no log of it. Whatever the request says, it reads only
/// a log of this node's own and at most the read limit.
pub fn read(dir: &Path, request: &LeaseLogsRequest) -> io::Result<Option<LeaseLogs>> {
    let path = match request.placement {
        // Only that placement's: an older one's log is not this run's.
        Some(placement) => file_in(dir, request.lease_id, placement),
        None => match latest(dir, request.lease_id) {
            Some(path) => path,
            None => return Ok(None),
        },
    };
    let (meta, bytes, start, size) = {
        let _held = lock();
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = read_meta(&path);
        let size = meta.dropped_bytes + file.metadata()?.len();
        let start = match request.tail {
            Some(tail) => size.saturating_sub(tail),
            None => request.offset,
        }
        .clamp(meta.dropped_bytes, size);
        file.seek(SeekFrom::Start(start - meta.dropped_bytes))?;
        let mut bytes = Vec::new();
        file.take(request.read_bytes()).read_to_end(&mut bytes)?;
        (meta, bytes, start, size)
    };
    let finished = meta.ended_at_unix_secs.is_some();
    let at_the_end = start + bytes.len() as u64 == size;
    let bytes = whole_characters(bytes, finished && at_the_end);
    Ok(Some(LeaseLogs {
        data: String::from_utf8_lossy(&bytes).into_owned(),
        next_offset: start + bytes.len() as u64,
        dropped_before: meta.dropped_bytes,
        size,
        finished,
    }))
}

/// `bytes` without a UTF-8 character cut at its end (the next read starts
/// with it), unless nothing more will come. Pure.
pub fn whole_characters(bytes: Vec<u8>, last: bool) -> Vec<u8> {
    if last {
        return bytes;
    }
    match std::str::from_utf8(&bytes) {
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => {
            let mut bytes = bytes;
            bytes.truncate(e.valid_up_to());
            bytes
        }
        _ => bytes,
    }
}

/// One sweep of `dir` at `now`: removes the logs kept past their keep
/// time, then, while all of them hold more than the total allowed, the
/// oldest ended ones. A running workload's log is never removed. How many
/// went.
pub fn sweep(dir: &Path, policy: &LeaseLogPolicy, now: SystemTime) -> usize {
    let now = unix_secs(now);
    let keep_secs = policy.keep_for.as_secs();
    let mut logs: Vec<(Option<u64>, u64, PathBuf)> = list(dir)
        .into_iter()
        .map(|(_, _, path)| {
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            (read_meta(&path).ended_at_unix_secs, len, path)
        })
        .collect();
    let mut removed = 0;
    logs.retain(|(ended, _, path)| match ended {
        Some(at) if at.saturating_add(keep_secs) <= now => {
            remove(path);
            removed += 1;
            false
        }
        _ => true,
    });
    let mut total: u64 = logs.iter().map(|(_, len, _)| len).sum();
    let mut ended: Vec<_> = logs
        .into_iter()
        .filter_map(|(at, len, path)| Some((at?, len, path)))
        .collect();
    ended.sort_by_key(|(at, _, _)| *at);
    for (_, len, path) in ended {
        if total <= policy.max_total_bytes {
            break;
        }
        remove(&path);
        total -= len;
        removed += 1;
    }
    removed
}

/// Sweeps the logs every [`LeaseLogPolicy::check_every`] until `stop`.
pub async fn keep_tidy(
    state_dir: PathBuf,
    policy: LeaseLogPolicy,
    stop: lh_service::CancellationToken,
) {
    let dir = dir(&state_dir);
    let mut every = tokio::time::interval(policy.check_interval());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let dir = dir.clone();
        let removed = tokio::task::spawn_blocking(move || sweep(&dir, &policy, SystemTime::now()))
            .await
            .unwrap_or(0);
        if removed > 0 {
            tracing::info!(
                removed,
                "lease logs past their keep time or the total removed"
            );
        }
    }
}

/// Answers the gateway's reads of this node's lease logs until the
/// subscription ends.
/// `simulated`: the node runs no workloads (`--runtime sim`), which the
/// answer for a lease without a log says, rather than leave a tenant to
/// wonder where their output went.
pub async fn serve(
    bus: Bus,
    node_id: String,
    state_dir: PathBuf,
    simulated: bool,
) -> anyhow::Result<()> {
    let dir = dir(&state_dir);
    lh_bus::rpc::serve(
        &bus,
        &subject::rpc_lease_logs(&node_id),
        QUEUE_GROUP,
        |request: LeaseLogsRequest| {
            let dir = dir.clone();
            async move {
                let lease_id = request.lease_id;
                let read = tokio::task::spawn_blocking(move || read(&dir, &request))
                    .await
                    .map_err(|e| format!("reading the log: {e}"))?;
                match read {
                    Ok(Some(logs)) => Ok(LeaseLogsReply::Logs(logs)),
                    Ok(None) if simulated => Ok(LeaseLogsReply::NotFound {
                        why: format!(
                            "this node simulates its workloads (--runtime sim): the command of \
                             lease {lease_id} never ran here, so it wrote nothing; a node-agent \
                             with --runtime process, docker or podman runs it"
                        ),
                    }),
                    Ok(None) => Ok(LeaseLogsReply::NotFound {
                        why: format!("this node keeps no log of lease {lease_id}"),
                    }),
                    Err(e) => {
                        tracing::warn!(lease = %lease_id, error = %e, "cannot read a lease log");
                        Err(format!("cannot read the log of lease {lease_id}: {e}"))
                    }
                }
            }
        },
    )
    .await?;
    anyhow::bail!("the lease log subscription ended")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(lease_id: Uuid, offset: u64, tail: Option<u64>, max: u64) -> LeaseLogsRequest {
        LeaseLogsRequest {
            lease_id,
            offset,
            tail,
            max_bytes: Some(max),
            placement: None,
        }
    }

    fn small(max_file_bytes: u64) -> LeaseLogPolicy {
        LeaseLogPolicy {
            max_file_bytes,
            ..LeaseLogPolicy::default()
        }
    }

    /// Reads from `offset` to the end in pieces of `max` bytes.
    fn read_all(dir: &Path, lease: Uuid, mut offset: u64, max: u64) -> (String, u64) {
        let mut text = String::new();
        loop {
            let got = read(dir, &request(lease, offset, None, max))
                .unwrap()
                .unwrap();
            assert!(got.next_offset >= offset);
            text.push_str(&got.data);
            if got.next_offset == offset {
                return (text, offset);
            }
            offset = got.next_offset;
        }
    }

    #[test]
    fn reads_continue_from_their_offsets_without_repeats_and_a_tail_reads_the_end() {
        let state = tempfile::tempdir().unwrap();
        let lease = Uuid::from_u128(1);
        let log = path(state.path(), lease, 3);
        let mut file = open(&log).unwrap();
        for i in 0..100 {
            writeln!(file, "line {i}").unwrap();
        }
        let (text, end) = read_all(&dir(state.path()), lease, 0, 7);
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text, expected);
        assert_eq!(end, expected.len() as u64);
        let last = read(&dir(state.path()), &request(lease, 0, Some(8), 100))
            .unwrap()
            .unwrap();
        assert_eq!(last.data, "line 99\n");
        assert!(!last.finished);
        mark_ended(&log, SystemTime::now());
        let done = read(&dir(state.path()), &request(lease, end, None, 100))
            .unwrap()
            .unwrap();
        assert_eq!((done.data.as_str(), done.finished), ("", true));
        // The same placement started again (an agent restarted it) writes
        // on, and its log is no longer finished.
        let mut again = open(&log).unwrap();
        writeln!(again, "line 100").unwrap();
        let more = read(&dir(state.path()), &request(lease, end, None, 100))
            .unwrap()
            .unwrap();
        assert_eq!((more.data.as_str(), more.finished), ("line 100\n", false));
        // Another lease, or one never run here: nothing.
        assert!(read(
            &dir(state.path()),
            &request(Uuid::from_u128(2), 0, None, 10)
        )
        .unwrap()
        .is_none());
    }

    #[test]
    fn the_latest_placement_is_read_and_a_read_is_held_to_its_limit() {
        let state = tempfile::tempdir().unwrap();
        let lease = Uuid::from_u128(1);
        writeln!(open(&path(state.path(), lease, 2)).unwrap(), "old").unwrap();
        let mut new = open(&path(state.path(), lease, 10)).unwrap();
        new.write_all(&vec![b'x'; 600 * 1024]).unwrap();
        let got = read(&dir(state.path()), &request(lease, 0, None, u64::MAX))
            .unwrap()
            .unwrap();
        assert_eq!(
            got.data.len() as u64,
            lh_rpc::lease_logs::MAX_LEASE_LOG_READ_BYTES
        );
        assert!(got.data.starts_with('x'));
    }

    #[test]
    fn a_named_placement_reads_its_own_log_and_none_before_it_is_written() {
        let state = tempfile::tempdir().unwrap();
        let lease = Uuid::from_u128(1);
        // Placed at 2, moved away, then back at 10: only 2 has written.
        writeln!(open(&path(state.path(), lease, 2)).unwrap(), "old").unwrap();
        let named = |placement| LeaseLogsRequest {
            placement: Some(placement),
            ..request(lease, 0, None, 1024)
        };
        assert_eq!(read(&dir(state.path()), &named(10)).unwrap(), None);
        let old = read(&dir(state.path()), &named(2)).unwrap().unwrap();
        assert_eq!(old.data, "old\n");
        writeln!(open(&path(state.path(), lease, 10)).unwrap(), "new").unwrap();
        let new = read(&dir(state.path()), &named(10)).unwrap().unwrap();
        assert_eq!(new.data, "new\n");
        // The older one is still there to be named.
        assert_eq!(read(&dir(state.path()), &named(2)).unwrap(), Some(old));
    }

    #[test]
    fn a_file_past_its_limit_keeps_its_newest_part_and_its_offsets() {
        let state = tempfile::tempdir().unwrap();
        let lease = Uuid::from_u128(5);
        let log = path(state.path(), lease, 1);
        let policy = small(4096);
        let mut file = open(&log).unwrap();
        let line = |i: usize| format!("line {i:05}\n");
        let mut written = 0u64;
        let mut offsets = Vec::new();
        for i in 0..1000 {
            offsets.push(written);
            file.write_all(line(i).as_bytes()).unwrap();
            written += line(i).len() as u64;
        }
        assert_eq!(keep_bounded(&log, &policy).map(|cut| cut > 0), Some(true));
        let len = std::fs::metadata(&log).unwrap().len();
        assert!(len <= 4096, "{len}");
        // The writer appends at the new end.
        file.write_all(line(1000).as_bytes()).unwrap();
        offsets.push(written);
        written += line(1000).len() as u64;

        let from_start = read(&dir(state.path()), &request(lease, 0, None, 100_000))
            .unwrap()
            .unwrap();
        assert_eq!(from_start.size, written, "offsets count every byte written");
        assert!(from_start.dropped_before > 0);
        assert!(
            from_start.data.starts_with("[leasehold: ")
                && from_start.data.contains("bytes of older output dropped]\n"),
            "{}",
            &from_start.data[..80]
        );
        // Every kept line is read at the offset it was written at.
        let kept: Vec<&str> = from_start.data.lines().skip(1).collect();
        assert_eq!(kept.last(), Some(&"line 01000"));
        let first: usize = kept[0]["line ".len()..].parse().unwrap();
        let at = read(
            &dir(state.path()),
            &request(lease, offsets[first], None, 11),
        )
        .unwrap()
        .unwrap();
        assert_eq!(at.data, line(first));
        assert_eq!(at.next_offset, offsets[first + 1]);
        // A second cut moves the start on; offsets still hold.
        for i in 1001..2000 {
            offsets.push(written);
            file.write_all(line(i).as_bytes()).unwrap();
            written += line(i).len() as u64;
        }
        keep_bounded(&log, &policy).unwrap();
        let tail = read(
            &dir(state.path()),
            &request(lease, offsets[1999], None, 100),
        )
        .unwrap()
        .unwrap();
        assert_eq!(tail.data, line(1999));
        assert_eq!(tail.size, written);
    }

    #[test]
    fn a_character_cut_by_the_read_limit_is_left_for_the_next_read() {
        let cut = "añ".as_bytes()[..2].to_vec();
        assert_eq!(whole_characters(cut.clone(), false), b"a");
        assert_eq!(whole_characters(cut.clone(), true), cut);
        assert_eq!(whole_characters(b"ok".to_vec(), false), b"ok");
    }

    #[test]
    fn the_sweep_removes_old_ended_logs_then_the_oldest_past_the_total() {
        let state = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let day = Duration::from_secs(24 * 3600);
        let policy = LeaseLogPolicy {
            keep_for: 7 * day,
            max_total_bytes: 2500,
            ..LeaseLogPolicy::default()
        };
        let write = |n: u128, ended: Option<Duration>| {
            let log = path(state.path(), Uuid::from_u128(n), 1);
            open(&log).unwrap().write_all(&[b'x'; 1000]).unwrap();
            if let Some(ago) = ended {
                mark_ended(&log, now - ago);
            }
            log
        };
        let expired = write(1, Some(8 * day));
        let older = write(2, Some(2 * day));
        let newer = write(3, Some(day));
        let running = write(4, None);
        let running_too = write(5, None);
        assert_eq!(sweep(&dir(state.path()), &policy, now), 3);
        assert!(!expired.exists() && !meta_path(&expired).exists());
        assert!(!older.exists() && !newer.exists());
        assert!(
            running.exists() && running_too.exists(),
            "running logs stay"
        );
        assert_eq!(sweep(&dir(state.path()), &policy, now), 0);
    }

    #[test]
    fn after_a_restart_the_logs_of_workloads_not_adopted_are_marked_ended() {
        let state = tempfile::tempdir().unwrap();
        let (adopted, gone) = (Uuid::from_u128(1), Uuid::from_u128(2));
        for (lease, placement) in [(adopted, 4), (gone, 1), (adopted, 3)] {
            open(&path(state.path(), lease, placement)).unwrap();
        }
        let at = SystemTime::now();
        assert_eq!(
            mark_others_ended(&dir(state.path()), &[(adopted, 4)], at),
            2
        );
        let ended = |lease, placement| {
            read_meta(&path(state.path(), lease, placement))
                .ended_at_unix_secs
                .is_some()
        };
        assert!(!ended(adopted, 4));
        assert!(ended(gone, 1) && ended(adopted, 3));
        assert_eq!(
            mark_others_ended(&dir(state.path()), &[(adopted, 4)], at),
            0
        );
    }

    #[test]
    fn keep_time_and_limits_stay_within_theirs() {
        let policy = LeaseLogPolicy::new(u64::MAX, 1);
        assert_eq!(policy.keep_for.as_secs(), MAX_LEASE_LOG_KEEP_SECS);
        assert_eq!(policy.max_total_bytes, 1024 * 1024);
        assert_eq!(small(1).file_limit(), MIN_LEASE_LOG_BYTES);
    }
}
