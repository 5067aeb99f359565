//! What a tenant's workload may carry onto a GPU host. The gateway refuses
//! a request that breaks these rules, and the node-agent applies them again
//! before it runs anything: a log written before the rules existed, or an
//! event forged on the bus, must not reach the container CLI either.
//!
//! * An image is an OCI image reference in the grammar of
//!   `distribution/reference`: `[host[:port]/]path[:tag][@digest]`, path
//!   components in lowercase. Such a reference can never start with `-`,
//!   so the container CLI cannot read it as one of its own flags.
//! * An environment variable must not reconfigure what runs the workload
//!   (the dynamic loader, the container CLI and its daemon, the proxies it
//!   pulls through) nor the devices and caps the agent gives the lease.
//! * Values go into an env file, one `NAME=value` per line: a line break
//!   would smuggle in a second variable.

/// Longest image name (host and path), bytes: `distribution/reference`'s
/// `NameTotalLengthMax`.
pub const MAX_IMAGE_NAME_BYTES: usize = 255;
/// Longest tag, bytes (the grammar's `[\w][\w.-]{0,127}`).
pub const MAX_IMAGE_TAG_BYTES: usize = 128;
/// Shortest and longest digest value, hex digits: at least 128 bits (the
/// grammar's floor), at most a SHA-512.
pub const MIN_DIGEST_HEX_DIGITS: usize = 32;
pub const MAX_DIGEST_HEX_DIGITS: usize = 128;

/// Why a string is not an image reference, for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadImage(&'static str);

/// Checks `image` against the OCI image reference grammar.
pub fn check_image_reference(image: &str) -> Result<(), BadImage> {
    if image.starts_with('-') {
        return Err(BadImage("an image reference cannot start with '-'"));
    }
    let (name_and_tag, digest) = match image.split_once('@') {
        Some((left, digest)) => (left, Some(digest)),
        None => (image, None),
    };
    // A ':' after the last '/' starts the tag; one before it is a port.
    let last_slash = name_and_tag.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name_and_tag[last_slash..].find(':') {
        Some(i) => (
            &name_and_tag[..last_slash + i],
            Some(&name_and_tag[last_slash + i + 1..]),
        ),
        None => (name_and_tag, None),
    };
    if name.is_empty() {
        return Err(BadImage("an image reference needs a name"));
    }
    if name.len() > MAX_IMAGE_NAME_BYTES {
        return Err(BadImage("the image name is longer than 255 bytes"));
    }
    check_name(name)?;
    if let Some(tag) = tag {
        check_tag(tag)?;
    }
    if let Some(digest) = digest {
        check_digest(digest)?;
    }
    Ok(())
}

/// `[domain '/'] path`: the first component is a registry host when there
/// is more than one and it has a '.' or a ':' or is `localhost`, as
/// docker and podman read it.
fn check_name(name: &str) -> Result<(), BadImage> {
    let mut components: Vec<&str> = name.split('/').collect();
    if components.len() > 1 {
        let first = components[0];
        if first.contains(['.', ':']) || first == "localhost" {
            check_domain(first)?;
            components.remove(0);
        }
    }
    for component in components {
        if !is_path_component(component) {
            return Err(BadImage(
                "image path components are lowercase letters and digits, joined by '.', '_', '__' or dashes",
            ));
        }
    }
    Ok(())
}

/// `host[:port]`, the host a DNS name or an IPv4 address (both are dotted
/// components of letters, digits and inner dashes).
fn check_domain(domain: &str) -> Result<(), BadImage> {
    const BAD_HOST: BadImage = BadImage("the image registry must be host[:port]");
    let (host, port) = match domain.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (domain, None),
    };
    let component_ok = |c: &str| {
        !c.is_empty()
            && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !c.starts_with('-')
            && !c.ends_with('-')
    };
    if !host.split('.').all(component_ok) {
        return Err(BAD_HOST);
    }
    if let Some(port) = port {
        let digits_ok =
            !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
        if !digits_ok {
            return Err(BAD_HOST);
        }
    }
    Ok(())
}

/// `[a-z0-9]+ (([._]|__|[-]+) [a-z0-9]+)*`.
fn is_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let separator = &component[start..i];
        let ok = matches!(separator, "." | "_" | "__") || separator.bytes().all(|b| b == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `[\w][\w.-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), BadImage> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let ok = !tag.is_empty()
        && tag.len() <= MAX_IMAGE_TAG_BYTES
        && word(tag.as_bytes()[0])
        && tag.bytes().all(|b| word(b) || b == b'.' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(BadImage(
            "an image tag is 1 to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'",
        ))
    }
}

/// `algorithm:hex`, the algorithm `[A-Za-z][A-Za-z0-9]*` components joined
/// by `+`, `.`, `_` or `-`.
fn check_digest(digest: &str) -> Result<(), BadImage> {
    const BAD_DIGEST: BadImage =
        BadImage("an image digest is algorithm:hex, e.g. sha256:<64 hex digits>");
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err(BAD_DIGEST);
    };
    let algorithm_ok = algorithm.split(['+', '.', '_', '-']).all(|c| {
        c.as_bytes().first().is_some_and(u8::is_ascii_alphabetic)
            && c.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    let hex_ok = (MIN_DIGEST_HEX_DIGITS..=MAX_DIGEST_HEX_DIGITS).contains(&hex.len())
        && hex.bytes().all(|b| b.is_ascii_hexdigit());
    if algorithm_ok && hex_ok {
        Ok(())
    } else {
        Err(BAD_DIGEST)
    }
}

/// Names no tenant may set, exactly (any case): the proxies the container
/// CLI and the workload's pulls would go through, and the devices the agent
/// gives the lease.
const DENIED_ENV_NAMES: [&str; 8] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "FTP_PROXY",
    "CONTAINER_HOST",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
];

/// Prefixes of names no tenant may set (any case), with why.
const DENIED_ENV_PREFIXES: [(&str, &str); 7] = [
    ("LD_", "it configures the dynamic loader"),
    ("DOCKER_", "it configures the container CLI"),
    ("CONTAINERS_", "it configures the container CLI"),
    ("CUDA_MPS_", "the agent sets the GPU sharing limits"),
    ("CUDA_DEVICE_", "the agent sets the GPU sharing limits"),
    ("NVIDIA_", "it configures the NVIDIA container toolkit"),
    ("LEASEHOLD_", "the agent sets the lease's own variables"),
];

/// Why a tenant may not set the variable `name`; `None` when it may.
pub fn denied_env_name(name: &str) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    if DENIED_ENV_NAMES.contains(&upper.as_str()) {
        return Some(if upper.ends_with("_PROXY") {
            "it would route the host's traffic through the tenant's proxy"
        } else if upper == "CONTAINER_HOST" {
            "it configures the container CLI"
        } else {
            "the agent sets the lease's devices"
        });
    }
    DENIED_ENV_PREFIXES
        .iter()
        .find(|(prefix, _)| upper.starts_with(prefix))
        .map(|(_, why)| *why)
}

/// Why `value` cannot go into an env file; `None` when it can. An env file
/// is read line by line (docker and podman split on `\n` and drop a
/// trailing `\r`), and a NUL ends a C string.
pub fn bad_env_value(value: &str) -> Option<&'static str> {
    value
        .contains(['\n', '\r', '\0'])
        .then_some("values cannot hold line breaks or NUL bytes")
}

/// Bytes of the secret salt a workload's environment is hashed with.
pub const ENV_SALT_BYTES: usize = 32;

/// The hash a lease's event carries for its environment: SHA-256 of the
/// salt, then each variable as its name's and value's lengths (u64, big
/// endian) and bytes, in name order. Lengths first, so that no two
/// environments hash the same bytes. The salt is secret (the gateway
/// derives it from the tenant's key), so a guessed value cannot be tested
/// against the log.
pub fn env_digest(
    salt: &[u8; ENV_SALT_BYTES],
    values: &std::collections::BTreeMap<String, String>,
) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(salt);
    for (name, value) in values {
        hash.update((name.len() as u64).to_be_bytes());
        hash.update(name.as_bytes());
        hash.update((value.len() as u64).to_be_bytes());
        hash.update(value.as_bytes());
    }
    hex::encode(hash.finalize())
}

/// Whether `values`, fetched with `salt`, are the environment `env_ref`
/// names; why not, for the lease's failure.
pub fn check_fetched_env(
    env_ref: &lh_events::WorkloadEnvRef,
    salt: &[u8; ENV_SALT_BYTES],
    values: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    if !values.keys().eq(env_ref.names.iter()) {
        return Err("the environment fetched names other variables than the request".into());
    }
    if env_digest(salt, values) != env_ref.sha256 {
        return Err("the environment fetched does not hash to the request's".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_names_that_reconfigure_the_host_when_checked_then_they_are_denied() {
        for name in [
            "LD_PRELOAD",
            "ld_preload",
            "LD_LIBRARY_PATH",
            "LD_AUDIT",
            "DOCKER_HOST",
            "docker_context",
            "DOCKER_CONFIG",
            "CONTAINER_HOST",
            "CONTAINERS_CONF",
            "HTTP_PROXY",
            "https_proxy",
            "No_Proxy",
            "ALL_PROXY",
            "CUDA_VISIBLE_DEVICES",
            "NVIDIA_VISIBLE_DEVICES",
            "NVIDIA_DRIVER_CAPABILITIES",
            "CUDA_MPS_PIPE_DIRECTORY",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "CUDA_DEVICE_MEMORY_LIMIT",
            "CUDA_DEVICE_SM_LIMIT",
            "LEASEHOLD_LEASE_ID",
        ] {
            assert!(denied_env_name(name).is_some(), "{name} allowed");
        }
    }

    #[test]
    fn given_ordinary_names_when_checked_then_they_pass() {
        for name in [
            "PATH",
            "HF_TOKEN",
            "EPOCHS",
            "CUDA_LAUNCH_BLOCKING",
            "LDX",
            "MY_LD_PRELOAD",
            "PROXY",
        ] {
            assert_eq!(denied_env_name(name), None, "{name}");
        }
    }

    #[test]
    fn given_values_with_line_breaks_when_checked_then_they_are_refused() {
        for value in ["a\nLD_PRELOAD=/x.so", "a\r", "a\0b"] {
            assert!(bad_env_value(value).is_some(), "{value:?}");
        }
        assert_eq!(bad_env_value("x=y with spaces, \"quotes\" and $VARS"), None);
    }

    const SHA256: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn given_real_references_when_checked_then_they_pass() {
        let digested = format!("ubuntu@{SHA256}");
        let everything = format!("registry.example.com:5000/team/app_x/img-v2:1.0.0-rc.1@{SHA256}");
        for image in [
            "ubuntu",
            "ubuntu:22.04",
            "library/ubuntu",
            "docker.io/library/ubuntu:latest",
            "nvcr.io/nvidia/pytorch:24.01-py3",
            "localhost/mine",
            "localhost:5000/mine:v1",
            "10.0.0.1:5000/a/b",
            "ghcr.io/o/a__b.c-d---e",
            "python:3",
            "a:_private",
            digested.as_str(),
            everything.as_str(),
        ] {
            assert_eq!(check_image_reference(image), Ok(()), "{image}");
        }
    }

    #[test]
    fn given_hostile_strings_when_checked_then_they_are_refused() {
        let long_name = "a".repeat(MAX_IMAGE_NAME_BYTES + 1);
        let long_tag = format!("ubuntu:{}", "t".repeat(MAX_IMAGE_TAG_BYTES + 1));
        for image in [
            "--volume=/:/host",
            "-v",
            "--privileged",
            "--gpus=all",
            "-",
            "ubuntu --gpus=all",
            "ubuntu\t--privileged",
            "ubuntu\n--privileged",
            " ubuntu",
            "Ubuntu",
            "library/Ubuntu",
            "",
            ":latest",
            "@sha256:00",
            "ubuntu:",
            "ubuntu:-x",
            "ubuntu:.x",
            "ubuntu@sha256:abc",
            "ubuntu@sha256",
            "ubuntu@:0123456789abcdef0123456789abcdef",
            "/ubuntu",
            "ubuntu/",
            "a//b",
            "a/-b",
            "a/b-",
            "a..b",
            "a___b",
            "-registry.io/x",
            "registry.io:port/x",
            "registry.io:123456/x",
            "reg_istry.io/x",
            "ubuntu;rm -rf /",
            "ubuntu$(id)",
            "ubuntu\0",
            long_name.as_str(),
            long_tag.as_str(),
        ] {
            assert!(check_image_reference(image).is_err(), "{image:?} accepted");
        }
    }

    #[test]
    fn given_a_name_of_exactly_the_limit_when_checked_then_it_passes() {
        let name = "a".repeat(MAX_IMAGE_NAME_BYTES);
        assert_eq!(check_image_reference(&name), Ok(()));
        let tag = format!("a:{}", "t".repeat(MAX_IMAGE_TAG_BYTES));
        assert_eq!(check_image_reference(&tag), Ok(()));
    }

    fn env(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_env_digest_depends_on_the_salt_and_on_where_names_end() {
        let salt = [7u8; ENV_SALT_BYTES];
        let a = env_digest(&salt, &env(&[("AB", "C")]));
        assert_eq!(a.len(), 64);
        assert_eq!(a, env_digest(&salt, &env(&[("AB", "C")])));
        assert_ne!(a, env_digest(&salt, &env(&[("A", "BC")])));
        assert_ne!(a, env_digest(&[8u8; ENV_SALT_BYTES], &env(&[("AB", "C")])));
        assert_ne!(
            env_digest(&salt, &env(&[])),
            env_digest(&[8u8; ENV_SALT_BYTES], &env(&[]))
        );
    }

    #[test]
    fn a_fetched_env_must_name_the_same_variables_and_hash_the_same() {
        let salt = [1u8; ENV_SALT_BYTES];
        let values = env(&[("HF_TOKEN", "secret"), ("MODE", "train")]);
        let env_ref = lh_events::WorkloadEnvRef {
            lease_id: uuid::Uuid::nil(),
            names: vec!["HF_TOKEN".into(), "MODE".into()],
            sha256: env_digest(&salt, &values),
        };
        assert_eq!(check_fetched_env(&env_ref, &salt, &values), Ok(()));
        let changed = env(&[("HF_TOKEN", "other"), ("MODE", "train")]);
        assert!(check_fetched_env(&env_ref, &salt, &changed).is_err());
        let more = env(&[("HF_TOKEN", "secret"), ("LD_X", "1"), ("MODE", "train")]);
        assert!(check_fetched_env(&env_ref, &salt, &more).is_err());
        assert!(check_fetched_env(&env_ref, &[2u8; ENV_SALT_BYTES], &values).is_err());
    }
}
