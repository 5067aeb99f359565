//! `lh invoice ls | show | export`: invoices and notes as the gateway keeps
//! them; `export` prints the gateway's CSV as it comes.

use crate::args::InvoiceCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, write_out, Out};
use crate::render;

/// Runs one `lh invoice` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: InvoiceCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        InvoiceCommand::Ls(l) => {
            let limit = l.limit.map(|n| n.to_string());
            let query: Vec<(&str, &str)> = [
                ("period", l.period.as_deref()),
                ("status", l.status.as_deref()),
                ("tenant_id", l.tenant.as_deref()),
                ("limit", limit.as_deref()),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect();
            let list = gw.get(&["v1", "invoices"], &query).await?;
            emit(out, json, &list, render::invoice_list)?;
            Ok(EXIT_OK)
        }
        InvoiceCommand::Show(i) => {
            let query: Vec<(&str, &str)> =
                i.tenant.iter().map(|t| ("tenant_id", t.as_str())).collect();
            let invoice = gw.get(&["v1", "invoices", i.target()], &query).await?;
            emit(out, json, &invoice, render::invoice)?;
            Ok(EXIT_OK)
        }
        InvoiceCommand::Export(i) => {
            let query: Vec<(&str, &str)> =
                i.tenant.iter().map(|t| ("tenant_id", t.as_str())).collect();
            let csv = gw
                .get_text(&["v1", "invoices", i.target(), "csv"], &query)
                .await?;
            write_out(out, &csv)?;
            Ok(EXIT_OK)
        }
    }
}
