//! Operators, and tenants' people where the issuer names their tenant,
//! sign in to the console with the OpenID Connect issuer, where one is
//! configured for it: the authorization code flow with PKCE. The
//! browser goes to the issuer and comes back with a code; the gateway,
//! not the page, trades the code for tokens (the console's policy lets it
//! call its own origin only, and a client secret never reaches a browser),
//! and gives the page the token that names an admin, an auditor or a
//! tenant, the same token any client may send as its Bearer.
//!
//! `GET /v1/oidc/console` tells the page where to send the browser;
//! `POST /v1/oidc/token` trades the code. Both answer anyone, as a sign-in
//! must; what they give is worth nothing without the issuer's consent.

use std::path::PathBuf;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ApiContext, ApiError, ApiJson};
use uuid::Uuid;

use crate::oidc::{Refused, Signed};

/// Longest code taken from a browser, in bytes.
pub const MAX_CODE_BYTES: usize = 2048;
/// Longest redirect URI, in bytes.
pub const MAX_REDIRECT_URI_BYTES: usize = 2048;
/// Largest answer read from the issuer's token endpoint, in bytes.
pub const MAX_TOKEN_ANSWER_BYTES: usize = 64 * 1024;
/// Longest the issuer's token endpoint may take.
pub const TOKEN_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);
/// What the console asks the issuer for when nothing else is set.
pub const DEFAULT_SCOPE: &str = "openid";

/// The console's client at the issuer, from the gateway's configuration.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConsoleSignInArgs {
    /// The console's client id at the OIDC issuer: set, and the console
    /// offers operators to sign in there (with LH_OIDC_AUTHORIZATION_URL
    /// and LH_OIDC_TOKEN_URL).
    #[arg(long, env = "LH_OIDC_CONSOLE_CLIENT_ID")]
    pub oidc_console_client_id: Option<String>,
    /// A file holding the console client's secret, for an issuer that
    /// takes the console as a confidential client; none for a public one.
    #[arg(long, env = "LH_OIDC_CONSOLE_CLIENT_SECRET_FILE")]
    pub oidc_console_client_secret_file: Option<PathBuf>,
    /// The issuer's authorization endpoint (https, or http on loopback).
    #[arg(long, env = "LH_OIDC_AUTHORIZATION_URL")]
    pub oidc_authorization_url: Option<String>,
    /// The issuer's token endpoint (https, or http on loopback).
    #[arg(long, env = "LH_OIDC_TOKEN_URL")]
    pub oidc_token_url: Option<String>,
    /// The scopes the console asks for, space-separated.
    #[arg(long, env = "LH_OIDC_CONSOLE_SCOPE", default_value = DEFAULT_SCOPE)]
    pub oidc_console_scope: String,
}

/// The console's client, checked.
#[derive(Debug, Clone)]
pub struct ConsoleSignIn {
    client_id: String,
    client_secret: Option<String>,
    authorization_url: reqwest::Url,
    token_url: reqwest::Url,
    scope: String,
    http: reqwest::Client,
}

fn endpoint(name: &str, value: Option<&str>) -> anyhow::Result<reqwest::Url> {
    let value = value.ok_or_else(|| {
        anyhow::anyhow!("LH_OIDC_CONSOLE_CLIENT_ID is set, so {name} must be too")
    })?;
    let url: reqwest::Url = value
        .parse()
        .map_err(|e| anyhow::anyhow!("{name} {value:?} is not a URL: {e}"))?;
    let loopback = url
        .host_str()
        .and_then(|h| h.trim_matches(['[', ']']).parse::<std::net::IpAddr>().ok())
        .is_some_and(|ip| ip.is_loopback())
        || url.host_str() == Some("localhost");
    anyhow::ensure!(
        url.scheme() == "https" || (url.scheme() == "http" && loopback),
        "{name} must be https:// (http:// only on a loopback address)"
    );
    Ok(url)
}

impl ConsoleSignInArgs {
    /// The console's client, or `None` where the console offers keys only.
    pub fn config(&self, issuer_set: bool) -> anyhow::Result<Option<ConsoleSignIn>> {
        let Some(client_id) = self.oidc_console_client_id.clone() else {
            return Ok(None);
        };
        anyhow::ensure!(
            issuer_set,
            "LH_OIDC_CONSOLE_CLIENT_ID is set but LH_OIDC_ISSUER is not: the console's tokens are checked as the issuer's"
        );
        let client_secret = match &self.oidc_console_client_secret_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        Ok(Some(ConsoleSignIn {
            client_id,
            client_secret,
            authorization_url: endpoint(
                "LH_OIDC_AUTHORIZATION_URL",
                self.oidc_authorization_url.as_deref(),
            )?,
            token_url: endpoint("LH_OIDC_TOKEN_URL", self.oidc_token_url.as_deref())?,
            scope: self.oidc_console_scope.clone(),
            http: reqwest::Client::builder()
                .timeout(TOKEN_EXCHANGE_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
        }))
    }
}

/// Where the console sends an operator to sign in.
#[derive(Debug, Serialize, ToSchema)]
pub struct ConsoleSignInView {
    pub authorization_endpoint: String,
    pub client_id: String,
    pub scope: String,
    /// Whether the issuer signs in tenants' people too, not only operators
    /// (`LH_OIDC_TENANT_CLAIM` is set).
    pub tenants: bool,
}

/// A code the issuer gave the browser, to trade.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeExchange {
    pub code: String,
    /// The PKCE verifier whose S256 challenge the browser sent the issuer.
    pub code_verifier: String,
    /// The redirect URI the browser named to the issuer: this gateway's
    /// `/console/`.
    pub redirect_uri: String,
}

/// The token the console then sends as its Bearer.
#[derive(Debug, Serialize, ToSchema)]
pub struct SignedIn {
    pub token: String,
    /// `admin`, `auditor`, or `tenant` where the issuer names a tenant
    /// (`LH_OIDC_TENANT_CLAIM`).
    pub role: &'static str,
    /// `oidc:` and the subject.
    pub name: String,
    /// The tenant a `tenant` acts for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<Uuid>,
    /// Seconds the issuer says the token lives, where it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_in: Option<u64>,
}

fn not_configured() -> ApiError {
    ApiError::not_found(
        "this gateway offers no OIDC sign-in to the console (LH_OIDC_CONSOLE_CLIENT_ID is not set)",
    )
}

#[utoipa::path(
    get, path = "/v1/oidc/console",
    responses((status = 200, body = ConsoleSignInView), (status = 404, body = super::Problem))
)]
pub async fn console(State(ctx): State<ApiContext>) -> Result<Json<ConsoleSignInView>, ApiError> {
    let sign_in = ctx.console_sign_in.as_ref().ok_or_else(not_configured)?;
    Ok(Json(ConsoleSignInView {
        authorization_endpoint: sign_in.authorization_url.to_string(),
        client_id: sign_in.client_id.clone(),
        scope: sign_in.scope.clone(),
        tenants: ctx
            .principals
            .oidc
            .as_ref()
            .is_some_and(|oidc| oidc.signs_in_tenants()),
    }))
}

/// A PKCE verifier as RFC 7636 has it: 43 to 128 unreserved characters.
fn verifier_ok(v: &str) -> bool {
    (43..=128).contains(&v.len())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: Option<String>,
    id_token: Option<String>,
    expires_in: Option<u64>,
}

#[utoipa::path(
    post, path = "/v1/oidc/token", request_body = CodeExchange,
    responses(
        (status = 200, body = SignedIn),
        (status = 401, body = super::Problem, description = "The issuer refused the code, or its token is not valid here"),
        (status = 403, body = super::Problem, description = "The token grants no Leasehold role"),
        (status = 404, body = super::Problem), (status = 422, body = super::Problem),
        (status = 502, body = super::Problem, description = "The issuer's token endpoint failed")
    )
)]
pub async fn token(
    State(ctx): State<ApiContext>,
    headers: axum::http::HeaderMap,
    ApiJson(body): ApiJson<CodeExchange>,
) -> Result<Json<SignedIn>, ApiError> {
    let sign_in = ctx.console_sign_in.as_ref().ok_or_else(not_configured)?;
    let verifier = ctx.principals.oidc.as_ref().ok_or_else(not_configured)?;
    if body.code.is_empty() || body.code.len() > MAX_CODE_BYTES {
        return Err(ApiError::unprocessable(
            format!("a code of 1 to {MAX_CODE_BYTES} bytes"),
            "code",
        ));
    }
    if !verifier_ok(&body.code_verifier) {
        return Err(ApiError::unprocessable(
            "a PKCE verifier of 43 to 128 characters A-Z a-z 0-9 - . _ ~",
            "code_verifier",
        ));
    }
    let redirect: Option<reqwest::Url> = (body.redirect_uri.len() <= MAX_REDIRECT_URI_BYTES)
        .then(|| body.redirect_uri.parse().ok())
        .flatten();
    // This gateway's own console, as the browser asking reached it: a code
    // the issuer sent elsewhere is not traded here.
    let asked_at = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if !redirect.is_some_and(|u| {
        ["http", "https"].contains(&u.scheme())
            && u.path() == "/console/"
            && u.query().is_none()
            && u.fragment().is_none()
            && u.host_str().is_some_and(|host| match u.port() {
                Some(port) => asked_at == format!("{host}:{port}"),
                None => asked_at == host,
            })
    }) {
        return Err(ApiError::unprocessable(
            "the console's own address, ending /console/",
            "redirect_uri",
        ));
    }
    let mut form = vec![
        ("grant_type", "authorization_code"),
        ("code", body.code.as_str()),
        ("code_verifier", body.code_verifier.as_str()),
        ("redirect_uri", body.redirect_uri.as_str()),
        ("client_id", sign_in.client_id.as_str()),
    ];
    if let Some(secret) = &sign_in.client_secret {
        form.push(("client_secret", secret.as_str()));
    }
    let answer = sign_in
        .http
        .post(sign_in.token_url.clone())
        .form(&form)
        .send()
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "the OIDC issuer's token endpoint did not answer");
            ApiError::bad_gateway("the issuer's token endpoint did not answer")
        })?;
    let status = answer.status();
    let bytes = read_bounded(answer).await?;
    // What the issuer said goes to the gateway's log, not to whoever asked.
    if status.is_client_error() {
        tracing::info!(%status, answer = %String::from_utf8_lossy(&bytes[..bytes.len().min(300)]),
            "the OIDC issuer refused a console sign-in's code");
        return Err(ApiError::unauthorized(format!(
            "the issuer refused the code ({status}); sign in again"
        )));
    }
    if !status.is_success() {
        return Err(ApiError::bad_gateway(format!(
            "the issuer's token endpoint answered {status}"
        )));
    }
    let tokens: TokenAnswer = serde_json::from_slice(&bytes)
        .map_err(|_| ApiError::bad_gateway("the issuer's token answer is not JSON"))?;
    // The access token where the issuer makes it for this audience, else
    // the ID token; each checked as any Bearer is.
    let mut refused = None;
    for candidate in [tokens.access_token, tokens.id_token].into_iter().flatten() {
        match verifier.verify(&candidate).await {
            Ok(Signed::Operator(operator)) => {
                tracing::info!(operator = %operator.name, role = operator.role.as_str(), "an operator signed in to the console");
                return Ok(Json(SignedIn {
                    token: candidate,
                    role: operator.role.as_str(),
                    name: operator.name,
                    tenant_id: None,
                    expires_in: tokens.expires_in,
                }));
            }
            Ok(Signed::Tenant { id, name, .. }) => {
                // Asked as any call with the token is, so that a tenant
                // this platform does not have is refused here and now.
                let known: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM tenants WHERE id = $1 AND NOT erased)",
                )
                .bind(id)
                .fetch_one(&ctx.pool)
                .await?;
                if !known {
                    tracing::info!(%name, tenant = %id, "an OIDC token names a tenant this platform does not have");
                    return Err(ApiError::forbidden(format!(
                        "the token names tenant {id}, which this platform does not have"
                    )));
                }
                tracing::info!(%name, tenant = %id, "a tenant's person signed in to the console");
                return Ok(Json(SignedIn {
                    token: candidate,
                    role: "tenant",
                    name,
                    tenant_id: Some(id),
                    expires_in: tokens.expires_in,
                }));
            }
            Err(why) => refused = Some(why),
        }
    }
    Err(match refused {
        Some(why @ Refused::NoRole(_)) => ApiError::forbidden(why.to_string()),
        Some(why) => ApiError::unauthorized(why.to_string()),
        None => ApiError::bad_gateway("the issuer gave no token"),
    })
}

async fn read_bounded(mut answer: reqwest::Response) -> Result<Vec<u8>, ApiError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = answer
        .chunk()
        .await
        .map_err(|_| ApiError::bad_gateway("the issuer's token answer broke off"))?
    {
        if bytes.len() + chunk.len() > MAX_TOKEN_ANSWER_BYTES {
            return Err(ApiError::bad_gateway(format!(
                "the issuer's token answer is over {MAX_TOKEN_ANSWER_BYTES} bytes"
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_is_as_rfc_7636_has_it() {
        assert!(verifier_ok(&"a".repeat(43)));
        assert!(verifier_ok(&"A-._~9".repeat(20)));
        assert!(!verifier_ok(&"a".repeat(42)));
        assert!(!verifier_ok(&"a".repeat(129)));
        assert!(!verifier_ok(&format!("{}+", "a".repeat(43))));
    }

    #[test]
    fn endpoints_are_https_or_loopback() {
        assert!(endpoint("X", Some("https://id.example/token")).is_ok());
        assert!(endpoint("X", Some("http://127.0.0.1:9/token")).is_ok());
        assert!(endpoint("X", Some("http://[::1]:9/token")).is_ok());
        assert!(endpoint("X", Some("http://id.example/token")).is_err());
        assert!(endpoint("X", None).is_err());
        let args = ConsoleSignInArgs {
            oidc_console_client_id: Some("console".into()),
            oidc_authorization_url: Some("https://id.example/auth".into()),
            oidc_token_url: Some("https://id.example/token".into()),
            oidc_console_scope: DEFAULT_SCOPE.into(),
            ..Default::default()
        };
        assert!(args.config(false).is_err(), "needs the issuer");
        assert!(args.config(true).unwrap().is_some());
        assert!(ConsoleSignInArgs::default().config(true).unwrap().is_none());
    }
}
