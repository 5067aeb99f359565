//! Where the workspace is: the deployment files and the validators of
//! `make deps` are found from its root, wherever the checks run from.

use std::path::{Path, PathBuf};

/// The directory holding the workspace's `Cargo.toml`. This crate lives at
/// `tools/deploy-check`, two levels below it; the checks do not depend on
/// the test kit (and the platform it starts) just to find it.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}
