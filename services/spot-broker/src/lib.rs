//! Spot-broker: the spot market. For now it publishes a spot price per
//! (zone, GPU model) from current utilisation, evaluated at a fixed
//! interval and appended only when it changed, so the 365-day log is not
//! filled with repeats. Pricing does not bill from it yet.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::Expect;
use lh_domain::fleet::Fleet;
use lh_events::{derived_id, subject, Actor, Envelope, EventData, SpotPriceSet};
use lh_service::decider::{self, Batch, Decider, Pace};
use lh_service::{CancellationToken, CommonArgs, Running};
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
    let interval = Duration::from_millis(config.interval_ms.max(10));
    decider::serve(
        config.common.http_addr_or(DEFAULT_HTTP_ADDR),
        bus,
        SpotMarket::new(interval),
        futures::stream::pending(),
        shutdown,
    )
    .await
}

/// The spot market's fold and decisions: the fleet's use per (zone, model)
/// and the last price the log holds for each.
pub struct SpotMarket {
    fleet: Fleet,
    published: BTreeMap<(String, String), Decimal>,
    interval: Duration,
    /// Prices are evaluated once per interval, not on every event.
    next_evaluation: Option<DateTime<Utc>>,
}

impl SpotMarket {
    pub fn new(interval: Duration) -> Self {
        Self {
            fleet: Fleet::default(),
            published: BTreeMap::new(),
            interval,
            next_evaluation: None,
        }
    }
}

impl Decider for SpotMarket {
    type Signal = std::convert::Infallible;

    fn name(&self) -> &'static str {
        SERVICE
    }

    fn filters(&self) -> &[&'static str] {
        &[subject::NODES_ALL, subject::LEASES_ALL, subject::SPOT_ALL]
    }

    fn pace(&self) -> Pace {
        Pace {
            quiet: Duration::from_millis(300),
            tick: self.interval,
            ..Pace::default()
        }
    }

    fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        if let EventData::SpotPriceSet(p) = &envelope.data {
            self.published.insert(
                (p.zone.clone(), p.gpu_model.clone()),
                p.price_cny_per_gb_hour,
            );
        }
        self.fleet.apply(sequence, &envelope.data);
    }

    fn snapshot(&self) -> Option<serde_json::Value> {
        // Object keys must be strings: the prices go as a list.
        let published: Vec<(&String, &String, &Decimal)> = self
            .published
            .iter()
            .map(|((zone, model), price)| (zone, model, price))
            .collect();
        Some(serde_json::json!({"fleet": self.fleet, "published": published}))
    }

    fn restore(&mut self, mut state: serde_json::Value) -> bool {
        let (Ok(fleet), Ok(published)) = (
            serde_json::from_value::<Fleet>(state["fleet"].take()),
            serde_json::from_value::<Vec<(String, String, Decimal)>>(state["published"].take()),
        ) else {
            return false;
        };
        self.fleet = fleet;
        self.published = published
            .into_iter()
            .map(|(zone, model, price)| ((zone, model), price))
            .collect();
        true
    }

    /// Once per interval: a price for every (zone, model) whose price
    /// changed since the log last recorded one.
    fn decide(&mut self, now: DateTime<Utc>) -> Vec<Batch> {
        if self.next_evaluation.is_some_and(|at| now < at) {
            return Vec::new();
        }
        self.next_evaluation = Some(now + self.interval);
        // Two brokers evaluating the same interval derive the same event id,
        // so JetStream keeps one.
        let slot = (now.timestamp_millis() as u128 / self.interval.as_millis().max(1)).to_string();
        let mut decisions = Vec::new();
        for ((zone, model), (total, used)) in self.fleet.usage_by_zone_model() {
            let (utilisation, price) = lh_domain::spot::price(total, used);
            if self.published.get(&(zone.clone(), model.clone())) == Some(&price) {
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
            decisions.push(vec![(envelope, Expect::Any)]);
        }
        decisions
    }

    fn appended(&mut self, batch: &Batch) {
        for (envelope, _) in batch {
            if let EventData::SpotPriceSet(p) = &envelope.data {
                metrics::counter!("lh_spot_prices_published_total").increment(1);
                tracing::info!(zone = %p.zone, model = %p.gpu_model, price = %p.price_cny_per_gb_hour,
                    utilisation = %p.utilisation, "spot price set");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::fixtures;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_780_000_000 + seconds, 0).unwrap()
    }

    fn stored(market: &mut SpotMarket, sequence: u64, data: EventData) {
        market.apply(
            sequence,
            &Envelope::new(Actor::Service("test".into()), at(0), data),
        );
    }

    #[test]
    fn a_price_is_set_once_per_change_and_at_most_once_per_interval() {
        let mut market = SpotMarket::new(Duration::from_secs(30));
        let node = fixtures::node("n1", "z1", 4, fixtures::MODEL, fixtures::MODEL_VRAM_GB);
        stored(&mut market, 1, EventData::NodeRegistered(node));
        let first = market.decide(at(0));
        assert_eq!(first.len(), 1, "one (zone, model)");
        let (envelope, _) = &first[0][0];
        let EventData::SpotPriceSet(price) = &envelope.data else {
            panic!("{envelope:?}")
        };
        assert_eq!((price.gpus_total, price.gpus_used), (4, 0));
        assert!(market.decide(at(10)).is_empty(), "within the interval");
        stored(&mut market, 2, envelope.data.clone());
        assert!(
            market.decide(at(31)).is_empty(),
            "the log already holds this price"
        );
    }
}
