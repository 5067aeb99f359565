//! A lease, a page of leases, a lease's GPU usage.

use serde_json::Value;

use super::table::{align_right, decimals, finish, key_values, present, table, text};

/// The state column of a lease: `queued (#3)` while it waits in line.
fn state_summary(lease: &Value) -> String {
    let state = text(lease, "state");
    if present(lease, "queue_position") {
        format!("{state} (#{})", text(lease, "queue_position"))
    } else {
        state
    }
}

/// One lease, as a key/value table. Optional fields appear only when set.
pub(crate) fn lease_view(lease: &Value) -> String {
    let mut rows = vec![
        ("id", text(lease, "id")),
        ("tenant", text(lease, "tenant_id")),
        ("state", text(lease, "state")),
        ("gpus", text(lease, "gpus")),
        ("gpu model", text(lease, "gpu_model")),
        ("tier", text(lease, "tier")),
    ];
    let optional = [
        ("share", "gpu_fraction"),
        ("mig profile", "mig_profile"),
        ("mig instance", "mig_instance"),
        ("workload", "workload"),
        ("moved because", "last_migration_reason"),
        ("idle since", "idle_since"),
        ("suspended", "suspended_at"),
        ("queue position", "queue_position"),
        ("queued reason", "queued_reason"),
        ("rejected reason", "rejected_reason"),
        ("end reason", "end_reason"),
        ("failure", "failure"),
        ("node", "node_id"),
        ("zone", "zone"),
        ("gpu uuids", "gpu_uuids"),
        ("gpu indices", "gpu_indices"),
    ];
    // Named on a row of its own: `lh lease open` needs a template's lease.
    if let Some(workload) = lease.get("workload").filter(|w| present(w, "template")) {
        rows.push(("template", text(workload, "template")));
    }
    rows.extend(
        optional
            .iter()
            .filter(|(_, key)| present(lease, key))
            .map(|(label, key)| (*label, text(lease, key))),
    );
    // A lease across nodes: each member, its GPUs, and whether its part
    // has started.
    if let Some(members) = lease.get("members").and_then(|m| m.as_array()) {
        let parts: Vec<String> = members
            .iter()
            .map(|m| {
                let gpus: Vec<String> = m["gpu_indices"]
                    .as_array()
                    .map(|g| g.iter().map(|i| i.to_string()).collect())
                    .unwrap_or_default();
                let started = if m["started"] == true {
                    "started"
                } else {
                    "starting"
                };
                format!("{} (GPU {}, {started})", text(m, "node_id"), gpus.join(","))
            })
            .collect();
        if !parts.is_empty() {
            rows.push(("members", parts.join("; ")));
        }
    }
    // How to reach a running lease over SSH, and the key to expect.
    if let Some(ssh) = lease.get("ssh").filter(|s| s.is_object()) {
        rows.push(("ssh", text(ssh, "command")));
        rows.push(("ssh host key", text(ssh, "host_key_fingerprint")));
    }
    rows.push(("created", text(lease, "created_at")));
    for (label, key) in [
        ("placed", "placed_at"),
        ("started", "started_at"),
        ("ended", "ended_at"),
    ] {
        if present(lease, key) {
            rows.push((label, text(lease, key)));
        }
    }
    key_values(rows)
}

/// A page (or several) of leases, one row each.
pub(crate) fn lease_list(items: &[Value]) -> String {
    if items.is_empty() {
        return "no leases\n".to_string();
    }
    let mut t = table();
    t.set_header(vec![
        "ID", "STATE", "GPUS", "MODEL", "TIER", "NODE", "ZONE", "CREATED",
    ]);
    for lease in items {
        t.add_row(vec![
            text(lease, "id"),
            state_summary(lease),
            text(lease, "gpus"),
            text(lease, "gpu_model"),
            text(lease, "tier"),
            text(lease, "node_id"),
            text(lease, "zone"),
            text(lease, "created_at"),
        ]);
    }
    align_right(&mut t, &[2]);
    finish(t)
}

/// A lease's usage: per GPU, one row per step (time, samples, utilisation,
/// VRAM average and peak, hottest temperature, average power).
pub(crate) fn lease_usage(report: &Value) -> String {
    let series: &[Value] = report
        .get("series")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut out = format!(
        "from {} to {}, every {} s\n",
        text(report, "from"),
        text(report, "to"),
        text(report, "step_seconds")
    );
    if series.is_empty() {
        out.push_str("no usage in this window\n");
        return out;
    }
    for gpu in series {
        out.push_str(&format!(
            "\nGPU {} {} on {}\n",
            text(gpu, "gpu_index"),
            text(gpu, "gpu_uuid"),
            text(gpu, "node_id")
        ));
        let mut t = table();
        t.set_header(vec![
            "TIME",
            "SAMPLES",
            "UTIL %",
            "VRAM MIB AVG",
            "VRAM MIB MAX",
            "TEMP C MAX",
            "POWER W AVG",
        ]);
        for point in gpu
            .get("points")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice)
        {
            t.add_row(vec![
                text(point, "at"),
                text(point, "samples"),
                decimals(point, "utilization_pct_avg", 1),
                decimals(point, "memory_used_mib_avg", 0),
                text(point, "memory_used_mib_max"),
                text(point, "temperature_c_max"),
                decimals(point, "power_w_avg", 1),
            ]);
        }
        align_right(&mut t, &[1, 2, 3, 4, 5, 6]);
        out.push_str(&finish(t));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::test_rows::value_of;
    use serde_json::json;

    fn queued_lease() -> Value {
        json!({
            "id": "0193b7e2-0000-7000-8000-000000000001",
            "tenant_id": "0193b7e2-0000-7000-8000-0000000000aa",
            "state": "queued",
            "gpus": 2,
            "gpu_model": "H100-80G",
            "tier": "basic",
            "node_id": null,
            "zone": null,
            "gpu_uuids": [],
            "gpu_indices": [],
            "queued_reason": "no capacity",
            "queue_position": 3,
            "rejected_reason": null,
            "end_reason": null,
            "created_at": "2026-12-01T10:00:00Z",
            "placed_at": null,
            "started_at": null,
            "ended_at": null,
            "some_future_field": {"x": 1}
        })
    }

    fn running_lease() -> Value {
        json!({
            "id": "0193b7e2-0000-7000-8000-000000000002",
            "tenant_id": "0193b7e2-0000-7000-8000-0000000000aa",
            "state": "running",
            "gpus": 2,
            "gpu_model": "H100-80G",
            "tier": "spot",
            "node_id": "node-7",
            "zone": "cn-east-1a",
            "gpu_uuids": ["GPU-aaaa", "GPU-bbbb"],
            "gpu_indices": [0, 1],
            "queued_reason": null,
            "queue_position": null,
            "rejected_reason": null,
            "end_reason": null,
            "created_at": "2026-12-01T10:00:00Z",
            "placed_at": "2026-12-01T10:00:01Z",
            "started_at": "2026-12-01T10:00:03Z",
            "ended_at": null
        })
    }

    #[test]
    fn queued_lease_view() {
        let out = lease_view(&queued_lease());
        assert_eq!(
            value_of(&out, "id").as_deref(),
            Some("0193b7e2-0000-7000-8000-000000000001")
        );
        assert_eq!(value_of(&out, "state").as_deref(), Some("queued"));
        assert_eq!(value_of(&out, "gpus").as_deref(), Some("2"));
        assert_eq!(value_of(&out, "gpu model").as_deref(), Some("H100-80G"));
        assert_eq!(value_of(&out, "queue position").as_deref(), Some("3"));
        assert_eq!(
            value_of(&out, "queued reason").as_deref(),
            Some("no capacity")
        );
        assert_eq!(
            value_of(&out, "created").as_deref(),
            Some("2026-12-01T10:00:00Z")
        );
        // Unset optional fields are left out rather than shown empty.
        for absent in ["node", "zone", "gpu uuids", "placed", "ended", "end reason"] {
            assert_eq!(value_of(&out, absent), None, "{absent} in\n{out}");
        }
        assert!(!out.contains("some_future_field"));
    }

    #[test]
    fn running_lease_view() {
        let out = lease_view(&running_lease());
        assert_eq!(value_of(&out, "tier").as_deref(), Some("spot"));
        assert_eq!(value_of(&out, "node").as_deref(), Some("node-7"));
        assert_eq!(value_of(&out, "zone").as_deref(), Some("cn-east-1a"));
        assert_eq!(
            value_of(&out, "gpu uuids").as_deref(),
            Some("GPU-aaaa,GPU-bbbb")
        );
        assert_eq!(value_of(&out, "gpu indices").as_deref(), Some("0,1"));
        assert_eq!(
            value_of(&out, "started").as_deref(),
            Some("2026-12-01T10:00:03Z")
        );
        assert_eq!(value_of(&out, "queue position"), None);
    }

    #[test]
    fn a_template_s_lease_names_it() {
        let mut lease = running_lease();
        lease["workload"] = json!({"image": "localhost/leasehold/jupyter", "command": ["sh"],
            "template": "jupyter"});
        assert_eq!(
            value_of(&lease_view(&lease), "template").as_deref(),
            Some("jupyter")
        );
        assert_eq!(value_of(&lease_view(&running_lease()), "template"), None);
    }

    #[test]
    fn lease_view_survives_junk() {
        for junk in [json!({}), json!(null), json!([1, 2]), json!({"state": 5})] {
            let out = lease_view(&junk);
            assert_eq!(value_of(&out, "id").as_deref(), Some("-"));
        }
    }

    #[test]
    fn list_table() {
        let out = lease_list(&[queued_lease(), running_lease()]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(
            header,
            ["ID", "STATE", "GPUS", "MODEL", "TIER", "NODE", "ZONE", "CREATED"]
        );
        let first: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            first,
            [
                "0193b7e2-0000-7000-8000-000000000001",
                "queued",
                "(#3)",
                "2",
                "H100-80G",
                "basic",
                "-",
                "-",
                "2026-12-01T10:00:00Z"
            ]
        );
        let second: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(second[1], "running");
        assert_eq!(second[5], "node-7");
        assert_eq!(second[6], "cn-east-1a");
        assert_eq!(lease_list(&[]), "no leases\n");
    }
}
