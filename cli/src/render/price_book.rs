//! The price books: one row per version and tier, and one for storage.

use serde_json::Value;

use super::table::{finish, table, text};

/// One row per (version, tier): what each book charges.
pub(crate) fn price_books(list: &Value) -> String {
    let books: &[Value] = list
        .get("books")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut t = table();
    t.set_header(vec!["VERSION", "EFFECTIVE FROM", "TIER", "MODEL", "PRICE"]);
    for book in books {
        for tier in book
            .get("tiers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let model = tier.get("model");
            let kind = model.map_or("flat".to_string(), |m| text(m, "kind"));
            let price = match model.and_then(|m| m.get("steps")).and_then(Value::as_array) {
                Some(steps) => steps
                    .iter()
                    .map(|s| {
                        format!(
                            "{}h:{}",
                            text(s, "from_hour"),
                            text(s, "price_cny_per_gb_hour")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
                None => text(tier, "price_cny_per_gb_hour"),
            };
            t.add_row(vec![
                format!("v{}", text(book, "version")),
                text(book, "effective_from"),
                text(tier, "tier"),
                kind,
                price,
            ]);
        }
        // Storage is priced per GB-month, not per GB of VRAM: its own row.
        if book
            .get("storage_cny_per_gb_month")
            .is_some_and(|p| !p.is_null())
        {
            t.add_row(vec![
                format!("v{}", text(book, "version")),
                text(book, "effective_from"),
                "storage".to_string(),
                "per GB-month".to_string(),
                text(book, "storage_cny_per_gb_month"),
            ]);
        }
    }
    finish(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn storage_has_a_row_of_its_own_where_the_book_prices_it() {
        let out = price_books(&json!({"books": [
            {"version": 1, "effective_from": "2026-12-01T00:00:00Z",
             "tiers": [{"tier": "basic", "price_cny_per_gb_hour": "0.5"}],
             "storage_cny_per_gb_month": "0.12"},
            {"version": 2, "effective_from": "2026-12-02T00:00:00Z",
             "tiers": [{"tier": "basic", "price_cny_per_gb_hour": "0.6"}]}
        ]}));
        let rows: Vec<Vec<&str>> = out
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 3, "{out}");
        assert_eq!(rows[1][..3], ["v1", "2026-12-01T00:00:00Z", "storage"]);
        assert_eq!(rows[1].last(), Some(&"0.12"));
        assert!(
            rows[2].contains(&"v2") && !out.contains("v2 storage"),
            "{out}"
        );
    }
}
