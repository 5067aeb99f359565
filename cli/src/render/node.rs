//! A node after an enrollment, a drain or an uncordon; the fleet, one
//! node, and the catalogue of GPUs to rent.

use serde_json::Value;

use super::table::{align_right, finish, key_values, present, table, text, NONE};

fn list_of<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// `3 healthy, 1 unhealthy`: a node's GPUs by health.
fn health_counts(gpus: &[Value]) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for gpu in gpus {
        *counts.entry(text(gpu, "health")).or_default() += 1;
    }
    if counts.is_empty() {
        return NONE.to_string();
    }
    counts
        .iter()
        .map(|(health, n)| format!("{n} {health}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// GPUs held, whole or in part, of all: `2/8`.
fn in_use(gpus: &[Value]) -> String {
    let used = gpus
        .iter()
        .filter(|g| g.get("used_milli").and_then(Value::as_u64).unwrap_or(0) > 0)
        .count();
    format!("{used}/{}", gpus.len())
}

/// Where a node stands: `ready`, `draining (move)`, `lost`.
fn node_state(node: &Value) -> String {
    match node.get("drain_mode").and_then(Value::as_str) {
        Some(mode) => format!("{} ({mode})", text(node, "state")),
        None => text(node, "state"),
    }
}

/// The fleet, a node a row.
pub(crate) fn node_list(fleet: &Value) -> String {
    let mut t = table();
    t.set_header(vec![
        "NODE",
        "ZONE",
        "STATE",
        "GPUS USED",
        "HEALTH",
        "LAST HEARTBEAT",
    ]);
    for node in list_of(fleet, "nodes") {
        let gpus = list_of(node, "gpus");
        t.add_row(vec![
            text(node, "id"),
            text(node, "zone"),
            node_state(node),
            in_use(gpus),
            health_counts(gpus),
            text(node, "last_heartbeat_at"),
        ]);
    }
    finish(t)
}

/// One node, then its GPUs.
pub(crate) fn node_view(node: &Value) -> String {
    let mut rows = vec![
        ("node", text(node, "id")),
        ("zone", text(node, "zone")),
        ("state", node_state(node)),
        ("last heartbeat", text(node, "last_heartbeat_at")),
        ("isolation", text(node, "isolation")),
        ("gpu sharing", text(node, "gpu_sharing")),
    ];
    if present(node, "fabric") {
        rows.push(("fabric", text(node, "fabric")));
    }
    if present(node, "lost_since") {
        rows.push(("lost since", text(node, "lost_since")));
    }
    let mut t = table();
    t.set_header(vec![
        "GPU",
        "MODEL",
        "VRAM GB",
        "HEALTH",
        "MIG",
        "HELD",
        "BUSY",
        "MEMORY MIB",
        "TEMP C",
        "HELD BY",
    ]);
    for gpu in list_of(node, "gpus") {
        let holders: Vec<String> = match gpu.get("held_by").and_then(Value::as_str) {
            Some(lease) => vec![lease.to_string()],
            None => list_of(gpu, "shares")
                .iter()
                .map(|s| format!("{} ({}‰)", text(s, "lease_id"), text(s, "milli")))
                .collect(),
        };
        let used_milli = gpu.get("used_milli").and_then(Value::as_u64).unwrap_or(0);
        t.add_row(vec![
            text(gpu, "index"),
            text(gpu, "model"),
            text(gpu, "vram_gb"),
            text(gpu, "health"),
            text(gpu, "mig"),
            format!("{:.1} %", used_milli as f64 / 10.0),
            match gpu.get("utilization_pct").and_then(Value::as_u64) {
                Some(pct) => format!("{pct} %"),
                None => NONE.to_string(),
            },
            text(gpu, "memory_used_mib"),
            text(gpu, "temperature_c"),
            if holders.is_empty() {
                NONE.to_string()
            } else {
                holders.join(", ")
            },
        ]);
    }
    align_right(&mut t, &[0, 2, 5, 6, 7, 8]);
    format!("{}\n{}", key_values(rows), finish(t))
}

/// What may be rented now, a model and zone a row, with an hour's price
/// of one GPU on each tier.
pub(crate) fn gpu_catalogue(catalogue: &Value) -> String {
    let price = |offer: &Value, tier: &str| {
        list_of(offer, "prices")
            .iter()
            .find(|p| p.get("tier").and_then(Value::as_str) == Some(tier))
            .map_or(NONE.to_string(), |p| text(p, "cny_per_gpu_hour"))
    };
    let mut t = table();
    t.set_header(vec![
        "MODEL",
        "VRAM GB",
        "ZONE",
        "FREE",
        "IN SHARES",
        "MIG",
        "BASIC CNY/H",
        "PERFORMANCE CNY/H",
        "SPOT CNY/H",
    ]);
    for offer in list_of(catalogue, "offers") {
        let free_milli = offer.get("free_milli").and_then(Value::as_u64).unwrap_or(0);
        let spot = if present(offer, "spot_cny_per_gpu_hour") {
            text(offer, "spot_cny_per_gpu_hour")
        } else {
            price(offer, "spot")
        };
        t.add_row(vec![
            text(offer, "gpu_model"),
            text(offer, "vram_gb"),
            text(offer, "zone"),
            format!("{}/{}", text(offer, "gpus_free"), text(offer, "gpus_total")),
            format!("{:.2} GPUs", free_milli as f64 / 1000.0),
            text(offer, "mig_gpus"),
            price(offer, "basic"),
            price(offer, "performance"),
            spot,
        ]);
    }
    align_right(&mut t, &[1, 3, 4, 5, 6, 7, 8]);
    finish(t)
}

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
