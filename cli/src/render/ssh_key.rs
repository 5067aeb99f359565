//! A tenant's SSH public keys: one as added, or all of them.

use serde_json::Value;

use super::table::{finish, key_values, table, text};

/// One key, as the gateway answered its addition.
pub(crate) fn ssh_key_view(key: &Value) -> String {
    key_values(vec![
        ("id", text(key, "id")),
        ("name", text(key, "name")),
        ("fingerprint", text(key, "fingerprint")),
        ("public key", text(key, "public_key")),
        ("added", text(key, "created_at")),
    ])
}

/// A tenant's keys, one a row.
pub(crate) fn ssh_key_list(keys: &Value) -> String {
    let mut t = table();
    t.set_header(["ID", "NAME", "FINGERPRINT", "ADDED"]);
    for key in keys
        .get("ssh_keys")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        t.add_row([
            text(key, "id"),
            text(key, "name"),
            text(key, "fingerprint"),
            text(key, "created_at"),
        ]);
    }
    finish(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_key_list_shows_ids_names_and_fingerprints() {
        let out = ssh_key_list(&json!({"ssh_keys": [{
            "id": "0190d1c4-7f3a-7000-8000-000000000001", "name": "laptop",
            "fingerprint": "SHA256:+GpunoeWB/eVazFjMdgTnUH4DQSLzW4wBKBHfA3xRbg",
            "public_key": "ssh-ed25519 AAAA", "created_at": "2026-12-07T10:00:00Z"
        }]}));
        let mut lines = out.lines();
        let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(header, ["ID", "NAME", "FINGERPRINT", "ADDED"]);
        let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(
            row,
            [
                "0190d1c4-7f3a-7000-8000-000000000001",
                "laptop",
                "SHA256:+GpunoeWB/eVazFjMdgTnUH4DQSLzW4wBKBHfA3xRbg",
                "2026-12-07T10:00:00Z"
            ]
        );
        assert!(!out.contains("AAAA"), "the list leaves the key itself out");
    }
}
