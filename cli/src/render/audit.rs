//! The audit chain check and the audit records, as a table or as CSV rows
//! for an export; table and CSV share one column order.

use serde_json::Value;

use super::table::{
    align_right, csv_cell, finish, key_values, present, scalar_or_json, table, text,
};

/// Columns of an audit record, in table and CSV order.
const AUDIT_RECORD_COLUMNS: [&str; 8] = [
    "sequence",
    "occurred_at",
    "actor",
    "event_type",
    "object",
    "outcome",
    "tenant_id",
    "subject",
];

/// A page of audit records, one row each, and the cursor of the next page.
pub(crate) fn audit_events(page: &Value) -> String {
    let items: &[Value] = page
        .get("events")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut out = if items.is_empty() {
        "no audit records\n".to_string()
    } else {
        let mut t = table();
        t.set_header(vec![
            "SEQ", "TIME", "ACTOR", "TYPE", "OBJECT", "OUTCOME", "TENANT", "SUBJECT",
        ]);
        for record in items {
            t.add_row(AUDIT_RECORD_COLUMNS.map(|c| text(record, c)).to_vec());
        }
        align_right(&mut t, &[0]);
        finish(t)
    };
    if present(page, "next") {
        out.push_str(&format!("next page: --after {}\n", text(page, "next")));
    }
    out
}

/// The header of an audit CSV export.
pub(crate) fn audit_csv_header() -> String {
    let mut header = AUDIT_RECORD_COLUMNS.join(",");
    header.push_str(",payload\n");
    header
}

/// One audit record as a CSV row: its columns, then its payload as JSON;
/// no cell can run as a spreadsheet formula.
pub(crate) fn audit_csv_row(record: &Value) -> String {
    let mut cells: Vec<String> = AUDIT_RECORD_COLUMNS
        .iter()
        .map(|c| csv_cell(&text(record, c)))
        .collect();
    let payload = record
        .get("payload")
        .map_or_else(String::new, Value::to_string);
    cells.push(csv_cell(&payload));
    let mut row = cells.join(",");
    row.push('\n');
    row
}

/// The audit check: `ok`, number of events, chain head, and any other field.
pub(crate) fn audit(report: &Value) -> String {
    let ok = report.get("ok").and_then(Value::as_bool) == Some(true);
    let mut rows = vec![
        ("ok", if ok { "yes" } else { "NO" }.to_string()),
        ("events", text(report, "events")),
        ("head", text(report, "head")),
    ];
    if let Some(obj) = report.as_object() {
        for (k, v) in obj {
            if !matches!(k.as_str(), "ok" | "events" | "head") {
                rows.push((k.as_str(), scalar_or_json(v)));
            }
        }
    }
    key_values(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::test_rows::value_of;
    use serde_json::json;

    #[test]
    fn audit_records_as_table_and_defused_csv() {
        let page = json!({"events": [{
            "sequence": 7, "occurred_at": "2026-12-01T00:00:00Z", "actor": "tenant:t1",
            "event_type": "lease.requested", "object": "lease.l1", "outcome": "success",
            "tenant_id": "t1", "subject": "lh.evt.lease.l1.requested.gateway",
            "payload": {"note": "=HYPERLINK(\"x\")"}
        }], "next": 7});
        let out = audit_events(&page);
        assert!(
            out.contains("lease.requested") && out.contains("tenant:t1"),
            "{out}"
        );
        assert!(out.contains("next page: --after 7"), "{out}");
        let row = audit_csv_row(&page["events"][0]);
        assert!(
            row.starts_with("7,2026-12-01T00:00:00Z,tenant:t1,lease.requested,"),
            "{row}"
        );
        assert!(
            row.ends_with("\"{\"\"note\"\":\"\"=HYPERLINK(\\\"\"x\\\"\")\"\"}\"\n"),
            "{row}"
        );
        assert!(audit_csv_header().ends_with(",subject,payload\n"));
        let formula = audit_csv_row(&json!({"sequence": 1, "actor": "=cmd|' /C calc'!A0"}));
        assert!(formula.contains("'=cmd"), "{formula}");
        assert_eq!(audit_events(&json!({"events": []})), "no audit records\n");
    }

    #[test]
    fn audit_table() {
        let out = audit(&json!({"ok": true, "events": 42, "head": "deadbeef"}));
        assert_eq!(value_of(&out, "ok").as_deref(), Some("yes"));
        assert_eq!(value_of(&out, "events").as_deref(), Some("42"));
        assert_eq!(value_of(&out, "head").as_deref(), Some("deadbeef"));
        let out = audit(&json!({"ok": false, "events": 7, "head": "00", "first_bad_seq": 5}));
        assert_eq!(value_of(&out, "ok").as_deref(), Some("NO"));
        assert_eq!(value_of(&out, "first_bad_seq").as_deref(), Some("5"));
        // Verified from an anchor once the log's oldest events expired.
        let out = audit(&json!({
            "ok": true, "events": 9, "head": "ab", "checked_from": 6,
            "anchor": {"sequence": 5, "events": 5, "head": "cd"}
        }));
        assert_eq!(value_of(&out, "checked_from").as_deref(), Some("6"));
        assert_eq!(
            value_of(&out, "anchor").as_deref(),
            Some(r#"{"events":5,"head":"cd","sequence":5}"#)
        );
        let out = audit(&json!({"ok": false, "events": 0, "head": "00", "problem": "no anchor"}));
        assert_eq!(value_of(&out, "ok").as_deref(), Some("NO"));
        assert_eq!(value_of(&out, "problem").as_deref(), Some("no anchor"));
    }
}
