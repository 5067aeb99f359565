//! What a tenant may name on its object storage, and where a lease may see
//! it: dataset and workspace names, versions, and the paths they are
//! mounted at inside a workload (docs/adr/031).

/// Longest dataset or workspace name, in bytes.
pub const MAX_NAME_BYTES: usize = 63;
/// Most datasets one lease may mount.
pub const MAX_DATASET_MOUNTS: usize = 8;
/// Most workspaces one lease may mount.
pub const MAX_WORKSPACE_MOUNTS: usize = 4;
/// Longest mount path inside a workload, in bytes.
pub const MAX_MOUNT_PATH_BYTES: usize = 255;

/// Directories a mount may not cover or sit under: the container's own
/// system, which the engine or the platform provides.
const RESERVED_PATHS: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr",
    "/scratch",
];

/// Why a name is refused; `None` for a good one: 1 to 63 bytes of lowercase
/// letters, digits, `-`, `_` and `.`, starting with a letter or digit, as
/// object keys and command lines take them without quoting.
pub fn bad_name(name: &str) -> Option<String> {
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let rest_ok = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !first_ok || !rest_ok {
        return Some(format!(
            "must be 1 to {MAX_NAME_BYTES} of a-z, 0-9, '-', '_' and '.', starting with a letter or digit"
        ));
    }
    None
}

/// Whether `version` is a content address: 64 lowercase hex digits.
pub fn is_version(version: &str) -> bool {
    version.len() == 64
        && version
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Why a mount path is refused; `None` for a good one: absolute, in its
/// plain form (no `.`, `..` or empty parts, no trailing `/`), not the root
/// and not a system directory or anything under one.
pub fn bad_mount_path(path: &str) -> Option<String> {
    if path.len() > MAX_MOUNT_PATH_BYTES {
        return Some(format!("is over {MAX_MOUNT_PATH_BYTES} bytes"));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Some("must be an absolute path".into());
    };
    if rest.is_empty() {
        return Some("cannot be the root".into());
    }
    for part in rest.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Some("must be in plain form: no empty, '.' or '..' parts".into());
        }
        if part
            .bytes()
            .any(|b| b.is_ascii_control() || b == b':' || b == b',')
        {
            return Some("may not hold control characters, ':' or ','".into());
        }
    }
    if let Some(reserved) = RESERVED_PATHS
        .iter()
        .find(|r| path == **r || under(path, r))
    {
        return Some(format!("cannot be at or under {reserved}"));
    }
    None
}

/// Whether `path` lies strictly under `dir`.
pub fn under(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// The first pair of paths that are the same or one inside the other.
pub fn overlapping<'a>(paths: &[&'a str]) -> Option<(&'a str, &'a str)> {
    for (i, a) in paths.iter().enumerate() {
        for b in &paths[i + 1..] {
            if a == b || under(a, b) || under(b, a) {
                return Some((a, b));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_lowercase() {
        for good in ["mnist", "ws", "a", "img-net_2.1", "0day"] {
            assert_eq!(bad_name(good), None, "{good}");
        }
        for bad in ["", "MNIST", "-x", ".x", "a/b", "a b", "é", &"a".repeat(64)] {
            assert!(bad_name(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn versions_are_sha256_hex() {
        assert!(is_version(&"a1".repeat(32)));
        assert!(!is_version(&"A1".repeat(32)));
        assert!(!is_version("a1"));
        assert!(!is_version(&"g1".repeat(32)));
    }

    #[test]
    fn mount_paths_are_plain_and_away_from_the_system() {
        for good in ["/data", "/workspace", "/home/me/ckpt", "/mnt/a.b"] {
            assert_eq!(bad_mount_path(good), None, "{good}");
        }
        for bad in [
            "data",
            "/",
            "/data/",
            "/a//b",
            "/a/./b",
            "/a/../etc",
            "/proc",
            "/etc/x",
            "/dev/shm",
            "/usr/local/data",
            "/scratch/x",
            "/a:ro",
            "/a,b",
            "/a\nb",
        ] {
            assert!(bad_mount_path(bad).is_some(), "{bad:?}");
        }
        // A name that merely begins like a system directory is fine.
        assert_eq!(bad_mount_path("/etcetera"), None);
    }

    #[test]
    fn overlapping_mounts_are_found() {
        assert_eq!(overlapping(&["/data", "/work"]), None);
        assert_eq!(overlapping(&["/data", "/data2"]), None);
        assert_eq!(
            overlapping(&["/data", "/data/x"]),
            Some(("/data", "/data/x"))
        );
        assert_eq!(overlapping(&["/w", "/d", "/w"]), Some(("/w", "/w")));
    }
}
