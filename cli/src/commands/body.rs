//! Parts of request bodies that more than one command sends: what a lease
//! or a quote asks for, and a JSON document read from a file.

use serde_json::{json, Value};

use crate::args::GpuAskArgs;
use crate::error::CliError;

/// Largest JSON file a command sends: what the gateway takes as a body.
pub const MAX_JSON_FILE_BYTES: u64 = 64 * 1024;

/// A JSON file to send as a body, refused before anything is sent when it
/// is too large or not JSON.
pub(super) fn read_json_file(path: &std::path::Path) -> Result<Value, CliError> {
    let unreadable =
        |e: std::io::Error| CliError::Usage(format!("cannot read {}: {e}", path.display()));
    let size = std::fs::metadata(path).map_err(unreadable)?.len();
    if size > MAX_JSON_FILE_BYTES {
        return Err(CliError::Usage(format!(
            "{} is larger than {MAX_JSON_FILE_BYTES} bytes",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    serde_json::from_str(&text)
        .map_err(|e| CliError::Usage(format!("{} is not JSON: {e}", path.display())))
}

/// Puts what a request asks for (whole GPUs, a share or a MIG instance) in `body`.
pub(super) fn gpu_fields(body: &mut Value, ask: &GpuAskArgs) {
    match (ask.gpus, ask.milli, ask.vram_gb, &ask.mig) {
        (Some(gpus), _, _, _) => body["gpus"] = json!(gpus),
        (None, Some(milli), Some(vram_gb), _) => {
            body["gpu_fraction"] = json!({"milli": milli, "vram_gb": vram_gb})
        }
        (None, None, None, Some(profile)) => body["mig_profile"] = json!(profile),
        _ => unreachable!("clap requires --gpus, --milli with --vram-gb, or --mig"),
    }
}
