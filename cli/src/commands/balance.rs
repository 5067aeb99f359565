//! `lh balance show | top-up`: a tenant's prepaid balance and the money
//! added to it, at `/v1/tenants/{id}/balance`.

use lh_rpc::http::balances::NewTopUp;

use crate::args::BalanceCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, Out};
use crate::render;

/// Runs one `lh balance` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: BalanceCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        BalanceCommand::Show(b) => {
            let balance = gw
                .get(&["v1", "tenants", &b.tenant, "balance"], &[])
                .await?;
            emit(out, json, &balance, render::balance)?;
            Ok(EXIT_OK)
        }
        BalanceCommand::TopUp(b) => {
            let body = NewTopUp { amount: b.amount };
            let path = ["v1", "tenants", &b.tenant, "balance", "top-ups"];
            let made = gw.post(&path, &body, &[]).await?;
            emit(out, json, &made, render::top_up)?;
            Ok(EXIT_OK)
        }
    }
}
