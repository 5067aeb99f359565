//! The database side every projection shares: a pool fenced into its
//! service's schema, the runner's own tables (offsets, skipped messages)
//! and the rule for which errors are an outage rather than a mistake.

use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgPool};

use crate::{ProjectionError, Projector, Result, MAX_POOL_CONNECTIONS, POOL_ACQUIRE_TIMEOUT};

/// First wait after the database failed to answer or to write; doubles up to
/// [`RETRY_MAX`].
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(200);
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(5);

pub(crate) fn check_schema_name(schema: &str) -> Result<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !schema.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(ProjectionError::SchemaName(schema.to_string()))
    }
}

/// A pool whose connections all work inside `schema` (created when missing).
pub async fn connect_schema(database_url: &str, schema: &str) -> Result<PgPool> {
    check_schema_name(schema)?;
    let base: PgConnectOptions = database_url.parse()?;
    {
        // A service may start before its database answers (they start
        // together, or the database restarts): wait for it.
        let mut wait = RETRY_MIN;
        let admin = loop {
            match PgPoolOptions::new()
                .max_connections(1)
                .connect_with(base.clone())
                .await
            {
                Ok(admin) => break admin,
                Err(e) if is_unavailable(&e) => {
                    tracing::warn!(schema, error = %e, retry_in_ms = wait.as_millis() as u64,
                        "the database does not answer yet");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
                Err(e) => return Err(e.into()),
            }
        };
        // Two services starting at once may race on CREATE SCHEMA.
        let _ = sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .execute(&admin)
            .await;
        admin.close().await;
    }
    let options = base.options([("search_path", schema)]);
    Ok(PgPoolOptions::new()
        .max_connections(MAX_POOL_CONNECTIONS)
        .acquire_timeout(POOL_ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await?)
}

/// Runs the service's migrations and the runner's own offset table.
pub async fn migrate(pool: &PgPool, migrator: &Migrator) -> Result<()> {
    let mut conn = pool.acquire().await?;
    if let Err(e) = migrator.run(&mut *conn).await {
        let schema: Option<String> = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(&mut *conn)
            .await
            .ok();
        // sqlx keeps its advisory lock when it refuses a history: back in
        // the pool, this connection would hold every later migration of
        // the database waiting. Closed, it lets the lock go.
        let _ = conn.detach().close().await;
        return Err(match e {
            MigrateError::VersionMissing(_) | MigrateError::VersionMismatch(_) => {
                ProjectionError::ForeignMigrations {
                    schema: schema.unwrap_or_default(),
                    detail: e.to_string(),
                }
            }
            e => e.into(),
        });
    }
    drop(conn);
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS projection_offsets (
            name TEXT PRIMARY KEY,
            sequence BIGINT NOT NULL
        )",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS skipped_events (
            projection TEXT NOT NULL,
            sequence BIGINT NOT NULL,
            subject TEXT NOT NULL,
            reason TEXT NOT NULL,
            stored_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (projection, sequence)
        )",
    )
    .execute(pool)
    .await?;
    // What the authority rule knows of each lease that has not ended, as
    // of the projection's offset (`commit::apply_events_recording_skips`).
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS lease_holds (
            projection TEXT NOT NULL,
            lease_id UUID NOT NULL,
            tenant_id UUID,
            node_id TEXT,
            started_at TIMESTAMPTZ,
            previous_node TEXT,
            PRIMARY KEY (projection, lease_id)
        )",
    )
    .execute(pool)
    .await?;
    sqlx::query("ALTER TABLE lease_holds ADD COLUMN IF NOT EXISTS previous_node TEXT")
        .execute(pool)
        .await?;
    // A gang's other members, a JSON array of node ids.
    sqlx::query("ALTER TABLE lease_holds ADD COLUMN IF NOT EXISTS members JSONB")
        .execute(pool)
        .await?;
    // The other members of the gang it last left, likewise.
    sqlx::query("ALTER TABLE lease_holds ADD COLUMN IF NOT EXISTS previous_members JSONB")
        .execute(pool)
        .await?;
    // Each node's newest enrollment, as of the projection's offset.
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS node_enrollments (
            projection TEXT NOT NULL,
            node_id TEXT NOT NULL,
            enrollment JSONB NOT NULL,
            PRIMARY KEY (projection, node_id)
        )",
    )
    .execute(pool)
    .await?;
    // An offset row from before the holds were kept: its projection's
    // leases have none, and every node's report on them would be refused.
    sqlx::query(
        "ALTER TABLE projection_offsets
         ADD COLUMN IF NOT EXISTS holds_kept BOOLEAN NOT NULL DEFAULT false",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Whether a database error means PostgreSQL is out of reach for now
/// (down, restarting, refusing connections, out of connections), not that
/// the statement is wrong: what a caller should retry, or answer with 503.
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // SQLSTATE classes 08 (connection exception), 53 (insufficient
        // resources) and 57P (the server is shutting down or starting).
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("53") || c.starts_with("57P")),
        _ => false,
    }
}

/// Makes sure the projection's offset row exists, so that every runner's
/// `FOR UPDATE` on it locks something: two runners starting at once on an
/// empty schema then take turns instead of both applying the first events.
pub(crate) async fn ensure_offset_row(pool: &PgPool, name: &str) -> Result<()> {
    sqlx::query(
        "INSERT INTO projection_offsets (name, sequence, holds_kept) VALUES ($1, 0, true)
         ON CONFLICT (name) DO UPDATE SET holds_kept = true
         WHERE projection_offsets.sequence = 0",
    )
    .bind(name)
    .execute(pool)
    .await?;
    Ok(())
}

/// Where `projector` resumes: the last sequence its own rows hold, or the
/// one the runner committed for it (its offset row made sure of first).
pub(crate) async fn resume_offset<P: Projector>(pool: &PgPool, projector: &P) -> Result<u64> {
    let mut conn = pool.acquire().await?;
    if let Some(sequence) = projector.own_offset(&mut conn).await? {
        return Ok(sequence);
    }
    drop(conn);
    ensure_offset_row(pool, projector.name()).await?;
    let (sequence, holds_kept): (i64, bool) =
        sqlx::query_as("SELECT sequence, holds_kept FROM projection_offsets WHERE name = $1")
            .bind(projector.name())
            .fetch_one(pool)
            .await?;
    if !holds_kept && reads_leases(projector.filters()) {
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(pool)
            .await?;
        return Err(ProjectionError::ForeignMigrations {
            schema,
            detail: format!(
                "projection {} reached sequence {sequence} before it kept the leases' holds, \
                 so it cannot judge who may report on them",
                projector.name()
            ),
        });
    }
    Ok(sequence as u64)
}

/// Whether subjects `filters` take in lease events.
fn reads_leases(filters: &[&str]) -> bool {
    filters
        .iter()
        .any(|f| f.starts_with("lh.evt.lease") || *f == "lh.evt.>" || *f == ">")
}

/// Last sequence this projection committed (0 when it never ran).
pub async fn committed_sequence(pool: &PgPool, name: &str) -> Result<u64> {
    let seq: Option<i64> =
        sqlx::query_scalar("SELECT sequence FROM projection_offsets WHERE name = $1")
            .bind(name)
            .fetch_optional(pool)
            .await?;
    Ok(seq.unwrap_or(0) as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn schema_names_are_checked() {
        assert!(super::check_schema_name("gateway_rebuild").is_ok());
        assert!(super::check_schema_name("Gateway").is_err());
        assert!(super::check_schema_name("x; DROP").is_err());
        assert!(super::check_schema_name("1abc").is_err());
    }
}
