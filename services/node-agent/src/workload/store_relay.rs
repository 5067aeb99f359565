//! A container's own way to its tenant's bucket (docs/adr/032).
//!
//! A container has no network out (none, or its tenant's internal bridge),
//! so it cannot reach the store. A lease that asks for `object_store` gets
//! a relay instead: a listener the agent opens on `127.0.0.1:`
//! [`PORT_IN_CONTAINER`] inside the container's own network namespace, whose
//! connections the agent carries to the store's endpoint, from the host,
//! byte for byte (over TLS where the endpoint is `https`). Nothing else is
//! reachable through it, and no other container sees it: the socket lives
//! in this container's namespace. The container signs its requests itself
//! with its tenant's identity ([`store_env`]), whose policy names the
//! tenant's bucket alone, so the store, not the relay, keeps tenants apart.
//!
//! The listener has to be there before the workload's first instruction,
//! which may well be a download. So such a container is not `run` but made
//! in steps by a small launcher, the process the agent supervises in place
//! of `<cli> run`: `create`, then `init` (its namespaces exist, its process
//! waits), then a line from the agent on the launcher's standard input, and
//! only then `start --attach`, whose exit is the container's. The agent
//! opens the listener between `init` and its answer ([`open`]); if it
//! cannot, its answer is the reason, which the launcher writes to the
//! lease's log before it exits 125.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use lh_rpc::workload_env::StorageGrant;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::ChildStdin;

use super::engine::Engine;

/// Where a container finds the store: `http://127.0.0.1:8333`.
pub const PORT_IN_CONTAINER: u16 = 8333;
/// Most connections one container holds to the store at once; more wait
/// in the listener's backlog.
pub const MOST_CONNECTIONS: usize = 64;
/// How long the relay may take to reach the store for one connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes each direction of a relayed connection reads at a time: at the
/// default 8 KiB a download through the relay ran at about 0.6 of a direct
/// one on this machine.
const COPY_BUFFER_BYTES: usize = 256 * 1024;
/// How often a container being made is looked at until its namespaces
/// exist.
const INIT_POLL: Duration = Duration::from_millis(50);
/// The launcher's go-ahead.
const GO: &str = "start";
/// Longest reason the launcher is given, in bytes.
const MOST_REASON_BYTES: usize = 512;

/// The variables a container with `object_store` gets: what the AWS SDKs
/// and CLI read (`AWS_ENDPOINT_URL` since 2023), and the bucket's name.
pub fn store_env(grant: &StorageGrant) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("AWS_ACCESS_KEY_ID".into(), grant.access_key_id.clone()),
        (
            "AWS_SECRET_ACCESS_KEY".into(),
            grant.secret_access_key.clone(),
        ),
        ("AWS_REGION".into(), grant.region.clone()),
        ("AWS_DEFAULT_REGION".into(), grant.region.clone()),
        (
            "AWS_ENDPOINT_URL".into(),
            format!("http://127.0.0.1:{PORT_IN_CONTAINER}"),
        ),
        // No instance metadata to look for: the SDKs' default chain
        // would try 169.254.169.254 first, which answers nothing here.
        ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
        ("LH_BUCKET".into(), grant.bucket.clone()),
    ])
}

/// Where the relay carries a container's connections.
#[derive(Clone)]
pub struct Target {
    host: String,
    port: u16,
    tls: Option<(
        rustls_pki_types::ServerName<'static>,
        Arc<rustls::ClientConfig>,
    )>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Target {
    /// The store's endpoint from the gateway's grant: `http://host[:port]`
    /// (80) or `https://host[:port]` (443, verified against the web's
    /// public roots). A path, a user or a query is refused.
    pub fn of(grant: &StorageGrant) -> Result<Target, String> {
        Self::with_roots(grant, || {
            rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned())
        })
    }

    /// [`Target::of`] trusting `roots` for an `https` endpoint.
    pub fn with_roots(
        grant: &StorageGrant,
        roots: impl FnOnce() -> rustls::RootCertStore,
    ) -> Result<Target, String> {
        let endpoint = grant.endpoint.trim_end_matches('/');
        let bad = |why: &str| format!("the store's endpoint {endpoint:?} {why}");
        let (tls, rest) = if let Some(rest) = endpoint.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = endpoint.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(bad("is neither http:// nor https://"));
        };
        if rest.is_empty()
            || rest.contains(['/', '@', '?', '#'])
            || rest.contains(char::is_whitespace)
        {
            return Err(bad("must be a scheme, a host and a port only"));
        }
        let default_port = if tls { 443 } else { 80 };
        // `[v6]:port`, `[v6]`, `host:port`, `host`.
        let (host, port) = match rest.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or_else(|| bad("has no ']'"))?;
                match after.strip_prefix(':') {
                    Some(port) => (host, port.parse().map_err(|_| bad("has a bad port"))?),
                    None if after.is_empty() => (host, default_port),
                    None => return Err(bad("has something after ']'")),
                }
            }
            None => match rest.rsplit_once(':') {
                Some((host, port)) => (host, port.parse().map_err(|_| bad("has a bad port"))?),
                None => (rest, default_port),
            },
        };
        if host.is_empty() || port == 0 {
            return Err(bad("has no host or port"));
        }
        let tls = match tls {
            false => None,
            true => {
                let name = rustls_pki_types::ServerName::try_from(host.to_string())
                    .map_err(|_| bad("names no host TLS can verify"))?;
                let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .map_err(|e| bad(&format!("cannot be reached over TLS: {e}")))?
                .with_root_certificates(roots())
                .with_no_client_auth();
                Some((name, Arc::new(config)))
            }
        };
        Ok(Target {
            host: host.to_string(),
            port,
            tls,
        })
    }

    async fn connect(&self) -> io::Result<Outbound> {
        let connect = TcpStream::connect((self.host.as_str(), self.port));
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the store did not answer"))??;
        tcp.set_nodelay(true)?;
        match &self.tls {
            None => Ok(Outbound::Plain(tcp)),
            Some((name, config)) => {
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                let tls =
                    tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name.clone(), tcp))
                        .await
                        .map_err(|_| {
                            io::Error::new(
                                io::ErrorKind::TimedOut,
                                "the store's TLS did not answer",
                            )
                        })??;
                Ok(Outbound::Tls(Box::new(tls)))
            }
        }
    }
}

enum Outbound {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// The launcher's shell program. `$@` is `create`'s arguments (the
/// tenant's image and command among them, never parsed by the shell); the
/// CLI and its global flags are the operator's, quoted into the text.
pub fn launcher_script(engine: &Engine, name: &str) -> String {
    let cli = std::iter::once(engine.cli.display().to_string())
        .chain(engine.global_args.iter().cloned())
        .map(|word| sh_quote(&word))
        .collect::<Vec<_>>()
        .join(" ");
    let name = sh_quote(name);
    format!(
        "{cli} create \"$@\" >/dev/null || exit $?\n\
         {cli} init {name} >/dev/null || exit $?\n\
         IFS= read -r answer || answer='the node agent gave no answer'\n\
         if [ \"$answer\" != {GO} ]; then\n\
         \x20 printf 'leasehold: the store relay: %s\\n' \"$answer\" >&2\n\
         \x20 exit 125\n\
         fi\n\
         exec {cli} start --attach {name} </dev/null\n"
    )
}

/// `word` in single quotes, for `sh`.
fn sh_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// A container's relay, open while this lives.
pub struct Relay {
    _serving: lh_service::AbortOnDrop<()>,
}

/// [`open`] under way, then the relay it opened: all of it ends when this
/// is dropped, with the container.
pub struct RelayTask(#[allow(dead_code)] lh_service::AbortOnDrop<()>);

impl std::fmt::Debug for RelayTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelayTask")
    }
}

/// Opens the relay of the container `name` in a task of its own, which
/// keeps it open until the [`RelayTask`] is dropped.
pub fn spawn_open(
    engine: Engine,
    name: String,
    deadline: tokio::time::Instant,
    target: Target,
    launcher: ChildStdin,
) -> RelayTask {
    RelayTask(lh_service::AbortOnDrop(tokio::spawn(async move {
        match open(&engine, &name, deadline, target, launcher).await {
            Ok(relay) => {
                tracing::info!(container = %name, port = PORT_IN_CONTAINER, "store relay open");
                std::future::pending::<()>().await;
                drop(relay);
            }
            Err(why) => {
                tracing::warn!(container = %name, why, "no store relay: the container is not started");
            }
        }
    })))
}

/// Opens the relay of the container `name`, which runs already, in a task
/// of its own: what a restarted agent does for a container it adopts (the
/// listener went with the agent that opened it).
pub fn spawn_reopen(engine: Engine, name: String, target: Target) -> RelayTask {
    RelayTask(lh_service::AbortOnDrop(tokio::spawn(async move {
        let opened = async {
            let mut inspect = engine.command();
            inspect
                .args([
                    "container",
                    "inspect",
                    "--format",
                    "{{.State.Status}} {{.State.Pid}}",
                    &name,
                ])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true);
            let output = tokio::time::timeout(CONNECT_TIMEOUT, inspect.output())
                .await
                .map_err(|_| "the engine did not answer".to_string())?
                .map_err(|e| format!("cannot ask the engine: {e}"))?;
            let said = String::from_utf8_lossy(&output.stdout);
            let mut words = said.split_whitespace();
            let pid = match (
                words.next(),
                words.next().and_then(|p| p.parse::<i32>().ok()),
            ) {
                (Some("running"), Some(pid)) if pid > 0 => pid,
                _ => return Err(format!("the container is not running ({})", said.trim())),
            };
            listen_in(pid)
                .await
                .map_err(|e| format!("cannot listen in the container: {e}"))
        };
        match opened.await {
            Ok(listener) => {
                tracing::info!(container = %name, port = PORT_IN_CONTAINER, "store relay open again");
                serve(listener, target).await;
            }
            Err(why) => {
                tracing::warn!(container = %name, why, "no store relay for an adopted container");
            }
        }
    })))
}

/// Waits until the container `name` exists with its namespaces, opens the
/// relay inside it and tells the launcher to start it. Gives up at
/// `deadline`, or once the container cannot come to be; the launcher is then
/// told why (and ends the lease with it) unless it is gone already.
pub async fn open(
    engine: &Engine,
    name: &str,
    deadline: tokio::time::Instant,
    target: Target,
    mut launcher: ChildStdin,
) -> Result<Relay, String> {
    let opened = async {
        let pid = until_initialized(engine, name, deadline).await?;
        let listener = listen_in(pid)
            .await
            .map_err(|e| format!("cannot listen in the container: {e}"))?;
        Ok::<_, String>(Relay {
            _serving: lh_service::AbortOnDrop(tokio::spawn(serve(listener, target))),
        })
    }
    .await;
    let answer = match &opened {
        Ok(_) => GO.to_string(),
        Err(why) => {
            let mut why: String = why
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            let mut end = why.len().min(MOST_REASON_BYTES);
            while !why.is_char_boundary(end) {
                end -= 1;
            }
            why.truncate(end);
            why
        }
    };
    // A launcher gone already has ended the lease its own way.
    let _ = launcher.write_all(format!("{answer}\n").as_bytes()).await;
    let _ = launcher.flush().await;
    opened
}

/// The pid of the container's first process once the engine has made its
/// namespaces (`initialized`).
async fn until_initialized(
    engine: &Engine,
    name: &str,
    deadline: tokio::time::Instant,
) -> Result<i32, String> {
    loop {
        let mut inspect = engine.command();
        inspect
            .args([
                "container",
                "inspect",
                "--format",
                "{{.State.Status}} {{.State.Pid}}",
                name,
            ])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let looked = tokio::time::timeout_at(deadline, inspect.output()).await;
        let output = match looked {
            Err(_) => return Err("the container was not made by its start deadline".into()),
            Ok(Err(e)) => return Err(format!("cannot ask the engine: {e}")),
            Ok(Ok(output)) => output,
        };
        let said = String::from_utf8_lossy(&output.stdout);
        let mut words = said.split_whitespace();
        match (
            words.next(),
            words.next().and_then(|p| p.parse::<i32>().ok()),
        ) {
            (Some("initialized"), Some(pid)) if pid > 0 => return Ok(pid),
            // Not made yet (its image still being pulled), or being made.
            (None | Some("configured" | "created" | "initialized"), _) => {}
            (Some(state), _) => {
                return Err(format!("the container is {state} before it started"));
            }
        }
        if tokio::time::Instant::now() + INIT_POLL >= deadline {
            return Err("the container was not made by its start deadline".into());
        }
        tokio::time::sleep(INIT_POLL).await;
    }
}

/// A listener on `127.0.0.1:`[`PORT_IN_CONTAINER`] in `pid`'s network
/// namespace.
async fn listen_in(pid: i32) -> io::Result<TcpListener> {
    let netns: OwnedFd = std::fs::File::open(format!("/proc/{pid}/ns/net"))?.into();
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A thread of its own enters the namespace and ends: the socket keeps
    // the namespace it was made in, and no thread of the agent's pools is
    // left in the container's network.
    std::thread::Builder::new()
        .name("lh-store-relay".into())
        .spawn(move || {
            let _ = tx.send(bind_in(&netns));
        })?;
    let listener = rx
        .await
        .map_err(|_| io::Error::other("the listening thread died"))??;
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

fn bind_in(netns: &OwnedFd) -> io::Result<std::net::TcpListener> {
    // SAFETY: setns on a namespace descriptor we hold, for this thread,
    // which ends after the bind.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    std::net::TcpListener::bind(("127.0.0.1", PORT_IN_CONTAINER))
}

/// Carries each connection to the store, at most [`MOST_CONNECTIONS`] at
/// once, until dropped.
async fn serve(listener: TcpListener, target: Target) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MOST_CONNECTIONS));
    let mut carrying = tokio::task::JoinSet::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let inbound = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = carrying.join_next() => {
                drop(slot);
                continue;
            }
        };
        let mut inbound = match inbound {
            Ok((inbound, _)) => inbound,
            Err(e) => {
                // Out of descriptors, most likely: wait rather than spin.
                tracing::warn!(error = %e, "the store relay cannot accept");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let target = target.clone();
        carrying.spawn(async move {
            let _slot = slot;
            let outbound = match target.connect().await {
                Ok(outbound) => outbound,
                Err(e) => {
                    tracing::warn!(error = %e, host = %target.host, port = target.port,
                        "the store relay cannot reach the store");
                    return;
                }
            };
            let _ = inbound.set_nodelay(true);
            let _ = match outbound {
                Outbound::Plain(mut out) => {
                    tokio::io::copy_bidirectional_with_sizes(
                        &mut inbound,
                        &mut out,
                        COPY_BUFFER_BYTES,
                        COPY_BUFFER_BYTES,
                    )
                    .await
                }
                Outbound::Tls(mut out) => {
                    tokio::io::copy_bidirectional_with_sizes(
                        &mut inbound,
                        &mut *out,
                        COPY_BUFFER_BYTES,
                        COPY_BUFFER_BYTES,
                    )
                    .await
                }
            };
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(endpoint: &str) -> StorageGrant {
        StorageGrant {
            endpoint: endpoint.into(),
            region: "us-east-1".into(),
            bucket: "lh-t-1".into(),
            access_key_id: "AK".into(),
            secret_access_key: "SK".into(),
            allow_http: true,
        }
    }

    #[test]
    fn endpoints_are_a_scheme_a_host_and_a_port() {
        let of = |e: &str| Target::of(&grant(e)).map(|t| (t.host, t.port, t.tls.is_some()));
        assert_eq!(
            of("http://127.0.0.1:8333"),
            Ok(("127.0.0.1".into(), 8333, false))
        );
        assert_eq!(of("http://s3.local/"), Ok(("s3.local".into(), 80, false)));
        assert_eq!(
            of("https://s3.example.com"),
            Ok(("s3.example.com".into(), 443, true))
        );
        assert_eq!(of("http://[::1]:9000"), Ok(("::1".into(), 9000, false)));
        assert_eq!(of("https://[::1]"), Ok(("::1".into(), 443, true)));
        for bad in [
            "ftp://x",
            "http://",
            "http://a/b",
            "http://u@a",
            "http://a:x",
            "http://a:0",
            "http://[::1",
            "http://[::1]x",
            "http://a b",
        ] {
            assert!(of(bad).is_err(), "{bad}");
        }
    }

    /// A store behind TLS: the relay carries the container's bytes over a
    /// connection it verified, and carries nothing to a store whose
    /// certificate it does not trust.
    #[tokio::test]
    async fn the_relay_carries_bytes_to_a_tls_store_it_verifies() {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
        let rcgen::CertifiedKey { cert, key_pair } =
            rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(key_pair.serialize_der().into()),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let store = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = store.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = store.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut tls = BufReader::new(tls);
                    let mut line = String::new();
                    tls.read_line(&mut line).await.unwrap();
                    tls.get_mut()
                        .write_all(format!("store saw {line}").as_bytes())
                        .await
                        .unwrap();
                    tls.get_mut().shutdown().await.unwrap();
                });
            }
        });
        let grant = grant(&format!("https://localhost:{port}"));
        let relay_through = |target: Target| async move {
            let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = relay.local_addr().unwrap();
            let serving = lh_service::AbortOnDrop(tokio::spawn(serve(relay, target)));
            let mut container = TcpStream::connect(addr).await.unwrap();
            container.write_all(b"GET /lh-t-1/x\n").await.unwrap();
            let mut answer = String::new();
            let _ = tokio::time::timeout(
                Duration::from_secs(20),
                container.read_to_string(&mut answer),
            )
            .await
            .expect("the relay closes or answers");
            drop(serving);
            answer
        };
        let trusted = Target::with_roots(&grant, || {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(cert.der().clone()).unwrap();
            roots
        })
        .unwrap();
        assert_eq!(relay_through(trusted).await, "store saw GET /lh-t-1/x\n");
        let public_roots = Target::of(&grant).unwrap();
        assert_eq!(relay_through(public_roots).await, "");
    }

    #[test]
    fn the_store_variables_point_at_the_relay() {
        let env = store_env(&grant("http://10.0.0.1:8333"));
        assert_eq!(env["AWS_ENDPOINT_URL"], "http://127.0.0.1:8333");
        assert_eq!(env["LH_BUCKET"], "lh-t-1");
        assert_eq!(env["AWS_ACCESS_KEY_ID"], "AK");
        assert_eq!(env["AWS_SECRET_ACCESS_KEY"], "SK");
    }

    #[test]
    fn the_launcher_quotes_the_operators_words() {
        let engine = Engine {
            cli: "/usr/bin/pod man".into(),
            flavor: super::super::engine::CliFlavor::Podman,
            global_args: vec!["--root".into(), "/x'y".into()],
        };
        let script = launcher_script(&engine, "lh-lease-1");
        assert!(script.starts_with(r#"'/usr/bin/pod man' '--root' '/x'\''y' create "$@""#));
        assert!(script
            .contains("exec '/usr/bin/pod man' '--root' '/x'\\''y' start --attach 'lh-lease-1'"));
    }

    /// The launcher makes, waits for the answer and starts; a refusal
    /// reaches its standard error and its exit is 125. Run with a stand-in
    /// CLI that records its calls.
    #[tokio::test]
    async fn the_launcher_starts_only_on_the_agents_word() {
        let dir = tempfile::tempdir().unwrap();
        let calls = dir.path().join("calls");
        let cli = dir.path().join("cli");
        std::fs::write(
            &cli,
            format!("#!/bin/sh\necho \"$*\" >> {}\n", calls.display()),
        )
        .unwrap();
        std::fs::set_permissions(&cli, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let engine = Engine {
            cli: cli.clone(),
            flavor: super::super::engine::CliFlavor::Podman,
            global_args: vec!["--g".into()],
        };
        for (answer, code) in [("start\n", 0), ("no netns\n", 125), ("", 125)] {
            let _ = std::fs::remove_file(&calls);
            let mut child = tokio::process::Command::new("/bin/sh")
                .args([
                    "-c",
                    &launcher_script(&engine, "lh-x"),
                    "sh",
                    "--name",
                    "lh-x",
                    "img; rm -rf /",
                ])
                .stdin(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(answer.as_bytes()).await.unwrap();
            drop(stdin);
            let out = child.wait_with_output().await.unwrap();
            assert_eq!(out.status.code(), Some(code), "{answer:?}");
            let calls = std::fs::read_to_string(&calls).unwrap();
            let lines: Vec<&str> = calls.lines().collect();
            assert_eq!(lines[0], "--g create --name lh-x img; rm -rf /");
            assert_eq!(lines[1], "--g init lh-x");
            if code == 0 {
                assert_eq!(lines[2], "--g start --attach lh-x");
            } else {
                assert_eq!(lines.len(), 2);
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(err.contains("leasehold: the store relay: "), "{err}");
            }
        }
    }
}
