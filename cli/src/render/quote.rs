//! A quote: what a lease would cost and until when the price holds.

use serde_json::Value;

use super::table::{key_values, text};

/// A quote: what the request costs and until when it may be used.
pub(crate) fn quote(q: &Value) -> String {
    let mut rows = vec![
        ("quote", text(q, "quote_id")),
        (
            "amount",
            format!("{} {}", text(q, "amount"), text(q, "currency")),
        ),
        ("per GB-hour", text(q, "unit_price_cny_per_gb_hour")),
        ("GB", text(q, "vram_gb")),
        ("seconds", text(q, "duration_seconds")),
        ("price book", format!("v{}", text(q, "price_book_version"))),
        ("valid until", text(q, "expires_at")),
    ];
    if q.get("price_moves").and_then(Value::as_bool) == Some(true) {
        rows.push((
            "note",
            "spot: the market price now; the lease is billed at the price of each moment".into(),
        ));
    }
    key_values(rows)
}
