//! A tenant's workspaces: all of them, one with its snapshots, a snapshot.

use serde_json::Value;

use super::data::bytes_text;
use super::table::{finish, key_values, table, text, NONE};

fn snapshots(workspace: &Value) -> &[Value] {
    workspace
        .get("snapshots")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn size(v: &Value) -> String {
    bytes_text(v.get("bytes").and_then(Value::as_u64).unwrap_or(0))
}

/// Who holds it: a lease that has not ended, else the last writer's state.
fn holder(workspace: &Value) -> String {
    match workspace.get("held_by").and_then(Value::as_str) {
        Some(lease) => format!("held by {lease}"),
        None if workspace.get("released").and_then(Value::as_bool) == Some(false) => {
            format!("{} (not released)", text(workspace, "lease_id"))
        }
        None => "free".to_string(),
    }
}

/// The tenant's workspaces, a row each.
pub(crate) fn workspace_list(list: &Value) -> String {
    let mut t = table();
    t.set_header(["NAME", "SIZE", "FILES", "SYNCED", "LEASE", "SNAPSHOTS"]);
    for workspace in list
        .get("workspaces")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        let dates: Vec<String> = snapshots(workspace)
            .iter()
            .map(|s| text(s, "date"))
            .collect();
        t.add_row([
            text(workspace, "name"),
            size(workspace),
            text(workspace, "files"),
            text(workspace, "synced_at"),
            holder(workspace),
            if dates.is_empty() {
                NONE.to_string()
            } else {
                dates.join(",")
            },
        ]);
    }
    finish(t)
}

/// One workspace, then its snapshots, newest first.
pub(crate) fn workspace_view(workspace: &Value) -> String {
    let mut out = key_values(vec![
        ("name", text(workspace, "name")),
        ("manifest", text(workspace, "manifest")),
        ("size", size(workspace)),
        ("files", text(workspace, "files")),
        ("synced", text(workspace, "synced_at")),
        ("lease", holder(workspace)),
        ("restored from", text(workspace, "restored_from")),
    ]);
    let mut t = table();
    t.set_header(["SNAPSHOT", "SIZE", "FILES", "MANIFEST"]);
    for s in snapshots(workspace) {
        t.add_row([
            text(s, "date"),
            size(s),
            text(s, "files"),
            text(s, "manifest"),
        ]);
    }
    out.push('\n');
    out.push_str(&finish(t));
    out
}

/// A snapshot just taken.
pub(crate) fn workspace_snapshot(snapshot: &Value) -> String {
    key_values(vec![
        ("snapshot", text(snapshot, "date")),
        ("manifest", text(snapshot, "manifest")),
        ("size", size(snapshot)),
        ("files", text(snapshot, "files")),
        ("taken", text(snapshot, "taken_at")),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_list_shows_each_workspace_with_its_snapshot_days() {
        let out = workspace_list(&json!({"workspaces": [{
        "name": "ckpt", "manifest": "aa", "bytes": 1536, "files": 2,
        "synced_at": "2026-12-07T10:00:00Z", "lease_id": "l1", "released": true,
        "held_by": "l2",
        "snapshots": [
            {"date": "2026-12-07", "manifest": "aa", "bytes": 1536, "files": 2, "taken_at": "x"},
            {"date": "2026-12-06", "manifest": "bb", "bytes": 1, "files": 1, "taken_at": "y"}
        ]}]}));
        let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            row,
            [
                "ckpt",
                "1.5",
                "KiB",
                "2",
                "2026-12-07T10:00:00Z",
                "held",
                "by",
                "l2",
                "2026-12-07,2026-12-06"
            ]
        );
        let free = workspace_list(&json!({"workspaces": [{"name": "w", "released": true}]}));
        assert!(free.contains("free"), "{free}");
    }
}
