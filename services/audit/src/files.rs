//! Writing the files a deployment trusts the service with: the signing seed,
//! the pinned public keys and the verify token.
//!
//! Each is made once and never rewritten, with its mode set as it is created
//! so that a secret is never briefly readable by others. Both the signing
//! key and `init-keys` write through here, which keeps storage below them.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;

/// Writes `text` to a file that must not exist yet, with `mode` from the
/// start (never briefly readable by others).
pub(crate) fn write_new(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    Ok(())
}
