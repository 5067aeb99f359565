//! Everything Leasehold needs from an S3 service (SeaweedFS in the tests
//! and `make up`, any S3 in production; docs/adr/031), and nothing about
//! events, nor about leases beyond the id a workspace's head names:
//!
//! - [`Admin`]: the platform's admin identity makes tenants' buckets and
//!   identities (a key confined to one bucket), revokes them, measures and
//!   empties buckets.
//! - [`TenantStore`]: a tenant's bucket through its own key.
//! - [`Manifest`], [`scan_dir`], [`upload_dir`], [`download`]: directory
//!   trees stored as content-addressed chunks, each file cut into
//!   [`CHUNK_BYTES`] pieces named by their SHA-256, plus a manifest whose
//!   own digest addresses the whole tree.
//! - [`workspace`]: how a workspace is laid out on its bucket (its head,
//!   each sync's manifest, daily snapshots), synced, snapshotted, restored
//!   and collected; the node that syncs it and the gateway share it.

mod admin;
mod config;
mod error;
mod gc;
mod manifest;
mod progress;
mod safe_fs;
mod scan;
pub mod sigv4;
mod tenant;
mod transfer;
pub mod workspace;

pub use admin::{
    Admin, ADMIN_CONNECT_TIMEOUT, ADMIN_REQUEST_TIMEOUT, MAX_RESPONSE_BYTES, TENANT_POLICY_NAME,
};
pub use config::{Credentials, StoreConfig, DEFAULT_REGION};
pub use error::{Error, Result};
pub use gc::{garbage_collect, GcStats};
pub use manifest::{
    chunk_len, file_count, is_chunk_name, EntryKind, FileEntry, Manifest, ManifestError,
    ManifestLimits, CHUNK_BYTES, MAX_FILES, MAX_MANIFEST_BYTES, MAX_PATH_BYTES,
    MAX_PATH_COMPONENTS, MAX_SYMLINK_TARGET_BYTES,
};
pub use progress::{NoProgress, Phase, Progress, ProgressEvent};
pub use scan::{scan_dir, Scan, SkipReason, Skipped, MAX_SKIPPED_LISTED};
pub use tenant::{
    chunk_key, ObjectInfo, TenantStore, CHUNK_PREFIX, CONNECT_TIMEOUT, MAX_GET_BYTES, MAX_RETRIES,
    REQUEST_TIMEOUT, RETRY_TIMEOUT,
};
pub use transfer::{
    download, upload_dir, upload_dir_reusing, DownloadStats, Reuse, UploadStats,
    DOWNLOAD_CHUNKS_IN_FLIGHT, UPLOAD_CHUNKS_IN_FLIGHT,
};
