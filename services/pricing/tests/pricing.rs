//! Pricing against a real nats-server and a real PostgreSQL (lh-testkit):
//! the lease events are published with lh_bus as the gateway, scheduler and
//! node-agent would, and the invoice is asked for over the NATS RPC as the
//! gateway would.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use lh_bus::{rpc, Bus, BusConfig, Expect};
use lh_events::*;
use lh_pricing::Config;
use lh_rpc::charges::{ChargeStatement, ChargeStatementRequest, CHARGES_SUBJECT};
use lh_service::{CancellationToken, Running};
use lh_testkit::Nats;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);

struct Env {
    _nats: Nats,
    config: Config,
    bus: Bus,
}

impl Env {
    async fn new() -> Env {
        let (nats, database_url) = lh_testkit::nats_and_database().await;
        // The months these tests bill are long over: the longest grace
        // period keeps their invoices drafts (the ledger's own tests move a
        // clock).
        let config = Config {
            invoice_grace_secs: lh_pricing::ledger::MAX_INVOICE_GRACE_SECS,
            ..Config::for_replayed_reports(&nats.url(), &database_url, at(2026, 11, 1, 0, 0, 0))
        };
        let bus = Bus::connect(&BusConfig::new(nats.url(), "pricing-test"))
            .await
            .expect("bus connects");
        Env {
            _nats: nats,
            config,
            bus,
        }
    }

    async fn start_pricing(&self) -> Pricing {
        let shutdown = CancellationToken::new();
        let running = lh_pricing::start(self.config.clone(), shutdown.clone())
            .await
            .expect("pricing starts");
        lh_testkit::wait_ready("pricing", &running, WAIT).await;
        Pricing { running, shutdown }
    }

    /// The four lifecycle events of a lease of 2 GPUs of 40 GB, tier basic,
    /// stored at once: pricing never sees it running (it would charge the
    /// hours that are long over by now).
    async fn lease(&self, tenant: Uuid, lease: Uuid, started: DateTime<Utc>, ended: DateTime<Utc>) {
        let mut events = lifecycle(tenant, lease, Tier::Basic, started);
        events.push(end_of(lease, ended));
        self.store(events).await;
    }

    /// `events` in one atomic batch.
    async fn store(&self, events: Vec<Envelope>) {
        let batch: Vec<(Envelope, Expect)> = events.into_iter().map(|e| (e, Expect::Any)).collect();
        self.bus
            .publish_atomic(&batch)
            .await
            .expect("lease events stored");
    }

    /// The month's charges as the gateway would ask for them, checked to be
    /// JSON with money as strings.
    async fn charges(&self, tenant: Uuid, period: &str) -> ChargeStatement {
        let raw: serde_json::Value = rpc::call(
            &self.bus,
            CHARGES_SUBJECT,
            &ChargeStatementRequest {
                tenant_id: tenant,
                period: period.into(),
            },
            Duration::from_secs(5),
        )
        .await
        .expect("charges answered");
        assert!(raw["total"].is_string(), "total is a decimal string: {raw}");
        for line in raw["lines"].as_array().unwrap() {
            assert!(
                line["amount"].is_string() && line["unit_price"].is_string(),
                "{line}"
            );
        }
        let statement: ChargeStatement = serde_json::from_value(raw).expect("a statement");
        assert!(statement.verify(), "total and content hash match the lines");
        statement
    }

    /// Asks until the statement has `lines` lines (the projection is eventually consistent).
    async fn charges_with(&self, tenant: Uuid, period: &str, lines: usize) -> ChargeStatement {
        let deadline = Instant::now() + WAIT;
        loop {
            let invoice = self.charges(tenant, period).await;
            if invoice.lines.len() >= lines {
                assert_eq!(invoice.lines.len(), lines, "{invoice:?}");
                return invoice;
            }
            assert!(
                Instant::now() < deadline,
                "invoice never got {lines} lines: {invoice:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every charge.accrued in the log, read from the stream.
    async fn charges_in_log(&self) -> Vec<ChargeAccrued> {
        let mut feed = self.bus.feed(&[subject::CHARGES_ALL], 1).await.unwrap();
        let mut charges = Vec::new();
        while let Some(event) = feed.next_within(Duration::from_secs(1)).await {
            let event = event.unwrap();
            if let EventData::ChargeAccrued(c) = event.envelope.data {
                charges.push(c);
            }
            if event.pending == 0 {
                break;
            }
        }
        charges
    }
}

/// A lease of 2 GPUs of 40 GB requested, placed in `cn-north-1` and started.
fn lifecycle(tenant: Uuid, lease: Uuid, tier: Tier, started: DateTime<Utc>) -> Vec<Envelope> {
    let mut request = fixtures::whole_request(lease, tenant, 2, fixtures::MODEL);
    request.tier = tier;
    vec![
        Envelope::new(
            Actor::Tenant(tenant),
            started,
            EventData::LeaseRequested(request),
        ),
        Envelope::new(
            Actor::Service("lh-scheduler".into()),
            started,
            EventData::LeasePlaced(fixtures::placed(
                lease,
                "node-1",
                "cn-north-1",
                fixtures::MODEL,
                fixtures::MODEL_VRAM_GB,
                &[0, 1],
            )),
        ),
        Envelope::new(
            Actor::Node("node-1".into()),
            started,
            EventData::LeaseStarted(fixtures::started(lease, "node-1", started)),
        ),
    ]
}

fn end_of(lease: Uuid, ended: DateTime<Utc>) -> Envelope {
    Envelope::new(
        Actor::Node("node-1".into()),
        ended,
        EventData::LeaseEnded(fixtures::ended(lease, "node-1", ended, EndReason::Stopped)),
    )
}

struct Pricing {
    running: Running,
    shutdown: CancellationToken,
}

impl Pricing {
    async fn stop(self) {
        self.shutdown.cancel();
        self.running.wait().await.expect("pricing stops cleanly");
    }
}

fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
}

#[tokio::test]
async fn a_finished_lease_is_charged_and_invoiced() {
    let env = Env::new().await;
    let pricing = env.start_pricing().await;
    let (tenant, lease) = (Uuid::now_v7(), Uuid::now_v7());
    let t = at(2026, 12, 2, 10, 0, 0);
    env.lease(tenant, lease, t, t + chrono::Duration::seconds(90))
        .await;

    let invoice = env.charges_with(tenant, "2026-12", 1).await;
    assert_eq!(invoice.tenant_id, tenant);
    assert_eq!(invoice.currency, "CNY");
    let line = &invoice.lines[0];
    assert_eq!(line.lease_id, lease);
    assert_eq!(line.tier, "basic");
    assert_eq!((line.gpus, line.vram_gb), (2, 80));
    assert_eq!(line.billed_seconds, 90);
    assert_eq!(line.unit_price.to_string(), "0.5");
    assert_eq!(line.amount.to_string(), "1.00");
    assert_eq!((line.from, line.to), (t, t + chrono::Duration::seconds(90)));
    assert_eq!(line.price_book_version, 1);
    assert_eq!(invoice.total.to_string(), "1.00");
    assert_eq!(invoice.content_hash.len(), 64);

    // The charge event itself: deterministic id, caused by lease.ended, by pricing.
    let charges = env.charges_in_log().await;
    assert_eq!(charges.len(), 1);
    assert_eq!(
        charges[0].charge_id,
        lh_domain::rating::hourly_charge_id(lease, t)
    );

    // Other tenants and periods are empty; a bad period is refused.
    assert!(env
        .charges(Uuid::now_v7(), "2026-12")
        .await
        .lines
        .is_empty());
    assert_eq!(
        env.charges(tenant, "2026-11").await.total.to_string(),
        "0.00"
    );
    let err = rpc::call::<_, ChargeStatement>(
        &env.bus,
        CHARGES_SUBJECT,
        &ChargeStatementRequest {
            tenant_id: tenant,
            period: "2026-13".into(),
        },
        Duration::from_secs(5),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("period must be YYYY-MM"), "{err}");
    pricing.stop().await;
}

#[tokio::test]
async fn a_restart_never_charges_twice_and_catches_up_on_missed_leases() {
    let env = Env::new().await;
    let pricing = env.start_pricing().await;
    let (tenant, lease) = (Uuid::now_v7(), Uuid::now_v7());
    let t = at(2026, 12, 2, 10, 0, 0);
    env.lease(tenant, lease, t, t + chrono::Duration::seconds(90))
        .await;
    let before = env.charges_with(tenant, "2026-12", 1).await;
    pricing.stop().await;

    // A lease that ends while pricing is down is charged when it is back.
    let (tenant2, lease2) = (Uuid::now_v7(), Uuid::now_v7());
    env.lease(tenant2, lease2, t, t + chrono::Duration::seconds(3600))
        .await;

    let pricing = env.start_pricing().await;
    let missed = env.charges_with(tenant2, "2026-12", 1).await;
    assert_eq!(missed.total.to_string(), "40.00");
    // Give a wrongly re-charging fold every chance to show itself.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let charges = env.charges_in_log().await;
    assert_eq!(
        charges.iter().filter(|c| c.lease_id == lease).count(),
        1,
        "{charges:?}"
    );
    assert_eq!(charges.len(), 2, "{charges:?}");
    let after = env.charges(tenant, "2026-12").await;
    assert_eq!(after, before);
    pricing.stop().await;

    // A third start, with everything charged, publishes nothing.
    let pricing = env.start_pricing().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.charges_in_log().await.len(), 2);
    assert_eq!(
        env.charges(tenant, "2026-12").await.content_hash,
        before.content_hash
    );
    pricing.stop().await;
}

#[tokio::test]
async fn a_rebuild_gives_identical_rows() {
    let env = Env::new().await;
    let pricing = env.start_pricing().await;
    let tenant = Uuid::now_v7();
    for start in [
        at(2026, 11, 30, 22, 0, 0),
        at(2026, 11, 30, 22, 40, 0),
        at(2026, 11, 30, 23, 50, 0),
    ] {
        env.lease(
            tenant,
            Uuid::now_v7(),
            start,
            start + chrono::Duration::minutes(30),
        )
        .await;
    }
    // 3 leases, the last two span an hour, the last one the month
    // boundary: 5 lines (one per lease and UTC hour).
    env.charges_with(tenant, "2026-12", 1).await;
    let live = env.charges_with(tenant, "2026-11", 4).await;

    let mut seen = 0;
    let report = lh_pricing::rebuild(&env.config, "pricing_rebuild", false, |_, _| seen += 1)
        .await
        .expect("rebuild runs");
    // The 5 charges and the price book (the cost report's on-demand price).
    assert_eq!(seen, 6);
    let reached = report.reached;
    assert!(reached > 0);
    let lines = &report.tables[0];
    assert_eq!(lines.live.0, 5);
    assert!(lines.identical(), "live and rebuilt invoice_lines differ");

    // The rebuilt schema answers with the very same invoice (same content hash).
    let pool = lh_projection::connect_schema(env.config.database_url.expose(), "pricing_rebuild")
        .await
        .unwrap();
    let request = ChargeStatementRequest {
        tenant_id: tenant,
        period: "2026-11".into(),
    };
    let rebuilt = lh_pricing::projection::read_charge_statement(&pool, &request)
        .await
        .unwrap();
    assert_eq!(rebuilt.content_hash, live.content_hash);
    pool.close().await;

    // Rebuilding into the live schema is refused: it would be dropped.
    assert!(
        lh_pricing::rebuild(&env.config, "pricing", false, |_, _| {})
            .await
            .is_err()
    );
    pricing.stop().await;

    // The binary's `rebuild --swap`, with the service stopped as documented.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_lh-pricing"))
        .args(["rebuild", "--into", "pricing_cli", "--swap"])
        .env("LH_NATS_URL", env.config.common.nats_url.as_str())
        .env("DATABASE_URL", env.config.database_url.expose())
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("lh-pricing runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("rebuilt pricing_cli up to sequence {reached}")),
        "{stdout}"
    );
    assert!(stdout.contains("identical"), "{stdout}");
    assert!(stdout.contains("is now the live schema"), "{stdout}");
    let pricing = env.start_pricing().await;
    assert_eq!(env.charges(tenant, "2026-11").await, live);
    pricing.stop().await;
}

#[tokio::test]
async fn a_lease_across_a_month_boundary_is_billed_in_both_periods() {
    let env = Env::new().await;
    let pricing = env.start_pricing().await;
    let (tenant, lease) = (Uuid::now_v7(), Uuid::now_v7());
    let start = at(2026, 11, 30, 23, 59, 0);
    let end = at(2026, 12, 1, 0, 1, 0);
    env.lease(tenant, lease, start, end).await;

    let november = env.charges_with(tenant, "2026-11", 1).await;
    let december = env.charges_with(tenant, "2026-12", 1).await;
    let (n, d) = (&november.lines[0], &december.lines[0]);
    assert_eq!((n.lease_id, d.lease_id), (lease, lease));
    assert_eq!((n.from, n.to), (start, at(2026, 12, 1, 0, 0, 0)));
    assert_eq!((d.from, d.to), (at(2026, 12, 1, 0, 0, 0), end));
    assert_eq!((n.billed_seconds, d.billed_seconds), (60, 60));
    // 80 GB × 0.5 CNY/GB·h × 60 s / 3600 = 0.666… → 0.67 up to midnight;
    // the whole lease, 1.333…, is 1.33, so the second line is 0.66.
    assert_eq!(
        (n.amount.to_string(), d.amount.to_string()),
        ("0.67".into(), "0.66".into())
    );
    assert_eq!(november.total.to_string(), "0.67");

    // Both charges went out in one atomic batch.
    let charges = env.charges_in_log().await;
    assert_eq!(charges.len(), 2);
    assert_eq!(
        charges
            .iter()
            .map(|c| c.period.as_str())
            .collect::<Vec<_>>(),
        ["2026-11", "2026-12"]
    );
    pricing.stop().await;
}

#[tokio::test]
async fn the_server_refuses_a_second_batch_of_charges_for_a_lease() {
    let env = Env::new().await;
    let pricing = env.start_pricing().await;
    let (tenant, lease) = (Uuid::now_v7(), Uuid::now_v7());
    let start = at(2026, 11, 30, 23, 0, 0);
    env.lease(tenant, lease, start, start + chrono::Duration::hours(2))
        .await;
    env.charges_with(tenant, "2026-12", 1).await;
    pricing.stop().await;
    let charges = env.charges_in_log().await;
    assert_eq!(charges.len(), 2);

    // Another replica (or a retry) publishing the same bill again.
    let cause = Envelope::new(
        Actor::Node("node-1".into()),
        start,
        EventData::LeaseStopRequested(LeaseStopRequested { lease_id: lease }),
    );
    let bill = lh_pricing::charges::Bill {
        lease_id: lease,
        charges: charges.clone(),
        cause,
        after_sequence: 0,
    };
    let again = lh_pricing::charges::bill_batches(&bill, Utc::now()).remove(0);
    match env.bus.publish_atomic(&again).await {
        Ok(appended) => assert!(appended.duplicate, "a duplicate stored nothing"),
        Err(lh_bus::BusError::Conflict(_)) | Err(lh_bus::BusError::DuplicateBatch(_)) => {}
        Err(e) => panic!("unexpected error {e}"),
    }
    // Same bill with fresh event ids (as if outside the duplicate window):
    // only the expected subject sequence 0 stands in the way.
    let fresh: Vec<(Envelope, Expect)> = lh_pricing::charges::envelopes(&bill, Utc::now())
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let expect = if i == 0 {
                Expect::LastSubjectSequence(0)
            } else {
                Expect::Any
            };
            (e.with_id(Uuid::now_v7()), expect)
        })
        .collect();
    let err = env.bus.publish_atomic(&fresh).await.unwrap_err();
    assert!(matches!(err, lh_bus::BusError::Conflict(_)), "{err}");
    assert_eq!(env.charges_in_log().await.len(), 2);
}

#[tokio::test]
async fn a_price_book_is_published_only_when_valid_and_newer() {
    use lh_rpc::price_book::{self, PublishReply, PublishRequest};
    let env = Env::new().await;
    let pricing = env.start_pricing().await;
    let books = price_book::list(&env.bus, WAIT).await.unwrap().books;
    assert_eq!(books.len(), 1, "the default book: {books:?}");
    let mut book = books[0].clone();
    book.version = 2;
    book.effective_from = Utc::now();
    book.tiers[0].model = Some(ChargeModel::Flat {
        price_cny_per_gb_hour: "0.6".parse().unwrap(),
    });
    let publish = |book: PriceBookPublished| {
        let bus = env.bus.clone();
        async move {
            price_book::publish(&bus, &PublishRequest { book }, WAIT)
                .await
                .unwrap()
        }
    };
    assert!(matches!(
        publish(book.clone()).await,
        PublishReply::Published { version: 2, .. }
    ));
    // The same version again, however it is sent, is refused by name.
    let deadline = Instant::now() + WAIT;
    loop {
        match publish(book.clone()).await {
            PublishReply::Refused { field, detail } if detail.contains("greater than 2") => {
                assert_eq!(field, "version");
                break;
            }
            // The fold has not read version 2 yet: the guard refused it.
            PublishReply::Refused { field, .. } => assert_eq!(field, "version"),
            other => panic!("published twice: {other:?}"),
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut bad = book.clone();
    bad.version = 3;
    bad.tiers[1].model = Some(ChargeModel::Graduated {
        steps: vec![PriceStep {
            from_hour: 2,
            price_cny_per_gb_hour: 1.into(),
        }],
    });
    assert_eq!(
        publish(bad).await,
        PublishReply::Refused {
            field: "tiers[1].model.steps[0].from_hour".into(),
            detail: "the first step starts at hour 0".into()
        }
    );
    let mut past = book.clone();
    past.version = 3;
    past.effective_from = Utc::now() - chrono::Duration::hours(1);
    assert!(
        matches!(publish(past).await, PublishReply::Refused { field, .. } if field == "effective_from")
    );
    let books = price_book::list(&env.bus, WAIT).await.unwrap().books;
    assert_eq!(
        books.iter().map(|b| b.version).collect::<Vec<_>>(),
        vec![1, 2]
    );
    pricing.stop().await;
}

impl Env {
    /// Waits until the log holds `n` charges of `lease`; returns them.
    async fn charges_of(&self, lease: Uuid, n: usize) -> Vec<ChargeAccrued> {
        let deadline = Instant::now() + WAIT;
        loop {
            let charges: Vec<_> = self
                .charges_in_log()
                .await
                .into_iter()
                .filter(|c| c.lease_id == lease)
                .collect();
            if charges.len() >= n {
                assert_eq!(charges.len(), n, "{charges:?}");
                return charges;
            }
            assert!(Instant::now() < deadline, "only {charges:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn sum(charges: &[ChargeAccrued]) -> String {
    charges
        .iter()
        .map(|c| c.amount)
        .sum::<rust_decimal::Decimal>()
        .to_string()
}

/// `GB x price x seconds / 3600`, rounded to the fen half away from zero:
/// the bill of a whole lease, worked out apart from the engine.
fn expected(gb: u32, price: &str, seconds: i64) -> String {
    let price: rust_decimal::Decimal = price.parse().unwrap();
    (rust_decimal::Decimal::from(gb) * price * rust_decimal::Decimal::from(seconds)
        / rust_decimal::Decimal::from(3600))
    .round_dp_with_strategy(2, rust_decimal::RoundingStrategy::MidpointAwayFromZero)
    .to_string()
}

#[tokio::test]
async fn accrual_survives_a_restart_and_a_second_replica_without_double_charges() {
    let mut env = Env::new().await;
    let clock = lh_service::clock::ManualClock::new(at(2026, 11, 10, 11, 10, 0));
    env.config.clocks.charges = Some(clock.shared());
    let (tenant, lease) = (Uuid::now_v7(), Uuid::now_v7());
    env.store(lifecycle(
        tenant,
        lease,
        Tier::Basic,
        at(2026, 11, 10, 9, 30, 0),
    ))
    .await;
    // 11:10: the hours 09:00 (from 09:30) and 10:00 are over.
    let pricing = env.start_pricing().await;
    let first = env.charges_of(lease, 2).await;
    assert_eq!(
        first
            .iter()
            .map(|c| c.amount.to_string())
            .collect::<Vec<_>>(),
        ["20.00", "40.00"]
    );
    pricing.stop().await;

    // Down over two more hours; back as two replicas at once.
    clock.set(at(2026, 11, 10, 13, 10, 0));
    let (one, two) = (env.start_pricing().await, env.start_pricing().await);
    env.charges_of(lease, 4).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.charges_of(lease, 4).await;

    env.store(vec![end_of(lease, at(2026, 11, 10, 13, 20, 0))])
        .await;
    let all = env.charges_of(lease, 5).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.charges_of(lease, 5).await;
    let ids: std::collections::HashSet<_> = all.iter().map(|c| c.charge_id).collect();
    assert_eq!(ids.len(), 5);
    let hours: Vec<_> = all.iter().map(|c| (c.from, c.to)).collect();
    assert_eq!(
        hours[2],
        (at(2026, 11, 10, 11, 0, 0), at(2026, 11, 10, 12, 0, 0))
    );
    assert_eq!(
        hours[4],
        (at(2026, 11, 10, 13, 0, 0), at(2026, 11, 10, 13, 20, 0))
    );
    // 80 GB x 0.5 CNY/GB-h x 3 h 50 min.
    assert_eq!(sum(&all), expected(80, "0.5", 13_800));
    assert_eq!(sum(&all), "153.33");
    let invoice = env.charges_with(tenant, "2026-11", 5).await;
    assert_eq!(invoice.total.to_string(), "153.33");
    one.stop().await;
    two.stop().await;
}

#[tokio::test]
async fn the_notice_period_and_a_failure_gap_are_not_billed() {
    let mut env = Env::new().await;
    // Just after the lease ended: no hour of it is over yet.
    env.config.clocks.charges =
        Some(lh_service::clock::ManualClock::new(at(2026, 11, 12, 10, 43, 0)).shared());
    let pricing = env.start_pricing().await;
    let (tenant, lease) = (Uuid::now_v7(), Uuid::now_v7());
    let t = |m: u32| at(2026, 11, 12, 10, m, 0);
    let scheduler = Actor::Service("lh-scheduler".into());
    let mut events = lifecycle(tenant, lease, Tier::Basic, t(0));
    // node-1 last heard at 10:20; the lease runs again on node-2 at 10:25.
    events.push(Envelope::new(
        scheduler.clone(),
        t(21),
        EventData::LeaseMigrated(LeaseMigrated {
            lease_id: lease,
            reason: "node node-1 lost".into(),
            from_node_id: "node-1".into(),
            from_gpu_indices: vec![0, 1],
            billing_ends_at: t(20),
            to: None,
        }),
    ));
    events.push(Envelope::new(
        scheduler.clone(),
        t(24),
        EventData::LeasePlaced(fixtures::placed(
            lease,
            "node-2",
            "cn-north-1",
            fixtures::MODEL,
            fixtures::MODEL_VRAM_GB,
            &[0, 1],
        )),
    ));
    events.push(Envelope::new(
        Actor::Node("node-2".into()),
        t(25),
        EventData::LeaseStarted(fixtures::started(lease, "node-2", t(25))),
    ));
    // Noticed at 10:40, ended at its deadline 10:42.
    events.push(Envelope::new(
        scheduler,
        t(40),
        EventData::LeasePreemptionNoticed(LeasePreemptionNoticed {
            lease_id: lease,
            node_id: "node-2".into(),
            preempted_for: Uuid::now_v7(),
            deadline: t(42),
            reason: lh_events::PreemptionReason::Capacity,
        }),
    ));
    events.push(Envelope::new(
        Actor::Node("node-2".into()),
        t(42),
        EventData::LeaseEnded(fixtures::ended(
            lease,
            "node-2",
            t(42),
            EndReason::Preempted,
        )),
    ));
    env.store(events).await;
    let charges = env.charges_of(lease, 1).await;
    // 10:00-10:20 and 10:25-10:40: 35 minutes of 42.
    assert_eq!(charges[0].billed_seconds, 35 * 60);
    assert_eq!(sum(&charges), expected(80, "0.5", 35 * 60));
    pricing.stop().await;
}

#[tokio::test]
async fn each_tier_is_billed_to_the_cent_across_a_book_change_and_spot_prices() {
    use chrono::{Duration as D, SubsecRound};
    use lh_rpc::price_book::{self, PublishReply, PublishRequest};
    // Leases running now, by the wall clock.
    let mut env = Env::new().await;
    env.config.clocks.charges = None;
    let pricing = env.start_pricing().await;
    let w0 = Utc::now().trunc_subsecs(0);
    let tenant = Uuid::now_v7();
    let (basic, performance, spot, reserved, later) = (
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
    );
    let starts = [
        (basic, Tier::Basic, w0 - D::hours(2)),
        (performance, Tier::Performance, w0 - D::hours(7)),
        (spot, Tier::Spot, w0 - D::minutes(90)),
        (reserved, Tier::Reserved, w0 - D::hours(1)),
    ];
    // The market of the spot lease's zone and model, and another one.
    let spot_price = |at: DateTime<Utc>, zone: &str, price: &str| {
        Envelope::new(
            Actor::Service("lh-spot-broker".into()),
            at,
            EventData::SpotPriceSet(SpotPriceSet {
                zone: zone.into(),
                gpu_model: fixtures::MODEL.into(),
                price_cny_per_gb_hour: price.parse().unwrap(),
                utilisation: rust_decimal::Decimal::ZERO,
                gpus_total: 8,
                gpus_used: 1,
            }),
        )
    };
    env.store(vec![
        spot_price(w0 - D::minutes(100), "cn-north-1", "0.1"),
        spot_price(w0 - D::minutes(100), "elsewhere", "9"),
        spot_price(w0 - D::minutes(60), "cn-north-1", "0.3"),
        spot_price(w0 - D::minutes(5), "cn-north-1", "0.15"),
    ])
    .await;
    for (lease, tier, start) in starts {
        env.store(lifecycle(tenant, lease, tier, start)).await;
    }
    // Version 2 from now: dearer basic and performance.
    let mut v2 = price_book::list(&env.bus, WAIT).await.unwrap().books[0].clone();
    v2.version = 2;
    v2.effective_from = Utc::now();
    v2.tiers[0].price_cny_per_gb_hour = "0.7".parse().unwrap();
    v2.tiers[0].model = Some(ChargeModel::Flat {
        price_cny_per_gb_hour: "0.7".parse().unwrap(),
    });
    v2.tiers[1].model = Some(ChargeModel::Flat {
        price_cny_per_gb_hour: "9".parse().unwrap(),
    });
    let published = price_book::publish(&env.bus, &PublishRequest { book: v2.clone() }, WAIT)
        .await
        .unwrap();
    assert!(matches!(
        published,
        PublishReply::Published { version: 2, .. }
    ));
    // A lease started under version 2, once its reports can be stored.
    let later_start = v2.effective_from.trunc_subsecs(0) + D::seconds(1);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let mut events = lifecycle(tenant, later, Tier::Basic, later_start);
    events.push(end_of(later, later_start + D::seconds(2)));
    env.store(events).await;
    let end = Utc::now().trunc_subsecs(0);
    for (lease, _, _) in starts {
        env.store(vec![end_of(lease, end)]).await;
    }

    let billed = |charges: &[ChargeAccrued]| {
        assert!(
            charges.iter().all(|c| c.price_book_version == 1),
            "{charges:?}"
        );
        charges.iter().map(|c| c.billed_seconds as i64).sum::<i64>()
    };
    let env = &env;
    let done = |lease| async move {
        let deadline = Instant::now() + WAIT;
        loop {
            let charges: Vec<_> = env
                .charges_in_log()
                .await
                .into_iter()
                .filter(|c| c.lease_id == lease)
                .collect();
            if charges.last().is_some_and(|c| c.to == end) {
                return charges;
            }
            assert!(Instant::now() < deadline, "{charges:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let secs = |from: DateTime<Utc>| (end - from).num_seconds();

    let charges = done(basic).await;
    assert_eq!(billed(&charges), secs(w0 - D::hours(2)));
    assert_eq!(sum(&charges), expected(80, "0.5", secs(w0 - D::hours(2))));

    // 2.0 for 3 h, 1.6 for 3 h, 1.2 after: per GB, 10.8 + 1.2 x the rest.
    let charges = done(performance).await;
    let age = secs(w0 - D::hours(7));
    assert_eq!(billed(&charges), age);
    let ladder = rust_decimal::Decimal::from(80)
        * (rust_decimal::Decimal::new(108, 1)
            + rust_decimal::Decimal::new(12, 1) * rust_decimal::Decimal::from(age - 6 * 3600)
                / rust_decimal::Decimal::from(3600));
    assert_eq!(
        sum(&charges),
        ladder
            .round_dp_with_strategy(2, rust_decimal::RoundingStrategy::MidpointAwayFromZero)
            .to_string()
    );

    // 0.1 until w0-60m (30 min), 0.3 until w0-5m (55 min), then 0.15.
    let charges = done(spot).await;
    let spot_exact = rust_decimal::Decimal::from(80)
        * (rust_decimal::Decimal::new(1, 1) * rust_decimal::Decimal::from(1800)
            + rust_decimal::Decimal::new(3, 1) * rust_decimal::Decimal::from(55 * 60)
            + rust_decimal::Decimal::new(15, 2)
                * rust_decimal::Decimal::from(secs(w0 - D::minutes(5))))
        / rust_decimal::Decimal::from(3600);
    assert_eq!(
        sum(&charges),
        spot_exact
            .round_dp_with_strategy(2, rust_decimal::RoundingStrategy::MidpointAwayFromZero)
            .to_string()
    );
    assert!(charges.iter().all(|c| c.tier == Tier::Spot));

    // No reservation covers it: billed as basic.
    let charges = done(reserved).await;
    assert_eq!(sum(&charges), expected(80, "0.5", secs(w0 - D::hours(1))));
    assert!(charges.iter().all(|c| c.tier == Tier::Reserved));

    let charges = env.charges_of(later, 1).await;
    assert_eq!(charges[0].price_book_version, 2);
    assert_eq!(sum(&charges), expected(80, "0.7", 2));
    pricing.stop().await;
}

#[tokio::test]
async fn a_reservation_is_committed_billed_as_its_term_passes_and_covers_a_reserved_lease() {
    use chrono::{Duration as D, SubsecRound};
    use lh_rpc::reservation::{self, CommitReply, CommitRequest, ListRequest};
    let mut env = Env::new().await;
    let w0 = Utc::now().trunc_subsecs(0);
    let clock = lh_service::clock::ManualClock::new(w0);
    env.config.clocks.charges = Some(clock.shared());
    let pricing = env.start_pricing().await;
    let tenant = Uuid::now_v7();
    let ask = |gpu_model: &str, gpus: u32| CommitRequest {
        tenant_id: tenant,
        gpu_model: gpu_model.into(),
        zone: "cn-north-1".into(),
        gpus,
        term_days: None,
        starts_at: Some(w0),
        requested_by: None,
    };
    let commit = |request: CommitRequest| {
        let bus = env.bus.clone();
        async move { reservation::commit(&bus, &request, WAIT).await.unwrap() }
    };
    assert_eq!(
        commit(ask("no-such-gpu", 2)).await,
        CommitReply::Refused {
            field: "gpu_model".into(),
            detail: "not a GPU model of the catalog".into()
        }
    );
    assert!(matches!(commit(ask(fixtures::MODEL, 0)).await,
        CommitReply::Refused { field, .. } if field == "gpus"));
    let CommitReply::Committed { reservation: r } = commit(ask(fixtures::MODEL, 2)).await else {
        panic!("refused")
    };
    assert_eq!(r.ends_at - r.starts_at, D::days(30));
    // Listed once the fold has read it; another tenant sees none.
    let deadline = Instant::now() + WAIT;
    loop {
        let mine = reservation::list(
            &env.bus,
            &ListRequest {
                tenant_id: Some(tenant),
            },
            WAIT,
        )
        .await
        .unwrap()
        .reservations;
        if mine == vec![r.clone()] {
            break;
        }
        assert!(Instant::now() < deadline, "{mine:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let theirs = ListRequest {
        tenant_id: Some(Uuid::now_v7()),
    };
    assert!(reservation::list(&env.bus, &theirs, WAIT)
        .await
        .unwrap()
        .reservations
        .is_empty());

    // A reserved lease of 2 GPUs in its term: covered, charged nothing.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let lease = Uuid::now_v7();
    let mut events = lifecycle(tenant, lease, Tier::Reserved, w0 + D::seconds(1));
    events.push(end_of(lease, w0 + D::seconds(2)));
    env.store(events).await;
    let charges = env.charges_of(lease, 1).await;
    assert_eq!(charges[0].reservation_id, Some(r.reservation_id));
    assert_eq!(charges[0].amount.to_string(), "0.00");

    // Two hours on: the commitment is billed for them, used or not.
    clock.set(w0 + D::minutes(130));
    let billed_to = lh_domain::rating::hour_start(w0 + D::minutes(125));
    let deadline = Instant::now() + WAIT;
    let commitment = loop {
        let charges = env.charges_in_log().await;
        let commitment: Vec<_> = charges
            .into_iter()
            .filter(|c| c.lease_id == r.reservation_id)
            .collect();
        if commitment.last().is_some_and(|c| c.to == billed_to) {
            break commitment;
        }
        assert!(Instant::now() < deadline, "{commitment:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(commitment
        .iter()
        .all(|c| c.tier == Tier::Reserved && c.reservation_id == Some(r.reservation_id)));
    // 2 x 40 GB x 0.35 CNY/GB-h.
    assert_eq!(
        sum(&commitment),
        expected(80, "0.35", (billed_to - w0).num_seconds())
    );
    pricing.stop().await;
}

#[tokio::test]
async fn a_lease_made_from_a_quote_is_billed_on_the_quoted_book_after_a_newer_one() {
    use lh_rpc::price_book::{self, PublishReply, PublishRequest};
    use lh_rpc::quote::{self, GetRequest, QuoteReply, QuoteRequest};
    let mut env = Env::new().await;
    let now = Utc::now();
    // Held at now: the leases below start after it, so no hour of theirs is
    // due while they run, and each is charged once, at its end (a clock
    // ahead would charge a lease folded as started before its end is read).
    env.config.clocks.charges = Some(lh_service::clock::ManualClock::new(now).shared());
    let pricing = env.start_pricing().await;
    let tenant = Uuid::now_v7();
    let ask = |tenant_id: Uuid, tier: Tier| QuoteRequest {
        tenant_id,
        gpus: Some(2),
        fraction: None,
        mig_profile: None,
        gpu_model: fixtures::MODEL.into(),
        tier,
        duration_seconds: 3600,
    };
    let QuoteReply::Issued { quote: issued } =
        quote::issue(&env.bus, &ask(tenant, Tier::Basic), WAIT)
            .await
            .unwrap()
    else {
        panic!("the quote is refused");
    };
    // 80 GB for an hour at the default book's 0.5 CNY/GB-h.
    assert_eq!(issued.amount.to_string(), "40.00");
    assert_eq!(issued.price_book_version, 1);
    assert!(!issued.price_moves);
    assert!(issued.expires_at > now);
    let QuoteReply::Issued { quote: spot } = quote::issue(&env.bus, &ask(tenant, Tier::Spot), WAIT)
        .await
        .unwrap()
    else {
        panic!("the spot quote is refused");
    };
    assert!(spot.price_moves, "a spot quote says its price moves");
    let mut never = ask(tenant, Tier::Basic);
    never.duration_seconds = 0;
    assert!(matches!(
        quote::issue(&env.bus, &never, WAIT).await.unwrap(),
        QuoteReply::Refused { field, .. } if field == "duration_seconds"
    ));

    // A far dearer book from now on.
    let mut book = price_book::list(&env.bus, WAIT).await.unwrap().books[0].clone();
    book.version = 2;
    let effective_from = Utc::now();
    book.effective_from = effective_from;
    book.tiers[0].model = Some(ChargeModel::Flat {
        price_cny_per_gb_hour: "90".parse().unwrap(),
    });
    assert!(matches!(
        price_book::publish(&env.bus, &PublishRequest { book }, WAIT)
            .await
            .unwrap(),
        PublishReply::Published { version: 2, .. }
    ));
    // The gateway finds the quote to check a request against it.
    let deadline = Instant::now() + WAIT;
    while quote::get(
        &env.bus,
        &GetRequest {
            quote_id: issued.quote_id,
        },
        WAIT,
    )
    .await
    .unwrap()
    .is_none()
    {
        assert!(Instant::now() < deadline, "the quote is never found");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Two leases start after the new book, two seconds each (a node
    // cannot report a time after the log stored it): one asked for with
    // the quote, one without.
    let started = effective_from + chrono::Duration::seconds(1);
    let ended = started + chrono::Duration::seconds(2);
    tokio::time::sleep_until((Instant::now() + Duration::from_secs(4)).into()).await;
    let (quoted, plain) = (Uuid::now_v7(), Uuid::now_v7());
    let mut events = lifecycle(tenant, quoted, Tier::Basic, started);
    if let EventData::LeaseRequested(r) = &mut events[0].data {
        r.quote_id = Some(issued.quote_id);
    }
    events.push(end_of(quoted, ended));
    env.store(events).await;
    env.lease(tenant, plain, started, ended).await;

    let quoted_charges = env.charges_of(quoted, 1).await;
    assert_eq!(quoted_charges[0].price_book_version, 1);
    // 80 GB x 0.5 CNY/GB-h x 2 s.
    assert_eq!(sum(&quoted_charges), "0.02");
    let plain_charges = env.charges_of(plain, 1).await;
    assert_eq!(plain_charges[0].price_book_version, 2);
    // 80 GB x 90 CNY/GB-h x 2 s.
    assert_eq!(sum(&plain_charges), "4.00");
    pricing.stop().await;
}
