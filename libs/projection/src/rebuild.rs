//! Rebuilding a read model from nothing: replay into a fresh schema,
//! compare it table by table with the live one, and swap them when asked.
//! The comparison is what shows a projector deterministic.

use lh_bus::Bus;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::database::{check_schema_name, connect_schema, migrate};
use crate::replay::replay;
use crate::{ProjectionError, Projector, Result, SKIPPED_TABLE};

/// Replays the whole log (up to its head at call time) into a fresh
/// `schema`, dropping whatever that schema held. Returns the sequence
/// reached. `on_event` is told each applied sequence (for progress output).
pub async fn rebuild<P: Projector>(
    bus: &Bus,
    database_url: &str,
    schema: &str,
    migrator: &Migrator,
    projector: &P,
    on_event: impl FnMut(u64, u64),
) -> Result<u64> {
    check_schema_name(schema)?;
    {
        let base: PgConnectOptions = database_url.parse()?;
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(base)
            .await?;
        sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .execute(&admin)
            .await?;
        admin.close().await;
    }
    let pool = connect_schema(database_url, schema).await?;
    migrate(&pool, migrator).await?;
    let reached = replay(bus, &pool, projector, on_event).await;
    pool.close().await;
    reached
}

/// Replaces schema `live` by `rebuilt` in one transaction (the old one is dropped).
pub async fn swap_schemas(database_url: &str, live: &str, rebuilt: &str) -> Result<()> {
    check_schema_name(live)?;
    check_schema_name(rebuilt)?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url)
        .await?;
    let mut tx = pool.begin().await?;
    let old = format!("{live}_old");
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {old} CASCADE"))
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!("ALTER SCHEMA {live} RENAME TO {old}"))
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!("ALTER SCHEMA {rebuilt} RENAME TO {live}"))
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!("DROP SCHEMA {old} CASCADE"))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    pool.close().await;
    Ok(())
}

/// How one table of a rebuilt schema compares with the live one:
/// `(row count, md5 over all rows)` each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableComparison {
    pub table: &'static str,
    pub live: (i64, String),
    pub rebuilt: (i64, String),
}

impl TableComparison {
    pub fn identical(&self) -> bool {
        self.live == self.rebuilt
    }
}

/// The outcome of [`rebuild_and_compare`].
#[derive(Debug, Clone)]
pub struct RebuildReport {
    pub live_schema: String,
    pub rebuilt_schema: String,
    /// Last sequence applied to the rebuilt schema.
    pub reached: u64,
    pub tables: Vec<TableComparison>,
    /// The rebuilt schema replaced the live one.
    pub swapped: bool,
}

impl RebuildReport {
    pub fn identical(&self) -> bool {
        self.tables.iter().all(TableComparison::identical)
    }
}

/// Digests of `tables` in two schemas, read in one UTC session so that
/// timestamps print the same way.
pub async fn compare_tables(
    database_url: &str,
    live: &str,
    rebuilt: &str,
    tables: &[&'static str],
) -> Result<Vec<TableComparison>> {
    let options: PgConnectOptions = database_url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.options([("timezone", "UTC")]))
        .await?;
    let mut out = Vec::new();
    for table in tables {
        out.push(TableComparison {
            table,
            live: table_digest(&pool, live, table).await?,
            rebuilt: table_digest(&pool, rebuilt, table).await?,
        });
    }
    pool.close().await;
    Ok(out)
}

/// Replays the log into the fresh schema `into` (see [`rebuild`]), compares
/// `tables` and then [`SKIPPED_TABLE`] with schema `live`, and with `swap`
/// makes the rebuilt schema the live one. Refuses to rebuild into the live
/// schema.
#[allow(clippy::too_many_arguments)]
pub async fn rebuild_and_compare<P: Projector>(
    bus: &Bus,
    database_url: &str,
    live: &str,
    into: &str,
    migrator: &Migrator,
    projector: &P,
    tables: &[&'static str],
    swap: bool,
    on_event: impl FnMut(u64, u64),
) -> Result<RebuildReport> {
    if live == into {
        return Err(ProjectionError::SchemaName(format!(
            "{into} is the live schema; rebuilding into it would drop it"
        )));
    }
    let reached = rebuild(bus, database_url, into, migrator, projector, on_event).await?;
    let tables = [tables, &[SKIPPED_TABLE]].concat();
    let tables = compare_tables(database_url, live, into, &tables).await?;
    if swap {
        swap_schemas(database_url, live, into).await?;
    }
    Ok(RebuildReport {
        live_schema: live.to_string(),
        rebuilt_schema: into.to_string(),
        reached,
        tables,
        swapped: swap,
    })
}

/// MD5 over every row of `schema.table` in a canonical order: equal digests
/// mean byte-identical tables.
pub async fn table_digest(pool: &PgPool, schema: &str, table: &str) -> Result<(i64, String)> {
    check_schema_name(schema)?;
    check_schema_name(table)?;
    let row: (i64, Option<String>) = sqlx::query_as(&format!(
        "SELECT count(*), md5(string_agg(t::text, E'\\n' ORDER BY t::text)) FROM {schema}.{table} t"
    ))
    .fetch_one(pool)
    .await?;
    Ok((row.0, row.1.unwrap_or_default()))
}
