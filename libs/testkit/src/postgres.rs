//! A throw-away PostgreSQL cluster: `initdb` into a temporary directory, a
//! postmaster on a random 127.0.0.1 port, one fresh database per test.

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tempfile::TempDir;
use tokio::sync::OnceCell;

use crate::locate::pg_bin_dir;
use crate::process::{
    restart_on_its_port, start_on_a_free_port, stop_child, Answer, Launch, Server, StartError,
    Watchdog,
};

/// How long a started postmaster may take to accept connections (crash
/// recovery after [`Postgres::kill`] included).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Timeout of one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between readiness probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// The superuser `initdb` creates; trust authentication, no password.
const SUPERUSER: &str = "postgres";
/// Server settings for tests: durability off (a test cluster is thrown
/// away), enough connections for many parallel tests.
const SERVER_SETTINGS: &[&str] = &[
    "listen_addresses=127.0.0.1",
    "fsync=off",
    "max_connections=200",
];

/// One PostgreSQL cluster, its data directory, socket directory and log in a
/// temporary directory that lives as long as this value.
///
/// Tests normally share one cluster per test binary ([`shared_postgres`])
/// and each take a fresh database ([`Postgres::create_database`]). A test
/// that crashes the server owns its own cluster: [`Postgres::kill`] is an
/// immediate shutdown (no checkpoint: the restart runs crash recovery), and
/// [`Postgres::restart`] brings it back on the same port and data. Dropping
/// the value stops the server and removes the directory.
pub struct Postgres {
    port: u16,
    cluster_name: String,
    bin: PathBuf,
    /// `(uid, gid)` of the `postgres` user when the tests run as root.
    run_as: Option<(u32, u32)>,
    child: Option<Child>,
    watchdog: Option<Watchdog>,
    // Declared last: dropped after the server is gone.
    dir: TempDir,
}

impl Postgres {
    /// Runs `initdb` into a new temporary directory and starts the cluster.
    pub async fn start() -> anyhow::Result<Postgres> {
        let bin = pg_bin_dir()?;
        // SAFETY: geteuid(2) cannot fail.
        let run_as = if unsafe { libc::geteuid() } == 0 {
            Some(postgres_user()?)
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("lh-pg-")
            .tempdir()
            .context("creating the PostgreSQL temporary directory")?;
        let mut pg = Postgres {
            port: 0,
            cluster_name: format!("lh_test_{}", uuid::Uuid::new_v4().simple()),
            bin,
            run_as,
            child: None,
            watchdog: None,
            dir,
        };
        std::fs::create_dir(pg.socket_dir()).context("creating the socket directory")?;
        for path in [pg.dir.path(), &pg.socket_dir()] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
            if let Some((uid, gid)) = run_as {
                std::os::unix::fs::chown(path, Some(uid), Some(gid))
                    .with_context(|| format!("chown {} to the postgres user", path.display()))?;
            }
        }
        pg.initdb().await?;

        start_on_a_free_port(&mut pg).await?;
        tracing::info!(url = %pg.admin_url(), dir = %pg.dir.path().display(), "PostgreSQL started");
        Ok(pg)
    }

    /// Creates a fresh, uniquely named database and returns its URL,
    /// `postgres://postgres@127.0.0.1:<port>/<name>`.
    pub async fn create_database(&self) -> anyhow::Result<String> {
        let name = format!("lh_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = self
            .connect_admin()
            .await
            .context("connecting to create a database")?;
        sqlx::raw_sql(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await
            .with_context(|| format!("CREATE DATABASE {name}"))?;
        conn.close().await.ok();
        Ok(self.database_url(&name))
    }

    /// The URL of database `name` on this cluster.
    pub fn database_url(&self, name: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{name}", self.port)
    }

    /// The URL of the `postgres` maintenance database.
    pub fn admin_url(&self) -> String {
        self.database_url("postgres")
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server's log (stdout and stderr, appended across restarts).
    pub fn log_file(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// Whether the postmaster is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Stops the server the way a crash would: SIGQUIT, PostgreSQL's
    /// immediate shutdown (what `pg_ctl -m immediate stop` sends), with no
    /// checkpoint; reaps the postmaster. Does nothing when it is not running.
    pub fn kill(&mut self) {
        self.watchdog = None;
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, libc::SIGQUIT);
            tracing::info!(url = %self.admin_url(), "PostgreSQL stopped (immediate)");
        }
    }

    /// Starts the server again on the same port and data directory (stopping
    /// it first if it still runs) and waits until it accepts connections.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        restart_on_its_port(self).await?;
        tracing::info!(url = %self.admin_url(), "PostgreSQL restarted");
        Ok(())
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    /// A command for one of the server binaries, run as the `postgres` user
    /// when the tests run as root.
    fn command(&self, tool: &str) -> Command {
        let mut command = Command::new(self.bin.join(tool));
        command
            .current_dir(self.dir.path())
            .env("LC_ALL", "C")
            .env("TZ", "UTC")
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            // std drops the supplementary groups, then setgid, then setuid.
            std::os::unix::process::CommandExt::gid(&mut command, gid);
            std::os::unix::process::CommandExt::uid(&mut command, uid);
        }
        command
    }

    async fn initdb(&self) -> anyhow::Result<()> {
        let mut command = tokio::process::Command::from(self.command("initdb"));
        command
            .arg("-D")
            .arg(self.data_dir())
            .args([
                "-A",
                "trust",
                "-U",
                SUPERUSER,
                "--no-sync",
                "-E",
                "UTF8",
                "--no-locale",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let output = command
            .output()
            .await
            .with_context(|| format!("running {}", self.bin.join("initdb").display()))?;
        if !output.status.success() {
            bail!(
                "initdb failed ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// Spawns the postmaster and waits until *our* postmaster (matched by
    /// its unique `cluster_name`) accepts a connection.
    async fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        let mut command = self.command("postgres");
        command
            .arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(self.socket_dir())
            .arg("-c")
            .arg(format!("cluster_name={}", self.cluster_name));
        for setting in SERVER_SETTINGS {
            command.arg("-c").arg(setting);
        }
        let log = self.log_file();
        let launch = Launch {
            name: <Self as Server>::NAME,
            log: &log,
            stop_signal: "QUIT",
            dir: self.dir.path(),
            ready_means: "connection accepted",
            ready_timeout: READY_TIMEOUT,
            probe_timeout: PROBE_TIMEOUT,
            probe_interval: PROBE_INTERVAL,
        };
        let (child, watchdog) = launch
            .spawn_until_ready(command, || async {
                match self.probe_cluster_name().await {
                    Ok(name) if name == self.cluster_name => Answer::Ready,
                    Ok(name) => Answer::Other(name),
                    Err(_) => Answer::NotYet,
                }
            })
            .await?;
        self.child = Some(child);
        self.watchdog = Some(watchdog);
        Ok(())
    }

    async fn probe_cluster_name(&self) -> anyhow::Result<String> {
        let mut conn = self.connect_admin().await?;
        let name: String = sqlx::query_scalar("SELECT current_setting('cluster_name')")
            .fetch_one(&mut conn)
            .await?;
        conn.close().await.ok();
        Ok(name)
    }

    async fn connect_admin(&self) -> anyhow::Result<PgConnection> {
        let options = PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username(SUPERUSER)
            .database("postgres")
            .application_name("lh-testkit")
            .disable_statement_logging();
        Ok(PgConnection::connect_with(&options).await?)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("url", &self.admin_url())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

/// One PostgreSQL cluster per test binary, started on first use; take a
/// fresh database per test with [`Postgres::create_database`]. The cluster
/// outlives every test of the binary and stops when the test process exits
/// (the watchdog, see the crate docs).
///
/// Panics when the cluster cannot be started (the message says why, e.g. to
/// run `make deps`).
pub async fn shared_postgres() -> &'static Postgres {
    static SHARED: OnceCell<Postgres> = OnceCell::const_new();
    SHARED
        .get_or_init(|| async {
            match Postgres::start().await {
                Ok(pg) => pg,
                Err(err) => panic!("starting the shared PostgreSQL cluster failed: {err:#}"),
            }
        })
        .await
}

/// `(uid, gid)` of the `postgres` system user.
fn postgres_user() -> anyhow::Result<(u32, u32)> {
    let name = CString::new(SUPERUSER).expect("no NUL in the user name");
    // SAFETY: getpwnam_r writes into `entry` and `buffer`, both owned here and
    // sized as passed; `found` is null or points at `entry`.
    unsafe {
        let mut entry: libc::passwd = std::mem::zeroed();
        let mut buffer = vec![0 as libc::c_char; 16 * 1024];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(
            name.as_ptr(),
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        );
        if rc != 0 || found.is_null() {
            bail!(
                "running as root, but there is no `postgres` user to run initdb and postgres as \
                 (they refuse to run as root): run `make deps` (apt-get install postgresql creates it)"
            );
        }
        Ok((entry.pw_uid, entry.pw_gid))
    }
}

impl Server for Postgres {
    const NAME: &'static str = "PostgreSQL";

    fn port(&self) -> u16 {
        self.port
    }

    fn set_port(&mut self, port: u16) {
        self.port = port;
    }

    async fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        Postgres::spawn_and_wait(self).await
    }
}
