//! The gateway's SSH endpoint (docs/adr/030): `ssh -p 2222 <lease>@gateway`
//! with a key the lease's tenant registered opens a shell, runs a command,
//! serves sftp (scp, editors' remote modes) or forwards a port (`-L`) in
//! the lease, each channel a session relayed to the lease's node like the
//! REST API's WebSockets, on the trail the same way.

mod channel;
mod server;

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use lh_service::CancellationToken;
use russh::keys::ssh_key::{self, HashAlg, LineEnding, PrivateKey};

use crate::http::ApiContext;

/// How long a client may take to sign in, and wait after a refusal.
const AUTH_REJECTION: Duration = Duration::from_secs(1);
/// Sign-in attempts per connection.
const MAX_AUTH_ATTEMPTS: usize = 6;
/// A connection with no traffic at all this long is dropped (sessions have
/// their own idle limit; this catches one that never opens a channel).
const CONNECTION_INACTIVITY: Duration = Duration::from_secs(3600);

#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct SshArgs {
    /// Where the SSH endpoint listens; `off` runs none.
    #[arg(long, env = "LH_SSH_ADDR", default_value = "127.0.0.1:2222")]
    pub ssh_addr: String,
    /// The endpoint's host key (OpenSSH format, mode 0600), made on the
    /// first start when missing and kept, so that clients' known_hosts
    /// stay right.
    #[arg(
        long,
        env = "LH_SSH_HOST_KEY_FILE",
        default_value = "ssh_host_ed25519_key"
    )]
    pub ssh_host_key_file: PathBuf,
    /// `HOST[:PORT]` clients reach the endpoint at, for the command `lh
    /// lease get` shows; the listen address when unset.
    #[arg(long, env = "LH_SSH_PUBLIC_ADDR")]
    pub ssh_public_addr: Option<String>,
    /// Most SSH connections held at once; past it a new one is closed.
    #[arg(long, env = "LH_SSH_MAX_CONNECTIONS", default_value_t = 1024)]
    pub ssh_max_connections: usize,
}

impl Default for SshArgs {
    fn default() -> Self {
        SshArgs {
            ssh_addr: "off".into(),
            ssh_host_key_file: "ssh_host_ed25519_key".into(),
            ssh_public_addr: None,
            ssh_max_connections: 1024,
        }
    }
}

impl SshArgs {
    pub fn enabled(&self) -> bool {
        self.ssh_addr != "off"
    }
}

pub use crate::sessions::SshEndpoint;

/// The host key in `path`, made (ed25519) and kept there when missing.
pub fn host_key(path: &Path) -> anyhow::Result<PrivateKey> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let key = PrivateKey::from_openssh(&text)
                .with_context(|| format!("{}: not an OpenSSH private key", path.display()))?;
            let mode =
                std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path)?.permissions());
            anyhow::ensure!(
                mode & 0o077 == 0,
                "{}: readable by others (mode {:o}); make it 600",
                path.display(),
                mode & 0o777
            );
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut seed = [0u8; 32];
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut seed);
            let key = PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&seed));
            let text = key
                .to_openssh(LineEnding::LF)
                .context("encoding the host key")?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("writing the host key {}", path.display()))?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            tracing::info!(path = %path.display(), "made the SSH endpoint's host key");
            Ok(key)
        }
        Err(e) => Err(e).with_context(|| format!("reading the host key {}", path.display())),
    }
}

/// The endpoint, bound and keyed, before it serves.
pub struct Bound {
    pub endpoint: SshEndpoint,
    listener: tokio::net::TcpListener,
    config: Arc<russh::server::Config>,
    max_connections: usize,
}

/// Binds the endpoint with its host key; `None` when off.
pub async fn bind(args: &SshArgs) -> anyhow::Result<Option<Bound>> {
    if !args.enabled() {
        return Ok(None);
    }
    let key = host_key(&args.ssh_host_key_file)?;
    let fingerprint = key.public_key().fingerprint(HashAlg::Sha256).to_string();
    let listener = tokio::net::TcpListener::bind(&args.ssh_addr)
        .await
        .with_context(|| format!("LH_SSH_ADDR {}", args.ssh_addr))?;
    let bound = listener.local_addr()?;
    let (host, port) = match &args.ssh_public_addr {
        Some(public) => match public
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse().ok()?)))
        {
            Some((h, p)) => (h.to_string(), p),
            None => (public.clone(), bound.port()),
        },
        None => (bound.ip().to_string(), bound.port()),
    };
    let config = Arc::new(russh::server::Config {
        keys: vec![key],
        auth_rejection_time: AUTH_REJECTION,
        auth_rejection_time_initial: Some(Duration::ZERO),
        max_auth_attempts: MAX_AUTH_ATTEMPTS,
        inactivity_timeout: Some(CONNECTION_INACTIVITY),
        methods: russh::MethodSet::from(&[russh::MethodKind::PublicKey][..]),
        nodelay: true,
        ..Default::default()
    });
    tracing::info!(addr = %bound, fingerprint = %fingerprint, "SSH endpoint listening");
    Ok(Some(Bound {
        endpoint: SshEndpoint {
            host,
            port,
            host_key_fingerprint: fingerprint,
        },
        listener,
        config,
        max_connections: args.ssh_max_connections,
    }))
}

/// Serves the endpoint until `shutdown`.
pub fn serve(
    bound: Bound,
    ctx: ApiContext,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(server::serve(
        bound.listener,
        bound.config,
        bound.max_connections,
        ctx,
        shutdown,
    ))
}
