//! Crypto-shredding of personal data. Names and e-mail addresses are sealed
//! with a per-tenant key (ChaCha20-Poly1305) before they enter the log; the
//! keys live outside the log, in the `gateway_keys` schema. Destroying a
//! tenant's key (erasing the tenant; not built yet) leaves only ciphertext in
//! the log while the audit chain still verifies.

use base64::{engine::general_purpose::STANDARD, Engine as _};
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use rand::RngCore;
use sqlx::PgPool;
use uuid::Uuid;

pub const KEYS_SCHEMA: &str = "gateway_keys";
const NONCE_BYTES: usize = 12;

/// A fresh random 256-bit key.
pub fn new_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut key);
    key
}

/// Base64 of nonce ‖ ciphertext.
pub fn seal(key: &[u8; 32], plaintext: &str) -> String {
    let cipher = ChaCha20Poly1305::new(Key::from_slice(key));
    let mut nonce = [0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut nonce);
    let ct = cipher
        .encrypt(Nonce::from_slice(&nonce), plaintext.as_bytes())
        .expect("encryption of a short string cannot fail");
    let mut out = nonce.to_vec();
    out.extend(ct);
    STANDARD.encode(out)
}

/// The plaintext, or `None` when the key is gone or the text was tampered with.
pub fn open(key: &[u8; 32], sealed: &str) -> Option<String> {
    let bytes = STANDARD.decode(sealed).ok()?;
    if bytes.len() < NONCE_BYTES {
        return None;
    }
    let (nonce, ct) = bytes.split_at(NONCE_BYTES);
    let cipher = ChaCha20Poly1305::new(Key::from_slice(key));
    let pt = cipher.decrypt(Nonce::from_slice(nonce), ct).ok()?;
    String::from_utf8(pt).ok()
}

pub async fn migrate_keys(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {KEYS_SCHEMA}"))
        .execute(pool)
        .await?;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {KEYS_SCHEMA}.tenant_keys (
            tenant_id UUID PRIMARY KEY,
            key BYTEA NOT NULL
        )"
    ))
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn store_key(pool: &PgPool, tenant_id: Uuid, key: &[u8; 32]) -> sqlx::Result<()> {
    sqlx::query(&format!(
        "INSERT INTO {KEYS_SCHEMA}.tenant_keys (tenant_id, key) VALUES ($1, $2)"
    ))
    .bind(tenant_id)
    .bind(key.as_slice())
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn load_key(pool: &PgPool, tenant_id: Uuid) -> sqlx::Result<Option<[u8; 32]>> {
    let key: Option<Vec<u8>> = sqlx::query_scalar(&format!(
        "SELECT key FROM {KEYS_SCHEMA}.tenant_keys WHERE tenant_id = $1"
    ))
    .bind(tenant_id)
    .fetch_optional(pool)
    .await?;
    Ok(key.and_then(|k| k.try_into().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_round_trips_and_another_key_cannot_open() {
        let k = new_key();
        let s = seal(&k, "ops@acme.example");
        assert!(!s.contains("acme"));
        assert_eq!(open(&k, &s).as_deref(), Some("ops@acme.example"));
        assert_eq!(open(&new_key(), &s), None);
    }
}
