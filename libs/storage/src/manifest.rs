//! A directory tree as data: each file's size, mode bit and chunks, each
//! directory, each symlink's target. Serialized canonically (entries sorted
//! by path, fields in a fixed order) so that the SHA-256 of its JSON is a
//! stable content address for the whole tree.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Files are cut into chunks of this size (the last one shorter), each
/// stored once under the name of its SHA-256: an upload resumes by
/// skipping chunks that are there, and a chunk two files share is sent
/// once.
pub const CHUNK_BYTES: u64 = 8 * 1024 * 1024;
/// Entries (files, directories, symlinks) in one manifest.
pub const MAX_FILES: usize = 1_000_000;
/// A path's length, as Linux's `PATH_MAX`.
pub const MAX_PATH_BYTES: usize = 4096;
/// Components in a path: how deep a tree may be.
pub const MAX_PATH_COMPONENTS: usize = 256;
/// A symlink's target, as Linux's `PATH_MAX`.
pub const MAX_SYMLINK_TARGET_BYTES: usize = 4096;
/// A manifest's JSON: about 250 bytes an entry at [`MAX_FILES`], and 67
/// more for each chunk (10 TB of files are 1.2 million chunks).
pub const MAX_MANIFEST_BYTES: u64 = 256 * 1024 * 1024;
/// Hex characters in a chunk's name.
const CHUNK_NAME_CHARS: usize = 64;

/// What [`Manifest::validate`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManifestLimits {
    pub max_files: usize,
    pub max_path_bytes: usize,
    pub max_components: usize,
}

impl Default for ManifestLimits {
    fn default() -> Self {
        ManifestLimits {
            max_files: MAX_FILES,
            max_path_bytes: MAX_PATH_BYTES,
            max_components: MAX_PATH_COMPONENTS,
        }
    }
}

/// A tree of files; see the module's documentation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub files: Vec<FileEntry>,
}

/// One entry, at a path relative to the tree's root, `/`-separated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub path: String,
    pub kind: EntryKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum EntryKind {
    File {
        bytes: u64,
        executable: bool,
        /// Hex SHA-256 of each chunk, in order.
        chunks: Vec<String>,
    },
    Dir,
    /// Kept as data: nothing on our side follows it.
    Symlink {
        target: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("path {path:?}: {why}")]
    Path { path: String, why: &'static str },
    #[error("path {0:?} appears twice")]
    Duplicate(String),
    #[error("{path:?}: its parent {parent:?} is not a directory of the manifest")]
    Parent { path: String, parent: String },
    #[error("{path:?}: chunk {chunk:?} is not 64 lowercase hex characters")]
    ChunkName { path: String, chunk: String },
    #[error("{path:?}: {bytes} bytes need {expected} chunks, not {chunks}")]
    ChunkCount {
        path: String,
        bytes: u64,
        expected: u64,
        chunks: usize,
    },
    #[error("{path:?}: symlink target {why}")]
    Target { path: String, why: &'static str },
    #[error("{count} entries, more than {max}")]
    TooManyFiles { count: usize, max: usize },
    #[error("the files' sizes add up past 2^64 bytes")]
    TooManyBytes,
    #[error("{bytes} bytes of JSON, more than {max}")]
    TooLarge { bytes: u64, max: u64 },
    #[error("not a manifest: {0}")]
    Json(String),
}

impl FileEntry {
    pub fn file(
        path: impl Into<String>,
        bytes: u64,
        executable: bool,
        chunks: Vec<String>,
    ) -> Self {
        FileEntry {
            path: path.into(),
            kind: EntryKind::File {
                bytes,
                executable,
                chunks,
            },
        }
    }

    pub fn dir(path: impl Into<String>) -> Self {
        FileEntry {
            path: path.into(),
            kind: EntryKind::Dir,
        }
    }

    pub fn symlink(path: impl Into<String>, target: impl Into<String>) -> Self {
        FileEntry {
            path: path.into(),
            kind: EntryKind::Symlink {
                target: target.into(),
            },
        }
    }
}

/// The length of chunk `index` of a file of `bytes` bytes.
pub fn chunk_len(bytes: u64, index: usize) -> u64 {
    let start = index as u64 * CHUNK_BYTES;
    bytes.saturating_sub(start).min(CHUNK_BYTES)
}

/// The regular files in a manifest (not its directories or symlinks).
pub fn file_count(manifest: &Manifest) -> u64 {
    manifest
        .files
        .iter()
        .filter(|f| matches!(f.kind, EntryKind::File { .. }))
        .count() as u64
}

/// Whether `name` can be a chunk's name: 64 lowercase hex characters.
pub fn is_chunk_name(name: &str) -> bool {
    name.len() == CHUNK_NAME_CHARS && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[derive(Serialize)]
struct Canonical<'a> {
    files: Vec<&'a FileEntry>,
}

impl Manifest {
    /// A manifest of these entries, sorted.
    pub fn new(mut files: Vec<FileEntry>) -> Manifest {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Manifest { files }
    }

    /// The JSON whose hash is the manifest's digest: entries sorted by
    /// path (bytewise), whatever order `files` is in.
    pub fn canonical_json(&self) -> Vec<u8> {
        let mut files: Vec<&FileEntry> = self.files.iter().collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        serde_json::to_vec(&Canonical { files }).expect("a manifest always serializes")
    }

    /// Hex SHA-256 of [`Self::canonical_json`].
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(self.canonical_json()))
    }

    /// Parses JSON (canonical or not); does not validate.
    pub fn from_json(json: &[u8]) -> Result<Manifest, ManifestError> {
        if json.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge {
                bytes: json.len() as u64,
                max: MAX_MANIFEST_BYTES,
            });
        }
        serde_json::from_slice(json).map_err(|e| ManifestError::Json(e.to_string()))
    }

    /// The files' bytes added up (saturating: [`Self::validate`] refuses
    /// an overflow).
    pub fn total_bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|f| match &f.kind {
                EntryKind::File { bytes, .. } => *bytes,
                _ => 0,
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Every chunk named, once.
    pub fn chunk_set(&self) -> BTreeSet<&str> {
        self.files
            .iter()
            .flat_map(|f| match &f.kind {
                EntryKind::File { chunks, .. } => chunks.as_slice(),
                _ => &[],
            })
            .map(String::as_str)
            .collect()
    }

    /// Refuses what cannot be written safely under a directory: absolute
    /// paths, `..`, `.` or empty components, NUL, duplicates, an entry
    /// whose parent is not a directory of the manifest (so that nothing is
    /// ever written through a symlink or into a file), malformed chunk
    /// names, a chunk count that does not fit the size, and anything past
    /// the limits.
    pub fn validate(&self, limits: &ManifestLimits) -> Result<(), ManifestError> {
        if self.files.len() > limits.max_files {
            return Err(ManifestError::TooManyFiles {
                count: self.files.len(),
                max: limits.max_files,
            });
        }
        let mut kinds: HashMap<&str, &EntryKind> = HashMap::with_capacity(self.files.len());
        for entry in &self.files {
            validate_path(&entry.path, limits)?;
            if kinds.insert(&entry.path, &entry.kind).is_some() {
                return Err(ManifestError::Duplicate(entry.path.clone()));
            }
        }
        let mut total: u64 = 0;
        for entry in &self.files {
            let path = &entry.path;
            if let Some((parent, _)) = path.rsplit_once('/') {
                if !matches!(kinds.get(parent), Some(EntryKind::Dir)) {
                    return Err(ManifestError::Parent {
                        path: path.clone(),
                        parent: parent.to_owned(),
                    });
                }
            }
            match &entry.kind {
                EntryKind::File { bytes, chunks, .. } => {
                    let expected = bytes.div_ceil(CHUNK_BYTES);
                    if expected != chunks.len() as u64 {
                        return Err(ManifestError::ChunkCount {
                            path: path.clone(),
                            bytes: *bytes,
                            expected,
                            chunks: chunks.len(),
                        });
                    }
                    if let Some(bad) = chunks.iter().find(|c| !is_chunk_name(c)) {
                        return Err(ManifestError::ChunkName {
                            path: path.clone(),
                            chunk: bad.clone(),
                        });
                    }
                    total = total
                        .checked_add(*bytes)
                        .ok_or(ManifestError::TooManyBytes)?;
                }
                EntryKind::Dir => {}
                EntryKind::Symlink { target } => {
                    let why = if target.is_empty() {
                        Some("is empty")
                    } else if target.len() > MAX_SYMLINK_TARGET_BYTES {
                        Some("is too long")
                    } else if target.contains('\0') {
                        Some("contains NUL")
                    } else {
                        None
                    };
                    if let Some(why) = why {
                        return Err(ManifestError::Target {
                            path: path.clone(),
                            why,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

fn validate_path(path: &str, limits: &ManifestLimits) -> Result<(), ManifestError> {
    let refuse = |why| {
        Err(ManifestError::Path {
            path: path.to_owned(),
            why,
        })
    };
    if path.is_empty() {
        return refuse("is empty");
    }
    if path.len() > limits.max_path_bytes {
        return refuse("is too long");
    }
    if path.contains('\0') {
        return refuse("contains NUL");
    }
    if path.starts_with('/') {
        return refuse("is absolute");
    }
    let mut depth = 0;
    for component in path.split('/') {
        depth += 1;
        match component {
            "" => return refuse("has an empty component"),
            "." => return refuse("has a `.` component"),
            ".." => return refuse("has a `..` component"),
            _ => {}
        }
    }
    if depth > limits.max_components {
        return refuse("is too deep");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn sample() -> Manifest {
        Manifest {
            files: vec![
                FileEntry::symlink("d/link", "../x"),
                FileEntry::file("x", 3, true, vec![A.into()]),
                FileEntry::dir("d"),
                FileEntry::file("d/empty", 0, false, vec![]),
            ],
        }
    }

    fn refused(files: Vec<FileEntry>) -> ManifestError {
        Manifest { files }
            .validate(&ManifestLimits::default())
            .expect_err("refused")
    }

    #[test]
    fn the_canonical_form_sorts_by_path_and_its_digest_is_stable() {
        let manifest = sample();
        manifest.validate(&ManifestLimits::default()).unwrap();
        let json = String::from_utf8(manifest.canonical_json()).unwrap();
        assert_eq!(
            json,
            r#"{"files":[{"path":"d","kind":"dir"},{"path":"d/empty","kind":{"file":{"bytes":0,"executable":false,"chunks":[]}}},{"path":"d/link","kind":{"symlink":{"target":"../x"}}},{"path":"x","kind":{"file":{"bytes":3,"executable":true,"chunks":["aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]}}}]}"#
        );
        // `printf '%s' "$json" | sha256sum`, computed outside this code.
        assert_eq!(
            manifest.digest(),
            "b4bc4425531220dec3d8b9c6e8bc133ae8c364ebfb548470e2c53046f7916e5d"
        );
        // Order in memory does not matter; content does.
        let mut shuffled = sample();
        shuffled.files.reverse();
        assert_eq!(shuffled.digest(), manifest.digest());
        assert_eq!(Manifest::new(shuffled.files.clone()).files[0].path, "d");
        let mut changed = sample();
        changed.files[1] = FileEntry::file("x", 3, false, vec![A.into()]);
        assert_ne!(changed.digest(), manifest.digest());
        // And it reads back as it was.
        let back = Manifest::from_json(json.as_bytes()).unwrap();
        assert_eq!(back.digest(), manifest.digest());
    }

    #[test]
    fn totals_and_chunks() {
        let mut manifest = sample();
        manifest.files.push(FileEntry::file(
            "y",
            CHUNK_BYTES + 1,
            false,
            vec![A.into(), B.into()],
        ));
        assert_eq!(manifest.total_bytes(), CHUNK_BYTES + 4);
        assert_eq!(file_count(&manifest), 3);
        assert_eq!(manifest.chunk_set().into_iter().collect::<Vec<_>>(), [A, B]);
        assert_eq!(chunk_len(CHUNK_BYTES + 1, 0), CHUNK_BYTES);
        assert_eq!(chunk_len(CHUNK_BYTES + 1, 1), 1);
        manifest.validate(&ManifestLimits::default()).unwrap();
    }

    #[test]
    fn paths_that_could_leave_the_root_are_refused() {
        for bad in [
            "/etc/passwd",
            "..",
            "a/../../etc",
            "a/./b",
            ".",
            "a//b",
            "a/",
            "",
            "a\0b",
        ] {
            let error = refused(vec![
                FileEntry::dir("a"),
                FileEntry::file(bad, 0, false, vec![]),
            ]);
            assert!(
                matches!(error, ManifestError::Path { .. }),
                "{bad:?}: {error}"
            );
        }
        let long = "x".repeat(MAX_PATH_BYTES + 1);
        assert!(matches!(
            refused(vec![FileEntry::dir(long)]),
            ManifestError::Path {
                why: "is too long",
                ..
            }
        ));
        let deep = vec!["d"; MAX_PATH_COMPONENTS + 1].join("/");
        let limits = ManifestLimits {
            max_path_bytes: usize::MAX,
            ..Default::default()
        };
        let mut files: Vec<FileEntry> = (1..=MAX_PATH_COMPONENTS + 1)
            .map(|n| FileEntry::dir(vec!["d"; n].join("/")))
            .collect();
        files.push(FileEntry::file(format!("{deep}/f"), 0, false, vec![]));
        assert!(Manifest { files }.validate(&limits).is_err());
    }

    #[test]
    fn nothing_is_written_through_a_symlink_or_into_a_file() {
        // A symlink to /etc and a file "under" it would write /etc/passwd.
        let error = refused(vec![
            FileEntry::symlink("a", "/etc"),
            FileEntry::file("a/passwd", 0, false, vec![]),
        ]);
        assert!(matches!(error, ManifestError::Parent { .. }), "{error}");
        let error = refused(vec![
            FileEntry::file("a", 0, false, vec![]),
            FileEntry::dir("a/b"),
        ]);
        assert!(matches!(error, ManifestError::Parent { .. }), "{error}");
        // A parent must be listed.
        let error = refused(vec![FileEntry::file("missing/f", 0, false, vec![])]);
        assert!(matches!(error, ManifestError::Parent { .. }), "{error}");
    }

    #[test]
    fn duplicates_chunks_and_counts_are_checked() {
        assert!(matches!(
            refused(vec![
                FileEntry::dir("a"),
                FileEntry::file("a", 0, false, vec![])
            ]),
            ManifestError::Duplicate(_)
        ));
        assert!(matches!(
            refused(vec![FileEntry::file("f", 1, false, vec![A.to_uppercase()])]),
            ManifestError::ChunkName { .. }
        ));
        assert!(matches!(
            refused(vec![FileEntry::file("f", 1, false, vec!["../../x".into()])]),
            ManifestError::ChunkName { .. }
        ));
        assert!(matches!(
            refused(vec![FileEntry::file("f", 1, false, vec![])]),
            ManifestError::ChunkCount { .. }
        ));
        assert!(matches!(
            refused(vec![FileEntry::file("f", 0, false, vec![A.into()])]),
            ManifestError::ChunkCount { .. }
        ));
        assert!(matches!(
            refused(vec![FileEntry::file(
                "f",
                CHUNK_BYTES + 1,
                false,
                vec![A.into()]
            )]),
            ManifestError::ChunkCount { .. }
        ));
        assert!(matches!(
            refused(vec![FileEntry::symlink("l", "")]),
            ManifestError::Target { .. }
        ));
        let limits = ManifestLimits {
            max_files: 2,
            ..Default::default()
        };
        let three = Manifest::new(vec![
            FileEntry::dir("a"),
            FileEntry::dir("b"),
            FileEntry::dir("c"),
        ]);
        assert!(matches!(
            three.validate(&limits),
            Err(ManifestError::TooManyFiles { count: 3, max: 2 })
        ));
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(Manifest::from_json(br#"{"files":[],"extra":1}"#).is_err());
        assert!(Manifest::from_json(br#"{"files":[{"path":"a","kind":"dir","mode":7}]}"#).is_err());
    }
}
