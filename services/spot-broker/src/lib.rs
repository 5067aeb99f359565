//! Spot-broker: the spot market. For now it publishes a spot price per
//! (zone, GPU model) from current utilisation, evaluated at a fixed
//! interval and appended only when it changed, so the 365-day log is not
//! filled with repeats. Pricing does not bill from it yet.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use lh_bus::{Bus, Expect};
use lh_domain::fleet::Fleet;
use lh_events::{derived_id, subject, Actor, Envelope, EventData, SpotPriceSet};
use lh_service::{CancellationToken, CommonArgs, Readiness, Running};
use rust_decimal::Decimal;

pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9104";
const SERVICE: &str = "lh-spot-broker";

#[derive(clap::Parser, Debug, Clone)]
#[command(name = "lh-spot-broker", about = "Leasehold spot market")]
pub struct Config {
    #[command(flatten)]
    pub common: CommonArgs,
    /// How often spot prices are evaluated.
    #[arg(long, env = "LH_SPOT_INTERVAL_MS", default_value_t = 30_000)]
    pub interval_ms: u64,
}

pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    let bus = config.common.connect_bus(SERVICE).await?;
    let readiness = Readiness::default();
    let ready = readiness.clone();
    let interval = Duration::from_millis(config.interval_ms.max(10));
    Running::spawn(
        config.common.http_addr_or(DEFAULT_HTTP_ADDR),
        axum::Router::new(),
        readiness,
        shutdown,
        async move { broker(bus, interval, ready).await },
    )
    .await
}

async fn broker(bus: Bus, interval: Duration, ready: Readiness) -> anyhow::Result<()> {
    let mut fleet = Fleet::default();
    let mut published: BTreeMap<(String, String), Decimal> = BTreeMap::new();
    let mut feed = bus
        .feed(
            &[subject::NODES_ALL, subject::LEASES_ALL, subject::SPOT_ALL],
            1,
        )
        .await?;
    let mut caught_up = false;
    let mut tick = tokio::time::interval(interval);
    loop {
        tokio::select! {
            next = feed.next_within(Duration::from_millis(300)) => match next {
                Some(event) => {
                    let event = event?;
                    if let EventData::SpotPriceSet(p) = &event.envelope.data {
                        published.insert((p.zone.clone(), p.gpu_model.clone()), p.price_cny_per_gb_hour);
                    }
                    fleet.apply(event.sequence, &event.envelope.data);
                    if event.pending == 0 { caught_up = true; }
                }
                None => caught_up = true,
            },
            _ = tick.tick(), if caught_up => {
                ready.set(true);
                publish_changes(&bus, &fleet, &mut published, interval).await?;
            }
        }
    }
}

async fn publish_changes(
    bus: &Bus,
    fleet: &Fleet,
    published: &mut BTreeMap<(String, String), Decimal>,
    interval: Duration,
) -> anyhow::Result<()> {
    let now = Utc::now();
    // Two brokers evaluating the same interval derive the same event id, so
    // JetStream keeps one.
    let slot = (now.timestamp_millis() as u128 / interval.as_millis().max(1)).to_string();
    for ((zone, model), (total, used)) in fleet.usage_by_zone_model() {
        let (utilisation, price) = lh_domain::spot::price(total, used);
        let key = (zone.clone(), model.clone());
        if published.get(&key) == Some(&price) {
            continue;
        }
        let data = EventData::SpotPriceSet(SpotPriceSet {
            zone: zone.clone(),
            gpu_model: model.clone(),
            price_cny_per_gb_hour: price,
            utilisation,
            gpus_total: total,
            gpus_used: used,
        });
        let envelope = Envelope::new(Actor::Service(SERVICE.into()), now, data)
            .with_id(derived_id(&["spot", &zone, &model, &slot]));
        bus.publish(&envelope, Expect::Any).await?;
        metrics::counter!("lh_spot_prices_published_total").increment(1);
        tracing::info!(%zone, %model, %price, %utilisation, "spot price set");
        published.insert(key, price);
    }
    Ok(())
}
