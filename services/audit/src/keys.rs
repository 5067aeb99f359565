//! `lh-audit init-keys DIR`: what a deployment hands the service, made once
//! before it starts. DIR gets the checkpoint signing key (`signing.key`),
//! its public half to pin (`trusted-public-keys`) and the bearer token of
//! `GET /v1/verify` (`verify.token`), named as the Kubernetes Secret
//! `leasehold-audit-key` names them, so the directory can become that Secret.
//!
//! A file already there is kept: the key must outlive restarts, the pinned
//! list may hold a rotated-out key an operator added, and auditors hold the
//! token. Run as an init step (docker-compose.yml runs it in `nats-auth`),
//! so that the service itself can mount the directory read-only and cannot
//! change what it is trusted with.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rand::RngCore as _;

use crate::files::write_new;
use crate::signing;

/// The files `init-keys` writes, as `k8s/10-secrets.yaml` names them.
pub const SIGNING_KEY_FILE: &str = "signing.key";
pub const TRUSTED_PUBLIC_KEYS_FILE: &str = "trusted-public-keys";
pub const VERIFY_TOKEN_FILE: &str = "verify.token";
/// Random bytes in a generated verify token (written as hex).
const VERIFY_TOKEN_BYTES: usize = 32;

#[derive(clap::Parser, Debug)]
#[command(
    name = "init-keys",
    about = "Writes the audit signing key, its public half to pin and the verify token into DIR, keeping any already there; prints the public key"
)]
pub struct InitKeys {
    /// Directory to write into (created when missing).
    pub dir: PathBuf,
}

impl InitKeys {
    pub fn run(&self) -> anyhow::Result<()> {
        let public_key = init_keys(&self.dir)?;
        println!("{public_key}");
        Ok(())
    }
}

/// Makes what is missing of the three files in `dir`; returns the signing
/// key's public half (hex).
pub fn init_keys(dir: &Path) -> anyhow::Result<String> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let key = signing::load_or_generate(Some(&dir.join(SIGNING_KEY_FILE)))?;
    let public_key = hex::encode(key.verifying_key().to_bytes());

    let trusted = dir.join(TRUSTED_PUBLIC_KEYS_FILE);
    if trusted.exists() {
        let text = std::fs::read_to_string(&trusted)
            .with_context(|| format!("reading {}", trusted.display()))?;
        if !text.lines().any(|line| line.trim() == public_key) {
            eprintln!(
                "warning: {} does not pin the key of {SIGNING_KEY_FILE} ({public_key}): \
                 the service's own checkpoints will fail verification",
                trusted.display()
            );
        }
    } else {
        // Not secret, but only the deployment should change it.
        write_new(
            &trusted,
            &format!(
                "# the public half of {SIGNING_KEY_FILE} (lh-audit init-keys)\n{public_key}\n"
            ),
            0o644,
        )?;
    }

    let token = dir.join(VERIFY_TOKEN_FILE);
    if !token.exists() {
        let mut bytes = [0u8; VERIFY_TOKEN_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        write_new(&token, &format!("{}\n", hex::encode(bytes)), 0o600)?;
    }
    Ok(public_key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn init_keys_makes_what_the_service_reads_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("audit");
        let public_key = init_keys(&keys).unwrap();

        // What the service reads at start, from the files it was given.
        let mut config = Config::for_test("nats://127.0.0.1:1", "postgres://x");
        config.signing_key_file = Some(keys.join(SIGNING_KEY_FILE));
        config.trusted_public_keys_file = Some(keys.join(TRUSTED_PUBLIC_KEYS_FILE));
        config.verify_token_file = Some(keys.join(VERIFY_TOKEN_FILE));
        let signing = signing::load_or_generate(config.signing_key_file.as_deref()).unwrap();
        assert_eq!(
            config.pinned_public_keys().unwrap(),
            vec![signing.verifying_key().to_bytes()],
            "the service's own key, and only it, is pinned"
        );
        assert_eq!(hex::encode(signing.verifying_key().to_bytes()), public_key);
        let token = crate::read_verify_token(&keys.join(VERIFY_TOKEN_FILE)).unwrap();
        assert_eq!(token.len(), 2 * VERIFY_TOKEN_BYTES);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            for (file, mode) in [(SIGNING_KEY_FILE, 0o600), (VERIFY_TOKEN_FILE, 0o600)] {
                let got = std::fs::metadata(keys.join(file))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(got & 0o777, mode, "{file}");
            }
        }

        // Run again (every `docker compose up`): nothing changes, and a
        // key an operator added to the pinned list stays.
        let other = hex::encode([3u8; 32]);
        let trusted = keys.join(TRUSTED_PUBLIC_KEYS_FILE);
        let pinned = std::fs::read_to_string(&trusted).unwrap() + &other + "\n";
        std::fs::write(&trusted, &pinned).unwrap();
        assert_eq!(init_keys(&keys).unwrap(), public_key);
        assert_eq!(std::fs::read_to_string(&trusted).unwrap(), pinned);
        assert_eq!(
            crate::read_verify_token(&keys.join(VERIFY_TOKEN_FILE)).unwrap(),
            token
        );
    }

    #[test]
    fn a_placeholder_signing_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(SIGNING_KEY_FILE),
            "REPLACE-ME-openssl-rand-hex-32\n",
        )
        .unwrap();
        assert!(init_keys(dir.path()).is_err());
        assert!(!dir.path().join(TRUSTED_PUBLIC_KEYS_FILE).exists());
    }
}
