//! A JetStream-enabled nats-server in a temporary directory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::OnceCell;

use crate::locate::nats_server_binary;
use crate::process::{
    free_port, log_len, log_since, log_stdio, log_tail, stop_child, Watchdog,
    RESTART_PORT_BUSY_TIMEOUT, START_ATTEMPTS_MAX,
};

/// How long a started server may take to answer with its INFO line.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of one readiness probe (connect, then read INFO).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between readiness probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(25);
/// The default NATS maximum message size, written down explicitly.
const MAX_PAYLOAD_BYTES: u64 = 1024 * 1024;

/// A nats-server child process with JetStream (`sync_interval: always`) on a
/// random 127.0.0.1 port, its store, config and log in a temporary directory
/// that lives as long as this value.
///
/// [`Nats::kill`] and [`Nats::restart`] inject a crash: the restarted server
/// listens on the same port and reads the same store directory, so
/// acknowledged JetStream data survives. Dropping the value kills the server
/// and removes the directory.
pub struct Nats {
    port: u16,
    server_name: String,
    binary: PathBuf,
    child: Option<Child>,
    watchdog: Option<Watchdog>,
    // Declared last: dropped after the server is gone.
    dir: TempDir,
}

impl Nats {
    /// Starts a nats-server and waits until it accepts clients with
    /// JetStream enabled.
    pub async fn start() -> anyhow::Result<Nats> {
        let binary = nats_server_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("lh-nats-")
            .tempdir()
            .context("creating the nats-server temporary directory")?;
        std::fs::create_dir(dir.path().join("store"))
            .context("creating the JetStream store directory")?;
        let mut nats = Nats {
            port: 0,
            server_name: format!("lh-test-{}", uuid::Uuid::new_v4().simple()),
            binary,
            child: None,
            watchdog: None,
            dir,
        };
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS_MAX {
            nats.port = free_port().context("picking a free port")?;
            match nats.spawn_and_wait().await {
                Ok(()) => {
                    tracing::info!(url = %nats.url(), dir = %nats.dir.path().display(), "nats-server started");
                    return Ok(nats);
                }
                Err(StartError::PortTaken(why)) => {
                    tracing::debug!(port = nats.port, %why, "nats-server port taken, retrying on another");
                    last_error = Some(why);
                }
                Err(StartError::Failed(err)) => return Err(err),
            }
        }
        bail!(
            "nats-server did not start after {START_ATTEMPTS_MAX} ports: {}",
            last_error.unwrap_or_default()
        )
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JetStream `store_dir` (the server keeps its data in
    /// `<store_dir>/jetstream`).
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// The server's log (stdout and stderr, appended across restarts).
    pub fn log_file(&self) -> PathBuf {
        self.dir.path().join("nats-server.log")
    }

    /// The generated configuration file.
    pub fn config_file(&self) -> PathBuf {
        self.dir.path().join("nats-server.conf")
    }

    /// Whether the server process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Kills the server with SIGKILL (no graceful shutdown: a crash) and
    /// reaps it. Does nothing when it is not running.
    pub fn kill(&mut self) {
        self.watchdog = None;
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, libc::SIGKILL);
            tracing::info!(url = %self.url(), "nats-server killed");
        }
    }

    /// Starts the server again on the same port with the same store
    /// directory (killing it first if it still runs) and waits until it is
    /// ready. Retries while another process holds the port, up to 15 s.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let deadline = Instant::now() + RESTART_PORT_BUSY_TIMEOUT;
        loop {
            match self.spawn_and_wait().await {
                Ok(()) => {
                    tracing::info!(url = %self.url(), "nats-server restarted");
                    return Ok(());
                }
                Err(StartError::PortTaken(why)) if Instant::now() < deadline => {
                    tracing::debug!(port = self.port, %why, "nats-server port still taken, retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(StartError::PortTaken(why)) => {
                    bail!(
                        "restarting nats-server on port {}: port stayed taken: {why}",
                        self.port
                    )
                }
                Err(StartError::Failed(err)) => return Err(err),
            }
        }
    }

    fn write_config(&self) -> anyhow::Result<()> {
        let config = format!(
            "# Generated by lh-testkit.\n\
             server_name: \"{name}\"\n\
             listen: \"127.0.0.1:{port}\"\n\
             max_payload: {max_payload}\n\
             jetstream {{\n  store_dir: \"{store}\"\n  sync_interval: always\n}}\n",
            name = self.server_name,
            port = self.port,
            max_payload = MAX_PAYLOAD_BYTES,
            store = self.store_dir().display(),
        );
        std::fs::write(self.config_file(), config).context("writing the nats-server config")
    }

    async fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        self.write_config().map_err(StartError::Failed)?;
        let log = self.log_file();
        let log_offset = log_len(&log);
        let (stdout, stderr) = log_stdio(&log)
            .context("opening the nats-server log")
            .map_err(StartError::Failed)?;
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(self.config_file())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("spawning {}", self.binary.display()))
            .map_err(StartError::Failed)?;
        let watchdog = Watchdog::spawn(child.id(), "KILL", self.dir.path())
            .context("spawning the nats-server watchdog")
            .map_err(StartError::Failed);
        self.child = Some(child);
        self.watchdog = Some(match watchdog {
            Ok(watchdog) => watchdog,
            Err(err) => {
                self.kill();
                return Err(err);
            }
        });

        let result = self.wait_ready().await;
        if let Err(err) = result {
            self.kill();
            let output = log_since(&log, log_offset);
            return Err(
                if output.contains("address already in use") || matches!(err, Probe::OtherServer(_))
                {
                    StartError::PortTaken(format!("{err}"))
                } else {
                    StartError::Failed(anyhow!(
                        "nats-server did not become ready: {err}\n--- log ---\n{}",
                        log_tail(&log)
                    ))
                },
            );
        }
        Ok(())
    }

    /// Polls the port until *our* server (matched by its unique name) sends
    /// an INFO line that says JetStream is enabled. nats-server enables
    /// JetStream, recovering its streams from the store, before it starts
    /// accepting clients, so that INFO line means the server is ready.
    async fn wait_ready(&mut self) -> Result<(), Probe> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(Probe::Exited(status.to_string()));
                }
            }
            let probe = tokio::time::timeout(PROBE_TIMEOUT, read_info(self.port)).await;
            if let Ok(Ok(info)) = probe {
                let name = info
                    .get("server_name")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default();
                if name != self.server_name {
                    return Err(Probe::OtherServer(name.to_string()));
                }
                if info.get("jetstream").and_then(|v| v.as_bool()) == Some(true) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(Probe::Timeout);
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for Nats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nats")
            .field("url", &self.url())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

/// One nats-server per test binary, started on first use. For tests that
/// only publish and consume; a test that kills or restarts the server must
/// own a [`Nats`]. Give each test its own stream names or subject prefix.
///
/// Panics when the server cannot be started (the message says why, e.g. to
/// run `make deps`).
pub async fn shared_nats() -> &'static Nats {
    static SHARED: OnceCell<Nats> = OnceCell::const_new();
    SHARED
        .get_or_init(|| async {
            match Nats::start().await {
                Ok(nats) => nats,
                Err(err) => panic!("starting the shared nats-server failed: {err:#}"),
            }
        })
        .await
}

async fn read_info(port: u16) -> std::io::Result<serde_json::Value> {
    let stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).await?;
    let json = line
        .strip_prefix("INFO ")
        .ok_or_else(|| std::io::Error::other(format!("not a NATS INFO line: {line:?}")))?;
    serde_json::from_str(json.trim()).map_err(std::io::Error::other)
}

enum StartError {
    /// Another process holds the port: try again (elsewhere or later).
    PortTaken(String),
    Failed(anyhow::Error),
}

#[derive(Debug)]
enum Probe {
    Exited(String),
    OtherServer(String),
    Timeout,
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probe::Exited(status) => write!(f, "nats-server exited ({status})"),
            Probe::OtherServer(name) => write!(f, "another server ({name:?}) answers on the port"),
            Probe::Timeout => write!(f, "no JetStream-enabled INFO within {READY_TIMEOUT:?}"),
        }
    }
}
