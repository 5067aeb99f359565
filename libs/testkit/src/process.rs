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
