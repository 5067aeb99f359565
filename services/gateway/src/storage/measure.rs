//! Measuring tenants' buckets: at each interval the gateway lists every
//! provisioned bucket of a tenant not erased and records what it holds
//! (`storage.measured`), which pricing charges and the storage quota
//! counts. A tenant found over its quota (`max_storage_gb`) may no longer
//! write to its bucket (its identity's policy keeps reading, listing and
//! deleting) until a measurement finds it under: whatever writes (an
//! upload, a node's workspace sync, a container through its relay), the
//! quota holds within an interval. An unreachable store costs a
//! measurement, never the gateway: the next interval tries again.
//!
//! Intervals are counted from the Unix epoch, so every replica starts its
//! pass at the same instants, and a measurement's id is derived from its
//! tenant and interval: a second replica's measurement within the log's
//! duplicate window (2 minutes) is the same event, dropped by JetStream;
//! one made later (a replica that was slow to list) only cuts the span
//! pricing charges in two, which charges the same.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::stream::{self, StreamExt};
use lh_bus::{Bus, Expect};
use lh_events::{derived_id, Actor, Envelope, EventData, StorageMeasured};
use sqlx::PgPool;
use uuid::Uuid;

use super::TenantStorage;

/// How often each tenant's bucket is measured, by default: an hour.
pub const DEFAULT_MEASURE_INTERVAL_SECS: u64 = 3600;
/// Buckets listed at once.
const LISTINGS_IN_FLIGHT: usize = 4;

/// The start of the interval of `interval_secs` that `now` is in.
pub fn interval_start(now: DateTime<Utc>, interval_secs: u64) -> DateTime<Utc> {
    let secs = interval_secs.clamp(1, i64::MAX as u64) as i64;
    let start = now.timestamp().div_euclid(secs) * secs;
    DateTime::from_timestamp(start, 0).unwrap_or(now)
}

/// The id of tenant `tenant_id`'s measurement of the interval starting at
/// `start`: every replica derives the same.
pub fn measurement_id(tenant_id: Uuid, start: DateTime<Utc>) -> Uuid {
    derived_id(&[
        "storage.measured",
        &tenant_id.to_string(),
        &start.timestamp().to_string(),
    ])
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub recorded: u64,
    /// Another replica had recorded the same interval's.
    pub duplicate: u64,
    pub failed: u64,
}

/// Measures each tenant with a bucket, not erased, that the read model
/// shows no measurement of in the interval starting at `start`.
pub async fn measure_due(
    storage: &TenantStorage,
    pool: &PgPool,
    bus: &Bus,
    start: DateTime<Utc>,
) -> Result<Pass, sqlx::Error> {
    let due: Vec<(Uuid, String, Option<i32>, bool)> = sqlx::query_as(
        "SELECT s.tenant_id, s.bucket, t.max_storage_gb, s.writes_stopped FROM storage_usage s
         LEFT JOIN tenants t ON t.id = s.tenant_id
         WHERE NOT s.erased AND NOT COALESCE(t.erased, false)
           AND (s.measured_at IS NULL OR s.measured_at < $1)
         ORDER BY s.tenant_id",
    )
    .bind(start)
    .fetch_all(pool)
    .await?;
    let outcomes: Vec<&'static str> = stream::iter(due)
        .map(|(tenant_id, bucket, max_storage_gb, stopped)| async move {
            let bytes = match storage.bucket_bytes(&bucket).await {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(tenant = %tenant_id, %bucket, error = %e,
                        "cannot measure a tenant's bucket; trying next interval");
                    return "failed";
                }
            };
            let over = over_quota(bytes, max_storage_gb);
            // Put every time the answer differs from the last recorded:
            // a policy put that failed is tried again next interval.
            let writes_stopped = if over != stopped {
                match storage.set_writes(tenant_id, &bucket, !over).await {
                    Ok(()) => {
                        tracing::info!(tenant = %tenant_id, bytes, ?max_storage_gb, over,
                            "a tenant's writes to its bucket changed with its quota");
                        over
                    }
                    Err(e) => {
                        tracing::warn!(tenant = %tenant_id, %bucket, error = %e,
                            "cannot change a tenant's writes with its quota; trying next interval");
                        stopped
                    }
                }
            } else {
                over
            };
            let measured_at = Utc::now();
            let envelope = Envelope::new(
                Actor::Service("gateway".into()),
                measured_at,
                EventData::StorageMeasured(StorageMeasured {
                    tenant_id,
                    bucket: bucket.clone(),
                    bytes,
                    measured_at,
                    writes_stopped,
                }),
            )
            .with_id(measurement_id(tenant_id, start));
            match bus.publish(&envelope, Expect::Any).await {
                Ok(appended) if appended.duplicate => "duplicate",
                Ok(_) => "recorded",
                Err(e) => {
                    tracing::warn!(tenant = %tenant_id, error = %e,
                        "cannot record a tenant's storage measurement; trying next interval");
                    "failed"
                }
            }
        })
        .buffer_unordered(LISTINGS_IN_FLIGHT)
        .collect()
        .await;
    let mut pass = Pass::default();
    for outcome in outcomes {
        metrics::counter!("lh_gateway_storage_measurements_total", "result" => outcome)
            .increment(1);
        match outcome {
            "recorded" => pass.recorded += 1,
            "duplicate" => pass.duplicate += 1,
            _ => pass.failed += 1,
        }
    }
    Ok(pass)
}

/// Whether `bytes` are over a quota of `max_storage_gb` GB (10^9 bytes);
/// never without one.
pub fn over_quota(bytes: u64, max_storage_gb: Option<i32>) -> bool {
    max_storage_gb
        .is_some_and(|gb| u128::from(bytes) > u128::from(gb.max(0) as u32) * 1_000_000_000)
}

/// After a quota change: a tenant whose writes are stopped and whose last
/// measurement is within its new quota `max_storage_gb` may write again at
/// once, not an interval later (the read model says so at the next
/// measurement). A failure waits for that measurement.
pub async fn lift_if_under(
    storage: &TenantStorage,
    pool: &PgPool,
    tenant_id: Uuid,
    max_storage_gb: Option<u32>,
) {
    let row: Result<Option<(String, Option<i64>)>, _> = sqlx::query_as(
        "SELECT bucket, bytes FROM storage_usage
         WHERE tenant_id = $1 AND writes_stopped AND NOT erased",
    )
    .bind(tenant_id)
    .fetch_optional(pool)
    .await;
    let Ok(Some((bucket, bytes))) = row else {
        return;
    };
    let quota = max_storage_gb.map(|gb| i32::try_from(gb).unwrap_or(i32::MAX));
    if over_quota(bytes.unwrap_or(0).max(0) as u64, quota) {
        return;
    }
    match storage.set_writes(tenant_id, &bucket, true).await {
        Ok(()) => tracing::info!(tenant = %tenant_id, "a tenant under its new quota writes again"),
        Err(e) => tracing::warn!(tenant = %tenant_id, error = %e,
            "a tenant under its new quota writes again at the next measurement"),
    }
}

/// Measures at the start of every interval, for as long as the gateway
/// runs.
pub async fn every_interval(
    storage: Arc<TenantStorage>,
    pool: PgPool,
    bus: Bus,
    interval_secs: u64,
) -> std::convert::Infallible {
    loop {
        let now = Utc::now();
        let start = interval_start(now, interval_secs);
        match measure_due(&storage, &pool, &bus, start).await {
            Ok(pass) if pass == Pass::default() => {}
            Ok(pass) => tracing::debug!(?pass, "tenants' buckets measured"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the buckets to measure; trying next interval")
            }
        }
        let next = start + chrono::Duration::seconds(interval_secs.max(1) as i64);
        let wait = (next - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn replicas_share_the_intervals_and_the_ids() {
        let at = |h, m, s| Utc.with_ymd_and_hms(2026, 12, 2, h, m, s).unwrap();
        assert_eq!(interval_start(at(10, 59, 59), 3600), at(10, 0, 0));
        assert_eq!(interval_start(at(11, 0, 0), 3600), at(11, 0, 0));
        assert_eq!(interval_start(at(11, 0, 7), 5), at(11, 0, 5));
        // A zero interval would divide by zero: it counts as a second.
        assert_eq!(interval_start(at(11, 0, 7), 0), at(11, 0, 7));
        let tenant = Uuid::from_u128(1);
        let a = measurement_id(tenant, interval_start(at(10, 0, 1), 3600));
        let b = measurement_id(tenant, interval_start(at(10, 1, 30), 3600));
        assert_eq!(a, b);
        assert_ne!(a, measurement_id(tenant, at(11, 0, 0)));
        assert_ne!(a, measurement_id(Uuid::from_u128(2), at(10, 0, 0)));
    }
}
