//! `lh reservation ls | create`: GPUs committed to a tenant for a term; a
//! new reservation is shown in the same table as the list.

use serde_json::json;

use crate::args::ReservationCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, Out};
use crate::render;

/// Runs one `lh reservation` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: ReservationCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        ReservationCommand::Ls(r) => {
            let query: Vec<(&str, &str)> =
                r.tenant.iter().map(|t| ("tenant_id", t.as_str())).collect();
            let list = gw.get(&["v1", "reservations"], &query).await?;
            emit(out, json, &list, render::reservations)?;
            Ok(EXIT_OK)
        }
        ReservationCommand::Create(r) => {
            let mut body = json!({
                "tenant_id": r.tenant, "gpu_model": r.gpu_model, "zone": r.zone, "gpus": r.gpus
            });
            if let Some(days) = r.term_days {
                body["term_days"] = json!(days);
            }
            let made = gw.post(&["v1", "reservations"], Some(&body), &[]).await?;
            emit(
                out,
                json,
                &json!({"reservations": [made]}),
                render::reservations,
            )?;
            Ok(EXIT_OK)
        }
    }
}
