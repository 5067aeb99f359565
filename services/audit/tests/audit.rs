//! The audit service against a real nats-server and a real PostgreSQL
//! (lh-testkit). Events are published with lh_bus as the other services
//! would; the chain is recomputed here independently of lh-domain, straight
//! from `schemas/audit-chain.md`, and verification is asked for over the
//! NATS RPC as the gateway would and over the audit service's own HTTP API.

use std::time::{Duration, Instant};

use chrono::Utc;
use ed25519_dalek::{Signature, Verifier as _, VerifyingKey};
use lh_audit::Config;
use lh_bus::{Bus, BusConfig, Expect};
use lh_events::*;
use lh_rpc::audit::VerifyResponse;
use lh_service::{CancellationToken, Running};
use lh_testkit::Nats;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);
const VERIFY_TIMEOUT: Duration = Duration::from_secs(60);

struct Env {
    _nats: Nats,
    config: Config,
    bus: Bus,
    /// Superuser connection to the test database.
    db: PgPool,
}

struct Audit {
    running: Running,
    shutdown: CancellationToken,
}

impl Audit {
    async fn stop(self) {
        self.shutdown.cancel();
        self.running.wait().await.expect("audit stops cleanly");
    }

    /// What the service's `/metrics` says now.
    async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.running.http_addr))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text")
    }
}

impl Env {
    async fn new() -> Env {
        Env::with_log(None).await
    }

    /// An environment whose log keeps events for `max_age`, or 365 days.
    async fn with_log(max_age: Option<Duration>) -> Env {
        let (nats, database_url) = lh_testkit::nats_and_database().await;
        let mut config = Config::for_test(&nats.url(), &database_url);
        let mut bus_config = BusConfig::new(nats.url(), "audit-test");
        if let Some(max_age) = max_age {
            config.common.events_max_age_secs = Some(max_age.as_secs());
            config.common.allow_short_retention = true;
            bus_config.events_max_age = max_age;
            bus_config.allow_short_retention = true;
        }
        let bus = Bus::connect(&bus_config).await.expect("bus connects");
        let db = PgPool::connect(&database_url)
            .await
            .expect("database connects");
        Env {
            _nats: nats,
            config,
            bus,
            db,
        }
    }

    async fn start_audit(&self, config: Config) -> Audit {
        let shutdown = CancellationToken::new();
        let running = lh_audit::start(config, shutdown.clone())
            .await
            .expect("audit starts");
        lh_testkit::wait_ready("audit", &running, WAIT).await;
        Audit { running, shutdown }
    }

    async fn publish_assorted(&self, n: usize) {
        publish_assorted(&self.bus, n).await;
    }

    /// Highest sequence in the audit copy.
    async fn stored_max(&self) -> u64 {
        let max: i64 = sqlx::query_scalar("SELECT coalesce(max(sequence), 0) FROM audit.events")
            .fetch_one(&self.db)
            .await
            .expect("audit.events readable");
        max as u64
    }

    /// Waits until the audit copy holds the whole stream and stays so for a
    /// moment (the keeper may still be publishing a checkpoint); returns the
    /// stream's last sequence.
    async fn settled(&self) -> u64 {
        let deadline = Instant::now() + WAIT;
        loop {
            assert!(
                Instant::now() < deadline,
                "audit never caught up with the stream"
            );
            let last = self.bus.last_sequence().await.expect("stream info");
            if self.stored_max().await == last {
                tokio::time::sleep(Duration::from_millis(700)).await;
                if self.bus.last_sequence().await.expect("stream info") == last
                    && self.stored_max().await == last
                {
                    return last;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A full verification: from the genesis or the anchor, whatever an
    /// earlier run verified or cached (changes behind the triggers bring no
    /// new event, so only a full run is sure to see them).
    async fn verify(&self) -> VerifyResponse {
        lh_rpc::audit::call_with(
            &self.bus,
            &lh_rpc::audit::VerifyRequest { full: true },
            VERIFY_TIMEOUT,
        )
        .await
        .expect("verify answers")
    }

    /// What the gateway asks: from the last verified checkpoint on.
    async fn verify_incremental(&self) -> VerifyResponse {
        lh_rpc::audit::call(&self.bus, VERIFY_TIMEOUT)
            .await
            .expect("verify answers")
    }

    /// Every stored message up to `upto`: (sequence, subject, payload).
    async fn stream(&self, upto: u64) -> Vec<(u64, String, Vec<u8>)> {
        let mut out = Vec::new();
        if upto == 0 {
            return out;
        }
        let mut feed = self
            .bus
            .feed(&[subject::EVENTS_ALL], 1)
            .await
            .expect("feed");
        // Every stored message, decodable or not.
        while let Some(item) = feed.next_item_within(Duration::from_secs(5)).await {
            let item = item.expect("a stored message");
            out.push((
                item.sequence(),
                item.subject().to_string(),
                item.payload().to_vec(),
            ));
            if item.sequence() >= upto {
                break;
            }
        }
        out
    }

    async fn checkpoints_in_stream(&self) -> Vec<(u64, AuditCheckpoint)> {
        let last = self.bus.last_sequence().await.expect("stream info");
        self.stream(last)
            .await
            .into_iter()
            .filter_map(
                |(seq, _, payload)| match Envelope::from_json(&payload).ok()?.data {
                    EventData::AuditCheckpoint(cp) => Some((seq, cp)),
                    _ => None,
                },
            )
            .collect()
    }

    /// Every `audit.divergence_detected` on the log, with its sequence.
    async fn divergences(&self) -> Vec<(u64, AuditDivergenceDetected)> {
        let last = self.bus.last_sequence().await.expect("stream info");
        self.stream(last)
            .await
            .into_iter()
            .filter_map(|(seq, subject, payload)| {
                let envelope = Envelope::from_json(&payload).ok()?;
                match envelope.data {
                    EventData::AuditDivergenceDetected(found) => {
                        assert_eq!(
                            subject,
                            format!("{}.divergence_detected.audit", subject::audit())
                        );
                        assert_eq!(envelope.actor, Actor::Service("lh-audit".into()));
                        Some((seq, found))
                    }
                    _ => None,
                }
            })
            .collect()
    }
}

/// Publishes `n` events of assorted types, as the services would.
async fn publish_assorted(bus: &Bus, n: usize) {
    let tenant = Uuid::now_v7();
    let mut lease = Uuid::now_v7();
    for i in 0..n {
        let data = match i % 10 {
            0 => EventData::TenantCreated(TenantCreated {
                tenant_id: tenant,
                name_sealed: "c2VhbGVk".into(),
                email_sealed: "c2VhbGVk".into(),
                api_key_sha256: "00".repeat(32),
                api_key_prefix: "lh_00000000".into(),
                quota: Quota {
                    max_gpus: 8,
                    max_vram_gb: None,
                    max_storage_gb: None,
                },
                weight: 1,
                idle_policy: None,
                trusted: false,
            }),
            // An operator's enrollment: a node's own registration would
            // be refused without one, and is a node's to write.
            1 => EventData::NodeEnrolled(fixtures::enrollment_of(&fixtures::node(
                &format!("node-{i}"),
                "cn-north-1",
                1,
                fixtures::MODEL,
                fixtures::MODEL_VRAM_GB,
            ))),
            2 => {
                lease = Uuid::now_v7();
                EventData::LeaseRequested(LeaseRequested {
                    idempotency_key: Some(format!("k{i}")),
                    ..fixtures::whole_request(lease, tenant, 1, fixtures::MODEL)
                })
            }
            3 => EventData::LeaseQueued(LeaseQueued {
                lease_id: lease,
                reason: "no capacity".into(),
                position: 1,
            }),
            4 => EventData::LeasePlaced(fixtures::placed(
                lease,
                "node-1",
                "cn-north-1",
                fixtures::MODEL,
                fixtures::MODEL_VRAM_GB,
                &[0],
            )),
            5 => EventData::NodeGpusAllocated(NodeGpusAllocated::one("node-1", lease, vec![0])),
            6 => EventData::LeaseStarted(fixtures::started(lease, "node-1", Utc::now())),
            7 => serde_json::from_value(serde_json::json!({
                "type": "spot.price_set", "zone": "cn-north-1", "gpu_model": "A100-40GB",
                "price_cny_per_gb_hour": "0.25", "utilisation": "0.5",
                "gpus_total": 8, "gpus_used": 4
            }))
            .expect("a spot price"),
            8 => EventData::LeaseStopRequested(LeaseStopRequested { lease_id: lease }),
            _ => EventData::LeaseEnded(LeaseEnded {
                exit_code: Some(0),
                failure: None,
                ..fixtures::ended(lease, "node-1", Utc::now(), EndReason::Stopped)
            }),
        };
        let envelope = fixtures::by_owner(data);
        bus.publish(&envelope, Expect::Any)
            .await
            .expect("event is stored");
    }
}

/// Runs `sql` with the audit table's triggers off, as a superuser could.
async fn behind_the_triggers(db: &PgPool, sql: &str) {
    let mut tx = db.begin().await.unwrap();
    sqlx::query("ALTER TABLE audit.events DISABLE TRIGGER ALL")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(sql).execute(&mut *tx).await.unwrap();
    sqlx::query("ALTER TABLE audit.events ENABLE TRIGGER ALL")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// The chain as schemas/audit-chain.md defines it, written out here on
/// purpose rather than calling lh-domain. Returns (events, head hex) after
/// the message at sequence `upto`.
fn recompute(stream: &[(u64, String, Vec<u8>)], upto: u64) -> (u64, String) {
    let mut head = [0u8; 32];
    let mut events = 0;
    for (seq, subject, payload) in stream.iter().filter(|(s, _, _)| *s <= upto) {
        let mut h = Sha256::new();
        h.update(head);
        h.update(seq.to_be_bytes());
        h.update((subject.len() as u32).to_be_bytes());
        h.update(subject.as_bytes());
        h.update((payload.len() as u64).to_be_bytes());
        h.update(payload);
        head = h.finalize().into();
        events += 1;
    }
    (events, hex::encode(head))
}

#[tokio::test]
async fn verifies_a_log_of_assorted_events() {
    let env = Env::new().await;
    env.publish_assorted(50).await;
    let token_dir = tempfile::tempdir().expect("a temp dir");
    let token_file = token_dir.path().join("verify.token");
    std::fs::write(&token_file, "s3cret-verify-token\n").expect("token written");
    let mut config = env.config.clone();
    config.verify_token_file = Some(token_file);
    let audit = env.start_audit(config).await;
    let last = env.settled().await;
    assert_eq!(last, 50, "no checkpoint is due with the default policy");

    let report = env.verify().await;
    let (events, head) = recompute(&env.stream(last).await, last);
    assert!(report.ok, "{report:?}");
    assert_eq!(report.events, last);
    assert_eq!(report.events, events);
    assert_eq!(report.sequence, last);
    assert_eq!(report.head, head);
    assert_eq!(report.first_mismatch, None);

    // Auditors holding the token get the same report from the audit
    // service's own API; nobody else gets one.
    let url = format!("http://{}/v1/verify", audit.running.http_addr);
    let client = reqwest::Client::new();
    for authorization in [
        None,
        Some("Bearer wrong-token"),
        Some("s3cret-verify-token"),
    ] {
        let mut request = client.get(&url);
        if let Some(authorization) = authorization {
            request = request.header("authorization", authorization);
        }
        let refused = request.send().await.expect("GET /v1/verify");
        assert_eq!(refused.status(), 401, "{authorization:?}");
        assert_eq!(
            refused.headers()["content-type"],
            "application/problem+json"
        );
    }
    let http: VerifyResponse = client
        .get(&url)
        .bearer_auth("s3cret-verify-token")
        .send()
        .await
        .expect("GET /v1/verify")
        .error_for_status()
        .expect("200")
        .json()
        .await
        .expect("a verify report");
    assert_eq!(http, report);

    let metrics = audit.metrics().await;
    assert!(metrics.contains("lh_audit_chain_sequence"), "{metrics}");
    audit.stop().await;
}

#[tokio::test]
async fn a_restart_mid_stream_neither_loses_nor_doubles_a_row() {
    let env = Env::new().await;
    let key_dir = tempfile::tempdir().expect("a temp dir");
    let mut config = env.config.clone();
    config.signing_key_file = Some(key_dir.path().join("audit.key"));
    config.checkpoint_every_events = 100;

    let audit = env.start_audit(config.clone()).await;
    let bus = env.bus.clone();
    let publisher = tokio::spawn(async move { publish_assorted(&bus, 200).await });
    // Stop while the log is still growing and the keeper is following it.
    let deadline = Instant::now() + WAIT;
    while env.stored_max().await < 20 {
        assert!(Instant::now() < deadline, "no rows written");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    audit.stop().await;
    let stopped_at = env.stored_max().await;
    publisher.await.expect("publisher finishes");
    assert!(stopped_at < 200, "stopped mid-stream, not at {stopped_at}");

    env.publish_assorted(20).await;
    let audit = env.start_audit(config).await;
    env.publish_assorted(10).await;
    let last = env.settled().await;

    let (rows, distinct, max): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT sequence), max(sequence) FROM audit.events",
    )
    .fetch_one(&env.db)
    .await
    .expect("audit.events readable");
    assert_eq!(rows as u64, last, "one row per stored message");
    assert_eq!(distinct, rows);
    assert_eq!(max as u64, last);

    let report = env.verify().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(report.events, last);
    assert_eq!(report.head, recompute(&env.stream(last).await, last).1);
    assert!(
        report.checkpoints >= 2,
        "after 100 and 200 events: {report:?}"
    );
    assert_eq!(report.checkpoints_verified, report.checkpoints);

    // Both runs signed with the key kept in the file.
    let keys: i64 = sqlx::query_scalar("SELECT count(DISTINCT public_key) FROM audit.checkpoints")
        .fetch_one(&env.db)
        .await
        .expect("audit.checkpoints readable");
    assert_eq!(keys, 1);
    audit.stop().await;
}

#[tokio::test]
async fn tampering_with_the_copy_is_detected() {
    let env = Env::new().await;
    env.publish_assorted(30).await;
    let audit = env.start_audit(env.config.clone()).await;
    env.settled().await;
    assert!(env.verify().await.ok);

    // The table is append-only while its triggers are on.
    for sql in [
        "UPDATE audit.events SET subject = 'x' WHERE sequence = 3",
        "DELETE FROM audit.events WHERE sequence = 3",
        "TRUNCATE audit.events",
        "TRUNCATE audit.checkpoints",
    ] {
        let err = sqlx::query(sql)
            .execute(&env.db)
            .await
            .expect_err("the append-only trigger refuses it");
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }

    // A superuser can switch the triggers off: verification still catches it.
    // A stored link flipped by one bit.
    behind_the_triggers(
        &env.db,
        "UPDATE audit.events SET hash = set_byte(hash, 0, get_byte(hash, 0) # 1) WHERE sequence = 7",
    )
    .await;
    let report = env.verify().await;
    assert!(!report.ok, "{report:?}");
    assert_eq!(report.first_mismatch, Some(7));
    assert_eq!(
        report.events, 30,
        "the chain is still recomputed to the end"
    );

    behind_the_triggers(
        &env.db,
        "UPDATE audit.events SET hash = set_byte(hash, 0, get_byte(hash, 0) # 1) WHERE sequence = 7",
    )
    .await;
    assert!(
        env.verify().await.ok,
        "undoing the change restores the chain"
    );

    // A stored payload changed by one byte, its link left alone.
    behind_the_triggers(
        &env.db,
        "UPDATE audit.events SET payload = payload || '\\x20'::bytea WHERE sequence = 12",
    )
    .await;
    let report = env.verify().await;
    assert!(!report.ok, "{report:?}");
    assert_eq!(report.first_mismatch, Some(12));

    // A row removed from the copy.
    behind_the_triggers(&env.db, "DELETE FROM audit.events WHERE sequence = 5").await;
    let report = env.verify().await;
    assert!(!report.ok);
    assert_eq!(report.first_mismatch, Some(5));
    audit.stop().await;
}

#[tokio::test]
async fn checkpoints_are_signed_chained_and_verified() {
    let env = Env::new().await;
    let mut config = env.config.clone();
    config.checkpoint_every_events = 10;
    let audit = env.start_audit(config).await;
    env.publish_assorted(25).await;
    let last = env.settled().await;

    let checkpoints = env.checkpoints_in_stream().await;
    assert_eq!(
        checkpoints.len(),
        2,
        "after 10 and 20 events: {checkpoints:?}"
    );
    let stream = env.stream(last).await;
    for (at, cp) in &checkpoints {
        assert!(cp.sequence < *at, "a checkpoint covers earlier events");
        let (events, head) = recompute(&stream, cp.sequence);
        assert_eq!(cp.head, head);
        assert_eq!(cp.events, events);
        let key_bytes: [u8; 32] = hex::decode(&cp.public_key).unwrap().try_into().unwrap();
        let key = VerifyingKey::from_bytes(&key_bytes).expect("a public key");
        let signature = Signature::from_slice(&hex::decode(&cp.signature).unwrap()).unwrap();
        let statement = format!(
            "leasehold-audit-checkpoint:v1:{}:{}:{}",
            cp.sequence, cp.events, cp.head
        );
        key.verify(statement.as_bytes(), &signature)
            .expect("the checkpoint signature verifies");
    }
    // The first covers exactly the first ten events other than checkpoints.
    let first = &checkpoints[0].1;
    let non_checkpoints_upto = stream
        .iter()
        .filter(|(s, subj, _)| *s <= first.sequence && subj != &subject::audit())
        .count();
    assert_eq!(non_checkpoints_upto, 10);

    let report = env.verify().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(report.checkpoints, 2);
    assert_eq!(report.checkpoints_verified, 2);
    assert_eq!(report.events, last);
    audit.stop().await;
}

#[tokio::test]
async fn a_quiet_log_gets_one_timed_checkpoint_not_a_loop() {
    let env = Env::new().await;
    let mut config = env.config.clone();
    config.checkpoint_every_secs = 1;
    env.publish_assorted(3).await;
    let audit = env.start_audit(config).await;

    let deadline = Instant::now() + WAIT;
    while env.checkpoints_in_stream().await.is_empty() {
        assert!(Instant::now() < deadline, "no timed checkpoint");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Its own checkpoint is not news: no further checkpoint follows.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let checkpoints = env.checkpoints_in_stream().await;
    assert_eq!(checkpoints.len(), 1, "{checkpoints:?}");
    assert_eq!(checkpoints[0].1.sequence, 3);
    assert_eq!(checkpoints[0].1.events, 3);

    let report = env.verify().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(report.checkpoints_verified, 1);
    audit.stop().await;
}

#[tokio::test]
async fn messages_no_reader_can_decode_are_chained_copied_and_verified() {
    let env = Env::new().await;
    let bad = fixtures::undecodable();
    let publish_bad = || async {
        for (_, bytes) in &bad {
            env.bus
                .jetstream()
                .publish(subject::audit(), bytes.clone().into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    env.publish_assorted(5).await;
    publish_bad().await;
    env.publish_assorted(5).await;
    let audit = env.start_audit(env.config.clone()).await;
    let last = env.settled().await;
    let report = env.verify().await;
    let (events, head) = recompute(&env.stream(last).await, last);
    assert!(report.ok, "{report:?}");
    assert_eq!((report.events, report.head.clone()), (events, head));
    assert_eq!(report.events, last, "every message is chained");

    let rows: Vec<(i64, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT sequence, event_type, skip_reason FROM audit.events
         WHERE skip_reason IS NOT NULL ORDER BY sequence",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    let reasons: Vec<&str> = rows.iter().map(|r| r.2.as_deref().unwrap()).collect();
    let expected: Vec<&str> = bad.iter().map(|(reason, _)| reason.as_str()).collect();
    assert_eq!(reasons, expected);
    assert_eq!(rows[0].1, None, "junk has no type");
    assert_eq!(rows[2].1.as_deref(), Some("lease.stop_requested"));

    let metrics = audit.metrics().await;
    assert!(
        metrics.contains("lh_events_skipped_total{service=\"lh-audit\",reason=\"junk\"}"),
        "{metrics}"
    );

    // A restart resumes after them, and newer bad messages at the head
    // are chained too.
    audit.stop().await;
    publish_bad().await;
    let audit = env.start_audit(env.config.clone()).await;
    let last = env.settled().await;
    let report = env.verify().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(report.events, last);
    audit.stop().await;
}

/// How long the log keeps an event in the tests that run it past expiry.
const SHORT_LOG_MAX_AGE: Duration = Duration::from_secs(4);

impl Env {
    /// The oldest sequence the log still holds.
    async fn log_first(&self) -> u64 {
        let mut stream = self
            .bus
            .jetstream()
            .get_stream(subject::EVENTS_STREAM)
            .await
            .expect("the log");
        stream
            .info()
            .await
            .expect("stream info")
            .state
            .first_sequence
    }

    /// Waits until the log no longer holds `sequence`.
    async fn expired_past(&self, sequence: u64) {
        let deadline = Instant::now() + WAIT;
        while self.log_first().await <= sequence {
            assert!(
                Instant::now() < deadline,
                "the log never expired sequence {sequence}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The newest prune recorded in the copy: (anchor, below_sequence).
    async fn newest_prune(&self) -> Option<(u64, u64)> {
        let row: Option<(i64, i64)> = sqlx::query_as(
            "SELECT anchor_checkpoint, below_sequence FROM audit.prunes
             ORDER BY anchor_checkpoint DESC LIMIT 1",
        )
        .fetch_optional(&self.db)
        .await
        .expect("audit.prunes readable");
        row.map(|(a, b)| (a as u64, b as u64))
    }

    /// The lowest sequence the copy holds in `table`.
    async fn copy_min(&self, table: &str) -> u64 {
        let min: Option<i64> = sqlx::query_scalar(&format!("SELECT min(sequence) FROM {table}"))
            .fetch_one(&self.db)
            .await
            .expect("the copy readable");
        min.unwrap_or_default() as u64
    }
}

/// A test config whose signing key outlives a restart.
fn keyed(config: &Config, key_dir: &tempfile::TempDir) -> Config {
    let mut config = config.clone();
    config.signing_key_file = Some(key_dir.path().join("audit.key"));
    config.checkpoint_every_events = 5;
    config
}

#[tokio::test]
async fn after_expiry_verification_starts_from_an_anchor_and_the_copy_is_pruned() {
    let env = Env::with_log(Some(SHORT_LOG_MAX_AGE)).await;
    let key_dir = tempfile::tempdir().expect("a temp dir");
    let mut config = keyed(&env.config, &key_dir);
    config.prune_every_secs = 1;
    let audit = env.start_audit(config.clone()).await;
    env.publish_assorted(12).await;
    let before_expiry = env.settled().await;
    let report = env.verify().await;
    assert!(report.ok, "{report:?}");
    assert_eq!((report.anchor.clone(), report.checked_from), (None, 1));

    env.expired_past(before_expiry).await;
    env.publish_assorted(12).await;

    // The keeper publishes audit.pruned and deletes below its anchor.
    let deadline = Instant::now() + WAIT;
    let (anchor, below) = loop {
        if let Some(prune) = env.newest_prune().await {
            break prune;
        }
        assert!(Instant::now() < deadline, "the copy was never pruned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(anchor < below && below > before_expiry, "{anchor} {below}");
    let last = env.settled().await;
    let pruned_on_the_log: Vec<AuditPruned> = env
        .stream(last)
        .await
        .into_iter()
        .filter_map(
            |(_, _, payload)| match Envelope::from_json(&payload).ok()?.data {
                EventData::AuditPruned(p) => Some(p),
                _ => None,
            },
        )
        .collect();
    assert!(
        pruned_on_the_log.contains(&AuditPruned {
            below_sequence: below,
            anchor_checkpoint: anchor,
        }),
        "{pruned_on_the_log:?}"
    );
    assert!(env.copy_min("audit.events").await >= anchor);
    assert!(env.copy_min("audit.checkpoints").await >= anchor);
    // Pruned rows are the only ones the trigger lets go.
    let err = sqlx::query("DELETE FROM audit.events WHERE sequence = $1")
        .bind(last as i64)
        .execute(&env.db)
        .await
        .expect_err("a row above the anchor is not deleted");
    assert!(err.to_string().contains("append-only"), "{err}");

    let report = env.verify().await;
    assert!(report.ok, "{report:?}");
    let from = report.anchor.clone().expect("verified from an anchor");
    assert!(from.sequence >= anchor && from.sequence < env.log_first().await);
    assert_eq!(report.checked_from, from.sequence + 1);
    assert_eq!(report.sequence, last);
    let stored_head: Vec<u8> =
        sqlx::query_scalar("SELECT hash FROM audit.events WHERE sequence = $1")
            .bind(last as i64)
            .fetch_one(&env.db)
            .await
            .expect("the newest link");
    assert_eq!(report.head, hex::encode(stored_head));
    assert_eq!(report.checkpoints_verified, report.checkpoints);

    // After a restart the keeper counts on from the anchor: its next
    // checkpoint states the event count verification recomputes.
    audit.stop().await;
    let audit = env.start_audit(config).await;
    env.publish_assorted(6).await;
    let last = env.settled().await;
    let report = env.verify().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(report.sequence, last);
    assert!(report.checkpoints > 1, "{report:?}");
    assert_eq!(report.checkpoints_verified, report.checkpoints);
    audit.stop().await;

    // The anchor is signed by the old key: a service that trusts only its
    // own, new key does not trust it.
    let other_key = tempfile::tempdir().expect("a temp dir");
    let audit = env.start_audit(keyed(&env.config, &other_key)).await;
    let report = env.verify().await;
    assert!(!report.ok, "{report:?}");
    assert!(
        report
            .problem
            .as_deref()
            .unwrap_or_default()
            .contains("not signed by a pinned key"),
        "{report:?}"
    );
    audit.stop().await;
}

#[tokio::test]
async fn a_changed_event_after_the_anchor_is_still_found() {
    let env = Env::with_log(Some(SHORT_LOG_MAX_AGE)).await;
    let key_dir = tempfile::tempdir().expect("a temp dir");
    // No prune within the test: the rows between the anchor and the log's
    // first sequence stay, and are checked from the copy alone.
    let audit = env.start_audit(keyed(&env.config, &key_dir)).await;
    env.publish_assorted(12).await;
    let before_expiry = env.settled().await;
    env.expired_past(before_expiry).await;
    env.publish_assorted(3).await;
    let last = env.settled().await;

    let report = env.verify().await;
    assert!(report.ok, "{report:?}");
    let anchor = report
        .anchor
        .clone()
        .expect("verified from an anchor")
        .sequence;
    assert!(anchor < before_expiry, "{report:?}");

    // A row the log still holds, and a row only the copy still holds.
    for changed in [last, anchor + 1] {
        let change = format!(
            "UPDATE audit.events SET payload = payload || '\\x20'::bytea WHERE sequence = {changed}"
        );
        behind_the_triggers(&env.db, &change).await;
        let report = env.verify().await;
        assert!(!report.ok, "{report:?}");
        assert_eq!(report.first_mismatch, Some(changed), "{report:?}");
        let undo = format!(
            "UPDATE audit.events SET payload = substring(payload from 1 for length(payload) - 1) WHERE sequence = {changed}"
        );
        behind_the_triggers(&env.db, &undo).await;
        assert!(env.verify().await.ok);
    }

    // A stored link at the anchor that is not the signed head.
    behind_the_triggers(
        &env.db,
        &format!("UPDATE audit.events SET hash = set_byte(hash, 0, get_byte(hash, 0) # 1) WHERE sequence = {anchor}"),
    )
    .await;
    let report = env.verify().await;
    assert_eq!(report.first_mismatch, Some(anchor), "{report:?}");
    audit.stop().await;
}

#[tokio::test]
async fn without_a_checkpoint_before_the_log_start_there_is_no_anchor() {
    let env = Env::with_log(Some(SHORT_LOG_MAX_AGE)).await;
    let mut config = env.config.clone();
    config.prune_every_secs = 1;
    let audit = env.start_audit(config).await;
    env.publish_assorted(5).await;
    let before_expiry = env.settled().await;
    env.expired_past(before_expiry).await;
    env.publish_assorted(2).await;
    env.settled().await;

    let report = env.verify().await;
    assert!(!report.ok, "{report:?}");
    assert_eq!(report.anchor, None);
    assert!(
        report
            .problem
            .as_deref()
            .unwrap_or_default()
            .starts_with("no anchor"),
        "{report:?}"
    );
    // Nothing is pruned without an anchor.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.newest_prune().await, None);
    assert_eq!(env.copy_min("audit.events").await, 1);
    audit.stop().await;
}

#[tokio::test]
async fn a_prune_of_rows_the_log_still_holds_is_copied_but_not_applied() {
    let env = Env::new().await;
    let key_dir = tempfile::tempdir().expect("a temp dir");
    let audit = env.start_audit(keyed(&env.config, &key_dir)).await;
    env.publish_assorted(12).await;
    env.settled().await;
    let anchor = env.checkpoints_in_stream().await[0].1.sequence;
    // An audit.pruned by an audit service other than this one, on a log
    // where nothing has expired.
    let forged = Envelope::new(
        Actor::Service("lh-audit".into()),
        Utc::now(),
        EventData::AuditPruned(AuditPruned {
            below_sequence: anchor + 1,
            anchor_checkpoint: anchor,
        }),
    );
    env.bus
        .publish(&forged, Expect::Any)
        .await
        .expect("event is stored");
    env.settled().await;

    assert_eq!(env.newest_prune().await, None);
    assert_eq!(env.copy_min("audit.events").await, 1);
    let report = env.verify().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(report.anchor, None);
    audit.stop().await;
}

/// A second replica on the same schema waits for the keeper's lock: it
/// neither copies nor decides until the first one stops, and then takes
/// over from the table.
#[tokio::test]
async fn a_second_replica_waits_as_a_standby_then_takes_over() {
    let env = Env::new().await;
    let key_dir = tempfile::tempdir().expect("a temp dir");
    let config = keyed(&env.config, &key_dir);
    let first = env.start_audit(config.clone()).await;
    let standby_shutdown = CancellationToken::new();
    let standby = lh_audit::start(config.clone(), standby_shutdown.clone())
        .await
        .expect("the standby starts");
    env.publish_assorted(12).await;
    env.settled().await;
    assert!(!standby.readiness.is_ready(), "a standby is not ready");
    // One keeper decided: one checkpoint after each five events.
    assert_eq!(env.checkpoints_in_stream().await.len(), 2);

    first.stop().await;
    lh_testkit::wait_ready("the standby", &standby, WAIT).await;
    env.publish_assorted(5).await;
    let last = env.settled().await;
    assert_eq!(env.checkpoints_in_stream().await.len(), 3);
    let report = env.verify().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(report.events, last);
    assert_eq!(report.checkpoints_verified, 3);
    standby_shutdown.cancel();
    standby.wait().await.expect("the standby stops cleanly");
}

/// What auditors filter on, row by row.
type QueryColumns = Vec<(
    i64,
    Option<Uuid>,
    Option<String>,
    Option<String>,
    Option<String>,
)>;

async fn query_columns(db: &PgPool) -> QueryColumns {
    sqlx::query_as(
        "SELECT sequence, tenant_id, actor, object, outcome FROM audit.events ORDER BY sequence",
    )
    .fetch_all(db)
    .await
    .unwrap()
}

#[tokio::test]
async fn rows_copied_before_the_query_columns_are_filled_from_their_payload() {
    let env = Env::new().await;
    env.publish_assorted(12).await;
    for (_, bytes) in fixtures::undecodable() {
        env.bus
            .jetstream()
            .publish(subject::audit(), bytes.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let audit = env.start_audit(env.config.clone()).await;
    env.settled().await;
    audit.stop().await;
    let kept = query_columns(&env.db).await;
    assert!(
        kept.iter().any(|r| r.1.is_some()),
        "some rows name a tenant"
    );
    assert!(kept.iter().any(|r| r.2.is_none()), "junk names no actor");
    assert!(kept.iter().all(|r| r.2.is_none()
        || r.2.as_deref().unwrap().contains(':')
        || ["admin", "auditor"].contains(&r.2.as_deref().unwrap())));

    // As if the copy had been made before the columns existed: they go,
    // and the migration that adds them runs again on the next start.
    sqlx::query(
        "ALTER TABLE audit.events DROP COLUMN tenant_id, DROP COLUMN actor, \
         DROP COLUMN object, DROP COLUMN outcome",
    )
    .execute(&env.db)
    .await
    .unwrap();
    sqlx::query("DROP INDEX audit.events_type_sequence, audit.events_occurred_at")
        .execute(&env.db)
        .await
        .unwrap();
    sqlx::query("DELETE FROM audit._sqlx_migrations WHERE version = 4")
        .execute(&env.db)
        .await
        .unwrap();
    let audit = env.start_audit(env.config.clone()).await;
    env.settled().await;
    let backfilled = query_columns(&env.db).await;
    // The migration can read only what each envelope names; the keeper
    // tags a lease's events with the lease's tenant as the log holds it,
    // where the envelope names none.
    let as_backfilled: QueryColumns = kept
        .iter()
        .zip(&backfilled)
        .map(|(kept, backfilled)| {
            let by_lease = kept.3.as_deref().is_some_and(|o| o.starts_with("lease."));
            let tenant = match (kept.1, backfilled.1) {
                (Some(_), None) if by_lease => None,
                (kept, _) => kept,
            };
            (
                kept.0,
                tenant,
                kept.2.clone(),
                kept.3.clone(),
                kept.4.clone(),
            )
        })
        .collect();
    assert_eq!(
        backfilled[..kept.len()],
        as_backfilled[..],
        "the migration fills what the keeper would have"
    );
    assert!(
        kept.iter()
            .filter(|r| r.3.as_deref().is_some_and(|o| o.starts_with("lease.")))
            .all(|r| r.1.is_some()),
        "every lease event is in its tenant's trail: {kept:?}"
    );
    let report = env.verify().await;
    assert!(report.ok, "the chain is untouched: {report:?}");
    audit.stop().await;
}

/// The auditor's verifiers (the pure engine `lh audit verify` runs, and the
/// Python one written from the spec) pass the log this service keeps, with
/// its key pinned, and find the head its own report finds.
#[tokio::test]
async fn the_auditors_verifiers_pass_the_services_own_log() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("audit.key");
    let seed = [42u8; 32];
    std::fs::write(&key_file, format!("{}\n", hex::encode(seed))).unwrap();
    let pinned = ed25519_dalek::SigningKey::from_bytes(&seed)
        .verifying_key()
        .to_bytes();
    let mut config = env.config.clone();
    config.checkpoint_every_events = 10;
    config.signing_key_file = Some(key_file);
    let audit = env.start_audit(config).await;
    env.publish_assorted(25).await;
    let last = env.settled().await;
    let report = env.verify().await;
    assert!(report.ok, "{report:?}");

    let mut check = lh_domain::chain_check::StreamCheck::from_genesis(pinned);
    for (seq, subject, payload) in env.stream(last).await {
        check.message(seq, &subject, &payload);
    }
    let found = check.report();
    assert!(found.ok, "{found:?}");
    assert_eq!(found.checkpoints_verified, 2, "{found:?}");
    assert_eq!(found.head, report.head);

    let python = lh_testkit::workspace_root().join(".data/venv/bin/python");
    let out = std::process::Command::new(python)
        .arg(lh_testkit::workspace_root().join("tools/audit-verify/verify.py"))
        .args(["--json", "--nats-url", &env._nats.url(), "--public-key"])
        .arg(hex::encode(pinned))
        .env_remove("LH_NATS_USER")
        .env_remove("LH_NATS_NKEY_SEED_FILE")
        .output()
        .expect("verify.py runs (scripts/deps.sh installs its packages)");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let python: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(python["head"], report.head);
    assert_eq!(python["checkpoints_verified"], 2);
    audit.stop().await;
}

/// The last checkpoint on the stream up to `upto`: what a run that verified
/// up to there resumes from next.
async fn last_checkpoint_upto(env: &Env, upto: u64) -> AuditCheckpoint {
    env.checkpoints_in_stream()
        .await
        .into_iter()
        .rev()
        .find(|(at, _)| *at <= upto)
        .map(|(_, cp)| cp)
        .expect("a checkpoint on the stream")
}

#[tokio::test]
async fn verification_resumes_from_the_last_verified_checkpoint_and_shares_runs() {
    let env = Env::new().await;
    let key_dir = tempfile::tempdir().expect("a temp dir");
    let mut config = keyed(&env.config, &key_dir);
    config.checkpoint_every_events = 10;
    let audit = env.start_audit(config.clone()).await;
    env.publish_assorted(25).await;
    let first_last = env.settled().await;

    let first = env.verify_incremental().await;
    assert!(first.ok, "{first:?}");
    assert_eq!(first.checked_from, 1, "nothing verified before: {first:?}");
    assert_eq!(first.events_checked_this_run, first.events);
    assert_eq!(first.sequence, first_last);
    let resume = last_checkpoint_upto(&env, first_last).await;

    // Only what came after the last verified checkpoint is checked.
    env.publish_assorted(7).await;
    let last = env.settled().await;
    let second = env.verify_incremental().await;
    assert!(second.ok, "{second:?}");
    assert_eq!(second.sequence, last);
    assert_eq!(second.events, recompute(&env.stream(last).await, last).0);
    let resumed = second.resumed_from.clone().expect("resumed");
    assert_eq!(resumed.sequence, resume.sequence, "{second:?}");
    assert_eq!(second.checked_from, resume.sequence + 1);
    assert_eq!(
        second.events_checked_this_run,
        second.events - resume.events
    );
    assert!(second.events_checked_this_run < second.events);
    assert!(second.run > first.run);

    // No new event: the cached result, not another run.
    let again = env.verify_incremental().await;
    assert_eq!(again, second);

    // Calls made while a run is on wait for it and share its result.
    env.publish_assorted(3).await;
    env.settled().await;
    let (a, b, c, d) = tokio::join!(
        env.verify_incremental(),
        env.verify_incremental(),
        env.verify_incremental(),
        env.verify_incremental(),
    );
    assert!(a.ok, "{a:?}");
    assert_eq!(a.run, second.run + 1, "one run for all four");
    for other in [&b, &c, &d] {
        assert_eq!(other, &a);
    }

    // A restart resumes from the checkpoint the last run stored.
    let stored: i64 = sqlx::query_scalar("SELECT sequence FROM audit.verified_checkpoint")
        .fetch_one(&env.db)
        .await
        .expect("a stored verified checkpoint");
    assert_eq!(
        stored as u64,
        last_checkpoint_upto(&env, a.sequence).await.sequence
    );
    audit.stop().await;
    let audit = env.start_audit(config).await;
    env.publish_assorted(2).await;
    env.settled().await;
    let after_restart = env.verify_incremental().await;
    assert!(after_restart.ok, "{after_restart:?}");
    assert_eq!(after_restart.run, 1, "a new process");
    assert_eq!(
        after_restart.resumed_from.map(|r| r.sequence),
        Some(stored as u64)
    );
    assert!(after_restart.events_checked_this_run < after_restart.events);

    // A full run still starts from the genesis.
    let full = env.verify().await;
    assert!(full.ok, "{full:?}");
    assert_eq!(full.checked_from, 1);
    assert_eq!(full.events_checked_this_run, full.events);
    audit.stop().await;
}

#[tokio::test]
async fn a_checkpoint_on_the_log_signed_by_a_key_not_pinned_fails_verification() {
    use ed25519_dalek::Signer as _;
    let env = Env::new().await;
    let audit = env.start_audit(env.config.clone()).await;
    env.publish_assorted(10).await;
    let last = env.settled().await;
    assert!(env.verify().await.ok);

    // A checkpoint true to the log, but signed by a key nobody pinned.
    let (events, head) = recompute(&env.stream(last).await, last);
    let foreign = ed25519_dalek::SigningKey::from_bytes(&[9u8; 32]);
    let statement = format!("leasehold-audit-checkpoint:v1:{last}:{events}:{head}");
    let forged = AuditCheckpoint {
        sequence: last,
        head,
        events,
        public_key: hex::encode(foreign.verifying_key().to_bytes()),
        signature: hex::encode(foreign.sign(statement.as_bytes()).to_bytes()),
    };
    let envelope = Envelope::new(
        Actor::Service("lh-audit".into()),
        Utc::now(),
        EventData::AuditCheckpoint(forged),
    );
    env.bus
        .publish(&envelope, Expect::Any)
        .await
        .expect("stored");
    env.settled().await;

    for report in [env.verify_incremental().await, env.verify().await] {
        assert!(!report.ok, "{report:?}");
        let bad = report.first_bad_checkpoint.expect("a bad checkpoint");
        assert_eq!(bad.sequence, last);
        assert_eq!(bad.checkpoint_at, last + 1);
        assert_eq!(bad.reason, "key_not_pinned");
    }
    // Found by both runs, recorded once.
    let found = env.divergences().await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].1.first_sequence, found[0].1.kind),
        (last, DivergenceKind::CheckpointFails)
    );
    audit.stop().await;
}

#[tokio::test]
async fn a_divergence_is_recorded_once_per_finding() {
    let env = Env::new().await;
    env.publish_assorted(30).await;
    let audit = env.start_audit(env.config.clone()).await;
    let last = env.settled().await;
    // An honest log raises none, whichever way it is verified.
    assert!(env.verify().await.ok);
    assert!(env.verify_incremental().await.ok);
    assert!(env.divergences().await.is_empty());

    let change = "UPDATE audit.events SET payload = payload || '\\x20'::bytea WHERE sequence = 12";
    behind_the_triggers(&env.db, change).await;
    let report = env.verify().await;
    assert_eq!(report.first_mismatch, Some(12), "{report:?}");
    let found = env.divergences().await;
    assert_eq!(found.len(), 1, "{found:?}");
    let (at, divergence) = &found[0];
    assert!(*at > last, "published after the log it judges");
    assert_eq!(
        divergence,
        &AuditDivergenceDetected {
            first_sequence: 12,
            kind: DivergenceKind::CopyRowDiffers,
            checked_from: 1,
            checked_to: report.sequence,
            head: report.head.clone(),
            full: true,
        }
    );

    // Found again, fully or incrementally: not recorded again.
    env.settled().await;
    assert_eq!(env.verify().await.first_mismatch, Some(12));
    env.publish_assorted(2).await;
    env.settled().await;
    let incremental = env.verify_incremental().await;
    assert_eq!(incremental.first_mismatch, Some(12), "{incremental:?}");
    assert_eq!(env.divergences().await.len(), 1);

    // Repaired, a full run holds and forgets it: the same change made
    // again is a new finding.
    let undo = "UPDATE audit.events SET payload = substring(payload from 1 for length(payload) - 1) WHERE sequence = 12";
    behind_the_triggers(&env.db, undo).await;
    assert!(env.verify().await.ok);
    behind_the_triggers(&env.db, change).await;
    assert_eq!(env.verify().await.first_mismatch, Some(12));
    assert_eq!(env.divergences().await.len(), 2);

    // A row removed from the copy before it is another finding.
    behind_the_triggers(&env.db, "DELETE FROM audit.events WHERE sequence = 5").await;
    let report = env.verify().await;
    assert_eq!(report.first_mismatch, Some(5));
    let found = env.divergences().await;
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(
        (found[2].1.first_sequence, found[2].1.kind),
        (5, DivergenceKind::MissingFromCopy)
    );

    // The last finding recorded outlives a restart.
    audit.stop().await;
    let audit = env.start_audit(env.config.clone()).await;
    env.settled().await;
    assert_eq!(env.verify().await.first_mismatch, Some(5));
    assert_eq!(env.divergences().await.len(), 3);
    let metrics = audit.metrics().await;
    // The recorder is the process's, shared with the tests running
    // alongside: its count is theirs too.
    assert!(metrics.contains("lh_audit_divergences_total"), "{metrics}");
    audit.stop().await;
}

/// Retention and the incremental path together: a resume point the log
/// has expired past, a prune, and verification resuming from the anchor.
#[tokio::test]
async fn incremental_verification_resumes_from_the_anchor_once_the_log_expired_past_it() {
    let env = Env::with_log(Some(SHORT_LOG_MAX_AGE)).await;
    let key_dir = tempfile::tempdir().expect("a temp dir");
    let mut config = keyed(&env.config, &key_dir);
    config.prune_every_secs = 1;
    let audit = env.start_audit(config).await;
    env.publish_assorted(12).await;
    let first_last = env.settled().await;
    let first = env.verify_incremental().await;
    assert!(first.ok, "{first:?}");
    let resume = last_checkpoint_upto(&env, first_last).await.sequence;

    // More checkpoints after the resume point, then the log expires past
    // all of them: the anchor is newer than the resume point.
    env.publish_assorted(12).await;
    let before_expiry = env.settled().await;
    env.expired_past(before_expiry).await;
    // Fewer than a checkpoint's worth: no newer anchor, and no second
    // prune, while the rows after this one are looked at.
    env.publish_assorted(3).await;
    let deadline = Instant::now() + WAIT;
    // An earlier prune may rest on the resume point itself; wait for one
    // past it.
    let (anchor, below) = loop {
        if let Some(prune) = env.newest_prune().await.filter(|(a, _)| *a > resume) {
            break prune;
        }
        assert!(
            Instant::now() < deadline,
            "the copy was never pruned past {resume}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        resume < anchor && anchor < below,
        "{resume} {anchor} {below}"
    );
    let last = env.settled().await;
    let pruned_on_the_log = env
        .stream(last)
        .await
        .into_iter()
        .filter_map(
            |(_, _, payload)| match Envelope::from_json(&payload).ok()?.data {
                EventData::AuditPruned(p) => Some(p),
                _ => None,
            },
        )
        .any(|p| p.anchor_checkpoint == anchor && p.below_sequence == below);
    assert!(pruned_on_the_log, "audit.pruned for anchor {anchor}");
    assert!(env.copy_min("audit.events").await >= anchor);

    // A row after the anchor, held by the copy alone, changed: the
    // incremental run starts from the anchor, so it is found.
    let changed = anchor + 1;
    behind_the_triggers(
        &env.db,
        &format!("UPDATE audit.events SET payload = payload || '\\x20'::bytea WHERE sequence = {changed}"),
    )
    .await;
    let tampered = env.verify_incremental().await;
    assert!(!tampered.ok, "{tampered:?}");
    assert_eq!(tampered.first_mismatch, Some(changed), "{tampered:?}");
    assert_eq!(tampered.resumed_from, None, "{tampered:?}");
    let from = tampered.anchor.clone().expect("from an anchor").sequence;
    assert!(from >= anchor, "{tampered:?}");
    assert_eq!(tampered.checked_from, from + 1);
    let found = env.divergences().await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].1.first_sequence, changed);
    assert_eq!(found[0].1.checked_from, from + 1);
    assert!(!found[0].1.full);
    behind_the_triggers(
        &env.db,
        &format!("UPDATE audit.events SET payload = substring(payload from 1 for length(payload) - 1) WHERE sequence = {changed}"),
    )
    .await;

    // Repaired (and a new event, past the cached report): the incremental
    // run holds, from the anchor, not from the expired resume point.
    env.publish_assorted(1).await;
    let last = env.settled().await;
    let report = env.verify_incremental().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(report.resumed_from, None, "{report:?}");
    let from = report.anchor.clone().expect("from an anchor");
    assert!(
        from.sequence >= anchor && from.sequence > resume,
        "{report:?}"
    );
    assert_eq!(report.checked_from, from.sequence + 1);
    assert_eq!(report.sequence, last);
    assert_eq!(report.events_checked_this_run, report.events - from.events);
    assert_eq!(report.checkpoints_verified, report.checkpoints);

    // From the checkpoint that run verified on, a change is still found.
    env.publish_assorted(6).await;
    let last = env.settled().await;
    behind_the_triggers(
        &env.db,
        &format!(
            "UPDATE audit.events SET payload = payload || '\\x20'::bytea WHERE sequence = {last}"
        ),
    )
    .await;
    env.publish_assorted(1).await;
    env.settled().await;
    let tampered = env.verify_incremental().await;
    assert!(!tampered.ok, "{tampered:?}");
    assert_eq!(tampered.first_mismatch, Some(last), "{tampered:?}");
    let started = tampered
        .resumed_from
        .as_ref()
        .or(tampered.anchor.as_ref())
        .expect("resumed or anchored")
        .sequence;
    assert!(started >= from.sequence, "{tampered:?}");
    assert_eq!(tampered.checked_from, started + 1);
    audit.stop().await;
}

#[tokio::test]
async fn a_row_the_log_never_held_is_a_divergence_of_its_own_kind() {
    let env = Env::new().await;
    env.publish_assorted(20).await;
    let audit = env.start_audit(env.config.clone()).await;
    let last = env.settled().await;
    assert!(env.verify().await.ok);

    // A row forged into the copy after the log's last message (a copy of
    // another row, under the next sequence). The log denies deletes, so
    // this is how the copy comes to hold what the log does not.
    sqlx::query(
        "INSERT INTO audit.events (sequence, subject, event_id, event_type, occurred_at, payload, hash)
         SELECT $1, subject, event_id, event_type, occurred_at, payload, hash
         FROM audit.events WHERE sequence = 5",
    )
    .bind((last + 1) as i64)
    .execute(&env.db)
    .await
    .expect("the append-only copy takes an insert");
    let report = env.verify().await;
    assert!(!report.ok, "{report:?}");
    assert_eq!(report.first_mismatch, Some(last + 1), "{report:?}");
    let found = env.divergences().await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].1.first_sequence, found[0].1.kind),
        (last + 1, DivergenceKind::MissingFromStream)
    );
    audit.stop().await;
}
