//! Calls of the host's own tools (the container CLI, `ip`, the firewall)
//! that block, each bounded in time and output, and the lock the agents of
//! one host take around a change they make together (the tenant networks,
//! the gang links).

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::RuntimeError;

/// How long one CLI call (engine, firewall, `ip`) may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a change waits for another agent's to finish.
pub const LOCK_WAIT: Duration = Duration::from_secs(60);
/// Most bytes read from one CLI call's output.
const MOST_OUTPUT_BYTES: u64 = 1 << 20;

/// Replaces a chain of the filter table with `rules` (an
/// `iptables-restore --noflush` input) and makes sure `INPUT` jumps to it
/// first with `jump` (the rule's match and its `-j <chain>`), once.
pub(crate) fn install_chain(tool: &Path, rules: &str, jump: &[&str]) -> io::Result<()> {
    let restore = PathBuf::from(format!("{}-restore", tool.display()));
    run_bounded(
        Command::new(&restore).args(["--noflush", "--wait"]),
        Some(rules.as_bytes()),
    )?;
    let check = run_bounded(
        Command::new(tool)
            .args(["--wait", "-C", "INPUT"])
            .args(jump),
        None,
    );
    // Exit 1: no such rule. Anything else is an error, and adding the
    // jump again would only stack copies of it.
    let missing = match check {
        Ok(_) => false,
        Err(e) if e.to_string().contains("exit status: 1:") => true,
        Err(e) => return Err(e),
    };
    if missing {
        run_bounded(
            Command::new(tool)
                .args(["--wait", "-I", "INPUT", "1"])
                .args(jump),
            None,
        )?;
    }
    Ok(())
}

/// A host-wide lock (the tenant networks', the gang links'), held while
/// the file is open: the agents of one host take it around a change.
pub(crate) struct HostLock(#[allow(dead_code)] fs::File);

impl HostLock {
    pub(crate) fn take(path: &Path) -> Result<Self, RuntimeError> {
        let cannot = |e: io::Error| {
            RuntimeError::InvalidConfig(format!("cannot lock {}: {e}", path.display()))
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(cannot)?;
        }
        // Made by the first agent; flock needs only a descriptor, so any
        // agent that can read it takes it.
        let file = match fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o644)
                .open(path)
                .map_err(cannot)?,
            Err(e) => return Err(cannot(e)),
        };
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            // SAFETY: flock(2) on a descriptor this function owns; released
            // when the file is closed.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(HostLock(file));
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(cannot(e));
            }
            if Instant::now() >= deadline {
                return Err(cannot(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("held by another agent for over {LOCK_WAIT:?}"),
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs `command` with `input` on its standard input, for at most
/// [`CALL_TIMEOUT`]; its standard output when it succeeds, else an error
/// with its standard error.
pub(crate) fn run_bounded(command: &mut Command, input: Option<&[u8]>) -> io::Result<String> {
    let mut child = command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
    let read_out = std::thread::spawn(move || read_some(stdout.as_mut()));
    let read_err = std::thread::spawn(move || read_some(stderr.as_mut()));
    let end = |child: &mut std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
    };
    // Dropped after the write: the tool reads to its end.
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        if let Err(e) = stdin.write_all(input) {
            end(&mut child);
            return Err(e);
        }
    }
    let deadline = Instant::now() + CALL_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                end(&mut child);
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{command:?} took over {CALL_TIMEOUT:?}"),
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                end(&mut child);
                return Err(e);
            }
        }
    };
    let out = read_out.join().unwrap_or_default();
    let err = read_err.join().unwrap_or_default();
    if status.success() {
        Ok(out)
    } else {
        Err(io::Error::other(format!(
            "{:?} {status}: {}",
            command.get_program(),
            err.trim()
        )))
    }
}

fn read_some(stream: Option<&mut impl Read>) -> String {
    let mut bytes = Vec::new();
    if let Some(stream) = stream {
        let _ = stream.take(MOST_OUTPUT_BYTES).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}
