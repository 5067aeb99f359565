//! A pseudo-terminal the agent holds for a session's command: the command
//! gets the terminal side as its stdin, stdout, stderr and controlling
//! terminal; the agent reads and writes the other side, and resizing it
//! signals the command (SIGWINCH), as a terminal emulator does.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::unix::AsyncFd;

/// The agent's side of a pseudo-terminal.
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

/// A new pseudo-terminal of `cols` × `rows`: the agent's side, and the
/// terminal side for the command (closed in the agent once spawned).
pub fn open(cols: u16, rows: u16) -> io::Result<(PtyMaster, OwnedFd)> {
    let (mut master, mut slave): (RawFd, RawFd) = (-1, -1);
    let size = winsize(cols, rows);
    // SAFETY: openpty writes two descriptors into live locals; the name
    // buffer is not asked for, the terminal settings are the defaults.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openpty returned two fresh descriptors we now own.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [&master, &slave] {
        set_cloexec(fd.as_raw_fd())?;
    }
    set_nonblocking(master.as_raw_fd())?;
    // SAFETY: the descriptor is owned by the AsyncFd, never replaced or
    // closed while it is registered.
    let fd = unsafe { AsyncFd::register(master)? };
    Ok((PtyMaster { fd }, slave))
}

fn winsize(cols: u16, rows: u16) -> libc::winsize {
    libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A `pre_exec` hook that makes the child lead a session of its own with
/// its stdin (the terminal side) as the controlling terminal: Ctrl-C on
/// the terminal then reaches its foreground, and a resize signals it.
/// Only async-signal-safe calls.
pub fn controlling_terminal_hook() -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
    || {
        // SAFETY: setsid and ioctl on the child's own stdin, no allocation.
        unsafe {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

impl PtyMaster {
    /// What the command wrote, at most `buf.len()` bytes; 0 once it and
    /// everything it started have closed the terminal.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let fd = guard.get_inner().as_raw_fd();
            // SAFETY: reads into a live buffer of its length.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => guard.clear_ready(),
                Some(libc::EINTR) => {}
                // Linux says EIO once no process holds the terminal side.
                Some(libc::EIO) => return Ok(0),
                _ => return Err(e),
            }
        }
    }

    /// Writes all of `bytes` to the command's terminal.
    pub async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let mut guard = self.fd.writable().await?;
            let fd = guard.get_inner().as_raw_fd();
            // SAFETY: writes from a live buffer of its length.
            let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
            if n >= 0 {
                bytes = &bytes[n as usize..];
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => guard.clear_ready(),
                Some(libc::EINTR) => {}
                _ => return Err(e),
            }
        }
        Ok(())
    }

    /// Sets the terminal's size; the kernel signals its foreground.
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        let size = winsize(cols, rows);
        // SAFETY: TIOCSWINSZ reads a live winsize.
        if unsafe { libc::ioctl(self.fd.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    #[tokio::test]
    async fn a_command_on_the_terminal_sees_its_size_and_a_resize() {
        let (master, slave) = open(91, 17).unwrap();
        let stdin = Stdio::from(slave.try_clone().unwrap());
        let stdout = Stdio::from(slave.try_clone().unwrap());
        let mut command = tokio::process::Command::new("sh");
        command
            .args(["-c", "stty size; read line; stty size"])
            .stdin(stdin)
            .stdout(stdout)
            .stderr(Stdio::from(slave));
        // SAFETY: the hook makes only async-signal-safe calls.
        unsafe {
            command.pre_exec(controlling_terminal_hook());
        }
        let mut child = command.spawn().unwrap();
        drop(command);
        let mut seen = String::new();
        let mut buf = [0u8; 256];
        while !seen.contains("17 91") {
            let n = master.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "the terminal closed before its size was told: {seen:?}"
            );
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        master.resize(120, 40).unwrap();
        master.write_all(b"go\n").await.unwrap();
        loop {
            let n = master.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        assert!(seen.contains("40 120"), "{seen:?}");
        assert!(child.wait().await.unwrap().success());
    }
}
