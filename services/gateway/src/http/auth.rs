//! Who is calling: an operator (the bootstrap admin token, the auditor
//! token, a named key or an OIDC token with a role, see
//! [`crate::principals`]) or a tenant (its API key, or an OIDC token whose
//! tenant claim names it). Operators are found by their key's hash,
//! tenants by their key's hash in the read model (through
//! [`crate::tenant_keys`], which keeps what it read, a tenant's OIDC token
//! beside the keys), so no comparison runs over a secret byte by byte. A
//! tenant's new key is made here too, beside the hash it is found by.

use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts, Method};
use lh_events::{Actor, Operator, OperatorRole};
use lh_rpc::http::sessions::BEARER_SUBPROTOCOL_PREFIX;
use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{ApiContext, ApiError};
use crate::oidc::Signed;
use crate::tenant_keys::{TenantCredential, TenantKey};

/// Who is calling.
#[derive(Debug, Clone)]
pub enum Caller {
    /// An admin or an auditor, by name.
    Operator(Operator),
    Tenant {
        id: Uuid,
        max_gpus: u32,
        /// What it showed: what a lease's web page cookie is tied to.
        credential: TenantCredential,
    },
}

impl Caller {
    pub fn tenant(&self) -> Result<(Uuid, u32), ApiError> {
        match self {
            Caller::Tenant { id, max_gpus, .. } => Ok((*id, *max_gpus)),
            _ => Err(ApiError::forbidden("this call needs a tenant API key")),
        }
    }

    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Caller::Operator(o) if o.role == OperatorRole::Admin => Ok(()),
            _ => Err(ApiError::forbidden("this call needs an admin")),
        }
    }

    /// Whether the caller is an operator, who may read every tenant's data.
    pub fn is_operator(&self) -> bool {
        matches!(self, Caller::Operator(_))
    }

    /// Refuses the auditor, who only reads; tenants and admins pass (what
    /// they may change is the handler's to decide).
    pub fn require_writer(&self) -> Result<(), ApiError> {
        match self {
            Caller::Operator(o) if o.role == OperatorRole::Auditor => Err(ApiError::forbidden(
                "the auditor role reads only; this call changes something",
            )),
            _ => Ok(()),
        }
    }

    /// Refuses anyone but an admin and the tenant `tenant_id` itself; an
    /// unknown or other tenant is told 404, so that ids do not leak.
    pub fn require_admin_or_tenant(&self, tenant_id: Uuid) -> Result<(), ApiError> {
        match self {
            Caller::Operator(o) if o.role == OperatorRole::Admin => Ok(()),
            Caller::Operator(_) => Err(ApiError::forbidden(
                "the auditor role reads only; this call changes something",
            )),
            Caller::Tenant { id, .. } if *id == tenant_id => Ok(()),
            Caller::Tenant { .. } => {
                Err(ApiError::not_found(format!("no tenant {tenant_id}")).field("id"))
            }
        }
    }

    /// Who the log records as the cause of what this caller asked.
    pub fn actor(&self) -> Actor {
        match self {
            Caller::Operator(o) => Actor::Operator(o.clone()),
            Caller::Tenant { id, .. } => Actor::Tenant(*id),
        }
    }
}

pub fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Random bytes in a key (shown as hex after `lh_`).
const KEY_SECRET_BYTES: usize = 24;
/// Characters of the key shown in listings: `lh_` and 8 hex digits.
const KEY_PREFIX_CHARS: usize = 11;

/// A new API key: the key itself (shown once), its prefix and its hash.
pub struct NewKey {
    pub secret: String,
    pub prefix: String,
    pub sha256: String,
}

pub fn new_key() -> NewKey {
    let mut bytes = [0u8; KEY_SECRET_BYTES];
    rand::thread_rng().fill_bytes(&mut bytes);
    let secret = format!("lh_{}", hex::encode(bytes));
    NewKey {
        prefix: secret[..KEY_PREFIX_CHARS].to_string(),
        sha256: sha256_hex(&secret),
        secret,
    }
}

/// Most bytes of a key carried in a WebSocket's subprotocol, encoded.
const MAX_SUBPROTOCOL_KEY_BYTES: usize = 8 * 1024;

/// The key a request carries: its `Authorization: Bearer` header, or, on a
/// WebSocket's upgrade into a lease only (a GET with a WebSocket key, to an
/// exec or a port forward), the bearer subprotocol a browser must use.
pub(crate) fn token_of(
    headers: &axum::http::HeaderMap,
    method: &Method,
    path: &str,
) -> Result<String, ApiError> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let value = value
            .to_str()
            .map_err(|_| ApiError::unauthorized("Authorization header is not text"))?;
        return value
            .strip_prefix("Bearer ")
            .map(|t| t.trim().to_string())
            .ok_or_else(|| ApiError::unauthorized("Authorization must be `Bearer <key>`"));
    }
    let upgrading = *method == Method::GET
        && (path.ends_with("/exec") || path.ends_with("/port-forward"))
        && headers.contains_key(header::SEC_WEBSOCKET_KEY)
        && headers
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let carried = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(BEARER_SUBPROTOCOL_PREFIX));
    match carried {
        Some(encoded) if upgrading => {
            use base64::Engine as _;
            if encoded.len() > MAX_SUBPROTOCOL_KEY_BYTES {
                return Err(ApiError::unauthorized(
                    "the key in the subprotocol is too long",
                ));
            }
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(encoded)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .map(|t| t.trim().to_string())
                .ok_or_else(|| {
                    ApiError::unauthorized(format!(
                        "the subprotocol {BEARER_SUBPROTOCOL_PREFIX}<key> carries the key as base64url without padding"
                    ))
                })
        }
        _ => Err(ApiError::unauthorized(
            "missing Authorization: Bearer <key>",
        )),
    }
}

impl FromRequestParts<ApiContext> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, ctx: &ApiContext) -> Result<Self, ApiError> {
        let token = token_of(&parts.headers, &parts.method, parts.uri.path())?;
        let token = token.as_str();
        // The principal a refusal is counted under (see `refusals`).
        let named = |principal: String| {
            if let Some(slot) = parts.extensions.get::<super::refusals::NamedPrincipal>() {
                slot.set(principal);
            }
        };
        if let Some(operator) = ctx.principals.operator(token) {
            let caller = Caller::Operator(operator.clone());
            named(caller.actor().principal());
            return Ok(caller);
        }
        let sha256 = crate::principals::token_sha256(token);
        let mut key = ctx.tenant_keys.get(&sha256);
        if let Some(oidc) = &ctx.principals.oidc {
            if key.is_none() && crate::oidc::Verifier::looks_like_jwt(token) {
                match oidc.verify(token).await {
                    Ok(Signed::Operator(operator)) => {
                        let caller = Caller::Operator(operator);
                        named(caller.actor().principal());
                        return Ok(caller);
                    }
                    Ok(Signed::Tenant {
                        id,
                        name,
                        expires_at,
                    }) => {
                        let generation = ctx.tenant_keys.generation();
                        let row: Option<(i32, bool)> = sqlx::query_as(
                            "SELECT max_gpus, suspended FROM tenants WHERE id = $1 AND NOT erased",
                        )
                        .bind(id)
                        .fetch_optional(&ctx.pool)
                        .await?;
                        let Some((max_gpus, suspended)) = row else {
                            tracing::info!(%name, tenant = %id, "an OIDC token names a tenant this platform does not have");
                            return Err(ApiError::forbidden(format!(
                                "the token names tenant {id}, which this platform does not have"
                            )));
                        };
                        let found = TenantKey {
                            tenant_id: id,
                            max_gpus,
                            suspended,
                            key_id: None,
                            revoked: false,
                            expires_at: Some(expires_at),
                        };
                        ctx.tenant_keys.insert(generation, sha256, found.clone());
                        key = Some(found);
                    }
                    Err(refused @ crate::oidc::Refused::NoRole(_)) => {
                        return Err(ApiError::forbidden(refused.to_string()))
                    }
                    Err(refused) => return Err(ApiError::unauthorized(refused.to_string())),
                }
            }
        }
        let key = match key {
            Some(key) => key,
            None => {
                let generation = ctx.tenant_keys.generation();
                let row: Option<TenantKey> = sqlx::query_as(
                    "SELECT t.id AS tenant_id, t.max_gpus, t.suspended, k.key_id,
                            k.revoked_at IS NOT NULL AS revoked, k.expires_at
                     FROM tenant_keys k JOIN tenants t ON t.id = k.tenant_id WHERE k.sha256 = $1",
                )
                .bind(hex::encode(sha256))
                .fetch_optional(&ctx.pool)
                .await?;
                let Some(key) = row else {
                    return Err(ApiError::unauthorized("unknown API key"));
                };
                ctx.tenant_keys.insert(generation, sha256, key.clone());
                key
            }
        };
        named(Actor::Tenant(key.tenant_id).principal());
        let credential = match (key.key_id, key.expires_at) {
            (Some(key_id), _) => TenantCredential::ApiKey(key_id),
            (None, Some(expires_at)) => TenantCredential::Oidc { expires_at },
            (None, None) => return Err(ApiError::unauthorized("unknown API key")),
        };
        let which = match credential {
            TenantCredential::ApiKey(key_id) => format!("API key {key_id} of this tenant"),
            TenantCredential::Oidc { .. } => "the OIDC token".to_string(),
        };
        if key.revoked {
            return Err(ApiError::unauthorized(format!("{which} was revoked")));
        }
        if key.expired(chrono::Utc::now()) {
            return Err(ApiError::unauthorized(format!("{which} has expired")));
        }
        let (id, max_gpus) = (key.tenant_id, key.max_gpus);
        // A session into a lease runs commands in it: a write, though it
        // comes as a GET (a WebSocket's upgrade).
        let path = parts.uri.path();
        let write = !matches!(parts.method, Method::GET | Method::HEAD)
            || path.ends_with("/exec")
            || path.ends_with("/port-forward");
        // A suspended tenant may still revoke a key of its own, an API key
        // or an SSH key: a key that leaked while it was suspended must not
        // stay valid until an operator acts.
        let revoking = parts.method == Method::DELETE
            && (path.contains("/keys/") || path.starts_with("/v1/ssh-keys/"));
        if write && key.suspended && !revoking {
            return Err(ApiError::forbidden(
                "this tenant is suspended: it may read but not change anything",
            ));
        }
        if write {
            if let Err(wait) = ctx.write_budgets.spend(id, std::time::Instant::now()) {
                metrics::counter!("lh_gateway_writes_limited_total").increment(1);
                return Err(ApiError::too_many_requests(format!(
                    "this tenant's writes are limited to {} a second (bursts of {})",
                    ctx.limits.writes_per_s, ctx.limits.write_burst
                ))
                .retry_after(wait.as_secs_f64().ceil().max(1.0) as u32));
            }
        }
        Ok(Caller::Tenant {
            id,
            max_gpus: max_gpus as u32,
            credential,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_shows_its_prefix_and_keeps_only_its_hash() {
        let key = new_key();
        assert!(key.secret.starts_with(&key.prefix));
        assert_eq!(key.prefix.len(), KEY_PREFIX_CHARS);
        assert!(key.prefix.starts_with("lh_"));
        assert_eq!(key.sha256, sha256_hex(&key.secret));
        assert_ne!(new_key().secret, key.secret);
    }
}
