//! What-if billing against a real nats-server and a real PostgreSQL
//! (lh-testkit): leases of two tenants charged by pricing as they would be
//! in production, then November priced again on another book over
//! `lh.rpc.pricing.what_if`, the numbers worked out by hand below; rows
//! projected without their age give the same answer; a bad period or book
//! is refused naming the field.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use lh_bus::{Bus, BusConfig, Expect};
use lh_events::*;
use lh_pricing::Config;
use lh_rpc::invoice_document::{DocumentRequest, InvoiceDocument};
use lh_rpc::what_if::{WhatIfReply, WhatIfReport, WhatIfRequest};
use lh_service::clock::ManualClock;
use lh_service::CancellationToken;
use rust_decimal::Decimal;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);
const RPC_TIMEOUT: Duration = Duration::from_secs(10);

fn at(mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, mo, d, h, mi, 0).unwrap()
}

fn price(text: &str) -> Decimal {
    text.parse().unwrap()
}

struct Env {
    _nats: lh_testkit::Nats,
    config: Config,
    bus: Bus,
}

impl Env {
    async fn new() -> Env {
        let (nats, database_url) = lh_testkit::nats_and_database().await;
        let config = Config::for_replayed_reports(&nats.url(), &database_url, at(1, 1, 0, 0));
        let bus = Bus::connect(&BusConfig::new(nats.url(), "what-if-test"))
            .await
            .expect("bus connects");
        Env {
            _nats: nats,
            config,
            bus,
        }
    }

    async fn publish(&self, actor: Actor, occurred_at: DateTime<Utc>, data: EventData) {
        self.bus
            .publish(&Envelope::new(actor, occurred_at, data), Expect::Any)
            .await
            .expect("event stored");
    }

    /// A lease of 2 GPUs (80 GB) of `tier` that runs from `from` to `to`.
    async fn lease(&self, tenant: Uuid, tier: Tier, from: DateTime<Utc>, to: DateTime<Utc>) {
        let lease = Uuid::now_v7();
        let mut request = fixtures::whole_request(lease, tenant, 2, fixtures::MODEL);
        request.tier = tier;
        self.publish(
            Actor::Tenant(tenant),
            from,
            EventData::LeaseRequested(request),
        )
        .await;
        let placed = fixtures::placed(
            lease,
            "node-1",
            "cn-north-1",
            fixtures::MODEL,
            fixtures::MODEL_VRAM_GB,
            &[0, 1],
        );
        let scheduler = Actor::Service("lh-scheduler".into());
        self.publish(scheduler, from, EventData::LeasePlaced(placed))
            .await;
        let node = Actor::Node("node-1".into());
        let started = fixtures::started(lease, "node-1", from);
        self.publish(node.clone(), from, EventData::LeaseStarted(started))
            .await;
        let ended = fixtures::ended(lease, "node-1", to, EndReason::Stopped);
        self.publish(node, to, EventData::LeaseEnded(ended)).await;
    }

    /// The tenant's draft of `period` once it bills `seconds`.
    async fn billed(&self, tenant: Uuid, period: &str, seconds: u64) {
        let deadline = Instant::now() + WAIT;
        loop {
            let request = DocumentRequest::ByPeriod {
                tenant_id: tenant,
                period: period.into(),
            };
            let draft: InvoiceDocument =
                lh_rpc::invoice_document::document(&self.bus, &request, RPC_TIMEOUT)
                    .await
                    .expect("pricing answers")
                    .expect("a draft");
            let billed: u64 = draft.lines.iter().map(|l| l.billed_seconds).sum();
            if billed == seconds {
                return;
            }
            assert!(billed < seconds, "more than expected: {draft:#?}");
            assert!(Instant::now() < deadline, "never billed: {draft:#?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn what_if(&self, book: &PriceBookPublished, period: &str) -> WhatIfReply {
        let request = WhatIfRequest {
            book: book.clone(),
            period: period.into(),
        };
        lh_rpc::what_if::call(&self.bus, &request, RPC_TIMEOUT)
            .await
            .expect("pricing answers")
    }
}

/// The default book: basic flat 0.5; performance 2.0 for a lease's first
/// 3 hours, 1.6 up to 6 hours, 1.2 after.
fn billed_book() -> PriceBookPublished {
    lh_domain::rating::default_price_book(at(9, 1, 0, 0))
}

/// The book tried: basic flat 0.6; performance 2.5 for the first 3 hours,
/// 1.0 after. Never published.
fn other_book() -> PriceBookPublished {
    let mut book = billed_book();
    book.version = 0;
    for tier in &mut book.tiers {
        match tier.tier {
            Tier::Basic => {
                tier.price_cny_per_gb_hour = price("0.6");
                tier.model = Some(ChargeModel::Flat {
                    price_cny_per_gb_hour: price("0.6"),
                });
            }
            Tier::Performance => {
                tier.price_cny_per_gb_hour = price("2.5");
                tier.model = Some(ChargeModel::Graduated {
                    steps: vec![
                        PriceStep {
                            from_hour: 0,
                            price_cny_per_gb_hour: price("2.5"),
                        },
                        PriceStep {
                            from_hour: 3,
                            price_cny_per_gb_hour: price("1.0"),
                        },
                    ],
                });
            }
            _ => {}
        }
    }
    book
}

/// `(tenant, charges, current, what-if, difference)` per tenant, and the
/// same for the totals.
fn rows(report: &WhatIfReport) -> Vec<(Uuid, u64, String, String, String)> {
    let mut rows: Vec<_> = report
        .tenants
        .iter()
        .map(|t| {
            (
                t.tenant_id,
                t.charges,
                t.current_cny.to_string(),
                t.what_if_cny.to_string(),
                t.difference_cny.to_string(),
            )
        })
        .collect();
    rows.push((
        Uuid::nil(),
        report.charges,
        report.current_cny.to_string(),
        report.what_if_cny.to_string(),
        report.difference_cny.to_string(),
    ));
    rows
}

#[tokio::test]
async fn a_past_month_is_priced_again_on_another_book_per_tenant() {
    let env = Env::new().await;
    let data = EventData::PriceBookPublished(billed_book());
    env.publish(fixtures::owner_of(&data), at(9, 1, 0, 0), data)
        .await;
    let shutdown = CancellationToken::new();
    // The ledger's clock stays in October: no invoice is issued, every
    // charge stays on its month's draft.
    let ledger_clock = ManualClock::new(at(10, 25, 0, 0));
    let mut config = env.config.clone();
    config.clocks.ledger = Some(ledger_clock.shared());
    let running = lh_pricing::start(config, shutdown.clone())
        .await
        .expect("pricing starts");
    lh_testkit::wait_ready("pricing", &running, WAIT).await;

    let (a, b) = {
        let (x, y) = (Uuid::now_v7(), Uuid::now_v7());
        (x.min(y), x.max(y))
    };
    // Tenant A, 80 GB of performance from 31 October 22:00 to 1 November
    // 03:00: hours 1-2 of its age are October's, 3-5 November's.
    env.lease(a, Tier::Performance, at(10, 31, 22, 0), at(11, 1, 3, 0))
        .await;
    // Tenant A, 80 GB of basic for 2.5 hours in November.
    env.lease(a, Tier::Basic, at(11, 10, 8, 0), at(11, 10, 10, 30))
        .await;
    // Tenant B, 80 GB of basic for 4 hours in November, and an hour in
    // October that November's report leaves out.
    env.lease(b, Tier::Basic, at(11, 5, 0, 0), at(11, 5, 4, 0))
        .await;
    env.lease(b, Tier::Basic, at(10, 20, 0, 0), at(10, 20, 1, 0))
        .await;
    env.billed(a, "2026-10", 2 * 3600).await;
    env.billed(a, "2026-11", 3 * 3600 + 9000).await;
    env.billed(b, "2026-11", 4 * 3600).await;
    env.billed(b, "2026-10", 3600).await;

    // A, billed: the performance lease's November hours are its 3rd (2.0:
    // 80 x 2.0 = 160.00), 4th and 5th (1.6: 128.00 each) = 416.00, the
    // basic lease 80 x 0.5 x 2.5 = 100.00 (40 + 40 + 20, 3 charges): 516.00
    // in 6 charges.
    // A, on the other book: the 3rd hour at 2.5 = 200.00, the 4th and 5th
    // at 1.0 = 80.00 each (had the age been counted from November, all
    // three would be at 2.5), basic 80 x 0.6 x 2.5 = 120.00: 480.00, -36.00.
    // B: 4 hours of basic, 160.00 billed, 80 x 0.6 x 4 = 192.00: +32.00.
    let expected = vec![
        (a, 6, "516.00".into(), "480.00".into(), "-36.00".into()),
        (b, 4, "160.00".into(), "192.00".into(), "32.00".into()),
        (
            Uuid::nil(),
            10,
            "676.00".into(),
            "672.00".into(),
            "-4.00".into(),
        ),
    ];
    let WhatIfReply::Report(report) = env.what_if(&other_book(), "2026-11").await else {
        panic!("refused")
    };
    assert_eq!(
        (report.period.as_str(), report.book_version),
        ("2026-11", 0)
    );
    assert_eq!(rows(&report), expected);
    // The billed book itself changes nothing.
    let WhatIfReply::Report(same) = env.what_if(&billed_book(), "2026-11").await else {
        panic!("refused")
    };
    assert_eq!(same.difference_cny.to_string(), "0.00");
    assert_eq!(same.book_version, 1);

    // The ages are a function of the log: a rebuild compares equal.
    let rebuilt = lh_pricing::rebuild(&env.config, "pricing_rebuild", false, |_, _| {})
        .await
        .expect("rebuild runs");
    for table in &rebuilt.tables {
        assert!(table.identical(), "{table:?} differs");
    }
    // Rows projected before the column have no age: the lease's billed
    // seconds over every month stand for it, October's two hours included.
    let pool = lh_projection::connect_schema(env.config.database_url.expose(), "pricing")
        .await
        .unwrap();
    let nulled = sqlx::query("UPDATE invoice_lines SET age_seconds = NULL")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(nulled.rows_affected(), 13);
    pool.close().await;
    let WhatIfReply::Report(again) = env.what_if(&other_book(), "2026-11").await else {
        panic!("refused")
    };
    assert_eq!(rows(&again), expected);

    // A month with no charges: an empty report.
    let WhatIfReply::Report(empty) = env.what_if(&other_book(), "2026-12").await else {
        panic!("refused")
    };
    assert!(empty.tenants.is_empty());
    assert_eq!(empty.current_cny.to_string(), "0.00");

    // Refused, naming the field of the request.
    let refused = |reply: WhatIfReply| match reply {
        WhatIfReply::Refused { field, .. } => field,
        WhatIfReply::Report(r) => panic!("not refused: {r:?}"),
    };
    assert_eq!(
        refused(env.what_if(&other_book(), "2026-13").await),
        "period"
    );
    let mut ladder = other_book();
    if let Some(ChargeModel::Graduated { steps }) = &mut ladder.tiers[1].model {
        steps[0].from_hour = 1;
    }
    assert_eq!(
        refused(env.what_if(&ladder, "2026-11").await),
        "book.tiers[1].model.steps[0].from_hour"
    );
    // November has performance charges; a book without that tier cannot
    // price them.
    let mut no_performance = other_book();
    no_performance.tiers.retain(|t| t.tier != Tier::Performance);
    assert_eq!(
        refused(env.what_if(&no_performance, "2026-11").await),
        "book.tiers"
    );

    shutdown.cancel();
    running.wait().await.expect("pricing stops cleanly");
}
