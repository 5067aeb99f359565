//! Operators, and tenants' people where the issuer names their tenant,
//! sign in to the console with an OpenID Connect issuer, in a real browser: the authorization code flow with PKCE, the code traded by
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
const TENANT_CLAIM: &str = "leasehold_tenant";
/// How long the issuer's tokens live.
const TOKEN_SECS: i64 = 600;

/// A code given, and what it is bound to.
struct Pending {
    challenge: String,
    redirect_uri: String,
}

struct Issuer {
    pkcs8: Vec<u8>,
    /// The roles the next sign-in's token grants.
    roles: Mutex<Vec<String>>,
    /// What the next token's tenant claim holds, if it has one.
    tenant: Mutex<Option<String>>,
    codes: Mutex<HashMap<String, Pending>>,
}

impl Issuer {
    fn token(&self, sub: &str) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some("k1".into());
        let now = chrono::Utc::now().timestamp();
        let mut claims = json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": now + TOKEN_SECS,
            "roles": *self.roles.lock().unwrap()});
        if let Some(tenant) = &*self.tenant.lock().unwrap() {
            claims[TENANT_CLAIM] = json!(tenant);
        }
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
        tenant: Mutex::new(None),
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

/// A stack whose gateway takes the issuer's tokens and offers it to the
/// console; tenants sign in with it too where `tenant_claim` is set.
async fn stack_with_issuer(
    issuer_url: &str,
    jwks: &std::path::Path,
    tenant_claim: Option<&str>,
    lease_web_port: Option<u16>,
) -> Stack {
    let (issuer_url, jwks) = (issuer_url.to_string(), jwks.to_path_buf());
    let tenant_claim = tenant_claim.map(String::from);
    Stack::start_configured(FLEET, |s| {
        s.gateway_config = Some(Arc::new(move |c: &mut lh_gateway::Config| {
            c.oidc = lh_gateway::OidcArgs {
                oidc_issuer: Some(ISSUER.into()),
                oidc_audience: Some(AUDIENCE.into()),
                oidc_jwks_file: Some(jwks.clone()),
                oidc_jwks_url: None,
                oidc_roles_claim: "roles".into(),
                oidc_tenant_claim: tenant_claim.clone(),
            };
            c.console_sign_in = lh_gateway::http::console_sign_in::ConsoleSignInArgs {
                oidc_console_client_id: Some(CLIENT_ID.into()),
                oidc_console_client_secret_file: None,
                oidc_authorization_url: Some(format!("{issuer_url}/authorize")),
                oidc_token_url: Some(format!("{issuer_url}/token")),
                oidc_console_scope: "openid profile".into(),
            };
            if let Some(port) = lease_web_port {
                c.lease_web = lh_gateway::lease_web::LeaseWebArgs {
                    lease_web_addr: Some(format!("127.0.0.1:{port}")),
                    lease_web_base: Some(format!("http://localhost:{port}")),
                };
            }
        }));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_signs_in_with_the_issuer_and_the_console_uses_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let (issuer_url, jwks, issuer) = start_issuer(dir.path()).await;
    let stack = stack_with_issuer(&issuer_url, &jwks, None, None).await;
    let console = format!("{}/console/", stack.gateway_url);
    let (s, offered) = stack.call(Method::GET, "/v1/oidc/console", "", None).await;
    assert_eq!(s, 200, "{offered}");
    assert_eq!(offered["client_id"], CLIENT_ID);
    assert_eq!(offered["tenants"], false, "{offered}");

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
    let token = console_token(&browser).await;
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

/// The token the console keeps as its key.
async fn console_token(browser: &Browser) -> String {
    let token: Value = browser
        .run_script("return sessionStorage.getItem('leasehold.key');", json!([]))
        .await;
    token.as_str().unwrap().to_string()
}

/// Where the issuer names a tenant, that tenant's people sign in with it
/// too: the console shows the tenant's pages, and the token rents, reads
/// and enters a lease's web page as the tenant's key does, for that tenant
/// alone. A suspension stops its writes and its web page; a tenant the
/// platform does not have, or a claim that is no tenant id, is refused; an
/// operator's role wins over a tenant claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_person_signs_in_with_the_issuer_and_acts_for_that_tenant_alone() {
    use crate::console_lease::{cookie_set_by, enter_web, free_port, web_get};
    let dir = tempfile::tempdir().unwrap();
    let (issuer_url, jwks, issuer) = start_issuer(dir.path()).await;
    let web_port = free_port();
    let stack = stack_with_issuer(&issuer_url, &jwks, Some(TENANT_CLAIM), Some(web_port)).await;
    let (tenant, key) = stack.create_tenant("acme", 4).await;
    let (_, stranger) = stack.create_tenant("other", 4).await;
    let (s, offered) = stack.call(Method::GET, "/v1/oidc/console", "", None).await;
    assert_eq!((s, &offered["tenants"]), (200, &json!(true)), "{offered}");

    // Signed in at the issuer, back in the console as the tenant.
    *issuer.roles.lock().unwrap() = Vec::new();
    *issuer.tenant.lock().unwrap() = Some(tenant.clone());
    let browser = Browser::start().await;
    browser.go(&format!("{}/console/", stack.gateway_url)).await;
    let button = browser.text(&browser.wait("#oidc-sign-in").await).await;
    assert_eq!(button, "Sign in with your organisation");
    browser.click("#oidc-sign-in").await;
    browser.wait("#nav-leases").await;
    assert_eq!(browser.text(&browser.wait("#role").await).await, "Tenant");
    assert!(browser.find("#nav-fleet").await.is_none());
    let token = console_token(&browser).await;
    let (s, me) = stack.call(Method::GET, "/v1/whoami", &token, None).await;
    assert_eq!(s, 200, "{me}");
    assert_eq!(
        (me["kind"].as_str(), me["tenant_id"].as_str()),
        (Some("tenant"), Some(tenant.as_str())),
        "{me}"
    );

    // It rents as the tenant: the tenant's key sees the lease, another
    // tenant's lease is not found with the token.
    let lease = stack
        .lease(&token, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    stack
        .wait_lease(&key, &lease, |l| l["state"] == "running")
        .await;
    let theirs = stack
        .lease(&stranger, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    let (s, p) = stack
        .call(Method::GET, &format!("/v1/leases/{theirs}"), &token, None)
        .await;
    assert_eq!(s, 404, "{p}");
    // The console lists the lease the token rented.
    browser.click("#nav-leases").await;
    browser.wait(&format!("[data-lease='{lease}']")).await;

    // Its lease's web page: the cookie lives no longer than the token.
    let entered = enter_web(&stack, &token, &lease, 8888, web_port).await;
    assert_eq!(entered.status(), 303);
    let set_cookie = entered.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_string();
    let max_age: i64 = set_cookie
        .split(';')
        .find_map(|part| part.trim().strip_prefix("Max-Age="))
        .and_then(|age| age.parse().ok())
        .unwrap_or_else(|| panic!("{set_cookie}"));
    assert!((1..=TOKEN_SECS).contains(&max_age), "{set_cookie}");
    let cookie = cookie_set_by(&entered);
    let host = format!("{lease}-8888.localhost:{web_port}");
    // Taken: the simulated node has nothing to serve, but the gateway let
    // the browser in.
    let inside = web_get(web_port, &host, "/", Some(&cookie)).await;
    assert_ne!(inside.status(), 401);

    // Suspended: its writes are refused, and its web page within the
    // cookie's check interval.
    let (s, p) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant}/suspend"),
            lh_test_stack::ADMIN_TOKEN,
            Some(json!({"reason": "unpaid"})),
        )
        .await;
    assert_eq!(s, 202, "{p}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (s, p) = stack
            .call(
                Method::POST,
                "/v1/leases",
                &token,
                Some(json!({"gpus": 1, "gpu_model": "A100-40GB"})),
            )
            .await;
        let shut = web_get(web_port, &host, "/", Some(&cookie)).await.status() == 401;
        if s == 403 && shut {
            assert!(p["detail"].as_str().unwrap().contains("suspended"), "{p}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {s} {p}, cookie shut: {shut}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }

    // A tenant this platform does not have, a claim that is no tenant's
    // id, or none: each refused, saying which.
    let refusals = [
        (Some(uuid::Uuid::new_v4().to_string()), 403, "does not have"),
        (Some("acme".to_string()), 401, TENANT_CLAIM),
        (None, 403, "names no tenant"),
    ];
    for (claim, status, says) in refusals {
        *issuer.tenant.lock().unwrap() = claim;
        let (s, p) = stack
            .call(Method::GET, "/v1/whoami", &issuer.token("mallory"), None)
            .await;
        assert_eq!(s, status, "{p}");
        assert!(p["detail"].as_str().unwrap().contains(says), "{p}");
    }

    // An operator's role wins over a tenant claim: one token is never both.
    *issuer.roles.lock().unwrap() = vec!["auditor".into()];
    *issuer.tenant.lock().unwrap() = Some(tenant.clone());
    let (s, me) = stack
        .call(Method::GET, "/v1/whoami", &issuer.token("erin"), None)
        .await;
    assert_eq!(s, 200, "{me}");
    assert_eq!(
        (me["kind"].as_str(), me["role"].as_str()),
        (Some("operator"), Some("auditor")),
        "{me}"
    );
}
