//! The API key `lh` calls with. It comes from a file or the environment,
//! never from the command line, where `ps` and shell history would show it.

use crate::args::Cli;
use crate::error::CliError;

/// Largest key file read, in bytes.
pub const MAX_KEY_FILE_BYTES: u64 = 8 * 1024;

/// The key to call with: from the key file (`--api-key-file` or
/// `LH_API_KEY_FILE`) or `LH_API_KEY`, never from the command line.
pub(crate) fn api_key(cli: &Cli) -> Result<Option<String>, CliError> {
    if cli.api_key.is_some() {
        return Err(CliError::Usage(
            "--api-key is no longer accepted: a key on the command line shows in `ps` and \
             shell history. Set LH_API_KEY, or put the key in a file and pass \
             --api-key-file PATH (or set LH_API_KEY_FILE)"
                .into(),
        ));
    }
    let from_env = std::env::var("LH_API_KEY")
        .ok()
        .filter(|k| !k.trim().is_empty());
    let Some(path) = &cli.api_key_file else {
        return Ok(from_env);
    };
    if from_env.is_some() {
        return Err(CliError::Usage(
            "both LH_API_KEY and a key file (--api-key-file or LH_API_KEY_FILE) are set; \
             keep one"
                .into(),
        ));
    }
    let unreadable = |e: std::io::Error| {
        CliError::Usage(format!("cannot read the key file {}: {e}", path.display()))
    };
    let len = std::fs::metadata(path).map_err(unreadable)?.len();
    if len > MAX_KEY_FILE_BYTES {
        return Err(CliError::Usage(format!(
            "the key file {} is larger than {MAX_KEY_FILE_BYTES} bytes",
            path.display()
        )));
    }
    let key = std::fs::read_to_string(path).map_err(unreadable)?;
    let key = key.trim();
    if key.is_empty() {
        return Err(CliError::Usage(format!(
            "the key file {} is empty",
            path.display()
        )));
    }
    Ok(Some(key.to_string()))
}
