//! Why a workload failed, from the last lines of its log
//! ([`super::lease_log`], where its standard error goes): a workload over
//! its share's GPU memory gets an allocation error from the driver (MPS
//! enforces the limit), which the CUDA libraries print before the process
//! exits non-zero.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use lh_events::LeaseFailure;

/// How much of the end of the file is read to tell why a workload failed.
pub const STDERR_TAIL_BYTES: u64 = 16 * 1024;
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

/// Why a workload that exited non-zero failed, from the end of what it
/// wrote to standard error. Pure.
pub fn failure_in(stderr_tail: &str) -> Option<LeaseFailure> {
    let text = stderr_tail.to_ascii_lowercase();
    ALLOCATION_ERRORS
        .iter()
        .any(|marker| text.contains(marker))
        .then_some(LeaseFailure::GpuMemoryExceeded)
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
    fn the_tail_is_the_end_of_a_long_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut file = std::fs::File::create(&path).unwrap();
        use std::io::Write;
        let filler = "x".repeat(1024);
        for _ in 0..64 {
            writeln!(file, "{filler}").unwrap();
        }
        writeln!(file, "CUDA error: out of memory").unwrap();
        let tail = tail(&path);
        assert!(tail.len() as u64 <= STDERR_TAIL_BYTES);
        assert!(tail.ends_with("CUDA error: out of memory\n"));
        assert_eq!(super::tail(&dir.path().join("none")), "");
    }
}
