//! `lh quote`: what a lease would cost for a duration on the current price
//! book. The duration is checked here, before anything is sent, because
//! the gateway takes it in seconds and the flag is in hours.

use serde_json::json;

use crate::args::QuoteCreate;
use crate::client::Gateway;
use crate::error::{CliError, EXIT_OK};
use crate::output::{emit, Out};
use crate::render;

use super::body::gpu_fields;

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
    let mut body = json!({
        "gpu_model": q.gpu_model,
        "tier": q.tier.as_str(),
        "duration_seconds": (q.hours * 3600.0).round() as u64,
    });
    gpu_fields(&mut body, &q.ask);
    let quote = gw.post(&["v1", "quotes"], Some(&body), &[]).await?;
    emit(out, json, &quote, render::quote)?;
    Ok(EXIT_OK)
}
