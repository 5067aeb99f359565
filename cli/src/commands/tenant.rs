//! `lh tenant ...`: create, list, read, suspend, resume, erase a tenant and set
//! its quota; `lh tenant key ...` is handed to [`super::key`]. Each command
//! is one request to the gateway's `/v1/tenants`.

use lh_rpc::http::tenants::{ChangeQuota, CreateTenant, IdlePolicyBody, QuotaBody, SuspendTenant};

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
            let body = CreateTenant {
                name: t.name,
                email: t.email,
                quota: QuotaBody {
                    max_gpus: t.max_gpus,
                    max_vram_gb: None,
                    max_storage_gb: t.max_storage_gb,
                },
                weight: None,
                idle_policy: t.idle_window_secs.zip(t.idle_action).map(
                    |(window_seconds, action)| IdlePolicyBody {
                        window_seconds,
                        action,
                    },
                ),
                trusted: t.trusted,
            };
            let tenant = gw.post(&["v1", "tenants"], &body, &[]).await?;
            emit(out, json, &tenant, render::tenant_created)?;
            Ok(EXIT_OK)
        }
        TenantCommand::Ls(l) => {
            let limit = l.limit.map(|n| n.to_string());
            let mut query = Vec::new();
            if let Some(limit) = &limit {
                query.push(("limit", limit.as_str()));
            }
            if let Some(after) = &l.after {
                query.push(("after", after.as_str()));
            }
            let page = gw.get(&["v1", "tenants"], &query).await?;
            emit(out, json, &page, render::tenant_list)?;
            Ok(EXIT_OK)
        }
        TenantCommand::Get(t) => {
            let tenant = gw.get(&["v1", "tenants", &t.id], &[]).await?;
            emit(out, json, &tenant, render::tenant_view)?;
            Ok(EXIT_OK)
        }
        TenantCommand::Suspend(t) => {
            let body = SuspendTenant {
                reason: t.reason,
                stop_leases: t.stop_leases,
            };
            let changed = gw
                .post(&["v1", "tenants", &t.id, "suspend"], &body, &[])
                .await?;
            emit(out, json, &changed, render::tenant_changed)?;
            Ok(EXIT_OK)
        }
        TenantCommand::Resume(t) => {
            let changed = gw.post_empty(&["v1", "tenants", &t.id, "resume"]).await?;
            emit(out, json, &changed, render::tenant_changed)?;
            Ok(EXIT_OK)
        }
        TenantCommand::Erase(t) => {
            let tenant = gw.post_empty(&["v1", "tenants", &t.id, "erase"]).await?;
            emit(out, json, &tenant, render::tenant_view)?;
            Ok(EXIT_OK)
        }
        TenantCommand::SetQuota(q) => {
            let body = ChangeQuota {
                quota: QuotaBody {
                    max_gpus: q.max_gpus,
                    max_vram_gb: q.max_vram_gb,
                    max_storage_gb: q.max_storage_gb,
                },
                weight: q.weight,
            };
            let tenant = gw.put(&["v1", "tenants", &q.id, "quota"], &body).await?;
            emit(out, json, &tenant, render::tenant_view)?;
            Ok(EXIT_OK)
        }
        TenantCommand::Key(command) => key::run(gw, command, json, out).await,
    }
}
