//! Child-process plumbing shared by the servers: free ports, the watchdog that
//! outlives the test process, signals and log tails.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How many fresh ports a start tries before giving up.
pub(crate) const START_ATTEMPTS_MAX: u32 = 10;
/// How long a restart keeps retrying its (fixed) port while something else
/// holds it.
pub(crate) const RESTART_PORT_BUSY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long `Drop` waits for a server to exit after asking it to stop, before
/// it sends SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How many bytes of a server log an error message quotes.
const LOG_TAIL_BYTES: u64 = 4096;

/// A port on 127.0.0.1 that was free a moment ago. The listener is closed
/// before returning, so another process may take the port before the server
/// binds it: callers retry on bind failure.
pub(crate) fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// The watchdog script. Arguments: test process pid, server pid, the signal
/// that stops the server, the directory to remove afterwards.
///
/// A process counts as alive while `/proc/<pid>` exists and is not a zombie
/// (`kill -0` cannot be used: the server may run as another user).
const WATCHDOG_SCRIPT: &str = r#"
parent=$1 server=$2 sig=$3 dir=$4
alive() { [ -e "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
while alive "$parent"; do
  alive "$server" || exit 0
  sleep 1
done
kill "-$sig" "$server" 2>/dev/null
i=0
while alive "$server" && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -KILL "$server" 2>/dev/null
[ -n "$dir" ] && rm -rf -- "$dir"
exit 0
"#;

/// A `sh` process that stops a server and removes its directory once the test
/// process is gone. Dropping the watchdog (the normal path, the owner stops
/// the server itself) kills it.
pub(crate) struct Watchdog {
    child: Child,
}

impl Watchdog {
    pub(crate) fn spawn(server_pid: u32, signal: &str, remove_dir: &Path) -> io::Result<Watchdog> {
        let child = Command::new("/bin/sh")
            .arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("lh-testkit-watchdog")
            .arg(std::process::id().to_string())
            .arg(server_pid.to_string())
            .arg(signal)
            .arg(remove_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Own process group: a Ctrl-C at the terminal must not take the
            // watchdog down with the test process, it has cleaning to do.
            .process_group(0)
            .spawn()?;
        Ok(Watchdog { child })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `signal` to the child (if it still runs) and reaps it, escalating to
/// SIGKILL after [`STOP_TIMEOUT`].
pub(crate) fn stop_child(child: &mut Child, signal: libc::c_int) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if signal == libc::SIGKILL {
        let _ = child.kill();
        let _ = child.wait();
        return;
    }
    // SAFETY: plain kill(2) on a pid we own and have not reaped yet.
    unsafe {
        libc::kill(child.id() as libc::pid_t, signal);
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The last few KiB of a log file, for error messages.
pub(crate) fn log_tail(path: &Path) -> String {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(err) => return format!("<cannot read {}: {err}>", path.display()),
    };
    let len = file.metadata().map(|meta| meta.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The byte length of a log file, so that a later [`log_since`] reads only
/// what one start attempt wrote.
pub(crate) fn log_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|meta| meta.len()).unwrap_or(0)
}

/// What was appended to a log file since byte `offset`.
pub(crate) fn log_since(path: &Path, offset: u64) -> String {
    let mut out = Vec::new();
    if let Ok(mut file) = File::open(path) {
        let _ = file.seek(SeekFrom::Start(offset));
        let _ = file.read_to_end(&mut out);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Opens (creating, appending) a server log file for a child's stdout and
/// stderr.
pub(crate) fn log_stdio(path: &Path) -> io::Result<(Stdio, Stdio)> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    Ok((Stdio::from(file.try_clone()?), Stdio::from(file)))
}

/// How a starting server is watched until it is ready.
pub(crate) struct Launch<'a> {
    /// What the logs call it ("nats-server", "PostgreSQL").
    pub name: &'static str,
    /// The file its stdout and stderr are appended to.
    pub log: &'a Path,
    /// The signal the watchdog stops it with once the test process is gone.
    pub stop_signal: &'static str,
    /// The directory the watchdog removes after stopping it.
    pub dir: &'a Path,
    /// What "ready" means for this server, for the timeout message.
    pub ready_means: &'static str,
    /// How long it may take to become ready.
    pub ready_timeout: Duration,
    /// How long one probe may take.
    pub probe_timeout: Duration,
    /// The pause between two probes.
    pub probe_interval: Duration,
}

/// What one probe of a starting server's port saw.
pub(crate) enum Answer {
    /// Our server, ready.
    Ready,
    /// Nothing usable yet (no answer, or ours and not ready).
    NotYet,
    /// Another server, which calls itself this, holds the port.
    Other(String),
}

/// Why a spawned server did not become ready.
enum NotReady {
    Exited(String),
    Other(String),
    Timeout,
}

impl Launch<'_> {
    /// Spawns `command` with its output in the log and a watchdog beside it,
    /// then probes until the server is ready. A server that never gets ready
    /// is killed; a port held by another process (its log says the address
    /// is in use, or another server answers) is [`StartError::PortTaken`].
    pub(crate) async fn spawn_until_ready<F, Fut>(
        &self,
        mut command: Command,
        mut probe: F,
    ) -> Result<(Child, Watchdog), StartError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Answer>,
    {
        let name = self.name;
        let log_offset = log_len(self.log);
        let (stdout, stderr) = log_stdio(self.log)
            .map_err(|err| StartError::Failed(anyhow::anyhow!("opening the {name} log: {err}")))?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|err| {
                let program = command.get_program().to_string_lossy().into_owned();
                StartError::Failed(anyhow::anyhow!("spawning {program}: {err}"))
            })?;
        let watchdog = match Watchdog::spawn(child.id(), self.stop_signal, self.dir) {
            Ok(watchdog) => watchdog,
            Err(err) => {
                stop_child(&mut child, libc::SIGKILL);
                return Err(StartError::Failed(anyhow::anyhow!(
                    "spawning the {name} watchdog: {err}"
                )));
            }
        };
        let Err(not_ready) = self.wait_ready(&mut child, &mut probe).await else {
            return Ok((child, watchdog));
        };
        drop(watchdog);
        stop_child(&mut child, libc::SIGKILL);
        let why = match &not_ready {
            NotReady::Exited(status) => format!("{name} exited ({status})"),
            NotReady::Other(other) => format!("another server ({other:?}) answers on the port"),
            NotReady::Timeout => format!("no {} within {:?}", self.ready_means, self.ready_timeout),
        };
        let output = log_since(self.log, log_offset).to_ascii_lowercase();
        Err(
            if output.contains("address already in use") || matches!(not_ready, NotReady::Other(_))
            {
                StartError::PortTaken(why)
            } else {
                StartError::Failed(anyhow::anyhow!(
                    "{name} did not become ready: {why}\n--- log ---\n{}",
                    log_tail(self.log)
                ))
            },
        )
    }

    async fn wait_ready<F, Fut>(&self, child: &mut Child, probe: &mut F) -> Result<(), NotReady>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Answer>,
    {
        let deadline = Instant::now() + self.ready_timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(NotReady::Exited(status.to_string()));
            }
            match tokio::time::timeout(self.probe_timeout, probe()).await {
                Ok(Answer::Ready) => return Ok(()),
                Ok(Answer::Other(other)) => return Err(NotReady::Other(other)),
                Ok(Answer::NotYet) | Err(_) => {}
            }
            if Instant::now() >= deadline {
                return Err(NotReady::Timeout);
            }
            tokio::time::sleep(self.probe_interval).await;
        }
    }
}

/// Why one start of a server failed.
pub(crate) enum StartError {
    /// Another process holds the port: try again (elsewhere or later).
    PortTaken(String),
    Failed(anyhow::Error),
}

/// A server child process that can be (re)started on a given port.
pub(crate) trait Server {
    /// What the logs call it ("nats-server", "PostgreSQL").
    const NAME: &'static str;
    fn port(&self) -> u16;
    fn set_port(&mut self, port: u16);
    /// Spawns the process on `port()` and waits until it is ready.
    async fn spawn_and_wait(&mut self) -> Result<(), StartError>;
}

/// Starts `server` on a free port, trying other ports while the one picked
/// turns out taken (another process may grab it between pick and bind).
pub(crate) async fn start_on_a_free_port<S: Server>(server: &mut S) -> anyhow::Result<()> {
    let mut last_error = None;
    for _ in 0..START_ATTEMPTS_MAX {
        server.set_port(free_port().map_err(|e| anyhow::anyhow!("picking a free port: {e}"))?);
        match server.spawn_and_wait().await {
            Ok(()) => return Ok(()),
            Err(StartError::PortTaken(why)) => {
                tracing::debug!(port = server.port(), %why, "{} port taken, retrying on another", S::NAME);
                last_error = Some(why);
            }
            Err(StartError::Failed(err)) => return Err(err),
        }
    }
    anyhow::bail!(
        "{} did not start after {START_ATTEMPTS_MAX} ports: {}",
        S::NAME,
        last_error.unwrap_or_default()
    )
}

/// Starts `server` again on its port, waiting while the port is still held
/// (a killed process's socket may linger), up to [`RESTART_PORT_BUSY_TIMEOUT`].
pub(crate) async fn restart_on_its_port<S: Server>(server: &mut S) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + RESTART_PORT_BUSY_TIMEOUT;
    loop {
        match server.spawn_and_wait().await {
            Ok(()) => return Ok(()),
            Err(StartError::PortTaken(why)) if std::time::Instant::now() < deadline => {
                tracing::debug!(port = server.port(), %why, "{} port still taken, retrying", S::NAME);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(StartError::PortTaken(why)) => {
                anyhow::bail!(
                    "restarting {} on port {}: port stayed taken: {why}",
                    S::NAME,
                    server.port()
                )
            }
            Err(StartError::Failed(err)) => return Err(err),
        }
    }
}
