//! What every table and CSV of `lh` is made of: fields read leniently from
//! the gateway's JSON (a missing or oddly typed field shows as `-` instead
//! of failing; fields this CLI does not know are ignored), laid out as
//! borderless tables, or as CSV cells that cannot run as formulas.

use comfy_table::{presets, CellAlignment, Table};
use serde_json::Value;

/// Shown for a missing or null field.
pub(super) const NONE: &str = "-";

/// A field as text: strings as they are, numbers and booleans printed,
/// arrays joined with `,`, null or missing as `-`.
pub(super) fn text(v: &Value, key: &str) -> String {
    v.get(key).map_or_else(|| NONE.to_string(), scalar)
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => NONE.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => NONE.to_string(),
        Value::Array(items) => items.iter().map(scalar).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// Whether a field carries something worth a row (not missing, null or empty).
pub(super) fn present(v: &Value, key: &str) -> bool {
    match v.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

pub(super) fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING);
    t
}

/// Two-column `key  value` table with no header.
pub(super) fn key_values(rows: Vec<(&str, String)>) -> String {
    let mut t = table();
    for (k, v) in rows {
        t.add_row(vec![k.to_string(), v]);
    }
    finish(t)
}

/// Drops the padding comfy-table leaves at the ends of each line.
pub(super) fn finish(t: Table) -> String {
    let mut out = String::new();
    for line in t.lines() {
        let line = line.strip_prefix(' ').unwrap_or(&line);
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub(super) fn align_right(t: &mut Table, columns: &[usize]) {
    for &i in columns {
        if let Some(col) = t.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// A number with `places` decimals, or `-` when null or missing.
pub(super) fn decimals(v: &Value, key: &str, places: usize) -> String {
    v.get(key)
        .and_then(Value::as_f64)
        .map_or_else(|| NONE.to_string(), |n| format!("{n:.places$}"))
}

/// A CSV cell from the server's words that can neither break its row nor
/// run as a spreadsheet formula (a cell starting with `=`, `+`, `-`, `@`,
/// a tab or a carriage return); a number, or the lone dash of a missing
/// value, stays as it is.
pub(super) fn csv_cell(value: &str) -> String {
    let plain = value == NONE || value.parse::<f64>().is_ok_and(f64::is_finite);
    let defused = if !plain && value.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{value}")
    } else {
        value.to_string()
    };
    if defused.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", defused.replace('"', "\"\""))
    } else {
        defused
    }
}

pub(super) fn scalar_or_json(v: &Value) -> String {
    match v {
        Value::Object(_) => v.to_string(),
        _ => scalar(v),
    }
}
