//! A workload's standard error, kept in a file of the agent's state
//! directory while it runs, so that the agent can tell from its last lines
//! why it failed: a workload over its share's GPU memory gets an
//! allocation error from the driver (MPS enforces the limit), which the
//! CUDA libraries print before the process exits non-zero.
//!
//! A file rather than a pipe to the agent: a workload outlives a restart
//! of its agent, and a pipe whose reader died would kill it with SIGPIPE
//! at its next line. The file is opened for appending, so the agent may
//! cut it back while the workload writes, and it goes when the lease's
//! workload ends.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use lh_events::LeaseFailure;
use uuid::Uuid;

/// How much of the end of the file is read to tell why a workload failed.
pub const STDERR_TAIL_BYTES: u64 = 16 * 1024;
/// A file past this is cut back to nothing (a workload that writes that
/// much to standard error would fill the agent's disk otherwise).
pub const MAX_STDERR_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// How often a running workload's file is checked against that limit.
pub const STDERR_CHECK_SECS: u64 = 30;

/// What the CUDA runtime, the driver API, PyTorch, CuPy, TensorFlow and
/// JAX print when a GPU allocation fails. Matched case-insensitively.
const ALLOCATION_ERRORS: &[&str] = &[
    "cuda out of memory",
    "cuda error: out of memory",
    "cudaerrormemoryallocation",
    "cuda_error_out_of_memory",
    "outofmemoryerror",
    "out of memory allocating",
    "resource_exhausted: out of memory",
];

/// Where the standard error of `lease_id`'s workload for `placement` is
/// kept: a lease moved to other GPUs of the node runs anew, while its old
/// workload may still be stopping.
pub fn path(state_dir: &Path, lease_id: Uuid, placement: u64) -> PathBuf {
    state_dir
        .join("stderr")
        .join(format!("{lease_id}-{placement}.log"))
}

/// Opens (creating it, readable by the agent's user only) the file a new
/// workload writes its standard error to.
pub fn open(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// The last [`STDERR_TAIL_BYTES`] of the file, as text; empty when there
/// is none.
pub fn tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if file
        .seek(SeekFrom::Start(len.saturating_sub(STDERR_TAIL_BYTES)))
        .is_err()
    {
        return String::new();
    }
    let mut bytes = Vec::new();
    let _ = file.take(STDERR_TAIL_BYTES).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Cuts the file back to nothing when it outgrew [`MAX_STDERR_FILE_BYTES`];
/// the workload's next line lands at the new end.
pub fn keep_bounded(path: &Path) {
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    if meta.len() <= MAX_STDERR_FILE_BYTES {
        return;
    }
    match OpenOptions::new().write(true).open(path) {
        Ok(file) => {
            if let Err(e) = file.set_len(0) {
                tracing::warn!(file = %path.display(), error = %e, "cannot cut back a workload's stderr file");
            }
        }
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot cut back a workload's stderr file")
        }
    }
}

/// Why a workload that exited non-zero failed, from the end of what it
/// wrote to standard error. Pure.
pub fn failure_in(stderr_tail: &str) -> Option<LeaseFailure> {
    let text = stderr_tail.to_ascii_lowercase();
    ALLOCATION_ERRORS
        .iter()
        .any(|marker| text.contains(marker))
        .then_some(LeaseFailure::GpuMemoryExceeded)
}

/// Removes the file; one already gone is fine.
pub fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(file = %path.display(), error = %e, "cannot remove a workload's stderr file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_errors_of_the_usual_libraries_read_as_gpu_memory_exceeded() {
        for said in [
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of 139.81 GiB",
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
            "cudaMalloc failed: cudaErrorMemoryAllocation",
            "CUDA_ERROR_OUT_OF_MEMORY: out of memory",
            "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 3,221,225,472 bytes",
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate",
        ] {
            assert_eq!(
                failure_in(said),
                Some(LeaseFailure::GpuMemoryExceeded),
                "{said}"
            );
        }
    }

    #[test]
    fn other_failures_name_no_cause() {
        for said in [
            "",
            "Traceback (most recent call last):\nValueError: bad input",
            "Killed",
            "host memory: cannot allocate memory",
        ] {
            assert_eq!(failure_in(said), None, "{said}");
        }
    }

    #[test]
    fn the_tail_is_the_end_of_a_long_file_and_a_file_past_its_limit_is_cut_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = path(dir.path(), Uuid::from_u128(7), 1);
        let mut file = open(&path).unwrap();
        use std::io::Write;
        let filler = "x".repeat(1024);
        for _ in 0..64 {
            writeln!(file, "{filler}").unwrap();
        }
        writeln!(file, "CUDA error: out of memory").unwrap();
        let tail = tail(&path);
        assert!(tail.len() as u64 <= STDERR_TAIL_BYTES);
        assert!(tail.ends_with("CUDA error: out of memory\n"));
        keep_bounded(&path);
        assert!(
            std::fs::metadata(&path).unwrap().len() > 0,
            "under the limit"
        );
        file.set_len(MAX_STDERR_FILE_BYTES + 1).unwrap();
        keep_bounded(&path);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        // The writer appends at the new end, not past a hole.
        writeln!(file, "after").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "after\n");
        remove(&path);
        assert!(!path.exists());
    }
}
