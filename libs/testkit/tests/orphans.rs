//! Servers must not outlive the test process, even when it dies without
//! running destructors (the shared servers live in statics that never drop).
//!
//! The test re-runs this test binary as a child that starts the shared
//! PostgreSQL cluster, the shared nats-server and a private one, prints where
//! they are and sleeps; the test SIGKILLs the child and then expects the
//! watchdogs to stop every server and remove every directory.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lh_testkit::{shared_nats, shared_postgres, Nats};

const PROBE_ENV: &str = "LH_TESTKIT_ORPHAN_PROBE";
const PROBE_PREFIX: &str = "ORPHAN-PROBE";

/// The child's part: only does something when started by the test below.
#[tokio::test]
#[ignore = "helper process of servers_die_with_the_test_process"]
async fn orphan_probe() {
    if std::env::var_os(PROBE_ENV).is_none() {
        return;
    }
    let pg = shared_postgres().await;
    let nats = shared_nats().await;
    let private = Nats::start().await.expect("start nats-server");
    let postmaster_pid = std::fs::read_to_string(pg.data_dir().join("postmaster.pid"))
        .expect("postmaster.pid")
        .lines()
        .next()
        .unwrap()
        .to_string();
    println!(
        "{PROBE_PREFIX} {} {} {} {} {} {} {}",
        pg.port(),
        pg.data_dir().parent().unwrap().display(),
        postmaster_pid,
        nats.port(),
        nats.store_dir().parent().unwrap().display(),
        private.port(),
        private.store_dir().parent().unwrap().display(),
    );
    tokio::time::sleep(Duration::from_secs(300)).await;
    drop(private);
}

fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))
        .is_ok()
}

fn process_alive(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => !status
            .lines()
            .any(|line| line.starts_with("State:") && line.contains('Z')),
        Err(_) => false,
    }
}

#[test]
fn servers_die_with_the_test_process() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "orphan_probe",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PROBE_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the probe");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest may have printed `test orphan_probe ... ` on the same line.
            if let Some((_, rest)) = line.split_once(PROBE_PREFIX) {
                let _ = tx.send(
                    rest.split_whitespace()
                        .map(str::to_string)
                        .collect::<Vec<_>>(),
                );
                return;
            }
        }
    });
    let fields = match rx.recv_timeout(Duration::from_secs(180)) {
        Ok(fields) => fields,
        Err(err) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the probe did not report its servers: {err}");
        }
    };
    let pg_port: u16 = fields[0].parse().unwrap();
    let pg_dir = PathBuf::from(&fields[1]);
    let postmaster_pid = fields[2].clone();
    let nats_port: u16 = fields[3].parse().unwrap();
    let nats_dir = PathBuf::from(&fields[4]);
    let private_port: u16 = fields[5].parse().unwrap();
    let private_dir = PathBuf::from(&fields[6]);
    assert!(port_open(pg_port) && port_open(nats_port) && port_open(private_port));
    assert!(process_alive(&postmaster_pid));

    // Die the hard way: no destructor runs.
    child.kill().unwrap();
    child.wait().unwrap();

    let dirs: [&Path; 3] = [&pg_dir, &nats_dir, &private_dir];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ports_closed = !port_open(pg_port) && !port_open(nats_port) && !port_open(private_port);
        let dirs_gone = dirs.iter().all(|dir| !dir.exists());
        let postmaster_gone = !process_alive(&postmaster_pid);
        if ports_closed && dirs_gone && postmaster_gone {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "30 s after the test process died: ports closed {ports_closed}, directories removed \
             {dirs_gone}, postmaster gone {postmaster_gone}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
