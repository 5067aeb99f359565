//! Operators sign in to the console with an OpenID Connect issuer, in a
//! real browser: the authorization code flow with PKCE, the code traded by
//! the gateway, the token then the console's Bearer. The issuer is the
//! test's own, speaking the protocol over HTTP on loopback (no issuer such
//! as Keycloak can be installed here): it signs Ed25519 tokens, checks the
//! S256 challenge against the verifier, and consents at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Form, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Json;
use lh_test_stack::{Stack, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

use crate::browser::Browser;

const ISSUER: &str = "https://id.example/realms/ops";
const AUDIENCE: &str = "leasehold";
const CLIENT_ID: &str = "leasehold-console";

/// A code given, and what it is bound to.
struct Pending {
    challenge: String,
    redirect_uri: String,
}

struct Issuer {
    pkcs8: Vec<u8>,
    /// The roles the next sign-in's token grants.
    roles: Mutex<Vec<String>>,
    codes: Mutex<HashMap<String, Pending>>,
}

impl Issuer {
    fn token(&self, sub: &str) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some("k1".into());
        let now = chrono::Utc::now().timestamp();
        let claims = json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": now + 600,
            "roles": *self.roles.lock().unwrap()});
        jsonwebtoken::encode(
            &header,
            &claims,
            &jsonwebtoken::EncodingKey::from_ed_der(&self.pkcs8),
        )
        .unwrap()
    }
}

async fn authorize(
    State(issuer): State<Arc<Issuer>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let ok = q.get("response_type").map(String::as_str) == Some("code")
        && q.get("client_id").map(String::as_str) == Some(CLIENT_ID)
        && q.get("code_challenge_method").map(String::as_str) == Some("S256")
        && q.get("scope")
            .is_some_and(|s| s.split(' ').any(|s| s == "openid"));
    if !ok {
        return (axum::http::StatusCode::BAD_REQUEST, format!("{q:?}")).into_response();
    }
    let code = uuid::Uuid::new_v4().to_string();
    let redirect_uri = q["redirect_uri"].clone();
    issuer.codes.lock().unwrap().insert(
        code.clone(),
        Pending {
            challenge: q["code_challenge"].clone(),
            redirect_uri: redirect_uri.clone(),
        },
    );
    Redirect::to(&format!("{redirect_uri}?code={code}&state={}", q["state"])).into_response()
}

async fn token(
    State(issuer): State<Arc<Issuer>>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    use base64::Engine as _;
    let refuse = |why: &str| {
        (
            axum::http::StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_grant", "error_description": why})),
        )
            .into_response()
    };
    let Some(pending) = f
        .get("code")
        .and_then(|c| issuer.codes.lock().unwrap().remove(c))
    else {
        return refuse("unknown code");
    };
    let verifier = f.get("code_verifier").cloned().unwrap_or_default();
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(ring::digest::digest(
        &ring::digest::SHA256,
        verifier.as_bytes(),
    ));
    if challenge != pending.challenge {
        return refuse("the verifier does not match the challenge");
    }
    if f.get("redirect_uri") != Some(&pending.redirect_uri)
        || f.get("client_id").map(String::as_str) != Some(CLIENT_ID)
    {
        return refuse("another client or redirect");
    }
    Json(
        json!({"access_token": issuer.token("erin"), "id_token": issuer.token("erin"),
        "token_type": "Bearer", "expires_in": 600}),
    )
    .into_response()
}

/// Starts the issuer on loopback: its base URL, its JWKS file.
async fn start_issuer(dir: &std::path::Path) -> (String, std::path::PathBuf, Arc<Issuer>) {
    use base64::Engine as _;
    use ring::signature::KeyPair as _;
    let pkcs8 =
        ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
    let jwks = dir.join("jwks.json");
    std::fs::write(
        &jwks,
        json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1", "x": x}]}).to_string(),
    )
    .unwrap();
    let issuer = Arc::new(Issuer {
        pkcs8: pkcs8.as_ref().to_vec(),
        roles: Mutex::new(vec!["admin".into()]),
        codes: Mutex::new(HashMap::new()),
    });
    let app = axum::Router::new()
        .route("/authorize", axum::routing::get(authorize))
        .route("/token", axum::routing::post(token))
        .with_state(issuer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, jwks, issuer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_signs_in_with_the_issuer_and_the_console_uses_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let (issuer_url, jwks, issuer) = start_issuer(dir.path()).await;
    let stack = Stack::start_configured(FLEET, |s| {
        let (issuer_url, jwks) = (issuer_url.clone(), jwks.clone());
        s.gateway_config = Some(Arc::new(move |c: &mut lh_gateway::Config| {
            c.oidc = lh_gateway::OidcArgs {
                oidc_issuer: Some(ISSUER.into()),
                oidc_audience: Some(AUDIENCE.into()),
                oidc_jwks_file: Some(jwks.clone()),
                oidc_jwks_url: None,
                oidc_roles_claim: "roles".into(),
            };
            c.console_sign_in = lh_gateway::http::console_sign_in::ConsoleSignInArgs {
                oidc_console_client_id: Some(CLIENT_ID.into()),
                oidc_console_client_secret_file: None,
                oidc_authorization_url: Some(format!("{issuer_url}/authorize")),
                oidc_token_url: Some(format!("{issuer_url}/token")),
                oidc_console_scope: "openid profile".into(),
            };
        }));
    })
    .await;
    let console = format!("{}/console/", stack.gateway_url);
    let (s, offered) = stack.call(Method::GET, "/v1/oidc/console", "", None).await;
    assert_eq!(s, 200, "{offered}");
    assert_eq!(offered["client_id"], CLIENT_ID);

    // Signed in at the issuer, back in the console as an admin: the fleet
    // is there, the code is gone from the address, and what the operator
    // does is the trail's `oidc:erin`.
    let browser = Browser::start().await;
    browser.go(&console).await;
    browser.click("#oidc-sign-in").await;
    browser.wait("#nav-fleet").await;
    let role = browser.text(&browser.wait("#role").await).await;
    assert_eq!(role, "Operator");
    let url: Value = browser.call(Method::GET, "/url", Value::Null).await;
    assert!(!url.as_str().unwrap().contains("code="), "{url}");
    browser.click("#nav-fleet").await;
    browser.wait("[data-node='node-a']").await;
    let token: Value = browser
        .run_script("return sessionStorage.getItem('leasehold.key');", json!([]))
        .await;
    let token = token.as_str().unwrap().to_string();
    let (s, me) = stack.call(Method::GET, "/v1/whoami", &token, None).await;
    assert_eq!((s, me["name"].as_str()), (200, Some("oidc:erin")), "{me}");

    // A code is traded once, with its own verifier only.
    browser.click("#signout").await;
    let (s, p) = stack
        .call(
            Method::POST,
            "/v1/oidc/token",
            "",
            Some(
                json!({"code": "not-a-code", "code_verifier": "v".repeat(43),
                "redirect_uri": console}),
            ),
        )
        .await;
    assert_eq!(s, 401, "{p}");
    let (s, p) = stack
        .call(
            Method::POST,
            "/v1/oidc/token",
            "",
            Some(json!({"code": "c", "code_verifier": "short", "redirect_uri": console})),
        )
        .await;
    assert_eq!(
        (s, p["field"].as_str()),
        (422, Some("code_verifier")),
        "{p}"
    );
    let (s, p) = stack
        .call(
            Method::POST,
            "/v1/oidc/token",
            "",
            Some(json!({"code": "c", "code_verifier": "v".repeat(43),
                "redirect_uri": "https://evil.example/steal"})),
        )
        .await;
    assert_eq!((s, p["field"].as_str()), (422, Some("redirect_uri")), "{p}");

    // A person the issuer grants no Leasehold role is told so, and stays
    // signed out.
    *issuer.roles.lock().unwrap() = vec!["viewer".into()];
    browser.click("#oidc-sign-in").await;
    let error = browser.text(&browser.wait("#signin-error").await).await;
    assert!(error.contains("no Leasehold role"), "{error}");
    assert!(browser.find("#nav-fleet").await.is_none());
    // A sign-in that comes back with another tab's state is not taken.
    browser
        .go(&format!("{console}?code=anything&state=forged"))
        .await;
    browser.wait("#signin-error").await;
    assert!(browser.find("#nav-fleet").await.is_none());
}
