//! Services' snapshots: folded state at a sequence of the log, kept in a
//! JetStream object store that is created on first use. A snapshot is a
//! cache, never the truth, so its size is capped both ways.
//!
//! Each NATS user keeps its snapshots in a bucket of its own
//! (`lh-snapshots-<user>`), and the server lets a user touch no other
//! ([`crate::auth`]): no service can rewrite another's state, no node agent
//! can purge a service's. A connection with an nkey signs each snapshot
//! with it and takes back only one its own key signed, so that bytes put
//! there by anyone else (an operator's mistake, a permission left open)
//! are replayed past, never restored.

use std::sync::Arc;

use async_nats::jetstream::{self, stream::StorageType};

use crate::auth::NODE_SNAPSHOTS_MAX_BYTES;
use crate::error::{js_err, BusError, Result};
use crate::Bus;

/// The prefix of every user's snapshot bucket (docs/adr/011).
pub const SNAPSHOTS_BUCKET_PREFIX: &str = "lh-snapshots-";
/// Size limit of one service's snapshot store, in bytes: JetStream
/// reserves it on disk, for each service.
pub const SNAPSHOTS_MAX_BYTES: i64 = 512 * 1024 * 1024;
/// Largest snapshot stored or read, in bytes.
pub const MAX_SNAPSHOT_BYTES: usize = 256 * 1024 * 1024;
/// First line of a snapshot's object: the format, then the signature.
const SIGNED: &str = "lh-snapshot-v1 ed25519 ";
const UNSIGNED: &str = "lh-snapshot-v1 unsigned\n";

/// The bucket of snapshots `user` keeps: its name with anything but
/// letters, digits, `-` and `_` as `_`.
pub fn snapshots_bucket(user: &str) -> String {
    let name: String = user
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{SNAPSHOTS_BUCKET_PREFIX}{name}")
}

/// Where a connection keeps its snapshots, and the key it signs them with.
#[derive(Clone)]
pub(crate) struct SnapshotKeeper {
    pub(crate) bucket: String,
    /// The bucket's size limit: a node's is small, so that one node cannot
    /// fill the disk through it, nor a fleet's buckets reserve much of it.
    pub(crate) max_bytes: i64,
    pub(crate) signer: Option<Arc<nkeys::KeyPair>>,
}

/// The size limit of `user`'s snapshot bucket.
pub(crate) fn snapshots_max_bytes(user: &str) -> i64 {
    if crate::auth::is_node_user(user) {
        NODE_SNAPSHOTS_MAX_BYTES
    } else {
        SNAPSHOTS_MAX_BYTES
    }
}

impl SnapshotKeeper {
    /// `bytes` as stored: with a signature line when there is a signer.
    fn seal(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        let head = match &self.signer {
            Some(key) => {
                let signature = key
                    .sign(bytes)
                    .map_err(|e| BusError::JetStream(format!("cannot sign a snapshot: {e}")))?;
                format!("{SIGNED}{}\n", hex::encode(signature))
            }
            None => UNSIGNED.to_string(),
        };
        let mut sealed = Vec::with_capacity(head.len() + bytes.len());
        sealed.extend_from_slice(head.as_bytes());
        sealed.extend_from_slice(bytes);
        Ok(sealed)
    }

    /// The snapshot in `sealed`, when this connection may trust it: signed
    /// by its own key when it has one, in this format otherwise.
    fn open(&self, mut sealed: Vec<u8>) -> std::result::Result<Vec<u8>, String> {
        let Some(end) = sealed.iter().position(|&b| b == b'\n') else {
            return Err("no format line".into());
        };
        let head =
            std::str::from_utf8(&sealed[..=end]).map_err(|_| "a format line that is not text")?;
        let body_from = end + 1;
        match (&self.signer, head.strip_prefix(SIGNED)) {
            (Some(key), Some(signature)) => {
                let signature =
                    hex::decode(signature.trim_end()).map_err(|_| "a signature that is not hex")?;
                key.verify(&sealed[body_from..], &signature)
                    .map_err(|_| "a signature not by this connection's key")?;
            }
            (Some(_), None) => return Err("not signed, and this connection signs".into()),
            (None, _) if head == UNSIGNED => {}
            (None, _) => return Err("signed, and this connection has no key to check it".into()),
        }
        sealed.drain(..body_from);
        Ok(sealed)
    }
}

impl Bus {
    async fn snapshot_store(&self) -> Result<jetstream::object_store::ObjectStore> {
        let bucket = &self.snapshots.bucket;
        match self.own_js.get_object_store(bucket).await {
            Ok(store) => Ok(store),
            Err(_) => self
                .own_js
                .create_object_store(jetstream::object_store::Config {
                    bucket: bucket.clone(),
                    description: Some(
                        "services' folded state at a sequence of LH_EVENTS: a cache, never the truth"
                            .into(),
                    ),
                    max_bytes: self.snapshots.max_bytes,
                    storage: StorageType::File,
                    num_replicas: self.replicas,
                    ..Default::default()
                })
                .await
                .map_err(js_err),
        }
    }

    /// Stores a snapshot under `key`, replacing the one there.
    pub async fn put_snapshot(&self, key: &str, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_SNAPSHOT_BYTES {
            return Err(BusError::JetStream(format!(
                "a snapshot of {} bytes is over the {MAX_SNAPSHOT_BYTES} allowed",
                bytes.len()
            )));
        }
        let sealed = self.snapshots.seal(bytes)?;
        let store = self.snapshot_store().await?;
        let mut reader = sealed.as_slice();
        store.put(key, &mut reader).await.map_err(js_err)?;
        Ok(())
    }

    /// The snapshot stored under `key`, if there is one this connection
    /// trusts (see the module's documentation); one it does not is
    /// logged and counted as none.
    pub async fn get_snapshot(&self, key: &str) -> Result<Option<Vec<u8>>> {
        use tokio::io::AsyncReadExt as _;
        let store = self.snapshot_store().await?;
        let mut object = match store.get(key).await {
            Ok(object) => object,
            Err(e) if e.kind() == jetstream::object_store::GetErrorKind::NotFound => {
                return Ok(None)
            }
            Err(e) => return Err(js_err(e)),
        };
        let mut bytes = Vec::new();
        (&mut object)
            .take(MAX_SNAPSHOT_BYTES as u64 + 1024)
            .read_to_end(&mut bytes)
            .await
            .map_err(js_err)?;
        if bytes.len() > MAX_SNAPSHOT_BYTES + 1024 {
            return Err(BusError::JetStream(format!(
                "the snapshot {key} is over the {MAX_SNAPSHOT_BYTES} bytes allowed"
            )));
        }
        match self.snapshots.open(bytes) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(why) => {
                metrics::counter!("lh_snapshots_refused_total", "service" => self.service.to_string())
                    .increment(1);
                tracing::warn!(
                    key,
                    bucket = self.snapshots.bucket,
                    why,
                    "refusing a stored snapshot"
                );
                Ok(None)
            }
        }
    }
}
