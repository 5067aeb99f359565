//! Services' snapshots: folded state at a sequence of the log, kept in a
//! JetStream object store that is created on first use. A snapshot is a
//! cache, never the truth, so its size is capped both ways.

use async_nats::jetstream::{self, stream::StorageType};

use crate::error::{js_err, BusError, Result};
use crate::Bus;

/// The object store of services' snapshots (docs/adr/011).
pub const SNAPSHOTS_BUCKET: &str = "lh-snapshots";
/// Size limit of the snapshot store, in bytes.
pub const SNAPSHOTS_MAX_BYTES: i64 = 1024 * 1024 * 1024;
/// Largest snapshot stored or read, in bytes.
pub const MAX_SNAPSHOT_BYTES: usize = 256 * 1024 * 1024;

impl Bus {
    async fn snapshot_store(&self) -> Result<jetstream::object_store::ObjectStore> {
        match self.js.get_object_store(SNAPSHOTS_BUCKET).await {
            Ok(store) => Ok(store),
            Err(_) => self
                .js
                .create_object_store(jetstream::object_store::Config {
                    bucket: SNAPSHOTS_BUCKET.to_string(),
                    description: Some(
                        "services' folded state at a sequence of LH_EVENTS: a cache, never the truth"
                            .into(),
                    ),
                    max_bytes: SNAPSHOTS_MAX_BYTES,
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
        let store = self.snapshot_store().await?;
        let mut reader = bytes;
        store.put(key, &mut reader).await.map_err(js_err)?;
        Ok(())
    }

    /// The snapshot stored under `key`, if there is one.
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
            .take(MAX_SNAPSHOT_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(js_err)?;
        if bytes.len() > MAX_SNAPSHOT_BYTES {
            return Err(BusError::JetStream(format!(
                "the snapshot {key} is over the {MAX_SNAPSHOT_BYTES} bytes allowed"
            )));
        }
        Ok(Some(bytes))
    }
}
