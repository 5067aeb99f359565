//! The two independent verifiers of the audit chain, `lh audit verify`
//! (Rust) and `tools/audit-verify/verify.py` (Python, written from the
//! spec), run over an honest log and over tampered copies of it, each on its
//! own nats-server. They must both pass the honest log and agree on the
//! first bad sequence and its reason for each tampering:
//!
//! | copy | what changed | first bad sequence | reason |
//! | --- | --- | --- | --- |
//! | changed | the payload at 5 | 9, the first checkpoint after it | `head_mismatch` |
//! | dropped | the message at 15, deleted: a gap | 19 | `events_mismatch` |
//! | re-signed | the checkpoint at 21 signed and named by another key | 19 | `key_not_pinned` |
//! | forged | the same signature, naming the pinned key | 19 | `bad_signature` |
//!
//! A dropped message is deleted from the copy rather than left out, so that
//! every other message keeps its sequence, as an operator deleting it from
//! the real log would leave it; a copy that renumbers instead fails as a
//! changed one does (`head_mismatch`), since every later link moves.

use std::path::PathBuf;
use std::process::Command;

use chrono::Utc;
use ed25519_dalek::{Signer as _, SigningKey};
use futures::StreamExt as _;
use lh_bus::async_nats::{self, jetstream};
use lh_bus::auth;
use lh_domain::chain::{checkpoint_statement, Chain};
use lh_events::{Actor, AuditCheckpoint, Envelope, EventData};
use lh_testkit::{workspace_root, Nats};
use serde_json::Value;

const STREAM: &str = "LH_EVENTS";
const SUBJECTS: &str = "lh.evt.>";
const CHECKPOINT_SUBJECT: &str = "lh.evt.audit.chain.checkpoint.audit";

fn pinned_key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

fn attacker_key() -> SigningKey {
    SigningKey::from_bytes(&[9; 32])
}

fn checkpoint_payload(signer: &SigningKey, named: &SigningKey, at: &Chain) -> Vec<u8> {
    let signature =
        signer.sign(checkpoint_statement(at.last_sequence, at.events, &at.head).as_bytes());
    let envelope = Envelope::new(
        Actor::Service("audit".into()),
        Utc::now(),
        EventData::AuditCheckpoint(AuditCheckpoint {
            sequence: at.last_sequence,
            head: at.head_hex(),
            events: at.events,
            public_key: hex::encode(named.verifying_key().to_bytes()),
            signature: hex::encode(signature.to_bytes()),
        }),
    );
    serde_json::to_vec(&envelope).unwrap()
}

async fn log_stream(js: &jetstream::Context) -> jetstream::stream::Stream {
    js.create_stream(jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec![SUBJECTS.into()],
        ..Default::default()
    })
    .await
    .unwrap()
}

async fn context(nats: &Nats) -> jetstream::Context {
    jetstream::new(async_nats::connect(nats.url()).await.unwrap())
}

async fn publish(js: &jetstream::Context, subject: &str, payload: Vec<u8>) -> u64 {
    js.publish(subject.to_string(), payload.into())
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence
}

/// The honest log: events, one undecodable message (at 7), and
/// checkpoints at every tenth sequence signing the one before, except
/// that the one due at 20 comes at 21, behind one more event (as the audit
/// service's may), and still signs 19. Appends what it published to `chain`.
async fn publish_honest(js: &jetstream::Context, chain: &mut Chain, upto: u64) {
    let key = pinned_key();
    while chain.last_sequence < upto {
        let next = chain.last_sequence + 1;
        let (subject, payload) = if next == 21 {
            let at = Chain {
                head: head_at(js, 19).await,
                events: 19,
                last_sequence: 19,
            };
            (
                CHECKPOINT_SUBJECT.into(),
                checkpoint_payload(&key, &key, &at),
            )
        } else if next.is_multiple_of(10) && next != 20 {
            (
                CHECKPOINT_SUBJECT.into(),
                checkpoint_payload(&key, &key, chain),
            )
        } else if next == 7 {
            ("lh.evt.junk".into(), b"\xffnot json".to_vec())
        } else {
            let lease = uuid::Uuid::from_u128(next as u128);
            (
                format!("lh.evt.lease.{lease}.requested.gateway"),
                format!(r#"{{"type":"lease.requested","n":{next}}}"#).into_bytes(),
            )
        };
        let seq = publish(js, &subject, payload.clone()).await;
        assert_eq!(seq, next, "the log's sequences are the chain's");
        chain.append(seq, &subject, &payload);
    }
}

/// The link at `sequence`, recomputed from the log.
async fn head_at(js: &jetstream::Context, sequence: u64) -> [u8; 32] {
    let mut chain = Chain::default();
    for (seq, subject, payload) in read_all(js).await {
        if seq > sequence {
            break;
        }
        chain.append(seq, &subject, &payload);
    }
    chain.head
}

async fn read_all(js: &jetstream::Context) -> Vec<(u64, String, Vec<u8>)> {
    let stream = js.get_stream(STREAM).await.unwrap();
    let last = stream.cached_info().state.last_sequence;
    let mut out = Vec::new();
    if last == 0 {
        return out;
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    while out.last().is_none_or(|(s, _, _)| *s < last) {
        let m = messages.next().await.unwrap().unwrap();
        let seq = m.info().unwrap().stream_sequence;
        out.push((seq, m.subject.to_string(), m.payload.to_vec()));
    }
    out
}

enum Edit {
    Keep(Vec<u8>),
    Drop,
}

/// A copy of the honest log on its own server, with `edit` applied.
async fn tampered_copy(
    honest: &[(u64, String, Vec<u8>)],
    edit: impl Fn(u64, &[u8]) -> Edit,
) -> Nats {
    let nats = Nats::start().await.unwrap();
    let js = context(&nats).await;
    let stream = log_stream(&js).await;
    for (seq, subject, payload) in honest {
        let (payload, dropped) = match edit(*seq, payload) {
            Edit::Keep(p) => (p, false),
            Edit::Drop => (payload.clone(), true),
        };
        assert_eq!(publish(&js, subject, payload).await, *seq);
        if dropped {
            assert!(stream.delete_message(*seq).await.unwrap());
        }
    }
    nats
}

struct Verdicts {
    rust: Value,
    rust_code: i32,
    python: Value,
    python_code: i32,
}

fn python() -> PathBuf {
    let python = workspace_root().join(".data/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/deps.sh",
        python.display()
    );
    python
}

async fn verify_both(nats: &Nats, extra_rust: &[&str], extra_python: &[&str]) -> Verdicts {
    let key = hex::encode(pinned_key().verifying_key().to_bytes());
    let url = nats.url();
    let mut args = vec![
        "lh",
        "--json",
        "audit",
        "verify",
        "--nats-url",
        &url,
        "--public-key",
        &key,
        "--stream",
        STREAM,
    ];
    args.extend_from_slice(extra_rust);
    let rust = lh_cli::capture(args).await;
    let rust_json: Value = serde_json::from_str(&rust.stdout)
        .unwrap_or_else(|e| panic!("lh printed no JSON ({e}): {rust:?}"));

    let script = workspace_root().join("tools/audit-verify/verify.py");
    let py = Command::new(python())
        .arg(script)
        .args(["--json", "--nats-url", &url, "--public-key", &key])
        .args(["--stream", STREAM])
        .args(extra_python)
        .env_remove("LH_NATS_USER")
        .env_remove("LH_NATS_NKEY_SEED_FILE")
        .env_remove("LH_NATS_PASSWORD_FILE")
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&py.stdout);
    let python_json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "verify.py printed no JSON ({e}); is scripts/deps.sh run? stdout: {stdout} stderr: {}",
            String::from_utf8_lossy(&py.stderr)
        )
    });
    Verdicts {
        rust: rust_json,
        rust_code: rust.code,
        python: python_json,
        python_code: py.status.code().unwrap_or(-1),
    }
}

/// Both verifiers gave the same answer on every field that is not a
/// free-text sentence.
fn assert_agree(v: &Verdicts) {
    let fields = [
        "ok",
        "checked_from",
        "sequence",
        "events",
        "head",
        "checkpoints",
        "checkpoints_verified",
        "first_bad_sequence",
        "first_bad",
        "first_gap",
        "last_checkpoint",
        "resumed_from",
        "unsigned_events",
    ];
    for field in fields {
        assert_eq!(
            v.rust[field], v.python[field],
            "the verifiers disagree on {field}:\nrust: {:#}\npython: {:#}",
            v.rust, v.python
        );
    }
    assert_eq!(v.rust_code, v.python_code, "exit codes");
}

fn assert_broken(v: &Verdicts, sequence: u64, reason: &str) {
    assert_agree(v);
    assert_eq!(v.rust["ok"], false, "{:#}", v.rust);
    assert_eq!(v.rust_code, lh_cli::EXIT_FAILURE);
    assert_eq!(v.rust["first_bad_sequence"], sequence, "{:#}", v.rust);
    assert_eq!(v.rust["first_bad"]["reason"], reason, "{:#}", v.rust);
}

#[tokio::test]
async fn both_verifiers_pass_the_honest_log_and_agree_on_each_tampering() {
    let honest_nats = Nats::start().await.unwrap();
    let js = context(&honest_nats).await;
    log_stream(&js).await;
    let mut chain = Chain::default();
    publish_honest(&js, &mut chain, 31).await;
    let honest = read_all(&js).await;
    assert_eq!(honest.len(), 31);

    let v = verify_both(&honest_nats, &[], &[]).await;
    assert_agree(&v);
    assert_eq!(v.rust["ok"], true, "{:#}\n{:#}", v.rust, v.python);
    assert_eq!(v.rust_code, lh_cli::EXIT_OK);
    assert_eq!(v.rust["events"], 31);
    assert_eq!(v.rust["head"], chain.head_hex());
    assert_eq!(v.rust["checkpoints_verified"], 3);
    assert_eq!(v.rust["last_checkpoint"]["sequence"], 29);
    assert_eq!(v.rust["unsigned_events"], 2);
    let key = hex::encode(pinned_key().verifying_key().to_bytes());
    let table = lh_cli::capture([
        "lh",
        "audit",
        "verify",
        "--nats-url",
        &honest_nats.url(),
        "--public-key",
        &key,
    ])
    .await;
    assert_eq!(table.code, lh_cli::EXIT_OK, "{table:?}");
    assert!(table.stdout.contains(&chain.head_hex()), "{table:?}");

    let changed = tampered_copy(&honest, |seq, p| {
        Edit::Keep(if seq == 5 {
            br#"{"type":"lease.requested","n":500}"#.to_vec()
        } else {
            p.to_vec()
        })
    })
    .await;
    assert_broken(&verify_both(&changed, &[], &[]).await, 9, "head_mismatch");

    let dropped = tampered_copy(&honest, |seq, p| {
        if seq == 15 {
            Edit::Drop
        } else {
            Edit::Keep(p.to_vec())
        }
    })
    .await;
    let v = verify_both(&dropped, &[], &[]).await;
    assert_broken(&v, 19, "events_mismatch");
    assert_eq!(v.rust["first_gap"], 15);

    // The checkpoint at 21 (signing 19) re-signed by someone else, naming
    // their own key, then naming the pinned one.
    let resign = |named: SigningKey| {
        let honest = honest.clone();
        move |seq: u64, p: &[u8]| {
            if seq != 21 {
                return Edit::Keep(p.to_vec());
            }
            let mut at = Chain::default();
            for (s, subject, payload) in honest.iter().take_while(|(s, _, _)| *s <= 19) {
                at.append(*s, subject, payload);
            }
            Edit::Keep(checkpoint_payload(&attacker_key(), &named, &at))
        }
    };
    let resigned = tampered_copy(&honest, resign(attacker_key())).await;
    let v = verify_both(&resigned, &[], &[]).await;
    assert_broken(&v, 19, "key_not_pinned");
    assert_eq!(v.rust["last_checkpoint"]["sequence"], 9);
    let forged = tampered_copy(&honest, resign(pinned_key())).await;
    assert_broken(&verify_both(&forged, &[], &[]).await, 19, "bad_signature");
}

#[tokio::test]
async fn both_verifiers_resume_from_a_verified_checkpoint() {
    let nats = Nats::start().await.unwrap();
    let js = context(&nats).await;
    log_stream(&js).await;
    let mut chain = Chain::default();
    publish_honest(&js, &mut chain, 31).await;

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let state_arg = state.to_str().unwrap().to_string();
    let v = verify_both(&nats, &["--save-state", &state_arg], &[]).await;
    assert_agree(&v);
    assert_eq!(v.rust["ok"], true, "{:#}", v.rust);
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(saved, v.rust["last_checkpoint"]);
    let token = format!(
        "{}:{}:{}:{}",
        saved["sequence"],
        saved["events"],
        saved["head"].as_str().unwrap(),
        saved["signature"].as_str().unwrap()
    );

    // More events and a checkpoint signing 39; the resumed runs chain from 30.
    publish_honest(&js, &mut chain, 41).await;
    let v = verify_both(
        &nats,
        &["--resume-from", &state_arg],
        &["--resume-from", &token],
    )
    .await;
    assert_agree(&v);
    assert_eq!(v.rust["ok"], true, "{:#}", v.rust);
    assert_eq!(v.rust["checked_from"], 30);
    assert_eq!(v.rust["events"], 41);
    assert_eq!(v.rust["head"], chain.head_hex());
    assert_eq!(v.rust["checkpoints"], 1);
    assert_eq!(v.rust["last_checkpoint"]["sequence"], 39);

    // A resume point whose signature does not hold is refused by both.
    let forged = token.replacen(":29:", ":28:", 1);
    assert_ne!(forged, token);
    let rust = lh_cli::capture([
        "lh",
        "audit",
        "verify",
        "--nats-url",
        &nats.url(),
        "--public-key",
        &hex::encode(pinned_key().verifying_key().to_bytes()),
        "--resume-from",
        &forged,
    ])
    .await;
    assert_eq!(rust.code, lh_cli::EXIT_CLIENT_ERROR, "{rust:?}");
    assert!(
        rust.stderr.contains("not signed by the pinned key"),
        "{rust:?}"
    );
    let py = Command::new(python())
        .arg(workspace_root().join("tools/audit-verify/verify.py"))
        .args(["--nats-url", &nats.url(), "--public-key"])
        .arg(hex::encode(pinned_key().verifying_key().to_bytes()))
        .args(["--resume-from", &forged])
        .output()
        .unwrap();
    assert_eq!(py.status.code(), Some(2), "{py:?}");
}

/// The deployment's read-only `auditor` user is enough for both: they read
/// the log through the permissions checked in at deploy/nats/permissions.conf.
#[tokio::test]
async fn both_verifiers_read_the_log_as_the_auditor() {
    let writer = nkeys::KeyPair::new_user();
    let auditor = nkeys::KeyPair::new_user();
    let permissions =
        std::fs::read_to_string(workspace_root().join("deploy/nats/permissions.conf")).unwrap();
    // Every user of the deployment (the server refuses unused permission
    // blocks), with the auditor's key, plus a writer with every right to
    // build the log.
    let users: Vec<(String, String)> = auth::fixed_users()
        .into_iter()
        .map(|(user, _)| {
            let key = if user == auth::AUDITOR_USER {
                auditor.public_key()
            } else {
                nkeys::KeyPair::new_user().public_key()
            };
            (user, key)
        })
        .collect();
    let users = auth::users_conf(&users, &[]).replacen(
        "  users: [\n",
        &format!("  users: [\n    {{ nkey: \"{}\" }}\n", writer.public_key()),
        1,
    );
    let nats = Nats::start_secured(
        vec![
            ("permissions.conf".into(), permissions),
            ("users.conf".into(), users),
        ],
        "include \"users.conf\"",
    )
    .await
    .unwrap();
    let client = async_nats::ConnectOptions::new()
        .nkey(writer.seed().unwrap())
        .connect(nats.url())
        .await
        .unwrap();
    let js = jetstream::new(client);
    log_stream(&js).await;
    let mut chain = Chain::default();
    publish_honest(&js, &mut chain, 31).await;

    let dir = tempfile::tempdir().unwrap();
    let seed_file = dir.path().join("auditor.nk");
    std::fs::write(&seed_file, auditor.seed().unwrap()).unwrap();
    let key = hex::encode(pinned_key().verifying_key().to_bytes());
    let args = ["--nats-url", &nats.url(), "--public-key", &key];
    let as_auditor = |command: &mut Command| {
        command
            .env("LH_NATS_USER", "auditor")
            .env("LH_NATS_NKEY_SEED_FILE", &seed_file)
            .env_remove("LH_NATS_PASSWORD_FILE")
            .env_remove("LH_NATS_CA_FILE")
            .output()
            .unwrap()
    };
    let rust = as_auditor(
        Command::new(env!("CARGO_BIN_EXE_lh"))
            .args(["--json", "audit", "verify"])
            .args(args),
    );
    let python = as_auditor(
        Command::new(python())
            .arg(workspace_root().join("tools/audit-verify/verify.py"))
            .arg("--json")
            .args(args),
    );
    for (name, out) in [("lh", &rust), ("verify.py", &python)] {
        assert_eq!(out.status.code(), Some(0), "{name}: {out:?}");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["head"], chain.head_hex(), "{name}");
        assert_eq!(report["checkpoints_verified"], 3, "{name}");
    }
}
