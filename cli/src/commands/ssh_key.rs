//! `lh ssh-key ...`: add, list and remove the tenant's SSH public keys,
//! one request each to `/v1/ssh-keys`. A key is read from its `.pub` file
//! here, and a private key is refused before anything is sent.

use std::path::{Path, PathBuf};

use lh_rpc::http::ssh_keys::AddSshKey;
use serde_json::json;

use crate::args::SshKeyCommand;
use crate::client::Gateway;
use crate::error::{CliError, EXIT_OK};
use crate::output::{emit, write_out, Out};
use crate::render;

/// Where `lh ssh-key add` looks for a key when none is named, in this
/// order: ssh-keygen's default names, the newest kind first.
pub(crate) const DEFAULT_KEY_FILES: &[&str] = &[
    ".ssh/id_ed25519.pub",
    ".ssh/id_ecdsa.pub",
    ".ssh/id_rsa.pub",
];

/// Largest key file read: the gateway takes keys of at most 8 KiB, and a
/// larger file is not a public key.
const MAX_KEY_FILE_BYTES: u64 = 16 * 1024;

/// Most characters of a key's name (as the gateway allows).
const MAX_NAME_CHARS: usize = 64;

/// Runs one `lh ssh-key` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: SshKeyCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        SshKeyCommand::Add(add) => {
            let path = match add.file {
                Some(path) => path,
                None => default_key_file(&home()?).ok_or_else(|| {
                    CliError::Usage(format!(
                        "no public key at ~/{}: name its file (lh ssh-key add FILE), or make \
                         one with `ssh-keygen -t ed25519`",
                        DEFAULT_KEY_FILES.join(", ~/")
                    ))
                })?,
            };
            let public_key = read_public_key(&path)?;
            let name = add.name.unwrap_or_else(|| default_name(&path));
            let body = AddSshKey { name, public_key };
            let key = gw.post(&["v1", "ssh-keys"], &body, &[]).await?;
            emit(out, json, &key, render::ssh_key_view)?;
            Ok(EXIT_OK)
        }
        SshKeyCommand::Ls(ls) => {
            let mut query = Vec::new();
            if let Some(tenant) = &ls.tenant_id {
                query.push(("tenant_id", tenant.as_str()));
            }
            let keys = gw.get(&["v1", "ssh-keys"], &query).await?;
            emit(out, json, &keys, render::ssh_key_list)?;
            Ok(EXIT_OK)
        }
        SshKeyCommand::Rm(rm) => {
            // 204: the gateway answers nothing, so this says what was done.
            gw.delete(&["v1", "ssh-keys", &rm.id]).await?;
            if json {
                let text = serde_json::to_string_pretty(&json!({"id": rm.id, "removed": true}))?;
                write_out(out, &format!("{text}\n"))?;
            } else {
                write_out(out, &format!("removed SSH key {}\n", rm.id))?;
            }
            Ok(EXIT_OK)
        }
    }
}

fn home() -> Result<PathBuf, CliError> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            CliError::Usage("HOME is not set: name the key's file (lh ssh-key add FILE)".into())
        })
}

/// The first of [`DEFAULT_KEY_FILES`] under `home` that exists.
fn default_key_file(home: &Path) -> Option<PathBuf> {
    DEFAULT_KEY_FILES
        .iter()
        .map(|name| home.join(name))
        .find(|path| path.is_file())
}

/// The key's line, refused here when the file is too large or is the
/// private half: that must never leave this machine.
fn read_public_key(path: &Path) -> Result<String, CliError> {
    let unreadable =
        |e: std::io::Error| CliError::Usage(format!("cannot read {}: {e}", path.display()));
    let size = std::fs::metadata(path).map_err(unreadable)?.len();
    if size > MAX_KEY_FILE_BYTES {
        return Err(CliError::Usage(format!(
            "{} is larger than {MAX_KEY_FILE_BYTES} bytes: not a public key",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    if text.contains("PRIVATE KEY") {
        return Err(CliError::Usage(format!(
            "{} is a private key, which stays here: give its .pub file",
            path.display()
        )));
    }
    Ok(text.trim().to_string())
}

/// The key file's name: never the key's comment, which is often
/// `user@host` and would go on the log (where an erasure cannot reach) in
/// clear; `--name` names a key otherwise. At most [`MAX_NAME_CHARS`].
fn default_name(path: &Path) -> String {
    let name = path.file_name().map_or_else(
        || "ssh key".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    name.chars().take(MAX_NAME_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_key_is_the_first_of_ed25519_ecdsa_rsa_that_exists() {
        let home = tempfile::tempdir().unwrap();
        assert_eq!(default_key_file(home.path()), None);
        std::fs::create_dir(home.path().join(".ssh")).unwrap();
        let rsa = home.path().join(".ssh/id_rsa.pub");
        std::fs::write(&rsa, "ssh-rsa AAAA").unwrap();
        assert_eq!(default_key_file(home.path()), Some(rsa));
        let ed25519 = home.path().join(".ssh/id_ed25519.pub");
        std::fs::write(&ed25519, "ssh-ed25519 AAAA").unwrap();
        assert_eq!(default_key_file(home.path()), Some(ed25519));
    }

    #[test]
    fn the_default_name_is_the_file_name_never_the_comment() {
        let path = Path::new("/home/a/.ssh/id_ed25519.pub");
        assert_eq!(default_name(path), "id_ed25519.pub");
        let long = format!("/k/{}.pub", "x".repeat(100));
        assert_eq!(
            default_name(Path::new(&long)).chars().count(),
            MAX_NAME_CHARS
        );
    }

    #[test]
    fn a_private_key_is_never_read_for_sending() {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("id_ed25519");
        std::fs::write(
            &private,
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n",
        )
        .unwrap();
        let refused = read_public_key(&private).unwrap_err().to_string();
        assert!(refused.contains("private key"), "{refused}");
        let public = dir.path().join("id_ed25519.pub");
        std::fs::write(&public, "ssh-ed25519 AAAA me@here\n").unwrap();
        assert_eq!(
            read_public_key(&public).unwrap(),
            "ssh-ed25519 AAAA me@here"
        );
        let big = dir.path().join("big.pub");
        std::fs::write(&big, "A".repeat(20_000)).unwrap();
        assert!(read_public_key(&big).is_err());
    }
}
