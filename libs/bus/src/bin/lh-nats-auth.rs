//! Writes the NATS server's users, permissions and accounts (see
//! `lh_bus::auth`; a node's own account: docs/adr/028).
//!
//! ```text
//! lh-nats-auth permissions          the permissions of the fixed users (deploy/nats/permissions.conf)
//! lh-nats-auth init DIR             an nkey per service, operator and auditor under DIR/keys, DIR/users.conf
//! lh-nats-auth node DIR NODE_ID     an nkey for one node agent, DIR/users.conf again
//! ```
//!
//! Seeds are written once (mode 0600) and never printed; running again
//! keeps them and writes users.conf from every seed under DIR/keys.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use lh_bus::auth;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["permissions"] => print!("{}", auth::permissions_conf()),
        ["init", dir] => {
            let dir = Path::new(dir);
            for (user, _) in auth::fixed_users() {
                ensure_seed(&keys_dir(dir), &user)?;
            }
            write_config(dir)?;
        }
        ["node", dir, node_id] => {
            auth::check_user_name(node_id).map_err(anyhow::Error::msg)?;
            let dir = Path::new(dir);
            let seed = ensure_seed(&keys_dir(dir), &auth::node_user(node_id))?;
            write_config(dir)?;
            println!("{}", seed.display());
        }
        _ => bail!("usage: lh-nats-auth permissions | init DIR | node DIR NODE_ID"),
    }
    Ok(())
}

fn keys_dir(dir: &Path) -> PathBuf {
    dir.join("keys")
}

/// The seed file of `user`, created with a new user nkey when missing.
fn ensure_seed(keys: &Path, user: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(keys).with_context(|| format!("creating {}", keys.display()))?;
    std::fs::set_permissions(keys, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let path = keys.join(format!("{user}.nk"));
    if path.exists() {
        return Ok(path);
    }
    let seed = nkeys::KeyPair::new_user()
        .seed()
        .context("encoding a new nkey seed")?;
    create_private(&path)?.write_all(seed.as_bytes())?;
    Ok(path)
}

/// A new file only its owner may read, refused when `path` exists.
fn create_private(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))
}

/// Writes permissions.conf and users.conf beside each other in `dir`.
fn write_config(dir: &Path) -> anyhow::Result<()> {
    let fixed: Vec<String> = auth::fixed_users().into_iter().map(|(u, _)| u).collect();
    let (mut users, mut nodes) = (Vec::new(), Vec::new());
    let mut entries: Vec<_> = std::fs::read_dir(keys_dir(dir))?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let Some(user) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".nk"))
        else {
            continue;
        };
        let seed = std::fs::read_to_string(&path)?;
        let public_key = nkeys::KeyPair::from_seed(seed.trim())
            .with_context(|| format!("{} is not an nkey seed", path.display()))?
            .public_key();
        if let Some(node_id) = user.strip_prefix("node-") {
            nodes.push((node_id.to_string(), public_key));
        } else if fixed.iter().any(|f| f == user) {
            users.push((user.to_string(), public_key));
        } else {
            bail!("{}: no user is called {user}", path.display());
        }
    }
    write_private(&dir.join("permissions.conf"), &auth::permissions_conf())?;
    write_private(&dir.join("users.conf"), &auth::users_conf(&users, &nodes))
}

/// Replaces `path` with `text` (written aside, then renamed), mode 0600.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    let aside = path.with_extension("tmp");
    let _ = std::fs::remove_file(&aside);
    create_private(&aside)?.write_all(text.as_bytes())?;
    std::fs::rename(&aside, path).with_context(|| format!("writing {}", path.display()))
}
