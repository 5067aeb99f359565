//! A tenant's datasets: all of them, or one with its versions.

use serde_json::Value;

use super::table::{finish, key_values, table, text};

fn versions(dataset: &Value) -> &[Value] {
    dataset
        .get("versions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// Bytes as people read them: 1.5 GiB.
pub(crate) fn bytes_text(bytes: u64) -> String {
    const UNITS: &[&str] = &["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn size(version: &Value) -> String {
    bytes_text(version.get("bytes").and_then(Value::as_u64).unwrap_or(0))
}

/// The tenant's datasets, a row each with its newest version.
pub(crate) fn dataset_list(list: &Value) -> String {
    let mut t = table();
    t.set_header([
        "NAME",
        "NEWEST VERSION",
        "SIZE",
        "FILES",
        "VERSIONS",
        "ADDED",
    ]);
    for dataset in list
        .get("datasets")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        let all = versions(dataset);
        let newest = all.first().cloned().unwrap_or(Value::Null);
        t.add_row([
            text(dataset, "name"),
            text(&newest, "version"),
            size(&newest),
            text(&newest, "files"),
            all.len().to_string(),
            text(&newest, "created_at"),
        ]);
    }
    finish(t)
}

/// One dataset, a row a version, newest first.
pub(crate) fn dataset_view(dataset: &Value) -> String {
    let mut t = table();
    t.set_header(["NAME", "VERSION", "SIZE", "FILES", "ADDED"]);
    for version in versions(dataset) {
        t.add_row([
            text(dataset, "name"),
            text(version, "version"),
            size(version),
            text(version, "files"),
            text(version, "created_at"),
        ]);
    }
    finish(t)
}

/// The tenant's storage as last measured, against its quota.
pub(crate) fn storage_usage(usage: &Value) -> String {
    let bytes = usage.get("bytes").and_then(Value::as_u64).unwrap_or(0);
    let measured = match usage.get("measured_at").and_then(Value::as_str) {
        Some(at) => at.to_string(),
        None => "not yet".to_string(),
    };
    let quota = match usage.get("max_storage_gb").and_then(Value::as_u64) {
        Some(gb) => {
            let limit = gb.saturating_mul(1_000_000_000);
            let share = match limit {
                0 => String::new(),
                _ => format!(", {:.1} % used", bytes as f64 * 100.0 / limit as f64),
            };
            format!("{gb} GB ({limit} bytes){share}")
        }
        None => "none".to_string(),
    };
    let mut rows = vec![
        ("used", format!("{} ({bytes} bytes)", bytes_text(bytes))),
        ("measured at", measured),
        ("quota", quota),
    ];
    if usage.get("writes_stopped").and_then(Value::as_bool) == Some(true) {
        rows.push((
            "writes",
            "stopped: over the quota at the last measurement; delete data \
             (lh data rm, lh workspace rm) and writes come back at the next"
                .to_string(),
        ));
    }
    key_values(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_list_shows_each_dataset_with_its_newest_version() {
        let out = dataset_list(&json!({"datasets": [{"name": "mnist", "versions": [
            {"version": "bb", "bytes": 1610612736u64, "files": 4, "created_at": "2026-12-07T10:00:00Z"},
            {"version": "aa", "bytes": 1, "files": 1, "created_at": "2026-12-06T10:00:00Z"}
        ]}]}));
        let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            row,
            [
                "mnist",
                "bb",
                "1.5",
                "GiB",
                "4",
                "2",
                "2026-12-07T10:00:00Z"
            ]
        );
    }

    #[test]
    fn usage_shows_the_share_of_the_quota() {
        let out = storage_usage(&json!({"bytes": 2_500_000_000u64,
            "measured_at": "2026-12-07T10:00:00Z", "max_storage_gb": 10}));
        assert!(out.contains("2.3 GiB (2500000000 bytes)"), "{out}");
        assert!(
            out.contains("10 GB (10000000000 bytes), 25.0 % used"),
            "{out}"
        );
        let none = storage_usage(&json!({"bytes": 0, "measured_at": null, "max_storage_gb": null}));
        assert!(none.contains("not yet"), "{none}");
        assert!(none.contains("none"), "{none}");
    }

    #[test]
    fn sizes_read_as_people_say_them() {
        assert_eq!(bytes_text(0), "0 B");
        assert_eq!(bytes_text(1023), "1023 B");
        assert_eq!(bytes_text(1536), "1.5 KiB");
        assert_eq!(bytes_text(8 << 20), "8.0 MiB");
    }
}
