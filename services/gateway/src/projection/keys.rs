//! The tenant_keys table: a tenant's API keys, by the hash a request is
//! authenticated with.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

pub(super) async fn issued(
    conn: &mut PgConnection,
    e: &lh_events::TenantApiKeyIssued,
    seq: i64,
    at: DateTime<Utc>,
) -> sqlx::Result<()> {
    super::keys::insert_key(
        conn,
        e.tenant_id,
        e.key_id,
        &e.prefix,
        &e.sha256,
        at,
        e.expires_at,
        seq,
    )
    .await?;
    Ok(())
}

pub(super) async fn revoked(
    conn: &mut PgConnection,
    e: &lh_events::TenantApiKeyRevoked,
    seq: i64,
    at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE tenant_keys SET revoked_at = COALESCE(revoked_at, $3), sequence = $4
                 WHERE tenant_id = $1 AND key_id = $2",
    )
    .bind(e.tenant_id)
    .bind(e.key_id as i32)
    .bind(at)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}

/// A key whose hash some other key has already is not taken: the first
/// holder keeps it, so no event can take over another tenant's key.
#[allow(clippy::too_many_arguments)]
pub(super) async fn insert_key(
    conn: &mut PgConnection,
    tenant_id: Uuid,
    key_id: u32,
    prefix: &str,
    sha256: &str,
    at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    seq: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO tenant_keys (tenant_id, key_id, prefix, sha256, created_at, expires_at, sequence)
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
    )
    .bind(tenant_id)
    .bind(key_id as i32)
    .bind(prefix)
    .bind(sha256)
    .bind(at)
    .bind(expires_at)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}
