//! Tenants' SSH public keys: what a key must be to be registered
//! ([`parse_public_key`], [`check_name`]) and the keys a tenant's people
//! may sign in with ([`authorized_keys`]), which the SSH endpoint asks on
//! every sign-in, so that a removal or an erasure holds from the moment
//! its request returns. The REST routes are in `http/ssh_keys.rs`, the
//! table's statements in `projection/ssh_keys.rs`.

use ssh_key::public::KeyData;
use ssh_key::{HashAlg, PublicKey};
use uuid::Uuid;

/// Most SSH keys one tenant may have.
pub const MAX_SSH_KEYS_PER_TENANT: i64 = 16;
/// Longest public key accepted, in bytes of its text: a 16,384-bit RSA
/// key is under 3 KiB, so anything longer is not a key anyone uses.
pub const MAX_PUBLIC_KEY_BYTES: usize = 8 * 1024;
/// Most characters of a key's name.
pub const MAX_NAME_CHARS: usize = 64;
/// Smallest RSA modulus accepted: OpenSSH itself refuses shorter ones
/// since 8.8, and 1024 bits are within reach of a well-funded attacker.
pub const MIN_RSA_BITS: usize = 2048;
/// Largest RSA modulus accepted, as OpenSSH's: a larger one only makes
/// each sign-in's verification slower.
pub const MAX_RSA_BITS: usize = 16 * 1024;

/// The algorithms accepted, as they begin a `.pub` line.
pub const ACCEPTED_ALGORITHMS: &[&str] = &[
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
];

/// What a refusal of the algorithm says is accepted instead.
const ACCEPTED: &str = "ssh-ed25519, ecdsa-sha2-nistp256/384/521, or ssh-rsa of 2048 bits or more";

/// One of a tenant's keys, as the SSH endpoint checks a client's key
/// against it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AuthorizedKey {
    pub key_id: Uuid,
    pub name: String,
    /// `SHA256:...`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
    /// The OpenSSH one-line form, without a comment.
    pub public_key: String,
}

/// The keys with which `tenant_id`'s people may sign in, oldest first, as
/// the read model has them now: a removed key or an erased tenant's are
/// gone from it.
pub async fn authorized_keys(
    pool: &sqlx::PgPool,
    tenant_id: Uuid,
) -> Result<Vec<AuthorizedKey>, sqlx::Error> {
    sqlx::query_as(
        "SELECT key_id, name, fingerprint, public_key FROM ssh_keys
         WHERE tenant_id = $1 ORDER BY created_at, key_id",
    )
    .bind(tenant_id)
    .fetch_all(pool)
    .await
}

/// Reads one line of an OpenSSH `.pub` file (`ssh-ed25519 AAAA... comment`)
/// and answers the key in the form the log keeps (algorithm and base64,
/// the comment dropped) and its SHA-256 fingerprint (`SHA256:...`, as
/// `ssh-keygen -l` prints it); or why it is refused, in words for the
/// person who sent it.
pub fn parse_public_key(text: &str) -> Result<(String, String), String> {
    if text.len() > MAX_PUBLIC_KEY_BYTES {
        return Err(format!(
            "a public key is at most {} KiB; this one is {} bytes",
            MAX_PUBLIC_KEY_BYTES / 1024,
            text.len()
        ));
    }
    let line = text.trim();
    if line.contains("PRIVATE KEY") {
        return Err(
            "this is a private key: send the line of its .pub file, and keep the private key to yourself"
                .into(),
        );
    }
    if line.starts_with("---- BEGIN SSH2 PUBLIC KEY") {
        return Err(
            "this is the RFC 4716 form; send the OpenSSH one-line form (`ssh-keygen -i -f FILE` prints it)"
                .into(),
        );
    }
    if line.contains(['\n', '\r']) {
        return Err("send one key, on one line, as a .pub file holds it".into());
    }
    let algorithm = line.split_whitespace().next().unwrap_or_default();
    if !ACCEPTED_ALGORITHMS.contains(&algorithm) {
        // An authorized_keys line: options first, then the key.
        if line
            .split_whitespace()
            .any(|token| ACCEPTED_ALGORITHMS.contains(&token))
        {
            return Err("send the key alone, without authorized_keys options before it".into());
        }
        return Err(if algorithm.is_empty() {
            format!("the public key is empty; accepted are {ACCEPTED}")
        } else {
            format!(
                "{} keys are not accepted; accepted are {ACCEPTED}",
                shorten(algorithm)
            )
        });
    }
    let key = PublicKey::from_openssh(line).map_err(|e| {
        format!("not an OpenSSH public key (`{algorithm} <base64> [comment]`): {e}")
    })?;
    match key.key_data() {
        KeyData::Ed25519(_) | KeyData::Ecdsa(_) => {}
        KeyData::Rsa(rsa) => {
            let bits = rsa.n().as_positive_bytes().map_or(0, |n| {
                let n = n.strip_prefix(&[0]).unwrap_or(n);
                n.first()
                    .map_or(0, |top| n.len() * 8 - top.leading_zeros() as usize)
            });
            if bits < MIN_RSA_BITS {
                return Err(format!(
                    "this RSA key has {bits} bits; at least {MIN_RSA_BITS} are needed \
                     (or use ssh-ed25519: `ssh-keygen -t ed25519`)"
                ));
            }
            if bits > MAX_RSA_BITS {
                return Err(format!(
                    "this RSA key has {bits} bits; at most {MAX_RSA_BITS} are accepted"
                ));
            }
        }
        other => {
            return Err(format!(
                "{} keys are not accepted; accepted are {ACCEPTED}",
                other.algorithm().as_str()
            ))
        }
    }
    let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
    let normalized = PublicKey::new(key.key_data().clone(), "")
        .to_openssh()
        .map_err(|e| format!("the key cannot be written again: {e}"))?;
    Ok((normalized, fingerprint))
}

/// A key's name as kept: `name` without the spaces around it, 1 to
/// [`MAX_NAME_CHARS`] characters, none of them a control character (it is
/// printed in tables and terminals).
pub fn check_name(name: &str) -> Result<String, String> {
    let name = name.trim();
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS {
        return Err(format!(
            "name must be 1 to {MAX_NAME_CHARS} characters, not {chars}"
        ));
    }
    if name.chars().any(char::is_control) {
        return Err("name must be printable: no control characters".into());
    }
    Ok(name.to_string())
}

/// Enough of a refused token to recognise it by, never a whole pasted blob.
fn shorten(token: &str) -> String {
    const MOST: usize = 40;
    if token.chars().count() <= MOST {
        format!("`{token}`")
    } else {
        format!("`{}...`", token.chars().take(MOST).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    /// A key made with `ssh-keygen -t ed25519 -C alice@laptop`, and what
    /// `ssh-keygen -lf` printed for it.
    const ED25519: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICwrvRQo4fBsmsPgL/+PUCnKbEL6OH8oNHiWJMzu55pN alice@laptop";
    const ED25519_FINGERPRINT: &str = "SHA256:+GpunoeWB/eVazFjMdgTnUH4DQSLzW4wBKBHfA3xRbg";

    /// A key of `algorithm` and `bits` made by ssh-keygen in `dir`: its
    /// `.pub` line and the fingerprint `ssh-keygen -lf` prints for it.
    fn keygen(dir: &Path, algorithm: &str, bits: Option<u32>) -> (String, String) {
        let file = dir.join(format!("{algorithm}-{}", bits.unwrap_or(0)));
        let mut command = Command::new("ssh-keygen");
        command.args(["-q", "-N", "", "-C", "someone@somewhere", "-t", algorithm]);
        if let Some(bits) = bits {
            command.args(["-b", &bits.to_string()]);
        }
        let made = command
            .arg("-f")
            .arg(&file)
            .output()
            .expect("ssh-keygen runs (make deps installs openssh-client)");
        assert!(made.status.success(), "{made:?}");
        let listed = Command::new("ssh-keygen")
            .args(["-l", "-E", "sha256", "-f"])
            .arg(file.with_extension("pub"))
            .output()
            .unwrap();
        assert!(listed.status.success(), "{listed:?}");
        // `256 SHA256:... someone@somewhere (ED25519)`
        let listed = String::from_utf8(listed.stdout).unwrap();
        let fingerprint = listed.split_whitespace().nth(1).unwrap().to_string();
        let line = std::fs::read_to_string(file.with_extension("pub")).unwrap();
        (line, fingerprint)
    }

    #[test]
    fn a_fixed_ed25519_key_is_kept_without_its_comment_and_fingerprinted_as_ssh_keygen_does() {
        let (key, fingerprint) = parse_public_key(ED25519).unwrap();
        assert_eq!(
            key,
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICwrvRQo4fBsmsPgL/+PUCnKbEL6OH8oNHiWJMzu55pN"
        );
        assert_eq!(fingerprint, ED25519_FINGERPRINT);
        // The same key pasted with a newline, spaces or another comment
        // is the same key.
        let again = parse_public_key(&format!("  {}  bob@desk\n", &key)).unwrap();
        assert_eq!(again, (key.clone(), fingerprint.clone()));
        assert_eq!(parse_public_key(&key).unwrap(), (key, fingerprint));
    }

    #[test]
    fn keys_made_by_ssh_keygen_are_accepted_with_its_fingerprints() {
        let dir = tempfile::tempdir().unwrap();
        for (algorithm, bits) in [
            ("ed25519", None),
            ("ecdsa", Some(256)),
            ("ecdsa", Some(384)),
            ("ecdsa", Some(521)),
            ("rsa", Some(2048)),
            ("rsa", Some(3072)),
        ] {
            let (line, expected) = keygen(dir.path(), algorithm, bits);
            let (key, fingerprint) = parse_public_key(&line)
                .unwrap_or_else(|e| panic!("{algorithm} {bits:?} refused: {e}"));
            assert_eq!(fingerprint, expected, "{algorithm} {bits:?}");
            assert!(!key.contains("someone@somewhere"), "{key}");
            assert!(line.starts_with(&key), "{line} vs {key}");
            assert_eq!(key.split(' ').count(), 2, "{key}");
        }
    }

    #[test]
    fn a_short_rsa_key_and_other_algorithms_are_refused_saying_what_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let (short, _) = keygen(dir.path(), "rsa", Some(1024));
        let refused = parse_public_key(&short).unwrap_err();
        assert!(refused.contains("1024 bits"), "{refused}");
        assert!(refused.contains("2048"), "{refused}");

        // DSA (ssh-keygen no longer makes them), a security key's and a
        // certificate: each refused by its algorithm, naming the accepted.
        let base64 = ED25519.split(' ').nth(1).unwrap();
        for line in [
            format!("ssh-dss {base64}"),
            format!("sk-ssh-ed25519@openssh.com {base64}"),
            format!("ssh-ed25519-cert-v01@openssh.com {base64}"),
        ] {
            let refused = parse_public_key(&line).unwrap_err();
            assert!(refused.contains("not accepted"), "{line}: {refused}");
            assert!(refused.contains("ssh-ed25519,"), "{refused}");
        }
    }

    #[test]
    fn what_is_not_one_public_key_is_refused_saying_why() {
        let refused = |text: &str| parse_public_key(text).unwrap_err();
        assert!(refused("").contains("empty"));
        assert!(refused("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=\n-----END OPENSSH PRIVATE KEY-----")
            .contains("private key"));
        assert!(
            refused("---- BEGIN SSH2 PUBLIC KEY ----\nAAAA\n---- END SSH2 PUBLIC KEY ----")
                .contains("RFC 4716")
        );
        assert!(refused(&format!("{ED25519}\n{ED25519}")).contains("one line"));
        assert!(refused(&format!("no-pty,from=\"10.0.0.1\" {ED25519}")).contains("options"));
        // The algorithm the text names must be the one its base64 holds.
        let base64 = ED25519.split(' ').nth(1).unwrap();
        assert!(refused(&format!("ssh-rsa {base64}")).contains("not an OpenSSH public key"));
        assert!(refused("ssh-ed25519 AAAA!!!!").contains("not an OpenSSH public key"));
        assert!(refused("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0mxRbV").contains("not an OpenSSH"));
        let long = format!("ssh-rsa {}", "A".repeat(MAX_PUBLIC_KEY_BYTES));
        assert!(refused(&long).contains("at most 8 KiB"));
        // A pasted blob is not echoed whole.
        let blob = "x".repeat(500);
        assert!(refused(&blob).len() < 200);
    }

    #[test]
    fn a_name_is_1_to_64_printable_characters() {
        assert_eq!(check_name("  laptop ").unwrap(), "laptop");
        assert_eq!(check_name("Büro — Schlüssel").unwrap(), "Büro — Schlüssel");
        assert!(check_name(&"é".repeat(64)).is_ok());
        assert!(check_name(&"é".repeat(65)).unwrap_err().contains("1 to 64"));
        assert!(check_name("   ").is_err());
        assert!(check_name("a\u{1b}[31mred")
            .unwrap_err()
            .contains("printable"));
        assert!(check_name("two\nlines").is_err());
    }
}
