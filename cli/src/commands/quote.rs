//! `lh quote`: what a lease would cost for a duration on the current price
//! book. The duration is checked here, before anything is sent, because
//! the gateway takes it in seconds and the flag is in hours.

use lh_rpc::http::quotes::NewQuote;

use crate::args::QuoteCreate;
use crate::client::Gateway;
use crate::error::{CliError, EXIT_OK};
use crate::output::{emit, Out};
use crate::render;

use super::body::GpuFields;

/// Runs `lh quote`.
pub(crate) async fn run(
    gw: &Gateway,
    q: QuoteCreate,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    if !(q.hours > 0.0 && q.hours <= 366.0 * 24.0) {
        return Err(
            CliError::Usage("--hours must be above 0 and at most 8784 (366 days)".into()).into(),
        );
    }
    let GpuFields {
        gpus,
        gpu_fraction,
        mig_profile,
    } = GpuFields::from(&q.ask);
    let body = NewQuote {
        gpus,
        gpu_fraction,
        mig_profile,
        gpu_model: q.gpu_model,
        tier: q.tier,
        duration_seconds: (q.hours * 3600.0).round() as u64,
    };
    let quote = gw.post(&["v1", "quotes"], &body, &[]).await?;
    emit(out, json, &quote, render::quote)?;
    Ok(EXIT_OK)
}
