//! Tenants' API keys as the read model showed them, kept in memory so that
//! authenticating a request costs a hash and a map lookup rather than a
//! database round trip.
//!
//! What decides a key's answer (its tenant, quota, suspension, revocation)
//! changes only through events of the tenant family, so the projection's
//! runner forgets the whole cache when it has committed any such event and
//! before its progress says so ([`TenantKeys::forget_if_tenant_event`]): a
//! caller that waited for a revocation to be read back never finds the key
//! still cached. A lookup that raced such an event (it read the database
//! before the commit and returns after the cache was forgotten) does not
//! put its stale row back: each fill names the generation it read under,
//! and a forgotten cache has moved on to the next one.
//!
//! Unknown keys are not cached: a key issued a moment later must work, and
//! a flood of wrong keys is bounded by the anonymous request budget.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use lh_events::subject;
use uuid::Uuid;

use crate::cache::GenerationalCache;

/// Most keys held at once; when full, the cache starts over (a refill is
/// one query per key in use).
pub const MAX_CACHED_API_KEYS: usize = 100_000;

/// What authenticating with one key needs to know: an API key's, or an
/// OIDC token's that names a tenant (kept by the token's hash too).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TenantKey {
    pub tenant_id: Uuid,
    pub max_gpus: i32,
    pub suspended: bool,
    /// The API key's number; `None` for an OIDC token.
    pub key_id: Option<i32>,
    pub revoked: bool,
    pub expires_at: Option<DateTime<Utc>>,
}

/// What a tenant's caller showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantCredential {
    /// One of the tenant's API keys, by its number.
    ApiKey(i32),
    /// A token of the OIDC issuer, which no one revokes: valid until then.
    Oidc { expires_at: DateTime<Utc> },
}

impl TenantCredential {
    /// The API key's number, if it is one.
    pub fn key_id(&self) -> Option<i32> {
        match self {
            TenantCredential::ApiKey(key_id) => Some(*key_id),
            TenantCredential::Oidc { .. } => None,
        }
    }

    /// Until when it is valid, where that is known now (a key's expiry can
    /// change only by revocation, which is looked up).
    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        match self {
            TenantCredential::ApiKey(_) => None,
            TenantCredential::Oidc { expires_at } => Some(*expires_at),
        }
    }
}

impl TenantKey {
    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// The cache shared by the API's handlers and the projection's runner.
#[derive(Default)]
pub struct TenantKeys {
    /// By the key's SHA-256; the generation moves on each time the cache is
    /// forgotten.
    by_sha256: GenerationalCache<HashMap<[u8; 32], TenantKey>>,
}

impl std::fmt::Debug for TenantKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantKeys")
            .field("keys", &self.len())
            .finish()
    }
}

impl TenantKeys {
    /// The key with this SHA-256, if cached.
    pub fn get(&self, sha256: &[u8; 32]) -> Option<TenantKey> {
        self.by_sha256.read().get(sha256).cloned()
    }

    /// The generation a lookup in the database starts under; pass it to
    /// [`TenantKeys::insert`] with what the lookup found.
    pub fn generation(&self) -> u64 {
        self.by_sha256.read().generation()
    }

    /// Keeps `key`, unless the cache was forgotten since `generation`
    /// (the row may predate the event that made it so).
    pub fn insert(&self, generation: u64, sha256: [u8; 32], key: TenantKey) {
        let mut keys = self.by_sha256.write();
        if !keys.is_current(generation) {
            return;
        }
        if keys.len() >= MAX_CACHED_API_KEYS {
            keys.clear();
        }
        keys.insert(sha256, key);
    }

    /// Forgets every key.
    pub fn forget_all(&self) {
        let mut keys = self.by_sha256.write();
        keys.move_on();
        keys.clear();
    }

    /// Forgets every key when a message of the tenant family (a key issued
    /// or revoked, a tenant suspended, resumed, erased, its quota changed,
    /// one the service could not decode) has been committed.
    pub fn forget_if_tenant_event(&self, stored_subject: &str) {
        let family = subject::TENANTS_ALL.trim_end_matches('>');
        if stored_subject.starts_with(family) {
            self.forget_all();
        }
    }

    pub fn len(&self) -> usize {
        self.by_sha256.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(revoked: bool) -> TenantKey {
        TenantKey {
            tenant_id: Uuid::nil(),
            max_gpus: 4,
            suspended: false,
            key_id: Some(1),
            revoked,
            expires_at: None,
        }
    }

    #[test]
    fn a_fill_that_raced_a_tenant_event_is_not_kept() {
        let keys = TenantKeys::default();
        let before = keys.generation();
        keys.forget_if_tenant_event(&subject::tenant(Uuid::nil()));
        keys.insert(before, [1; 32], key(false));
        assert_eq!(keys.get(&[1; 32]), None, "a row read before the event");
        keys.insert(keys.generation(), [1; 32], key(true));
        assert_eq!(keys.get(&[1; 32]), Some(key(true)));
    }

    #[test]
    fn only_the_tenant_family_forgets_keys() {
        let keys = TenantKeys::default();
        keys.insert(keys.generation(), [2; 32], key(false));
        keys.forget_if_tenant_event(&subject::lease(Uuid::nil()));
        keys.forget_if_tenant_event(&subject::balance(Uuid::nil()));
        assert_eq!(keys.len(), 1);
        keys.forget_if_tenant_event(&format!("{}.x", subject::tenant(Uuid::nil())));
        assert!(keys.is_empty());
    }

    #[test]
    fn a_key_expires_at_its_time() {
        let now = Utc::now();
        let mut k = key(false);
        assert!(!k.expired(now));
        k.expires_at = Some(now);
        assert!(k.expired(now));
        k.expires_at = Some(now + chrono::Duration::seconds(1));
        assert!(!k.expired(now));
    }
}
