//! A month's charges, one line each, as pricing answers them on
//! [`CHARGES_SUBJECT`] (`GET /v1/charges`): a statement of what was charged,
//! not an invoice. It is shared with the gateway (which puts these types into
//! its OpenAPI document) and any client that wants to check its
//! [`ChargeStatement::content_hash`]. Issued invoices and notes are
//! [`crate::invoice_document`], which hash the same canonical JSON.
//!
//! Pricing computes the lines; this module only says what travels and how it
//! is hashed, so that a caller does not link pricing's SQL to read its charges.
//!
//! Money is [`Decimal`] carried as JSON strings (`"1.00"`), never floats.
//!
//! # Content hash
//!
//! `content_hash` is the lowercase hex SHA-256 of the *canonical JSON* of the
//! object `{"tenant_id", "period", "currency", "lines", "total"}` (every field
//! of the statement except `content_hash` itself), where canonical JSON is:
//!
//! * object keys sorted by their UTF-8 bytes, at every level;
//! * no whitespace at all;
//! * strings as `serde_json` writes them (only `"`, `\` and control
//!   characters escaped); integers in plain decimal; no floats ever occur;
//! * amounts and prices as decimal strings exactly as in the statement
//!   (`"1.00"`, `"0.5"`), ids as lowercase hyphenated UUIDs, instants as
//!   RFC 3339 UTC with `Z` and fractional seconds only when non-zero.
//!
//! The line order is part of the hash: lines are ordered by
//! (`from`, `lease_id`, charge id). See [`content_hash`] and
//! [`canonical_json`]; `docs/pricing.md` has a worked example.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::Bus;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;
use uuid::Uuid;

/// NATS request/reply subject on which pricing answers for a month's charges.
pub const CHARGES_SUBJECT: &str = lh_events::subject::RPC_PRICING_INVOICE;
/// The one error text for a malformed period.
pub const INVALID_PERIOD: &str = "period must be YYYY-MM";

/// Asks for one tenant's charges of one period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChargeStatementRequest {
    pub tenant_id: Uuid,
    /// UTC calendar month, `YYYY-MM`.
    #[schema(example = "2026-12")]
    pub period: String,
}

/// One charge: what one lease cost within the period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChargeLine {
    /// The lease; on a `storage` line, the tenant's storage id.
    pub lease_id: Uuid,
    /// `basic`, `spot`, `performance` or `reserved`; `storage` for the
    /// tenant's object storage (no GPUs, and its unit price per GB-month).
    #[schema(example = "basic")]
    pub tier: String,
    pub gpus: u32,
    /// VRAM of all the lease's GPUs together, in GB.
    pub vram_gb: u32,
    /// Whole seconds billed in this period (partial seconds round up).
    pub billed_seconds: u64,
    /// CNY per GB of VRAM per hour, as a decimal string; on a `storage`
    /// line, CNY per GB (10^9 bytes) per month of 730 hours.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "0.5")]
    pub unit_price: Decimal,
    /// Rounded to 2 places, half away from zero, as a decimal string.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "1.00")]
    pub amount: Decimal,
    /// Start of the billed interval (the node-agent's `started_at`, or the month start).
    pub from: DateTime<Utc>,
    /// End of the billed interval (the node-agent's `ended_at`, or the next month start).
    pub to: DateTime<Utc>,
    /// Version of the price book the charge used.
    pub price_book_version: u32,
}

/// A tenant's charges of one period, with their total and content hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChargeStatement {
    pub tenant_id: Uuid,
    #[schema(example = "2026-12")]
    pub period: String,
    #[schema(example = "CNY")]
    pub currency: String,
    /// Ordered by (`from`, `lease_id`, charge id).
    pub lines: Vec<ChargeLine>,
    /// Sum of the line amounts, 2 places, as a decimal string.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "1.00")]
    pub total: Decimal,
    /// Hex SHA-256 over the canonical JSON of every other field (module docs).
    pub content_hash: String,
}

impl ChargeStatement {
    /// A statement of `lines` (already in statement order) with its total and hash.
    pub fn new(tenant_id: Uuid, period: String, currency: String, lines: Vec<ChargeLine>) -> Self {
        let total = total_of(&lines);
        let mut statement = Self {
            tenant_id,
            period,
            currency,
            lines,
            total,
            content_hash: String::new(),
        };
        statement.content_hash = content_hash(&statement);
        statement
    }

    /// True when `total` and `content_hash` match the lines.
    pub fn verify(&self) -> bool {
        self.total == total_of(&self.lines)
            && self.total.to_string() == total_of(&self.lines).to_string()
            && self.content_hash == content_hash(self)
    }
}

/// Asks a running pricing service for one statement (what the gateway calls).
pub async fn call(
    bus: &Bus,
    request: &ChargeStatementRequest,
    timeout: Duration,
) -> lh_bus::Result<ChargeStatement> {
    lh_bus::rpc::call(bus, CHARGES_SUBJECT, request, timeout).await
}

/// Sum of the line amounts with exactly 2 decimal places.
pub fn total_of(lines: &[ChargeLine]) -> Decimal {
    let sum: Decimal = lines.iter().map(|l| l.amount).sum();
    lh_domain::rating::round_amount(sum)
}

/// The hash a statement carries (see the module docs).
pub fn content_hash(statement: &ChargeStatement) -> String {
    let mut value = serde_json::to_value(statement).expect("a statement serialises");
    if let serde_json::Value::Object(map) = &mut value {
        map.remove("content_hash");
    }
    hex::encode(Sha256::digest(canonical_json(&value).as_bytes()))
}

/// Compact JSON with object keys sorted at every level.
pub fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(key).expect("a string serialises"));
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&serde_json::to_string(scalar).expect("a scalar serialises")),
    }
}

/// Checks a `YYYY-MM` period (month 01–12); the error is [`INVALID_PERIOD`].
pub fn parse_period(period: &str) -> Result<(i32, u32), String> {
    let bytes = period.as_bytes();
    let shape_ok = bytes.len() == 7
        && bytes[4] == b'-'
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[5..].iter().all(u8::is_ascii_digit);
    if !shape_ok {
        return Err(INVALID_PERIOD.to_string());
    }
    let year: i32 = period[..4]
        .parse()
        .map_err(|_| INVALID_PERIOD.to_string())?;
    let month: u32 = period[5..]
        .parse()
        .map_err(|_| INVALID_PERIOD.to_string())?;
    if !(1..=12).contains(&month) {
        return Err(INVALID_PERIOD.to_string());
    }
    Ok((year, month))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn line(amount: &str) -> ChargeLine {
        let t0 = Utc.with_ymd_and_hms(2026, 12, 2, 10, 0, 0).unwrap();
        ChargeLine {
            lease_id: Uuid::nil(),
            tier: "basic".into(),
            gpus: 2,
            vram_gb: 80,
            billed_seconds: 90,
            unit_price: "0.5".parse().unwrap(),
            amount: amount.parse().unwrap(),
            from: t0,
            to: t0 + chrono::Duration::seconds(90),
            price_book_version: 1,
        }
    }

    #[test]
    fn periods_are_checked() {
        assert_eq!(parse_period("2026-12"), Ok((2026, 12)));
        for bad in [
            "2026-13",
            "2026-00",
            "2026-1",
            "26-12",
            "2026/12",
            "2026-12-01",
            "",
            "２０２６-12",
        ] {
            assert_eq!(parse_period(bad), Err(INVALID_PERIOD.to_string()), "{bad}");
        }
    }

    #[test]
    fn money_travels_as_strings_with_two_places() {
        let statement = ChargeStatement::new(
            Uuid::nil(),
            "2026-12".into(),
            "CNY".into(),
            vec![line("1.00"), line("0.25")],
        );
        let json = serde_json::to_value(&statement).unwrap();
        assert_eq!(json["total"], "1.25");
        assert_eq!(json["lines"][0]["amount"], "1.00");
        assert_eq!(json["lines"][0]["unit_price"], "0.5");
        assert_eq!(json["lines"][0]["from"], "2026-12-02T10:00:00Z");
        let empty = ChargeStatement::new(Uuid::nil(), "2026-12".into(), "CNY".into(), vec![]);
        assert_eq!(serde_json::to_value(&empty).unwrap()["total"], "0.00");
        let back: ChargeStatement = serde_json::from_value(json).unwrap();
        assert_eq!(back, statement);
        assert!(back.verify());
    }

    #[test]
    fn canonical_json_sorts_keys_and_has_no_whitespace() {
        let v = serde_json::json!({"b": [1, {"z": "x", "a": null}], "a": "é\""});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":"é\"","b":[1,{"a":null,"z":"x"}]}"#
        );
    }

    #[test]
    fn content_hash_covers_every_field_but_itself() {
        let statement = ChargeStatement::new(
            Uuid::nil(),
            "2026-12".into(),
            "CNY".into(),
            vec![line("1.00")],
        );
        // Pinned: a change here changes every statement's hash.
        let canonical = r#"{"currency":"CNY","lines":[{"amount":"1.00","billed_seconds":90,"from":"2026-12-02T10:00:00Z","gpus":2,"lease_id":"00000000-0000-0000-0000-000000000000","price_book_version":1,"tier":"basic","to":"2026-12-02T10:01:30Z","unit_price":"0.5","vram_gb":80}],"period":"2026-12","tenant_id":"00000000-0000-0000-0000-000000000000","total":"1.00"}"#;
        assert_eq!(
            statement.content_hash,
            hex::encode(Sha256::digest(canonical.as_bytes()))
        );
        // The worked example of docs/pricing.md.
        assert_eq!(
            statement.content_hash,
            "e3d8043964ad4a7e29136fd540b305986019693285b2152e0eaf062859ae9081"
        );
        let mut tampered = statement.clone();
        tampered.lines[0].billed_seconds = 91;
        assert!(!tampered.verify());
        let mut tampered = statement.clone();
        tampered.total = "1.0".parse().unwrap();
        assert!(!tampered.verify());
    }
}
