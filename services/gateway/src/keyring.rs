//! Master keys that wrap tenants' data keys. A tenant's data key seals its
//! personal data in the log; the database keeps that key only wrapped, so a
//! copy of the database (a dump, a backup, a replica, another service's
//! role) opens nothing without the master key, which never enters it.
//!
//! [`KeyProvider`] is the seam a KMS fills; [`FileKeyProvider`] keeps the
//! master keys in a file only the gateway's user may read.

use std::path::Path;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use rand::RngCore;
use uuid::Uuid;

const NONCE_BYTES: usize = 12;
/// Longest master-key file read: a few thousand keys' worth.
const MAX_KEY_FILE_BYTES: u64 = 256 * 1024;
/// Longest master-key id.
const MAX_KEY_ID_CHARS: usize = 64;

/// A data key as the database keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrappedKey {
    /// Which master key wrapped it.
    pub master_key_id: String,
    /// nonce ‖ ChaCha20-Poly1305 ciphertext, bound to the tenant.
    pub ciphertext: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("master key {0:?} is not known to this key provider")]
    UnknownMasterKey(String),
    #[error("the wrapped key does not open with master key {0:?} for this tenant")]
    Unwrap(String),
    #[error("{0}")]
    Provider(String),
}

/// Wraps and unwraps tenant data keys with master keys it never hands out.
pub trait KeyProvider: Send + Sync {
    /// The master key that wraps new data keys.
    fn current_key_id(&self) -> &str;
    fn wrap(&self, tenant_id: Uuid, data_key: &[u8; 32]) -> Result<WrappedKey, KeyError>;
    fn unwrap(&self, tenant_id: Uuid, wrapped: &WrappedKey) -> Result<[u8; 32], KeyError>;
}

/// Master keys from a file of `ID HEX` lines (64 hex digits each; `#`
/// starts a comment). The last line's key wraps; every listed key unwraps,
/// so a key is rotated by appending a new line, restarting (the gateway
/// rewraps every data key at start) and only then removing the old line.
pub struct FileKeyProvider {
    keys: Vec<(String, [u8; 32])>,
}

impl std::fmt::Debug for FileKeyProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("FileKeyProvider")
            .field("key_ids", &ids)
            .finish()
    }
}

impl FileKeyProvider {
    /// Reads the file, refusing one that others may read or anyone but its
    /// owner may change.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let meta = std::fs::metadata(path)
            .map_err(|e| anyhow::anyhow!("master key file {}: {e}", path.display()))?;
        anyhow::ensure!(
            meta.len() <= MAX_KEY_FILE_BYTES,
            "master key file {} is larger than {MAX_KEY_FILE_BYTES} bytes",
            path.display()
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            // Group read is let through: Kubernetes mounts a Secret as 0440
            // when the pod sets an fsGroup, the group being the pod's own.
            let mode = meta.permissions().mode() & 0o777;
            anyhow::ensure!(
                mode & 0o027 == 0,
                "master key file {} is open to others (mode {mode:o}); chmod 600 it",
                path.display()
            );
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("master key file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("master key file {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys: Vec<(String, [u8; 32])> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(id), Some(hex_key), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("line {}: expected `ID HEX`", n + 1));
            };
            if id.is_empty()
                || id.len() > MAX_KEY_ID_CHARS
                || !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(format!(
                    "line {}: key id must be 1-{MAX_KEY_ID_CHARS} of [A-Za-z0-9_-]",
                    n + 1
                ));
            }
            let key: [u8; 32] = hex::decode(hex_key)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| format!("line {}: key must be 64 hex digits", n + 1))?;
            if key.iter().all(|b| *b == key[0]) {
                return Err(format!(
                    "line {}: key {id:?} is one byte repeated, a placeholder: generate one with \
                     `openssl rand -hex 32`",
                    n + 1
                ));
            }
            if keys.iter().any(|(k, _)| k == id) {
                return Err(format!("line {}: key id {id:?} appears twice", n + 1));
            }
            keys.push((id.to_string(), key));
        }
        if keys.is_empty() {
            return Err("no key: add a line `ID HEX` (`openssl rand -hex 32`)".into());
        }
        Ok(Self { keys })
    }

    fn key(&self, id: &str) -> Option<&[u8; 32]> {
        self.keys.iter().find(|(k, _)| k == id).map(|(_, key)| key)
    }
}

/// What a wrapped key is bound to: moving it to another tenant's row, or
/// relabelling it with another master key's id, makes it fail to open.
fn associated_data(tenant_id: Uuid, master_key_id: &str) -> Vec<u8> {
    format!("lh-tenant-data-key\0{tenant_id}\0{master_key_id}").into_bytes()
}

impl KeyProvider for FileKeyProvider {
    fn current_key_id(&self) -> &str {
        &self.keys.last().expect("parse refuses an empty key file").0
    }

    fn wrap(&self, tenant_id: Uuid, data_key: &[u8; 32]) -> Result<WrappedKey, KeyError> {
        let id = self.current_key_id().to_string();
        let master = self.key(&id).expect("the current key is listed");
        let cipher = ChaCha20Poly1305::new(Key::from_slice(master));
        let mut nonce = [0u8; NONCE_BYTES];
        rand::thread_rng().fill_bytes(&mut nonce);
        let aad = associated_data(tenant_id, &id);
        let ct = cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: data_key,
                    aad: &aad,
                },
            )
            .map_err(|_| KeyError::Provider("wrapping failed".into()))?;
        let mut ciphertext = nonce.to_vec();
        ciphertext.extend(ct);
        Ok(WrappedKey {
            master_key_id: id,
            ciphertext,
        })
    }

    fn unwrap(&self, tenant_id: Uuid, wrapped: &WrappedKey) -> Result<[u8; 32], KeyError> {
        let master = self
            .key(&wrapped.master_key_id)
            .ok_or_else(|| KeyError::UnknownMasterKey(wrapped.master_key_id.clone()))?;
        let fail = || KeyError::Unwrap(wrapped.master_key_id.clone());
        if wrapped.ciphertext.len() < NONCE_BYTES {
            return Err(fail());
        }
        let (nonce, ct) = wrapped.ciphertext.split_at(NONCE_BYTES);
        let aad = associated_data(tenant_id, &wrapped.master_key_id);
        let cipher = ChaCha20Poly1305::new(Key::from_slice(master));
        let key = cipher
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad: &aad })
            .map_err(|_| fail())?;
        key.try_into().map_err(|_| fail())
    }
}

/// The file named by the configuration, for the gateway's start.
pub fn file_provider(path: &Path) -> anyhow::Result<std::sync::Arc<dyn KeyProvider>> {
    let provider = FileKeyProvider::load(path)?;
    tracing::info!(keys = ?provider, current = provider.current_key_id(), "master keys loaded");
    Ok(std::sync::Arc::new(provider))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0101010101010101010101010101010101010101010101010101010101010102";
    const B: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";

    fn provider(text: &str) -> FileKeyProvider {
        FileKeyProvider::parse(text).unwrap()
    }

    #[test]
    fn given_a_wrapped_key_when_unwrapped_for_its_tenant_then_it_is_the_same_key() {
        let p = provider(&format!("k1 {A}\n"));
        let (tenant, data_key) = (Uuid::from_u128(7), [9u8; 32]);
        let wrapped = p.wrap(tenant, &data_key).unwrap();
        assert_eq!(wrapped.master_key_id, "k1");
        assert!(!wrapped.ciphertext.windows(32).any(|w| w == data_key));
        assert_eq!(p.unwrap(tenant, &wrapped).unwrap(), data_key);
    }

    #[test]
    fn given_a_wrapped_key_when_moved_to_another_tenant_or_relabelled_then_it_does_not_open() {
        let p = provider(&format!("k1 {A}\nk2 {B}\n"));
        let wrapped = p.wrap(Uuid::from_u128(1), &[3u8; 32]).unwrap();
        assert_eq!(wrapped.master_key_id, "k2", "the last line wraps");
        assert_eq!(
            p.unwrap(Uuid::from_u128(2), &wrapped),
            Err(KeyError::Unwrap("k2".into()))
        );
        let relabelled = WrappedKey {
            master_key_id: "k1".into(),
            ..wrapped.clone()
        };
        assert!(p.unwrap(Uuid::from_u128(1), &relabelled).is_err());
        let mut flipped = wrapped.clone();
        flipped.ciphertext[20] ^= 1;
        assert!(p.unwrap(Uuid::from_u128(1), &flipped).is_err());
    }

    #[test]
    fn given_a_rotated_file_when_an_old_key_is_unwrapped_then_the_old_line_opens_it() {
        let old = provider(&format!("k1 {A}\n"));
        let wrapped = old.wrap(Uuid::nil(), &[5u8; 32]).unwrap();
        let rotated = provider(&format!("# rotated\nk1 {A}\nk2 {B} # new\n"));
        assert_eq!(rotated.current_key_id(), "k2");
        assert_eq!(rotated.unwrap(Uuid::nil(), &wrapped).unwrap(), [5u8; 32]);
        let gone = provider(&format!("k2 {B}\n"));
        assert_eq!(
            gone.unwrap(Uuid::nil(), &wrapped),
            Err(KeyError::UnknownMasterKey("k1".into()))
        );
    }

    #[test]
    fn given_bad_files_when_parsed_then_each_is_refused_with_its_line() {
        for (text, says) in [
            ("", "no key"),
            ("# only a comment\n", "no key"),
            ("k1\n", "expected `ID HEX`"),
            (&format!("k1 {A} extra\n") as &str, "expected `ID HEX`"),
            ("k1 abcd\n", "64 hex digits"),
            (&format!("bad/id {A}\n"), "key id"),
            (&format!("k1 {}\n", "00".repeat(32)), "placeholder"),
            (&format!("k1 {A}\nk1 {B}\n"), "twice"),
        ] {
            let err = FileKeyProvider::parse(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn given_a_key_file_others_can_read_when_loaded_then_it_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.keys");
        std::fs::write(&path, format!("k1 {B}\n")).unwrap();
        for mode in [0o644, 0o604, 0o660] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = FileKeyProvider::load(&path).unwrap_err().to_string();
            assert!(err.contains("chmod 600"), "{mode:o}: {err}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o440)).unwrap();
        assert!(
            FileKeyProvider::load(&path).is_ok(),
            "a Secret mounted with an fsGroup"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(FileKeyProvider::load(&path).unwrap().current_key_id(), "k1");
    }
}
