//! The ssh_keys table: tenants' SSH public keys, each added and removed by
//! an event of its own aggregate.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// A key whose id or fingerprint its tenant has already is not taken again,
/// and an erased tenant gets none: its erasure may have been stored while
/// this addition was being decided.
pub(super) async fn added(
    conn: &mut PgConnection,
    e: &lh_events::SshKeyAdded,
    seq: i64,
    at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO ssh_keys (key_id, tenant_id, name, public_key, fingerprint, created_at, sequence)
         SELECT $1, $2, $3, $4, $5, $6, $7
         WHERE NOT EXISTS (SELECT 1 FROM tenants WHERE id = $2 AND erased)
         ON CONFLICT DO NOTHING",
    )
    .bind(e.key_id)
    .bind(e.tenant_id)
    .bind(&e.name)
    .bind(&e.public_key)
    .bind(&e.fingerprint)
    .bind(at)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}

/// Only the tenant's own key goes: a removal naming another tenant moves
/// nothing.
pub(super) async fn removed(
    conn: &mut PgConnection,
    e: &lh_events::SshKeyRemoved,
) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM ssh_keys WHERE key_id = $1 AND tenant_id = $2")
        .bind(e.key_id)
        .bind(e.tenant_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// An erased tenant lets nobody in by its keys.
pub(super) async fn tenant_erased(
    conn: &mut PgConnection,
    e: &lh_events::TenantErased,
) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM ssh_keys WHERE tenant_id = $1")
        .bind(e.tenant_id)
        .execute(conn)
        .await?;
    Ok(())
}
