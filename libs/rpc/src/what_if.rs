//! What-if billing: a past month's charges priced again on another price
//! book, per tenant. Pricing answers it on [`RPC_PRICING_WHAT_IF`] from its
//! charges (`lh_pricing::what_if` says what is re-rated and what is left
//! as billed); the gateway serves it to admins at `POST /v1/billing/what-if`
//! and `lh billing what-if` prints it.

use std::time::Duration;

use lh_bus::Bus;
use lh_domain::rating::BookError;
use lh_events::PriceBookPublished;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

pub use lh_events::subject::RPC_PRICING_WHAT_IF;

/// How long a caller waits for a what-if, in seconds: pricing reads every
/// charge of the month, which for a large fleet takes far longer than an
/// ordinary call.
pub const WHAT_IF_TIMEOUT_SECS: u64 = 120;
/// [`WHAT_IF_TIMEOUT_SECS`] as a duration.
pub const WHAT_IF_TIMEOUT: Duration = Duration::from_secs(WHAT_IF_TIMEOUT_SECS);
/// Most tenants one report holds: the reply is one NATS message (1 MiB at
/// most), and a tenant's row is about 160 bytes of JSON.
pub const MAX_WHAT_IF_TENANTS: usize = 5_000;
/// Most charges one what-if reads (a month of a large fleet: 10,000
/// leases running all month are 7.2 million hourly charges).
pub const MAX_WHAT_IF_CHARGES: u64 = 50_000_000;
/// The version a what-if book without one is shown with: a draft that was
/// never published.
pub const DRAFT_BOOK_VERSION: u32 = 0;

/// Request on [`RPC_PRICING_WHAT_IF`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhatIfRequest {
    /// The other book. Only its prices count: its version is a label
    /// ([`DRAFT_BOOK_VERSION`] for a draft) and its `effective_from` is
    /// ignored, every charge of the month is priced on it.
    pub book: PriceBookPublished,
    /// `YYYY-MM`.
    pub period: String,
}

/// One tenant's month, as billed and as the other book would have billed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantDifference {
    pub tenant_id: Uuid,
    /// Charges of the month re-rated.
    pub charges: u64,
    /// What the month's charges add up to, CNY.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "1200.00")]
    pub current_cny: Decimal,
    /// What they add up to on the other book, CNY.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "1320.00")]
    pub what_if_cny: Decimal,
    /// `what_if_cny - current_cny`: positive, the tenant would pay more.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "120.00")]
    pub difference_cny: Decimal,
}

impl TenantDifference {
    /// A tenant with no charges yet.
    pub fn new(tenant_id: Uuid) -> Self {
        Self {
            tenant_id,
            charges: 0,
            current_cny: Decimal::new(0, 2),
            what_if_cny: Decimal::new(0, 2),
            difference_cny: Decimal::new(0, 2),
        }
    }
}

/// A month on another book: every tenant charged in it, by tenant id, and
/// the totals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WhatIfReport {
    #[schema(example = "2026-11")]
    pub period: String,
    /// The other book's version ([`DRAFT_BOOK_VERSION`] for a draft).
    pub book_version: u32,
    pub tenants: Vec<TenantDifference>,
    /// Charges re-rated, all tenants.
    pub charges: u64,
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "1200.00")]
    pub current_cny: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "1320.00")]
    pub what_if_cny: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "120.00")]
    pub difference_cny: Decimal,
}

impl WhatIfReport {
    /// The report of `tenants`, with their totals.
    pub fn new(period: String, book_version: u32, tenants: Vec<TenantDifference>) -> Self {
        let mut total = TenantDifference::new(Uuid::nil());
        for t in &tenants {
            total.charges += t.charges;
            total.current_cny += t.current_cny;
            total.what_if_cny += t.what_if_cny;
        }
        Self {
            period,
            book_version,
            tenants,
            charges: total.charges,
            current_cny: total.current_cny,
            what_if_cny: total.what_if_cny,
            difference_cny: total.what_if_cny - total.current_cny,
        }
    }
}

/// What became of a [`WhatIfRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum WhatIfReply {
    Report(WhatIfReport),
    /// The book or the period cannot be used; `field` is a path into the
    /// request (`book.tiers[1].model.steps`, `period`).
    Refused {
        field: String,
        detail: String,
    },
}

/// Checks a what-if book as a book to publish would be, but for its
/// version: a draft that was never published ([`DRAFT_BOOK_VERSION`]) may
/// be tried too. The field named is a path into the book.
pub fn check_book(book: &PriceBookPublished) -> Result<(), BookError> {
    if book.version == DRAFT_BOOK_VERSION {
        let labelled = PriceBookPublished {
            version: DRAFT_BOOK_VERSION + 1,
            ..book.clone()
        };
        return lh_domain::rating::validate_book(&labelled);
    }
    lh_domain::rating::validate_book(book)
}

/// Asks pricing for a what-if; it may take up to [`WHAT_IF_TIMEOUT`].
pub async fn call(
    bus: &Bus,
    request: &WhatIfRequest,
    timeout: Duration,
) -> lh_bus::Result<WhatIfReply> {
    lh_bus::rpc::call(bus, RPC_PRICING_WHAT_IF, request, timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tenant: u128, current: &str, what_if: &str) -> TenantDifference {
        let (current, what_if): (Decimal, Decimal) =
            (current.parse().unwrap(), what_if.parse().unwrap());
        TenantDifference {
            tenant_id: Uuid::from_u128(tenant),
            charges: 3,
            current_cny: current,
            what_if_cny: what_if,
            difference_cny: what_if - current,
        }
    }

    #[test]
    fn the_report_totals_its_tenants_and_travels_as_strings() {
        let report = WhatIfReport::new(
            "2026-11".into(),
            7,
            vec![row(1, "10.00", "12.50"), row(2, "5.00", "4.00")],
        );
        assert_eq!(report.charges, 6);
        assert_eq!(report.current_cny.to_string(), "15.00");
        assert_eq!(report.what_if_cny.to_string(), "16.50");
        assert_eq!(report.difference_cny.to_string(), "1.50");
        let json = serde_json::to_value(WhatIfReply::Report(report.clone())).unwrap();
        assert_eq!(json["outcome"], "report");
        assert_eq!(json["difference_cny"], "1.50");
        assert_eq!(json["tenants"][1]["difference_cny"], "-1.00");
        let back: WhatIfReply = serde_json::from_value(json).unwrap();
        assert_eq!(back, WhatIfReply::Report(report));
        // No tenant: zeros with the two places money has.
        let empty = WhatIfReport::new("2026-11".into(), 7, Vec::new());
        assert_eq!(empty.difference_cny.to_string(), "0.00");
    }

    #[test]
    fn a_draft_book_may_have_no_version_but_must_be_valid() {
        let mut book = lh_domain::rating::default_price_book(chrono::Utc::now());
        book.version = DRAFT_BOOK_VERSION;
        assert!(check_book(&book).is_ok());
        book.tiers[0].price_cny_per_gb_hour = Decimal::from(-1);
        assert_eq!(
            check_book(&book).unwrap_err().field,
            "tiers[0].price_cny_per_gb_hour"
        );
    }
}
