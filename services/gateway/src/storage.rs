//! Tenants' object storage (docs/adr/031): each tenant's bucket and the
//! identity of its own that may use that bucket alone, made on first use
//! with the store's admin identity, which only the gateway holds. The
//! identity's secret is sealed with the tenant's data key, as a workload's
//! environment is: destroying the key at erasure destroys it too, and the
//! erasure deletes the bucket and the identity on the store.

pub mod measure;

use std::path::PathBuf;

use anyhow::Context as _;
use chrono::Utc;
use lh_bus::{Bus, BusError, Expect};
use lh_events::{derived_id, Actor, Envelope, EventData, StorageErased, StorageProvisioned};
use lh_storage::{Admin, Credentials, StoreConfig, TenantStore};
use sqlx::PgPool;
use uuid::Uuid;

use crate::keyring::KeyProvider;
use crate::seal::{self, KEYS_SCHEMA, STORAGE_ACCESS_TABLE};

/// By default a pass a day, at midnight UTC.
pub const DEFAULT_SNAPSHOT_INTERVAL_SECS: u64 = 24 * 3600;
/// By default a snapshot is kept for a week after its day.
pub const DEFAULT_SNAPSHOT_KEEP_DAYS: u64 = 7;
/// By default an object nothing names is collected once a day old: longer
/// than `lh_storage::workspace::CHUNK_REUSE_FRESH` (an hour) plus the
/// longest sync, as a collection must wait.
pub const DEFAULT_COLLECT_GRACE_SECS: u64 = 24 * 3600;

/// What a pass keeps, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct Keeping {
    pub interval_secs: u64,
    pub keep_days: u64,
    pub grace: std::time::Duration,
}

/// Where tenants' data is kept; off unless the endpoint is set.
#[derive(clap::Args, Debug, Clone)]
pub struct StorageArgs {
    /// The S3 endpoint that holds tenants' datasets and workspaces, as the
    /// gateway reaches it (`http://127.0.0.1:8333`). Without it, datasets
    /// and workspaces are off (503).
    #[arg(long, env = "LH_STORAGE_ENDPOINT")]
    pub storage_endpoint: Option<String>,
    /// The same endpoint as tenants and nodes reach it, where that differs
    /// (a compose service name, a public host).
    #[arg(long, env = "LH_STORAGE_PUBLIC_ENDPOINT")]
    pub storage_public_endpoint: Option<String>,
    /// The region requests are signed for.
    #[arg(long, env = "LH_STORAGE_REGION", default_value = lh_storage::DEFAULT_REGION)]
    pub storage_region: String,
    /// The access key id of the store's admin identity, which makes
    /// buckets and identities.
    #[arg(long, env = "LH_STORAGE_ADMIN_ACCESS_KEY_ID")]
    pub storage_admin_access_key_id: Option<String>,
    /// File holding the admin identity's secret key (mode 0600).
    #[arg(long, env = "LH_STORAGE_ADMIN_SECRET_KEY_FILE")]
    pub storage_admin_secret_key_file: Option<PathBuf>,
    /// Allow plain HTTP to an endpoint that is not on loopback. Keys and
    /// data then cross the network in clear: only for a network nobody
    /// else reaches.
    #[arg(long, env = "LH_STORAGE_ALLOW_HTTP", default_value_t = false)]
    pub storage_allow_http: bool,
    /// How often each tenant's bucket is measured (`storage.measured`):
    /// what pricing charges storage by and the storage quota counts.
    #[arg(long, env = "LH_STORAGE_MEASURE_INTERVAL_SECS",
          default_value_t = measure::DEFAULT_MEASURE_INTERVAL_SECS,
          value_parser = clap::value_parser!(u64).range(1..=MAX_MEASURE_INTERVAL_SECS))]
    pub storage_measure_interval_secs: u64,
    /// How often every workspace's head is copied to the day's snapshot
    /// and what nothing names any more is collected; passes start at
    /// multiples of it from the Unix epoch (midnight UTC for a day).
    #[arg(long, env = "LH_WORKSPACE_SNAPSHOT_INTERVAL_SECS",
          default_value_t = DEFAULT_SNAPSHOT_INTERVAL_SECS,
          value_parser = clap::value_parser!(u64).range(1..=7 * 86_400))]
    pub workspace_snapshot_interval_secs: u64,
    /// Days a workspace's snapshot is kept after its day.
    #[arg(long, env = "LH_WORKSPACE_SNAPSHOT_KEEP_DAYS",
          default_value_t = DEFAULT_SNAPSHOT_KEEP_DAYS,
          value_parser = clap::value_parser!(u64).range(1..=3_650))]
    pub workspace_snapshot_keep_days: u64,
    /// Seconds a manifest no longer current, or a chunk nothing names,
    /// stays before it is collected: longer than an hour plus the longest
    /// workspace sync (a sync takes as they are only chunks stored within
    /// the hour or named by its workspace's head).
    #[arg(long, env = "LH_WORKSPACE_COLLECT_GRACE_SECS",
          default_value_t = DEFAULT_COLLECT_GRACE_SECS)]
    pub workspace_collect_grace_secs: u64,
}

/// Longest measuring interval accepted: a day, so that the quota's count
/// and the charges are never more than a day behind.
pub const MAX_MEASURE_INTERVAL_SECS: u64 = 24 * 3600;

impl Default for StorageArgs {
    fn default() -> Self {
        StorageArgs {
            storage_endpoint: None,
            storage_public_endpoint: None,
            storage_region: lh_storage::DEFAULT_REGION.to_string(),
            storage_admin_access_key_id: None,
            storage_admin_secret_key_file: None,
            storage_allow_http: false,
            storage_measure_interval_secs: measure::DEFAULT_MEASURE_INTERVAL_SECS,
            workspace_snapshot_interval_secs: DEFAULT_SNAPSHOT_INTERVAL_SECS,
            workspace_snapshot_keep_days: DEFAULT_SNAPSHOT_KEEP_DAYS,
            workspace_collect_grace_secs: DEFAULT_COLLECT_GRACE_SECS,
        }
    }
}

impl StorageArgs {
    /// What the workspaces' passes keep, and for how long.
    pub fn keeping(&self) -> Keeping {
        Keeping {
            interval_secs: self.workspace_snapshot_interval_secs,
            keep_days: self.workspace_snapshot_keep_days,
            grace: std::time::Duration::from_secs(self.workspace_collect_grace_secs),
        }
    }

    /// The storage this gateway keeps tenants' data on; `None` when off.
    pub fn open(&self) -> anyhow::Result<Option<TenantStorage>> {
        let Some(endpoint) = &self.storage_endpoint else {
            anyhow::ensure!(
                self.storage_admin_access_key_id.is_none()
                    && self.storage_admin_secret_key_file.is_none(),
                "storage admin keys are set but LH_STORAGE_ENDPOINT is not"
            );
            return Ok(None);
        };
        let (Some(key_id), Some(secret_file)) = (
            &self.storage_admin_access_key_id,
            &self.storage_admin_secret_key_file,
        ) else {
            anyhow::bail!(
                "LH_STORAGE_ENDPOINT needs LH_STORAGE_ADMIN_ACCESS_KEY_ID and \
                 LH_STORAGE_ADMIN_SECRET_KEY_FILE"
            );
        };
        let secret =
            crate::principals::read_token_file("the storage admin secret key", secret_file)?;
        let config = |endpoint: &str| StoreConfig {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            region: self.storage_region.clone(),
            allow_http: self.storage_allow_http,
        };
        let internal = config(endpoint);
        let public = config(
            self.storage_public_endpoint
                .as_deref()
                .unwrap_or(endpoint.as_str()),
        );
        let admin = Admin::new(
            &internal,
            Credentials {
                access_key_id: key_id.clone(),
                secret_access_key: secret,
            },
        )
        .context("LH_STORAGE_ENDPOINT")?;
        Ok(Some(TenantStorage {
            admin,
            internal,
            public,
        }))
    }
}

/// A tenant's bucket and the identity that may use it.
#[derive(Clone)]
pub struct TenantAccess {
    pub bucket: String,
    pub credentials: Credentials,
}

/// What went wrong making or reaching a tenant's storage.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("the tenant is erased")]
    Erased,
    #[error("the object store: {0}")]
    Store(#[from] lh_storage::Error),
    #[error("the database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("the log: {0}")]
    Bus(#[from] BusError),
    #[error("{0:#}")]
    Other(#[from] anyhow::Error),
}

pub struct TenantStorage {
    admin: Admin,
    /// The endpoint as this gateway reaches it.
    internal: StoreConfig,
    /// The endpoint as tenants and nodes reach it.
    public: StoreConfig,
}

/// The bucket of tenant `tenant_id`: 37 characters, within S3's 63.
pub fn bucket_of(tenant_id: Uuid) -> String {
    format!("lh-t-{}", tenant_id.simple())
}

/// The name of the tenant's identity on the store.
fn user_of(tenant_id: Uuid) -> String {
    format!("lh-t-{}", tenant_id.simple())
}

impl TenantStorage {
    /// The endpoint as tenants and nodes reach it.
    pub fn public(&self) -> &StoreConfig {
        &self.public
    }

    /// Bytes in `bucket` now, listed with the admin identity.
    pub async fn bucket_bytes(&self, bucket: &str) -> Result<u64, lh_storage::Error> {
        self.admin.bucket_bytes(bucket).await
    }

    /// Lets the tenant's identity write to its bucket, or only read, list
    /// and delete (over its quota).
    pub async fn set_writes(
        &self,
        tenant_id: Uuid,
        bucket: &str,
        writes: bool,
    ) -> Result<(), lh_storage::Error> {
        self.admin
            .set_tenant_writes(&user_of(tenant_id), bucket, writes)
            .await
    }

    /// The tenant's bucket through this gateway's own endpoint, with the
    /// tenant's identity: what the gateway checks a tenant's uploads with
    /// can reach nothing the tenant could not.
    pub fn tenant_store(&self, access: &TenantAccess) -> Result<TenantStore, StorageError> {
        Ok(TenantStore::new(
            &self.internal,
            &access.bucket,
            &access.credentials,
        )?)
    }

    /// The tenant's bucket and identity, made on first use. Gateways
    /// deciding at once take turns on a lock of the tenant's: a second
    /// identity would hold a key the database never keeps.
    pub async fn ensure(
        &self,
        pool: &PgPool,
        keys: &dyn KeyProvider,
        bus: &Bus,
        tenant_id: Uuid,
    ) -> Result<TenantAccess, StorageError> {
        let key = seal::ensure_key(pool, keys, tenant_id)
            .await?
            .ok_or(StorageError::Erased)?;
        if let Some(access) = load(pool, &key, tenant_id).await? {
            return Ok(access);
        }
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("lh-storage:{tenant_id}"))
            .execute(&mut *tx)
            .await?;
        if let Some(access) = load(&mut *tx, &key, tenant_id).await? {
            return Ok(access);
        }
        let bucket = bucket_of(tenant_id);
        self.admin.ensure_bucket(&bucket).await?;
        let credentials = self
            .admin
            .ensure_tenant_identity(&user_of(tenant_id), &bucket)
            .await?;
        sqlx::query(&format!(
            "INSERT INTO {KEYS_SCHEMA}.{STORAGE_ACCESS_TABLE}
                 (tenant_id, bucket, access_key_id, sealed_secret) VALUES ($1, $2, $3, $4)"
        ))
        .bind(tenant_id)
        .bind(&bucket)
        .bind(&credentials.access_key_id)
        .bind(seal::seal(&key, &credentials.secret_access_key))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        let envelope = Envelope::new(
            Actor::Service("gateway".into()),
            Utc::now(),
            EventData::StorageProvisioned(StorageProvisioned {
                tenant_id,
                bucket: bucket.clone(),
                access_key_id: credentials.access_key_id.clone(),
            }),
        )
        .with_id(derived_id(&[
            "storage.provisioned",
            &tenant_id.to_string(),
            &credentials.access_key_id,
        ]));
        bus.publish(&envelope, Expect::Any).await?;
        metrics::counter!("lh_gateway_storage_provisioned_total").increment(1);
        tracing::info!(tenant = %tenant_id, %bucket, "tenant storage made");
        Ok(TenantAccess {
            bucket,
            credentials,
        })
    }

    /// The tenant's bucket and identity as they are now, without making
    /// them: `None` before the tenant's first use of storage.
    pub async fn existing(
        &self,
        pool: &PgPool,
        keys: &dyn KeyProvider,
        tenant_id: Uuid,
    ) -> Result<Option<TenantAccess>, StorageError> {
        let key = seal::load_key(pool, keys, tenant_id)
            .await?
            .ok_or(StorageError::Erased)?;
        load(pool, &key, tenant_id).await
    }

    /// Deletes everything of the tenant's on the store: its identity first,
    /// so that nothing is written while the bucket empties, then every
    /// object and the bucket, and records it. Safe to run again.
    pub async fn erase(
        &self,
        bus: &Bus,
        actor: Actor,
        tenant_id: Uuid,
    ) -> Result<u64, StorageError> {
        let bucket = bucket_of(tenant_id);
        self.admin.revoke_identity(&user_of(tenant_id)).await?;
        let objects_deleted = self.admin.empty_and_delete_bucket(&bucket).await?;
        let envelope = Envelope::new(
            actor,
            Utc::now(),
            EventData::StorageErased(StorageErased {
                tenant_id,
                bucket,
                objects_deleted,
            }),
        )
        .with_id(derived_id(&["storage.erased", &tenant_id.to_string()]));
        match bus.publish(&envelope, Expect::Any).await {
            Ok(_) | Err(BusError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(tenant = %tenant_id, objects_deleted, "tenant storage erased");
        Ok(objects_deleted)
    }
}

async fn load<'e>(
    db: impl sqlx::PgExecutor<'e>,
    key: &[u8; 32],
    tenant_id: Uuid,
) -> Result<Option<TenantAccess>, StorageError> {
    let row: Option<(String, String, String)> = sqlx::query_as(&format!(
        "SELECT bucket, access_key_id, sealed_secret FROM {KEYS_SCHEMA}.{STORAGE_ACCESS_TABLE}
         WHERE tenant_id = $1"
    ))
    .bind(tenant_id)
    .fetch_optional(db)
    .await?;
    let Some((bucket, access_key_id, sealed)) = row else {
        return Ok(None);
    };
    let secret_access_key = seal::open(key, &sealed).ok_or_else(|| {
        anyhow::anyhow!("tenant {tenant_id}: the stored storage secret does not open")
    })?;
    Ok(Some(TenantAccess {
        bucket,
        credentials: Credentials {
            access_key_id,
            secret_access_key,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_name_is_valid_for_s3() {
        let bucket = bucket_of(Uuid::new_v4());
        assert!(bucket.len() <= 63);
        assert!(bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
    }

    #[test]
    fn storage_is_off_without_an_endpoint_and_refuses_half_a_setup() {
        assert!(StorageArgs::default().open().unwrap().is_none());
        let half = StorageArgs {
            storage_endpoint: Some("http://127.0.0.1:8333".into()),
            ..Default::default()
        };
        let e = half.open().err().unwrap().to_string();
        assert!(e.contains("LH_STORAGE_ADMIN_ACCESS_KEY_ID"), "{e}");
        let keys_only = StorageArgs {
            storage_admin_access_key_id: Some("AK".into()),
            ..Default::default()
        };
        assert!(keys_only.open().is_err());
    }
}
