//! `lh spot prices`: the spot market of each zone and GPU model, with a
//! short history, read from `/v1/spot/prices`.

use crate::args::SpotCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, Out};
use crate::render;

/// Runs one `lh spot` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: SpotCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        SpotCommand::Prices(p) => {
            let history = p.history.to_string();
            let mut query = vec![("history", history.as_str())];
            if let Some(zone) = &p.zone {
                query.push(("zone", zone.as_str()));
            }
            if let Some(model) = &p.gpu_model {
                query.push(("gpu_model", model.as_str()));
            }
            let prices = gw.get(&["v1", "spot", "prices"], &query).await?;
            emit(out, json, &prices, render::spot_prices)?;
            Ok(EXIT_OK)
        }
    }
}
