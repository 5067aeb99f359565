//! A node after an enrollment, a drain or an uncordon.

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

/// A node's enrollment as recorded.
pub(crate) fn node_enrollment(node: &Value) -> String {
    let list = |field: &str| {
        node[field]
            .as_array()
            .map(|v| {
                v.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let sharing = list("gpu_sharing");
    key_values(vec![
        ("node", text(node, "node_id")),
        ("zone", text(node, "zone")),
        ("max gpus", text(node, "max_gpus")),
        ("gpu models", list("gpu_models")),
        ("max isolation", text(node, "max_isolation")),
        (
            "gpu sharing",
            if sharing.is_empty() {
                "none".to_string()
            } else {
                sharing
            },
        ),
        ("sequence", text(node, "sequence")),
    ])
}
