//! `lh template ls`: the workload templates the gateway offers, read from
//! `/v1/templates`.

use crate::args::TemplateCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, Out};
use crate::render;

/// Runs one `lh template` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: TemplateCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        TemplateCommand::Ls => {
            let templates = gw.get(&["v1", "templates"], &[]).await?;
            emit(out, json, &templates, render::templates)?;
            Ok(EXIT_OK)
        }
    }
}
