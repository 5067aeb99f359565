//! How a service reaches NATS: the server list, stream sizing, who the
//! connection is (credentials read from files the environment names, never
//! from argv) and the TLS it trusts. Everything here is settled before a
//! byte goes to the server, so it is checked here and tested without one.

use std::time::Duration;

use crate::auth;
use crate::error::{BusError, Result};

/// Retention of the business log: the audit trail must outlive a year.
/// A longer age may be configured; a shorter one only where
/// [`BusConfig::allow_short_retention`] says so (tests that run past expiry).
pub const EVENTS_MAX_AGE: Duration = Duration::from_secs(365 * 24 * 3600);
/// Default byte cap of the business log; `discard: new` means the stream
/// refuses writes at the cap instead of evicting audit data.
pub const EVENTS_DEFAULT_MAX_BYTES: i64 = 1024 * 1024 * 1024;
/// Most servers one NATS URL setting may list; a cluster has 3 or 5.
pub const MAX_SERVER_ADDRS: usize = 16;

/// The servers a NATS URL setting names: one address, or the members of a
/// cluster separated by commas (`nats://a:4222,nats://b:4222`). Blanks
/// around each address are ignored; an address without a scheme is
/// `nats://`, without a port 4222.
pub fn server_addrs(nats_url: &str) -> Result<Vec<async_nats::ServerAddr>> {
    let addrs: Vec<&str> = nats_url.split(',').map(str::trim).collect();
    if addrs.len() > MAX_SERVER_ADDRS {
        return Err(BusError::BadServerAddr {
            addr: nats_url.to_string(),
            reason: format!("more than {MAX_SERVER_ADDRS} servers"),
        });
    }
    addrs
        .into_iter()
        .map(|addr| {
            if addr.is_empty() {
                return Err(BusError::BadServerAddr {
                    addr: nats_url.to_string(),
                    reason: "an empty entry in the list".to_string(),
                });
            }
            addr.parse()
                .map_err(|e: std::io::Error| BusError::BadServerAddr {
                    addr: addr.to_string(),
                    reason: e.to_string(),
                })
        })
        .collect()
}

/// Connection settings and stream sizing.
#[derive(Debug, Clone)]
pub struct BusConfig {
    /// One server or a comma-separated list of a cluster's members (see
    /// [`server_addrs`]).
    pub nats_url: String,
    /// Name the connection shows in the server's monitoring.
    pub client_name: String,
    pub events_max_bytes: i64,
    /// R1 locally, R3 in production.
    pub replicas: usize,
    /// How long the business log keeps an event.
    pub events_max_age: Duration,
    /// Accept an `events_max_age` under [`EVENTS_MAX_AGE`]: only tests
    /// that run a log past expiry set it.
    pub allow_short_retention: bool,
    /// Who this connection is to the server.
    pub credentials: Credentials,
    /// TLS to the server, when it has a certificate.
    pub tls: Option<TlsFiles>,
}

/// How a connection proves who it is. Secrets come from files named in
/// the environment, never from the command line (see
/// [`Credentials::from_env`]).
#[derive(Clone, Default)]
pub enum Credentials {
    /// No credentials: only a server without authorization accepts it
    /// (tests, and `make up` before it had users).
    #[default]
    Anonymous,
    /// An nkey seed and the user it belongs to (the user names the inbox
    /// prefix the server lets it read).
    Nkey { user: String, seed: String },
    /// A user and password (a server configured with bcrypt'd passwords).
    Password { user: String, password: String },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The seed and the password never reach a log.
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Nkey { user, .. } => write!(f, "Nkey {{ user: {user:?}, .. }}"),
            Credentials::Password { user, .. } => write!(f, "Password {{ user: {user:?}, .. }}"),
        }
    }
}

/// Environment variable naming the NATS user.
pub const ENV_NATS_USER: &str = "LH_NATS_USER";
/// Environment variable naming the file that holds the user's nkey seed.
pub const ENV_NATS_NKEY_SEED_FILE: &str = "LH_NATS_NKEY_SEED_FILE";
/// Environment variable naming the file that holds the user's password.
pub const ENV_NATS_PASSWORD_FILE: &str = "LH_NATS_PASSWORD_FILE";
/// Environment variable naming the CA file that turns TLS on.
pub const ENV_NATS_CA_FILE: &str = "LH_NATS_CA_FILE";
/// Environment variables naming a client certificate and its key.
pub const ENV_NATS_CLIENT_CERT_FILE: &str = "LH_NATS_CLIENT_CERT_FILE";
pub const ENV_NATS_CLIENT_KEY_FILE: &str = "LH_NATS_CLIENT_KEY_FILE";
/// Largest credentials file read, in bytes (a seed is 58).
pub const MAX_SECRET_FILE_BYTES: u64 = 4096;

/// Command-line options that would carry a NATS secret: refused, because
/// argv is visible to every user of the host (`ps`, /proc).
const SECRET_OPTIONS: &[&str] = &[
    "--nats-password",
    "--nats-seed",
    "--nats-nkey",
    "--nats-creds",
    "--nats-token",
    "--nats-user",
];

/// The files of a TLS connection to NATS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA that signed the server's certificate.
    pub ca_file: std::path::PathBuf,
    /// A client certificate and its key, for a server that verifies clients.
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

fn read_secret(variable: &str, path: &str) -> Result<String> {
    let bad = |reason: String| BusError::BadCredentials(format!("{variable}={path}: {reason}"));
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if meta.len() > MAX_SECRET_FILE_BYTES {
        return Err(bad(format!("over {MAX_SECRET_FILE_BYTES} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(bad("empty".into()));
    }
    Ok(secret.to_string())
}

impl Credentials {
    /// The credentials the environment names: `LH_NATS_USER` with
    /// `LH_NATS_NKEY_SEED_FILE` or `LH_NATS_PASSWORD_FILE`; none when
    /// neither file is named. `args` is the command line, refused when
    /// it carries a secret.
    pub fn from_env(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        for arg in args {
            let option = SECRET_OPTIONS
                .iter()
                .find(|o| arg == **o || arg.starts_with(&format!("{o}=")));
            // The refusal names the option, never the value.
            let what = match option {
                Some(option) => option.to_string(),
                None if arg.starts_with("LH_NATS_PASSWORD=") => "LH_NATS_PASSWORD=".into(),
                None if looks_like_a_seed(&arg) => "a value shaped like an nkey seed".into(),
                None => continue,
            };
            return Err(BusError::BadCredentials(format!(
                "a NATS secret on the command line ({what}); name a file in {ENV_NATS_NKEY_SEED_FILE} or {ENV_NATS_PASSWORD_FILE}"
            )));
        }
        let user = env(ENV_NATS_USER).filter(|u| !u.is_empty());
        let seed_file = env(ENV_NATS_NKEY_SEED_FILE).filter(|p| !p.is_empty());
        let password_file = env(ENV_NATS_PASSWORD_FILE).filter(|p| !p.is_empty());
        let user = match (&user, &seed_file, &password_file) {
            (_, Some(_), Some(_)) => {
                return Err(BusError::BadCredentials(format!(
                    "{ENV_NATS_NKEY_SEED_FILE} and {ENV_NATS_PASSWORD_FILE} are both set; name one"
                )))
            }
            (None, None, None) => return Ok(Credentials::Anonymous),
            (None, _, _) => {
                return Err(BusError::BadCredentials(format!(
                    "{ENV_NATS_USER} is not set; it names the user whose secret is given"
                )))
            }
            (Some(user), _, _) => {
                auth::check_user_name(user).map_err(BusError::BadCredentials)?;
                user.clone()
            }
        };
        if let Some(path) = seed_file {
            let seed = read_secret(ENV_NATS_NKEY_SEED_FILE, &path)?;
            if nkeys::KeyPair::from_seed(&seed).is_err() {
                return Err(BusError::BadCredentials(format!(
                    "{ENV_NATS_NKEY_SEED_FILE}={path}: not an nkey seed"
                )));
            }
            return Ok(Credentials::Nkey { user, seed });
        }
        if let Some(path) = password_file {
            let password = read_secret(ENV_NATS_PASSWORD_FILE, &path)?;
            return Ok(Credentials::Password { user, password });
        }
        Err(BusError::BadCredentials(format!(
            "{ENV_NATS_USER} is set without {ENV_NATS_NKEY_SEED_FILE} or {ENV_NATS_PASSWORD_FILE}"
        )))
    }

    /// The user whose inbox replies arrive in, if there is one.
    pub fn user(&self) -> Option<&str> {
        match self {
            Credentials::Anonymous => None,
            Credentials::Nkey { user, .. } | Credentials::Password { user, .. } => Some(user),
        }
    }
}

/// An nkey user or account seed (`SU…`, `SA…`), 58 base32 characters.
fn looks_like_a_seed(arg: &str) -> bool {
    arg.split(['=', ' ', ':']).any(|word| {
        word.len() == 58
            && word.starts_with('S')
            && word
                .chars()
                .all(|c| c.is_ascii_uppercase() || ('2'..='7').contains(&c))
    })
}

impl TlsFiles {
    /// TLS as the environment names it: on when `LH_NATS_CA_FILE` is set,
    /// with a client certificate when both its variables are.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let set = |name: &str| env(name).filter(|v| !v.is_empty());
        let Some(ca_file) = set(ENV_NATS_CA_FILE) else {
            if set(ENV_NATS_CLIENT_CERT_FILE).is_some() || set(ENV_NATS_CLIENT_KEY_FILE).is_some() {
                return Err(BusError::BadCredentials(format!(
                    "a client certificate without {ENV_NATS_CA_FILE}"
                )));
            }
            return Ok(None);
        };
        let client_cert = match (
            set(ENV_NATS_CLIENT_CERT_FILE),
            set(ENV_NATS_CLIENT_KEY_FILE),
        ) {
            (Some(cert), Some(key)) => Some((cert.into(), key.into())),
            (None, None) => None,
            _ => {
                return Err(BusError::BadCredentials(format!(
                    "{ENV_NATS_CLIENT_CERT_FILE} and {ENV_NATS_CLIENT_KEY_FILE} go together"
                )))
            }
        };
        Ok(Some(TlsFiles {
            ca_file: ca_file.into(),
            client_cert,
        }))
    }
}

impl BusConfig {
    pub fn new(nats_url: impl Into<String>, client_name: impl Into<String>) -> Self {
        Self {
            nats_url: nats_url.into(),
            client_name: client_name.into(),
            events_max_bytes: EVENTS_DEFAULT_MAX_BYTES,
            replicas: 1,
            events_max_age: EVENTS_MAX_AGE,
            allow_short_retention: false,
            credentials: Credentials::Anonymous,
            tls: None,
        }
    }

    /// Where this connection keeps its snapshots (its user's bucket, or its
    /// client name's without credentials) and the key it signs them with
    /// (its nkey, when it has one).
    pub(crate) fn snapshot_keeper(&self) -> Result<crate::snapshots::SnapshotKeeper> {
        let owner = self.credentials.user().unwrap_or(&self.client_name);
        let signer = match &self.credentials {
            Credentials::Nkey { seed, .. } => Some(std::sync::Arc::new(
                nkeys::KeyPair::from_seed(seed)
                    .map_err(|e| BusError::BadCredentials(format!("the nkey seed: {e}")))?,
            )),
            _ => None,
        };
        Ok(crate::snapshots::SnapshotKeeper {
            bucket: crate::snapshots::snapshots_bucket(owner),
            max_bytes: crate::snapshots::snapshots_max_bytes(owner),
            signer,
        })
    }

    /// Where this connection's account sees the log's JetStream API, when
    /// not at its own `$JS.API`: a node agent's user is in an account of
    /// its own that imports the log's reads under
    /// [`auth::NODE_LOG_API_PREFIX`] (docs/adr/028).
    pub fn log_api_prefix(&self) -> Option<&'static str> {
        self.credentials
            .user()
            .filter(|user| auth::is_node_user(user))
            .map(|_| auth::NODE_LOG_API_PREFIX)
    }

    /// The shortest age the business log may keep events for under this
    /// configuration.
    pub fn least_events_max_age(&self) -> Duration {
        if self.allow_short_retention {
            self.events_max_age.min(EVENTS_MAX_AGE)
        } else {
            EVENTS_MAX_AGE
        }
    }

    /// Client options that present these credentials and trust this TLS.
    pub(crate) fn connect_options(&self) -> async_nats::ConnectOptions {
        let mut options = async_nats::ConnectOptions::new();
        match &self.credentials {
            Credentials::Anonymous => {}
            Credentials::Nkey { seed, .. } => options = options.nkey(seed.clone()),
            Credentials::Password { user, password } => {
                options = options.user_and_password(user.clone(), password.clone())
            }
        }
        if let Some(user) = self.credentials.user() {
            // The server lets each user read replies on its own prefix only.
            options = options.custom_inbox_prefix(auth::inbox_prefix(user));
        }
        if let Some(tls) = &self.tls {
            options = options
                .require_tls(true)
                .add_root_certificates(tls.ca_file.clone());
            if let Some((cert, key)) = &tls.client_cert {
                options = options.add_client_certificate(cert.clone(), key.clone());
            }
        }
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nats_url_names_one_server_or_a_list() {
        let one = server_addrs("nats://127.0.0.1:4222").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].host(), "127.0.0.1");
        assert_eq!(one[0].port(), 4222);

        let cluster = server_addrs("nats://a:4222, nats://b:4223 ,c").unwrap();
        let hosts: Vec<(&str, u16)> = cluster.iter().map(|a| (a.host(), a.port())).collect();
        assert_eq!(hosts, [("a", 4222), ("b", 4223), ("c", 4222)]);
    }

    #[test]
    fn a_bad_nats_url_is_refused_with_the_culprit() {
        for bad in ["", "nats://a:4222,", "nats://a:4222,,nats://b:4222"] {
            assert!(
                matches!(server_addrs(bad), Err(BusError::BadServerAddr { .. })),
                "{bad:?} was accepted"
            );
        }
        match server_addrs("nats://a:4222,http://b:80") {
            Err(BusError::BadServerAddr { addr, .. }) => assert_eq!(addr, "http://b:80"),
            other => panic!("a non-NATS scheme was accepted: {other:?}"),
        }
        let too_many = vec!["nats://a:4222"; MAX_SERVER_ADDRS + 1].join(",");
        assert!(server_addrs(&too_many).is_err());
    }
}
