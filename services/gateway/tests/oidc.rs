//! OIDC tokens against the gateway's verifier: keys generated here, the
//! JWKS served from a file and from a local HTTP server, and each way a
//! token can be wrong refused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use lh_events::{Operator, OperatorRole};
use lh_gateway::oidc::{JwksSource, OidcConfig, Refused, Signed, Verifier};
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};

const ISSUER: &str = "https://id.example/realms/ops";
const AUDIENCE: &str = "leasehold";

/// A signing key made for the test and its public JWK.
struct Signer {
    kid: String,
    algorithm: Algorithm,
    encoding: EncodingKey,
    jwk: Value,
}

fn ed25519(kid: &str) -> Signer {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    Signer {
        kid: kid.into(),
        algorithm: Algorithm::EdDSA,
        encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
        jwk: json!({"kty": "OKP", "crv": "Ed25519", "use": "sig", "kid": kid,
                    "x": URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())}),
    }
}

fn p256(kid: &str) -> Signer {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    Signer {
        kid: kid.into(),
        algorithm: Algorithm::ES256,
        encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
        jwk: json!({"kty": "EC", "crv": "P-256", "use": "sig", "kid": kid,
                    "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
                    "y": URL_SAFE_NO_PAD.encode(&point[33..65])}),
    }
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn claims(sub: &str, roles: Value) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now(), "exp": now() + 300,
           "roles": roles})
}

fn sign(signer: &Signer, claims: &Value) -> String {
    let mut header = Header::new(signer.algorithm);
    header.kid = Some(signer.kid.clone());
    jsonwebtoken::encode(&header, claims, &signer.encoding).unwrap()
}

fn jwks(signers: &[&Signer]) -> String {
    json!({"keys": signers.iter().map(|s| s.jwk.clone()).collect::<Vec<_>>()}).to_string()
}

async fn from_file(dir: &tempfile::TempDir, signers: &[&Signer]) -> Verifier {
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, jwks(signers)).unwrap();
    Verifier::new(OidcConfig {
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        jwks: JwksSource::File(path),
        roles_claim: "roles".into(),
        tenant_claim: None,
    })
    .await
    .unwrap()
}

fn invalid<T: std::fmt::Debug>(result: Result<T, Refused>, says: &str) {
    match result {
        Err(Refused::Invalid(why)) => assert!(why.contains(says), "{why} (expected {says})"),
        other => panic!("expected a refusal saying {says}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_valid_token_names_its_operator_and_every_wrong_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ed = ed25519("ed-1");
    let ec = p256("ec-1");
    let verifier = from_file(&dir, &[&ed, &ec]).await;

    // The subject names the operator; the username, which OIDC promises
    // neither unique nor stable, does not.
    let mut alice = claims("u-123", json!(["admin", "other"]));
    alice["preferred_username"] = json!("alice");
    let token = sign(&ed, &alice);
    assert!(Verifier::looks_like_jwt(&token));
    assert!(!Verifier::looks_like_jwt("lh_0123456789abcdef"));
    assert_eq!(
        verifier.verify(&token).await.unwrap(),
        Signed::Operator(Operator {
            name: "oidc:u-123".into(),
            role: OperatorRole::Admin
        })
    );
    let carol = sign(&ec, &claims("carol", json!("auditor")));
    assert_eq!(
        verifier.verify(&carol).await.unwrap(),
        Signed::Operator(Operator {
            name: "oidc:carol".into(),
            role: OperatorRole::Auditor
        })
    );

    let with = |change: &dyn Fn(&mut Value)| {
        let mut c = claims("mallory", json!(["admin"]));
        change(&mut c);
        sign(&ed, &c)
    };
    invalid(
        verifier
            .verify(&with(&|c| c["exp"] = json!(now() - 120)))
            .await,
        "expired",
    );
    // Within the leeway an expiry still passes.
    assert!(verifier
        .verify(&with(&|c| c["exp"] = json!(now() - 5)))
        .await
        .is_ok());
    invalid(
        verifier
            .verify(&with(&|c| c["nbf"] = json!(now() + 600)))
            .await,
        "not valid yet",
    );
    invalid(
        verifier
            .verify(&with(&|c| c["aud"] = json!("someone-else")))
            .await,
        "audience",
    );
    invalid(
        verifier
            .verify(&with(&|c| c["iss"] = json!("https://evil.example")))
            .await,
        "issuer",
    );
    invalid(
        verifier
            .verify(&with(&|c| {
                c.as_object_mut().unwrap().remove("exp");
            }))
            .await,
        "lacks",
    );

    // Signed by a key the issuer does not publish.
    let stranger = ed25519("ed-2");
    invalid(verifier.verify(&sign(&stranger, &alice)).await, "key id");
    // The issuer's key id on a stranger's signature.
    let forged = ed25519("ed-1");
    invalid(verifier.verify(&sign(&forged, &alice)).await, "signature");

    // A payload swapped under a valid signature.
    let parts: Vec<&str> = token.split('.').collect();
    let mut raised = claims("u-123", json!(["admin"]));
    raised["preferred_username"] = json!("root");
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(raised.to_string()),
        parts[2]
    );
    invalid(verifier.verify(&tampered).await, "signature");

    // alg none, with and without a signature part.
    let none_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT","kid":"ed-1"}"#);
    let body = URL_SAFE_NO_PAD.encode(alice.to_string());
    for unsigned in [
        format!("{none_header}.{body}."),
        format!("{none_header}.{body}.{}", parts[2]),
    ] {
        invalid(verifier.verify(&unsigned).await, "header");
    }

    // HS256 with the public key as the secret (the classic confusion).
    let public = URL_SAFE_NO_PAD
        .decode(ed.jwk["x"].as_str().unwrap())
        .unwrap();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("ed-1".into());
    let hmac = jsonwebtoken::encode(&header, &alice, &EncodingKey::from_secret(&public)).unwrap();
    invalid(verifier.verify(&hmac).await, "only RS256");
    // ES256 claimed for the Ed25519 key.
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("ed-1".into());
    let crossed = jsonwebtoken::encode(&header, &alice, &ec.encoding).unwrap();
    invalid(verifier.verify(&crossed).await, "algorithm");

    // A valid token that grants nothing here.
    assert_eq!(
        verifier
            .verify(&sign(&ed, &claims("bob", json!(["viewer"]))))
            .await,
        Err(Refused::NoRole(
            "claim `roles` holds neither admin nor auditor".into()
        ))
    );
}

#[tokio::test]
async fn a_tenant_claim_names_the_tenant_a_person_acts_for_and_a_role_wins_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let ed = ed25519("ed-1");
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, jwks(&[&ed])).unwrap();
    let verifier = Verifier::new(OidcConfig {
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        jwks: JwksSource::File(path),
        roles_claim: "roles".into(),
        tenant_claim: Some("leasehold_tenant".into()),
    })
    .await
    .unwrap();
    assert!(verifier.signs_in_tenants());
    let tenant = uuid::Uuid::new_v4();
    let mut fay = claims("fay", json!([]));
    fay["leasehold_tenant"] = json!(tenant.to_string());
    let exp = fay["exp"].as_i64().unwrap();
    assert_eq!(
        verifier.verify(&sign(&ed, &fay)).await.unwrap(),
        Signed::Tenant {
            id: tenant,
            name: "oidc:fay".into(),
            expires_at: chrono::DateTime::from_timestamp(exp, 0).unwrap(),
        }
    );

    // A role wins: one token is never both an operator and a tenant.
    fay["roles"] = json!(["auditor"]);
    assert!(matches!(
        verifier.verify(&sign(&ed, &fay)).await,
        Ok(Signed::Operator(Operator {
            role: OperatorRole::Auditor,
            ..
        }))
    ));

    // A claim that is no tenant id is refused naming the claim; a token
    // with neither is told both claims it lacks.
    for wrong in [json!("acme"), json!(42), json!([tenant.to_string()])] {
        let mut bad = claims("fay", json!([]));
        bad["leasehold_tenant"] = wrong;
        invalid(verifier.verify(&sign(&ed, &bad)).await, "leasehold_tenant");
    }
    assert_eq!(
        verifier.verify(&sign(&ed, &claims("gus", json!(["viewer"])))).await,
        Err(Refused::NoRole(
            "claim `roles` holds neither admin nor auditor, and claim `leasehold_tenant` names no tenant"
                .into()
        ))
    );
}

#[tokio::test]
async fn a_jwks_from_a_url_is_fetched_again_for_a_rotated_key_but_not_for_every_stranger() {
    let first = ed25519("k-1");
    let second = p256("k-2");
    let served = Arc::new(std::sync::Mutex::new(jwks(&[&first])));
    let fetches = Arc::new(AtomicUsize::new(0));
    let app = {
        let (served, fetches) = (served.clone(), fetches.clone());
        axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let (served, fetches) = (served.clone(), fetches.clone());
                async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    served.lock().unwrap().clone()
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let verifier = Verifier::new(OidcConfig {
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        jwks: JwksSource::Url(url.parse().unwrap()),
        roles_claim: "roles".into(),
        tenant_claim: None,
    })
    .await
    .unwrap();
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    let admin = claims("dana", json!(["admin"]));
    assert!(verifier.verify(&sign(&first, &admin)).await.is_ok());
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "known keys are cached");

    // The issuer rotates: the new key id makes the gateway look again.
    *served.lock().unwrap() = jwks(&[&first, &second]);
    let Signed::Operator(operator) = verifier.verify(&sign(&second, &admin)).await.unwrap() else {
        panic!("an admin's token names an operator");
    };
    assert_eq!(operator.name, "oidc:dana");
    assert_eq!(fetches.load(Ordering::SeqCst), 2);

    // Strangers' key ids right after do not fetch again.
    for n in 0..5 {
        let stranger = ed25519(&format!("x-{n}"));
        invalid(verifier.verify(&sign(&stranger, &admin)).await, "key id");
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 2);

    // A plain-http JWKS away from loopback is refused at start.
    let refused = Verifier::new(OidcConfig {
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        jwks: JwksSource::Url("http://id.example/jwks".parse().unwrap()),
        roles_claim: "roles".into(),
        tenant_claim: None,
    })
    .await
    .unwrap_err();
    assert!(refused.to_string().contains("https"), "{refused}");
}
