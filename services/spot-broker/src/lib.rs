//! Spot-broker: the spot market. It publishes a spot price per
//! (zone, GPU model) from current utilisation, within the operator's floor
//! and ceiling, evaluated at a fixed interval and appended only when it
//! changed, so the 365-day log is not filled with repeats. Pricing bills
//! spot leases from these prices; the scheduler places and preempts spot
//! leases by them.
//!
//! For every spot request it also weighs external capacity: the offers of
//! the clouds it knows ([`providers`], replaying recorded price histories),
//! and records on the log (`spot.capacity_chosen`) the cheapest that
//! satisfies the request, with every candidate and why the others were
//! passed over. Nothing is provisioned there yet: the choice is the record
//! an operator (or a provisioner) acts on.
//!
//! It also answers [`lh_rpc::spot::RPC_SPOT_PRICES`] (the current price of
//! each market and its recent history) from the same fold: the board the
//! decide loop keeps is shared, read-only, with the responder.

pub mod providers;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::{Bus, Expect};
use lh_domain::fleet::Fleet;
use lh_domain::spot::SpotBounds;
use lh_events::{
    derived_id, subject, Actor, Envelope, EventData, SpotCapacityChosen, SpotPriceSet, Tier,
};
use lh_rpc::spot::{
    SpotMarketView, SpotPricePoint, SpotPrices, SpotPricesRequest, MAX_FILTER_LEN,
    MAX_HISTORY_POINTS, MAX_MARKETS, RPC_SPOT_PRICES,
};
use lh_service::decider::{self, Batch, Decider, Pace};
use lh_service::{CancellationToken, CommonArgs, Running};
use providers::SpotProvider;
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9104";

/// Metrics this service records, with their `# HELP` text.
pub const METRICS: &[lh_service::MetricHelp] = &[
    (
        "lh_spot_prices_published_total",
        "Spot prices this replica set.",
    ),
    (
        "lh_spot_capacity_chosen_total",
        "External spot capacity chosen for a lease, by provider.",
    ),
    (
        "lh_spot_capacity_unmatched_total",
        "Spot leases no external provider could serve.",
    ),
    (
        "lh_spot_price_cny_per_gigabyte_hour",
        "Spot price in force, from the log, by zone and GPU model (CNY per GB of VRAM per hour).",
    ),
];

const SERVICE: &str = "lh-spot-broker";
/// Queue group of the brokers answering [`RPC_SPOT_PRICES`].
const QUEUE_GROUP: &str = "lh-spot-broker";
/// Shortest evaluation interval accepted, in milliseconds.
const MIN_INTERVAL_MS: u64 = 10;
/// Most spot requests waiting for an external capacity choice; past it a
/// request gets none.
pub const MAX_PENDING_CHOICES: usize = 10_000;
/// A spot request older than this when the broker first decides on it (a
/// log replayed after a long stop) gets no choice: the offers of then are
/// gone.
pub const MAX_CHOICE_AGE_SECS: i64 = 600;

#[derive(clap::Parser, Debug, Clone)]
#[command(name = "lh-spot-broker", about = "Leasehold spot market")]
pub struct Config {
    #[command(flatten)]
    pub common: CommonArgs,
    /// How often spot prices are evaluated: a change of use shows in the
    /// price within this.
    #[arg(long, env = "LH_SPOT_INTERVAL_MS", default_value_t = 5_000)]
    pub interval_ms: u64,
    /// Lowest spot price, CNY per GB of VRAM per hour (an idle market).
    #[arg(long, env = "LH_SPOT_FLOOR_CNY_PER_GB_HOUR", default_value_t = lh_domain::spot::FLOOR_CNY_PER_GB_HOUR)]
    pub floor_cny_per_gb_hour: Decimal,
    /// Highest spot price, CNY per GB of VRAM per hour (a full market).
    #[arg(long, env = "LH_SPOT_CEILING_CNY_PER_GB_HOUR", default_value_t = lh_domain::spot::CEILING_CNY_PER_GB_HOUR)]
    pub ceiling_cny_per_gb_hour: Decimal,
    /// External clouds weighed for each spot request, on their recorded
    /// price histories (`aws`, `aliyun`, `tencent`; empty: none).
    #[arg(
        long,
        env = "LH_SPOT_PROVIDERS",
        value_delimiter = ',',
        default_value = "aws,aliyun,tencent"
    )]
    pub spot_providers: Vec<String>,
}

impl Config {
    pub fn for_test(common: CommonArgs) -> Self {
        Self {
            common,
            interval_ms: 200,
            floor_cny_per_gb_hour: lh_domain::spot::FLOOR_CNY_PER_GB_HOUR,
            ceiling_cny_per_gb_hour: lh_domain::spot::CEILING_CNY_PER_GB_HOUR,
            spot_providers: providers::KNOWN.map(String::from).to_vec(),
        }
    }

    /// The providers named, on their recordings.
    pub fn providers(&self) -> anyhow::Result<Vec<Box<dyn SpotProvider>>> {
        self.spot_providers
            .iter()
            .map(|name| name.trim())
            .filter(|name| !name.is_empty())
            .map(|name| providers::recorded(name).map_err(anyhow::Error::msg))
            .collect()
    }
}

impl lh_service::Service for Config {
    const NAME: &'static str = "lh-spot-broker";

    async fn start(self, shutdown: CancellationToken) -> anyhow::Result<Running> {
        start(self, shutdown).await
    }
}

pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    lh_service::describe_metrics(METRICS);
    let bounds = SpotBounds::new(config.floor_cny_per_gb_hour, config.ceiling_cny_per_gb_hour)
        .map_err(anyhow::Error::msg)?;
    let bus = config.common.connect_bus(SERVICE).await?;
    let interval = Duration::from_millis(config.interval_ms.max(MIN_INTERVAL_MS));
    let market = SpotMarket::new(interval, bounds).with_providers(config.providers()?);
    tokio::spawn(answer_prices(bus.clone(), market.board(), shutdown.clone()));
    decider::serve(
        config.common.http_addr_or(DEFAULT_HTTP_ADDR),
        bus,
        market,
        futures::stream::pending(),
        shutdown,
    )
    .await
}

/// Answers price requests from `board` until `shutdown`.
async fn answer_prices(bus: Bus, board: SharedBoard, shutdown: CancellationToken) {
    let serving = lh_bus::rpc::serve(
        &bus,
        RPC_SPOT_PRICES,
        QUEUE_GROUP,
        |request: SpotPricesRequest| {
            let board = board.clone();
            async move {
                let board = board.read().map_err(|_| "the price board is unreadable")?;
                board.answer(&request)
            }
        },
    );
    tokio::select! {
        _ = shutdown.cancelled() => {}
        result = serving => {
            if let Err(e) = result {
                tracing::error!(error = %e, "spot price requests are not answered");
            }
        }
    }
}

/// One market as the log records it: its recent prices and its GPUs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Market {
    /// Oldest first; at most [`MAX_HISTORY_POINTS`].
    history: VecDeque<SpotPricePoint>,
    gpus_total: u32,
    gpus_used: u32,
    /// Stream sequence of the newest price recorded: the loop applies its
    /// own events at once and the feed brings them again.
    #[serde(default)]
    sequence: u64,
}

/// Every market's prices, as the log records them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PriceBoard {
    /// By (zone, model); serialized as a list, JSON keys being strings.
    #[serde(with = "as_list")]
    markets: BTreeMap<(String, String), Market>,
}

mod as_list {
    use super::*;
    use serde::{Deserializer, Serializer};

    type Key = (String, String);

    pub fn serialize<S: Serializer>(
        markets: &BTreeMap<Key, Market>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(markets.iter())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<Key, Market>, D::Error> {
        Ok(Vec::<(Key, Market)>::deserialize(d)?.into_iter().collect())
    }
}

pub type SharedBoard = Arc<RwLock<PriceBoard>>;

impl PriceBoard {
    fn record(&mut self, sequence: u64, price: &SpotPriceSet, at: DateTime<Utc>) {
        let market = self
            .markets
            .entry((price.zone.clone(), price.gpu_model.clone()))
            .or_default();
        if sequence <= market.sequence {
            return;
        }
        market.sequence = sequence;
        market.history.push_back(SpotPricePoint {
            price_cny_per_gb_hour: price.price_cny_per_gb_hour,
            utilisation: price.utilisation,
            at,
        });
        while market.history.len() > MAX_HISTORY_POINTS {
            market.history.pop_front();
        }
        market.gpus_total = price.gpus_total;
        market.gpus_used = price.gpus_used;
    }

    /// The price the log last recorded for (zone, model).
    pub fn current(&self, zone: &str, model: &str) -> Option<Decimal> {
        self.markets
            .get(&(zone.to_string(), model.to_string()))
            .and_then(|m| m.history.back())
            .map(|p| p.price_cny_per_gb_hour)
    }

    /// The markets `request` asks for, each with at most the history it
    /// asks for.
    pub fn answer(&self, request: &SpotPricesRequest) -> Result<SpotPrices, String> {
        for (field, value) in [("zone", &request.zone), ("gpu_model", &request.gpu_model)] {
            if value.as_ref().is_some_and(|v| v.len() > MAX_FILTER_LEN) {
                return Err(format!("{field} is longer than {MAX_FILTER_LEN} bytes"));
            }
        }
        let keep = request
            .history
            .map_or(MAX_HISTORY_POINTS, |h| (h as usize).min(MAX_HISTORY_POINTS));
        let markets = self
            .markets
            .iter()
            .filter(|((zone, model), _)| {
                request.zone.as_ref().is_none_or(|z| z == zone)
                    && request.gpu_model.as_ref().is_none_or(|m| m == model)
            })
            .filter_map(|((zone, model), market)| {
                let current = market.history.back()?.clone();
                let skip = market.history.len().saturating_sub(keep);
                Some(SpotMarketView {
                    zone: zone.clone(),
                    region: lh_domain::spot::region_of(zone).to_string(),
                    gpu_model: model.clone(),
                    current,
                    gpus_total: market.gpus_total,
                    gpus_used: market.gpus_used,
                    history: market.history.iter().skip(skip).cloned().collect(),
                })
            })
            .take(MAX_MARKETS)
            .collect();
        Ok(SpotPrices { markets })
    }
}

/// A spot request waiting for its external capacity choice.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PendingChoice {
    tenant_id: Uuid,
    gpu_model: String,
    gpus: u32,
    zones: Vec<String>,
    regions: Vec<String>,
    max_price_cny_per_gpu_hour: Option<Decimal>,
    requested_at: DateTime<Utc>,
}

/// The spot market's fold and decisions: the fleet's use per (zone, model)
/// and the prices the log holds for each, and the spot requests still
/// waiting for an external capacity choice.
pub struct SpotMarket {
    fleet: Fleet,
    board: SharedBoard,
    interval: Duration,
    bounds: SpotBounds,
    /// Prices are evaluated once per interval, not on every event.
    next_evaluation: Option<DateTime<Utc>>,
    providers: Vec<Box<dyn SpotProvider>>,
    pending_choices: BTreeMap<Uuid, PendingChoice>,
}

impl SpotMarket {
    pub fn new(interval: Duration, bounds: SpotBounds) -> Self {
        Self {
            fleet: Fleet::default(),
            board: SharedBoard::default(),
            interval,
            bounds,
            next_evaluation: None,
            providers: Vec::new(),
            pending_choices: BTreeMap::new(),
        }
    }

    /// The clouds weighed for each spot request.
    pub fn with_providers(mut self, providers: Vec<Box<dyn SpotProvider>>) -> Self {
        self.providers = providers;
        self
    }

    fn wait_for_choice(&mut self, request: &lh_events::LeaseRequested, at: DateTime<Utc>) {
        if request.tier != Tier::Spot || self.providers.is_empty() {
            return;
        }
        if self.pending_choices.len() >= MAX_PENDING_CHOICES {
            tracing::warn!(lease = %request.lease_id, limit = MAX_PENDING_CHOICES,
                "too many spot requests wait for a capacity choice; this one gets none");
            return;
        }
        self.pending_choices.insert(
            request.lease_id,
            PendingChoice {
                tenant_id: request.tenant_id,
                gpu_model: request.gpu_model.clone(),
                gpus: request.ask().gpus(),
                zones: request.zones.clone(),
                regions: request.regions.clone(),
                max_price_cny_per_gpu_hour: request.max_price_cny_per_gpu_hour,
                requested_at: at,
            },
        );
    }

    /// The external capacity chosen for each spot request waiting, each a
    /// `spot.capacity_chosen` whose id is derived from its lease. A request
    /// nothing satisfies, or too old, is told so on the service's log only.
    fn capacity_choices(&mut self, now: DateTime<Utc>) -> Vec<Batch> {
        if self.pending_choices.is_empty() {
            return Vec::new();
        }
        let offers: Vec<providers::Offer> =
            self.providers.iter().flat_map(|p| p.offers(now)).collect();
        let max_age = chrono::Duration::seconds(MAX_CHOICE_AGE_SECS);
        let mut decisions = Vec::new();
        let mut settled = Vec::new();
        for (lease_id, pending) in &self.pending_choices {
            if now - pending.requested_at > max_age {
                settled.push(*lease_id);
                continue;
            }
            let demand = providers::Demand {
                gpu_model: &pending.gpu_model,
                gpus: pending.gpus,
                zones: &pending.zones,
                regions: &pending.regions,
                max_price_cny_per_gpu_hour: pending.max_price_cny_per_gpu_hour,
            };
            let choice = providers::choose(&offers, &demand);
            let Some(chosen) = choice.chosen.map(|i| choice.candidates[i].clone()) else {
                tracing::info!(lease = %lease_id, model = %pending.gpu_model, gpus = pending.gpus,
                    candidates = choice.candidates.len(), "no external spot capacity satisfies the request");
                metrics::counter!("lh_spot_capacity_unmatched_total").increment(1);
                settled.push(*lease_id);
                continue;
            };
            let data = EventData::SpotCapacityChosen(SpotCapacityChosen {
                lease_id: *lease_id,
                tenant_id: pending.tenant_id,
                provider: chosen.provider,
                region: chosen.region,
                zone: chosen.zone,
                gpu_model: pending.gpu_model.clone(),
                gpus: pending.gpus,
                price_cny_per_gpu_hour: chosen.price_cny_per_gpu_hour,
                candidates: choice.candidates,
            });
            let mut envelope = Envelope::new(Actor::Service(SERVICE.into()), now, data)
                .with_id(derived_id(&["spot.capacity_chosen", &lease_id.to_string()]));
            envelope.tenant_id = Some(pending.tenant_id);
            decisions.push(vec![(envelope, Expect::Any)]);
        }
        for lease_id in settled {
            self.pending_choices.remove(&lease_id);
        }
        decisions
    }

    /// The prices the fold keeps, for readers beside the decide loop.
    pub fn board(&self) -> SharedBoard {
        self.board.clone()
    }

    fn current(&self, zone: &str, model: &str) -> Option<Decimal> {
        self.board.read().ok()?.current(zone, model)
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
        match &envelope.data {
            EventData::SpotPriceSet(p) => {
                if let Ok(mut board) = self.board.write() {
                    board.record(sequence, p, envelope.occurred_at);
                }
                // Set from the log rather than from this replica's own
                // appends, so that every replica reports the price in force.
                metrics::gauge!("lh_spot_price_cny_per_gigabyte_hour",
                    "zone" => p.zone.clone(), "gpu_model" => p.gpu_model.clone())
                .set(p.price_cny_per_gb_hour.to_f64().unwrap_or(f64::NAN));
            }
            EventData::LeaseRequested(r) => self.wait_for_choice(r, envelope.occurred_at),
            EventData::SpotCapacityChosen(c) => {
                self.pending_choices.remove(&c.lease_id);
            }
            _ => {}
        }
        self.fleet.apply(sequence, &envelope.data);
    }

    fn snapshot(&self) -> Option<Box<serde_json::value::RawValue>> {
        let board = self.board.read().ok()?;
        lh_service::decider::snapshot_of(&serde_json::json!({
            "fleet": self.fleet,
            "board": *board,
            "pending_choices": self.pending_choices,
        }))
    }

    fn restore(&mut self, state: &serde_json::value::RawValue) -> bool {
        let Some(mut state) = lh_service::decider::restored::<serde_json::Value>(state) else {
            return false;
        };
        let (Ok(fleet), Ok(board), Ok(pending_choices)) = (
            serde_json::from_value::<Fleet>(state["fleet"].take()),
            serde_json::from_value::<PriceBoard>(state["board"].take()),
            serde_json::from_value(state["pending_choices"].take()),
        ) else {
            return false;
        };
        self.fleet = fleet;
        self.pending_choices = pending_choices;
        if let Ok(mut shared) = self.board.write() {
            *shared = board;
        }
        true
    }

    /// Once per interval: a price for every (zone, model) whose price
    /// changed since the log last recorded one.
    fn decide(&mut self, now: DateTime<Utc>) -> Vec<Batch> {
        let mut decisions = self.capacity_choices(now);
        if self.next_evaluation.is_some_and(|at| now < at) {
            return decisions;
        }
        self.next_evaluation = Some(now + self.interval);
        // Two brokers evaluating the same interval to the same price derive
        // the same event id, so JetStream keeps one.
        let slot = (now.timestamp_millis() as u128 / self.interval.as_millis().max(1)).to_string();
        for ((zone, model), (total, used)) in self.fleet.usage_by_zone_model() {
            let (utilisation, price) = self.bounds.price(total, used);
            if self.current(&zone, &model) == Some(price) {
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
            let envelope =
                Envelope::new(Actor::Service(SERVICE.into()), now, data).with_id(derived_id(&[
                    "spot",
                    &zone,
                    &model,
                    &slot,
                    &price.to_string(),
                ]));
            decisions.push(vec![(envelope, Expect::Any)]);
        }
        decisions
    }

    fn appended(&mut self, batch: &Batch) {
        for (envelope, _) in batch {
            match &envelope.data {
                EventData::SpotPriceSet(p) => {
                    metrics::counter!("lh_spot_prices_published_total").increment(1);
                    tracing::info!(zone = %p.zone, model = %p.gpu_model, price = %p.price_cny_per_gb_hour,
                        utilisation = %p.utilisation, "spot price set");
                }
                EventData::SpotCapacityChosen(c) => {
                    metrics::counter!("lh_spot_capacity_chosen_total", "provider" => c.provider.clone())
                        .increment(1);
                    tracing::info!(lease = %c.lease_id, provider = %c.provider, region = %c.region,
                        zone = %c.zone, price = %c.price_cny_per_gpu_hour, "external spot capacity chosen");
                }
                _ => {}
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
        let mut market = SpotMarket::new(Duration::from_secs(30), SpotBounds::default());
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

    fn only_price(batches: &[Batch]) -> &SpotPriceSet {
        assert_eq!(batches.len(), 1, "{batches:?}");
        match &batches[0][0].0.data {
            EventData::SpotPriceSet(p) => p,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_price_follows_use_within_one_interval_and_stays_in_the_band() {
        let bounds = SpotBounds::new("0.2".parse().unwrap(), "0.6".parse().unwrap()).unwrap();
        let mut market = SpotMarket::new(Duration::from_secs(5), bounds);
        let node = fixtures::node("n1", "z1", 2, fixtures::MODEL, fixtures::MODEL_VRAM_GB);
        stored(&mut market, 1, EventData::NodeRegistered(node));
        let idle = market.decide(at(0));
        assert_eq!(only_price(&idle).price_cny_per_gb_hour.to_string(), "0.2");
        stored(&mut market, 2, idle[0][0].0.data.clone());
        let lease = uuid::Uuid::from_u128(1);
        let both = lh_events::NodeGpusAllocated::one("n1", lease, vec![0, 1]);
        stored(&mut market, 3, EventData::NodeGpusAllocated(both));
        assert!(market.decide(at(4)).is_empty(), "not before the interval");
        let full = market.decide(at(5));
        let full = only_price(&full);
        assert_eq!(
            (
                full.gpus_used,
                full.price_cny_per_gb_hour.to_string().as_str()
            ),
            (2, "0.6")
        );
    }

    fn choices(batches: &[Batch]) -> Vec<SpotCapacityChosen> {
        batches
            .iter()
            .flatten()
            .filter_map(|(e, _)| match &e.data {
                EventData::SpotCapacityChosen(c) => Some(c.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_spot_request_gets_the_cheapest_external_capacity_that_satisfies_it_once() {
        let config = Config::for_test(CommonArgs::for_test("nats://unused"));
        let mut market = SpotMarket::new(Duration::from_secs(30), SpotBounds::default())
            .with_providers(config.providers().unwrap());
        let tenant = uuid::Uuid::from_u128(9);
        let spot = |id: u128, gpus: u32| lh_events::LeaseRequested {
            tier: Tier::Spot,
            ..fixtures::whole_request(uuid::Uuid::from_u128(id), tenant, gpus, fixtures::MODEL)
        };
        stored(&mut market, 1, EventData::LeaseRequested(spot(1, 1)));
        let basic = fixtures::whole_request(uuid::Uuid::from_u128(2), tenant, 1, fixtures::MODEL);
        stored(&mut market, 2, EventData::LeaseRequested(basic));
        let narrow = lh_events::LeaseRequested {
            regions: vec!["cn-hangzhou".into()],
            ..spot(3, 2)
        };
        stored(&mut market, 3, EventData::LeaseRequested(narrow));
        let decided = market.decide(at(60));
        let chosen = choices(&decided);
        assert_eq!(
            chosen.len(),
            1,
            "spot only, and only what some offer satisfies"
        );
        let c = &chosen[0];
        assert_eq!(c.lease_id, uuid::Uuid::from_u128(1));
        let satisfying: Vec<&lh_events::CapacityCandidate> = c
            .candidates
            .iter()
            .filter(|x| x.rejected.is_none())
            .collect();
        assert!(satisfying.len() > 1, "{c:?}");
        assert!(satisfying
            .iter()
            .all(|x| x.price_cny_per_gpu_hour >= c.price_cny_per_gpu_hour));
        assert!(
            c.candidates.iter().any(|x| x.provider == "aws")
                && c.candidates.iter().any(|x| x.provider == "aliyun")
                && c.candidates.iter().any(|x| x.provider == "tencent")
        );
        let envelope = decided
            .iter()
            .flatten()
            .find(|(e, _)| e.event_type == "spot.capacity_chosen")
            .unwrap()
            .0
            .clone();
        market.apply(4, &envelope);
        assert!(choices(&market.decide(at(61))).is_empty(), "once");
    }

    #[test]
    fn the_board_answers_current_prices_with_bounded_history() {
        let mut board = PriceBoard::default();
        let price = |p: i64| SpotPriceSet {
            zone: "cn-north.1".into(),
            gpu_model: fixtures::MODEL.into(),
            price_cny_per_gb_hour: Decimal::new(p, 3),
            utilisation: Decimal::ZERO,
            gpus_total: 4,
            gpus_used: 0,
        };
        for i in 0..(MAX_HISTORY_POINTS as i64 + 10) {
            board.record(i as u64 + 1, &price(100 + i), at(i));
        }
        let all = board.answer(&SpotPricesRequest::default()).unwrap();
        let market = &all.markets[0];
        assert_eq!(market.region, "cn-north");
        assert_eq!(market.history.len(), MAX_HISTORY_POINTS);
        assert_eq!(market.history.last(), Some(&market.current));
        assert_eq!(market.current.price_cny_per_gb_hour, Decimal::new(169, 3));
        board.record(1, &price(999), at(99));
        let again = board.answer(&SpotPricesRequest::default()).unwrap();
        assert_eq!(
            again.markets[0].current, market.current,
            "a price seen again"
        );
        let recent = board
            .answer(&SpotPricesRequest {
                history: Some(3),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(recent.markets[0].history.len(), 3);
        let elsewhere = board
            .answer(&SpotPricesRequest {
                zone: Some("other".into()),
                ..Default::default()
            })
            .unwrap();
        assert!(elsewhere.markets.is_empty());
        let hostile = SpotPricesRequest {
            gpu_model: Some("x".repeat(MAX_FILTER_LEN + 1)),
            ..Default::default()
        };
        assert!(board.answer(&hostile).is_err());
    }
}
