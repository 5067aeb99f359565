//! The tenants table: one statement per tenant or balance event. A new
//! tenant's first API key is written with it, through `keys.rs`.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

pub(super) async fn created(
    conn: &mut PgConnection,
    e: &lh_events::TenantCreated,
    seq: i64,
    at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO tenants (id, name_sealed, email_sealed, api_key_sha256, max_gpus, created_at, sequence,
                                      max_vram_gb, weight, max_storage_gb)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (id) DO NOTHING",
    )
    .bind(e.tenant_id)
    .bind(&e.name_sealed)
    .bind(&e.email_sealed)
    .bind(&e.api_key_sha256)
    .bind(e.quota.max_gpus as i32)
    .bind(at)
    .bind(seq)
    .bind(e.quota.max_vram_gb.map(|v| v as i32))
    .bind(e.weight as i32)
    .bind(e.quota.max_storage_gb.map(|v| v.min(i32::MAX as u32) as i32))
    .execute(&mut *conn)
    .await?;
    super::keys::insert_key(
        conn,
        e.tenant_id,
        lh_events::FIRST_API_KEY_ID,
        &e.api_key_prefix,
        &e.api_key_sha256,
        at,
        None,
        seq,
    )
    .await?;
    Ok(())
}

pub(super) async fn suspended(
    conn: &mut PgConnection,
    e: &lh_events::TenantSuspended,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE tenants SET suspended = TRUE, suspended_reason = NULL, suspended_reason_sealed = $2
                 WHERE id = $1",
    )
    .bind(e.tenant_id)
    .bind(&e.reason_sealed)
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) async fn balance_exhausted(
    conn: &mut PgConnection,
    e: &lh_events::BalanceExhausted,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE tenants SET balance_exhausted = TRUE WHERE id = $1")
        .bind(e.tenant_id)
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn balance_restored(
    conn: &mut PgConnection,
    e: &lh_events::BalanceRestored,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE tenants SET balance_exhausted = FALSE WHERE id = $1")
        .bind(e.tenant_id)
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn resumed(
    conn: &mut PgConnection,
    e: &lh_events::TenantResumed,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE tenants SET suspended = FALSE, suspended_reason = NULL, suspended_reason_sealed = NULL
                 WHERE id = $1",
    )
    .bind(e.tenant_id)
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) async fn erased(
    conn: &mut PgConnection,
    e: &lh_events::TenantErased,
) -> sqlx::Result<()> {
    // The row keeps the ciphertext (names, and a sealed suspension
    // reason): it is the log's, and without the key it is noise; a
    // rebuild writes the same.
    sqlx::query(
        "UPDATE tenants SET erased = TRUE, suspended = TRUE, suspended_reason = 'erased'
                 WHERE id = $1",
    )
    .bind(e.tenant_id)
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) async fn quota_changed(
    conn: &mut PgConnection,
    e: &lh_events::TenantQuotaChanged,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE tenants SET max_gpus = $2, max_vram_gb = $3, weight = $4, max_storage_gb = $5
         WHERE id = $1",
    )
    .bind(e.tenant_id)
    .bind(e.quota.max_gpus as i32)
    .bind(e.quota.max_vram_gb.map(|v| v as i32))
    .bind(e.weight as i32)
    .bind(
        e.quota
            .max_storage_gb
            .map(|v| v.min(i32::MAX as u32) as i32),
    )
    .execute(conn)
    .await?;
    Ok(())
}
