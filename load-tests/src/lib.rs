//! Load harnesses for Leasehold. Each binary starts the servers it needs on
//! loopback, runs a bounded amount of work and prints its figures with the
//! method, so results in docs/benchmarks.md can be reproduced.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;

/// A nats-server with JetStream on loopback, fsyncing every write
/// (`sync_interval: always`, as production runs) or with the server's lazy
/// default; stopped on drop.
pub struct NatsServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts one on a free port, its store in a temporary directory.
    pub fn start(sync_always: bool) -> anyhow::Result<NatsServer> {
        let dir = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let sync = if sync_always {
            "  sync_interval: always\n"
        } else {
            ""
        };
        let conf = dir.path().join("nats.conf");
        std::fs::write(
            &conf,
            format!(
                "host: 127.0.0.1\nport: {port}\njetstream {{\n  store_dir: \"{}\"\n{sync}}}\n",
                dir.path().join("store").display()
            ),
        )?;
        let child = Command::new(lh_testkit::nats_server_binary()?)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting nats-server")?;
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(NatsServer {
                    child,
                    port,
                    _dir: dir,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        anyhow::bail!("nats-server did not start")
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub mod money_month;
