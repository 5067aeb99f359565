//! The container engine's CLI as the agent runs it: which one, its global
//! flags, and the environment it runs in. Every call of the engine (the
//! runtime's, the reconciliation's, the tenant networks') is built here.

use std::path::{Path, PathBuf};

use tokio::process::Command;

/// The agent's own variables the container CLI keeps: where it finds its
/// programs, its configuration and its daemon, as the operator set them.
/// Everything else of the agent's (its bus credentials, for one) stays out.
pub const CLI_ENV_ALLOWED: [&str; 14] = [
    "PATH",
    "HOME",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_CONTEXT",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "CONTAINER_HOST",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
];

/// Which CLI, for the flags that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CliFlavor {
    /// docker with the NVIDIA container toolkit (`--gpus`).
    Docker,
    /// podman with NVIDIA's CDI spec (`--device nvidia.com/gpu=…`).
    Podman,
}

/// The container engine's CLI as the agent runs it: the binary, its
/// flavour, and the global flags every call gets (`--cgroup-manager
/// cgroupfs --runtime runc` on this kind of host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    pub cli: PathBuf,
    pub flavor: CliFlavor,
    pub global_args: Vec<String>,
}

impl Engine {
    /// The CLI with its global flags, in a cleared environment
    /// ([`cli_command`]).
    pub(crate) fn command(&self) -> Command {
        Command::from(self.blocking_command())
    }

    /// `/bin/sh`, in the environment the CLI gets: what runs the CLI a
    /// few times in a row as one process (`super::store_relay`).
    pub(crate) fn launcher_command(&self) -> Command {
        Command::from(cli_command(Path::new("/bin/sh")))
    }

    /// [`Engine::command`] for a caller that waits on it in its thread.
    pub(crate) fn blocking_command(&self) -> std::process::Command {
        let mut command = cli_command(&self.cli);
        command.args(&self.global_args);
        command
    }
}

/// The container CLI with a cleared environment but for
/// [`CLI_ENV_ALLOWED`] from the agent's.
fn cli_command(cli: &Path) -> std::process::Command {
    let mut command = std::process::Command::new(cli);
    command.env_clear();
    for name in CLI_ENV_ALLOWED {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command
}
