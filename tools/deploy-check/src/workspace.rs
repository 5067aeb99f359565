//! Where the workspace is: the deployment files and the validators of
//! `make deps` are found from its root, wherever the checks run from.

use std::path::{Path, PathBuf};

/// The directory holding the workspace's `Cargo.toml`: the nearest ancestor
/// of this crate with a `Cargo.lock` or a `[workspace]` table, found the
/// same way `lh_testkit::workspace_root` finds it, without depending on the
/// test kit and the platform it starts.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let is_root = |dir: &Path| {
        dir.join("Cargo.lock").is_file()
            || std::fs::read_to_string(dir.join("Cargo.toml"))
                .map(|toml| toml.lines().any(|line| line.trim() == "[workspace]"))
                .unwrap_or(false)
    };
    manifest_dir
        .ancestors()
        .find(|dir| is_root(dir))
        .unwrap_or(manifest_dir)
        .to_path_buf()
}
