//! File system calls that never follow a symlink, for trees an untrusted
//! container wrote and a root process reads or fills.
//!
//! Everything below the root the caller names is reached one component at
//! a time from a directory descriptor: directories with `O_DIRECTORY |
//! O_NOFOLLOW`, so a directory swapped for a symlink fails to open instead
//! of leading elsewhere; regular files first as an `O_PATH` handle, whose
//! type is checked before the file is really opened through
//! `/proc/self/fd`, so neither a symlink nor a device or FIFO swapped in
//! at the last moment is ever opened for reading (opening a device has
//! effects of its own; opening a FIFO blocks).

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::manifest::MAX_SYMLINK_TARGET_BYTES;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    let fd = check(fd)?;
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A name for the `*at` calls.
pub(crate) fn c_name(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}

/// The kind of a mode's file.
pub(crate) fn kind(mode: libc::mode_t) -> libc::mode_t {
    mode & libc::S_IFMT
}

/// Opens the directory the caller names (a path it trusts), refusing a
/// symlink in its last component.
pub(crate) fn open_root(path: &Path) -> io::Result<OwnedFd> {
    let path = c_name(path.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path; the result is checked.
    owned(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })
}

/// Opens the directory `name` in `dir`; a symlink or anything else fails
/// (`ELOOP`, `ENOTDIR`).
pub(crate) fn open_dir_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: a valid descriptor and NUL-terminated name; checked result.
    owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })
}

/// What `name` in `dir` is, the link itself for a symlink.
pub(crate) fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: `stat` is plain data, filled by the kernel on success.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: as in `stat_at`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// Opens `name` in `dir` for reading if, and only if, it is a regular
/// file; also says what it is (size, mode) as opened.
pub(crate) fn open_regular_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<(File, libc::stat)> {
    // SAFETY: as in `open_dir_at`. `O_PATH` opens nothing: no driver, no
    // FIFO, no read permission is involved.
    let handle = owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    let st = fstat(handle.as_fd())?;
    if kind(st.st_mode) != libc::S_IFREG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    // The handle's inode, reopened for reading: no path is looked up again.
    let proc_path = c_name(format!("/proc/self/fd/{}", handle.as_raw_fd()).as_bytes())?;
    // SAFETY: a NUL-terminated path; checked result.
    let fd = owned(unsafe { libc::open(proc_path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
    let opened = fstat(fd.as_fd())?;
    if opened.st_ino != st.st_ino || opened.st_dev != st.st_dev {
        return Err(io::Error::other("the file changed while it was opened"));
    }
    Ok((File::from(fd), opened))
}

/// The target of the symlink `name` in `dir`, as bytes.
pub(crate) fn read_link_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; MAX_SYMLINK_TARGET_BYTES + 1];
    // SAFETY: the buffer is valid for its length; checked result.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n > MAX_SYMLINK_TARGET_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "symlink target too long",
        ));
    }
    buf.truncate(n);
    Ok(buf)
}

/// The names in a directory, but `.` and `..`; more than `max_names`
/// is an error (a directory of millions of names is refused before its
/// names fill memory).
pub(crate) fn list_dir(dir: BorrowedFd<'_>, max_names: usize) -> io::Result<Vec<CString>> {
    // `fdopendir` takes the descriptor it is given: give it a duplicate.
    // SAFETY: `dir` is valid; checked result.
    let dup = owned(unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: on success the stream owns the duplicate, released by
    // `closedir` below.
    let stream = unsafe { libc::fdopendir(dup.as_raw_fd()) };
    if stream.is_null() {
        return Err(io::Error::last_os_error());
    }
    std::mem::forget(dup);
    // The duplicate shares the original's offset, which an earlier listing
    // left at the end.
    // SAFETY: a valid stream.
    unsafe { libc::rewinddir(stream) };
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: errno is thread-local; `readdir` reports an error only
        // through it.
        unsafe { *libc::__errno_location() = 0 };
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            let error = io::Error::last_os_error();
            break match error.raw_os_error() {
                Some(0) | None => Ok(()),
                Some(_) => Err(error),
            };
        }
        // SAFETY: `d_name` is NUL-terminated, valid until the next call.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        if names.len() >= max_names {
            break Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("more than {max_names} names in one directory"),
            ));
        }
        names.push(name.to_owned());
    };
    // SAFETY: the stream from `fdopendir`, closed once.
    unsafe { libc::closedir(stream) };
    result.map(|()| names)
}

/// Whether a directory holds nothing but `.` and `..`.
pub(crate) fn is_empty_dir(dir: BorrowedFd<'_>) -> io::Result<bool> {
    match list_dir(dir, 1) {
        Ok(names) => Ok(names.is_empty()),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Ok(false),
        Err(e) => Err(e),
    }
}

/// `rel`'s parent and last component; `rel` is a validated relative path.
pub(crate) fn split_parent(rel: &str) -> (&str, &str) {
    match rel.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => ("", rel),
    }
}

/// The directory at `rel` below `root`, each component opened without
/// following a symlink. `""` is the root itself.
pub(crate) fn open_dir_beneath(root: BorrowedFd<'_>, rel: &str) -> io::Result<OwnedFd> {
    let mut dir = root.try_clone_to_owned()?;
    if rel.is_empty() {
        return Ok(dir);
    }
    for component in rel.split('/') {
        dir = open_dir_at(dir.as_fd(), &c_name(component.as_bytes())?)?;
    }
    Ok(dir)
}

/// The regular file at `rel` below `root`, opened for reading without
/// following a symlink anywhere on the way.
pub(crate) fn open_file_beneath(root: BorrowedFd<'_>, rel: &str) -> io::Result<(File, libc::stat)> {
    let (parent, name) = split_parent(rel);
    let dir = open_dir_beneath(root, parent)?;
    open_regular_at(dir.as_fd(), &c_name(name.as_bytes())?)
}

/// Makes the directory `name` in `dir` with exactly `mode` (whatever the
/// umask).
pub(crate) fn mkdir_at(dir: BorrowedFd<'_>, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: valid descriptor and name; checked results.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })?;
    let made = open_dir_at(dir, name)?;
    check(unsafe { libc::fchmod(made.as_raw_fd(), mode) })?;
    Ok(())
}

/// Creates the file `name` in `dir`, which must not exist, with exactly
/// `mode`, open for writing.
pub(crate) fn create_file_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    mode: libc::mode_t,
) -> io::Result<File> {
    // SAFETY: valid descriptor and name; checked results.
    let fd = owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            libc::c_uint::from(mode),
        )
    })?;
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })?;
    Ok(File::from(fd))
}

/// Makes `name` in `dir` a symlink to `target`, which is not looked at.
pub(crate) fn symlink_at(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: valid descriptor and names; checked result.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn nothing_is_reached_through_a_symlink() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"outside").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/f"), b"inside").unwrap();
        symlink(outside.path().join("secret"), root.path().join("file-link")).unwrap();
        symlink(outside.path(), root.path().join("dir-link")).unwrap();

        let fd = open_root(root.path()).unwrap();
        let (mut f, st) = open_file_beneath(fd.as_fd(), "d/f").unwrap();
        assert_eq!(st.st_size, 6);
        let mut text = String::new();
        std::io::Read::read_to_string(&mut f, &mut text).unwrap();
        assert_eq!(text, "inside");

        assert!(open_file_beneath(fd.as_fd(), "file-link").is_err());
        assert!(open_file_beneath(fd.as_fd(), "dir-link/secret").is_err());
        assert!(open_dir_beneath(fd.as_fd(), "dir-link").is_err());
        assert!(open_root(&root.path().join("dir-link")).is_err());

        let mut names = list_dir(fd.as_fd(), 10).unwrap();
        names.sort();
        assert_eq!(names.len(), 3);
        assert!(list_dir(fd.as_fd(), 2).is_err());
    }

    #[test]
    fn a_fifo_is_not_opened() {
        let root = tempfile::tempdir().unwrap();
        let fifo = c_name(root.path().join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let fd = open_root(root.path()).unwrap();
        // Would block forever if it opened the FIFO for reading.
        let error = open_file_beneath(fd.as_fd(), "fifo").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }
}
