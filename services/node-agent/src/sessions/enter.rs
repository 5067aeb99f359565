//! Starting what a session runs inside a workload: a command (on a
//! terminal or on pipes) or a connection to a port, always inside the
//! workload's own confinement, never on the host as the agent.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use lh_rpc::session::TtySize;
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use uuid::Uuid;

use super::pty::{self, PtyMaster};
use crate::workload::door::DoorTarget;

/// The variable that marks a session's processes, so that the ones left in
/// a container when its session is cut can be found and killed.
pub const ENV_SESSION: &str = "LEASEHOLD_SESSION";
/// `TERM` of a session on a terminal.
pub const SESSION_TERM: &str = "xterm-256color";
/// How long a connection to a port inside a workload may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the engine may take to say where a container's network is.
const INSPECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How the command's bytes come and go.
pub enum ExecIo {
    Tty(PtyMaster),
    Pipes {
        stdin: Option<ChildStdin>,
        stdout: ChildStdout,
        stderr: ChildStderr,
    },
}

/// A session's command, running.
pub struct Exec {
    pub child: Child,
    /// Taken by the relay.
    pub io: Option<ExecIo>,
    /// The command runs in a container (its processes are the engine's
    /// children, not ours).
    in_container: bool,
    session_id: Uuid,
}

/// Starts `command` in the workload `target` for session `session_id`.
pub fn exec(
    target: &DoorTarget,
    session_id: Uuid,
    command: &[String],
    tty: Option<TtySize>,
    stdin: bool,
) -> io::Result<Exec> {
    if command.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no command"));
    }
    let marker = session_id.to_string();
    let (mut cmd, in_container) = match target {
        DoorTarget::Container { engine, name } => {
            let mut cmd = engine.command();
            cmd.arg("exec");
            if stdin {
                cmd.arg("-i");
            }
            if tty.is_some() {
                cmd.args(["-t", "-e", &format!("TERM={SESSION_TERM}")]);
            }
            cmd.args(["-e", &format!("{ENV_SESSION}={marker}")])
                .arg(name)
                .args(command);
            (cmd, true)
        }
        DoorTarget::Process {
            home,
            env,
            cgroup_procs,
            ..
        } => {
            let mut cmd = Command::new(&command[0]);
            cmd.args(&command[1..])
                .env_clear()
                .envs(env)
                .env(ENV_SESSION, &marker)
                .current_dir(home);
            if tty.is_some() {
                cmd.env("TERM", SESSION_TERM);
            }
            if let Some(procs) = cgroup_procs.clone() {
                // SAFETY: only async-signal-safe calls (open, write, close).
                unsafe {
                    cmd.pre_exec(move || crate::workload::cgroup::write_own_pid(&procs));
                }
            }
            if tty.is_none() {
                cmd.process_group(0);
            }
            (cmd, false)
        }
    };
    cmd.kill_on_drop(true);
    let io_of = |cmd: &mut Command| -> io::Result<Option<PtyMaster>> {
        match tty {
            Some(size) => {
                let (master, slave) = pty::open(size.cols, size.rows)?;
                let (a, b) = (slave.try_clone()?, slave.try_clone()?);
                cmd.stdin(Stdio::from(a))
                    .stdout(Stdio::from(b))
                    .stderr(Stdio::from(slave));
                // SAFETY: setsid and an ioctl only.
                unsafe {
                    cmd.pre_exec(pty::controlling_terminal_hook());
                }
                Ok(Some(master))
            }
            None => {
                cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() })
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                Ok(None)
            }
        }
    };
    let master = io_of(&mut cmd)?;
    if let DoorTarget::Process { uid, .. } = target {
        let uid = *uid;
        // SAFETY: plain system calls on values; last, as it gives up root.
        unsafe {
            cmd.pre_exec(move || crate::workload::lease_user::become_user(uid));
        }
    }
    let mut child = cmd.spawn()?;
    // The terminal side lives on in the child only: the agent's copies go
    // with `cmd`, so that the terminal closes when the command's last
    // process does.
    drop(cmd);
    let io = match master {
        Some(master) => ExecIo::Tty(master),
        None => ExecIo::Pipes {
            stdin: child.stdin.take(),
            stdout: child.stdout.take().expect("piped"),
            stderr: child.stderr.take().expect("piped"),
        },
    };
    Ok(Exec {
        child,
        io: Some(io),
        in_container,
        session_id,
    })
}

impl Exec {
    /// Kills what the session started: its process group, or in a
    /// container the engine's client and every process that carries the
    /// session's mark (the engine leaves them running when its client dies).
    pub fn kill(&mut self) {
        if let Some(pid) = self.child.id() {
            if !self.in_container {
                // SAFETY: a signal to the group the child leads.
                unsafe {
                    libc::kill(-(pid as i32), libc::SIGKILL);
                }
            }
        }
        let _ = self.child.start_kill();
        if self.in_container {
            let killed = kill_marked(Path::new("/proc"), &self.session_id.to_string());
            if killed > 0 {
                tracing::info!(session = %self.session_id, killed, "processes of a cut session killed");
            }
        }
    }
}

/// SIGKILLs every process under `proc` whose environment holds
/// `LEASEHOLD_SESSION=<marker>`; how many.
pub fn kill_marked(proc: &Path, marker: &str) -> usize {
    let wanted = format!("{ENV_SESSION}={marker}");
    let Ok(entries) = std::fs::read_dir(proc) else {
        return 0;
    };
    let mut killed = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()) {
            // SAFETY: a signal to a pid.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
    }
    killed
}

/// A connection to `127.0.0.1:port` inside the workload `target`: in a
/// container's own network namespace, or on the host for a process lease
/// (which shares the host's network).
pub async fn connect(target: &DoorTarget, port: u16) -> io::Result<TcpStream> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    match target {
        DoorTarget::Process { .. } => {
            tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
        }
        DoorTarget::Container { engine, name } => {
            let mut inspect = engine.command();
            inspect
                .args(["inspect", "--format", "{{.State.Pid}}", name])
                .stdin(Stdio::null())
                .kill_on_drop(true);
            let out = tokio::time::timeout(INSPECT_TIMEOUT, inspect.output())
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the engine did not say"))??;
            let pid: i32 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .ok()
                .filter(|pid| *pid > 0)
                .ok_or_else(|| io::Error::other("the container is not running"))?;
            let netns: OwnedFd = std::fs::File::open(format!("/proc/{pid}/ns/net"))?.into();
            let (tx, rx) = tokio::sync::oneshot::channel();
            // A thread of its own enters the namespace and ends: a socket
            // keeps the namespace it was made in, and no thread of the
            // agent's pools is left in the container's network.
            std::thread::Builder::new()
                .name("lh-session-connect".into())
                .spawn(move || {
                    let _ = tx.send(connect_in(&netns, addr));
                })?;
            let stream = rx
                .await
                .map_err(|_| io::Error::other("the connecting thread died"))??;
            stream.set_nonblocking(true)?;
            TcpStream::from_std(stream)
        }
    }
}

fn connect_in(netns: &OwnedFd, addr: std::net::SocketAddr) -> io::Result<std::net::TcpStream> {
    use std::os::fd::AsRawFd;
    // SAFETY: setns on a namespace descriptor we hold, for this thread.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_marked_processes_are_killed() {
        let marker = Uuid::new_v4().to_string();
        let mut marked = std::process::Command::new("sleep")
            .arg("30")
            .env(ENV_SESSION, &marker)
            .spawn()
            .unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .env(ENV_SESSION, Uuid::new_v4().to_string())
            .spawn()
            .unwrap();
        assert_eq!(kill_marked(Path::new("/proc"), &marker), 1);
        assert!(marked.wait().unwrap().code().is_none());
        assert!(other.try_wait().unwrap().is_none());
        other.kill().unwrap();
        other.wait().unwrap();
    }
}
