//! What leases used of their GPUs, from the per-minute usage read model
//! ([`crate::usage`]):
//!
//! - `GET /v1/usage?from=&to=&step=[&node=][&gpu=][&tenant=]`: a tenant's
//!   own leases (naming another tenant is refused), every lease for an
//!   operator, who may filter by node, GPU and tenant;
//! - `GET /v1/leases/{id}/usage?from=&to=&step=`: one lease's.
//!
//! Points are aligned to `step` boundaries from the Unix epoch (step=3600
//! gives whole UTC hours), and there is one only for a step that had a
//! sample. The window is `[from, to)`, the last hour by default.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::Json;
use chrono::{DateTime, TimeDelta, Utc};
use lh_rpc::http::usage::{UsagePoint, UsageReport, UsageSeries};
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::{ApiContext, ApiError, Caller};

/// The most time one usage answer may take of the database.
pub const USAGE_QUERY_TIMEOUT_MILLIS: u64 = 10_000;

/// Most points one answer holds, over all its series; a query that would
/// give more must ask for a coarser step.
pub const MAX_USAGE_POINTS: usize = 100_000;
/// Widest window one query may span, in days.
pub const MAX_USAGE_WINDOW_DAYS: i64 = 400;
/// The window when `from` and `to` are not given, in seconds.
pub const DEFAULT_USAGE_WINDOW_SECS: i64 = 3600;
/// Finest and coarsest step, in seconds; a step is whole minutes.
pub const MIN_USAGE_STEP_SECS: u32 = 60;
pub const MAX_USAGE_STEP_SECS: u32 = 86_400;
/// Longest node id and GPU UUID a filter may name.
pub const MAX_USAGE_FILTER_CHARS: usize = 128;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// Start of the window (RFC 3339, inclusive); by default an hour before `to`.
    pub from: Option<String>,
    /// End of the window (RFC 3339, exclusive); by default now.
    pub to: Option<String>,
    /// Seconds per point: a multiple of 60, 60 to 86400 (default 60).
    pub step: Option<String>,
    /// Operators: only this node's GPUs.
    pub node: Option<String>,
    /// Only this GPU (its UUID).
    pub gpu: Option<String>,
    /// Only this tenant's leases (a tenant may name only itself).
    pub tenant: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct LeaseUsageQuery {
    /// Start of the window (RFC 3339, inclusive); by default an hour before `to`.
    pub from: Option<String>,
    /// End of the window (RFC 3339, exclusive); by default now.
    pub to: Option<String>,
    /// Seconds per point: a multiple of 60, 60 to 86400 (default 60).
    pub step: Option<String>,
}

/// A checked window and step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub step_secs: u32,
}

fn instant(raw: Option<&str>, field: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
    raw.map(|raw| {
        DateTime::parse_from_rfc3339(raw)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| {
                ApiError::unprocessable(
                    format!("{field} must be an RFC 3339 time such as 2026-12-03T00:00:00Z"),
                    field,
                )
            })
    })
    .transpose()
}

/// Checks `from`, `to` and `step` as sent; `now` stands for a missing `to`.
pub fn window(
    from: Option<&str>,
    to: Option<&str>,
    step: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Window, ApiError> {
    let step_rule = || {
        ApiError::unprocessable(
            format!(
                "step is seconds, a multiple of 60 from {MIN_USAGE_STEP_SECS} to {MAX_USAGE_STEP_SECS}"
            ),
            "step",
        )
    };
    let step_secs = match step {
        None => MIN_USAGE_STEP_SECS,
        Some(raw) => raw.parse::<u32>().map_err(|_| step_rule())?,
    };
    if !(MIN_USAGE_STEP_SECS..=MAX_USAGE_STEP_SECS).contains(&step_secs) || step_secs % 60 != 0 {
        return Err(step_rule());
    }
    let from_at = instant(from, "from")?;
    let to = instant(to, "to")?.unwrap_or(now);
    let from = from_at.unwrap_or(to - TimeDelta::seconds(DEFAULT_USAGE_WINDOW_SECS));
    if to <= from {
        return Err(ApiError::unprocessable("to must be after from", "to"));
    }
    if to - from > TimeDelta::days(MAX_USAGE_WINDOW_DAYS) {
        return Err(ApiError::unprocessable(
            format!("from is more than {MAX_USAGE_WINDOW_DAYS} days before to"),
            "from",
        ));
    }
    Ok(Window {
        from,
        to,
        step_secs,
    })
}

fn filter<'a>(raw: Option<&'a str>, field: &str) -> Result<Option<&'a str>, ApiError> {
    match raw {
        Some(v) if v.is_empty() || v.chars().count() > MAX_USAGE_FILTER_CHARS => {
            Err(ApiError::unprocessable(
                format!("{field} has 1 to {MAX_USAGE_FILTER_CHARS} characters"),
                field,
            ))
        }
        other => Ok(other),
    }
}

/// Which rows a query reads.
#[derive(Debug, Default)]
struct Selection<'a> {
    lease: Option<Uuid>,
    node: Option<&'a str>,
    gpu: Option<&'a str>,
    tenant: Option<Uuid>,
}

#[derive(sqlx::FromRow)]
struct PointRow {
    lease_id: Uuid,
    gpu_uuid: String,
    at: DateTime<Utc>,
    tenant_id: Option<String>,
    node_id: String,
    gpu_index: i32,
    samples: i64,
    minutes: i64,
    utilization_samples: i64,
    utilization_pct_sum: i64,
    memory_used_mib_sum: i64,
    memory_used_mib_max: i64,
    temperature_c_max: Option<i32>,
    power_samples: i64,
    power_w_sum: f64,
}

impl PointRow {
    fn point(&self) -> UsagePoint {
        let avg = |sum: f64, n: i64| (n > 0).then(|| sum / n as f64);
        UsagePoint {
            at: self.at,
            samples: self.samples.max(0) as u64,
            minutes: u32::try_from(self.minutes.max(0)).unwrap_or(u32::MAX),
            utilization_pct_avg: avg(self.utilization_pct_sum as f64, self.utilization_samples),
            memory_used_mib_avg: avg(self.memory_used_mib_sum as f64, self.samples).unwrap_or(0.0),
            memory_used_mib_max: self.memory_used_mib_max.max(0) as u64,
            temperature_c_max: self.temperature_c_max.map(|t| t.max(0) as u32),
            power_w_avg: avg(self.power_w_sum, self.power_samples),
        }
    }
}

async fn report(
    ctx: &ApiContext,
    window: Window,
    selection: Selection<'_>,
) -> Result<UsageReport, ApiError> {
    // A year of minutes of a large fleet is a lot to sum: one answer gets a
    // bounded time of the database, so that a few such requests cannot
    // take it from every other caller.
    let mut tx = ctx.pool.begin().await?;
    sqlx::query(&format!(
        "SET LOCAL statement_timeout = {}",
        USAGE_QUERY_TIMEOUT_MILLIS
    ))
    .execute(&mut *tx)
    .await?;
    // A tenant's rows must belong to a lease the read model gives it: the
    // tenant a node named is not taken on trust.
    let rows: Result<Vec<PointRow>, sqlx::Error> = sqlx::query_as(
        "SELECT lease_id, gpu_uuid,
                to_timestamp((extract(epoch FROM minute)::bigint / $3) * $3) AS at,
                min(tenant_id::text) AS tenant_id, min(node_id) AS node_id,
                min(gpu_index) AS gpu_index,
                sum(samples)::bigint AS samples,
                count(*)::bigint AS minutes,
                sum(utilization_samples)::bigint AS utilization_samples,
                sum(utilization_pct_sum)::bigint AS utilization_pct_sum,
                sum(memory_used_mib_sum)::bigint AS memory_used_mib_sum,
                max(memory_used_mib_max) AS memory_used_mib_max,
                max(temperature_c_max) AS temperature_c_max,
                sum(power_samples)::bigint AS power_samples,
                sum(power_w_sum) AS power_w_sum
         FROM lease_usage_minutes
         WHERE minute >= $1 AND minute < $2
           AND ($4::uuid IS NULL OR lease_id = $4)
           AND ($5::text IS NULL OR node_id = $5)
           AND ($6::text IS NULL OR gpu_uuid = $6)
           AND ($7::uuid IS NULL OR (tenant_id = $7 AND EXISTS (
                 SELECT 1 FROM leases l WHERE l.id = lease_id AND l.tenant_id = $7)))
         GROUP BY lease_id, gpu_uuid, 3
         ORDER BY node_id, gpu_index, lease_id, gpu_uuid, at
         LIMIT $8",
    )
    .bind(window.from)
    .bind(window.to)
    .bind(i64::from(window.step_secs))
    .bind(selection.lease)
    .bind(selection.node)
    .bind(selection.gpu)
    .bind(selection.tenant)
    .bind(MAX_USAGE_POINTS as i64 + 1)
    .fetch_all(&mut *tx)
    .await;
    let rows = match rows {
        // 57014: cancelled by the statement timeout.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("57014") => {
            return Err(ApiError::unprocessable(
                format!(
                    "summing this window took longer than {USAGE_QUERY_TIMEOUT_MILLIS} ms; \
                     ask for a shorter window, a coarser step, or one node or GPU"
                ),
                "step",
            ));
        }
        other => other?,
    };
    tx.commit().await?;
    if rows.len() > MAX_USAGE_POINTS {
        return Err(ApiError::unprocessable(
            format!(
                "more than {MAX_USAGE_POINTS} points; ask for a coarser step or a shorter window"
            ),
            "step",
        ));
    }
    // Rows come in series order already; the map keeps it.
    let mut series: BTreeMap<(String, i32, Uuid, String), UsageSeries> = BTreeMap::new();
    for row in &rows {
        let key = (
            row.node_id.clone(),
            row.gpu_index,
            row.lease_id,
            row.gpu_uuid.clone(),
        );
        series
            .entry(key)
            .or_insert_with(|| UsageSeries {
                lease_id: row.lease_id,
                tenant_id: row.tenant_id.as_deref().and_then(|t| t.parse().ok()),
                node_id: row.node_id.clone(),
                gpu_index: row.gpu_index.max(0) as u32,
                gpu_uuid: row.gpu_uuid.clone(),
                points: Vec::new(),
            })
            .points
            .push(row.point());
    }
    Ok(UsageReport {
        from: window.from,
        to: window.to,
        step_seconds: window.step_secs,
        series: series.into_values().collect(),
    })
}

#[utoipa::path(
    get, path = "/v1/usage", params(UsageQuery),
    responses(
        (status = 200, body = UsageReport, description = "usage per lease and GPU, one point per step with samples"),
        (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "A tenant named another tenant"),
        (status = 422, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn fleet(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<UsageReport>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let window = window(
        query.from.as_deref(),
        query.to.as_deref(),
        query.step.as_deref(),
        Utc::now(),
    )?;
    let asked = query
        .tenant
        .as_deref()
        .map(|t| {
            t.parse::<Uuid>().map_err(|_| {
                ApiError::unprocessable("tenant must be a tenant id (a UUID)", "tenant")
            })
        })
        .transpose()?;
    let tenant = match (&caller, asked) {
        (Caller::Tenant { id, .. }, Some(asked)) if asked != *id => {
            return Err(ApiError::forbidden("a tenant reads its own usage only").field("tenant"))
        }
        (Caller::Tenant { id, .. }, _) => Some(*id),
        (Caller::Operator(_), asked) => asked,
    };
    let selection = Selection {
        lease: None,
        node: filter(query.node.as_deref(), "node")?,
        gpu: filter(query.gpu.as_deref(), "gpu")?,
        tenant,
    };
    Ok(Json(report(&ctx, window, selection).await?))
}

#[utoipa::path(
    get, path = "/v1/leases/{id}/usage", params(("id" = String, Path, description = "Lease id"), LeaseUsageQuery),
    responses(
        (status = 200, body = UsageReport, description = "the lease's usage per GPU, one point per step with samples"),
        (status = 401, body = super::Problem), (status = 404, body = super::Problem),
        (status = 422, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn lease(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<LeaseUsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<UsageReport>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let lease_id = super::leases::parse_id(&id)?;
    // Another tenant's lease is not found, so that its existence is not
    // told; a lease just requested is waited for.
    let lease = super::leases::visible(&ctx, &caller, lease_id).await?;
    let tenant = match &caller {
        Caller::Tenant { .. } => Some(lease.view.tenant_id),
        Caller::Operator(_) => None,
    };
    let window = window(
        query.from.as_deref(),
        query.to.as_deref(),
        query.step.as_deref(),
        Utc::now(),
    )?;
    let selection = Selection {
        lease: Some(lease_id),
        tenant,
        ..Default::default()
    };
    Ok(Json(report(&ctx, window, selection).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn field_of(r: Result<Window, ApiError>) -> String {
        let e = r.expect_err("refused");
        assert_eq!(e.status, axum::http::StatusCode::UNPROCESSABLE_ENTITY);
        e.field.unwrap()
    }

    #[test]
    fn the_window_defaults_to_the_last_hour_by_the_minute() {
        let now = t("2026-12-04T10:30:00Z");
        assert_eq!(
            window(None, None, None, now).unwrap(),
            Window {
                from: t("2026-12-04T09:30:00Z"),
                to: now,
                step_secs: 60
            }
        );
        let w = window(
            Some("2026-12-03T00:00:00Z"),
            Some("2026-12-04T00:00:00+00:00"),
            Some("3600"),
            now,
        )
        .unwrap();
        assert_eq!(
            (w.from, w.to, w.step_secs),
            (t("2026-12-03T00:00:00Z"), t("2026-12-04T00:00:00Z"), 3600)
        );
        // Only `to`: the hour before it.
        let w = window(None, Some("2026-12-01T12:00:00Z"), None, now).unwrap();
        assert_eq!(w.from, t("2026-12-01T11:00:00Z"));
    }

    #[test]
    fn bad_values_name_their_field() {
        let now = t("2026-12-04T10:30:00Z");
        for step in ["0", "30", "90", "86460", "-60", "1m", ""] {
            assert_eq!(
                field_of(window(None, None, Some(step), now)),
                "step",
                "{step}"
            );
        }
        assert_eq!(field_of(window(Some("yesterday"), None, None, now)), "from");
        assert_eq!(
            field_of(window(None, Some("2026-13-01T00:00:00Z"), None, now)),
            "to"
        );
        let to = Some("2026-12-04T00:00:00Z");
        assert_eq!(field_of(window(to, to, None, now)), "to");
        assert_eq!(
            field_of(window(Some("2025-10-29T23:59:00Z"), to, Some("86400"), now)),
            "from"
        );
        // 400 days to the minute is allowed.
        assert!(window(Some("2025-10-30T00:00:00Z"), to, Some("86400"), now).is_ok());
        assert_eq!(
            field_of(filter(Some(""), "node").map(|_| window(None, None, None, now).unwrap())),
            "node"
        );
    }
}
