//! `lh tenant key ...`: issue, list and revoke a tenant's API keys, one
//! request each to `/v1/tenants/{id}/keys`.

use lh_rpc::http::keys::IssueKey;

use crate::args::KeyCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, Out};
use crate::render;

/// Runs one `lh tenant key` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: KeyCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        KeyCommand::Create(k) => {
            let body = IssueKey {
                expires_at: k.expires_at,
            };
            let key = gw
                .post(&["v1", "tenants", &k.id, "keys"], &body, &[])
                .await?;
            emit(out, json, &key, render::key_issued)?;
            Ok(EXIT_OK)
        }
        KeyCommand::Ls(t) => {
            let keys = gw.get(&["v1", "tenants", &t.id, "keys"], &[]).await?;
            emit(out, json, &keys, render::key_list)?;
            Ok(EXIT_OK)
        }
        KeyCommand::Revoke(k) => {
            let key = gw
                .delete(&["v1", "tenants", &k.id, "keys", &k.key_id.to_string()])
                .await?;
            emit(out, json, &key, render::key_view)?;
            Ok(EXIT_OK)
        }
    }
}
