//! Parts of request bodies that more than one command sends: what a lease
//! or a quote asks for, and a JSON document read from a file.

use lh_rpc::http::leases::FractionBody;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::args::GpuAskArgs;
use crate::error::CliError;

/// Largest JSON file a command sends: what the gateway takes as a body.
pub const MAX_JSON_FILE_BYTES: u64 = 64 * 1024;

/// A JSON file read as the body part `T`, refused before anything is sent
/// when it is too large, not JSON, or not `shape` (what the file should
/// hold, said in the error).
pub(super) fn read_json_file<T: DeserializeOwned>(
    path: &std::path::Path,
    shape: &str,
) -> Result<T, CliError> {
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
    let json: Value = serde_json::from_str(&text)
        .map_err(|e| CliError::Usage(format!("{} is not JSON: {e}", path.display())))?;
    T::deserialize(&json)
        .map_err(|e| CliError::Usage(format!("{} must hold {shape}: {e}", path.display())))
}

/// What a request asks for: whole GPUs, a share of one or a MIG instance,
/// as the bodies' `gpus`, `gpu_fraction` and `mig_profile` (one of them set).
pub(super) struct GpuFields {
    pub gpus: Option<u32>,
    pub gpu_fraction: Option<FractionBody>,
    pub mig_profile: Option<String>,
}

impl From<&GpuAskArgs> for GpuFields {
    fn from(ask: &GpuAskArgs) -> Self {
        let none = GpuFields {
            gpus: None,
            gpu_fraction: None,
            mig_profile: None,
        };
        match (ask.gpus, ask.milli, ask.vram_gb, &ask.mig) {
            (Some(gpus), _, _, _) => GpuFields {
                gpus: Some(gpus),
                ..none
            },
            (None, Some(milli), Some(vram_gb), _) => GpuFields {
                gpu_fraction: Some(FractionBody { milli, vram_gb }),
                ..none
            },
            (None, None, None, Some(profile)) => GpuFields {
                mig_profile: Some(profile.clone()),
                ..none
            },
            _ => unreachable!("clap requires --gpus, --milli with --vram-gb, or --mig"),
        }
    }
}
