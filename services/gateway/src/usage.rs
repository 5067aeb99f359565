//! What leases used of their GPUs, kept as one row per (lease, GPU,
//! minute) long after the samples leave `LH_TELEMETRY` (48 hours; see
//! docs/adr/018-usage-kept-as-minutes-beyond-the-telemetry-stream.md).
//!
//! The node agents' samples are folded by [`UsageProjection`] in the one
//! projection loop (`lh_projection::run`), each sample's rows committed
//! with its stream position. A node is trusted for what only it can tell
//! (its GPUs' figures), not for its clock nor for absurd figures: a sample
//! stamped far from when the stream stored it is put in the stream's
//! minute, and a GPU entry no device could report is left out; both are
//! counted. The node is the one the subject names (NATS lets a node publish
//! only under its own), and the tenant the lease read model's.

use crate::read_model::lease::PlacedMember;
use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, DurationRound as _, TimeDelta, Utc};
use futures::future::BoxFuture;
use lh_bus::{Sample, Stored};
use lh_events::subject;
use lh_events::telemetry::{LeaseGpuUsage, LeaseUsage};
use lh_projection::{Projector, Stream};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Days of minutes kept when `LH_USAGE_KEEP_DAYS` is not set.
pub const DEFAULT_USAGE_KEEP_DAYS: u32 = 400;
/// Most days `LH_USAGE_KEEP_DAYS` may keep.
pub const MAX_USAGE_KEEP_DAYS: u32 = 3650;
/// How often minutes past the kept days are deleted.
pub const USAGE_PRUNE_INTERVAL: Duration = Duration::from_secs(3600);
/// Most minutes one delete statement removes, so that pruning a year of
/// rows never holds the table for long.
pub const MAX_USAGE_PRUNE_ROWS: i64 = 10_000;
/// Furthest a sample's own time may be from when the stream stored it,
/// in seconds; past it the stream's time is used.
pub const MAX_USAGE_CLOCK_SKEW_SECS: i64 = 300;
/// Figures past these are no device's: the GPU entry is left out.
pub const MAX_UTILIZATION_PCT: u32 = 100;
pub const MAX_TEMPERATURE_C: u32 = 200;
pub const MAX_POWER_W: f64 = 5_000.0;
/// 16 TiB, in MiB: far above any board's memory.
pub const MAX_MEMORY_USED_MIB: u64 = 16 * 1024 * 1024;
pub const MAX_GPU_INDEX: u32 = 1023;
/// Most samples one GPU of one lease adds to one minute (one a second; the
/// agent sends one each 5 s by default): a node flooding its own lease's
/// samples moves its figures by no more than a steady sampler could.
pub const MAX_SAMPLES_PER_GPU_MINUTE: i32 = 60;
pub const MAX_GPU_UUID_CHARS: usize = 128;
/// Most GPU entries of one sample folded; the rest are refused.
pub const MAX_GPUS_PER_SAMPLE: usize = 64;

/// The usage projection's offset row and stream.
pub const PROJECTION_NAME: &str = "gateway_usage";
/// The table of minutes; carried over, never rebuilt from nothing.
pub const TABLE: &str = "lease_usage_minutes";

/// How long usage is kept.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct UsageArgs {
    /// Days of per-minute usage kept (1 to 3650); older minutes are deleted hourly.
    #[arg(
        long,
        env = "LH_USAGE_KEEP_DAYS",
        default_value_t = DEFAULT_USAGE_KEEP_DAYS,
        value_parser = clap::value_parser!(u32).range(1..=MAX_USAGE_KEEP_DAYS as i64)
    )]
    pub usage_keep_days: u32,
}

impl Default for UsageArgs {
    fn default() -> Self {
        Self {
            usage_keep_days: DEFAULT_USAGE_KEEP_DAYS,
        }
    }
}

/// Why a GPU entry is not folded: the field at fault.
pub fn refusal(gpu: &LeaseGpuUsage) -> Option<&'static str> {
    if gpu.utilization_pct.is_some_and(|u| u > MAX_UTILIZATION_PCT) {
        return Some("utilization_pct");
    }
    if gpu.temperature_c.is_some_and(|t| t > MAX_TEMPERATURE_C) {
        return Some("temperature_c");
    }
    if gpu
        .power_w
        .is_some_and(|p| !p.is_finite() || !(0.0..=MAX_POWER_W).contains(&p))
    {
        return Some("power_w");
    }
    if gpu.memory_used_mib > MAX_MEMORY_USED_MIB {
        return Some("memory_used_mib");
    }
    if gpu.index > MAX_GPU_INDEX {
        return Some("index");
    }
    // Shown to tenants and printed by the CLI: printable ASCII only, so a
    // node cannot put terminal escapes in front of them.
    if gpu.uuid.is_empty()
        || gpu.uuid.chars().count() > MAX_GPU_UUID_CHARS
        || !gpu.uuid.chars().all(|c| c.is_ascii_graphic())
    {
        return Some("uuid");
    }
    None
}

/// The minute a sample is counted in: its own time's, unless that is more
/// than [`MAX_USAGE_CLOCK_SKEW_SECS`] from when the stream stored it (a
/// node's clock is not trusted); `true` when the stream's time was used.
pub fn minute_of(at: DateTime<Utc>, stored_at: DateTime<Utc>) -> (DateTime<Utc>, bool) {
    let skewed = (at - stored_at).num_seconds().abs() > MAX_USAGE_CLOCK_SKEW_SECS;
    let time = if skewed { stored_at } else { at };
    let minute = time.duration_trunc(TimeDelta::minutes(1)).unwrap_or(time);
    (minute, skewed)
}

/// The node and lease a usage subject names (`lh.tel.usage.<node>.<lease>`).
fn subject_parts(subject: &str) -> Option<(&str, Uuid)> {
    let rest = subject.strip_prefix("lh.tel.usage.")?;
    let (node, lease) = rest.rsplit_once('.')?;
    Some((node, lease.parse().ok()?))
}

fn skipped(reason: &'static str) {
    metrics::counter!("lh_gateway_usage_samples_skipped_total", "reason" => reason).increment(1);
}

/// Folds the usage samples of `LH_TELEMETRY` into `lease_usage_minutes`.
pub struct UsageProjection;

impl Projector for UsageProjection {
    fn name(&self) -> &'static str {
        PROJECTION_NAME
    }

    fn filters(&self) -> &'static [&'static str] {
        &[subject::USAGE_ALL]
    }

    fn stream(&self) -> Stream {
        Stream::Telemetry
    }

    fn apply<'c>(
        &'c self,
        _conn: &'c mut PgConnection,
        _event: &'c Stored,
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn apply_sample<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        sample: &'c Sample,
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async move { apply_samples(conn, &[sample]).await })
    }

    fn apply_samples<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        samples: &'c [&'c Sample],
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(apply_samples(conn, samples))
    }
}

/// Most minute rows one multi-row statement writes.
const MAX_USAGE_ROWS_PER_STATEMENT: usize = 1024;

/// One GPU's figures of one sample, for its minute's row.
struct MinuteRow<'a> {
    lease_id: Uuid,
    gpu: &'a LeaseGpuUsage,
    minute: DateTime<Utc>,
    tenant_id: Uuid,
    node_id: &'a str,
    sequence: i64,
}

/// Folds consecutive samples, in stream order, as one by one would: the
/// leases they name are read in one query, and the minute rows are dealt
/// out in waves (the n-th row of each lease, GPU and minute to wave n, so a
/// row is counted in order and at most once per statement), each written
/// with one statement.
async fn apply_samples(conn: &mut PgConnection, samples: &[&Sample]) -> sqlx::Result<()> {
    let mut usable = Vec::with_capacity(samples.len());
    for &sample in samples {
        let Ok(usage) = serde_json::from_slice::<LeaseUsage>(&sample.payload) else {
            skipped("undecodable");
            continue;
        };
        // The subject is what NATS let the node publish on: its own.
        match subject_parts(&sample.subject) {
            Some((node, lease))
                if lease == usage.lease_id && node == subject::token(&usage.node_id) =>
            {
                usable.push((sample, usage))
            }
            _ => skipped("wrong_subject"),
        }
    }
    if usable.is_empty() {
        return Ok(());
    }
    let mut ids: Vec<Uuid> = usable.iter().map(|(_, u)| u.lease_id).collect();
    ids.sort_unstable();
    ids.dedup();
    type Known = (Uuid, Option<String>, String, Vec<String>, Vec<PlacedMember>);
    let known: HashMap<Uuid, Known> = sqlx::query_as::<
        _,
        (
            Uuid,
            Uuid,
            Option<String>,
            String,
            sqlx::types::Json<Vec<String>>,
            sqlx::types::Json<Vec<PlacedMember>>,
        ),
    >(
        "SELECT id, tenant_id, node_id, state, gpu_uuids, members FROM leases
             WHERE id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|(id, tenant, node, state, uuids, members)| {
        (id, (tenant, node, state, uuids.0, members.0))
    })
    .collect();
    let mut waves: Vec<Vec<MinuteRow>> = Vec::new();
    let mut wave_of: HashMap<(Uuid, &str, DateTime<Utc>), usize> = HashMap::new();
    for (sample, usage) in &usable {
        let (minute, clamped) = minute_of(usage.at, sample.stored_at);
        if clamped {
            metrics::counter!("lh_gateway_usage_clock_clamped_total").increment(1);
        }
        // Only a lease placed on the publishing node is its to report: a
        // node (NATS lets it publish under its own subject only) must not
        // write figures into another node's lease, whichever tenant holds
        // it. A sample that outruns the lease's placement in the read model
        // is lost with the rest of what cannot be attributed.
        // A gang's member reports the GPUs of its own part.
        let member = |members: &'_ [PlacedMember]| {
            members
                .iter()
                .find(|m| m.node_id == usage.node_id)
                .map(|m| m.gpu_uuids.clone())
        };
        let (tenant_id, placed_uuids) = match known.get(&usage.lease_id) {
            None => {
                skipped("unknown_lease");
                continue;
            }
            Some((_, node, _, _, members))
                if node.as_deref() != Some(usage.node_id.as_str()) && member(members).is_none() =>
            {
                skipped("not_placed_here");
                continue;
            }
            // Its GPUs are not its any more: nothing runs there for it.
            Some((_, _, state, ..)) if !matches!(state.as_str(), "placed" | "running") => {
                skipped("not_running");
                continue;
            }
            Some((tenant_id, _, _, uuids, members)) => {
                (*tenant_id, member(members).unwrap_or_else(|| uuids.clone()))
            }
        };
        for (n, gpu) in usage.gpus.iter().enumerate() {
            let why = if n >= MAX_GPUS_PER_SAMPLE {
                Some("gpus")
            } else if !placed_uuids.contains(&gpu.uuid) {
                // A node reports only the GPUs the lease was placed on.
                Some("uuid")
            } else {
                refusal(gpu)
            };
            if let Some(field) = why {
                metrics::counter!("lh_gateway_usage_gpus_refused_total", "field" => field)
                    .increment(1);
                continue;
            }
            let next = wave_of
                .entry((usage.lease_id, gpu.uuid.as_str(), minute))
                .or_insert(0);
            if waves.len() <= *next {
                waves.push(Vec::new());
            }
            waves[*next].push(MinuteRow {
                lease_id: usage.lease_id,
                gpu,
                minute,
                tenant_id,
                node_id: &usage.node_id,
                sequence: sample.sequence as i64,
            });
            *next += 1;
        }
    }
    for wave in &waves {
        for rows in wave.chunks(MAX_USAGE_ROWS_PER_STATEMENT) {
            add_to_minutes(conn, rows).await?;
        }
    }
    Ok(())
}

/// Adds rows (each on a minute of its own) to their minutes. A row counts
/// every sample of its lease and GPU up to its `last_sequence`, in stream
/// order: one at or below it (a redelivery, a replay into carried-over
/// rows, a GPU listed twice) is already in.
async fn add_to_minutes(conn: &mut PgConnection, rows: &[MinuteRow<'_>]) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO lease_usage_minutes AS m (lease_id, gpu_uuid, minute, tenant_id, node_id,
                gpu_index, samples, utilization_samples, utilization_pct_sum,
                memory_used_mib_sum, memory_used_mib_max, temperature_c_max, power_samples,
                power_w_sum, last_sequence)
         SELECT lease_id, gpu_uuid, minute, tenant_id, node_id, gpu_index, 1,
                utilization_samples, utilization_pct_sum, memory_used_mib, memory_used_mib,
                temperature_c_max, power_samples, power_w_sum, last_sequence
         FROM UNNEST($1::uuid[], $2::text[], $3::timestamptz[], $4::uuid[], $5::text[],
                     $6::int4[], $7::int4[], $8::int8[], $9::int8[], $10::int4[], $11::int4[],
                     $12::float8[], $13::int8[])
              AS u(lease_id, gpu_uuid, minute, tenant_id, node_id, gpu_index,
                   utilization_samples, utilization_pct_sum, memory_used_mib,
                   temperature_c_max, power_samples, power_w_sum, last_sequence)
         ON CONFLICT (lease_id, gpu_uuid, minute) DO UPDATE SET
            tenant_id = EXCLUDED.tenant_id,
            node_id = EXCLUDED.node_id,
            gpu_index = EXCLUDED.gpu_index,
            samples = m.samples + 1,
            utilization_samples = m.utilization_samples + EXCLUDED.utilization_samples,
            utilization_pct_sum = m.utilization_pct_sum + EXCLUDED.utilization_pct_sum,
            memory_used_mib_sum = m.memory_used_mib_sum + EXCLUDED.memory_used_mib_sum,
            memory_used_mib_max = GREATEST(m.memory_used_mib_max, EXCLUDED.memory_used_mib_max),
            temperature_c_max = GREATEST(m.temperature_c_max, EXCLUDED.temperature_c_max),
            power_samples = m.power_samples + EXCLUDED.power_samples,
            power_w_sum = m.power_w_sum + EXCLUDED.power_w_sum,
            last_sequence = EXCLUDED.last_sequence
         WHERE m.last_sequence < EXCLUDED.last_sequence AND m.samples < $14",
    )
    .bind(rows.iter().map(|r| r.lease_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.gpu.uuid.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.minute).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.tenant_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.node_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.gpu.index as i32).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|r| i32::from(r.gpu.utilization_pct.is_some()))
            .collect::<Vec<_>>(),
    )
    .bind(
        rows.iter()
            .map(|r| i64::from(r.gpu.utilization_pct.unwrap_or(0)))
            .collect::<Vec<_>>(),
    )
    .bind(
        rows.iter()
            .map(|r| r.gpu.memory_used_mib as i64)
            .collect::<Vec<_>>(),
    )
    .bind(
        rows.iter()
            .map(|r| r.gpu.temperature_c.map(|t| t as i32))
            .collect::<Vec<_>>(),
    )
    .bind(
        rows.iter()
            .map(|r| i32::from(r.gpu.power_w.is_some()))
            .collect::<Vec<_>>(),
    )
    .bind(
        rows.iter()
            .map(|r| r.gpu.power_w.unwrap_or(0.0))
            .collect::<Vec<_>>(),
    )
    .bind(rows.iter().map(|r| r.sequence).collect::<Vec<_>>())
    .bind(MAX_SAMPLES_PER_GPU_MINUTE)
    .execute(conn)
    .await?;
    Ok(())
}

/// Deletes the minutes older than `keep_days` before `now`, at most
/// [`MAX_USAGE_PRUNE_ROWS`] a statement; returns how many went.
pub async fn prune(pool: &PgPool, keep_days: u32, now: DateTime<Utc>) -> sqlx::Result<u64> {
    let cutoff = now - TimeDelta::days(i64::from(keep_days));
    let mut pruned = 0;
    loop {
        let deleted = sqlx::query(
            "DELETE FROM lease_usage_minutes WHERE ctid IN (
                SELECT ctid FROM lease_usage_minutes WHERE minute < $1 LIMIT $2)",
        )
        .bind(cutoff)
        .bind(MAX_USAGE_PRUNE_ROWS)
        .execute(pool)
        .await?
        .rows_affected();
        pruned += deleted;
        metrics::counter!("lh_gateway_usage_rows_pruned_total").increment(deleted);
        if deleted < MAX_USAGE_PRUNE_ROWS as u64 {
            return Ok(pruned);
        }
        // Let the projection's writes in between batches.
        tokio::task::yield_now().await;
    }
}

/// Prunes every [`USAGE_PRUNE_INTERVAL`], first at start, until the
/// process ends; a failure waits for the next round.
pub async fn prune_every_hour(pool: PgPool, keep_days: u32) -> std::convert::Infallible {
    let mut every = tokio::time::interval(USAGE_PRUNE_INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        match prune(&pool, keep_days, Utc::now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(minutes = n, keep_days, "pruned old usage"),
            Err(e) => tracing::warn!(error = %e, "cannot prune old usage; trying next hour"),
        }
    }
}

/// Brings the usage minutes into the rebuilt schema `into`: the live
/// schema's rows (what the stream no longer holds), then what the stream
/// still has, each sample counted once (see [`add_to_minutes`]).
pub async fn carry_over(
    bus: &lh_bus::Bus,
    database_url: &str,
    live: &str,
    into: &str,
) -> anyhow::Result<u64> {
    let pool = lh_projection::connect_schema(database_url, into).await?;
    let live_has_table: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM information_schema.tables
                        WHERE table_schema = $1 AND table_name = $2)",
    )
    .bind(live)
    .bind(TABLE)
    .fetch_one(&pool)
    .await?;
    if live_has_table {
        // Schema names were checked by the rebuild that made `into`.
        sqlx::query(&format!(
            "INSERT INTO {into}.{TABLE} SELECT * FROM {live}.{TABLE} ON CONFLICT DO NOTHING"
        ))
        .execute(&pool)
        .await?;
    }
    let reached = lh_projection::replay(bus, &pool, &UsageProjection, |_, _| {}).await?;
    pool.close().await;
    Ok(reached)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu() -> LeaseGpuUsage {
        LeaseGpuUsage {
            index: 0,
            uuid: "GPU-0".into(),
            utilization_pct: Some(100),
            memory_used_mib: 80 * 1024,
            shared: false,
            temperature_c: Some(200),
            power_w: Some(700.0),
        }
    }

    #[test]
    fn figures_no_device_reports_are_refused_by_field() {
        assert_eq!(refusal(&gpu()), None);
        type Spoil = fn(&mut LeaseGpuUsage);
        let bad: [(Spoil, &str); 8] = [
            (|g| g.utilization_pct = Some(101), "utilization_pct"),
            (|g| g.temperature_c = Some(201), "temperature_c"),
            (|g| g.power_w = Some(f64::NAN), "power_w"),
            (|g| g.power_w = Some(-1.0), "power_w"),
            (|g| g.memory_used_mib = u64::MAX, "memory_used_mib"),
            (|g| g.index = 4096, "index"),
            (|g| g.uuid = String::new(), "uuid"),
            (|g| g.uuid = "GPU-\u{1b}[2J".into(), "uuid"),
        ];
        for (spoil, field) in bad {
            let mut g = gpu();
            spoil(&mut g);
            assert_eq!(refusal(&g), Some(field));
        }
    }

    #[test]
    fn a_sample_counts_in_its_own_minute_unless_its_clock_is_far_off() {
        let t = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        let stored = t("2026-12-03T05:00:10Z");
        assert_eq!(
            minute_of(t("2026-12-03T04:59:59Z"), stored),
            (t("2026-12-03T04:59:00Z"), false)
        );
        assert_eq!(
            minute_of(t("2026-12-03T05:05:10Z"), stored),
            (t("2026-12-03T05:05:00Z"), false)
        );
        assert_eq!(
            minute_of(t("2026-12-03T05:05:11Z"), stored),
            (t("2026-12-03T05:00:00Z"), true)
        );
        assert_eq!(
            minute_of(t("1999-01-01T00:00:00Z"), stored),
            (t("2026-12-03T05:00:00Z"), true)
        );
    }

    #[test]
    fn kept_days_are_1_to_3650_and_400_by_default() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            usage: UsageArgs,
        }
        let parse = |args: &[&str]| {
            <Flags as clap::Parser>::try_parse_from([&["gateway"], args].concat())
                .map(|f| f.usage.usage_keep_days)
        };
        assert_eq!(parse(&[]).unwrap(), DEFAULT_USAGE_KEEP_DAYS);
        assert_eq!(parse(&["--usage-keep-days", "3650"]).unwrap(), 3650);
        assert_eq!(parse(&["--usage-keep-days", "1"]).unwrap(), 1);
        for refused in ["0", "3651", "-1", "forever"] {
            assert!(parse(&["--usage-keep-days", refused]).is_err(), "{refused}");
        }
    }

    #[test]
    fn usage_subjects_name_node_and_lease() {
        let lease = Uuid::from_u128(7);
        assert_eq!(
            subject_parts(&subject::usage("sim.a", lease)),
            Some(("sim_a", lease))
        );
        assert_eq!(subject_parts("lh.tel.heartbeat.n1"), None);
        assert_eq!(subject_parts("lh.tel.usage.n1.not-a-uuid"), None);
    }
}
