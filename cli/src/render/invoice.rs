//! Invoices and notes: one document with its lines, or a list of them.

use serde_json::Value;

use super::table::{align_right, finish, key_values, present, table, text, NONE};

/// A document's number, with which part it is when it was issued in
/// parts: `INV-000011 (part 2 of 3)`.
fn document_number(doc: &Value) -> String {
    let number = text(doc, "number");
    let of = |key: &str| doc.get(key).and_then(Value::as_u64).unwrap_or(1);
    match (of("part"), of("parts")) {
        (part, parts) if parts > 1 && present(doc, "number") => {
            format!("{number} (part {part} of {parts})")
        }
        _ => number,
    }
}

/// An invoice or note: a heading, one row per line and per credit, a
/// total row with the currency.
pub(crate) fn invoice(inv: &Value) -> String {
    let mut heading = vec![
        ("tenant", text(inv, "tenant_id")),
        ("period", text(inv, "period")),
    ];
    for (label, key) in [
        ("kind", "kind"),
        ("number", "number"),
        ("status", "status"),
        ("refers to", "refers_to_number"),
        ("issued at", "issued_at"),
    ] {
        if present(inv, key) {
            let value = if key == "number" {
                document_number(inv)
            } else {
                text(inv, key)
            };
            heading.push((label, value));
        }
    }
    let mut out = key_values(heading);
    let rows = |key: &str| -> Vec<Value> {
        inv.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut t = table();
    t.set_header(vec![
        "LEASE",
        "TIER",
        "FROM",
        "TO",
        "CHARGES",
        "SECONDS",
        "AMOUNT",
        "PRICE BOOK",
    ]);
    for line in rows("lines") {
        // A storage line names the tenant's storage, no lease.
        let lease = match text(&line, "tier").as_str() {
            "storage" => NONE.to_string(),
            _ => text(&line, "lease_id"),
        };
        t.add_row(vec![
            lease,
            text(&line, "tier"),
            text(&line, "from"),
            text(&line, "to"),
            text(&line, "charges"),
            text(&line, "billed_seconds"),
            text(&line, "amount"),
            if present(&line, "price_book_version") {
                format!("v{}", text(&line, "price_book_version"))
            } else {
                NONE.to_string()
            },
        ]);
    }
    for credit in rows("credits") {
        let mut row = vec![String::new(); 8];
        row[0] = format!("SLA credit {}", text(&credit, "period"));
        row[6] = text(&credit, "amount");
        t.add_row(row);
    }
    let currency = inv
        .get("currency")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut total = vec![String::new(); 8];
    total[0] = "TOTAL".to_string();
    total[6] = format!("{} {currency}", text(inv, "total"))
        .trim_end()
        .to_string();
    t.add_row(total);
    align_right(&mut t, &[4, 5, 6]);
    out.push('\n');
    out.push_str(&finish(t));
    if present(inv, "content_hash") {
        out.push('\n');
        out.push_str(&format!("content hash: {}\n", text(inv, "content_hash")));
    }
    out
}

/// Invoices and notes, one row each.
pub(crate) fn invoice_list(list: &Value) -> String {
    let items: &[Value] = list
        .get("invoices")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    if items.is_empty() {
        return "no invoices\n".to_string();
    }
    let mut t = table();
    t.set_header(vec![
        "ID", "NUMBER", "KIND", "STATUS", "PERIOD", "TENANT", "TOTAL", "ISSUED",
    ]);
    for doc in items {
        t.add_row(vec![
            text(doc, "id"),
            document_number(doc),
            text(doc, "kind"),
            text(doc, "status"),
            text(doc, "period"),
            text(doc, "tenant_id"),
            format!("{} {}", text(doc, "total"), text(doc, "currency")),
            text(doc, "issued_at"),
        ]);
    }
    align_right(&mut t, &[6]);
    finish(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::test_rows::value_of;
    use serde_json::json;

    fn sample_invoice() -> Value {
        json!({
            "id": "0193b7e2-0000-7000-8000-0000000000ff",
            "kind": "invoice",
            "status": "issued",
            "number": "INV-000007",
            "tenant_id": "0193b7e2-0000-7000-8000-0000000000aa",
            "period": "2026-12",
            "currency": "CNY",
            "issued_at": "2027-01-04T00:00:00Z",
            "lines": [
                {"lease_id": "L-1", "tier": "basic", "charges": 1,
                 "billed_seconds": 90, "amount": "1.00",
                 "from": "2026-12-01T10:00:00Z", "to": "2026-12-01T10:01:30Z",
                 "price_book_version": 1},
                {"lease_id": "L-2", "tier": "spot", "charges": 3,
                 "billed_seconds": 10800, "amount": "12.00",
                 "from": "2026-12-02T00:00:00Z", "to": "2026-12-02T03:00:00Z",
                 "price_book_version": 2}
            ],
            "credits": [{"credit_id": "C-1", "period": "2026-11", "amount": "-0.50"}],
            "total": "12.50",
            "content_hash": "ab12cd"
        })
    }

    #[test]
    fn invoice_table() {
        let out = invoice(&sample_invoice());
        assert_eq!(
            value_of(&out, "tenant").as_deref(),
            Some("0193b7e2-0000-7000-8000-0000000000aa")
        );
        assert_eq!(value_of(&out, "period").as_deref(), Some("2026-12"));
        assert_eq!(value_of(&out, "number").as_deref(), Some("INV-000007"));
        assert_eq!(value_of(&out, "status").as_deref(), Some("issued"));
        let line = |prefix: &str| -> Vec<String> {
            out.lines()
                .find(|l| l.trim_start().starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} row in\n{out}"))
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            line("LEASE"),
            ["LEASE", "TIER", "FROM", "TO", "CHARGES", "SECONDS", "AMOUNT", "PRICE", "BOOK"]
        );
        assert_eq!(
            line("L-1"),
            [
                "L-1",
                "basic",
                "2026-12-01T10:00:00Z",
                "2026-12-01T10:01:30Z",
                "1",
                "90",
                "1.00",
                "v1"
            ]
        );
        assert_eq!(line("L-2")[6], "12.00");
        assert_eq!(line("SLA credit"), ["SLA", "credit", "2026-11", "-0.50"]);
        assert_eq!(line("TOTAL"), ["TOTAL", "12.50", "CNY"]);
        assert!(out.contains("content hash: ab12cd"));
        let mut part = sample_invoice();
        part["part"] = 3.into();
        part["parts"] = 3.into();
        assert_eq!(
            value_of(&invoice(&part), "number").as_deref(),
            Some("INV-000007 (part 3 of 3)")
        );
    }

    #[test]
    fn invoice_list_rows() {
        let list = json!({"invoices": [
            {"id": "I-1", "number": "INV-000001", "kind": "invoice", "status": "issued",
             "period": "2026-11", "tenant_id": "T", "total": "3.00", "currency": "CNY",
             "issued_at": "2026-12-04T00:00:00Z"},
            {"id": "I-2", "number": null, "kind": "invoice", "status": "draft",
             "period": "2026-12", "tenant_id": "T", "total": "1.00", "currency": "CNY",
             "issued_at": null},
            {"id": "I-3", "number": "INV-000003", "kind": "invoice", "status": "issued",
             "period": "2026-10", "tenant_id": "T", "total": "9.00", "currency": "CNY",
             "issued_at": "2026-11-04T00:00:00Z", "part": 2, "parts": 3, "first_part_id": "I-0"}
        ]});
        let out = invoice_list(&list);
        let rows: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[1][..4], ["I-1", "INV-000001", "invoice", "issued"]);
        assert_eq!(rows[2][..4], ["I-2", "-", "invoice", "draft"]);
        assert_eq!(
            rows[3][..7],
            ["I-3", "INV-000003", "(part", "2", "of", "3)", "invoice"]
        );
        assert_eq!(invoice_list(&json!({"invoices": []})), "no invoices\n");
    }

    #[test]
    fn empty_invoice_still_has_total() {
        let out =
            invoice(&json!({"period": "2026-11", "currency": "CNY", "lines": [], "total": "0.00"}));
        let total = out
            .lines()
            .find(|l| l.trim_start().starts_with("TOTAL"))
            .unwrap();
        assert_eq!(
            total.split_whitespace().collect::<Vec<_>>(),
            ["TOTAL", "0.00", "CNY"]
        );
        assert!(!out.contains("content hash"));
    }
}
