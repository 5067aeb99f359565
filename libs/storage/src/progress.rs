//! How far a scan, upload or download has come, for a CLI's progress bar.

/// Which transfer an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading and hashing a directory; its total is not known before the
    /// end.
    Scan,
    Upload,
    Download,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressEvent {
    pub phase: Phase,
    /// Bytes read, sent (or found already there), or written so far.
    pub bytes_done: u64,
    pub bytes_total: Option<u64>,
    /// Files whose every byte is done (a scan and a download count them).
    pub files_done: u64,
}

/// Told of every step: after each chunk, and after each file of a scan.
/// Called from the transfer's tasks, so it must be cheap; a bar redraws at
/// its own pace.
pub trait Progress: Send + Sync {
    fn report(&self, event: ProgressEvent);
}

impl<F: Fn(ProgressEvent) + Send + Sync> Progress for F {
    fn report(&self, event: ProgressEvent) {
        self(event)
    }
}

/// Progress nobody watches.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn report(&self, _: ProgressEvent) {}
}
