//! Reading a directory into a [`Manifest`], hashing every file.
//!
//! Run as root by the node agent on a directory a tenant's container wrote
//! and may still be writing: nothing here follows a symlink (see
//! [`crate::safe_fs`]), a symlink is recorded as its target, and what a
//! manifest cannot hold (sockets, FIFOs, devices, names that are not
//! UTF-8, other file systems mounted inside) is skipped and reported.

use std::ffi::CStr;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::manifest::{
    FileEntry, Manifest, CHUNK_BYTES, MAX_FILES, MAX_PATH_BYTES, MAX_PATH_COMPONENTS,
};
use crate::progress::{Phase, Progress, ProgressEvent};
use crate::safe_fs;

/// Skipped entries listed one by one in a [`Scan`]; the rest are counted.
pub const MAX_SKIPPED_LISTED: usize = 1000;

/// A directory's manifest, and what it left out.
#[derive(Debug, Clone)]
pub struct Scan {
    pub manifest: Manifest,
    /// The first [`MAX_SKIPPED_LISTED`] entries skipped.
    pub skipped: Vec<Skipped>,
    /// All entries skipped.
    pub skipped_total: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Relative to the root; a name that is not UTF-8 shown lossily.
    pub path: String,
    pub reason: SkipReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    Socket,
    Fifo,
    CharDevice,
    BlockDevice,
    /// A directory on another file system (a mount point).
    OtherFileSystem,
    NameNotUtf8,
    SymlinkTargetNotUtf8,
    PathTooLong,
    /// Gone between the listing and the look.
    Vanished,
    /// A kind of file Linux does not have today.
    Other,
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SkipReason::Socket => "a socket",
            SkipReason::Fifo => "a FIFO",
            SkipReason::CharDevice => "a character device",
            SkipReason::BlockDevice => "a block device",
            SkipReason::OtherFileSystem => "on another file system",
            SkipReason::NameNotUtf8 => "its name is not UTF-8",
            SkipReason::SymlinkTargetNotUtf8 => "its symlink target is not UTF-8",
            SkipReason::PathTooLong => "its path is too long",
            SkipReason::Vanished => "gone before it was read",
            SkipReason::Other => "of an unknown kind",
        })
    }
}

/// Reads the tree under `root` (which must be a directory, not a symlink)
/// into a manifest: every directory, every symlink as its target, every
/// regular file as its size, executable bit and chunk hashes. Blocking:
/// from async code, run it with `spawn_blocking`.
pub fn scan_dir(root: &Path, progress: &dyn Progress) -> Result<Scan> {
    let root_fd = safe_fs::open_root(root).map_err(|e| Error::io(root.display(), e))?;
    let root_st = safe_fs::fstat(root_fd.as_fd()).map_err(|e| Error::io(root.display(), e))?;
    let mut walker = Walker {
        progress,
        root_dev: root_st.st_dev,
        files: Vec::new(),
        skipped: Vec::new(),
        skipped_total: 0,
        bytes_done: 0,
        files_done: 0,
        buf: vec![0u8; CHUNK_BYTES as usize],
    };
    walker.walk(&root_fd, "", 0)?;
    Ok(Scan {
        manifest: Manifest::new(walker.files),
        skipped: walker.skipped,
        skipped_total: walker.skipped_total,
    })
}

struct Walker<'a> {
    progress: &'a dyn Progress,
    root_dev: libc::dev_t,
    files: Vec<FileEntry>,
    skipped: Vec<Skipped>,
    skipped_total: u64,
    bytes_done: u64,
    files_done: u64,
    buf: Vec<u8>,
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}/{name}")
    }
}

impl Walker<'_> {
    fn skip(&mut self, path: String, reason: SkipReason) {
        tracing::debug!(%path, %reason, "skipped");
        self.skipped_total += 1;
        if self.skipped.len() < MAX_SKIPPED_LISTED {
            self.skipped.push(Skipped { path, reason });
        }
    }

    fn add(&mut self, entry: FileEntry) -> Result<()> {
        if self.files.len() >= MAX_FILES {
            return Err(Error::Limit(format!(
                "more than {MAX_FILES} entries under the directory"
            )));
        }
        self.files.push(entry);
        Ok(())
    }

    fn report(&self) {
        self.progress.report(ProgressEvent {
            phase: Phase::Scan,
            bytes_done: self.bytes_done,
            bytes_total: None,
            files_done: self.files_done,
        });
    }

    fn walk(&mut self, dir: &OwnedFd, prefix: &str, depth: usize) -> Result<()> {
        let room = MAX_FILES.saturating_sub(self.files.len()) + 1;
        let mut names = safe_fs::list_dir(dir.as_fd(), room).map_err(|e| Error::io(prefix, e))?;
        names.sort();
        for name in names {
            let Ok(utf8) = std::str::from_utf8(name.to_bytes()) else {
                let shown = join(prefix, &String::from_utf8_lossy(name.to_bytes()));
                self.skip(shown, SkipReason::NameNotUtf8);
                continue;
            };
            let path = join(prefix, utf8);
            if path.len() > MAX_PATH_BYTES {
                self.skip(path, SkipReason::PathTooLong);
                continue;
            }
            let st = match safe_fs::stat_at(dir.as_fd(), &name) {
                Ok(st) => st,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.skip(path, SkipReason::Vanished);
                    continue;
                }
                Err(e) => return Err(Error::io(path, e)),
            };
            match safe_fs::kind(st.st_mode) {
                libc::S_IFDIR => self.dir(dir, &name, path, depth + 1)?,
                libc::S_IFREG => self.file(dir, &name, path)?,
                libc::S_IFLNK => {
                    let target = safe_fs::read_link_at(dir.as_fd(), &name)
                        .map_err(|e| Error::io(&path, e))?;
                    match String::from_utf8(target) {
                        Ok(target) => self.add(FileEntry::symlink(path, target))?,
                        Err(_) => self.skip(path, SkipReason::SymlinkTargetNotUtf8),
                    }
                }
                libc::S_IFSOCK => self.skip(path, SkipReason::Socket),
                libc::S_IFIFO => self.skip(path, SkipReason::Fifo),
                libc::S_IFCHR => self.skip(path, SkipReason::CharDevice),
                libc::S_IFBLK => self.skip(path, SkipReason::BlockDevice),
                _ => self.skip(path, SkipReason::Other),
            }
        }
        Ok(())
    }

    fn dir(&mut self, parent: &OwnedFd, name: &CStr, path: String, depth: usize) -> Result<()> {
        if depth > MAX_PATH_COMPONENTS {
            return Err(Error::Limit(format!(
                "{path} is more than {MAX_PATH_COMPONENTS} directories deep"
            )));
        }
        // A symlink swapped in since the look fails here (ELOOP, ENOTDIR).
        let fd = safe_fs::open_dir_at(parent.as_fd(), name).map_err(|e| Error::Changed {
            path: path.clone(),
            what: format!("no longer a directory ({e})"),
        })?;
        let st = safe_fs::fstat(fd.as_fd()).map_err(|e| Error::io(&path, e))?;
        if st.st_dev != self.root_dev {
            self.skip(path, SkipReason::OtherFileSystem);
            return Ok(());
        }
        self.add(FileEntry::dir(path.clone()))?;
        self.walk(&fd, &path, depth)
    }

    fn file(&mut self, dir: &OwnedFd, name: &CStr, path: String) -> Result<()> {
        let (mut file, st) = safe_fs::open_regular_at(dir.as_fd(), name).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData || e.raw_os_error() == Some(libc::ELOOP)
            {
                Error::Changed {
                    path: path.clone(),
                    what: format!("no longer a regular file ({e})"),
                }
            } else {
                Error::io(&path, e)
            }
        })?;
        // What it holds when opened: bytes appended later are the next
        // scan's; a file that shrinks ends where its bytes do.
        let mut remaining = u64::try_from(st.st_size).unwrap_or(0);
        let mut bytes = 0u64;
        let mut chunks = Vec::new();
        while remaining > 0 {
            let want = remaining.min(CHUNK_BYTES) as usize;
            let got =
                read_full(&mut file, &mut self.buf[..want]).map_err(|e| Error::io(&path, e))?;
            if got == 0 {
                break;
            }
            chunks.push(hex::encode(Sha256::digest(&self.buf[..got])));
            bytes += got as u64;
            remaining -= got as u64;
            self.bytes_done += got as u64;
            self.report();
            if got < want {
                break;
            }
        }
        let executable = st.st_mode & 0o111 != 0;
        self.add(FileEntry::file(path, bytes, executable, chunks))?;
        self.files_done += 1;
        self.report();
        Ok(())
    }
}

/// Reads until `buf` is full or the file ends; how much was read.
pub(crate) fn read_full(file: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
