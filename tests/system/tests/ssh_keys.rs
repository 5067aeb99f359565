//! A tenant's SSH public keys, on a real NATS and PostgreSQL: added,
//! listed and removed by their tenant (and listed and removed by an
//! admin), each refusal naming its field; another tenant neither sees nor
//! removes them; what the SSH endpoint reads (`authorized_keys`) follows
//! every change the moment its request returns, an erasure included; the
//! log holds each addition and removal, without the key's comment; the
//! read model rebuilds identically.

use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use lh_events::{Actor, EventData, OperatorRole};
use lh_gateway::ssh_keys::{authorized_keys, MAX_SSH_KEYS_PER_TENANT};
use lh_test_stack::{of_type, read_log, Stack, ADMIN_TOKEN, AUDITOR_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};
use uuid::Uuid;

const KEYS: &str = "/v1/ssh-keys";

/// A key made by ssh-keygen in `dir`, commented `alice@laptop`: its
/// `.pub` file, its line and the fingerprint `ssh-keygen -lf` prints.
fn keygen(dir: &Path, algorithm: &str, bits: Option<u32>) -> (std::path::PathBuf, String, String) {
    let file = dir.join(format!("id_{algorithm}_{}", bits.unwrap_or(0)));
    let mut command = Command::new("ssh-keygen");
    command.args(["-q", "-N", "", "-C", "alice@laptop", "-t", algorithm]);
    if let Some(bits) = bits {
        command.args(["-b", &bits.to_string()]);
    }
    let made = command
        .arg("-f")
        .arg(&file)
        .output()
        .expect("ssh-keygen runs");
    assert!(made.status.success(), "{made:?}");
    let public = file.with_extension("pub");
    let listed = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(&public)
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let fingerprint = String::from_utf8(listed.stdout)
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    let line = std::fs::read_to_string(&public).unwrap().trim().to_string();
    (public, line, fingerprint)
}

/// An Ed25519 public key of 32 bytes drawn from `seed`: a key as far as
/// its form goes, made faster than ssh-keygen makes a pair.
fn made_up_key(seed: u8) -> String {
    let mut blob = Vec::new();
    blob.extend_from_slice(&11u32.to_be_bytes());
    blob.extend_from_slice(b"ssh-ed25519");
    blob.extend_from_slice(&32u32.to_be_bytes());
    blob.extend_from_slice(&[seed; 32]);
    format!(
        "ssh-ed25519 {} made-up-{seed}",
        base64::engine::general_purpose::STANDARD.encode(blob)
    )
}

async fn listed(stack: &Stack, key: &str, query: &str) -> Vec<Value> {
    let (status, body) = stack
        .call(Method::GET, &format!("{KEYS}{query}"), key, None)
        .await;
    assert_eq!(status, 200, "{body}");
    body["ssh_keys"].as_array().unwrap().clone()
}

async fn gateway_pool(stack: &Stack) -> sqlx::PgPool {
    lh_projection::connect_schema(&stack.database_url_for("gateway"), "gateway")
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_adds_lists_and_removes_its_ssh_keys_and_nobody_else_s() {
    let stack = Stack::start(FLEET).await;
    let (a_id, a) = stack.create_tenant("ssh-a", 1).await;
    let (b_id, b) = stack.create_tenant("ssh-b", 1).await;
    let a_uuid: Uuid = a_id.parse().unwrap();
    let pool = gateway_pool(&stack).await;
    let dir = tempfile::tempdir().unwrap();
    let (_, ed25519, ed25519_fingerprint) = keygen(dir.path(), "ed25519", None);
    let add = |key: &str, name: &str, public_key: &str| {
        let body = json!({"name": name, "public_key": public_key});
        let (stack, key) = (&stack, key.to_string());
        async move { stack.call(Method::POST, KEYS, &key, Some(body)).await }
    };

    let (status, added) = add(&a, "laptop", &ed25519).await;
    assert_eq!(status, 201, "{added}");
    let kept = ed25519.trim_end_matches(" alice@laptop");
    assert_eq!(added["name"], "laptop");
    assert_eq!(added["fingerprint"], ed25519_fingerprint.as_str());
    assert_eq!(added["public_key"], kept, "kept without its comment");
    assert!(added["created_at"].is_string(), "{added}");
    let laptop = added["id"].as_str().unwrap().to_string();
    // Read your write: the list and the SSH endpoint's lookup have it.
    assert_eq!(listed(&stack, &a, "").await, vec![added.clone()]);
    let authorized = authorized_keys(&pool, a_uuid).await.unwrap();
    assert_eq!(authorized.len(), 1);
    assert_eq!(
        (
            authorized[0].key_id.to_string(),
            authorized[0].name.as_str(),
            authorized[0].fingerprint.as_str(),
            authorized[0].public_key.as_str()
        ),
        (laptop.clone(), "laptop", ed25519_fingerprint.as_str(), kept)
    );

    // Each refusal names its field.
    let (_, ecdsa, _) = keygen(dir.path(), "ecdsa", Some(384));
    let (_, short_rsa, _) = keygen(dir.path(), "rsa", Some(1024));
    let base64 = kept.split(' ').nth(1).unwrap();
    let refusals = [
        ("", ecdsa.as_str(), 422, "name"),
        (&"n".repeat(65), ecdsa.as_str(), 422, "name"),
        ("bell\u{7}", ecdsa.as_str(), 422, "name"),
        ("dsa", &format!("ssh-dss {base64}"), 422, "public_key"),
        (
            "sk",
            &format!("sk-ssh-ed25519@openssh.com {base64}"),
            422,
            "public_key",
        ),
        ("short", short_rsa.as_str(), 422, "public_key"),
        ("junk", "ssh-ed25519 not-base64!", 422, "public_key"),
        (
            "huge",
            &format!("ssh-rsa {}", "A".repeat(9 * 1024)),
            422,
            "public_key",
        ),
        (
            "private",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----",
            422,
            "public_key",
        ),
        // The same key again, under another name and comment.
        ("again", &format!("{kept} alice@desktop"), 409, "public_key"),
    ];
    for (name, public_key, status, field) in refusals {
        let (got, problem) = add(&a, name, public_key).await;
        assert_eq!(
            (got, &problem["field"]),
            (status, &json!(field)),
            "{name}: {problem}"
        );
        assert!(problem["detail"].is_string(), "{problem}");
    }
    let (_, problem) = add(&a, "dsa", &format!("ssh-dss {base64}")).await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("ssh-ed25519, ecdsa-sha2-nistp256/384/521, or ssh-rsa"),
        "the refusal says what is accepted: {problem}"
    );
    let (status, problem) = stack
        .call(
            Method::POST,
            KEYS,
            &a,
            Some(json!({"name": "x", "public_key": ecdsa, "options": "no-pty"})),
        )
        .await;
    assert_eq!(
        (status, &problem["field"]),
        (400, &json!("options")),
        "{problem}"
    );
    // Operators add no key: a key is its tenant's, added with its own API key.
    for operator in [ADMIN_TOKEN, AUDITOR_TOKEN] {
        let (status, problem) = add(operator, "ops", &ecdsa).await;
        assert_eq!(status, 403, "{problem}");
    }

    // Another tenant may register the same key as its own, and sees only
    // its own; it neither lists nor removes A's.
    let (status, b_added) = add(&b, "shared", &ed25519).await;
    assert_eq!(status, 201, "{b_added}");
    assert_ne!(b_added["id"], added["id"]);
    assert_eq!(listed(&stack, &b, "").await, vec![b_added.clone()]);
    let (status, problem) = stack
        .call(Method::GET, &format!("{KEYS}?tenant_id={a_id}"), &b, None)
        .await;
    assert_eq!(
        (status, &problem["field"]),
        (404, &json!("tenant_id")),
        "{problem}"
    );
    let (status, problem) = stack
        .call(Method::DELETE, &format!("{KEYS}/{laptop}"), &b, None)
        .await;
    assert_eq!(
        (status, &problem["field"]),
        (404, &json!("id")),
        "{problem}"
    );
    let (status, _) = stack
        .call(Method::DELETE, &format!("{KEYS}/not-a-key"), &b, None)
        .await;
    assert_eq!(status, 404);
    assert_eq!(authorized_keys(&pool, a_uuid).await.unwrap().len(), 1);

    // Operators list a tenant's keys by naming it; the auditor removes none.
    assert_eq!(
        listed(&stack, ADMIN_TOKEN, &format!("?tenant_id={a_id}")).await,
        vec![added.clone()]
    );
    assert_eq!(
        listed(&stack, AUDITOR_TOKEN, &format!("?tenant_id={b_id}")).await,
        vec![b_added.clone()]
    );
    let (status, problem) = stack.call(Method::GET, KEYS, ADMIN_TOKEN, None).await;
    assert_eq!(
        (status, &problem["field"]),
        (422, &json!("tenant_id")),
        "{problem}"
    );
    let (status, _) = stack
        .call(
            Method::DELETE,
            &format!("{KEYS}/{laptop}"),
            AUDITOR_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 403);

    // At most 16 keys a tenant.
    let (status, second) = add(&a, "desk", &ecdsa).await;
    assert_eq!(status, 201, "{second}");
    for seed in 2..MAX_SSH_KEYS_PER_TENANT as u8 {
        let (status, body) = add(&a, &format!("made-up {seed}"), &made_up_key(seed)).await;
        assert_eq!(status, 201, "{body}");
    }
    assert_eq!(
        listed(&stack, &a, "").await.len() as i64,
        MAX_SSH_KEYS_PER_TENANT
    );
    let (status, problem) = add(&a, "one too many", &made_up_key(200)).await;
    assert_eq!(
        (status, &problem["field"]),
        (422, &json!("public_key")),
        "{problem}"
    );
    assert!(
        problem["detail"].as_str().unwrap().contains("16"),
        "{problem}"
    );

    // The tenant removes one: it lets nobody in as soon as the DELETE
    // returns, and a second removal finds nothing.
    let (status, body) = stack
        .call(Method::DELETE, &format!("{KEYS}/{laptop}"), &a, None)
        .await;
    assert_eq!(status, 204, "{body}");
    assert!(authorized_keys(&pool, a_uuid)
        .await
        .unwrap()
        .iter()
        .all(|k| k.key_id.to_string() != laptop));
    let (status, _) = stack
        .call(Method::DELETE, &format!("{KEYS}/{laptop}"), &a, None)
        .await;
    assert_eq!(status, 404);
    // B's copy of the same key is B's, and stays.
    assert_eq!(listed(&stack, &b, "").await, vec![b_added.clone()]);
    // An admin removes one of A's, but not by naming another tenant.
    let desk = second["id"].as_str().unwrap();
    let (status, _) = stack
        .call(
            Method::DELETE,
            &format!("{KEYS}/{desk}?tenant_id={b_id}"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = stack
        .call(
            Method::DELETE,
            &format!("{KEYS}/{desk}?tenant_id={a_id}"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 204);
    // Removed, the key may be added again.
    let (status, again) = add(&a, "laptop again", &ed25519).await;
    assert_eq!(status, 201, "{again}");
    assert_eq!(
        authorized_keys(&pool, a_uuid).await.unwrap().len() as i64,
        MAX_SSH_KEYS_PER_TENANT - 1
    );

    // The log holds each change, by whom it was made, and never the
    // comment the key's file carried.
    let log = read_log(&stack.bus().await).await;
    let added_events = of_type(&log, "ssh_key.added");
    assert_eq!(added_events.len() as i64, MAX_SSH_KEYS_PER_TENANT + 2);
    for event in &added_events {
        let EventData::SshKeyAdded(e) = &event.envelope.data else {
            unreachable!()
        };
        assert_eq!(event.envelope.actor, Actor::Tenant(e.tenant_id));
        assert!(!e.public_key.contains("alice@") && !e.public_key.contains("made-up"));
        assert!(
            !String::from_utf8_lossy(&event.payload).contains("alice@laptop"),
            "the comment is in the log"
        );
    }
    let removed: Vec<(Uuid, &Actor)> = of_type(&log, "ssh_key.removed")
        .into_iter()
        .map(|event| {
            let EventData::SshKeyRemoved(e) = &event.envelope.data else {
                unreachable!()
            };
            assert_eq!(e.tenant_id, a_uuid);
            (e.key_id, &event.envelope.actor)
        })
        .collect();
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert_eq!(
        removed[0],
        (laptop.parse().unwrap(), &Actor::Tenant(a_uuid))
    );
    assert!(
        matches!(removed[1].1, Actor::Operator(o) if o.role == OperatorRole::Admin),
        "{removed:?}"
    );
    for event in added_events {
        assert!(
            event.subject.starts_with("lh.evt.ssh_key."),
            "a key's events are on its own subject, never its tenant's: {}",
            event.subject
        );
    }

    stack.assert_gateway_rebuilds_identically().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_suspended_tenant_removes_its_keys_and_an_erased_one_has_none() {
    let stack = Stack::start(FLEET).await;
    let (id, key) = stack.create_tenant("ssh-erased", 1).await;
    let tenant: Uuid = id.parse().unwrap();
    let pool = gateway_pool(&stack).await;
    let dir = tempfile::tempdir().unwrap();

    // Through `lh`: the key's file, its comment for a name.
    let url = stack.gateway_url.clone();
    let key_file = dir.path().join("api-key");
    std::fs::write(&key_file, &key).unwrap();
    let lh = |args: &[&str]| {
        let mut argv: Vec<String> = [
            "lh",
            "--gateway-url",
            &url,
            "--api-key-file",
            key_file.to_str().unwrap(),
            "--json",
            "ssh-key",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        argv.extend(args.iter().map(|s| s.to_string()));
        lh_cli::capture(argv)
    };
    let (ed25519_file, _, ed25519_fingerprint) = keygen(dir.path(), "ed25519", None);
    let out = lh(&["add", ed25519_file.to_str().unwrap()]).await;
    assert_eq!(out.code, lh_cli::EXIT_OK, "{}", out.stderr);
    let added: Value = serde_json::from_str(&out.stdout).unwrap();
    // Named after its file, never its comment (`alice@laptop`), which the
    // log would keep in clear.
    let file_name = ed25519_file.with_extension("pub");
    let file_name = file_name.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        (&added["name"], &added["fingerprint"]),
        (&json!(file_name), &json!(ed25519_fingerprint))
    );
    let (rsa_file, _, _) = keygen(dir.path(), "rsa", Some(2048));
    let out = lh(&["add", "--name", "build box", rsa_file.to_str().unwrap()]).await;
    assert_eq!(out.code, lh_cli::EXIT_OK, "{}", out.stderr);
    let rsa: Value = serde_json::from_str(&out.stdout).unwrap();
    // The private half never leaves the machine.
    let out = lh(&["add", rsa_file.with_extension("").to_str().unwrap()]).await;
    assert_eq!(out.code, lh_cli::EXIT_CLIENT_ERROR);
    assert!(out.stderr.contains("private key"), "{}", out.stderr);
    let out = lh(&["ls"]).await;
    assert_eq!(out.code, lh_cli::EXIT_OK, "{}", out.stderr);
    let list: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(list["ssh_keys"].as_array().unwrap().len(), 2, "{list}");
    assert_eq!(authorized_keys(&pool, tenant).await.unwrap().len(), 2);

    // Suspended, the tenant adds nothing but may still remove a key that
    // leaked.
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{id}/suspend"),
            ADMIN_TOKEN,
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let (status, problem) = stack
        .call(
            Method::POST,
            KEYS,
            &key,
            Some(json!({"name": "late", "public_key": made_up_key(1)})),
        )
        .await;
    assert_eq!(status, 403, "{problem}");
    let out = lh(&["rm", rsa["id"].as_str().unwrap()]).await;
    assert_eq!(out.code, lh_cli::EXIT_OK, "{}", out.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&out.stdout).unwrap(),
        json!({"id": rsa["id"], "removed": true})
    );
    assert_eq!(authorized_keys(&pool, tenant).await.unwrap().len(), 1);

    // Erased, the tenant's keys are gone from the read model: nobody signs
    // in with them.
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{id}/erase"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(authorized_keys(&pool, tenant).await.unwrap().is_empty());
    let (status, body) = stack
        .call(
            Method::GET,
            &format!("{KEYS}?tenant_id={id}"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!((status, &body["ssh_keys"]), (200, &json!([])), "{body}");
    let log = read_log(&stack.bus().await).await;
    assert_eq!(of_type(&log, "ssh_key.added").len(), 2);
    assert_eq!(of_type(&log, "ssh_key.removed").len(), 1);
    assert_eq!(of_type(&log, "tenant.erased").len(), 1);

    // A rebuild from the log comes to the same: no key of the erased tenant.
    stack.assert_gateway_rebuilds_identically().await;
}
