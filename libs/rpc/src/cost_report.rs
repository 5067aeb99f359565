//! A tenant's weekly cost review (the seed's spot-versus-reserved review):
//! what it spent per tier in an ISO week, what the same usage would have
//! cost at the on-demand (basic) price, and the saving. Pricing answers it
//! on [`SUBJECT`] from its charges; the gateway serves it at
//! `GET /v1/reports/cost`.
//!
//! A charge belongs to the week of its `from`. The same usage at the
//! on-demand price is `vram_gb × basic price × billed_seconds / 3600`, the
//! basic price of the price book version the charge used, exact, then
//! rounded to the fen per tier like every amount.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, TimeZone, Utc, Weekday};
use lh_bus::Bus;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Subject on which pricing answers cost reports.
pub const SUBJECT: &str = lh_events::subject::RPC_PRICING_COST_REPORT;
/// The one error text for a malformed week.
pub const INVALID_WEEK: &str = "week must be an ISO week, YYYY-Www (2026-W49)";

/// Checks an ISO week `YYYY-Www` and returns its first instant (Monday
/// 00:00 UTC) and the next week's.
pub fn parse_week(week: &str) -> Result<(DateTime<Utc>, DateTime<Utc>), String> {
    let bytes = week.as_bytes();
    let shape_ok = bytes.len() == 8
        && bytes[4] == b'-'
        && bytes[5] == b'W'
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[6..].iter().all(u8::is_ascii_digit);
    if !shape_ok {
        return Err(INVALID_WEEK.to_string());
    }
    let year: i32 = week[..4].parse().map_err(|_| INVALID_WEEK.to_string())?;
    let number: u32 = week[6..].parse().map_err(|_| INVALID_WEEK.to_string())?;
    let monday = NaiveDate::from_isoywd_opt(year, number, Weekday::Mon)
        .ok_or_else(|| INVALID_WEEK.to_string())?;
    let start = Utc.from_utc_datetime(&monday.and_hms_opt(0, 0, 0).expect("midnight"));
    Ok((start, start + chrono::Duration::weeks(1)))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostReportRequest {
    pub tenant_id: Uuid,
    /// `YYYY-Www`.
    pub week: String,
}

/// One tier's spend in the week.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TierCost {
    #[schema(example = "spot")]
    pub tier: String,
    pub charges: u64,
    pub billed_seconds: u64,
    /// What was charged.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "12.00")]
    pub spend: Decimal,
    /// The same usage at the on-demand (basic) price.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "30.00")]
    pub on_demand: Decimal,
    /// `on_demand − spend`.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "18.00")]
    pub saving: Decimal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CostReport {
    pub tenant_id: Uuid,
    #[schema(example = "2026-W49")]
    pub week: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub currency: String,
    /// By tier name.
    pub tiers: Vec<TierCost>,
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String)]
    pub spend: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String)]
    pub on_demand: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String)]
    pub saving: Decimal,
}

impl CostReport {
    /// The report of `tiers` (in any order), with its totals.
    pub fn new(
        tenant_id: Uuid,
        week: String,
        (from, to): (DateTime<Utc>, DateTime<Utc>),
        mut tiers: Vec<TierCost>,
    ) -> Self {
        tiers.sort_by(|a, b| a.tier.cmp(&b.tier));
        let spend = crate::invoice_document::money(tiers.iter().map(|t| t.spend).sum());
        let on_demand = crate::invoice_document::money(tiers.iter().map(|t| t.on_demand).sum());
        Self {
            tenant_id,
            week,
            from,
            to,
            currency: lh_domain::rating::CURRENCY.to_string(),
            tiers,
            spend,
            on_demand,
            saving: crate::invoice_document::money(on_demand - spend),
        }
    }
}

/// Asks a running pricing service for a cost report.
pub async fn call(
    bus: &Bus,
    request: &CostReportRequest,
    timeout: Duration,
) -> lh_bus::Result<CostReport> {
    lh_bus::rpc::call(bus, SUBJECT, request, timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_weeks_are_checked() {
        let (from, to) = parse_week("2026-W49").unwrap();
        assert_eq!(from.to_rfc3339(), "2026-11-30T00:00:00+00:00");
        assert_eq!(to.to_rfc3339(), "2026-12-07T00:00:00+00:00");
        // 2026 has 53 ISO weeks; 2027 has 52.
        assert!(parse_week("2026-W53").is_ok());
        for bad in [
            "2027-W53",
            "2026-W00",
            "2026-49",
            "2026-w49",
            "2026-W4",
            "",
            "2026-W499",
        ] {
            assert_eq!(parse_week(bad), Err(INVALID_WEEK.to_string()), "{bad}");
        }
    }

    #[test]
    fn totals_add_the_tiers() {
        let tier = |name: &str, spend: &str, on_demand: &str| TierCost {
            tier: name.into(),
            charges: 1,
            billed_seconds: 3600,
            spend: spend.parse().unwrap(),
            on_demand: on_demand.parse().unwrap(),
            saving: (on_demand.parse::<Decimal>().unwrap() - spend.parse::<Decimal>().unwrap()),
        };
        let report = CostReport::new(
            Uuid::nil(),
            "2026-W49".into(),
            parse_week("2026-W49").unwrap(),
            vec![
                tier("spot", "8.00", "20.00"),
                tier("basic", "20.00", "20.00"),
            ],
        );
        assert_eq!(report.tiers[0].tier, "basic");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            (&json["spend"], &json["on_demand"], &json["saving"]),
            (&"28.00".into(), &"40.00".into(), &"12.00".into())
        );
    }
}
