//! The checkpoint signing key: an ed25519 seed kept as hex in a file.
//!
//! A key that lives only in memory would sign checkpoints nobody can tie to
//! the service after a restart, so production passes `--signing-key-file`:
//! the first start generates the seed there (mode 0600) and later starts read
//! it back. Without a file the key is ephemeral, which tests use.

use std::path::Path;

use anyhow::Context as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use lh_domain::chain::{checkpoint_statement, Hash};
use rand::RngCore as _;

/// Length of an ed25519 seed in bytes.
const SEED_BYTES: usize = 32;

/// Loads the seed from `path`, or generates one (and writes it to `path`
/// when one is given and no file is there yet).
pub fn load_or_generate(path: Option<&Path>) -> anyhow::Result<SigningKey> {
    if let Some(path) = path {
        if path.exists() {
            return read_key(path);
        }
    }
    let mut seed = [0u8; SEED_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut seed);
    let key = SigningKey::from_bytes(&seed);
    match path {
        Some(path) => {
            write_key(path, &seed)?;
            tracing::info!(path = %path.display(), "generated a new checkpoint signing key");
        }
        None => tracing::warn!("no signing key file: checkpoints are signed with an ephemeral key"),
    }
    Ok(key)
}

fn read_key(path: &Path) -> anyhow::Result<SigningKey> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading signing key {}", path.display()))?;
    let bytes = hex::decode(text.trim())
        .with_context(|| format!("signing key {} is not hex", path.display()))?;
    let seed: [u8; SEED_BYTES] = bytes.try_into().map_err(|b: Vec<u8>| {
        anyhow::anyhow!(
            "signing key {} holds {} bytes, not a {SEED_BYTES}-byte ed25519 seed",
            path.display(),
            b.len()
        )
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path)?.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "signing key file is readable by others");
        }
    }
    Ok(SigningKey::from_bytes(&seed))
}

fn write_key(path: &Path, seed: &[u8; SEED_BYTES]) -> anyhow::Result<()> {
    crate::files::write_new(path, &format!("{}\n", hex::encode(seed)), 0o600)
}

/// Signs the checkpoint statement for the chain state `(sequence, events, head)`.
pub fn sign_checkpoint(key: &SigningKey, sequence: u64, events: u64, head: &Hash) -> Signature {
    key.sign(checkpoint_statement(sequence, events, head).as_bytes())
}

/// True when `signature` by `public_key` covers the checkpoint statement.
/// Malformed keys or signatures simply do not verify.
pub fn checkpoint_signature_ok(
    public_key: &[u8],
    signature: &[u8],
    sequence: u64,
    events: u64,
    head: &Hash,
) -> bool {
    let Ok(public_key) = <[u8; 32]>::try_from(public_key) else {
        return false;
    };
    let Ok(key) = VerifyingKey::from_bytes(&public_key) else {
        return false;
    };
    let Ok(signature) = Signature::from_slice(signature) else {
        return false;
    };
    key.verify(
        checkpoint_statement(sequence, events, head).as_bytes(),
        &signature,
    )
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_is_written_0600_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.key");
        let first = load_or_generate(Some(&path)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().len(), 2 * SEED_BYTES);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let second = load_or_generate(Some(&path)).unwrap();
        assert_eq!(first.to_bytes(), second.to_bytes());
    }

    #[test]
    fn a_malformed_key_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.key");
        std::fs::write(&path, "abcd\n").unwrap();
        assert!(load_or_generate(Some(&path)).is_err());
    }

    #[test]
    fn signatures_cover_sequence_events_and_head() {
        let key = load_or_generate(None).unwrap();
        let public = key.verifying_key().to_bytes();
        let head = [7u8; 32];
        let sig = sign_checkpoint(&key, 10, 9, &head).to_bytes();
        assert!(checkpoint_signature_ok(&public, &sig, 10, 9, &head));
        assert!(!checkpoint_signature_ok(&public, &sig, 11, 9, &head));
        assert!(!checkpoint_signature_ok(&public, &sig, 10, 10, &head));
        assert!(!checkpoint_signature_ok(&public, &sig, 10, 9, &[8u8; 32]));
        assert!(!checkpoint_signature_ok(&public[..31], &sig, 10, 9, &head));
    }
}
