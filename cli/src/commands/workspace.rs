//! `lh workspace ...`: a tenant's workspaces, as the gateway reads them
//! from the tenant's bucket (`/v1/workspaces`).

use lh_rpc::http::workspaces::RestoreWorkspace;
use serde_json::json;

use crate::args::WorkspaceCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, Out};
use crate::render;

/// Runs one `lh workspace` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: WorkspaceCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        WorkspaceCommand::Ls(ls) => {
            let mut query = Vec::new();
            if let Some(tenant) = &ls.tenant_id {
                query.push(("tenant_id", tenant.as_str()));
            }
            let list = gw.get(&["v1", "workspaces"], &query).await?;
            emit(out, json, &list, render::workspace_list)?;
        }
        WorkspaceCommand::Snapshot(w) => {
            let snapshot = gw
                .post_empty(&["v1", "workspaces", &w.name, "snapshots"])
                .await?;
            emit(out, json, &snapshot, render::workspace_snapshot)?;
        }
        WorkspaceCommand::Restore(r) => {
            let body = RestoreWorkspace {
                snapshot: r.snapshot.clone(),
            };
            let view = gw
                .post(&["v1", "workspaces", &r.name, "restore"], &body, &[])
                .await?;
            emit(out, json, &view, render::workspace_view)?;
        }
        WorkspaceCommand::Rm(w) => {
            gw.delete(&["v1", "workspaces", &w.name]).await?;
            emit(
                out,
                json,
                &json!({"workspace": w.name, "removed": true}),
                |a| {
                    format!(
                        "removed workspace {}\n",
                        a["workspace"].as_str().unwrap_or_default()
                    )
                },
            )?;
        }
    }
    Ok(EXIT_OK)
}
