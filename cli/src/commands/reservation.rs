//! `lh reservation ls | create`: GPUs committed to a tenant for a term; a
//! new reservation is shown in the same table as the list.

use lh_rpc::http::reservations::NewReservation;
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
            let body = NewReservation {
                tenant_id: r.tenant,
                gpu_model: r.gpu_model,
                zone: r.zone,
                gpus: r.gpus,
                term_days: r.term_days,
                starts_at: None,
            };
            let made = gw.post(&["v1", "reservations"], &body, &[]).await?;
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
