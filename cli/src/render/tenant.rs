//! A tenant: created (with its API key, shown once, and how to use it
//! safely), read, suspended or resumed.

use serde_json::Value;

use super::table::{finish, key_values, present, table, text, NONE};

/// A new tenant, with its API key and how to use it.
pub(crate) fn tenant_created(tenant: &Value) -> String {
    let max_gpus = tenant
        .get("quota")
        .map_or_else(|| NONE.to_string(), |q| text(q, "max_gpus"));
    let mut rows = vec![("id", text(tenant, "id")), ("name", text(tenant, "name"))];
    if present(tenant, "email") {
        rows.push(("email", text(tenant, "email")));
    }
    rows.push(("max gpus", max_gpus));
    rows.push(("api key", text(tenant, "api_key")));
    let mut out = key_values(rows);
    if let Some(key) = tenant.get("api_key").and_then(Value::as_str) {
        out.push_str("\nThe API key is shown only this once. To use it:\n");
        out.push_str(&format!("  export LH_API_KEY={}\n", shell_quote(key)));
        out.push_str("or keep it in a file (mode 0600) and pass --api-key-file PATH.\n");
    }
    out
}

/// A tenant as the gateway shows it.
pub(crate) fn tenant_view(tenant: &Value) -> String {
    let mut rows = vec![
        ("id", text(tenant, "id")),
        ("name", text(tenant, "name")),
        ("email", text(tenant, "email")),
        ("erased", text(tenant, "erased")),
        ("max gpus", text(tenant, "max_gpus")),
        ("max vram gb", text(tenant, "max_vram_gb")),
        ("max storage gb", text(tenant, "max_storage_gb")),
        ("weight", text(tenant, "weight")),
        ("suspended", text(tenant, "suspended")),
    ];
    if present(tenant, "suspended_reason") {
        rows.push(("reason", text(tenant, "suspended_reason")));
    }
    key_values(rows)
}

/// A page of tenants, one a row, and how to ask for the next.
pub(crate) fn tenant_list(page: &Value) -> String {
    let mut t = table();
    t.set_header(vec![
        "TENANT",
        "NAME",
        "SUSPENDED",
        "MAX GPUS",
        "MAX VRAM GB",
        "MAX STORAGE GB",
        "WEIGHT",
        "CREATED",
    ]);
    let items = page.get("items").and_then(Value::as_array);
    for tenant in items.into_iter().flatten() {
        t.add_row(vec![
            text(tenant, "id"),
            text(tenant, "name"),
            text(tenant, "suspended"),
            text(tenant, "max_gpus"),
            text(tenant, "max_vram_gb"),
            text(tenant, "max_storage_gb"),
            text(tenant, "weight"),
            text(tenant, "created_at"),
        ]);
    }
    let mut out = finish(t);
    if let Some(next) = page.get("next_after").and_then(Value::as_str) {
        out.push_str(&format!("\nmore: lh tenant ls --after {next}\n"));
    }
    out
}

/// A tenant after a suspension or resumption, and the leases it stopped.
pub(crate) fn tenant_changed(changed: &Value) -> String {
    let mut out = tenant_view(changed.get("tenant").unwrap_or(&Value::Null));
    let stopping = changed
        .get("leases_stopping")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if stopping > 0 {
        out.push_str(&format!("{stopping} lease(s) asked to stop\n"));
    }
    out
}

/// Quotes a value for a POSIX shell when it has anything but safe characters.
fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/+=@%,".contains(c));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::test_rows::value_of;
    use serde_json::json;

    #[test]
    fn tenant_table_and_hint() {
        let out = tenant_created(&json!({
            "id": "0193b7e2-0000-7000-8000-0000000000aa",
            "api_key": "lh_live_abc123",
            "name": "acme",
            "quota": {"max_gpus": 8}
        }));
        assert_eq!(
            value_of(&out, "id").as_deref(),
            Some("0193b7e2-0000-7000-8000-0000000000aa")
        );
        assert_eq!(value_of(&out, "api key").as_deref(), Some("lh_live_abc123"));
        assert_eq!(value_of(&out, "max gpus").as_deref(), Some("8"));
        assert!(out.contains("export LH_API_KEY=lh_live_abc123\n"), "{out}");
    }

    #[test]
    fn tenant_list_a_row_each_and_the_next_page() {
        let out = tenant_list(&json!({
            "items": [
                {"id": "t1", "name": "acme", "suspended": false, "max_gpus": 8,
                 "weight": 1, "created_at": "2026-12-01T00:00:00Z"},
                {"id": "t2", "name": "globex", "suspended": true, "max_gpus": 2,
                 "max_storage_gb": 100, "weight": 3, "created_at": "2026-12-02T00:00:00Z"}
            ],
            "next_after": "t2"
        }));
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("TENANT"), "{out}");
        assert!(
            lines[1].contains("acme") && lines[1].contains("false"),
            "{out}"
        );
        assert!(
            lines[2].contains("globex") && lines[2].contains("100"),
            "{out}"
        );
        assert!(out.ends_with("more: lh tenant ls --after t2\n"), "{out}");
        let last = tenant_list(&json!({"items": []}));
        assert!(!last.contains("more:"), "{last}");
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("abc_1-2"), "abc_1-2");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$(rm)"), "'$(rm)'");
    }
}
