//! `lh report cost | daily`: a week's spending read from the gateway as a
//! table or CSV; the day of the fleet is drawn by [`crate::report`].

use crate::args::ReportCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, write_out, Out};
use crate::{render, report};

/// Runs one `lh report` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: ReportCommand,
    json: bool,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        ReportCommand::Cost(r) => {
            let mut query = vec![("week", r.week.as_str())];
            if let Some(tenant) = &r.tenant {
                query.push(("tenant_id", tenant.as_str()));
            }
            let report = gw.get(&["v1", "reports", "cost"], &query).await?;
            if r.csv {
                write_out(out, &render::cost_report_csv(&report))?;
            } else {
                emit(out, json, &report, render::cost_report)?;
            }
            Ok(EXIT_OK)
        }
        ReportCommand::Daily(d) => report::daily(gw, &d, json, out, err).await,
    }
}
