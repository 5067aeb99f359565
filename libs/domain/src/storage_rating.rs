//! What a tenant's object storage costs. Pure: what was held and when (the
//! gateway's measurements), the price books and where the period's charges
//! stand come in as arguments.
//!
//! # The rule
//!
//! * **Units.** A GB is 10^9 bytes (as object stores bill, and as
//!   `max_storage_gb` counts); a month is 730 hours, as cloud providers
//!   bill. A book's `storage_cny_per_gb_month` is what one GB held for 730
//!   hours costs; a book without one charges storage nothing.
//! * **What is held.** The bytes a measurement counted are held from it
//!   until the next measurement (or until the erasure deleted them). Time
//!   is counted exactly, to the microsecond the instants carry.
//! * **Which price.** At each instant, the book in force then: the newest
//!   version whose `effective_from` is not after it, else the oldest (the
//!   rule compute uses at a lease's start). A span is cut where a book
//!   takes effect and where a UTC month begins, so each charge has one
//!   book and one invoice period.
//! * **Cumulative cost.** Within a tenant's month, `P(t)` is the exact sum
//!   of bytes x seconds x CNY per GB-month up to `t` (products and sums
//!   only), and its cost is `C(t) = P(t) / (10^9 x 730 x 3600)`. `P` starts
//!   at 0 each month.
//! * **Charges.** A charge over `from..to` is `round(C(to)) - round(C(from))`
//!   with [`crate::rating::round_amount`] (fen, half away from zero): an
//!   hour of a few GB costs a fraction of a fen, and rounding each charge
//!   alone would bill nothing forever, while the month's charges add up to
//!   exactly `round(C)` of its end.

use chrono::{DateTime, Utc};
use lh_events::{derived_id, PriceBookPublished};
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::rating::{next_month_start, period_of, round_amount, AMOUNT_SCALE};

/// Bytes in a GB.
pub const BYTES_PER_GB: u64 = 1_000_000_000;
/// Hours in a billed month.
pub const HOURS_PER_MONTH: u64 = 730;

/// `P` per CNY: bytes per GB x seconds per month.
fn byte_seconds_per_gb_month() -> Decimal {
    Decimal::from(BYTES_PER_GB) * Decimal::from(HOURS_PER_MONTH * 3600)
}

/// Bytes held over `from..to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub bytes: u64,
}

/// Where a tenant's storage charges stand: the period of the last one and
/// `P` at its end.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Carried {
    pub period: String,
    pub priced_byte_seconds: Decimal,
}

/// One charge of held storage: one period, one book.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoragePiece {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub period: String,
    pub bytes: u64,
    pub price_book_version: u32,
    pub price_cny_per_gb_month: Decimal,
    /// `to - from` in whole seconds, rounded down (for reading only).
    pub billed_seconds: u64,
    /// `P(to)` within the period.
    pub priced_byte_seconds: Decimal,
    pub amount: Decimal,
}

/// Why held storage cannot be priced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageRatingError {
    #[error("no price book yet")]
    NoBook,
    #[error("the cost of {bytes} bytes over {from}..{to} overflows")]
    Overflow {
        bytes: u64,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    },
}

/// The book in force at `at` of `books` (sorted by version).
fn book_at(books: &[PriceBookPublished], at: DateTime<Utc>) -> Option<&PriceBookPublished> {
    books
        .iter()
        .rev()
        .find(|b| b.effective_from <= at)
        .or_else(|| books.first())
}

/// The charges of `held`, continuing from `carried` (the tenant's last
/// storage charge; `None` before its first), in time order. Nothing for an
/// empty span; a charge of 0.00 where the bytes or the price are 0.
pub fn price_held(
    books: &[PriceBookPublished],
    held: Held,
    carried: Option<&Carried>,
) -> Result<Vec<StoragePiece>, StorageRatingError> {
    if held.to <= held.from {
        return Ok(Vec::new());
    }
    if books.is_empty() {
        return Err(StorageRatingError::NoBook);
    }
    let mut cuts: Vec<DateTime<Utc>> = books
        .iter()
        .map(|b| b.effective_from)
        .filter(|at| held.from < *at && *at < held.to)
        .collect();
    let mut month = next_month_start(held.from);
    while month < held.to {
        cuts.push(month);
        month = next_month_start(month);
    }
    cuts.push(held.to);
    cuts.sort();
    cuts.dedup();
    let overflow = || StorageRatingError::Overflow {
        bytes: held.bytes,
        from: held.from,
        to: held.to,
    };
    let per_cny = byte_seconds_per_gb_month();
    let mut carried = carried.cloned().unwrap_or_default();
    let mut pieces = Vec::new();
    let mut from = held.from;
    for to in cuts {
        let book = book_at(books, from).ok_or(StorageRatingError::NoBook)?;
        let price = book.storage_cny_per_gb_month.unwrap_or(Decimal::ZERO);
        let period = period_of(from);
        let before = if carried.period == period {
            carried.priced_byte_seconds
        } else {
            Decimal::ZERO
        };
        let micros = (to - from).num_microseconds().ok_or_else(overflow)?;
        let seconds = Decimal::new(micros, 6);
        let after = Decimal::from(held.bytes)
            .checked_mul(seconds)
            .and_then(|p| p.checked_mul(price))
            .and_then(|p| p.checked_add(before))
            .ok_or_else(overflow)?;
        let mut amount = round_amount(after / per_cny) - round_amount(before / per_cny);
        amount.rescale(AMOUNT_SCALE);
        pieces.push(StoragePiece {
            from,
            to,
            period: period.clone(),
            bytes: held.bytes,
            price_book_version: book.version,
            price_cny_per_gb_month: price,
            billed_seconds: (micros / 1_000_000).max(0) as u64,
            priced_byte_seconds: after,
            amount,
        });
        carried = Carried {
            period,
            priced_byte_seconds: after,
        };
        from = to;
    }
    Ok(pieces)
}

/// The id of the storage charge of the tenant whose storage id is
/// `storage_id` that starts at `from`: its charges never overlap, so a
/// replay or a second replica derives the same one.
pub fn storage_charge_id(storage_id: Uuid, from: DateTime<Utc>) -> Uuid {
    derived_id(&[
        "charge.storage",
        &storage_id.to_string(),
        &from.timestamp_micros().to_string(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone};

    fn book(version: u32, from: DateTime<Utc>, price: Option<&str>) -> PriceBookPublished {
        PriceBookPublished {
            storage_cny_per_gb_month: price.map(|p| p.parse().unwrap()),
            version,
            ..crate::rating::default_price_book(from)
        }
    }

    fn t(day: u32, hour: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, day, hour, 0, 0).unwrap()
    }

    const GB: u64 = BYTES_PER_GB;

    #[test]
    fn a_gb_held_a_whole_month_costs_the_monthly_price() {
        let books = [book(1, t(1, 0), Some("0.12"))];
        let held = Held {
            from: t(1, 0),
            to: t(1, 0) + Duration::hours(730),
            bytes: 100 * GB,
        };
        // 730 hours from November 1st reach into December: two periods.
        let pieces = price_held(&books, held, None).unwrap();
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[0].period, "2026-11");
        assert_eq!(pieces[1].period, "2026-12");
        assert_eq!(
            pieces[0].to,
            Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()
        );
        // 100 GB for 720 h of 730: 12 x 720 / 730 = 11.8356… → 11.84;
        // and 100 GB for 10 h: 12 x 10 / 730 = 0.1643… → 0.16.
        assert_eq!(pieces[0].amount.to_string(), "11.84");
        assert_eq!(pieces[1].amount.to_string(), "0.16");
        assert_eq!(pieces[0].billed_seconds, 720 * 3600);
        // A second month starts its sum afresh.
        assert_eq!(
            pieces[1].priced_byte_seconds,
            Decimal::from(100 * GB) * Decimal::from(10 * 3600) * Decimal::new(12, 2)
        );
    }

    #[test]
    fn hours_too_small_for_a_fen_add_up_to_the_months_cost() {
        // 3 GB at 0.12: 0.000493… CNY an hour. Charged hour by hour, the
        // month's charges come to round(C) of the whole, not 0.
        let books = [book(1, t(1, 0), Some("0.12"))];
        let mut carried: Option<Carried> = None;
        let mut total = Decimal::ZERO;
        for h in 0..(30 * 24) {
            let from = t(1, 0) + Duration::hours(h);
            let pieces = price_held(
                &books,
                Held {
                    from,
                    to: from + Duration::hours(1),
                    bytes: 3 * GB,
                },
                carried.as_ref(),
            )
            .unwrap();
            assert_eq!(pieces.len(), 1);
            let p = &pieces[0];
            assert!(
                p.amount == Decimal::ZERO || p.amount == Decimal::new(1, 2),
                "{}",
                p.amount
            );
            total += p.amount;
            carried = Some(Carried {
                period: p.period.clone(),
                priced_byte_seconds: p.priced_byte_seconds,
            });
        }
        // 3 x 0.12 x 720 / 730 = 0.35506… → 0.36
        assert_eq!(total.to_string(), "0.36");
    }

    #[test]
    fn hours_between_measurements_are_counted_to_the_microsecond() {
        let books = [book(1, t(1, 0), Some("7.30"))];
        // 7.30 per GB-month is 0.01 per GB-hour: 1 GB for 90 minutes and
        // a microsecond costs 0.015… → 0.02.
        let from = t(2, 0);
        let pieces = price_held(
            &books,
            Held {
                from,
                to: from + Duration::minutes(90) + Duration::microseconds(1),
                bytes: GB,
            },
            None,
        )
        .unwrap();
        assert_eq!(pieces[0].amount.to_string(), "0.02");
        assert_eq!(pieces[0].billed_seconds, 5400);
        assert_eq!(
            pieces[0].priced_byte_seconds,
            Decimal::from(GB) * Decimal::new(5_400_000_001, 6) * Decimal::new(730, 2)
        );
        // Half a fen rounds away from zero: 1 GB for 30 minutes is 0.005.
        let half = price_held(
            &books,
            Held {
                from,
                to: from + Duration::minutes(30),
                bytes: GB,
            },
            None,
        )
        .unwrap();
        assert_eq!(half[0].amount.to_string(), "0.01");
    }

    #[test]
    fn a_new_book_takes_effect_within_a_span() {
        let books = [
            book(1, t(1, 0), Some("7.30")),
            book(2, t(2, 12), Some("14.60")),
        ];
        let pieces = price_held(
            &books,
            Held {
                from: t(2, 10),
                to: t(2, 14),
                bytes: 10 * GB,
            },
            None,
        )
        .unwrap();
        assert_eq!(pieces.len(), 2);
        assert_eq!((pieces[0].from, pieces[0].to), (t(2, 10), t(2, 12)));
        assert_eq!(pieces[0].price_book_version, 1);
        assert_eq!(pieces[1].price_book_version, 2);
        // 10 GB x 2 h x 0.01 = 0.20, then 10 GB x 2 h x 0.02 = 0.40.
        assert_eq!(pieces[0].amount.to_string(), "0.20");
        assert_eq!(pieces[1].amount.to_string(), "0.40");
        // The same month: the second continues the first's sum.
        assert!(pieces[1].priced_byte_seconds > pieces[0].priced_byte_seconds);
    }

    #[test]
    fn a_book_without_a_storage_price_or_an_empty_bucket_charges_nothing() {
        let books = [book(1, t(1, 0), None)];
        let held = Held {
            from: t(2, 0),
            to: t(3, 0),
            bytes: 1000 * GB,
        };
        let pieces = price_held(&books, held, None).unwrap();
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0].amount.to_string(), "0.00");
        assert_eq!(pieces[0].price_cny_per_gb_month, Decimal::ZERO);
        let zero = price_held(
            &[book(1, t(1, 0), Some("0.12"))],
            Held { bytes: 0, ..held },
            None,
        )
        .unwrap();
        assert_eq!(zero[0].amount.to_string(), "0.00");
        // Nothing at all for no time, and no book is waited for.
        assert!(price_held(
            &books,
            Held {
                to: held.from,
                ..held
            },
            None
        )
        .unwrap()
        .is_empty());
        assert_eq!(price_held(&[], held, None), Err(StorageRatingError::NoBook));
    }

    #[test]
    fn a_carried_sum_of_another_month_is_not_continued() {
        let books = [book(1, t(1, 0), Some("7.30"))];
        let carried = Carried {
            period: "2026-10".into(),
            priced_byte_seconds: Decimal::from(GB) * Decimal::from(1800) * Decimal::new(730, 2),
        };
        let pieces = price_held(
            &books,
            Held {
                from: t(2, 0),
                to: t(2, 0) + Duration::minutes(30),
                bytes: GB,
            },
            Some(&carried),
        )
        .unwrap();
        // Alone: 0.005 → 0.01; continuing October's 0.005 it would be 0.00.
        assert_eq!(pieces[0].amount.to_string(), "0.01");
        let same = Carried {
            period: "2026-11".into(),
            ..carried
        };
        let continued = price_held(
            &books,
            Held {
                from: t(2, 0),
                to: t(2, 0) + Duration::minutes(30),
                bytes: GB,
            },
            Some(&same),
        )
        .unwrap();
        assert_eq!(continued[0].amount.to_string(), "0.00");
    }

    #[test]
    fn the_default_book_prices_storage_and_a_negative_price_is_refused() {
        let book = crate::rating::default_price_book(t(1, 0));
        assert_eq!(
            book.storage_cny_per_gb_month,
            Some(crate::rating::DEFAULT_STORAGE_CNY_PER_GB_MONTH)
        );
        assert!(crate::rating::validate_book(&book).is_ok());
        let negative = PriceBookPublished {
            storage_cny_per_gb_month: Some(Decimal::new(-1, 2)),
            ..book
        };
        let e = crate::rating::validate_book(&negative).unwrap_err();
        assert_eq!(e.field, "storage_cny_per_gb_month");
    }

    #[test]
    fn ids_follow_the_start() {
        let id = Uuid::from_u128(1);
        assert_eq!(
            storage_charge_id(id, t(1, 0)),
            storage_charge_id(id, t(1, 0))
        );
        assert_ne!(
            storage_charge_id(id, t(1, 0)),
            storage_charge_id(id, t(1, 1))
        );
        assert_ne!(
            storage_charge_id(id, t(1, 0)),
            storage_charge_id(Uuid::from_u128(2), t(1, 0))
        );
    }
}
