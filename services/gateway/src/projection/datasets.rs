//! The datasets table: tenants' dataset versions, each added and removed
//! by an event of its dataset's aggregate.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// A version is taken once; an erased tenant gets none (its erasure may
/// have been stored while this version was being added), and neither does
/// a dataset whose id is not its tenant's and name's.
pub(super) async fn version_added(
    conn: &mut PgConnection,
    e: &lh_events::DatasetVersionAdded,
    seq: i64,
    at: DateTime<Utc>,
) -> sqlx::Result<()> {
    if lh_events::dataset_id(e.tenant_id, &e.name) != e.dataset_id {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO datasets (dataset_id, tenant_id, name, version, bytes, files, created_at, sequence)
         SELECT $1, $2, $3, $4, $5, $6, $7, $8
         WHERE NOT EXISTS (SELECT 1 FROM tenants WHERE id = $2 AND erased)
         ON CONFLICT DO NOTHING",
    )
    .bind(e.dataset_id)
    .bind(e.tenant_id)
    .bind(&e.name)
    .bind(&e.version)
    .bind(i64::try_from(e.bytes).unwrap_or(i64::MAX))
    .bind(i64::try_from(e.files).unwrap_or(i64::MAX))
    .bind(at)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}

/// Only the tenant's own dataset goes: a removal naming another tenant
/// moves nothing.
pub(super) async fn removed(
    conn: &mut PgConnection,
    e: &lh_events::DatasetRemoved,
) -> sqlx::Result<()> {
    sqlx::query(
        "DELETE FROM datasets WHERE dataset_id = $1 AND tenant_id = $2
         AND ($3::TEXT IS NULL OR version = $3)",
    )
    .bind(e.dataset_id)
    .bind(e.tenant_id)
    .bind(e.version.as_deref())
    .execute(conn)
    .await?;
    Ok(())
}

/// An erased tenant has no datasets.
pub(super) async fn tenant_erased(
    conn: &mut PgConnection,
    e: &lh_events::TenantErased,
) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM datasets WHERE tenant_id = $1")
        .bind(e.tenant_id)
        .execute(conn)
        .await?;
    Ok(())
}
