//! A JetStream-enabled nats-server in a temporary directory.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::Context;
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::OnceCell;

use crate::locate::nats_server_binary;
use crate::process::{
    restart_on_its_port, start_on_a_free_port, stop_child, Answer, Launch, Server, StartError,
    Watchdog,
};

/// How long a started server may take to answer with its INFO line.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of one readiness probe (connect, then read INFO).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between readiness probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(25);
/// The default NATS maximum message size, written down explicitly.
const MAX_PAYLOAD_BYTES: u64 = 1024 * 1024;
/// As deploy/nats/nats.conf: the suites run under the deployment's limits.
pub const MAX_SUBSCRIPTIONS_PER_CONNECTION: usize = 1024;
/// Free disk a test server needs: JetStream offers a share of the free disk
/// as its store (about three quarters), and the event log asks for 1 GiB.
/// With less, creating the log is refused and a service waits for it for
/// ever, so the test is refused here with the reason instead.
const STORE_DISK_FREE_MIN_BYTES: u64 = 2 * 1024 * 1024 * 1024;

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
    /// Set for a member of a [`crate::NatsCluster`].
    peering: Option<Peering>,
    /// Files written beside the config and lines appended to it (see
    /// [`Nats::start_secured`]).
    secured: Option<Box<Secured>>,
    // Declared last: dropped after the server is gone.
    dir: TempDir,
}

impl Nats {
    /// Starts a nats-server and waits until it accepts clients with
    /// JetStream enabled.
    pub async fn start() -> anyhow::Result<Nats> {
        let server_name = format!("lh-test-{}", uuid::Uuid::new_v4().simple());
        Nats::start_as(server_name, None).await
    }

    /// Starts a server whose config also says `config` (for example
    /// `include "users.conf"` and a `tls` block), with `files` (name,
    /// contents) written beside it first: how tests run the deployment's
    /// users and permissions. Most tests keep an open server
    /// ([`Nats::start`]).
    pub async fn start_secured(
        files: Vec<(String, String)>,
        config: impl Into<String>,
    ) -> anyhow::Result<Nats> {
        let server_name = format!("lh-test-{}", uuid::Uuid::new_v4().simple());
        Nats::start_inner(
            server_name,
            None,
            Some(Box::new(Secured {
                files,
                config: config.into(),
            })),
        )
        .await
    }

    /// Starts a server named `server_name`, a cluster member when `peering`
    /// says so (the caller then waits for the cluster to elect its leader).
    pub(crate) async fn start_as(
        server_name: String,
        peering: Option<Peering>,
    ) -> anyhow::Result<Nats> {
        Nats::start_inner(server_name, peering, None).await
    }

    async fn start_inner(
        server_name: String,
        peering: Option<Peering>,
        secured: Option<Box<Secured>>,
    ) -> anyhow::Result<Nats> {
        let binary = nats_server_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("lh-nats-")
            .tempdir()
            .context("creating the nats-server temporary directory")?;
        std::fs::create_dir(dir.path().join("store"))
            .context("creating the JetStream store directory")?;
        let free = disk_free_bytes(dir.path())?;
        if free < STORE_DISK_FREE_MIN_BYTES {
            anyhow::bail!(
                "the disk holding {} has {} MiB free; JetStream needs about {} MiB to create the \
                 event log (free the disk, or point TMPDIR at a larger one)",
                dir.path().display(),
                free / (1024 * 1024),
                STORE_DISK_FREE_MIN_BYTES / (1024 * 1024)
            );
        }
        let mut nats = Nats {
            port: 0,
            server_name,
            binary,
            child: None,
            watchdog: None,
            peering,
            secured,
            dir,
        };
        start_on_a_free_port(&mut nats).await?;
        tracing::info!(url = %nats.url(), dir = %nats.dir.path().display(), "nats-server started");
        Ok(nats)
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

    /// The directory of the config, the store and the log.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The generated configuration file.
    pub fn config_file(&self) -> PathBuf {
        self.dir.path().join("nats-server.conf")
    }

    /// The `server_name` in its config (what JetStream calls a leader by).
    pub fn server_name(&self) -> &str {
        &self.server_name
    }

    /// The monitoring port of a cluster member (single servers have none).
    pub(crate) fn http_port(&self) -> Option<u16> {
        self.peering.as_ref().map(|p| p.http_port)
    }

    /// Whether the server was started and not killed since (it may have
    /// exited by itself; see [`Nats::is_running`]).
    pub(crate) fn is_started(&self) -> bool {
        self.child.is_some()
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
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
        restart_on_its_port(self).await?;
        tracing::info!(url = %self.url(), "nats-server restarted");
        Ok(())
    }

    /// Writes `files` beside the config in place of a secured server's own
    /// (its users, say), has the server reload (SIGHUP) and waits until its
    /// log says it did, up to 10 s.
    pub async fn reload_secured(&mut self, files: Vec<(String, String)>) -> anyhow::Result<()> {
        let secured = self
            .secured
            .as_mut()
            .context("only a secured server has files to reload")?;
        secured.files = files;
        self.write_config()?;
        let reloads = || {
            std::fs::read_to_string(self.log_file())
                .unwrap_or_default()
                .matches("Reloaded server configuration")
                .count()
        };
        let before = reloads();
        let pid = self
            .child
            .as_ref()
            .context("the server is not running")?
            .id();
        // SAFETY: a plain kill(2) of the child this value owns.
        if unsafe { libc::kill(pid as libc::pid_t, libc::SIGHUP) } != 0 {
            anyhow::bail!(
                "SIGHUP to nats-server {pid}: {}",
                std::io::Error::last_os_error()
            );
        }
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while reloads() == before {
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!(
                    "nats-server did not reload within 10 s (see {})",
                    self.log_file().display()
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn write_config(&self) -> anyhow::Result<()> {
        let mut config = format!(
            "# Generated by lh-testkit.\n\
             server_name: \"{name}\"\n\
             listen: \"127.0.0.1:{port}\"\n\
             max_payload: {max_payload}\n\
             max_subscriptions: {max_subscriptions}\n\
             max_connections: 16384\n\
             jetstream {{\n  store_dir: \"{store}\"\n  sync_interval: always\n}}\n",
            name = self.server_name,
            port = self.port,
            max_payload = MAX_PAYLOAD_BYTES,
            max_subscriptions = MAX_SUBSCRIPTIONS_PER_CONNECTION,
            store = self.store_dir().display(),
        );
        if let Some(peering) = &self.peering {
            config.push_str(&peering.config());
        }
        if let Some(secured) = &self.secured {
            for (name, contents) in &secured.files {
                std::fs::write(self.dir.path().join(name), contents)
                    .with_context(|| format!("writing {name} beside the nats-server config"))?;
            }
            config.push_str(&secured.config);
            config.push('\n');
        }
        std::fs::write(self.config_file(), config).context("writing the nats-server config")
    }

    /// Spawns the server and waits until *our* server (matched by its
    /// unique name) sends an INFO line that says JetStream is enabled.
    /// nats-server enables JetStream, recovering its streams from the
    /// store, before it starts accepting clients, so that INFO line means
    /// the server is ready.
    async fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        self.write_config().map_err(StartError::Failed)?;
        let mut command = Command::new(&self.binary);
        command.arg("-c").arg(self.config_file());
        let log = self.log_file();
        let launch = Launch {
            name: <Self as Server>::NAME,
            log: &log,
            stop_signal: "KILL",
            dir: self.dir.path(),
            ready_means: "JetStream-enabled INFO",
            ready_timeout: READY_TIMEOUT,
            probe_timeout: PROBE_TIMEOUT,
            probe_interval: PROBE_INTERVAL,
        };
        let (port, ours) = (self.port, self.server_name.as_str());
        let (child, watchdog) = launch
            .spawn_until_ready(command, || async move {
                let Ok(info) = read_info(port).await else {
                    return Answer::NotYet;
                };
                let name = info
                    .get("server_name")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default();
                if name != ours {
                    Answer::Other(name.to_string())
                } else if info.get("jetstream").and_then(|v| v.as_bool()) == Some(true) {
                    Answer::Ready
                } else {
                    Answer::NotYet
                }
            })
            .await?;
        self.child = Some(child);
        self.watchdog = Some(watchdog);
        Ok(())
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

/// The parts of a secured server's config a test supplies.
#[derive(Debug, Clone)]
struct Secured {
    files: Vec<(String, String)>,
    config: String,
}

/// What makes a server a cluster member: its own route and monitoring
/// ports and every member's route port (its own included; the server skips
/// a route to itself).
#[derive(Debug, Clone)]
pub(crate) struct Peering {
    pub(crate) cluster_name: String,
    pub(crate) cluster_port: u16,
    pub(crate) http_port: u16,
    pub(crate) route_ports: Vec<u16>,
}

impl Peering {
    /// The `http` line and `cluster` block of the member's config.
    fn config(&self) -> String {
        let routes: Vec<String> = self
            .route_ports
            .iter()
            .map(|port| format!("    \"nats-route://127.0.0.1:{port}\""))
            .collect();
        format!(
            "http: \"127.0.0.1:{http}\"\n\
             cluster {{\n  name: \"{name}\"\n  listen: \"127.0.0.1:{listen}\"\n  routes: [\n{routes}\n  ]\n}}\n",
            http = self.http_port,
            name = self.cluster_name,
            listen = self.cluster_port,
            routes = routes.join("\n"),
        )
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

impl Server for Nats {
    const NAME: &'static str = "nats-server";

    fn port(&self) -> u16 {
        self.port
    }

    fn set_port(&mut self, port: u16) {
        self.port = port;
    }

    async fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        Nats::spawn_and_wait(self).await
    }
}

/// Bytes an unprivileged writer may still use on the file system of `path`.
fn disk_free_bytes(path: &std::path::Path) -> anyhow::Result<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .context("a temporary path without NUL bytes")?;
    // SAFETY: statvfs(3) writes only into the zeroed struct it is given and
    // reads the NUL-terminated path, both live for the call.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statvfs {}", path.display()));
    }
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_free_disk_under_a_path_is_read_and_a_missing_path_is_an_error() {
        let dir = tempfile::tempdir().expect("a temp dir");
        assert!(disk_free_bytes(dir.path()).expect("statvfs") > 0);
        assert!(disk_free_bytes(&dir.path().join("missing")).is_err());
    }
}
