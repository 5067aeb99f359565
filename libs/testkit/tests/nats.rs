//! The test kit's nats-server: starts on a free port with JetStream, accepts
//! clients, and survives kill + restart with its store.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use lh_testkit::{shared_nats, Nats};
use tokio::io::AsyncBufReadExt;

async fn info_line(port: u16) -> String {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let mut line = String::new();
    tokio::io::BufReader::new(stream)
        .read_line(&mut line)
        .await
        .expect("read INFO");
    line
}

#[tokio::test]
async fn starts_with_jetstream_and_accepts_a_tcp_connection() {
    let nats = Nats::start().await.expect("start nats-server");
    assert_eq!(nats.url(), format!("nats://127.0.0.1:{}", nats.port()));

    let info = info_line(nats.port()).await;
    assert!(info.starts_with("INFO "), "{info}");
    assert!(info.contains("\"jetstream\":true"), "{info}");

    let config = std::fs::read_to_string(nats.config_file()).unwrap();
    assert!(config.contains("sync_interval: always"), "{config}");
    assert!(
        config.contains(&nats.store_dir().display().to_string()),
        "{config}"
    );
    assert!(nats.store_dir().join("jetstream").is_dir());
}

#[tokio::test]
async fn restarts_on_the_same_port_and_keeps_its_store() {
    let mut nats = Nats::start().await.expect("start nats-server");
    let (port, url) = (nats.port(), nats.url());

    let client = async_nats::connect(&url).await.expect("connect");
    let js = jetstream::new(client.clone());
    js.create_stream(stream::Config {
        name: "TESTKIT".into(),
        subjects: vec!["testkit.>".into()],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .expect("create stream");
    js.publish("testkit.one", "kept".into())
        .await
        .expect("publish")
        .await
        .expect("ack");
    drop(js);
    drop(client);

    nats.kill();
    assert!(!nats.is_running());
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err(),
        "port {port} still accepts connections after kill"
    );

    nats.restart().await.expect("restart");
    assert_eq!(nats.port(), port);
    assert_eq!(nats.url(), url);
    assert!(nats.is_running());

    let client = async_nats::connect(&url).await.expect("reconnect");
    let js = jetstream::new(client);
    let mut stream = js
        .get_stream("TESTKIT")
        .await
        .expect("stream survived the restart");
    let info = stream.info().await.expect("stream info");
    assert_eq!(info.state.messages, 1, "the acknowledged message survived");
    let message = stream
        .get_last_raw_message_by_subject("testkit.one")
        .await
        .expect("message");
    assert_eq!(&message.payload[..], b"kept");
}

#[tokio::test]
async fn restart_of_a_running_server_works_too() {
    let mut nats = Nats::start().await.expect("start nats-server");
    let port = nats.port();
    nats.restart().await.expect("restart while running");
    assert_eq!(nats.port(), port);
    assert!(info_line(port).await.contains("\"jetstream\":true"));
}

#[tokio::test]
async fn parallel_servers_get_distinct_ports() {
    let (a, b, c) = tokio::join!(Nats::start(), Nats::start(), Nats::start());
    let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
    assert_ne!(a.port(), b.port());
    assert_ne!(b.port(), c.port());
    assert_ne!(a.port(), c.port());
    assert_ne!(a.store_dir(), b.store_dir());
}

#[tokio::test]
async fn drop_stops_the_server_and_removes_its_directory() {
    let nats = Nats::start().await.expect("start nats-server");
    let (port, store) = (nats.port(), nats.store_dir());
    drop(nats);
    assert!(!store.exists(), "{} left behind", store.display());
    // The port is closed as soon as the killed process is reaped.
    let refused = tokio::time::timeout(Duration::from_secs(2), async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
    })
    .await
    .unwrap_or(false);
    assert!(refused, "port {port} still open after drop");
}

#[tokio::test]
async fn shared_server_is_one_per_test_binary() {
    let a = shared_nats().await;
    let b = shared_nats().await;
    assert!(std::ptr::eq(a, b));
    assert!(info_line(a.port()).await.contains("\"jetstream\":true"));
}
