//! `lh billing what-if`: a past month priced again on a price book read
//! from a file. The gateway gives pricing minutes to answer, so this
//! request waits longer than the others, and a problem in the book is
//! named by its place in the file.

use std::time::Duration;

use lh_rpc::http::billing::WhatIf;

use crate::args::BillingCommand;
use crate::client::Gateway;
use crate::error::{CliError, EXIT_OK};
use crate::output::{emit, write_out, Out};
use crate::render;

use super::body::read_json_file;

/// How long `billing what-if` waits for its answer: the gateway gives
/// pricing two minutes to read the month.
pub const WHAT_IF_REQUEST_TIMEOUT: Duration = Duration::from_secs(150);

/// Runs one `lh billing` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: BillingCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        BillingCommand::WhatIf(w) => {
            let body = WhatIf {
                period: w.period.clone(),
                book: read_json_file(
                    &w.book,
                    "a price book, a JSON object: {\"version\"?, \"tiers\": [...]}",
                )?,
            };
            let report = gw
                .post_slow(
                    &["v1", "billing", "what-if"],
                    &body,
                    WHAT_IF_REQUEST_TIMEOUT,
                )
                .await
                .map_err(|e| match e {
                    // A field of the book is one of the file's.
                    CliError::Api(mut p)
                        if p.field.as_deref().is_some_and(|f| f.starts_with("book.")) =>
                    {
                        p.field = p
                            .field
                            .map(|f| format!("{} in {}", &f["book.".len()..], w.book.display()));
                        CliError::Api(p)
                    }
                    other => other,
                })?;
            if w.csv {
                write_out(out, &render::what_if_csv(&report))?;
            } else {
                emit(out, json, &report, render::what_if)?;
            }
            Ok(EXIT_OK)
        }
    }
}
