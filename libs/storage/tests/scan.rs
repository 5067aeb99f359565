//! Scanning a directory an untrusted container wrote, and writing one
//! from a manifest it may have forged: nothing outside the root is read
//! or written.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::sync::atomic::{AtomicU64, Ordering};

use lh_storage::{
    download, scan_dir, Credentials, EntryKind, Error, FileEntry, Manifest, NoProgress,
    ProgressEvent, SkipReason, StoreConfig, TenantStore,
};

#[test]
fn a_scan_never_follows_a_symlink_nor_opens_a_special_file() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("secret"),
        b"TOP SECRET, outside the root",
    )
    .unwrap();
    std::fs::create_dir(outside.path().join("dir")).unwrap();
    std::fs::write(outside.path().join("dir/more"), b"also outside").unwrap();

    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir(r.join("d")).unwrap();
    std::fs::write(r.join("d/f"), b"inside").unwrap();
    symlink(outside.path().join("secret"), r.join("link-to-file")).unwrap();
    // A directory as the container sees it, swapped for a symlink to one
    // outside: recorded as a symlink, never entered.
    symlink(outside.path().join("dir"), r.join("d/swapped")).unwrap();
    symlink("../../etc", r.join("d/relative")).unwrap();
    let fifo = std::ffi::CString::new(r.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let _socket = std::os::unix::net::UnixListener::bind(r.join("sock")).unwrap();
    std::fs::write(r.join(OsStr::from_bytes(b"not-utf8-\xff")), b"x").unwrap();

    let read = AtomicU64::new(0);
    let progress = |e: ProgressEvent| read.store(e.bytes_done, Ordering::Relaxed);
    let scan = scan_dir(r, &progress).unwrap();
    let entries: Vec<(&str, &EntryKind)> = scan
        .manifest
        .files
        .iter()
        .map(|f| (f.path.as_str(), &f.kind))
        .collect();
    let outside_dir = outside.path().join("dir").display().to_string();
    let outside_secret = outside.path().join("secret").display().to_string();
    assert_eq!(entries.len(), 5, "{entries:?}");
    assert_eq!(entries[0], ("d", &EntryKind::Dir));
    assert!(matches!(
        entries[1],
        ("d/f", EntryKind::File { bytes: 6, .. })
    ));
    assert_eq!(
        entries[2],
        (
            "d/relative",
            &EntryKind::Symlink {
                target: "../../etc".into()
            }
        )
    );
    assert_eq!(
        entries[3],
        (
            "d/swapped",
            &EntryKind::Symlink {
                target: outside_dir
            }
        )
    );
    assert_eq!(
        entries[4],
        (
            "link-to-file",
            &EntryKind::Symlink {
                target: outside_secret
            }
        )
    );
    // Only d/f's six bytes were ever read.
    assert_eq!(read.load(Ordering::Relaxed), 6);
    assert_eq!(scan.manifest.total_bytes(), 6);

    let mut skipped: Vec<(String, SkipReason)> = scan
        .skipped
        .iter()
        .map(|s| (s.path.clone(), s.reason))
        .collect();
    skipped.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        skipped,
        [
            ("fifo".to_owned(), SkipReason::Fifo),
            ("not-utf8-\u{fffd}".to_owned(), SkipReason::NameNotUtf8),
            ("sock".to_owned(), SkipReason::Socket),
        ]
    );
    assert_eq!(scan.skipped_total, 3);

    // The root itself may not be a symlink.
    let linked_root = tempfile::tempdir().unwrap();
    symlink(r, linked_root.path().join("root")).unwrap();
    assert!(scan_dir(&linked_root.path().join("root"), &NoProgress).is_err());
}

#[test]
fn a_scan_refuses_to_go_deeper_than_its_limit() {
    let root = tempfile::tempdir().unwrap();
    let mut dir = std::fs::File::open(root.path()).unwrap();
    for _ in 0..=lh_storage::MAX_PATH_COMPONENTS {
        use std::os::fd::AsRawFd;
        let name = std::ffi::CString::new("d").unwrap();
        // SAFETY: valid descriptor and name.
        unsafe {
            assert_eq!(libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755), 0);
            let fd = libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            );
            assert!(fd >= 0);
            dir = std::os::fd::FromRawFd::from_raw_fd(fd);
        }
    }
    let error = scan_dir(root.path(), &NoProgress).unwrap_err();
    assert!(matches!(error, Error::Limit(_)), "{error}");
}

#[tokio::test]
async fn a_forged_manifest_writes_nothing_outside_the_destination() {
    // Refused before any request: the store is never reached.
    let nowhere = StoreConfig::new("http://127.0.0.1:9");
    let store = TenantStore::new(&nowhere, "lh-t-x", &Credentials::new("k", "s")).unwrap();
    let dest = tempfile::tempdir().unwrap();
    let victim = tempfile::tempdir().unwrap();
    let chunk = "a".repeat(64);
    let forged = [
        vec![
            FileEntry::symlink("escape", victim.path().display().to_string()),
            FileEntry::file("escape/planted", 1, false, vec![chunk.clone()]),
        ],
        vec![FileEntry::file("../planted", 1, false, vec![chunk.clone()])],
        vec![FileEntry::file(
            victim.path().join("planted").display().to_string(),
            1,
            false,
            vec![chunk.clone()],
        )],
    ];
    for files in forged {
        let error = download(&store, &Manifest { files }, dest.path(), &NoProgress)
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Manifest(_)), "{error}");
    }
    assert_eq!(std::fs::read_dir(dest.path()).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(victim.path()).unwrap().count(), 0);
}
