//! The weekly cost report, as a table or as CSV; both show the same rows.

use serde_json::Value;

use super::table::{align_right, csv_cell, finish, key_values, table, text};

/// A weekly cost report: one row per tier and a total row.
pub(crate) fn cost_report(report: &Value) -> String {
    let mut out = key_values(vec![
        ("tenant", text(report, "tenant_id")),
        ("week", text(report, "week")),
        ("from", text(report, "from")),
        ("to", text(report, "to")),
    ]);
    let mut t = table();
    t.set_header(vec![
        "TIER",
        "CHARGES",
        "SECONDS",
        "SPEND",
        "ON DEMAND",
        "SAVING",
    ]);
    for row in cost_rows(report) {
        t.add_row(row);
    }
    align_right(&mut t, &[1, 2, 3, 4, 5]);
    out.push('\n');
    out.push_str(&finish(t));
    out.push_str(&format!("currency: {}\n", text(report, "currency")));
    out
}

/// A weekly cost report as CSV: a header, one row per tier, a total row.
pub(crate) fn cost_report_csv(report: &Value) -> String {
    let mut out =
        String::from("week,tier,charges,billed_seconds,spend,on_demand,saving,currency\n");
    let week = csv_cell(&text(report, "week"));
    let currency = csv_cell(&text(report, "currency"));
    for row in cost_rows(report) {
        let cells: Vec<String> = row.iter().map(|c| csv_cell(c)).collect();
        out.push_str(&format!("{week},{},{currency}\n", cells.join(",")));
    }
    out
}

fn cost_rows(report: &Value) -> Vec<Vec<String>> {
    let tiers: &[Value] = report
        .get("tiers")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut rows: Vec<Vec<String>> = tiers
        .iter()
        .map(|t| {
            [
                "tier",
                "charges",
                "billed_seconds",
                "spend",
                "on_demand",
                "saving",
            ]
            .iter()
            .map(|k| text(t, k))
            .collect()
        })
        .collect();
    let mut total = vec!["TOTAL".to_string(), String::new(), String::new()];
    total.extend(
        ["spend", "on_demand", "saving"]
            .iter()
            .map(|k| text(report, k)),
    );
    rows.push(total);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::test_rows::row_of;
    use serde_json::json;

    #[test]
    fn cost_report_table_and_csv() {
        let report = json!({
            "tenant_id": "T", "week": "2026-W49", "currency": "CNY",
            "from": "2026-11-30T00:00:00Z", "to": "2026-12-07T00:00:00Z",
            "tiers": [
                {"tier": "basic", "charges": 2, "billed_seconds": 7200,
                 "spend": "80.00", "on_demand": "80.00", "saving": "0.00"},
                {"tier": "spot", "charges": 1, "billed_seconds": 3600,
                 "spend": "16.00", "on_demand": "40.00", "saving": "24.00"}
            ],
            "spend": "96.00", "on_demand": "120.00", "saving": "24.00"
        });
        let out = cost_report(&report);
        let row = |p: &str| row_of(&out, p);
        assert_eq!(
            row("spot"),
            ["spot", "1", "3600", "16.00", "40.00", "24.00"]
        );
        assert_eq!(row("TOTAL"), ["TOTAL", "96.00", "120.00", "24.00"]);
        let csv = cost_report_csv(&report);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 4, "{csv}");
        assert_eq!(lines[2], "2026-W49,spot,1,3600,16.00,40.00,24.00,CNY");
        assert_eq!(lines[3], "2026-W49,TOTAL,,,96.00,120.00,24.00,CNY");
    }

    #[test]
    fn cost_report_csv_cells_cannot_run_as_formulas() {
        let report = json!({
            "week": "=HYPERLINK(\"x\")", "currency": "@SUM(A1)",
            "tiers": [
                {"tier": "-2+3,x", "charges": 1, "billed_seconds": 60,
                 "spend": "-1.50", "on_demand": "+cmd|' /C calc'!A0", "saving": "\t=1"}
            ],
            "spend": "-1.50", "on_demand": "0.00", "saving": "1.50"
        });
        let csv = cost_report_csv(&report);
        let row = csv.lines().nth(1).unwrap();
        assert_eq!(
            row,
            "\"'=HYPERLINK(\"\"x\"\")\",\"'-2+3,x\",1,60,-1.50,'+cmd|' /C calc'!A0,'\t=1,'@SUM(A1)"
        );
    }
}
