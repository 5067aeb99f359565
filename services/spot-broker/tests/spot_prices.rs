//! The spot-broker prices each (zone, model) from utilisation on a real
//! nats-server, and publishes again only when the price moves.

use std::time::Duration;

use lh_bus::{Bus, BusConfig, Expect};
use lh_events::*;
use lh_service::{CancellationToken, CommonArgs};
use lh_testkit::Nats;
use uuid::Uuid;

async fn prices(bus: &Bus) -> Vec<SpotPriceSet> {
    let head = bus.last_sequence().await.unwrap();
    let mut feed = bus.feed(&[subject::SPOT_ALL], 1).await.unwrap();
    let mut out = Vec::new();
    while let Some(Ok(e)) = feed.next_within(Duration::from_millis(300)).await {
        if let EventData::SpotPriceSet(p) = e.envelope.data {
            out.push(p);
        }
        if e.sequence >= head {
            break;
        }
    }
    out
}

async fn publish(bus: &Bus, data: EventData) {
    bus.publish(&fixtures::by_owner(data), Expect::Any)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spot_price_follows_utilisation() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    let node = fixtures::node("n1", "z1", 4, fixtures::MODEL, fixtures::MODEL_VRAM_GB);
    publish(
        &bus,
        EventData::NodeEnrolled(fixtures::enrollment_of(&node)),
    )
    .await;
    publish(&bus, EventData::NodeRegistered(node)).await;
    let token = CancellationToken::new();
    let running = lh_spot_broker::start(
        lh_spot_broker::Config {
            interval_ms: 100,
            ..lh_spot_broker::Config::for_test(CommonArgs::for_test(&nats.url()))
        },
        token.clone(),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    for _ in 0..50 {
        seen = prices(&bus).await;
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].price_cny_per_gb_hour.to_string(), "0.1");
    assert_eq!((seen[0].gpus_total, seen[0].gpus_used), (4, 0));

    // Two of four GPUs taken: u = 0.5, price = 0.1 + 0.4 × 0.25 = 0.2.
    publish(
        &bus,
        EventData::NodeGpusAllocated(NodeGpusAllocated::one("n1", Uuid::now_v7(), vec![0, 1])),
    )
    .await;
    for _ in 0..50 {
        seen = prices(&bus).await;
        if seen.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen[1].price_cny_per_gb_hour.to_string(), "0.2");
    assert_eq!(seen[1].utilisation.to_string(), "0.5");
    // Unchanged utilisation publishes nothing more.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(prices(&bus).await.len(), 2);

    // The broker answers what the log holds: the current price and the one before.
    let request = lh_rpc::spot::SpotPricesRequest::default();
    let answer = lh_rpc::spot::call(&bus, &request, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(answer.markets.len(), 1);
    let market = &answer.markets[0];
    assert_eq!(
        (market.zone.as_str(), market.gpu_model.as_str()),
        ("z1", fixtures::MODEL)
    );
    assert_eq!(market.current.price_cny_per_gb_hour.to_string(), "0.2");
    let history: Vec<String> = market
        .history
        .iter()
        .map(|p| p.price_cny_per_gb_hour.to_string())
        .collect();
    assert_eq!(history, ["0.1", "0.2"]);
    token.cancel();
    running.wait().await.unwrap();
}
