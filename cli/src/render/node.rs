//! A node after a drain or an uncordon.

use serde_json::Value;

use super::table::{key_values, present, text};

/// A node after a drain or an uncordon.
pub(crate) fn node_cordon(node: &Value) -> String {
    let mut rows = vec![
        ("node", text(node, "node_id")),
        ("cordoned", text(node, "cordoned")),
    ];
    if present(node, "drain") {
        rows.push(("drain", text(node, "drain")));
    }
    rows.push(("sequence", text(node, "sequence")));
    key_values(rows)
}
