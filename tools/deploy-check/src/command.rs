//! Running the outside programs the checks lean on (`check-jsonschema`,
//! `kubernetes-validate`, Python, cargo): where each is found and what it
//! said. A missing validator is a panic that names the fix, never a skip,
//! so a machine without `make deps` cannot pass by checking nothing.

use std::path::PathBuf;
use std::process::Command;

use crate::workspace::workspace_root;

/// A validator from `.data/venv/bin`, else from `PATH`; panics with the fix
/// when neither has it.
pub fn tool(name: &str) -> PathBuf {
    let venv = workspace_root().join(".data/venv/bin").join(name);
    if venv.is_file() {
        return venv;
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(found) = std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
        {
            return found;
        }
    }
    panic!(
        "{name} is not installed (looked in {} and on PATH): run `make deps`",
        venv.display()
    );
}

/// What a program said, its stdout then its stderr, and whether it
/// succeeded.
pub struct Run {
    pub success: bool,
    pub output: String,
}

/// Runs `command` to its end. It panics only when the program cannot be
/// started: a validator that refuses a file is a finding for the check to
/// report, not an error.
pub fn run(command: &mut Command) -> Run {
    let output = command
        .output()
        .unwrap_or_else(|err| panic!("running {command:?}: {err}"));
    Run {
        success: output.status.success(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}
