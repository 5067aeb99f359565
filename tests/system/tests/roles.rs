//! Who may call what: every route of the gateway called by every kind of
//! caller, each answer asserted. The same table is the matrix in
//! docs/security.md ("Who may call what"); the test fails when the two
//! differ (`LH_BLESS_DOCS=1` rewrites the doc's table from this one).
//!
//! Objects are tenant A's (its tenant, keys and leases) for every caller
//! but the suspended tenant, which calls on its own: what a suspension
//! takes away is the tenant's power over its own things.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lh_events::{Actor, Operator, OperatorRole};
use lh_test_stack::{read_log, Stack, ADMIN_TOKEN, AUDITOR_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

const ALICE_KEY: &str = "alice-named-admin-key-0123456789abcdef";
const OIDC_ISSUER: &str = "https://id.example/realms/ops";
const OIDC_AUDIENCE: &str = "leasehold";
const CAROL_KEY: &str = "carol-named-auditor-key-0123456789abcdef";

/// The callers, in the order of the matrix's columns.
const CALLERS: &[&str] = &[
    "anonymous",
    "tenant A",
    "tenant B",
    "revoked key",
    "expired key",
    "suspended tenant",
    "admin (bootstrap)",
    "admin (named key)",
    "admin (OIDC)",
    "auditor (shared)",
    "auditor (named key)",
];

/// Each route and what each caller gets, in the order of [`CALLERS`].
/// `{t}`, `{k}`, `{s}`, `{l}`, `{n}`, `{d}` and `{w}` are the tenant, API
/// key, SSH key, lease, node, dataset and workspace the call is about;
/// `{v}` the dataset's version.
#[rustfmt::skip]
const MATRIX: &[(&str, &str, [u16; 11])] = &[
    ("GET", "/v1/whoami", [401, 200, 200, 401, 401, 200, 200, 200, 200, 200, 200]),
    // A sign-in answers anyone; this gateway's console offers keys only.
    ("GET", "/v1/oidc/console", [404, 404, 404, 404, 404, 404, 404, 404, 404, 404, 404]),
    ("POST", "/v1/oidc/token", [404, 404, 404, 404, 404, 404, 404, 404, 404, 404, 404]),
    ("POST", "/v1/tenants", [401, 403, 403, 401, 401, 403, 201, 201, 201, 403, 403]),
    // Every tenant, by name: operators'.
    ("GET", "/v1/tenants", [401, 403, 403, 401, 401, 403, 200, 200, 200, 200, 200]),
    ("GET", "/v1/tenants/{t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("POST", "/v1/tenants/{t}/suspend", [401, 403, 403, 401, 401, 403, 202, 202, 202, 403, 403]),
    ("POST", "/v1/tenants/{t}/resume", [401, 403, 403, 401, 401, 403, 202, 202, 202, 403, 403]),
    ("PUT", "/v1/tenants/{t}/quota", [401, 403, 403, 401, 401, 403, 200, 200, 200, 403, 403]),
    ("POST", "/v1/tenants/{t}/erase", [401, 403, 403, 401, 401, 403, 200, 200, 200, 403, 403]),
    ("POST", "/v1/tenants/{t}/keys", [401, 201, 404, 401, 401, 403, 201, 201, 201, 403, 403]),
    ("GET", "/v1/tenants/{t}/keys", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("DELETE", "/v1/tenants/{t}/keys/{k}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 403, 403]),
    ("POST", "/v1/ssh-keys", [401, 201, 201, 401, 401, 403, 403, 403, 403, 403, 403]),
    ("GET", "/v1/ssh-keys?tenant_id={t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("DELETE", "/v1/ssh-keys/{s}", [401, 204, 404, 401, 401, 204, 204, 204, 204, 403, 403]),
    // A tenant's own identity on the store: tenant B gets its own.
    ("GET", "/v1/storage/credentials", [401, 200, 200, 401, 401, 200, 403, 403, 403, 403, 403]),
    ("GET", "/v1/storage?tenant_id={t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("POST", "/v1/datasets", [401, 201, 201, 401, 401, 403, 403, 403, 403, 403, 403]),
    ("GET", "/v1/datasets?tenant_id={t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/datasets/{d}?tenant_id={t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    // It names the tenant's files: the tenant's alone.
    ("GET", "/v1/datasets/{d}/versions/{v}/manifest", [401, 200, 404, 401, 401, 200, 403, 403, 403, 403, 403]),
    ("DELETE", "/v1/datasets/{d}?tenant_id={t}", [401, 204, 404, 401, 401, 403, 204, 204, 204, 403, 403]),
    ("GET", "/v1/workspaces?tenant_id={t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("POST", "/v1/workspaces/{w}/snapshots", [401, 200, 404, 401, 401, 403, 403, 403, 403, 403, 403]),
    ("POST", "/v1/workspaces/{w}/restore", [401, 200, 404, 401, 401, 403, 403, 403, 403, 403, 403]),
    ("DELETE", "/v1/workspaces/{w}", [401, 204, 404, 401, 401, 403, 403, 403, 403, 403, 403]),
    ("POST", "/v1/tenants/{t}/balance/top-ups", [401, 403, 403, 401, 401, 403, 201, 201, 201, 403, 403]),
    ("GET", "/v1/tenants/{t}/balance", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("POST", "/v1/leases", [401, 202, 202, 401, 401, 403, 403, 403, 403, 403, 403]),
    ("POST", "/v1/quotes", [401, 201, 201, 401, 401, 403, 403, 403, 403, 403, 403]),
    ("GET", "/v1/leases", [401, 200, 200, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/leases/{l}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("POST", "/v1/leases/{l}/stop", [401, 202, 404, 401, 401, 403, 202, 202, 202, 403, 403]),
    ("POST", "/v1/leases/{l}/resume", [401, 409, 404, 401, 401, 403, 409, 409, 409, 403, 403]),
    ("GET", "/v1/leases/{l}/usage", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/usage?tenant={t}", [401, 200, 403, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/leases/{l}/logs", [401, 200, 404, 401, 401, 200, 200, 200, 200, 403, 403]),
    // A WebSocket's route called without one: 400 for whoever may enter.
    // Operators enter only where LH_OPERATOR_SESSIONS allows (off here).
    ("GET", "/v1/leases/{l}/exec?command=true", [401, 400, 404, 401, 401, 403, 403, 403, 403, 403, 403]),
    ("GET", "/v1/leases/{l}/port-forward?port=8080", [401, 400, 404, 401, 401, 403, 403, 403, 403, 403, 403]),
    // No lease web pages on this gateway: its tenant is told where to look.
    ("POST", "/v1/leases/{l}/web", [401, 404, 404, 401, 401, 403, 403, 403, 403, 403, 403]),
    ("POST", "/v1/nodes/{n}/enroll", [401, 403, 403, 401, 401, 403, 201, 201, 201, 403, 403]),
    ("POST", "/v1/nodes/{n}/drain", [401, 403, 403, 401, 401, 403, 202, 202, 202, 403, 403]),
    ("POST", "/v1/nodes/{n}/uncordon", [401, 403, 403, 401, 401, 403, 202, 202, 202, 403, 403]),
    // The fleet, with every lease's place on it: operators'.
    ("GET", "/v1/nodes", [401, 403, 403, 401, 401, 403, 200, 200, 200, 403, 403]),
    ("GET", "/v1/nodes/{n}", [401, 403, 403, 401, 401, 403, 200, 200, 200, 403, 403]),
    // What may be rented, and for how much: anyone's.
    ("GET", "/v1/gpus", [401, 200, 200, 401, 401, 200, 200, 200, 200, 200, 200]),
    // Each hears what it may read (tests/fleet_view.rs says what).
    ("GET", "/v1/events/stream?for_secs=1", [401, 200, 200, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/invoices?period={p}&tenant_id={t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/spot/prices", [401, 200, 200, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/templates", [401, 200, 200, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/invoices/{p}?tenant_id={t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/invoices/{p}/csv?tenant_id={t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/charges?period={p}&tenant_id={t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/reports/cost?week=2026-W49&tenant_id={t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/audit/verify", [401, 403, 403, 401, 401, 403, 200, 200, 200, 200, 200]),
    ("GET", "/v1/audit/events?tenant_id={t}", [401, 200, 404, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("POST", "/v1/price-books", [401, 403, 403, 401, 401, 403, 201, 201, 201, 403, 403]),
    ("GET", "/v1/price-books", [401, 200, 200, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("POST", "/v1/billing/what-if", [401, 403, 403, 401, 401, 403, 200, 200, 200, 403, 403]),
    ("POST", "/v1/reservations", [401, 403, 403, 401, 401, 403, 201, 201, 201, 403, 403]),
    ("GET", "/v1/reservations", [401, 200, 200, 401, 401, 200, 200, 200, 200, 200, 200]),
    ("GET", "/openapi.json", [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200]),
    ("GET", "/v1/no-such-route", [404, 404, 404, 404, 404, 404, 404, 404, 404, 404, 404]),
];

const ONE_GPU: &str = r#"{"gpus": 1, "gpu_model": "A100-40GB"}"#;

fn body_for(method: &str, path: &str) -> Option<Value> {
    match (method, path) {
        ("POST", "/v1/tenants") => {
            Some(json!({"name": "made", "email": "ops@made.example", "quota": {"max_gpus": 1}}))
        }
        ("POST", "/v1/tenants/{t}/suspend") => Some(json!({"reason": "matrix"})),
        ("POST", "/v1/leases/{l}/web") => Some(json!({"port": 8888})),
        ("POST", "/v1/oidc/token") => Some(json!({"code": "c", "code_verifier": "v".repeat(43),
            "redirect_uri": "http://127.0.0.1/console/"})),
        ("PUT", "/v1/tenants/{t}/quota") => Some(json!({"quota": {"max_gpus": 64}})),
        ("POST", "/v1/tenants/{t}/keys") => Some(json!({})),
        ("POST", "/v1/ssh-keys") => Some(json!({"name": "matrix", "public_key": ssh_key()})),
        ("POST", "/v1/datasets") => Some(json!({"name": "made", "manifest": {"files": []}})),
        ("POST", "/v1/workspaces/{w}/restore") => Some(json!({"snapshot": "{today}"})),
        ("POST", "/v1/tenants/{t}/balance/top-ups") => Some(json!({"amount": "1000"})),
        ("POST", "/v1/leases") => Some(serde_json::from_str(ONE_GPU).unwrap()),
        ("POST", "/v1/quotes") => {
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "duration_seconds": 3600}))
        }
        ("POST", "/v1/nodes/{n}/drain") => Some(json!({"mode": "finish", "reason": "matrix"})),
        ("POST", "/v1/nodes/{n}/enroll") => Some(json!({"zone": "cn-north-1a", "max_gpus": 8,
            "gpu_models": ["A100-40GB"], "max_isolation": "container", "gpu_sharing": ["hami-core"]})),
        // Each publish needs a newer version than the one before.
        ("POST", "/v1/reservations") => {
            Some(json!({"tenant_id": "{t}", "gpu_model": "A100-40GB", "zone": "z1", "gpus": 1}))
        }
        ("POST", "/v1/price-books") => {
            static VERSION: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(2);
            let version = VERSION.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some(json!({"version": version, "tiers": [
                {"tier": "basic", "price_cny_per_gb_hour": "0.5"}
            ]}))
        }
        ("POST", "/v1/billing/what-if") => Some(json!({"period": "2026-11", "book": {"tiers": [
            {"tier": "basic", "price_cny_per_gb_hour": "0.6"}
        ]}})),
        _ => None,
    }
}

/// A new SSH public key each call: 32 bytes a key as far as its form goes.
fn ssh_key() -> String {
    use base64::Engine as _;
    static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(1);
    let seed = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mut blob = Vec::new();
    blob.extend_from_slice(&11u32.to_be_bytes());
    blob.extend_from_slice(b"ssh-ed25519");
    blob.extend_from_slice(&32u32.to_be_bytes());
    blob.extend_from_slice(&[seed; 32]);
    format!(
        "ssh-ed25519 {}",
        base64::engine::general_purpose::STANDARD.encode(blob)
    )
}

struct Tenant {
    id: String,
    key: String,
}

/// An SSH key of `tenant`'s, added with its own API key: its id.
async fn add_ssh_key(stack: &Stack, tenant: &Tenant) -> String {
    let body = json!({"name": "matrix", "public_key": ssh_key()});
    let (status, added) = stack
        .call(Method::POST, "/v1/ssh-keys", &tenant.key, Some(body))
        .await;
    assert_eq!(status, 201, "{added}");
    added["id"].as_str().unwrap().to_string()
}

/// A dataset of `tenant`'s (an empty version), added with its own key:
/// its name.
async fn add_dataset(stack: &Stack, tenant: &Tenant) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let name = format!(
        "matrix-{}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    let body = json!({"name": name, "manifest": {"files": []}});
    let (status, added) = stack
        .call(Method::POST, "/v1/datasets", &tenant.key, Some(body))
        .await;
    assert_eq!(status, 201, "{added}");
    name
}

/// A workspace of `tenant`'s as a node's last sync leaves it, with today's
/// snapshot: its name.
async fn add_workspace(stack: &Stack, tenant: &Tenant) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let name = format!(
        "matrix-{}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    let (status, creds) = stack
        .call(Method::GET, "/v1/storage/credentials", &tenant.key, None)
        .await;
    assert_eq!(status, 200, "{creds}");
    let store = lh_storage::TenantStore::new(
        &lh_storage::StoreConfig::new(creds["endpoint"].as_str().unwrap()),
        creds["bucket"].as_str().unwrap(),
        &lh_storage::Credentials::new(
            creds["access_key_id"].as_str().unwrap(),
            creds["secret_access_key"].as_str().unwrap(),
        ),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ckpt"), "1").unwrap();
    let holder = lh_storage::workspace::Holder {
        lease_id: uuid::Uuid::new_v4(),
        placement: 1,
        node_id: "node-gone".into(),
    };
    lh_storage::workspace::sync(&store, &name, dir.path(), holder, true, &Default::default())
        .await
        .unwrap();
    let (status, taken) = stack
        .call(
            Method::POST,
            &format!("/v1/workspaces/{name}/snapshots"),
            &tenant.key,
            None,
        )
        .await;
    assert_eq!(status, 201, "{taken}");
    name
}

/// The version of an empty dataset (every `add_dataset` adds that one).
fn empty_version() -> String {
    lh_storage::Manifest::default().digest()
}

async fn tenant(stack: &Stack, name: &str) -> Tenant {
    let (id, key) = stack.create_tenant(name, 64).await;
    Tenant { id, key }
}

async fn issue_key(stack: &Stack, tenant: &Tenant, body: Value) -> Value {
    let (status, issued) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{}/keys", tenant.id),
            ADMIN_TOKEN,
            Some(body),
        )
        .await;
    assert_eq!(status, 201, "{issued}");
    issued
}

/// Sends one request; `key` None sends no Authorization header.
async fn send(
    stack: &Stack,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = stack.http.request(
        Method::from_bytes(method.as_bytes()).unwrap(),
        format!("{}{path}", stack.gateway_url),
    );
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("the gateway answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn keys_file(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("admin-keys");
    let line = |name: &str, role: &str, key: &str| {
        format!("{name} {role} {}\n", lh_gateway::http::sha256_hex(key))
    };
    std::fs::write(
        &path,
        format!(
            "# named operators\n{}{}",
            line("alice", "admin", ALICE_KEY),
            line("carol", "auditor", CAROL_KEY)
        ),
    )
    .unwrap();
    path
}

/// The claim that names the tenant a person signed in with OIDC acts for.
const OIDC_TENANT_CLAIM: &str = "leasehold_tenant";

/// An OIDC issuer of the test's own: an Ed25519 key, its JWKS in a file,
/// an admin's token signed with it, and its key to sign more.
fn oidc_issuer(dir: &std::path::Path) -> (PathBuf, String, jsonwebtoken::EncodingKey) {
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
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    header.kid = Some("k1".into());
    let now = chrono::Utc::now().timestamp();
    // The username is the user's to edit: the trail names the subject.
    let claims = json!({"iss": OIDC_ISSUER, "aud": OIDC_AUDIENCE, "sub": "dana",
                        "preferred_username": "bootstrap",
                        "exp": now + 3600, "roles": ["admin"]});
    let key = jsonwebtoken::EncodingKey::from_ed_der(pkcs8.as_ref());
    (jwks, oidc_token(&key, &claims), key)
}

fn oidc_token(key: &jsonwebtoken::EncodingKey, claims: &Value) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    header.kid = Some("k1".into());
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_route_answers_every_caller_as_the_matrix_says() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path());
    let (jwks, oidc_admin_token, oidc_key) = oidc_issuer(dir.path());
    // Tenants' data on a real store: its routes answer as they would.
    let store = lh_testkit::S3Store::start().await.unwrap();
    let storage = {
        use std::os::unix::fs::PermissionsExt;
        let (key_id, secret) = store.admin_keys();
        let secret_file = dir.path().join("s3-admin-secret");
        std::fs::write(&secret_file, secret).unwrap();
        std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        lh_gateway::storage::StorageArgs {
            storage_endpoint: Some(store.endpoint()),
            storage_admin_access_key_id: Some(key_id.to_string()),
            storage_admin_secret_key_file: Some(secret_file),
            ..Default::default()
        }
    };
    let stack = Stack::start_configured(FLEET, move |s| {
        s.gateway_config = Some(Arc::new(move |c: &mut lh_gateway::Config| {
            c.storage = storage.clone();
            c.admin_keys_file = Some(keys.clone());
            c.oidc = lh_gateway::OidcArgs {
                oidc_issuer: Some(OIDC_ISSUER.into()),
                oidc_audience: Some(OIDC_AUDIENCE.into()),
                oidc_jwks_file: Some(jwks.clone()),
                oidc_jwks_url: None,
                oidc_roles_claim: "roles".into(),
                oidc_tenant_claim: Some(OIDC_TENANT_CLAIM.into()),
            };
        }));
    })
    .await;
    let a = tenant(&stack, "tenant-a").await;
    // A person of tenant A signed in with the issuer: answered, on every
    // route, as tenant A's key is (the matrix's column for tenant A).
    let mut fay = json!({"iss": OIDC_ISSUER, "aud": OIDC_AUDIENCE, "sub": "fay",
                         "exp": chrono::Utc::now().timestamp() + 3600, "roles": []});
    fay[OIDC_TENANT_CLAIM] = json!(a.id);
    let a_by_oidc = oidc_token(&oidc_key, &fay);
    let b = tenant(&stack, "tenant-b").await;
    let s = tenant(&stack, "tenant-s").await;
    let s_lease = stack
        .lease(&s.key, serde_json::from_str(ONE_GPU).unwrap())
        .await;
    // Added before the suspension, which stops the tenant adding one.
    let s_ssh_key = add_ssh_key(&stack, &s).await;
    let s_dataset = add_dataset(&stack, &s).await;
    let s_workspace = add_workspace(&stack, &s).await;
    let today = chrono::Utc::now().date_naive().to_string();
    let revoked = issue_key(&stack, &a, json!({})).await;
    let (status, body) = stack
        .call(
            Method::DELETE,
            &format!("/v1/tenants/{}/keys/{}", a.id, revoked["key_id"]),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!((status, &body["state"]), (200, &json!("revoked")), "{body}");
    let expires_at = chrono::Utc::now() + chrono::Duration::seconds(1);
    let expired = issue_key(&stack, &a, json!({"expires_at": expires_at})).await;
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{}/suspend", s.id),
            ADMIN_TOKEN,
            Some(json!({"reason": "unpaid"})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let period = chrono::Utc::now().format("%Y-%m").to_string();
    let revoked_key = revoked["api_key"].as_str().unwrap().to_string();
    let expired_key = expired["api_key"].as_str().unwrap().to_string();
    let mut wrong = Vec::new();
    for (method, template, expected) in MATRIX {
        let callers = CALLERS.iter().copied().enumerate();
        for (column, caller) in callers.chain([(1, "tenant A (OIDC)")]) {
            // Whose objects the call is about, and with which key.
            let (owner, key): (&Tenant, Option<&str>) = match caller {
                "anonymous" => (&a, None),
                "tenant A" => (&a, Some(&a.key)),
                "tenant B" => (&a, Some(&b.key)),
                "revoked key" => (&a, Some(&revoked_key)),
                "expired key" => (&a, Some(&expired_key)),
                "suspended tenant" => (&s, Some(&s.key)),
                "admin (bootstrap)" => (&a, Some(ADMIN_TOKEN)),
                "admin (named key)" => (&a, Some(ALICE_KEY)),
                "admin (OIDC)" => (&a, Some(oidc_admin_token.as_str())),
                "tenant A (OIDC)" => (&a, Some(a_by_oidc.as_str())),
                "auditor (shared)" => (&a, Some(AUDITOR_TOKEN)),
                "auditor (named key)" => (&a, Some(CAROL_KEY)),
                other => unreachable!("{other}"),
            };
            // A fresh object for each call that uses one up.
            let lease = if template.contains("{l}") {
                if owner.id == s.id {
                    s_lease.clone()
                } else {
                    stack
                        .lease(&a.key, serde_json::from_str(ONE_GPU).unwrap())
                        .await
                }
            } else {
                String::new()
            };
            let ssh_key_id = if !template.contains("{s}") {
                String::new()
            } else if owner.id == s.id {
                s_ssh_key.clone()
            } else {
                add_ssh_key(&stack, owner).await
            };
            let dataset = if !template.contains("{d}") {
                String::new()
            } else if owner.id == s.id {
                s_dataset.clone()
            } else {
                add_dataset(&stack, owner).await
            };
            let workspace = if !template.contains("{w}") {
                String::new()
            } else if owner.id == s.id {
                s_workspace.clone()
            } else {
                add_workspace(&stack, owner).await
            };
            let key_id = if template.contains("{k}") {
                issue_key(&stack, owner, json!({}))
                    .await
                    .get("key_id")
                    .map(|v| v.to_string())
                    .unwrap_or_default()
            } else {
                String::new()
            };
            // Erasing uses its tenant up: each call gets a fresh one,
            // suspended and with no lease, that the caller's tenant stands for.
            let erased;
            let owner = if template.ends_with("/erase") {
                erased = tenant(&stack, "to-erase").await;
                let suspend = format!("/v1/tenants/{}/suspend", erased.id);
                let (status, answer) =
                    send(&stack, "POST", &suspend, Some(ADMIN_TOKEN), Some(json!({}))).await;
                assert_eq!(status, 202, "{answer}");
                &erased
            } else {
                owner
            };
            let path = template
                .replace("{t}", &owner.id)
                .replace("{l}", &lease)
                .replace("{k}", &key_id)
                .replace("{s}", &ssh_key_id)
                .replace("{d}", &dataset)
                .replace("{v}", &empty_version())
                .replace("{w}", &workspace)
                .replace("{n}", "node-b")
                .replace("{p}", &period);
            // A body naming the tenant names the caller's object too.
            // Tenant A's person makes what tenant A's key made before it
            // under another name, as a second client of the tenant would.
            let made = if caller == "tenant A (OIDC)" {
                "\"made-by-oidc\""
            } else {
                "\"made\""
            };
            let body = body_for(method, template).map(|b| {
                let text = b.to_string().replace("{t}", &owner.id);
                let text = text.replace("\"made\"", made);
                serde_json::from_str(&text.replace("{today}", &today)).unwrap()
            });
            let (status, answer) = send(&stack, method, &path, key, body).await;
            if status != expected[column] {
                wrong.push(format!(
                    "{method} {template} as {caller}: {status}, expected {}: {answer}",
                    expected[column]
                ));
            }
            if status < 300 && (template.ends_with("/suspend") || template.ends_with("/drain")) {
                // Put back what the call changed, for the callers after it.
                let undo = template
                    .replace("/suspend", "/resume")
                    .replace("/drain", "/uncordon")
                    .replace("{t}", &owner.id)
                    .replace("{n}", "node-b");
                let (status, answer) = send(&stack, "POST", &undo, Some(ADMIN_TOKEN), None).await;
                assert_eq!(status, 202, "{undo}: {answer}");
            }
        }
    }
    assert!(wrong.is_empty(), "cells that differ:\n{}", wrong.join("\n"));

    // The matrix has every route the OpenAPI document names, and no other.
    let (_, doc) = send(&stack, "GET", "/openapi.json", None, None).await;
    let shape = |method: &str, path: &str| {
        let path = path.split('?').next().unwrap();
        let path: String = path
            .split('/')
            .map(|part| if part.starts_with('{') { "{}" } else { part })
            .collect::<Vec<_>>()
            .join("/");
        format!("{} {path}", method.to_uppercase())
    };
    let mut documented: Vec<String> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| ops.as_object().unwrap().keys().map(move |m| shape(m, path)))
        .collect();
    documented.sort();
    let mut tested: Vec<String> = MATRIX
        .iter()
        .filter(|(_, path, _)| path.starts_with("/v1/") && !path.contains("no-such-route"))
        .map(|(method, path, _)| shape(method, path))
        .collect();
    tested.sort();
    assert_eq!(
        tested, documented,
        "the matrix and the OpenAPI routes differ"
    );

    // Every operator's write is recorded under its name; the bare shared
    // `admin` is never written, and the auditor wrote nothing but the
    // records of its own reads of the trail.
    let log = read_log(&stack.bus().await).await;
    let auditor_reads = log
        .iter()
        .filter(
            |e| matches!(&e.envelope.actor, Actor::Operator(o) if o.role == OperatorRole::Auditor),
        )
        .inspect(|e| assert_eq!(e.envelope.event_type, "audit.accessed", "the auditor wrote"))
        .count();
    assert_eq!(
        auditor_reads, 2,
        "one read each by the shared and the named auditor"
    );
    let actors: Vec<&Actor> = log.iter().map(|e| &e.envelope.actor).collect();
    let named = |name: &str, role| {
        Actor::Operator(Operator {
            name: name.into(),
            role,
        })
    };
    assert!(actors.contains(&&named("bootstrap", OperatorRole::Admin)));
    assert!(actors.contains(&&named("alice", OperatorRole::Admin)));
    assert!(actors.contains(&&named("oidc:dana", OperatorRole::Admin)));
    for actor in &actors {
        assert!(
            !matches!(actor, Actor::Admin | Actor::Auditor),
            "a shared actor in the log: {actor:?}"
        );
    }

    check_the_doc();
}

/// The matrix as the Markdown table docs/security.md carries.
fn markdown() -> String {
    let mut out = format!(
        "| route | {} |\n|---|{}\n",
        CALLERS.join(" | "),
        "---|".repeat(CALLERS.len())
    );
    for (method, path, expected) in MATRIX {
        let cells: Vec<String> = expected.iter().map(u16::to_string).collect();
        out.push_str(&format!("| `{method} {path}` | {} |\n", cells.join(" | ")));
    }
    out
}

const BEGIN: &str = "<!-- role-matrix:begin (tests/system/tests/roles.rs writes this table) -->\n";
const END: &str = "<!-- role-matrix:end -->";

fn check_the_doc() {
    let path = lh_testkit::workspace_root().join("docs/security.md");
    let doc = std::fs::read_to_string(&path).expect("docs/security.md");
    let (Some(begin), Some(end)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/security.md lacks the role-matrix markers");
    };
    let table = markdown();
    let current = &doc[begin + BEGIN.len()..end];
    if current != table {
        if std::env::var_os("LH_BLESS_DOCS").is_some() {
            let updated = format!("{}{BEGIN}{table}{}", &doc[..begin], &doc[end..]);
            std::fs::write(&path, updated).unwrap();
        } else {
            panic!(
                "the matrix in docs/security.md differs from this test's; \
                 run it with LH_BLESS_DOCS=1 and review the diff:\n{table}"
            );
        }
    }
}
