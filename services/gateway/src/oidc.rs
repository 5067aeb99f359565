//! People signed in elsewhere: a Bearer that is a JWT from the configured
//! OpenID Connect issuer names an admin or an auditor by its roles claim,
//! or, where a tenant claim is configured, a person acting for the tenant
//! that claim names.
//!
//! A token is taken only when every check passes: its signature by a key
//! of the issuer's JWKS (RS256, ES256 or EdDSA, and the algorithm the key
//! itself is for, so a public key is never used as an HMAC secret and
//! `alg: none` never verifies), its issuer, its audience, and its `exp` and
//! `nbf` within a small leeway. The JWKS comes from a file or a URL; from a
//! URL it is cached and fetched again when a token names a key id the cache
//! does not hold (an issuer's key rotation), at most once per
//! [`MIN_REFRESH_INTERVAL`], each fetch bounded in size and time.
//!
//! The principal's name is `oidc:` and the token's `sub`, so it can never
//! pass for a named key or a shared token. Not `preferred_username`: OIDC
//! promises it neither unique nor stable, and an issuer may let its users
//! edit it, so one person could sign the trail as another. The username is
//! logged beside the subject at sign-in, for people to read.
//!
//! The issuer vouches for a tenant's people as it vouches for operators:
//! it is the platform's own (its operators configure it), and what it puts
//! in the tenant claim is the tenant a person may act for. An operator's
//! role wins over a tenant claim, so one token is never both. A tenant
//! signed in this way has no key to revoke: its token lives until its
//! `exp`, and suspending the tenant stops its writes as it does a key's.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use chrono::{DateTime, Utc};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use lh_events::{Operator, OperatorRole};
use serde::Deserialize;
use tokio::sync::{Mutex, RwLock};
use uuid::Uuid;

/// Clock difference tolerated on `exp` and `nbf`, in seconds.
pub const LEEWAY_S: u64 = 30;
/// Longest token looked at, in bytes.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Largest JWKS read or fetched, in bytes.
pub const MAX_JWKS_BYTES: usize = 256 * 1024;
/// Most keys kept from one JWKS.
pub const MAX_JWKS_KEYS: usize = 100;
/// How long one JWKS fetch may take.
pub const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Least time between two fetches of the JWKS, so that tokens naming
/// unknown key ids cannot make the gateway hammer the issuer.
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(10);
/// Longest principal name taken from a token, in characters.
pub const MAX_SUBJECT_CHARS: usize = 128;
/// What an OIDC principal's name starts with.
pub const NAME_PREFIX: &str = "oidc:";

/// Where the issuer's signing keys come from.
#[derive(Debug, Clone)]
pub enum JwksSource {
    File(PathBuf),
    /// `https://…`, or `http://` on a loopback address.
    Url(reqwest::Url),
}

#[derive(Debug, Clone)]
pub struct OidcConfig {
    pub issuer: String,
    pub audience: String,
    pub jwks: JwksSource,
    /// The claim holding the roles (a string or a list of strings).
    pub roles_claim: String,
    /// The claim naming the tenant (its id) a token without an operator's
    /// role acts for; `None`: tenants do not sign in with this issuer.
    pub tenant_claim: Option<String>,
}

/// Whom a valid token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signed {
    Operator(Operator),
    /// A person acting for a tenant, until the token expires.
    Tenant {
        id: Uuid,
        /// `oidc:` and the subject, for the gateway's log.
        name: String,
        expires_at: DateTime<Utc>,
    },
}

/// Why a token was refused; said to the caller as a 401 (or a 403 for a
/// valid token that grants no role).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the token is not valid: {0}")]
    Invalid(String),
    #[error("the token grants no Leasehold role ({0})")]
    NoRole(String),
}

impl Refused {
    /// The refusal of a token that names neither a role nor a tenant.
    fn no_role(config: &OidcConfig) -> Refused {
        let roles = format!(
            "claim `{}` holds neither admin nor auditor",
            config.roles_claim
        );
        Refused::NoRole(match &config.tenant_claim {
            Some(tenant) => format!("{roles}, and claim `{tenant}` names no tenant"),
            None => roles,
        })
    }
}

/// A key of the JWKS and the one algorithm it verifies.
struct Key {
    algorithm: Algorithm,
    decoding: DecodingKey,
}

struct Cache {
    keys: HashMap<String, Key>,
    fetched_at: Instant,
}

pub struct Verifier {
    config: OidcConfig,
    cache: RwLock<Cache>,
    /// One fetch at a time.
    refreshing: Mutex<()>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("issuer", &self.config.issuer)
            .finish()
    }
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    /// Required by the validation, which names it when it is missing.
    #[serde(default)]
    exp: Option<i64>,
    #[serde(default)]
    preferred_username: Option<String>,
    #[serde(flatten)]
    rest: HashMap<String, serde_json::Value>,
}

impl Verifier {
    /// Reads the JWKS once; a gateway whose issuer's keys cannot be read
    /// does not start, rather than refuse every operator later.
    pub async fn new(config: OidcConfig) -> anyhow::Result<Self> {
        ensure!(!config.issuer.is_empty(), "LH_OIDC_ISSUER is empty");
        ensure!(!config.audience.is_empty(), "LH_OIDC_AUDIENCE is empty");
        if let JwksSource::Url(url) = &config.jwks {
            let loopback = url
                .host_str()
                .is_some_and(|h| h == "localhost" || h == "127.0.0.1" || h == "[::1]");
            ensure!(
                url.scheme() == "https" || (url.scheme() == "http" && loopback),
                "LH_OIDC_JWKS_URL must be https:// (http:// only on a loopback address)"
            );
        }
        let http = reqwest::Client::builder()
            .timeout(JWKS_FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("building the JWKS client")?;
        let verifier = Verifier {
            config,
            cache: RwLock::new(Cache {
                keys: HashMap::new(),
                // The first unknown key id may fetch at once.
                fetched_at: Instant::now()
                    .checked_sub(MIN_REFRESH_INTERVAL)
                    .unwrap_or_else(Instant::now),
            }),
            refreshing: Mutex::new(()),
            http,
        };
        let keys = verifier.load().await?;
        verifier.cache.write().await.keys = keys;
        Ok(verifier)
    }

    /// Whether tokens may name a tenant (a tenant claim is configured).
    pub fn signs_in_tenants(&self) -> bool {
        self.config.tenant_claim.is_some()
    }

    /// Whether `token` has the shape of a JWT (three base64url parts);
    /// tenants' keys and shared tokens never do.
    pub fn looks_like_jwt(token: &str) -> bool {
        let parts: Vec<&str> = token.split('.').collect();
        parts.len() == 3
            && parts[..2].iter().all(|p| !p.is_empty())
            && token
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    }

    /// Whom a valid token names.
    pub async fn verify(&self, token: &str) -> Result<Signed, Refused> {
        let invalid = |why: &str| Refused::Invalid(why.to_string());
        if token.len() > MAX_TOKEN_BYTES {
            return Err(invalid("longer than allowed"));
        }
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| invalid("its header is unreadable or names an algorithm not allowed"))?;
        if !matches!(
            header.alg,
            Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA
        ) {
            return Err(invalid("only RS256, ES256 and EdDSA are accepted"));
        }
        let kid = header
            .kid
            .ok_or_else(|| invalid("its header names no key id"))?;
        if !self.cache.read().await.keys.contains_key(&kid) {
            self.refresh().await;
        }
        let cache = self.cache.read().await;
        let key = cache
            .keys
            .get(&kid)
            .ok_or_else(|| invalid("its key id is not among the issuer's keys"))?;
        if key.algorithm != header.alg {
            return Err(invalid("its algorithm is not the one its key is for"));
        }
        let mut validation = Validation::new(key.algorithm);
        validation.leeway = LEEWAY_S;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let claims = jsonwebtoken::decode::<Claims>(token, &key.decoding, &validation)
            .map_err(|e| {
                use jsonwebtoken::errors::ErrorKind;
                Refused::Invalid(
                    match e.kind() {
                        ErrorKind::ExpiredSignature => "it has expired",
                        ErrorKind::ImmatureSignature => "it is not valid yet (nbf)",
                        ErrorKind::InvalidIssuer => "its issuer is not the one configured",
                        ErrorKind::InvalidAudience => "its audience is not this gateway",
                        ErrorKind::InvalidSignature => "its signature does not verify",
                        ErrorKind::MissingRequiredClaim(_) => "it lacks exp, iss, aud or sub",
                        _ => "it cannot be verified",
                    }
                    .to_string(),
                )
            })?
            .claims;
        drop(cache);
        self.principal(claims)
    }

    fn principal(&self, claims: Claims) -> Result<Signed, Refused> {
        let who = claims.sub;
        if let Some(username) = claims.preferred_username.as_deref() {
            tracing::debug!(subject = who, username, "an OIDC token signs in");
        }
        if who.is_empty()
            || who.chars().count() > MAX_SUBJECT_CHARS
            || !who.chars().all(|c| c.is_ascii_graphic())
        {
            return Err(Refused::Invalid(format!(
                "its subject must be 1 to {MAX_SUBJECT_CHARS} printable characters"
            )));
        }
        let name = format!("{NAME_PREFIX}{who}");
        let roles: Vec<&str> = match claims.rest.get(&self.config.roles_claim) {
            Some(serde_json::Value::String(role)) => vec![role.as_str()],
            Some(serde_json::Value::Array(roles)) => {
                roles.iter().filter_map(serde_json::Value::as_str).collect()
            }
            _ => Vec::new(),
        };
        let role = if roles.contains(&"admin") {
            Some(OperatorRole::Admin)
        } else if roles.contains(&"auditor") {
            Some(OperatorRole::Auditor)
        } else {
            None
        };
        if let Some(role) = role {
            return Ok(Signed::Operator(Operator { name, role }));
        }
        let Some(tenant_claim) = &self.config.tenant_claim else {
            return Err(Refused::no_role(&self.config));
        };
        let tenant = match claims.rest.get(tenant_claim) {
            None | Some(serde_json::Value::Null) => return Err(Refused::no_role(&self.config)),
            Some(serde_json::Value::String(id)) => id.parse::<Uuid>().ok(),
            Some(_) => None,
        };
        let id = tenant.ok_or_else(|| {
            Refused::Invalid(format!(
                "its claim `{tenant_claim}` must be a tenant's id (a UUID)"
            ))
        })?;
        let expires_at = claims
            .exp
            .and_then(|exp| DateTime::from_timestamp(exp, 0))
            .ok_or_else(|| Refused::Invalid("its exp is not a time".into()))?;
        Ok(Signed::Tenant {
            id,
            name,
            expires_at,
        })
    }

    /// Fetches the JWKS again unless that happened a moment ago; a failed
    /// fetch keeps the keys known so far.
    async fn refresh(&self) {
        let Ok(_one) = self.refreshing.try_lock() else {
            // Another call is fetching: wait for it, then use its result.
            let _ = self.refreshing.lock().await;
            return;
        };
        if self.cache.read().await.fetched_at.elapsed() < MIN_REFRESH_INTERVAL {
            return;
        }
        match self.load().await {
            Ok(keys) => {
                let mut cache = self.cache.write().await;
                cache.keys = keys;
                cache.fetched_at = Instant::now();
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "the OIDC issuer's keys could not be fetched again");
                self.cache.write().await.fetched_at = Instant::now();
            }
        }
    }

    async fn load(&self) -> anyhow::Result<HashMap<String, Key>> {
        let bytes = match &self.config.jwks {
            JwksSource::File(path) => {
                let len = std::fs::metadata(path)
                    .with_context(|| format!("reading the JWKS {}", path.display()))?
                    .len();
                ensure!(
                    len <= MAX_JWKS_BYTES as u64,
                    "the JWKS {} is larger than {MAX_JWKS_BYTES} bytes",
                    path.display()
                );
                std::fs::read(path)
                    .with_context(|| format!("reading the JWKS {}", path.display()))?
            }
            JwksSource::Url(url) => self.fetch(url).await?,
        };
        parse_jwks(&bytes)
    }

    async fn fetch(&self, url: &reqwest::Url) -> anyhow::Result<Vec<u8>> {
        let mut response = self
            .http
            .get(url.clone())
            .send()
            .await
            .with_context(|| format!("fetching the JWKS from {url}"))?
            .error_for_status()
            .with_context(|| format!("fetching the JWKS from {url}"))?;
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.context("reading the JWKS")? {
            ensure!(
                body.len() + chunk.len() <= MAX_JWKS_BYTES,
                "the JWKS at {url} is larger than {MAX_JWKS_BYTES} bytes"
            );
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// The keys of a JWKS that this gateway can use, by key id; keys of other
/// kinds (HMAC secrets, other curves) and keys without an id are skipped.
fn parse_jwks(bytes: &[u8]) -> anyhow::Result<HashMap<String, Key>> {
    let set: JwkSet =
        serde_json::from_slice(bytes).context("the JWKS is not a JSON Web Key Set")?;
    let mut keys = HashMap::new();
    for jwk in set.keys.iter().take(MAX_JWKS_KEYS) {
        let Some(kid) = &jwk.common.key_id else {
            continue;
        };
        let algorithm = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                Algorithm::EdDSA
            }
            _ => continue,
        };
        let Ok(decoding) = DecodingKey::from_jwk(jwk) else {
            continue;
        };
        keys.insert(
            kid.clone(),
            Key {
                algorithm,
                decoding,
            },
        );
    }
    if keys.is_empty() {
        bail!("the JWKS holds no RS256, ES256 or EdDSA key with a key id");
    }
    Ok(keys)
}
