//! Crypto-shredding of personal data. Names and e-mail addresses are sealed
//! with a per-tenant key (ChaCha20-Poly1305) before they enter the log; the
//! keys live outside the log, in the `gateway_keys` schema, wrapped by a
//! master key that stays outside the database (`keyring`). Destroying a
//! tenant's key (`POST /v1/tenants/{id}/erase`) leaves only ciphertext in
//! the log while the audit chain still verifies.

use base64::{engine::general_purpose::STANDARD, Engine as _};
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use rand::RngCore;
use sqlx::PgPool;
use uuid::Uuid;

use crate::keyring::{KeyError, KeyProvider, WrappedKey};

pub const KEYS_SCHEMA: &str = "gateway_keys";
/// The table of sealed workload environments (`workload_env.rs`),
/// in [`KEYS_SCHEMA`]: like the keys, it is not a projection of the log, so
/// a rebuild never drops it.
pub const WORKLOAD_ENV_TABLE: &str = "workload_env";
/// The table of tenants' storage identities (`storage.rs`): each
/// tenant's bucket, access key id and sealed secret key.
pub const STORAGE_ACCESS_TABLE: &str = "storage_access";
/// Which lease holds each of a tenant's workspaces, claimed when the lease
/// is asked for: the read model shows a lease only once its request is
/// projected, and two asked for meanwhile would both pass a look at it.
pub const WORKSPACE_CLAIMS_TABLE: &str = "workspace_claims";
/// Tickets into a lease's web page (their hashes), each used once.
pub const LEASE_WEB_TICKETS_TABLE: &str = "lease_web_tickets";
/// Browsers let into a lease's web page (their cookies' hashes).
pub const LEASE_WEB_SESSIONS_TABLE: &str = "lease_web_sessions";

/// Why keeping a tenant's key, or sealing its data with it, failed. The
/// API answers each as it answers any failure of that kind; the texts name
/// what failed, for the log.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The master key could not wrap a tenant's data key.
    #[error("wrapping a tenant key: {0}")]
    Wrap(KeyError),
    /// The tenant's data key could not be read or made.
    #[error("loading a tenant key: {0}")]
    LoadKey(anyhow::Error),
    /// The tenant was erased: its key is gone and never comes back.
    #[error("tenant {0} is erased")]
    Erased(Uuid),
    /// An environment could not be written as JSON to be sealed.
    #[error("serialising an environment: {0}")]
    Serialise(serde_json::Error),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}
const NONCE_BYTES: usize = 12;

/// A fresh random 256-bit key.
pub fn new_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut key);
    key
}

/// Base64 of nonce ‖ ciphertext.
pub fn seal(key: &[u8; 32], plaintext: &str) -> String {
    let cipher = ChaCha20Poly1305::new(Key::from_slice(key));
    let mut nonce = [0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut nonce);
    let ct = cipher
        .encrypt(Nonce::from_slice(&nonce), plaintext.as_bytes())
        .expect("encryption of a short string cannot fail");
    let mut out = nonce.to_vec();
    out.extend(ct);
    STANDARD.encode(out)
}

/// The plaintext, or `None` when the key is gone or the text was tampered with.
pub fn open(key: &[u8; 32], sealed: &str) -> Option<String> {
    let bytes = STANDARD.decode(sealed).ok()?;
    if bytes.len() < NONCE_BYTES {
        return None;
    }
    let (nonce, ct) = bytes.split_at(NONCE_BYTES);
    let cipher = ChaCha20Poly1305::new(Key::from_slice(key));
    let pt = cipher.decrypt(Nonce::from_slice(nonce), ct).ok()?;
    String::from_utf8(pt).ok()
}

/// A key row: tenant, bare key (older tables), wrapped key, master key id.
type KeyRow = (Uuid, Option<Vec<u8>>, Option<Vec<u8>>, Option<String>);

/// Data keys rewrapped per transaction at start.
const REWRAP_BATCH_ROWS: i64 = 500;

/// Creates the key table, then wraps every data key that is still stored
/// bare (tables written before keys were wrapped) or wrapped by a master key
/// other than the current one (after a rotation), so that the database never
/// holds a usable key and an old master key can be retired.
pub async fn migrate_keys(pool: &PgPool, keys: &dyn KeyProvider) -> anyhow::Result<()> {
    // PostgreSQL checks the right to create before it looks whether the
    // schema exists: a role that owns the schema but may not create schemas
    // (deploy/postgres/roles.sql) must not ask.
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(KEYS_SCHEMA)
            .fetch_one(pool)
            .await?;
    if !exists {
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {KEYS_SCHEMA}"))
            .execute(pool)
            .await?;
    }
    for statement in [
        format!(
            "CREATE TABLE IF NOT EXISTS {KEYS_SCHEMA}.tenant_keys (
                tenant_id UUID PRIMARY KEY,
                key BYTEA
            )"
        ),
        format!("ALTER TABLE {KEYS_SCHEMA}.tenant_keys ALTER COLUMN key DROP NOT NULL"),
        format!("ALTER TABLE {KEYS_SCHEMA}.tenant_keys ADD COLUMN IF NOT EXISTS wrapped BYTEA"),
        format!(
            "ALTER TABLE {KEYS_SCHEMA}.tenant_keys ADD COLUMN IF NOT EXISTS master_key_id TEXT"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {KEYS_SCHEMA}.{} (
                lease_id UUID PRIMARY KEY,
                tenant_id UUID NOT NULL,
                sealed TEXT NOT NULL,
                stored_at TIMESTAMPTZ NOT NULL DEFAULT now()
            )",
            WORKLOAD_ENV_TABLE
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS workload_env_by_tenant ON {KEYS_SCHEMA}.{} (tenant_id)",
            WORKLOAD_ENV_TABLE
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {KEYS_SCHEMA}.{STORAGE_ACCESS_TABLE} (
                tenant_id UUID PRIMARY KEY,
                bucket TEXT NOT NULL,
                access_key_id TEXT NOT NULL,
                sealed_secret TEXT NOT NULL,
                stored_at TIMESTAMPTZ NOT NULL DEFAULT now()
            )"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {KEYS_SCHEMA}.{WORKSPACE_CLAIMS_TABLE} (
                tenant_id UUID NOT NULL,
                workspace TEXT NOT NULL,
                lease_id UUID NOT NULL,
                claimed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                PRIMARY KEY (tenant_id, workspace)
            )"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {KEYS_SCHEMA}.{LEASE_WEB_TICKETS_TABLE} (
                sha256 BYTEA PRIMARY KEY,
                tenant_id UUID NOT NULL,
                lease_id UUID NOT NULL,
                port INT NOT NULL,
                key_id INT NOT NULL,
                next_path TEXT NOT NULL,
                expires_at TIMESTAMPTZ NOT NULL
            )"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {KEYS_SCHEMA}.{LEASE_WEB_SESSIONS_TABLE} (
                sha256 BYTEA PRIMARY KEY,
                tenant_id UUID NOT NULL,
                lease_id UUID NOT NULL,
                port INT NOT NULL,
                key_id INT NOT NULL,
                expires_at TIMESTAMPTZ NOT NULL
            )"
        ),
        // A tenant's person signed in with the OIDC issuer has no key: its
        // tickets and cookies name none, and end with its token.
        format!("ALTER TABLE {KEYS_SCHEMA}.{LEASE_WEB_TICKETS_TABLE} ALTER COLUMN key_id DROP NOT NULL"),
        format!("ALTER TABLE {KEYS_SCHEMA}.{LEASE_WEB_SESSIONS_TABLE} ALTER COLUMN key_id DROP NOT NULL"),
        format!(
            "ALTER TABLE {KEYS_SCHEMA}.{LEASE_WEB_TICKETS_TABLE}
                 ADD COLUMN IF NOT EXISTS credential_expires_at TIMESTAMPTZ"
        ),
    ] {
        sqlx::query(&statement).execute(pool).await?;
    }
    let current = keys.current_key_id().to_string();
    let mut rewrapped = 0u64;
    loop {
        let mut tx = pool.begin().await?;
        let rows: Vec<KeyRow> = sqlx::query_as(&format!(
            "SELECT tenant_id, key, wrapped, master_key_id FROM {KEYS_SCHEMA}.tenant_keys
                 WHERE key IS NOT NULL OR master_key_id IS DISTINCT FROM $1
                 ORDER BY tenant_id LIMIT $2 FOR UPDATE"
        ))
        .bind(&current)
        .bind(REWRAP_BATCH_ROWS)
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            break;
        }
        for (tenant_id, bare, wrapped, master_key_id) in rows {
            let data_key: [u8; 32] = match (bare, wrapped, master_key_id) {
                (Some(bare), _, _) => bare.try_into().map_err(|_| {
                    anyhow::anyhow!("tenant {tenant_id}: stored data key is not 32 bytes")
                })?,
                (None, Some(ciphertext), Some(master_key_id)) => keys.unwrap(
                    tenant_id,
                    &WrappedKey {
                        master_key_id,
                        ciphertext,
                    },
                )?,
                _ => anyhow::bail!("tenant {tenant_id}: data key row has neither key nor wrap"),
            };
            let wrapped = keys.wrap(tenant_id, &data_key)?;
            sqlx::query(&format!(
                "UPDATE {KEYS_SCHEMA}.tenant_keys SET key = NULL, wrapped = $2, master_key_id = $3
                 WHERE tenant_id = $1"
            ))
            .bind(tenant_id)
            .bind(&wrapped.ciphertext)
            .bind(&wrapped.master_key_id)
            .execute(&mut *tx)
            .await?;
            rewrapped += 1;
        }
        tx.commit().await?;
    }
    if rewrapped > 0 {
        tracing::info!(rewrapped, master_key = %current, "tenant data keys wrapped with the current master key");
    }
    Ok(())
}

pub async fn store_key(
    pool: &PgPool,
    keys: &dyn KeyProvider,
    tenant_id: Uuid,
    key: &[u8; 32],
) -> Result<(), SealError> {
    let wrapped = keys.wrap(tenant_id, key).map_err(SealError::Wrap)?;
    sqlx::query(&format!(
        "INSERT INTO {KEYS_SCHEMA}.tenant_keys (tenant_id, wrapped, master_key_id) VALUES ($1, $2, $3)"
    ))
    .bind(tenant_id)
    .bind(&wrapped.ciphertext)
    .bind(&wrapped.master_key_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// Deletes the tenant's wrapped data key: from then on nothing this
/// database holds opens the tenant's sealed fields. Deleting a row that is
/// gone already is no error.
pub async fn destroy_key(pool: &PgPool, tenant_id: Uuid) -> Result<(), SealError> {
    let mut tx = pool.begin().await?;
    sqlx::query(&format!(
        "DELETE FROM {KEYS_SCHEMA}.tenant_keys WHERE tenant_id = $1"
    ))
    .bind(tenant_id)
    .execute(&mut *tx)
    .await?;
    // Unreadable without the key already; gone with it all the same.
    sqlx::query(&format!(
        "DELETE FROM {KEYS_SCHEMA}.{} WHERE tenant_id = $1",
        WORKLOAD_ENV_TABLE
    ))
    .bind(tenant_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(&format!(
        "DELETE FROM {KEYS_SCHEMA}.{STORAGE_ACCESS_TABLE} WHERE tenant_id = $1"
    ))
    .bind(tenant_id)
    .execute(&mut *tx)
    .await?;
    // Workspace names are the tenant's, and so are its ways into its
    // leases' web pages.
    for table in [
        WORKSPACE_CLAIMS_TABLE,
        LEASE_WEB_TICKETS_TABLE,
        LEASE_WEB_SESSIONS_TABLE,
    ] {
        sqlx::query(&format!(
            "DELETE FROM {KEYS_SCHEMA}.{table} WHERE tenant_id = $1"
        ))
        .bind(tenant_id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The tenant's data key, or `None` when it is gone (erased).
pub async fn load_key(
    pool: &PgPool,
    keys: &dyn KeyProvider,
    tenant_id: Uuid,
) -> anyhow::Result<Option<[u8; 32]>> {
    let row: Option<(Option<Vec<u8>>, Option<String>)> = sqlx::query_as(&format!(
        "SELECT wrapped, master_key_id FROM {KEYS_SCHEMA}.tenant_keys WHERE tenant_id = $1"
    ))
    .bind(tenant_id)
    .fetch_optional(pool)
    .await?;
    match row {
        Some((Some(ciphertext), Some(master_key_id))) => Ok(Some(keys.unwrap(
            tenant_id,
            &WrappedKey {
                master_key_id,
                ciphertext,
            },
        )?)),
        _ => Ok(None),
    }
}

/// The tenant's data key, to seal a new field with. Every tenant gets one
/// at its creation, but the key table is not rebuilt from the log: after a
/// restore of an older database (or for a tenant created before data keys
/// existed) it may have none. It then gets a new one, which cannot open its
/// older sealed fields but covers new ones. `None` for an erased tenant,
/// which never gets a key again.
pub async fn ensure_key(
    pool: &PgPool,
    keys: &dyn KeyProvider,
    tenant_id: Uuid,
) -> anyhow::Result<Option<[u8; 32]>> {
    if let Some(key) = load_key(pool, keys, tenant_id).await? {
        return Ok(Some(key));
    }
    let erased: Option<bool> = sqlx::query_scalar("SELECT erased FROM tenants WHERE id = $1")
        .bind(tenant_id)
        .fetch_optional(pool)
        .await?;
    if erased != Some(false) {
        return Ok(None);
    }
    let wrapped = keys.wrap(tenant_id, &new_key())?;
    // Two requests may race to make it: the first one's key is the key.
    sqlx::query(&format!(
        "INSERT INTO {KEYS_SCHEMA}.tenant_keys (tenant_id, wrapped, master_key_id)
         VALUES ($1, $2, $3) ON CONFLICT (tenant_id) DO NOTHING"
    ))
    .bind(tenant_id)
    .bind(&wrapped.ciphertext)
    .bind(&wrapped.master_key_id)
    .execute(pool)
    .await?;
    tracing::warn!(tenant = %tenant_id, "the tenant had no data key; a new one seals its new fields");
    load_key(pool, keys, tenant_id).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_round_trips_and_another_key_cannot_open() {
        let k = new_key();
        let s = seal(&k, "ops@acme.example");
        assert!(!s.contains("acme"));
        assert_eq!(open(&k, &s).as_deref(), Some("ops@acme.example"));
        assert_eq!(open(&new_key(), &s), None);
    }
}
