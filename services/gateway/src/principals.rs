//! Who may call the API as an operator (admin or auditor), read once at
//! start: the bootstrap admin token, the auditor token and the named keys
//! of `LH_ADMIN_KEYS_FILE`. Tenants' keys live in the read model instead,
//! because they are issued and revoked by events.
//!
//! A shared token that is short or still a placeholder from the repository
//! is refused at start: such a value is public, so accepting it would hand
//! the platform to anyone who read the manifests.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, ensure, Context as _};
use lh_events::{Operator, OperatorRole};
use sha2::{Digest, Sha256};

/// Shortest shared token accepted, in characters.
pub const MIN_TOKEN_CHARS: usize = 32;
/// Longest shared token accepted, in characters.
pub const MAX_TOKEN_CHARS: usize = 4096;
/// Beginnings of the placeholders the manifests and examples ship with
/// (compared without regard to case).
pub const PLACEHOLDER_PREFIXES: &[&str] = &["replace-me", "dev-", "change-me"];
/// Name under which the bootstrap admin token acts.
pub const BOOTSTRAP_NAME: &str = "bootstrap";
/// Name under which the shared auditor token reads.
pub const SHARED_AUDITOR_NAME: &str = "auditor";
/// Largest named-keys file read, in bytes.
pub const MAX_KEYS_FILE_BYTES: u64 = 1024 * 1024;
/// Most named keys in that file.
pub const MAX_NAMED_KEYS: usize = 10_000;
/// Longest principal name, in characters.
pub const MAX_NAME_CHARS: usize = 128;

/// The operators known at start, by the credential they present.
#[derive(Default)]
pub struct Principals {
    /// SHA-256 of each shared token or named key, and who presents it.
    by_key_sha256: HashMap<[u8; 32], Operator>,
    /// Checks the tokens of an OpenID Connect issuer, when one is configured.
    pub oidc: Option<crate::oidc::Verifier>,
}

impl std::fmt::Debug for Principals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Principals")
            .field("keys", &self.by_key_sha256.len())
            .finish()
    }
}

impl Principals {
    /// The bootstrap admin token and the auditor token (each optional),
    /// checked by [`check_token`], and the named keys of a keys file.
    pub fn new(
        bootstrap_admin: Option<&str>,
        auditor: Option<&str>,
        named_keys: Vec<(Operator, [u8; 32])>,
    ) -> anyhow::Result<Self> {
        let mut principals = Principals::default();
        if let Some(token) = bootstrap_admin {
            check_token("the admin token", token)?;
            principals.insert(
                operator(BOOTSTRAP_NAME, OperatorRole::Admin),
                token_sha256(token),
            )?;
        }
        if let Some(token) = auditor {
            check_token("the auditor token", token)?;
            principals.insert(
                operator(SHARED_AUDITOR_NAME, OperatorRole::Auditor),
                token_sha256(token),
            )?;
        }
        for (who, sha256) in named_keys {
            principals.insert(who, sha256)?;
        }
        Ok(principals)
    }

    fn insert(&mut self, who: Operator, sha256: [u8; 32]) -> anyhow::Result<()> {
        if let Some(earlier) = self.by_key_sha256.insert(sha256, who.clone()) {
            bail!(
                "{} and {} present the same key; give each its own",
                earlier.name,
                who.name
            );
        }
        Ok(())
    }

    pub fn with_oidc(mut self, verifier: crate::oidc::Verifier) -> Self {
        self.oidc = Some(verifier);
        self
    }

    /// The operator presenting `token`, if any. The lookup is by the
    /// token's hash, so its time says nothing about the stored keys.
    pub fn operator(&self, token: &str) -> Option<&Operator> {
        self.by_key_sha256.get(&token_sha256(token))
    }
}

pub fn token_sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn operator(name: &str, role: OperatorRole) -> Operator {
    Operator {
        name: name.to_string(),
        role,
    }
}

/// Refuses a shared token that anyone could guess: too short, too long,
/// or one of the repository's placeholders.
pub fn check_token(what: &str, token: &str) -> anyhow::Result<()> {
    let chars = token.chars().count();
    ensure!(
        chars >= MIN_TOKEN_CHARS,
        "{what} is {chars} characters; it needs at least {MIN_TOKEN_CHARS} \
         (for one: openssl rand -hex 32)"
    );
    ensure!(
        chars <= MAX_TOKEN_CHARS,
        "{what} is longer than {MAX_TOKEN_CHARS} characters"
    );
    let lower = token.to_ascii_lowercase();
    if let Some(p) = PLACEHOLDER_PREFIXES.iter().find(|p| lower.starts_with(*p)) {
        bail!("{what} starts with the placeholder `{p}`; set a random one (openssl rand -hex 32)");
    }
    ensure!(
        !token.chars().any(|c| c.is_whitespace() || c.is_control()),
        "{what} holds whitespace or control characters"
    );
    Ok(())
}

/// Reads a token from a file: its only line, without the line end.
pub fn read_token_file(what: &str, path: &Path) -> anyhow::Result<String> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading {what} from {}", path.display()))?
        .len();
    ensure!(
        len <= MAX_TOKEN_CHARS as u64 + 2,
        "{what} in {} is longer than {MAX_TOKEN_CHARS} characters",
        path.display()
    );
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {what} from {}", path.display()))?;
    Ok(text.trim().to_string())
}

/// Reads named keys: one `name role sha256hex` a line (`role` is `admin`
/// or `auditor`); blank lines and lines starting with `#` are skipped.
/// Only hashes are kept there, so the file reveals no key.
pub fn read_keys_file(path: &Path) -> anyhow::Result<Vec<(Operator, [u8; 32])>> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading named keys from {}", path.display()))?
        .len();
    ensure!(
        len <= MAX_KEYS_FILE_BYTES,
        "{} is larger than {MAX_KEYS_FILE_BYTES} bytes",
        path.display()
    );
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading named keys from {}", path.display()))?;
    parse_keys(&text).with_context(|| format!("in {}", path.display()))
}

pub fn parse_keys(text: &str) -> anyhow::Result<Vec<(Operator, [u8; 32])>> {
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = n + 1;
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, role, sha256] = fields[..] else {
            bail!("line {at}: expected `name role sha256hex`");
        };
        check_name(name).with_context(|| format!("line {at}"))?;
        let role = OperatorRole::parse(role)
            .with_context(|| format!("line {at}: role must be admin or auditor, not {role:?}"))?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(sha256, &mut digest).map_err(|_| {
            anyhow::anyhow!("line {at}: the key must be given as 64 hex digits of its SHA-256")
        })?;
        keys.push((operator(name, role), digest));
        ensure!(
            keys.len() <= MAX_NAMED_KEYS,
            "more than {MAX_NAMED_KEYS} named keys"
        );
    }
    Ok(keys)
}

/// A principal's name as it goes into the log: printable, bounded, and
/// never one of the names the shared tokens act under.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    ensure!(
        !name.is_empty() && name.chars().count() <= MAX_NAME_CHARS,
        "a name must be 1 to {MAX_NAME_CHARS} characters"
    );
    ensure!(
        name.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._@-:".contains(c)),
        "name {name:?} may hold only letters, digits and . _ @ - :"
    );
    ensure!(
        name != BOOTSTRAP_NAME && name != SHARED_AUDITOR_NAME,
        "the name {name:?} belongs to a shared token"
    );
    ensure!(
        !name.starts_with(crate::oidc::NAME_PREFIX),
        "names starting with {} are OIDC principals'",
        crate::oidc::NAME_PREFIX
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn short_and_placeholder_tokens_are_refused() {
        assert!(check_token("t", GOOD).is_ok());
        assert!(check_token("t", &GOOD[1..]).is_err());
        for placeholder in [
            "REPLACE-ME-openssl-rand-hex-32-xxxxxxxxxxxxxx",
            "Replace-Me-0123456789abcdef0123456789",
            "dev-admin-token-change-me-0123456789",
            "DEV-0123456789abcdef0123456789abcdef",
            "change-me-0123456789abcdef0123456789",
            "CHANGE-ME-0123456789abcdef0123456789",
        ] {
            let refused = check_token("the admin token", placeholder).unwrap_err();
            assert!(refused.to_string().contains("placeholder"), "{refused}");
        }
        assert!(check_token("t", "0123456789abcdef 0123456789abcdef").is_err());
    }

    #[test]
    fn the_shared_tokens_act_as_bootstrap_and_auditor() {
        let auditor = format!("{GOOD}-auditor");
        let p = Principals::new(Some(GOOD), Some(&auditor), vec![]).unwrap();
        assert_eq!(
            p.operator(GOOD),
            Some(&operator(BOOTSTRAP_NAME, OperatorRole::Admin))
        );
        assert_eq!(p.operator(&auditor).unwrap().role, OperatorRole::Auditor);
        assert_eq!(p.operator("nobody"), None);
        assert!(Principals::new(Some("dev-admin-token-change-me"), None, vec![]).is_err());
        assert!(Principals::new(None, Some("short"), vec![]).is_err());
    }

    #[test]
    fn named_keys_are_read_from_hashes_and_bad_lines_say_where() {
        let alice = hex::encode(token_sha256("alice-key"));
        let bob = hex::encode(token_sha256("bob-key"));
        let text = format!("# operators\nalice admin {alice}\n\nbob auditor {bob}\n");
        let p = Principals::new(None, None, parse_keys(&text).unwrap()).unwrap();
        assert_eq!(
            p.operator("alice-key"),
            Some(&operator("alice", OperatorRole::Admin))
        );
        assert_eq!(
            p.operator("bob-key"),
            Some(&operator("bob", OperatorRole::Auditor))
        );
        assert_eq!(p.operator(&alice), None, "the hash itself is no key");
        for (bad, says) in [
            (format!("alice root {alice}"), "line 1: role"),
            (format!("alice admin {alice} extra"), "line 1: expected"),
            ("alice admin abc".to_string(), "line 1: the key"),
            (format!("\nbootstrap admin {alice}"), "line 2"),
            (format!("al ice admin {alice}"), "line 1: expected"),
            (format!("al$ice admin {alice}"), "line 1"),
        ] {
            let err = format!("{:#}", parse_keys(&bad).unwrap_err());
            assert!(err.contains(says), "{bad}: {err}");
        }
        let twice = format!("alice admin {alice}\ncarol admin {alice}");
        assert!(Principals::new(None, None, parse_keys(&twice).unwrap()).is_err());
    }
}
