//! `lh tenant ...`: create, read, suspend, resume, erase a tenant and set
//! its quota; `lh tenant key ...` is handed to [`super::key`]. Each command
//! is one request to the gateway's `/v1/tenants`.

use serde_json::json;

use crate::args::TenantCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, Out};
use crate::render;

use super::key;

/// Runs one `lh tenant` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: TenantCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        TenantCommand::Create(t) => {
            let mut body = json!({
                "name": t.name,
                "email": t.email,
                "quota": {"max_gpus": t.max_gpus},
            });
            if let (Some(window_s), Some(action)) = (t.idle_window_secs, t.idle_action) {
                body["idle_policy"] = json!({"window_s": window_s, "action": action.as_str()});
            }
            if t.trusted {
                body["trusted"] = json!(true);
            }
            let tenant = gw.post(&["v1", "tenants"], Some(&body), &[]).await?;
            emit(out, json, &tenant, render::tenant_created)?;
            Ok(EXIT_OK)
        }
        TenantCommand::Get(t) => {
            let tenant = gw.get(&["v1", "tenants", &t.id], &[]).await?;
            emit(out, json, &tenant, render::tenant_view)?;
            Ok(EXIT_OK)
        }
        TenantCommand::Suspend(t) => {
            let mut body = json!({"stop_leases": t.stop_leases});
            if let Some(reason) = &t.reason {
                body["reason"] = json!(reason);
            }
            let changed = gw
                .post(&["v1", "tenants", &t.id, "suspend"], Some(&body), &[])
                .await?;
            emit(out, json, &changed, render::tenant_changed)?;
            Ok(EXIT_OK)
        }
        TenantCommand::Resume(t) => {
            let changed = gw
                .post(&["v1", "tenants", &t.id, "resume"], None, &[])
                .await?;
            emit(out, json, &changed, render::tenant_changed)?;
            Ok(EXIT_OK)
        }
        TenantCommand::Erase(t) => {
            let tenant = gw
                .post(&["v1", "tenants", &t.id, "erase"], None, &[])
                .await?;
            emit(out, json, &tenant, render::tenant_view)?;
            Ok(EXIT_OK)
        }
        TenantCommand::SetQuota(q) => {
            let mut body = json!({"quota": {"max_gpus": q.max_gpus}});
            if let Some(vram) = q.max_vram_gb {
                body["quota"]["max_vram_gb"] = json!(vram);
            }
            if let Some(weight) = q.weight {
                body["weight"] = json!(weight);
            }
            let tenant = gw.put(&["v1", "tenants", &q.id, "quota"], &body).await?;
            emit(out, json, &tenant, render::tenant_view)?;
            Ok(EXIT_OK)
        }
        TenantCommand::Key(command) => key::run(gw, command, json, out).await,
    }
}
