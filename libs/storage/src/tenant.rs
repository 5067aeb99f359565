//! A tenant's bucket, reached with the tenant's own key through
//! `object_store`: manifests wherever the caller puts them, chunks under
//! [`CHUNK_PREFIX`] named by their SHA-256.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, PutPayload, RetryConfig};
use sha2::{Digest, Sha256};

use crate::admin::check_bucket_name;
use crate::config::{Credentials, StoreConfig};
use crate::error::{Error, Result};
use crate::manifest::{is_chunk_name, Manifest, ManifestLimits, MAX_MANIFEST_BYTES};

/// Where chunks live: `chunks/sha256/<hex>`.
pub const CHUNK_PREFIX: &str = "chunks/sha256/";
/// One request, an 8 MiB chunk included, on a slow link.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Retries of a request that failed on the way or answered 5xx; a
/// refusal (4xx) is never retried.
pub const MAX_RETRIES: usize = 3;
/// All the tries of one request together.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(300);
/// The largest object [`TenantStore::get`] reads into memory.
pub const MAX_GET_BYTES: u64 = MAX_MANIFEST_BYTES;

/// The name of a chunk's object.
pub fn chunk_key(hash: &str) -> String {
    format!("{CHUNK_PREFIX}{hash}")
}

/// An object as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub bytes: u64,
    pub last_modified: DateTime<Utc>,
}

/// A tenant's bucket, with the tenant's credentials. Cheap to clone.
#[derive(Clone)]
pub struct TenantStore {
    s3: Arc<AmazonS3>,
    bucket: String,
}

impl std::fmt::Debug for TenantStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantStore")
            .field("bucket", &self.bucket)
            .finish_non_exhaustive()
    }
}

fn object_path(key: &str) -> Result<ObjectPath> {
    ObjectPath::parse(key).map_err(|e| Error::Invalid(format!("object key {key:?}: {e}")))
}

impl TenantStore {
    /// A client of `bucket` on the service `config` names, path-style,
    /// signed with `credentials`. Makes no request.
    pub fn new(
        config: &StoreConfig,
        bucket: &str,
        credentials: &Credentials,
    ) -> Result<TenantStore> {
        config.url()?;
        check_bucket_name(bucket)?;
        let options = ClientOptions::new()
            .with_timeout(REQUEST_TIMEOUT)
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_allow_http(config.is_http());
        let retry = RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: MAX_RETRIES,
            retry_timeout: RETRY_TIMEOUT,
        };
        let s3 = AmazonS3Builder::new()
            .with_endpoint(&config.endpoint)
            .with_region(&config.region)
            .with_bucket_name(bucket)
            .with_access_key_id(&credentials.access_key_id)
            .with_secret_access_key(&credentials.secret_access_key)
            .with_virtual_hosted_style_request(false)
            // Chunks are hashed by us already and checked on the way back;
            // a second SHA-256 of each body to sign it buys nothing.
            .with_unsigned_payload(true)
            .with_client_options(options)
            .with_retry(retry)
            .build()
            .map_err(|e| Error::Config(format!("the tenant store of {bucket}: {e}")))?;
        Ok(TenantStore {
            s3: Arc::new(s3),
            bucket: bucket.to_owned(),
        })
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<()> {
        self.s3
            .put(&object_path(key)?, PutPayload::from(bytes))
            .await
            .map_err(|e| Error::object("put", key, e))?;
        Ok(())
    }

    /// The object's bytes, `None` if there is none; refuses one over
    /// [`MAX_GET_BYTES`] without reading it.
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        self.get_bounded(key, MAX_GET_BYTES).await
    }

    async fn get_bounded(&self, key: &str, max_bytes: u64) -> Result<Option<Bytes>> {
        let result = match self.s3.get(&object_path(key)?).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Error::object("get", key, e)),
        };
        if result.meta.size > max_bytes {
            return Err(Error::Limit(format!(
                "{key} holds {} bytes, more than {max_bytes}",
                result.meta.size
            )));
        }
        let bytes = result
            .bytes()
            .await
            .map_err(|e| Error::object("get", key, e))?;
        Ok(Some(bytes))
    }

    /// The object's size, `None` if there is none.
    pub async fn head(&self, key: &str) -> Result<Option<u64>> {
        match self.s3.head(&object_path(key)?).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::object("head", key, e)),
        }
    }

    /// The object as a listing shows it, `None` if there is none: what a
    /// collector looks at again right before it deletes.
    pub async fn info(&self, key: &str) -> Result<Option<ObjectInfo>> {
        match self.s3.head(&object_path(key)?).await {
            Ok(meta) => Ok(Some(ObjectInfo {
                key: meta.location.to_string(),
                bytes: meta.size,
                last_modified: meta.last_modified,
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::object("head", key, e)),
        }
    }

    /// Deletes the object; one that is not there is no error.
    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.s3.delete(&object_path(key)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::object("delete", key, e)),
        }
    }

    /// Every object under `prefix` (a `/`-separated key prefix: `a/b`
    /// lists `a/b/...`; `""` lists the bucket).
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let prefix_path = if prefix.is_empty() {
            None
        } else {
            Some(object_path(prefix.trim_end_matches('/'))?)
        };
        self.s3
            .list(prefix_path.as_ref())
            .map_ok(|meta| ObjectInfo {
                key: meta.location.to_string(),
                bytes: meta.size,
                last_modified: meta.last_modified,
            })
            .try_collect()
            .await
            .map_err(|e| Error::object("list", prefix, e))
    }

    /// Stores a manifest, validated and canonical, at `key`; its digest.
    pub async fn put_manifest(&self, key: &str, manifest: &Manifest) -> Result<String> {
        manifest.validate(&ManifestLimits::default())?;
        let json = manifest.canonical_json();
        let digest = manifest.digest();
        self.put(key, Bytes::from(json)).await?;
        Ok(digest)
    }

    /// The manifest at `key`, validated; `None` if there is none. The
    /// bucket is the tenant's to write: what it holds is checked like any
    /// input.
    pub async fn get_manifest(&self, key: &str) -> Result<Option<Manifest>> {
        let Some(json) = self.get_bounded(key, MAX_MANIFEST_BYTES).await? else {
            return Ok(None);
        };
        let manifest = Manifest::from_json(&json)?;
        manifest.validate(&ManifestLimits::default())?;
        Ok(Some(manifest))
    }

    /// The stored chunk's size, `None` if it is not there.
    pub async fn chunk_bytes(&self, hash: &str) -> Result<Option<u64>> {
        check_chunk_name(hash)?;
        self.head(&chunk_key(hash)).await
    }

    pub(crate) async fn put_chunk(&self, hash: &str, bytes: Bytes) -> Result<()> {
        check_chunk_name(hash)?;
        self.put(&chunk_key(hash), bytes).await
    }

    /// The chunk's bytes as they arrived, which must be `expected_bytes`
    /// long, and their hex SHA-256 (for the caller to check against the
    /// name before using them). Hashed frame by frame while the rest is
    /// still on its way, and never gathered into one buffer: a download
    /// writes the frames where they belong, with no copy of its own.
    pub(crate) async fn fetch_chunk(
        &self,
        hash: &str,
        expected_bytes: u64,
    ) -> Result<(Vec<Bytes>, String)> {
        check_chunk_name(hash)?;
        let key = chunk_key(hash);
        let result = match self.s3.get(&object_path(&key)?).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::Invalid(format!(
                    "chunk {hash} is missing from the store"
                )))
            }
            Err(e) => return Err(Error::object("get", &key, e)),
        };
        let wrong_size = |bytes: u64| Error::ChunkMismatch {
            chunk: hash.to_owned(),
            why: format!("{bytes} bytes, not {expected_bytes}"),
        };
        if result.meta.size != expected_bytes {
            return Err(wrong_size(result.meta.size));
        }
        let mut body = result.into_stream();
        let mut frames = Vec::new();
        let mut hasher = Sha256::new();
        let mut received = 0u64;
        while let Some(frame) = body
            .try_next()
            .await
            .map_err(|e| Error::object("get", &key, e))?
        {
            received += frame.len() as u64;
            if received > expected_bytes {
                return Err(wrong_size(received));
            }
            hasher.update(&frame);
            frames.push(frame);
        }
        if received != expected_bytes {
            return Err(wrong_size(received));
        }
        Ok((frames, hex::encode(hasher.finalize())))
    }
}

fn check_chunk_name(hash: &str) -> Result<()> {
    if is_chunk_name(hash) {
        Ok(())
    } else {
        Err(Error::Invalid(format!("{hash:?} is not a chunk's name")))
    }
}
