//! The local terminal while a remote one is attached (`lease exec -t`,
//! `lease shell`): raw mode, so that every key (Ctrl-C, Ctrl-D, arrows)
//! reaches the remote terminal as bytes and only its echo is shown, and
//! the size the remote terminal should have.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;

use lh_rpc::http::sessions::TerminalSize;

/// The terminal `fd` in raw mode for as long as this lives; dropping it
/// (on return, on an error, while a panic unwinds) puts back the settings
/// it found.
#[derive(Debug)]
pub(crate) struct RawMode {
    fd: RawFd,
    saved: libc::termios,
}

impl RawMode {
    /// Puts the terminal `fd` in raw mode. Fails when `fd` is not a
    /// terminal.
    pub(crate) fn enter(fd: RawFd) -> io::Result<RawMode> {
        let saved = get_attributes(fd)?;
        let mut raw = saved;
        // SAFETY: cfmakeraw only writes the struct it is given, a valid one.
        unsafe { libc::cfmakeraw(&mut raw) };
        // One byte at a time, as soon as it is typed: a key press is sent
        // alone rather than waiting for more.
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        set_attributes(fd, &raw)?;
        Ok(RawMode { fd, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Nothing better to do if it fails: the terminal is gone, or the
        // user may still type `reset`.
        let _ = set_attributes(self.fd, &self.saved);
    }
}

fn get_attributes(fd: RawFd) -> io::Result<libc::termios> {
    let mut attributes = MaybeUninit::<libc::termios>::uninit();
    // SAFETY: tcgetattr fills the struct when it returns 0, and only then
    // is it read.
    if unsafe { libc::tcgetattr(fd, attributes.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: initialised by the successful tcgetattr above.
    Ok(unsafe { attributes.assume_init() })
}

fn set_attributes(fd: RawFd, attributes: &libc::termios) -> io::Result<()> {
    loop {
        // SAFETY: a valid termios, read only.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, attributes) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        // A SIGWINCH may arrive while it is being set.
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The size of the terminal `fd`, or `None` when it is not a terminal or
/// does not know its size (a serial line says 0 x 0).
pub(crate) fn size(fd: RawFd) -> Option<TerminalSize> {
    let mut size = MaybeUninit::<libc::winsize>::zeroed();
    // SAFETY: TIOCGWINSZ writes one winsize into the struct it is given.
    if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, size.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: zeroed, then filled by the successful ioctl.
    let size = unsafe { size.assume_init() };
    (size.ws_col > 0 && size.ws_row > 0).then_some(TerminalSize {
        width: size.ws_col,
        height: size.ws_row,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// A pseudo-terminal pair: the test holds the controlling side, the
    /// code under test the terminal side, as a shell's terminal would be.
    fn pty() -> (OwnedFd, OwnedFd) {
        let (mut controller, mut terminal) = (-1, -1);
        let size = libc::winsize {
            ws_row: 40,
            ws_col: 120,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: openpty writes two descriptors, owned from here on.
        let rc = unsafe {
            libc::openpty(
                &mut controller,
                &mut terminal,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        };
        assert_eq!(rc, 0, "openpty: {}", io::Error::last_os_error());
        // SAFETY: fresh descriptors nothing else owns.
        unsafe {
            (
                OwnedFd::from_raw_fd(controller),
                OwnedFd::from_raw_fd(terminal),
            )
        }
    }

    fn same_settings(a: &libc::termios, b: &libc::termios) -> bool {
        a.c_iflag == b.c_iflag
            && a.c_oflag == b.c_oflag
            && a.c_cflag == b.c_cflag
            && a.c_lflag == b.c_lflag
            && a.c_cc == b.c_cc
    }

    #[test]
    fn raw_mode_is_undone_when_the_guard_goes() {
        let (_controller, terminal) = pty();
        let fd = terminal.as_raw_fd();
        let before = get_attributes(fd).unwrap();
        assert_ne!(before.c_lflag & libc::ICANON, 0, "a new pty is cooked");
        {
            let _raw = RawMode::enter(fd).unwrap();
            let raw = get_attributes(fd).unwrap();
            for flag in [libc::ICANON, libc::ECHO, libc::ISIG, libc::IEXTEN] {
                assert_eq!(raw.c_lflag & flag, 0, "lflag {flag:#x} still set");
            }
            assert_eq!(raw.c_iflag & (libc::ICRNL | libc::IXON), 0);
            assert_eq!(raw.c_oflag & libc::OPOST, 0);
            assert_eq!(raw.c_cc[libc::VMIN], 1);
            assert!(!same_settings(&raw, &before));
        }
        assert!(same_settings(&get_attributes(fd).unwrap(), &before));
    }

    #[test]
    fn raw_mode_is_undone_when_a_panic_unwinds() {
        let (_controller, terminal) = pty();
        let fd = terminal.as_raw_fd();
        let before = get_attributes(fd).unwrap();
        let unwound = std::panic::catch_unwind(|| {
            let _raw = RawMode::enter(fd).unwrap();
            assert_eq!(get_attributes(fd).unwrap().c_lflag & libc::ICANON, 0);
            panic!("while the terminal is raw");
        });
        assert!(unwound.is_err());
        assert!(same_settings(&get_attributes(fd).unwrap(), &before));
    }

    #[test]
    fn what_is_not_a_terminal_has_no_raw_mode_and_no_size() {
        let file = tempfile::tempfile().unwrap();
        assert!(RawMode::enter(file.as_raw_fd()).is_err());
        assert_eq!(size(file.as_raw_fd()), None);
    }

    #[test]
    fn the_size_is_the_terminal_s() {
        let (_controller, terminal) = pty();
        assert_eq!(
            size(terminal.as_raw_fd()),
            Some(TerminalSize {
                width: 120,
                height: 40
            })
        );
    }
}
