//! The object store the storage tests start: a real SeaweedFS, answering
//! on loopback only, refusing the anonymous, gone when dropped.

use std::time::Duration;

use lh_testkit::S3Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The status line's code of a bare `GET path`, or `None` when nothing
/// answers.
async fn status(port: u16, path: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).await.ok()?;
    std::str::from_utf8(&head[..n])
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The local addresses (`ip:port`, hex as the kernel writes them) of the
/// TCP sockets listening on `port`.
fn listening_on(port: u16) -> Vec<String> {
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state)) = (fields.get(1), fields.get(3)) else {
                continue;
            };
            let Some((_, hex_port)) = local.rsplit_once(':') else {
                continue;
            };
            if *state == "0A" && u16::from_str_radix(hex_port, 16) == Ok(port) {
                found.push(local.to_string());
            }
        }
    }
    found
}

#[tokio::test]
async fn a_store_answers_on_loopback_only_refuses_the_anonymous_and_goes_when_dropped() {
    let mut store = S3Store::start().await.unwrap();
    assert!(store.is_running());
    let port: u16 = store
        .endpoint()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(status(port, "/healthz").await, Some(200));
    // With an identity configured, nobody without a signature gets in.
    assert_eq!(status(port, "/").await, Some(403));
    assert_eq!(status(port, "/lh-anything/key").await, Some(403));

    // Ten ports, each listening on 127.0.0.1 (0100007F) alone; the admin
    // server's come up last.
    let ports = store.ports();
    assert_eq!(ports.len(), 10, "{ports:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while ports.iter().any(|p| listening_on(*p).is_empty()) {
        let silent: Vec<_> = ports
            .iter()
            .filter(|p| listening_on(**p).is_empty())
            .collect();
        assert!(
            std::time::Instant::now() < deadline,
            "nothing listens on {silent:?} of {ports:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for p in &ports {
        let addresses = listening_on(*p);
        assert!(
            addresses.iter().all(|a| a.starts_with("0100007F:")),
            "port {p} listens on {addresses:?}"
        );
    }

    let (access, secret) = store.admin_keys();
    assert!(access.starts_with("LHADMIN") && secret.len() >= 32);
    assert!(!format!("{store:?}").contains(secret));

    drop(store);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while status(port, "/healthz").await.is_some() {
        assert!(std::time::Instant::now() < deadline, "still answering");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
