//! A tenant's API keys: a new one (its secret shown once), one, or all;
//! a listed key never shows its secret.

use serde_json::Value;

use super::table::{finish, key_values, table, text};

/// A newly issued key, with how to use it without putting it on a command line.
pub(crate) fn key_issued(key: &Value) -> String {
    let mut out = key_values(vec![
        ("key id", text(key, "key_id")),
        ("prefix", text(key, "prefix")),
        ("expires at", text(key, "expires_at")),
        ("api key", text(key, "api_key")),
    ]);
    if key.get("api_key").and_then(Value::as_str).is_some() {
        out.push_str("\nThe API key is shown only this once. Keep it in a file (mode 0600) and\n");
        out.push_str("pass --api-key-file PATH, or export LH_API_KEY.\n");
    }
    out
}

/// One key, never its secret.
pub(crate) fn key_view(key: &Value) -> String {
    key_values(vec![
        ("key id", text(key, "key_id")),
        ("prefix", text(key, "prefix")),
        ("state", text(key, "state")),
        ("created at", text(key, "created_at")),
        ("expires at", text(key, "expires_at")),
        ("revoked at", text(key, "revoked_at")),
    ])
}

/// A tenant's keys, one a row.
pub(crate) fn key_list(keys: &Value) -> String {
    let mut t = table();
    t.set_header(["KEY", "PREFIX", "STATE", "CREATED", "EXPIRES", "REVOKED"]);
    for key in keys
        .get("items")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        t.add_row([
            text(key, "key_id"),
            text(key, "prefix"),
            text(key, "state"),
            text(key, "created_at"),
            text(key, "expires_at"),
            text(key, "revoked_at"),
        ]);
    }
    finish(t)
}
