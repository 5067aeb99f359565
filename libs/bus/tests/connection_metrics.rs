//! What a service shows of its NATS connection, on a real nats-server: the
//! connection is up (1) once connected, down (0) while the server is gone
//! and up again after the client reconnects, each step counted by event;
//! and a stream's figures are what it holds, its followers on a cluster
//! current until one is killed, then lagging.

use std::time::Duration;

use lh_bus::{Bus, BusConfig, Expect};
use lh_events::{fixtures, subject};
use lh_testkit::{Nats, NatsCluster};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

const SERVICE: &str = "connection-metrics-test";

/// The value of the series whose line starts with `series`, if shown.
fn value(handle: &PrometheusHandle, series: &str) -> Option<f64> {
    handle
        .render()
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

async fn wait_for(handle: &PrometheusHandle, series: &str, wanted: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while value(handle, series) != Some(wanted) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} is {:?}, not {wanted}, after 30 s:\n{}",
            value(handle, series),
            handle.render()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_connection_gauge_follows_the_server_and_each_event_is_counted() {
    let handle = PrometheusBuilder::new().install_recorder().unwrap();
    let mut nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), SERVICE))
        .await
        .unwrap();
    let connected = format!("lh_nats_connected{{service=\"{SERVICE}\"}}");
    let event = |name: &str| {
        format!("lh_nats_connection_events_total{{service=\"{SERVICE}\",event=\"{name}\"}}")
    };
    wait_for(&handle, &connected, 1.0).await;
    assert_eq!(value(&handle, &event("connected")), Some(1.0));
    assert_eq!(value(&handle, &event("reconnected")), None);

    nats.kill();
    wait_for(&handle, &connected, 0.0).await;
    assert_eq!(value(&handle, &event("disconnected")), Some(1.0));

    nats.restart().await.unwrap();
    wait_for(&handle, &connected, 1.0).await;
    assert_eq!(value(&handle, &event("reconnected")), Some(1.0));
    assert_eq!(
        value(&handle, &event("connected")),
        Some(1.0),
        "a reconnect is not a first connect"
    );

    for _ in 0..3 {
        bus.publish(&fixtures::stop_request(), Expect::Any)
            .await
            .unwrap();
    }
    let _feed = bus.feed(&[subject::EVENTS_ALL], 1).await.unwrap();
    let figures = bus.stream_figures(subject::EVENTS_STREAM).await.unwrap();
    assert_eq!(figures.messages, 3);
    assert!(figures.bytes > 0);
    assert!(figures.consumers >= 1, "{figures:?}");
    assert_eq!(
        (figures.replicas_current, figures.replicas_lagging),
        (0, 0),
        "a single server has no followers"
    );
    let telemetry = bus.stream_figures(subject::TELEMETRY_STREAM).await.unwrap();
    assert_eq!(telemetry.messages, 0);
}

/// Polls the stream's figures until `wanted` says yes, for up to 60 s (a
/// follower is held not current some seconds after it was last heard).
async fn figures_until(
    bus: &Bus,
    stream: &str,
    wanted: impl Fn(&lh_bus::StreamFigures) -> bool,
) -> lh_bus::StreamFigures {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut last = None;
    loop {
        if let Ok(figures) = bus.stream_figures(stream).await {
            if wanted(&figures) {
                return figures;
            }
            last = Some(figures);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{stream} not as wanted within 60 s; last {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_killed_follower_shows_as_lagging_on_a_cluster() {
    let mut cluster = NatsCluster::start().await.unwrap();
    let mut config = BusConfig::new(cluster.urls(), "replica-figures-test");
    config.replicas = 3;
    let bus = Bus::connect(&config).await.unwrap();
    figures_until(&bus, subject::EVENTS_STREAM, |f| {
        (f.replicas_current, f.replicas_lagging) == (2, 0)
    })
    .await;

    let leader = cluster.stream_leader(subject::EVENTS_STREAM).await.unwrap();
    cluster.kill((leader + 1) % cluster.member_count());
    let figures = figures_until(&bus, subject::EVENTS_STREAM, |f| f.replicas_lagging == 1).await;
    assert_eq!(figures.replicas_current, 1, "{figures:?}");
}
