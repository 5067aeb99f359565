//! A month of leases priced into invoices, without servers: the pure parts
//! of pricing (the charges fold and the ledger, the same `Decider`s the
//! service runs on its decide loop) fed a generated log in time order.
//!
//! The log is generated as it is read, so the harness's own memory stays
//! bounded by the leases running at once, not by the month: lease starts
//! come in order, each lease's later events wait in a heap until the clock
//! reaches them, and the spot market moves on a fixed beat. What pricing
//! appends (charges, then invoices) is fed back to both deciders with the
//! next sequence, as the decide loop reads its own appends back.
//!
//! Used by the `money-month` binary (the benchmark in docs/benchmarks.md)
//! and by a short test that keeps it from rotting.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use chrono::{DateTime, Duration, TimeZone, Utc};
use lh_domain::rating;
use lh_events::{
    fixtures, Actor, ChargeModel, EndReason, Envelope, EventData, LeasePreemptionNoticed,
    PreemptionReason, PriceBookPublished, PriceStep, SpotPriceSet, Tier,
};
use lh_pricing::charges::{Charges, DEFAULT_ACCRUAL_GRACE_SECS};
use lh_pricing::ledger::{Ledger, DEFAULT_INVOICE_GRACE_SECS};
use lh_pricing::what_if::WhatIf;
use lh_service::decider::Decider;
use rust_decimal::Decimal;
use uuid::Uuid;

/// Most lease events one run may generate.
pub const MAX_LEASE_EVENTS: u64 = 20_000_000;
/// Zones and GPU models of the generated fleet; every (zone, model) is a
/// spot market.
const ZONES: [&str; 4] = ["zone-a", "zone-b", "zone-c", "zone-d"];
const MODELS: [(&str, u32); 2] = [("A100-40GB", 40), ("H100-80GB", 80)];
/// Share of the generated events that are spot prices, percent: the
/// markets publish as often as that allows, at most once a minute each.
const SPOT_PRICE_SHARE_PERCENT: u64 = 5;
const MIN_SPOT_PRICE_EVERY_SECS: u64 = 60;
/// Longest generated lease, seconds (a day).
const MAX_LEASE_SECS: u64 = 24 * 3600;
/// Notice a preempted spot lease gets before it ends, seconds.
const NOTICE_SECS: i64 = 120;
/// How often the deciders are asked what is due, on the simulated clock.
const DECIDE_EVERY_SECS: i64 = 60;

/// What to generate.
#[derive(Debug, Clone)]
pub struct MonthSpec {
    /// Lease events to generate (requested, placed, started, noticed,
    /// ended, spot prices and price books included).
    pub lease_events: u64,
    pub tenants: u32,
    pub seed: u64,
}

/// What came out.
#[derive(Debug, Default, Clone)]
pub struct MonthOutcome {
    pub lease_events: u64,
    pub leases: u64,
    pub spot_prices: u64,
    pub charges: u64,
    /// Tenants' months invoiced (one issued in parts counts once).
    pub invoices: u64,
    /// Sum of every charge's amount, CNY.
    pub charged_cny: Decimal,
    /// Sum of every invoice's total, CNY.
    pub invoiced_cny: Decimal,
    /// Charges priced on the book published mid-month.
    pub charges_on_second_book: u64,
    /// Leases the charges fold still holds at the end (0: all charged).
    pub open_leases: usize,
    /// Tenants that have at least one charge.
    pub tenants_charged: usize,
    /// Charges on the first book whose what-if on that same book is not
    /// what was charged (0: what-if prices as billing does).
    pub what_if_same_book_mismatches: u64,
    /// The month's total on the mid-month book for every lease, by
    /// what-if, CNY.
    pub what_if_second_book_cny: Decimal,
    /// Time spent in the two what-ifs, seconds.
    pub what_if_seconds: f64,
}

/// The month generated: November 2026.
pub fn month_start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap()
}

fn month_end() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()
}

/// SplitMix64: deterministic for a seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The book published mid-month: every price moved, so a lease's book
/// shows in its charges.
fn second_book(effective_from: DateTime<Utc>) -> PriceBookPublished {
    let mut book = rating::default_price_book(effective_from);
    book.version = 2;
    for tier in &mut book.tiers {
        match tier.tier {
            Tier::Basic => {
                tier.price_cny_per_gb_hour = Decimal::new(55, 2);
                tier.model = Some(ChargeModel::Flat {
                    price_cny_per_gb_hour: Decimal::new(55, 2),
                });
            }
            Tier::Performance => {
                tier.model = Some(ChargeModel::Graduated {
                    steps: vec![
                        PriceStep {
                            from_hour: 0,
                            price_cny_per_gb_hour: Decimal::new(18, 1),
                        },
                        PriceStep {
                            from_hour: 2,
                            price_cny_per_gb_hour: Decimal::new(14, 1),
                        },
                        PriceStep {
                            from_hour: 8,
                            price_cny_per_gb_hour: Decimal::new(10, 1),
                        },
                    ],
                });
                tier.price_cny_per_gb_hour = Decimal::new(18, 1);
            }
            Tier::Spot | Tier::Reserved => {}
        }
    }
    book
}

fn scheduler() -> Actor {
    Actor::Service("lh-scheduler".into())
}

/// One generated lease: its later events wait in the heap.
struct Pending {
    at: DateTime<Utc>,
    order: u64,
    envelope: Envelope,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// The generated log, in time order.
struct Generator {
    rng: Rng,
    tenants: Vec<Uuid>,
    pending: BinaryHeap<Reverse<Pending>>,
    order: u64,
    next_start: DateTime<Utc>,
    mean_gap_ms: u64,
    spot_every: Duration,
    next_spot: DateTime<Utc>,
    lease_index: u128,
    spot_price: HashMap<usize, Decimal>,
    books_left: Vec<Envelope>,
}

impl Generator {
    fn new(spec: &MonthSpec) -> Self {
        // About 4.05 events per lease (requested, placed, started, ended,
        // a notice for one spot lease in five) plus the market's beat.
        let seconds = (month_end() - month_start()).num_seconds() as u64;
        let markets = (ZONES.len() * MODELS.len()) as u64;
        let spot_events = spec.lease_events * SPOT_PRICE_SHARE_PERCENT / 100;
        let spot_every_secs =
            (seconds * markets / spot_events.max(1)).max(MIN_SPOT_PRICE_EVERY_SECS);
        let leases = spec.lease_events.saturating_sub(spot_events).max(1) * 100 / 405;
        let start = month_start();
        let books_left = vec![
            Envelope::new(
                Actor::Service("lh-pricing".into()),
                start - Duration::days(40),
                EventData::PriceBookPublished(rating::default_price_book(
                    start - Duration::days(40),
                )),
            ),
            Envelope::new(
                Actor::Admin,
                start + Duration::days(14),
                EventData::PriceBookPublished(second_book(start + Duration::days(15))),
            ),
        ];
        Self {
            rng: Rng(spec.seed),
            tenants: (0..spec.tenants.max(1))
                .map(|i| Uuid::from_u128(0x7e_0000 + i as u128))
                .collect(),
            pending: BinaryHeap::new(),
            order: 0,
            next_start: start,
            mean_gap_ms: (seconds * 1000 / leases.max(1)).max(1),
            spot_every: Duration::seconds(spot_every_secs as i64),
            next_spot: start,
            lease_index: 0,
            spot_price: HashMap::new(),
            books_left,
        }
    }

    fn push(&mut self, at: DateTime<Utc>, envelope: Envelope) {
        self.order += 1;
        self.pending.push(Reverse(Pending {
            at,
            order: self.order,
            envelope,
        }));
    }

    /// A new lease starting at `self.next_start`: its request, placement
    /// and start go out now, its notice and end into the heap.
    fn start_lease(&mut self) -> Vec<Envelope> {
        let at = self.next_start;
        self.lease_index += 1;
        let lease_id = Uuid::from_u128(0x0001_ea5e_0000_0000 + self.lease_index);
        let tenant = self.tenants[self.rng.below(self.tenants.len() as u64) as usize];
        let tier = match self.rng.below(100) {
            0..=39 => Tier::Basic,
            40..=64 => Tier::Performance,
            65..=89 => Tier::Spot,
            _ => Tier::Reserved,
        };
        let zone = self.rng.below(ZONES.len() as u64) as usize;
        let (model, vram) = MODELS[self.rng.below(MODELS.len() as u64) as usize];
        let gpus = [1, 1, 1, 2, 4, 8][self.rng.below(6) as usize];
        // Mostly short leases, some long: 5 minutes to a day.
        let seconds = match self.rng.below(10) {
            0..=5 => 300 + self.rng.below(3 * 3600),
            6..=8 => 3600 + self.rng.below(12 * 3600),
            _ => 3600 + self.rng.below(MAX_LEASE_SECS - 3600),
        };
        // Every lease ends in the month, so each month's invoice is whole.
        let end = (at + Duration::seconds(seconds as i64)).min(month_end() - Duration::seconds(1));
        let node = format!("node-{zone}-{}", self.rng.below(500));
        let mut request = fixtures::whole_request(lease_id, tenant, gpus, model);
        request.tier = tier;
        let indices: Vec<u32> = (0..gpus).collect();
        let placed = fixtures::placed(lease_id, &node, ZONES[zone], model, vram, &indices);
        let out = vec![
            Envelope::new(Actor::Admin, at, EventData::LeaseRequested(request)),
            Envelope::new(scheduler(), at, EventData::LeasePlaced(placed)),
            Envelope::new(
                Actor::Node(node.clone()),
                at,
                EventData::LeaseStarted(fixtures::started(lease_id, &node, at)),
            ),
        ];
        let preempted = tier == Tier::Spot
            && self.rng.below(5) == 0
            && end - at > Duration::seconds(NOTICE_SECS);
        if preempted {
            let noticed_at = end - Duration::seconds(NOTICE_SECS);
            let notice = LeasePreemptionNoticed {
                lease_id,
                node_id: node.clone(),
                preempted_for: Uuid::nil(),
                deadline: end,
                reason: PreemptionReason::Outbid,
            };
            self.push(
                noticed_at,
                Envelope::new(
                    scheduler(),
                    noticed_at,
                    EventData::LeasePreemptionNoticed(notice),
                ),
            );
        }
        let reason = if preempted {
            EndReason::Preempted
        } else {
            EndReason::Stopped
        };
        self.push(
            end,
            Envelope::new(
                Actor::Node(node.clone()),
                end,
                EventData::LeaseEnded(fixtures::ended(lease_id, &node, end, reason)),
            ),
        );
        // Exponential gaps between starts, by inversion on 1/1000 steps.
        let u = (self.rng.below(1000) + 1) as f64 / 1001.0;
        let gap_ms = (-(u.ln()) * self.mean_gap_ms as f64) as i64;
        self.next_start = at + Duration::milliseconds(gap_ms.max(1));
        out
    }

    /// Every market's next price: a random walk between a floor and a
    /// ceiling, as the spot-broker moves it with utilisation.
    fn spot_beat(&mut self) -> Vec<Envelope> {
        let at = self.next_spot;
        self.next_spot = at + self.spot_every;
        let mut out = Vec::new();
        for (z, zone) in ZONES.iter().enumerate() {
            for (m, (model, _)) in MODELS.iter().enumerate() {
                let key = z * MODELS.len() + m;
                let step = Decimal::new(self.rng.below(5) as i64 - 2, 2);
                let price = (self
                    .spot_price
                    .get(&key)
                    .copied()
                    .unwrap_or(Decimal::new(20, 2))
                    + step)
                    .clamp(Decimal::new(10, 2), Decimal::new(45, 2));
                self.spot_price.insert(key, price);
                out.push(Envelope::new(
                    Actor::Service("lh-spot-broker".into()),
                    at,
                    EventData::SpotPriceSet(SpotPriceSet {
                        zone: zone.to_string(),
                        gpu_model: model.to_string(),
                        price_cny_per_gb_hour: price,
                        utilisation: Decimal::new(5, 1),
                        gpus_total: 100,
                        gpus_used: 50,
                    }),
                ));
            }
        }
        out
    }

    /// The next events in time order; none once the month is over.
    fn next_events(&mut self) -> Vec<Envelope> {
        let book = self.books_left.first().map(|b| b.occurred_at);
        let due = self.pending.peek().map(|Reverse(p)| p.at);
        let starts = Some(self.next_start).filter(|&at| at < month_end() - Duration::seconds(1));
        let spot = Some(self.next_spot).filter(|&at| at < month_end());
        let Some(next) = [book, due, starts, spot].into_iter().flatten().min() else {
            return Vec::new();
        };
        if Some(next) == book {
            vec![self.books_left.remove(0)]
        } else if Some(next) == due {
            vec![self.pending.pop().expect("peeked").0.envelope]
        } else if Some(next) == spot {
            self.spot_beat()
        } else {
            self.start_lease()
        }
    }
}

/// Which of pricing's two deciders read an event (their subject filters).
fn for_charges(data: &EventData) -> bool {
    !matches!(
        data,
        EventData::InvoiceIssued(_) | EventData::InvoiceNoteIssued(_) | EventData::CreditGranted(_)
    )
}

fn for_ledger(data: &EventData) -> bool {
    !matches!(
        data,
        EventData::PriceBookPublished(_) | EventData::SpotPriceSet(_)
    )
}

/// Pricing's two deciders and the log they read.
struct Pricing {
    charges: Charges,
    ledger: Ledger,
    sequence: u64,
    outcome: MonthOutcome,
    tenants_charged: HashSet<Uuid>,
    same_book: WhatIf,
    second_book: WhatIf,
}

impl Pricing {
    fn read(&mut self, envelope: &Envelope) {
        self.sequence += 1;
        let (sequence, at) = (self.sequence, envelope.occurred_at);
        if for_charges(&envelope.data) {
            self.charges.apply_stored(sequence, at, envelope);
        }
        if for_ledger(&envelope.data) {
            self.ledger.apply_stored(sequence, at, envelope);
        }
        match &envelope.data {
            EventData::ChargeAccrued(c) => {
                self.outcome.charges += 1;
                self.outcome.charged_cny += c.amount;
                self.outcome.charges_on_second_book += u64::from(c.price_book_version == 2);
                self.tenants_charged.insert(c.tenant_id);
                let t = std::time::Instant::now();
                if c.price_book_version == 1 {
                    let same = self
                        .same_book
                        .rerated(c)
                        .expect("the default book prices every tier");
                    self.outcome.what_if_same_book_mismatches += u64::from(same != c.amount);
                }
                self.second_book
                    .add(c)
                    .expect("a month within the what-if's limits");
                self.outcome.what_if_seconds += t.elapsed().as_secs_f64();
            }
            EventData::InvoiceIssued(i) => {
                // A month issued in parts is one invoice.
                self.outcome.invoices += u64::from(i.part == 1);
                self.outcome.invoiced_cny += i.total;
            }
            _ => {}
        }
    }

    /// What the deciders append at `now`, read back as the loop would.
    fn decide(&mut self, now: DateTime<Utc>) {
        let charges: Vec<Envelope> = self
            .charges
            .decide(now)
            .into_iter()
            .flatten()
            .map(|(e, _)| e)
            .collect();
        for e in &charges {
            self.read(e);
        }
        let documents: Vec<Envelope> = self
            .ledger
            .decide(now)
            .into_iter()
            .flatten()
            .map(|(e, _)| e)
            .collect();
        for e in &documents {
            self.read(e);
        }
    }
}

/// Generates the month and prices it; `on_progress` is called with the
/// lease events read so far, every 100,000.
pub fn run(spec: &MonthSpec, mut on_progress: impl FnMut(u64)) -> MonthOutcome {
    let limit = spec.lease_events.min(MAX_LEASE_EVENTS);
    let mut generator = Generator::new(spec);
    let mut pricing = Pricing {
        charges: Charges::new(
            Duration::seconds(30),
            Duration::seconds(DEFAULT_ACCRUAL_GRACE_SECS),
        ),
        ledger: Ledger::new(Duration::seconds(DEFAULT_INVOICE_GRACE_SECS)),
        sequence: 0,
        outcome: MonthOutcome::default(),
        tenants_charged: HashSet::new(),
        same_book: WhatIf::new(rating::default_price_book(month_start()), "2026-11")
            .expect("the default book is valid"),
        second_book: WhatIf::new(second_book(month_start()), "2026-11")
            .expect("the second book is valid"),
    };
    let mut decided_at = month_start() - Duration::days(41);
    loop {
        let events = generator.next_events();
        if events.is_empty() {
            break;
        }
        for e in &events {
            if e.occurred_at >= decided_at + Duration::seconds(DECIDE_EVERY_SECS) {
                decided_at = e.occurred_at;
                pricing.decide(decided_at);
            }
            match &e.data {
                EventData::SpotPriceSet(_) => pricing.outcome.spot_prices += 1,
                EventData::LeaseRequested(_) => pricing.outcome.leases += 1,
                _ => {}
            }
            pricing.outcome.lease_events += 1;
            pricing.read(e);
            if pricing.outcome.lease_events.is_multiple_of(100_000) {
                on_progress(pricing.outcome.lease_events);
            }
        }
        // Stop starting leases once the budget of events is spent; the
        // running ones still end.
        if pricing.outcome.lease_events >= limit {
            generator.next_start = month_end();
            generator.next_spot = month_end();
        }
    }
    // Every lease ended in the month: charge the rest, then issue once the
    // invoice grace is over.
    pricing.decide(month_end() + Duration::hours(1));
    pricing.decide(month_end() + Duration::seconds(DEFAULT_INVOICE_GRACE_SECS + 1));
    let mut outcome = pricing.outcome;
    outcome.open_leases = pricing.charges.fold.open_leases();
    outcome.tenants_charged = pricing.tenants_charged.len();
    outcome.what_if_second_book_cny = pricing.second_book.report().what_if_cny;
    outcome
}
