//! The storage_usage table: each tenant's bucket and its newest
//! measurement, from its storage aggregate's events.

use sqlx::PgConnection;

pub(super) async fn provisioned(
    conn: &mut PgConnection,
    e: &lh_events::StorageProvisioned,
    seq: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO storage_usage (tenant_id, bucket, sequence) VALUES ($1, $2, $3)
         ON CONFLICT (tenant_id) DO NOTHING",
    )
    .bind(e.tenant_id)
    .bind(&e.bucket)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}

/// The newest measurement wins, whichever replica's came last; an erased
/// bucket takes none.
pub(super) async fn measured(
    conn: &mut PgConnection,
    e: &lh_events::StorageMeasured,
    seq: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO storage_usage (tenant_id, bucket, bytes, measured_at, writes_stopped, sequence)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (tenant_id) DO UPDATE
             SET bytes = EXCLUDED.bytes, measured_at = EXCLUDED.measured_at,
                 writes_stopped = EXCLUDED.writes_stopped, sequence = EXCLUDED.sequence
             WHERE NOT storage_usage.erased
               AND (storage_usage.measured_at IS NULL
                    OR storage_usage.measured_at < EXCLUDED.measured_at)",
    )
    .bind(e.tenant_id)
    .bind(&e.bucket)
    .bind(i64::try_from(e.bytes).unwrap_or(i64::MAX))
    .bind(e.measured_at)
    .bind(e.writes_stopped)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}

/// An erased bucket holds nothing and is measured no more.
pub(super) async fn erased(
    conn: &mut PgConnection,
    e: &lh_events::StorageErased,
    seq: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO storage_usage (tenant_id, bucket, erased, bytes, sequence)
         VALUES ($1, $2, true, 0, $3)
         ON CONFLICT (tenant_id) DO UPDATE SET erased = true, bytes = 0, sequence = EXCLUDED.sequence",
    )
    .bind(e.tenant_id)
    .bind(&e.bucket)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}
