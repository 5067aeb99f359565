//! The spot markets and their recent prices.

use serde_json::Value;

use super::table::{align_right, table, text};

/// Spot markets: one row per (zone, model) with its current price and,
/// oldest first, the prices before it.
pub(crate) fn spot_prices(prices: &Value) -> String {
    let markets: &[Value] = prices
        .get("markets")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut t = table();
    t.set_header(vec![
        "ZONE", "REGION", "MODEL", "CNY/GB-H", "USED", "SINCE", "HISTORY",
    ]);
    for m in markets {
        let current = m.get("current").cloned().unwrap_or(Value::Null);
        let history: Vec<String> = m
            .get("history")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .map(|p| text(p, "price_cny_per_gb_hour"))
            .collect();
        t.add_row(vec![
            text(m, "zone"),
            text(m, "region"),
            text(m, "gpu_model"),
            text(&current, "price_cny_per_gb_hour"),
            format!("{}/{}", text(m, "gpus_used"), text(m, "gpus_total")),
            text(&current, "at"),
            history.join(" "),
        ]);
    }
    align_right(&mut t, &[3, 4]);
    format!("{t}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spot_price_table() {
        let out = spot_prices(&json!({"markets": [{
            "zone": "cn-north.1", "region": "cn-north", "gpu_model": "A100-40GB",
            "current": {"price_cny_per_gb_hour": "0.2", "utilisation": "0.5", "at": "2026-12-04T10:00:00Z"},
            "gpus_total": 4, "gpus_used": 2,
            "history": [
                {"price_cny_per_gb_hour": "0.1", "utilisation": "0", "at": "2026-12-04T09:00:00Z"},
                {"price_cny_per_gb_hour": "0.2", "utilisation": "0.5", "at": "2026-12-04T10:00:00Z"}
            ]
        }]}));
        let row: Vec<&str> = out
            .lines()
            .find(|l| l.contains("cn-north.1"))
            .unwrap_or_else(|| panic!("no market row in\n{out}"))
            .split_whitespace()
            .collect();
        assert_eq!(
            row,
            [
                "cn-north.1",
                "cn-north",
                "A100-40GB",
                "0.2",
                "2/4",
                "2026-12-04T10:00:00Z",
                "0.1",
                "0.2"
            ]
        );
    }
}
