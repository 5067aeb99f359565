//! Who may come into a lease's web page: one-time tickets the console
//! asks for with a tenant's key, traded for a cookie of the lease port's
//! origin alone, tied to that key (or, for a tenant's person signed in with
//! the OIDC issuer, living no longer than that token). Both are kept as SHA-256 hashes in the
//! gateway's own schema, so any replica honours them and a rebuild of the
//! read model keeps them; a tenant's erasure removes them.

use std::collections::HashMap;
use std::time::Instant;

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use chrono::{DateTime, Utc};
use hyper::body::Incoming;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::LeaseWeb;
use crate::poison_free::PoisonFreeRwLock;
use crate::seal::{
    KEYS_SCHEMA, LEASE_WEB_SESSIONS_TABLE as SESSIONS, LEASE_WEB_TICKETS_TABLE as TICKETS,
};
use crate::tenant_keys::TenantCredential;

/// Where a ticket is traded for the origin's cookie.
pub const ENTER_PATH: &str = "/.leasehold/enter";
/// The origin's own cookie; over https `__Host-` before it, which no other
/// origin of the domain can set or shadow.
pub const COOKIE: &str = "lh_lease_web";
/// How long a ticket may wait before it is used.
pub const TICKET_SECS: i64 = 60;
/// How long a browser stays in before it needs a new ticket (less where
/// the key that asked expires sooner).
pub const SESSION_SECS: i64 = 12 * 3600;
/// Longest path a ticket leads to, in bytes.
pub const MAX_NEXT_PATH_BYTES: usize = 2048;
/// Random bytes in a ticket and in a cookie.
const SECRET_BYTES: usize = 24;
/// Cookies remembered between the database's answers.
const MOST_SESSIONS_CACHED: usize = 10_000;
/// How long a cookie is taken on its key's word before the key and its
/// tenant are looked at again: a revocation or a suspension bites within.
const KEY_CHECK_SECS: u64 = 10;
/// Values of one cookie name looked at in a request.
const MOST_COOKIE_VALUES: usize = 4;

/// Who a cookie lets in, and where.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub(super) struct WebSession {
    pub tenant_id: Uuid,
    pub lease_id: Uuid,
    pub port: i32,
    /// The tenant's key that asked for the ticket; `None` where an OIDC
    /// token asked (the session then ends with that token).
    pub key_id: Option<i32>,
    pub expires_at: DateTime<Utc>,
}

/// Cookies read lately, by hash, with when their key was last looked at.
#[derive(Default)]
pub(super) struct SessionCache(PoisonFreeRwLock<HashMap<[u8; 32], (WebSession, Instant)>>);

fn secret() -> (String, [u8; 32]) {
    use rand::RngCore as _;
    let mut bytes = [0u8; SECRET_BYTES];
    rand::thread_rng().fill_bytes(&mut bytes);
    let secret = hex::encode(bytes);
    let sha: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
    (secret, sha)
}

/// Whether `text` could be a ticket or a cookie of ours: only those cost a
/// look-up.
fn looks_secret(text: &str) -> bool {
    text.len() == SECRET_BYTES * 2 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `path` may follow a ticket: a path of the origin's own.
pub fn next_path_ok(path: &str) -> bool {
    path.starts_with('/')
        && !path.starts_with("//")
        && !path.starts_with("/\\")
        && path.len() <= MAX_NEXT_PATH_BYTES
        && !path.chars().any(|c| c.is_control() || c == ' ')
}

/// Whether the tenant's key `key_id` is still taken (not revoked, not
/// expired, its tenant not suspended): `Some(its expiry)`, or `None`. With
/// no key (an OIDC token asked), whether the tenant is there and not
/// suspended.
async fn key_taken(
    pool: &sqlx::PgPool,
    tenant: Uuid,
    key_id: Option<i32>,
) -> Option<Option<DateTime<Utc>>> {
    /// Suspended, revoked, until when.
    type Standing = (bool, bool, Option<DateTime<Utc>>);
    let row: Result<Option<Standing>, _> = match key_id {
        Some(key_id) => {
            sqlx::query_as(
                "SELECT t.suspended, k.revoked_at IS NOT NULL, k.expires_at
                 FROM tenant_keys k JOIN tenants t ON t.id = k.tenant_id
                 WHERE k.tenant_id = $1 AND k.key_id = $2",
            )
            .bind(tenant)
            .bind(key_id)
            .fetch_optional(pool)
            .await
        }
        None => {
            sqlx::query_as("SELECT suspended, false, NULL::timestamptz FROM tenants WHERE id = $1")
                .bind(tenant)
                .fetch_optional(pool)
                .await
        }
    };
    let row = row.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read a lease web cookie's key");
        None
    });
    match row {
        Some((false, false, expires)) if expires.is_none_or(|at| at > Utc::now()) => Some(expires),
        _ => None,
    }
}

/// A short page of the gateway's own, for what it refuses.
pub(super) fn page(status: StatusCode, text: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from(format!("Leasehold: {text}\n")))
        .expect("a page")
}

/// Every value the request gives the cookie `name` (another origin of the
/// domain may have set one of the same name).
pub(super) fn cookies_named(request: &Request<Incoming>, name: &str) -> Vec<String> {
    request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .filter(|(n, _)| *n == name)
        .map(|(_, value)| value.to_string())
        .take(MOST_COOKIE_VALUES)
        .collect()
}

impl LeaseWeb {
    pub(super) fn cookie_name(&self) -> String {
        if self.secure() {
            format!("__Host-{COOKIE}")
        } else {
            COOKIE.to_string()
        }
    }

    /// A ticket into `lease`'s `port` for what the tenant's caller showed,
    /// leading to `next`: the URL to open, and until when.
    pub async fn ticket(
        &self,
        pool: &sqlx::PgPool,
        (tenant, credential): (Uuid, TenantCredential),
        lease: Uuid,
        port: u16,
        next: &str,
    ) -> Result<(String, DateTime<Utc>), sqlx::Error> {
        let (secret, sha) = secret();
        let expires_at = Utc::now() + chrono::Duration::seconds(TICKET_SECS);
        // What has expired goes as new tickets come: a ticket's path may
        // hold a page's token.
        for table in [TICKETS, SESSIONS] {
            sqlx::query(&format!(
                "DELETE FROM {KEYS_SCHEMA}.{table} WHERE expires_at < now()"
            ))
            .execute(pool)
            .await?;
        }
        sqlx::query(&format!(
            "INSERT INTO {KEYS_SCHEMA}.{TICKETS}
                 (sha256, tenant_id, lease_id, port, key_id, next_path, expires_at,
                  credential_expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        ))
        .bind(&sha[..])
        .bind(tenant)
        .bind(lease)
        .bind(port as i32)
        .bind(credential.key_id())
        .bind(next)
        .bind(expires_at)
        .bind(credential.expires_at())
        .execute(pool)
        .await?;
        Ok((
            format!("{}{ENTER_PATH}?ticket={secret}", self.origin(lease, port)),
            expires_at,
        ))
    }

    /// Who a cookie lets in, while its key is taken.
    pub(super) async fn session_of(&self, pool: &sqlx::PgPool, cookie: &str) -> Option<WebSession> {
        if !looks_secret(cookie) {
            return None;
        }
        let sha: [u8; 32] = Sha256::digest(cookie.as_bytes()).into();
        let cached = self.sessions.0.read().get(&sha).copied();
        if let Some((found, checked)) = cached {
            if found.expires_at <= Utc::now() {
                return None;
            }
            if checked.elapsed().as_secs() < KEY_CHECK_SECS {
                return Some(found);
            }
        }
        let found: WebSession = match cached {
            Some((found, _)) => found,
            None => sqlx::query_as(&format!(
                "SELECT tenant_id, lease_id, port, key_id, expires_at
                 FROM {KEYS_SCHEMA}.{SESSIONS} WHERE sha256 = $1 AND expires_at > now()"
            ))
            .bind(&sha[..])
            .fetch_optional(pool)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot read a lease web cookie");
                None
            })?,
        };
        if key_taken(pool, found.tenant_id, found.key_id)
            .await
            .is_none()
        {
            self.sessions.0.write().remove(&sha);
            let _ = sqlx::query(&format!(
                "DELETE FROM {KEYS_SCHEMA}.{SESSIONS} WHERE sha256 = $1"
            ))
            .bind(&sha[..])
            .execute(pool)
            .await;
            return None;
        }
        let mut cache = self.sessions.0.write();
        if cache.len() >= MOST_SESSIONS_CACHED {
            cache.clear();
        }
        cache.insert(sha, (found, Instant::now()));
        Some(found)
    }

    /// Trades a ticket for a cookie: the answer that sets it and leads on.
    pub(super) async fn enter(
        &self,
        pool: &sqlx::PgPool,
        lease: Uuid,
        port: u16,
        query: &str,
    ) -> Response<Body> {
        let ticket = form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == "ticket")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        let used_up = || {
            page(
                StatusCode::UNAUTHORIZED,
                "This link was used already or has expired: open the lease's web page from the console again.",
            )
        };
        if !looks_secret(&ticket) {
            return used_up();
        }
        let sha: [u8; 32] = Sha256::digest(ticket.as_bytes()).into();
        // Used once: taken from the table as it is read.
        type Ticket = (Uuid, Uuid, i32, Option<i32>, String, Option<DateTime<Utc>>);
        let taken: Option<Ticket> = sqlx::query_as(&format!(
            "DELETE FROM {KEYS_SCHEMA}.{TICKETS} WHERE sha256 = $1 AND expires_at > now()
             RETURNING tenant_id, lease_id, port, key_id, next_path, credential_expires_at"
        ))
        .bind(&sha[..])
        .fetch_optional(pool)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read a lease web ticket");
            None
        });
        let Some((tenant, ticket_lease, ticket_port, key_id, next, credential_expires)) = taken
        else {
            return used_up();
        };
        if ticket_lease != lease || ticket_port != port as i32 {
            return page(
                StatusCode::UNAUTHORIZED,
                "This ticket is for another lease or port.",
            );
        }
        // The cookie lives no longer than the key, or the token, that
        // asked for it.
        let Some(key_expires) = key_taken(pool, tenant, key_id).await else {
            return page(
                StatusCode::UNAUTHORIZED,
                "The key that asked for this link is no longer taken.",
            );
        };
        let mut expires_at = Utc::now() + chrono::Duration::seconds(SESSION_SECS);
        for until in [key_expires, credential_expires].into_iter().flatten() {
            expires_at = expires_at.min(until);
        }
        if expires_at <= Utc::now() {
            return page(
                StatusCode::UNAUTHORIZED,
                "The sign-in that asked for this link has expired.",
            );
        }
        let max_age = (expires_at - Utc::now()).num_seconds().max(1);
        let (cookie, sha) = secret();
        let stored = sqlx::query(&format!(
            "INSERT INTO {KEYS_SCHEMA}.{SESSIONS} (sha256, tenant_id, lease_id, port, key_id, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6)"
        ))
        .bind(&sha[..])
        .bind(tenant)
        .bind(lease)
        .bind(port as i32)
        .bind(key_id)
        .bind(expires_at)
        .execute(pool)
        .await;
        if let Err(e) = stored {
            tracing::warn!(error = %e, "cannot keep a lease web cookie");
            return page(StatusCode::SERVICE_UNAVAILABLE, "Try again shortly.");
        }
        let secure = if self.secure() { "; Secure" } else { "" };
        let mut response = Response::builder()
            .status(StatusCode::SEE_OTHER)
            .header(header::LOCATION, next)
            .header(header::CACHE_CONTROL, "no-store")
            .header(header::REFERRER_POLICY, "no-referrer")
            .body(Body::empty())
            .expect("a redirect");
        response.headers_mut().insert(
            header::SET_COOKIE,
            HeaderValue::from_str(&format!(
                "{}={cookie}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age}{secure}",
                self.cookie_name()
            ))
            .expect("hex is a header value"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_leads_only_to_a_path_of_the_origin() {
        assert!(next_path_ok("/"));
        assert!(next_path_ok("/tree?token=abc"));
        for bad in [
            "",
            "//evil.example/",
            "/\\evil",
            "https://evil.example/",
            "/a b",
            "/a\nb",
        ] {
            assert!(!next_path_ok(bad), "{bad:?}");
        }
        assert!(!next_path_ok(&format!(
            "/{}",
            "a".repeat(MAX_NEXT_PATH_BYTES)
        )));
    }

    #[test]
    fn only_what_could_be_ours_is_looked_up() {
        let (secret, _) = secret();
        assert!(looks_secret(&secret));
        assert!(!looks_secret(&secret[1..]));
        assert!(!looks_secret(&format!("{}z", &secret[1..])));
        assert!(!looks_secret(""));
    }

    #[test]
    fn over_https_the_cookie_is_the_origins_alone() {
        let web = LeaseWeb {
            scheme: "https".into(),
            ..super::super::tests::web()
        };
        assert_eq!(web.cookie_name(), "__Host-lh_lease_web");
        assert_eq!(super::super::tests::web().cookie_name(), "lh_lease_web");
    }
}
