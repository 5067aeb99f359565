//! A tenant's prepaid balance and a top-up of it.

use serde_json::Value;

use super::table::{key_values, text};

/// A tenant's prepaid balance.
pub(crate) fn balance(b: &Value) -> String {
    if b.get("prepaid").and_then(Value::as_bool) != Some(true) {
        return key_values(vec![
            ("tenant", text(b, "tenant_id")),
            (
                "billing",
                "postpaid (never topped up): invoiced, never stopped".into(),
            ),
        ]);
    }
    let covers = match b.get("covers_seconds").and_then(Value::as_u64) {
        Some(s) => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        None => "nothing running".into(),
    };
    key_values(vec![
        ("tenant", text(b, "tenant_id")),
        ("state", text(b, "state")),
        ("balance (CNY)", text(b, "balance")),
        ("topped up", text(b, "topped_up")),
        ("charged", text(b, "charged")),
        ("credited", text(b, "credited")),
        ("not yet charged", text(b, "unbilled")),
        ("burn rate (CNY/h)", text(b, "burn_rate_cny_per_hour")),
        ("lasts", covers),
    ])
}

/// A top-up as stored.
pub(crate) fn top_up(t: &Value) -> String {
    key_values(vec![
        ("top-up", text(t, "top_up_id")),
        ("tenant", text(t, "tenant_id")),
        (
            "amount",
            format!("{} {}", text(t, "amount"), text(t, "currency")),
        ),
    ])
}
