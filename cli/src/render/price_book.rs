//! The price books: one row per version and tier.

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
    }
    finish(t)
}
