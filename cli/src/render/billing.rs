//! A what-if of a price book on a past month, as a table or as CSV; both
//! show the same rows.

use serde_json::Value;

use super::table::{align_right, csv_cell, finish, key_values, table, text};

/// A what-if: the month and book, one row per tenant, a total row.
pub(crate) fn what_if(report: &Value) -> String {
    let mut out = key_values(vec![
        ("period", text(report, "period")),
        ("book", format!("v{}", text(report, "book_version"))),
    ]);
    let mut t = table();
    t.set_header(vec![
        "TENANT",
        "CHARGES",
        "CURRENT CNY",
        "WHAT-IF CNY",
        "DIFFERENCE CNY",
    ]);
    for row in what_if_rows(report) {
        t.add_row(row);
    }
    align_right(&mut t, &[1, 2, 3, 4]);
    out.push('\n');
    out.push_str(&finish(t));
    out
}

/// A what-if as CSV: a header, one row per tenant, a total row.
pub(crate) fn what_if_csv(report: &Value) -> String {
    let mut out = String::from("period,tenant_id,charges,current_cny,what_if_cny,difference_cny\n");
    let period = csv_cell(&text(report, "period"));
    for row in what_if_rows(report) {
        let cells: Vec<String> = row.iter().map(|c| csv_cell(c)).collect();
        out.push_str(&format!("{period},{}\n", cells.join(",")));
    }
    out
}

fn what_if_rows(report: &Value) -> Vec<Vec<String>> {
    const COLUMNS: [&str; 5] = [
        "tenant_id",
        "charges",
        "current_cny",
        "what_if_cny",
        "difference_cny",
    ];
    let tenants: &[Value] = report
        .get("tenants")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut rows: Vec<Vec<String>> = tenants
        .iter()
        .map(|t| COLUMNS.iter().map(|k| text(t, k)).collect())
        .collect();
    let mut total = vec!["TOTAL".to_string()];
    total.extend(COLUMNS[1..].iter().map(|k| text(report, k)));
    rows.push(total);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::test_rows::row_of;
    use serde_json::json;

    #[test]
    fn what_if_table_and_csv() {
        let report = json!({
            "period": "2026-11", "book_version": 0,
            "tenants": [
                {"tenant_id": "T-1", "charges": 5, "current_cny": "800.00",
                 "what_if_cny": "720.00", "difference_cny": "-80.00"},
                {"tenant_id": "T-2", "charges": 2, "current_cny": "40.00",
                 "what_if_cny": "48.00", "difference_cny": "8.00"}
            ],
            "charges": 7, "current_cny": "840.00", "what_if_cny": "768.00",
            "difference_cny": "-72.00"
        });
        let out = what_if(&report);
        let row = |p: &str| row_of(&out, p);
        assert_eq!(row("book"), ["book", "v0"]);
        assert_eq!(
            row("TENANT"),
            [
                "TENANT",
                "CHARGES",
                "CURRENT",
                "CNY",
                "WHAT-IF",
                "CNY",
                "DIFFERENCE",
                "CNY"
            ]
        );
        assert_eq!(row("T-1"), ["T-1", "5", "800.00", "720.00", "-80.00"]);
        assert_eq!(row("TOTAL"), ["TOTAL", "7", "840.00", "768.00", "-72.00"]);
        let csv = what_if_csv(&report);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines,
            [
                "period,tenant_id,charges,current_cny,what_if_cny,difference_cny",
                "2026-11,T-1,5,800.00,720.00,-80.00",
                "2026-11,T-2,2,40.00,48.00,8.00",
                "2026-11,TOTAL,7,840.00,768.00,-72.00",
            ]
        );
    }

    #[test]
    fn what_if_csv_cells_cannot_run_as_formulas() {
        let report = json!({
            "period": "=1+1",
            "tenants": [{"tenant_id": "@SUM(A1)", "charges": 1, "current_cny": "-1.50",
                         "what_if_cny": "+cmd|' /C calc'!A0", "difference_cny": "a,\"b"}],
            "charges": 1, "current_cny": "-1.50", "what_if_cny": "0.00", "difference_cny": "1.50"
        });
        let csv = what_if_csv(&report);
        assert_eq!(
            csv.lines().nth(1).unwrap(),
            "'=1+1,'@SUM(A1),1,-1.50,'+cmd|' /C calc'!A0,\"a,\"\"b\""
        );
    }
}
