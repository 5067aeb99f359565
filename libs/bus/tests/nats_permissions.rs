//! The deployment's NATS users and permissions (deploy/nats/permissions.conf
//! and a users.conf written by `lh_bus::auth`, as `lh-nats-auth` writes it)
//! on a real nats-server: each door the owner table closes is tried and
//! seen shut, and what each user needs still works.

use std::time::Duration;

use async_nats::jetstream;
use chrono::Utc;
use lh_bus::{auth, Bus, BusConfig, Credentials, Expect, TlsFiles};
use lh_events::{fixtures, subject, Actor, Envelope, EventData, LeaseStarted};
use lh_testkit::Nats;
use tokio::sync::mpsc;
use uuid::Uuid;

/// How long a refused publish is waited on: the server drops it and says
/// so on the connection, so no acknowledgement ever comes.
const REFUSED_ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the server's word on a refusal may take.
const REFUSAL_NOTICE_TIMEOUT: Duration = Duration::from_secs(5);

struct Users {
    seeds: Vec<(String, String)>,
}

impl Users {
    /// Every fixed user and nodes `n1` and `n2`, each with a new nkey.
    fn new() -> Self {
        let mut seeds = Vec::new();
        for (user, _) in auth::fixed_users() {
            seeds.push((user, nkeys::KeyPair::new_user().seed().unwrap()));
        }
        for node in ["n1", "n2"] {
            seeds.push((
                auth::node_user(node),
                nkeys::KeyPair::new_user().seed().unwrap(),
            ));
        }
        Users { seeds }
    }

    /// A node added to this deployment, with a new nkey.
    fn add_node(&mut self, node: &str) {
        self.seeds.push((
            auth::node_user(node),
            nkeys::KeyPair::new_user().seed().unwrap(),
        ));
    }

    fn seed(&self, user: &str) -> String {
        self.seeds
            .iter()
            .find(|(u, _)| u == user)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| panic!("no user {user}"))
    }

    /// The files beside the server's config: the checked-in permissions and
    /// this deployment's users.
    fn files(&self) -> Vec<(String, String)> {
        let public = |seed: &str| {
            nkeys::KeyPair::from_seed(seed)
                .unwrap()
                .public_key()
                .to_string()
        };
        let (mut users, mut nodes) = (Vec::new(), Vec::new());
        for (user, seed) in &self.seeds {
            match user.strip_prefix("node-") {
                Some(node) => nodes.push((node.to_string(), public(seed))),
                None => users.push((user.clone(), public(seed))),
            }
        }
        let permissions = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/nats/permissions.conf"
        ))
        .expect("deploy/nats/permissions.conf");
        vec![
            ("permissions.conf".into(), permissions),
            ("users.conf".into(), auth::users_conf(&users, &nodes)),
        ]
    }

    async fn server(&self) -> Nats {
        Nats::start_secured(self.files(), "include \"users.conf\"")
            .await
            .expect("the secured nats-server starts")
    }

    fn credentials(&self, user: &str) -> Credentials {
        Credentials::Nkey {
            user: user.to_string(),
            seed: self.seed(user),
        }
    }

    /// A bus connected as `user` (the streams exist or it may create them).
    async fn bus(&self, nats: &Nats, user: &str) -> Bus {
        let mut config = BusConfig::new(nats.url(), user);
        config.credentials = self.credentials(user);
        tokio::time::timeout(Duration::from_secs(20), Bus::connect(&config))
            .await
            .unwrap_or_else(|_| panic!("{user} connects within 20 s"))
            .unwrap_or_else(|e| panic!("{user} connects: {e}"))
    }

    /// A plain client as `user`, and the errors the server sends it.
    async fn client(&self, nats: &Nats, user: &str) -> (async_nats::Client, Refusals) {
        let (tx, rx) = mpsc::unbounded_channel();
        let client = async_nats::ConnectOptions::new()
            .nkey(self.seed(user))
            .custom_inbox_prefix(auth::inbox_prefix(user))
            .event_callback(move |event| {
                if let async_nats::Event::ServerError(e) = event {
                    let _ = tx.send(e.to_string());
                }
                std::future::ready(())
            })
            .connect(nats.url())
            .await
            .unwrap_or_else(|e| panic!("{user} connects: {e}"));
        (client, Refusals(rx))
    }
}

struct Refusals(mpsc::UnboundedReceiver<String>);

impl Refusals {
    /// Waits for the server to refuse something on `subject`.
    async fn expect(&mut self, subject: &str) {
        let deadline = tokio::time::Instant::now() + REFUSAL_NOTICE_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, self.0.recv()).await {
                Ok(Some(error))
                    if error.to_lowercase().contains("permissions violation")
                        && error.contains(subject) =>
                {
                    return
                }
                Ok(Some(_)) => continue,
                _ => panic!("the server did not refuse {subject}"),
            }
        }
    }
}

fn started_by(node: &str, lease: Uuid) -> Envelope {
    Envelope::new(
        Actor::Node(node.into()),
        Utc::now(),
        EventData::LeaseStarted(LeaseStarted {
            lease_id: lease,
            node_id: node.into(),
            started_at: Utc::now(),
            mig_devices: Vec::new(),
        }),
    )
}

/// Publishes `envelope` through `client` as JetStream would and says
/// whether the log acknowledged it.
async fn stored(client: &async_nats::Client, envelope: &Envelope) -> bool {
    let mut js = jetstream::new(client.clone());
    js.set_timeout(REFUSED_ACK_TIMEOUT);
    match js
        .publish(envelope.subject(), envelope.to_json().into())
        .await
    {
        Ok(ack) => ack.await.is_ok(),
        Err(_) => false,
    }
}

/// The first event of the log, read through a feed as every service reads.
async fn first_event(bus: &Bus) -> lh_bus::Stored {
    let mut feed = bus.feed(&[subject::EVENTS_ALL], 1).await.unwrap();
    feed.next_within(Duration::from_secs(5))
        .await
        .expect("the log is read")
        .unwrap()
}

#[tokio::test]
async fn a_client_without_credentials_is_refused() {
    let users = Users::new();
    let nats = users.server().await;
    let anonymous = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(nats.url())
        .await;
    let error = anonymous.expect_err("an anonymous client was let in");
    assert!(
        error.to_string().to_lowercase().contains("authorization"),
        "{error}"
    );
    // A seed the server does not know is as good as none.
    let stranger = async_nats::ConnectOptions::new()
        .nkey(nkeys::KeyPair::new_user().seed().unwrap())
        .connection_timeout(Duration::from_secs(5))
        .connect(nats.url())
        .await;
    assert!(stranger.is_err(), "an unknown nkey was let in");
}

#[tokio::test]
async fn a_node_agent_publishes_only_its_own_events_heartbeat_and_usage() {
    let users = Users::new();
    let nats = users.server().await;
    let scheduler = users.bus(&nats, "scheduler").await;
    // What the node agent itself connects with works.
    let agent = users.bus(&nats, &auth::node_user("n1")).await;
    let lease = Uuid::now_v7();
    agent
        .publish(&started_by("n1", lease), Expect::Any)
        .await
        .expect("n1 reports a lease started on it");

    let (n1, mut refusals) = users.client(&nats, &auth::node_user("n1")).await;
    // lease.placed is the scheduler's, whatever actor the envelope names.
    let placed = Envelope::new(
        Actor::Service("lh-scheduler".into()),
        Utc::now(),
        EventData::LeasePlaced(fixtures::placed(
            lease,
            "n1",
            "z",
            fixtures::MODEL,
            40,
            &[0],
        )),
    );
    assert!(!stored(&n1, &placed).await, "a node stored lease.placed");
    refusals.expect(&placed.subject()).await;
    let as_node = Envelope::new(Actor::Node("n1".into()), Utc::now(), placed.data.clone());
    assert!(!stored(&n1, &as_node).await, "a node stored lease.placed");
    refusals.expect(&as_node.subject()).await;
    // Another node's events.
    let as_n2 = started_by("n2", lease);
    assert!(!stored(&n1, &as_n2).await, "n1 stored an event as n2");
    refusals.expect(&as_n2.subject()).await;

    // Heartbeats and usage: its own only.
    for subject in [subject::heartbeat("n2"), subject::usage("n2", lease)] {
        n1.publish(subject.clone(), "{}".into()).await.unwrap();
        n1.flush().await.unwrap();
        refusals.expect(&subject).await;
    }
    n1.publish(subject::heartbeat("n1"), "{}".into())
        .await
        .unwrap();
    n1.publish(subject::usage("n1", lease), "{}".into())
        .await
        .unwrap();
    n1.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(scheduler
        .last_telemetry(&subject::heartbeat("n1"))
        .await
        .unwrap()
        .is_some());
    assert!(scheduler
        .last_telemetry(&subject::heartbeat("n2"))
        .await
        .unwrap()
        .is_none());
    assert!(scheduler
        .last_telemetry(&subject::usage_of_lease(lease))
        .await
        .unwrap()
        .is_some());
    // The gateway keeps usage: it reads the samples with a feed of its own.
    let gateway = users.bus(&nats, "gateway").await;
    let mut usage = gateway
        .telemetry_feed(&[subject::USAGE_ALL], 1)
        .await
        .expect("the gateway reads the telemetry stream");
    let sample = usage
        .next_item_within(Duration::from_secs(5))
        .await
        .expect("a usage sample")
        .unwrap();
    assert_eq!(sample.subject, subject::usage("n1", lease));
    assert_eq!(sample.pending, 0, "only n1's sample was stored");

    // The scheduler may place; the log holds only what was allowed.
    scheduler
        .publish(&placed, Expect::Any)
        .await
        .expect("the scheduler places");
    let history = scheduler
        .subject_history(&subject::lease(lease), 1, 10)
        .await
        .unwrap();
    let types: Vec<&str> = history
        .iter()
        .map(|e| e.envelope.event_type.as_str())
        .collect();
    assert_eq!(types, ["lease.started", "lease.placed"]);
}

/// A node asks the gateway for its leases' environments on its own subject
/// only: the subject is how the gateway knows which node asks.
#[tokio::test]
async fn a_node_asks_for_environments_on_its_own_subject_only() {
    let users = Users::new();
    let nats = users.server().await;
    let gateway = users.bus(&nats, "gateway").await;
    let answering = tokio::spawn(async move {
        lh_bus::rpc::serve_subjects(
            &gateway,
            subject::RPC_GATEWAY_WORKLOAD_ENV_ALL,
            "gateway",
            |on: &str, _: serde_json::Value| {
                let on = on.to_string();
                async move { Ok::<_, String>(on) }
            },
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let n1 = users.bus(&nats, &auth::node_user("n1")).await;
    let answered: String = lh_bus::rpc::call(
        &n1,
        &subject::rpc_workload_env("n1"),
        &serde_json::json!({}),
        REFUSAL_NOTICE_TIMEOUT,
    )
    .await
    .expect("n1 asks on its own subject");
    assert_eq!(answered, subject::rpc_workload_env("n1"));

    let (n1_client, mut refusals) = users.client(&nats, &auth::node_user("n1")).await;
    let as_n2 = subject::rpc_workload_env("n2");
    let asked = tokio::time::timeout(
        REFUSED_ACK_TIMEOUT,
        n1_client.request(as_n2.clone(), "{}".into()),
    )
    .await;
    assert!(
        !matches!(asked, Ok(Ok(_))),
        "n1 was answered on n2's subject"
    );
    refusals.expect(&as_n2).await;
    // Nor may a node listen in the gateway's place.
    let _listening = n1_client
        .subscribe(subject::RPC_GATEWAY_WORKLOAD_ENV_ALL.to_string())
        .await;
    n1_client.flush().await.unwrap();
    refusals.expect(subject::RPC_GATEWAY_WORKLOAD_ENV_ALL).await;
    answering.abort();
}

/// The gateway reads a lease's log from the node it runs on; a node
/// answers on its own subject only, and may neither listen on another's
/// nor ask one itself.
#[tokio::test]
async fn a_node_answers_reads_of_its_lease_logs_on_its_own_subject_only() {
    let users = Users::new();
    let nats = users.server().await;
    // A service creates the logs a node's connection expects.
    let gateway = users.bus(&nats, "gateway").await;
    let n1 = users.bus(&nats, &auth::node_user("n1")).await;
    let answering = tokio::spawn(async move {
        lh_bus::rpc::serve(
            &n1,
            &subject::rpc_lease_logs("n1"),
            "node-agent",
            |_: serde_json::Value| async move { Ok::<_, String>("n1".to_string()) },
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let answered: String = lh_bus::rpc::call(
        &gateway,
        &subject::rpc_lease_logs("n1"),
        &serde_json::json!({}),
        REFUSAL_NOTICE_TIMEOUT,
    )
    .await
    .expect("the gateway asks n1");
    assert_eq!(answered, "n1");

    let (n2_client, mut refusals) = users.client(&nats, &auth::node_user("n2")).await;
    let _listening = n2_client.subscribe(subject::rpc_lease_logs("n1")).await;
    n2_client.flush().await.unwrap();
    refusals.expect(&subject::rpc_lease_logs("n1")).await;
    let asked = tokio::time::timeout(
        REFUSED_ACK_TIMEOUT,
        n2_client.request(subject::rpc_lease_logs("n1"), "{}".into()),
    )
    .await;
    assert!(!matches!(asked, Ok(Ok(_))), "n2 read n1's lease logs");
    answering.abort();
}

/// A session into a lease travels between the gateway and the lease's
/// node only (docs/adr/030): its opening answered and its frames both
/// ways, as plain publishes across the two accounts; another node may
/// neither speak on it nor listen to it, and no other service may send a
/// node a session's frame.
#[tokio::test]
async fn a_session_s_frames_pass_between_the_gateway_and_its_node_only() {
    use futures::StreamExt;
    let users = Users::new();
    let nats = users.server().await;
    // A service creates the logs a node's connection expects.
    let _streams = users.bus(&nats, "gateway").await;
    let (gateway, _) = users.client(&nats, "gateway").await;
    let (n1, _) = users.client(&nats, &auth::node_user("n1")).await;
    let session = Uuid::new_v4();
    let mut to_n1 = n1.subscribe(subject::sessions_to_node("n1")).await.unwrap();
    let mut from_n1 = gateway
        .subscribe(subject::session_from_node("n1", session))
        .await
        .unwrap();
    n1.flush().await.unwrap();
    gateway.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let node = n1.clone();
    let answering = tokio::spawn(async move {
        let open = to_n1.next().await.unwrap();
        node.publish(open.reply.unwrap(), "opened".into())
            .await
            .unwrap();
        let frame = to_n1.next().await.unwrap();
        (frame.subject.to_string(), frame.payload.to_vec())
    });
    let answer = tokio::time::timeout(
        REFUSAL_NOTICE_TIMEOUT,
        gateway.request(subject::session_open("n1"), "open".into()),
    )
    .await
    .expect("n1 answers within 5 s")
    .expect("n1 answers the opening");
    assert_eq!(&answer.payload[..], b"opened");
    gateway
        .publish(subject::session_to_node("n1", session), "stdin".into())
        .await
        .unwrap();
    let (on, payload) = tokio::time::timeout(REFUSAL_NOTICE_TIMEOUT, answering)
        .await
        .expect("the frame reaches n1")
        .unwrap();
    assert_eq!(
        (on, payload),
        (subject::session_to_node("n1", session), b"stdin".to_vec())
    );
    n1.publish(subject::session_from_node("n1", session), "stdout".into())
        .await
        .unwrap();
    let up = tokio::time::timeout(REFUSAL_NOTICE_TIMEOUT, from_n1.next())
        .await
        .expect("n1's frame reaches the gateway")
        .unwrap();
    assert_eq!(&up.payload[..], b"stdout");

    // Another node: neither speaks on n1's session nor listens to it.
    let (n2, mut refusals) = users.client(&nats, &auth::node_user("n2")).await;
    n2.publish(subject::session_from_node("n1", session), "forged".into())
        .await
        .unwrap();
    n2.flush().await.unwrap();
    refusals
        .expect(&subject::session_from_node("n1", session))
        .await;
    let _listening = n2.subscribe(subject::sessions_to_node("n1")).await;
    n2.flush().await.unwrap();
    refusals.expect(&subject::sessions_to_node("n1")).await;
    let forged = tokio::time::timeout(REFUSED_ACK_TIMEOUT, from_n1.next()).await;
    assert!(
        forged.is_err(),
        "a forged frame reached the gateway: {forged:?}"
    );

    // Only the gateway sends a node a session's frames.
    let (scheduler, mut refusals) = users.client(&nats, "scheduler").await;
    scheduler
        .publish(subject::session_to_node("n1", session), "x".into())
        .await
        .unwrap();
    scheduler.flush().await.unwrap();
    refusals
        .expect(&subject::session_to_node("n1", session))
        .await;
}

#[tokio::test]
async fn only_the_operator_may_update_purge_or_delete_the_log() {
    let users = Users::new();
    let nats = users.server().await;
    let gateway = users.bus(&nats, "gateway").await;
    // The gateway publishes what it owns and reads the log.
    let request = fixtures::stop_request();
    gateway.publish(&request, Expect::Any).await.unwrap();
    let read = first_event(&gateway).await;
    assert_eq!(read.envelope.id, request.id);
    assert_eq!(
        gateway
            .subject_last_sequence(&request.data.aggregate_subject())
            .await
            .unwrap(),
        read.sequence
    );

    let (client, mut refusals) = users.client(&nats, "gateway").await;
    let mut js = jetstream::new(client);
    js.set_timeout(REFUSED_ACK_TIMEOUT);
    let mut config = gateway.events_stream_config().await.unwrap();
    config.max_bytes *= 2;
    assert!(js.update_stream(config.clone()).await.is_err());
    refusals
        .expect(&format!("$JS.API.STREAM.UPDATE.{}", subject::EVENTS_STREAM))
        .await;
    assert!(js.delete_stream(subject::EVENTS_STREAM).await.is_err());
    refusals
        .expect(&format!("$JS.API.STREAM.DELETE.{}", subject::EVENTS_STREAM))
        .await;
    let telemetry = js.get_stream(subject::TELEMETRY_STREAM).await.unwrap();
    assert!(telemetry.purge().await.is_err());
    refusals
        .expect(&format!(
            "$JS.API.STREAM.PURGE.{}",
            subject::TELEMETRY_STREAM
        ))
        .await;
    assert_eq!(gateway.last_sequence().await.unwrap(), read.sequence);

    // The same update as the operator goes through: the refusal above was
    // the user's, not the request's.
    let (operator, _) = users.client(&nats, auth::OPERATOR_USER).await;
    let updated = jetstream::new(operator)
        .update_stream(config.clone())
        .await
        .expect("the operator updates the log");
    assert_eq!(updated.config.max_bytes, config.max_bytes);
}

#[tokio::test]
async fn the_auditor_reads_the_log_and_writes_nothing() {
    let users = Users::new();
    let nats = users.server().await;
    let pricing = users.bus(&nats, "pricing").await;
    let charge_free = fixtures::stop_request();
    // Pricing does not own a stop request.
    let (pricing_client, mut refusals) = users.client(&nats, "pricing").await;
    assert!(!stored(&pricing_client, &charge_free).await);
    refusals.expect(&charge_free.subject()).await;
    drop(pricing);

    let gateway = users.bus(&nats, "gateway").await;
    gateway.publish(&charge_free, Expect::Any).await.unwrap();
    let auditor = users.bus(&nats, auth::AUDITOR_USER).await;
    let read = first_event(&auditor).await;
    assert_eq!(read.envelope.id, charge_free.id);
    let (client, mut refusals) = users.client(&nats, auth::AUDITOR_USER).await;
    let again = fixtures::by_owner(charge_free.data.clone());
    assert!(!stored(&client, &again).await, "the auditor wrote an event");
    refusals.expect(&again.subject()).await;
}

/// A throwaway CA and a server certificate for 127.0.0.1 it signed.
fn certificates(dir: &std::path::Path) -> std::path::PathBuf {
    let run = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(status.success(), "openssl {args:?}");
    };
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=lh-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    ]);
    dir.to_path_buf()
}

#[tokio::test]
async fn with_a_certificate_clients_need_tls_and_the_ca() {
    let users = Users::new();
    let certs = tempfile::tempdir().unwrap();
    let dir = certificates(certs.path());
    let tls = format!(
        "include \"users.conf\"\ntls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}",
        dir.join("server.pem").display(),
        dir.join("server.key").display()
    );
    let nats = Nats::start_secured(users.files(), tls).await.unwrap();

    let mut config = BusConfig::new(nats.url(), "audit");
    config.credentials = users.credentials("audit");
    config.tls = TlsFiles::from_env(|name| match name {
        lh_bus::ENV_NATS_CA_FILE => Some(dir.join("ca.pem").display().to_string()),
        _ => None,
    })
    .unwrap();
    let bus = tokio::time::timeout(Duration::from_secs(20), Bus::connect(&config))
        .await
        .expect("connects within 20 s")
        .expect("a client with the CA connects over TLS");
    assert!(bus.is_connected());

    // Without the CA the server's certificate is not trusted.
    let untrusting = async_nats::ConnectOptions::new()
        .nkey(users.seed("audit"))
        .connection_timeout(Duration::from_secs(5))
        .connect(nats.url())
        .await;
    assert!(
        untrusting.is_err(),
        "a client that does not trust the CA connected"
    );
    // And a client that speaks plain NATS gets no answer but an error.
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", nats.port()))
        .await
        .unwrap();
    let mut plain = tokio::io::BufReader::new(stream);
    let mut info = String::new();
    plain.read_line(&mut info).await.unwrap();
    assert!(info.contains("\"tls_required\":true"), "{info}");
    plain
        .get_mut()
        .write_all(b"CONNECT {\"verbose\":false}\r\nPING\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_line(&mut answer)).await;
    assert!(
        !answer.starts_with("PONG"),
        "a plain client was answered: {answer}"
    );
}

#[test]
fn secrets_on_the_command_line_are_refused_and_files_are_read() {
    let no_env = |_: &str| None;
    let seed = nkeys::KeyPair::new_user().seed().unwrap();
    for argv in [
        vec!["lh-scheduler".to_string(), format!("--nats-seed={seed}")],
        vec![
            "lh-scheduler".to_string(),
            "--nats-password".into(),
            "x".into(),
        ],
        vec!["lh-scheduler".to_string(), seed.clone()],
    ] {
        let refused = Credentials::from_env(argv.clone(), no_env).unwrap_err();
        assert!(refused.to_string().contains("command line"), "{argv:?}");
        assert!(
            !refused.to_string().contains(&seed),
            "the error repeats the seed"
        );
    }
    assert!(matches!(
        Credentials::from_env(vec!["lh-scheduler".into()], no_env).unwrap(),
        Credentials::Anonymous
    ));

    let dir = tempfile::tempdir().unwrap();
    let seed_file = dir.path().join("scheduler.nk");
    std::fs::write(&seed_file, format!("{seed}\n")).unwrap();
    let env = |name: &str| match name {
        lh_bus::ENV_NATS_USER => Some("scheduler".to_string()),
        lh_bus::ENV_NATS_NKEY_SEED_FILE => Some(seed_file.display().to_string()),
        _ => None,
    };
    let credentials = Credentials::from_env(vec!["lh-scheduler".into()], env).unwrap();
    assert_eq!(credentials.user(), Some("scheduler"));
    assert!(
        !format!("{credentials:?}").contains(&seed),
        "Debug shows the seed"
    );

    let without_user = |name: &str| match name {
        lh_bus::ENV_NATS_NKEY_SEED_FILE => Some(seed_file.display().to_string()),
        _ => None,
    };
    assert!(Credentials::from_env(Vec::<String>::new(), without_user).is_err());
    std::fs::write(&seed_file, "not a seed").unwrap();
    assert!(Credentials::from_env(Vec::<String>::new(), env).is_err());
}

#[test]
fn the_deploy_config_is_a_valid_server_config() {
    let users = Users::new();
    let dir = tempfile::tempdir().unwrap();
    for (name, contents) in users.files() {
        std::fs::write(dir.path().join(name), contents).unwrap();
    }
    let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/nats/nats.conf");
    std::fs::copy(deploy, dir.path().join("nats.conf")).unwrap();
    let output = std::process::Command::new(lh_testkit::nats_server_binary().unwrap())
        .args(["-t", "-c"])
        .arg(dir.path().join("nats.conf"))
        .env("NATS_SERVER_NAME", "lh-nats-0")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn services_and_node_agents_keep_their_own_snapshots() {
    let users = Users::new();
    let nats = users.server().await;
    let scheduler = users.bus(&nats, "scheduler").await;
    scheduler
        .put_snapshot("lh-scheduler", b"folded state")
        .await
        .expect("a service stores its snapshot");
    // Replacing it purges the old chunks: allowed on the snapshot bucket.
    scheduler
        .put_snapshot("lh-scheduler", b"newer state")
        .await
        .expect("a service replaces its snapshot");
    assert_eq!(
        scheduler.get_snapshot("lh-scheduler").await.unwrap(),
        Some(b"newer state".to_vec())
    );

    let agent = users.bus(&nats, &auth::node_user("n1")).await;
    agent
        .put_snapshot("node-agent-n1", b"n1 state")
        .await
        .expect("a node agent stores its own snapshot");
    assert_eq!(
        agent.get_snapshot("node-agent-n1").await.unwrap(),
        Some(b"n1 state".to_vec())
    );
    // The same key is another object in another bucket: a node's writes
    // never reach a service's state.
    agent
        .put_snapshot("lh-scheduler", b"forged")
        .await
        .expect("a node writes in its own bucket");
    assert_eq!(
        scheduler.get_snapshot("lh-scheduler").await.unwrap(),
        Some(b"newer state".to_vec())
    );
    // Another service neither reads nor writes the scheduler's bucket, nor
    // purges it, with a plain client of its own credentials.
    let (pricing, _) = users.client(&nats, "pricing").await;
    let js = jetstream::new(pricing);
    // The server answers a refused request with silence: 3 s is plenty.
    let foreign = tokio::time::timeout(
        Duration::from_secs(3),
        js.get_object_store("lh-snapshots-scheduler"),
    )
    .await;
    assert!(
        !matches!(foreign, Ok(Ok(_))),
        "pricing opened the scheduler's snapshots"
    );
    let purge = tokio::time::timeout(
        Duration::from_secs(3),
        js.get_stream("OBJ_lh-snapshots-scheduler"),
    )
    .await;
    assert!(
        !matches!(purge, Ok(Ok(_))),
        "pricing reached the scheduler's snapshot stream"
    );
    assert_eq!(
        scheduler.get_snapshot("lh-scheduler").await.unwrap(),
        Some(b"newer state".to_vec())
    );
}

#[tokio::test]
async fn a_snapshot_signed_by_another_key_or_none_is_not_restored() {
    let users = Users::new();
    let nats = users.server().await;
    let scheduler = users.bus(&nats, "scheduler").await;
    scheduler
        .put_snapshot("lh-scheduler", b"folded state")
        .await
        .unwrap();
    // Bytes put straight into the bucket by the operator (who may manage
    // every stream), unsigned or signed by another key, are replayed past.
    let (operator, _) = users.client(&nats, auth::OPERATOR_USER).await;
    let store = jetstream::new(operator)
        .get_object_store("lh-snapshots-scheduler")
        .await
        .unwrap();
    let other = nkeys::KeyPair::new_user();
    let signature = hex::encode(other.sign(b"forged state").unwrap());
    for forged in [
        "lh-snapshot-v1 unsigned\nforged state".to_string(),
        format!("lh-snapshot-v1 ed25519 {signature}\nforged state"),
        "forged state".to_string(),
    ] {
        store
            .put("lh-scheduler", &mut forged.as_bytes())
            .await
            .unwrap();
        assert_eq!(
            scheduler.get_snapshot("lh-scheduler").await.unwrap(),
            None,
            "{forged}"
        );
    }
}

/// One credential's client cannot hold the server's memory: past
/// `max_subscriptions` a subscription is refused, and a payload over
/// `max_payload` is refused before it is sent.
#[tokio::test]
async fn a_connection_is_held_to_its_subscriptions_and_payload() {
    let users = Users::new();
    let nats = users.server().await;
    let node = auth::node_user("n1");
    let (client, mut refusals) = users.client(&nats, &node).await;
    let inbox = format!("{}.flood", auth::inbox_prefix(&node));
    let mut held = Vec::new();
    for i in 0..lh_testkit::MAX_SUBSCRIPTIONS_PER_CONNECTION + 8 {
        held.push(
            client
                .subscribe(format!("{inbox}.{i}"))
                .await
                .expect("the client sends the subscription"),
        );
    }
    client.flush().await.unwrap();
    let deadline = tokio::time::Instant::now() + REFUSAL_NOTICE_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, refusals.0.recv()).await {
            Ok(Some(error)) if error.to_lowercase().contains("maximum subscriptions") => break,
            Ok(Some(_)) => continue,
            _ => panic!("the server took more than max_subscriptions"),
        }
    }
    let oversized = vec![b' '; 2 * 1024 * 1024];
    let (other, _) = users.client(&nats, &node).await;
    assert!(
        other
            .publish(subject::heartbeat("n1"), oversized.into())
            .await
            .is_err(),
        "the client refuses a payload over max_payload"
    );
    // The server itself, to a client that sends it anyway.
    let answer = raw_publish(
        &nats,
        &users.seed(&node),
        &subject::heartbeat("n1"),
        2 * 1024 * 1024,
    )
    .await;
    assert!(
        answer.to_lowercase().contains("maximum payload"),
        "the server took a 2 MiB payload: {answer:?}"
    );
    let answer = raw_publish(&nats, &users.seed(&node), &subject::heartbeat("n1"), 1024).await;
    assert!(answer.starts_with("PONG"), "a small payload: {answer:?}");
}

/// Connects as the nkey `seed` over plain TCP, as a client that ignores
/// the server's `max_payload` would, publishes `bytes` bytes on `subject`
/// and pings; what the server answers first.
async fn raw_publish(nats: &Nats, seed: &str, subject: &str, bytes: usize) -> String {
    use base64::Engine;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let address = nats.url().trim_start_matches("nats://").to_string();
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let info = lines.next_line().await.unwrap().unwrap();
    let info: serde_json::Value =
        serde_json::from_str(info.strip_prefix("INFO ").expect("INFO first")).unwrap();
    let nonce = info["nonce"].as_str().expect("the server sends a nonce");
    let key = nkeys::KeyPair::from_seed(seed).unwrap();
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(key.sign(nonce.as_bytes()).unwrap());
    let connect = serde_json::json!({
        "verbose": false, "pedantic": false, "protocol": 1,
        "nkey": key.public_key(), "sig": signature,
    });
    write
        .write_all(format!("CONNECT {connect}\r\nPING\r\n").as_bytes())
        .await
        .unwrap();
    // The server may tell more of itself (INFO) between its answers.
    let mut answer = async || loop {
        match tokio::time::timeout(REFUSAL_NOTICE_TIMEOUT, lines.next_line()).await {
            Ok(Ok(Some(line))) if line.starts_with("INFO") => continue,
            Ok(Ok(Some(line))) => return line,
            _ => return String::new(),
        }
    };
    assert_eq!(answer().await, "PONG", "connected");
    let mut message = format!("PUB {subject} {bytes}\r\n").into_bytes();
    message.extend(std::iter::repeat_n(b'x', bytes));
    message.extend(b"\r\nPING\r\n");
    // The server may close the connection before it has read it all.
    let _ = write.write_all(&message).await;
    answer().await
}

fn relayed_to(node: &str, lease: Uuid) -> Envelope {
    let placed = Envelope::new(
        Actor::Service("lh-scheduler".into()),
        Utc::now(),
        EventData::LeasePlaced(fixtures::placed(
            lease,
            node,
            "z",
            fixtures::MODEL,
            40,
            &[0],
        )),
    );
    Envelope::new(
        Actor::Service("lh-scheduler".into()),
        Utc::now(),
        EventData::NodeViewRelayed(lh_events::NodeViewRelayed {
            node_id: node.into(),
            events: vec![lh_events::StatedEvent {
                sequence: 1,
                stored_at: Utc::now(),
                envelope: Box::new(placed),
            }],
            idle_policies: Vec::new(),
        }),
    )
}

/// A node reads the log only in its own view, the mirror the scheduler
/// keeps of the relays to it: every read there works and shows nothing
/// but its relays; no consumer of the log itself, no message of it, and
/// nothing of another node's view is given it.
#[tokio::test]
async fn a_node_reads_only_its_own_view_of_the_log() {
    let users = Users::new();
    let nats = users.server().await;
    let scheduler = users.bus(&nats, "scheduler").await;
    for node in ["n1", "n2"] {
        scheduler.ensure_node_view_stream(node).await.unwrap();
    }
    let to_n2 = relayed_to("n2", Uuid::now_v7());
    scheduler.publish(&to_n2, Expect::Any).await.unwrap();
    let to_n1 = relayed_to("n1", Uuid::now_v7());
    let n1_sequence = scheduler
        .publish(&to_n1, Expect::Any)
        .await
        .unwrap()
        .sequence;
    scheduler.publish(&to_n2, Expect::Any).await.unwrap();

    // What the node agent connects with reads its view, at the log's
    // sequences, and finds its head.
    let agent = users
        .bus(&nats, &auth::node_user("n1"))
        .await
        .reading_view_of("n1");
    let view = subject::guarded(&subject::node_view("n1"));
    let mut feed = agent.feed(&[&view], 1).await.expect("n1 reads its view");
    let read = feed
        .next_within(Duration::from_secs(5))
        .await
        .expect("n1's relay is read")
        .unwrap();
    assert_eq!(read.sequence, n1_sequence);
    assert_eq!(read.envelope.id, to_n1.id);
    assert_eq!(
        agent.last_sequence_matching(&[&view]).await.unwrap(),
        n1_sequence
    );
    let empty = subject::guarded(&subject::node_view("n1")).replace(".>", ".registered.>");
    assert_eq!(agent.last_sequence_matching(&[&empty]).await.unwrap(), 0);
    // Asked for the whole log, it gets the whole of its view: its relay.
    let mut everything = agent.feed(&[subject::EVENTS_ALL], 1).await.unwrap();
    let first = everything
        .next_within(Duration::from_secs(5))
        .await
        .expect("its relay")
        .unwrap();
    assert_eq!(first.envelope.id, to_n1.id);
    assert!(
        everything
            .next_within(Duration::from_secs(1))
            .await
            .is_none(),
        "n1 read past its own view"
    );

    // The log itself, through a bus that reads it: nothing.
    let reader = users.bus(&nats, &auth::node_user("n1")).await;
    for wider in [subject::EVENTS_ALL, subject::LEASES_ALL, view.as_str()] {
        let feed = tokio::time::timeout(Duration::from_secs(4), reader.feed(&[wider], 1)).await;
        assert!(
            !matches!(feed, Ok(Ok(_))),
            "n1 opened a feed of the log's {wider}"
        );
    }

    // And through a plain client, each door is seen shut.
    let (n1, mut refusals) = users.client(&nats, &auth::node_user("n1")).await;
    let create = |filter: &str| {
        serde_json::json!({
            "stream_name": subject::EVENTS_STREAM,
            "config": {
                "name": "peek",
                "filter_subject": filter,
                "deliver_policy": "all",
                "ack_policy": "none",
            },
        })
        .to_string()
    };
    let n2_view = subject::node_view_stream("n2");
    let refused = [
        (
            "$JS.API.CONSUMER.CREATE.LH_EVENTS".to_string(),
            create(subject::EVENTS_ALL),
        ),
        (
            "$JS.API.CONSUMER.CREATE.LH_EVENTS.peek".to_string(),
            create(subject::EVENTS_ALL),
        ),
        (
            "$JS.API.CONSUMER.CREATE.LH_EVENTS.peek.lh.evt.node_view.n1.>".to_string(),
            create("lh.evt.node_view.n1.>"),
        ),
        (
            format!("$JS.API.CONSUMER.CREATE.{n2_view}.peek"),
            create(subject::EVENTS_ALL),
        ),
        (
            "$JS.API.STREAM.MSG.GET.LH_EVENTS".to_string(),
            serde_json::json!({"last_by_subj": "lh.evt.lease.>"}).to_string(),
        ),
        (
            "$JS.API.DIRECT.GET.LH_EVENTS".to_string(),
            serde_json::json!({"last_by_subj": "lh.evt.lease.>"}).to_string(),
        ),
        (
            format!("$JS.API.DIRECT.GET.LH_EVENTS.{}", subject::LEASES_ALL),
            String::new(),
        ),
        (
            format!("$JS.API.STREAM.MSG.GET.{n2_view}"),
            serde_json::json!({"seq": 1}).to_string(),
        ),
        (
            format!("$JS.API.STREAM.CREATE.{}", subject::node_view_stream("n1")),
            String::new(),
        ),
    ];
    let inbox = format!("{}.peek", auth::inbox_prefix(&auth::node_user("n1")));
    for (api, body) in refused {
        // Asked of its own account's JetStream, or of the log's as its
        // account imports it: the same.
        let imported = api.replacen("$JS.API.", &format!("{}.", auth::NODE_LOG_API_PREFIX), 1);
        for api in [api, imported] {
            // A refused request is dropped, never answered: the server's
            // word on it is what tells.
            n1.publish_with_reply(api.clone(), inbox.clone(), body.clone().into())
                .await
                .unwrap();
            n1.flush().await.unwrap();
            refusals.expect(&api).await;
        }
    }
}

/// A client as `user` made without waiting: what the server said, when it
/// refused it.
async fn try_connect(nats: &Nats, users: &Users, user: &str) -> Result<async_nats::Client, String> {
    tokio::time::timeout(
        Duration::from_secs(10),
        async_nats::ConnectOptions::new()
            .nkey(users.seed(user))
            .custom_inbox_prefix(auth::inbox_prefix(user))
            .max_reconnects(Some(1))
            .connect(nats.url()),
    )
    .await
    .map_err(|_| "no answer within 10 s".to_string())?
    .map_err(|e| e.to_string())
}

/// One node's credential holds at most its account's connections, its
/// own account's streams, consumers and disk, and consumers of the log
/// that go when left unread; a node at its cap keeps neither a service
/// nor another node from connecting.
#[tokio::test]
async fn a_node_credential_is_capped_in_connections_consumers_and_disk() {
    const NODE_ID: &str = "n1";
    let users = Users::new();
    let nats = users.server().await;
    let scheduler = users.bus(&nats, "scheduler").await;
    scheduler
        .publish(&relayed_to(NODE_ID, Uuid::now_v7()), Expect::Any)
        .await
        .unwrap();
    let node = auth::node_user(NODE_ID);
    let (n1, _) = users.client(&nats, &node).await;

    // Its own account: a bucket over the account's disk is refused, its
    // own is made; consumers past the account's cap are refused.
    let own = jetstream::new(n1.clone());
    let bucket = lh_bus::snapshots_bucket(&node);
    let stream = format!("OBJ_{bucket}");
    let oversized = own
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("$O.{bucket}.>")],
            max_bytes: 4 * auth::NODE_MAX_FILE_BYTES,
            ..Default::default()
        })
        .await;
    assert!(
        oversized.is_err(),
        "a node made a bucket of {} bytes",
        4 * auth::NODE_MAX_FILE_BYTES
    );
    let agent = users.bus(&nats, &node).await.reading_view_of(NODE_ID);
    agent.put_snapshot("state", b"folded").await.unwrap();
    let snapshots = own.get_stream(&stream).await.unwrap();
    let mut made = 0;
    let refusal = loop {
        let consumer = snapshots
            .create_consumer(jetstream::consumer::pull::Config {
                name: Some(format!("held-{made}")),
                inactive_threshold: Duration::from_secs(600),
                ..Default::default()
            })
            .await;
        match consumer {
            Ok(_) => made += 1,
            Err(e) => break e.to_string(),
        }
        assert!(made <= auth::NODE_MAX_CONSUMERS, "no cap on consumers");
    };
    assert_eq!(made, auth::NODE_MAX_CONSUMERS, "refused: {refusal}");
    assert!(refusal.contains("maximum consumers"), "{refusal}");

    // Its view: consumers past the mirror's cap are refused, one that
    // would outlive the streams' idle limit too; the services go on
    // making theirs on the log.
    scheduler.ensure_node_view_stream(NODE_ID).await.unwrap();
    let log = jetstream::with_prefix(n1.clone(), auth::NODE_LOG_API_PREFIX);
    let view = log
        .get_stream(subject::node_view_stream(NODE_ID))
        .await
        .unwrap();
    let lingering = view
        .create_consumer(jetstream::consumer::pull::Config {
            name: Some("lingering".into()),
            inactive_threshold: Duration::from_secs(24 * 3600),
            ..Default::default()
        })
        .await;
    assert!(lingering.is_err(), "a consumer idle for a day was made");
    let mut made = 0;
    let refusal = loop {
        let consumer = view
            .create_consumer(jetstream::consumer::pull::Config {
                name: Some(format!("view-{made}")),
                inactive_threshold: Duration::from_secs(60),
                ..Default::default()
            })
            .await;
        match consumer {
            Ok(_) => made += 1,
            Err(e) => break e.to_string(),
        }
        assert!(
            made <= lh_bus::NODE_VIEW_MAX_CONSUMERS,
            "no cap on the view's consumers"
        );
    };
    assert_eq!(made, lh_bus::NODE_VIEW_MAX_CONSUMERS, "refused: {refusal}");
    assert!(refusal.contains("maximum consumers"), "{refusal}");
    let mut feed = scheduler.feed(&[subject::EVENTS_ALL], 1).await.unwrap();
    assert!(
        feed.next_within(Duration::from_secs(5)).await.is_some(),
        "the scheduler reads the log while a node is at its cap"
    );

    // Connections: the client and the agent's bus are two; the account
    // takes the rest up to its cap and refuses the next.
    let mut held = Vec::new();
    let refusal = loop {
        match try_connect(&nats, &users, &node).await {
            Ok(client) => held.push(client),
            Err(e) => break e,
        }
        assert!(
            held.len() as u32 <= auth::NODE_MAX_CONNECTIONS,
            "no cap on connections"
        );
    };
    assert_eq!(
        held.len() as u32 + 2,
        auth::NODE_MAX_CONNECTIONS,
        "refused: {refusal}"
    );
    assert!(
        refusal
            .to_lowercase()
            .contains("maximum account active connections"),
        "{refusal}"
    );
    // Nobody else is kept out.
    try_connect(&nats, &users, "scheduler")
        .await
        .expect("a service connects while a node is at its cap");
    try_connect(&nats, &users, &auth::node_user("n2"))
        .await
        .expect("another node connects while n1 is at its cap");
    // A connection closed makes room again.
    drop(held.pop());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match try_connect(&nats, &users, &node).await {
            Ok(client) => {
                held.push(client);
                break;
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "not yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("a closed connection's room was not given back: {e}"),
        }
    }
}

/// A node added to a running server, its account written and the server
/// reloaded as scripts/nats-node-creds.sh does it, reads its view,
/// publishes its events and answers reads of its lease logs; a node from
/// before goes on as it was.
#[tokio::test]
async fn a_node_added_to_a_running_server_works_after_its_reload() {
    let mut users = Users::new();
    let mut nats = users.server().await;
    let scheduler = users.bus(&nats, "scheduler").await;
    let before = users.bus(&nats, &auth::node_user("n1")).await;
    users.add_node("n3");
    // nats-server (2.15) wires a new account's imports on the reload after
    // the one that made the account: the script reloads twice.
    for _ in 0..2 {
        nats.reload_secured(users.files()).await.unwrap();
    }

    scheduler.ensure_node_view_stream("n3").await.unwrap();
    let to_n3 = relayed_to("n3", Uuid::now_v7());
    let relayed = scheduler
        .publish(&to_n3, Expect::Any)
        .await
        .unwrap()
        .sequence;
    let agent = users
        .bus(&nats, &auth::node_user("n3"))
        .await
        .reading_view_of("n3");
    let view = subject::guarded(&subject::node_view("n3"));
    let mut feed = agent.feed(&[&view], 1).await.expect("n3 reads its view");
    let read = feed
        .next_within(Duration::from_secs(5))
        .await
        .expect("n3's relay is read")
        .unwrap();
    assert_eq!(read.sequence, relayed);
    agent
        .publish(&started_by("n3", Uuid::now_v7()), Expect::Any)
        .await
        .expect("n3 reports a lease started on it");
    agent.put_snapshot("state", b"n3").await.unwrap();
    assert_eq!(
        agent.get_snapshot("state").await.unwrap().as_deref(),
        Some(&b"n3"[..])
    );
    let (n3, _) = users.client(&nats, &auth::node_user("n3")).await;
    let mut asked = n3.subscribe(subject::rpc_lease_logs("n3")).await.unwrap();
    n3.flush().await.unwrap();
    let answering = tokio::spawn(async move {
        use futures::StreamExt as _;
        let request = asked.next().await.expect("the gateway's read arrives");
        n3.publish(request.reply.expect("a reply subject"), "the log".into())
            .await
            .unwrap();
        n3.flush().await.unwrap();
    });
    let (gateway, _) = users.client(&nats, "gateway").await;
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        gateway.request(subject::rpc_lease_logs("n3"), "".into()),
    )
    .await
    .expect("n3 answers within 5 s")
    .expect("n3 answers");
    assert_eq!(&answer.payload[..], b"the log");
    answering.await.unwrap();

    before
        .publish(&started_by("n1", Uuid::now_v7()), Expect::Any)
        .await
        .expect("n1 goes on publishing across the reloads");
}
