//! Pricing against a real nats-server and a real PostgreSQL (lh-testkit):
//! the lease events are published with lh_bus as the gateway, scheduler and
//! node-agent would, and the invoice is asked for over the NATS RPC as the
//! gateway would.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use lh_bus::{rpc, Bus, BusConfig, Expect};
use lh_events::*;
use lh_pricing::Config;
use lh_rpc::invoice::{Invoice, InvoiceRequest, INVOICE_SUBJECT};
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
        // These tests play a node's reports of times long past (a month's
        // end, an hour's run) as if they arrived now: the node clock check
        // would hold them to now, so it is opened wide here (its own tests
        // are pricing's charge tests).
        let config = Config {
            node_clock_skew_secs: 400 * 24 * 3600,
            ..Config::for_test(&nats.url(), &database_url)
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

    /// The four lifecycle events of a lease of 2 GPUs of 40 GB, tier basic.
    async fn lease(&self, tenant: Uuid, lease: Uuid, started: DateTime<Utc>, ended: DateTime<Utc>) {
        let events = [
            Envelope::new(
                Actor::Tenant(tenant),
                started,
                EventData::LeaseRequested(fixtures::whole_request(
                    lease,
                    tenant,
                    2,
                    fixtures::MODEL,
                )),
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
            Envelope::new(
                Actor::Node("node-1".into()),
                ended,
                EventData::LeaseEnded(fixtures::ended(lease, "node-1", ended, EndReason::Stopped)),
            ),
        ];
        for event in events {
            self.bus
                .publish(&event, Expect::Any)
                .await
                .expect("lease event stored");
        }
    }

    /// The invoice as the gateway would ask for it, checked to be JSON with
    /// money as strings.
    async fn invoice(&self, tenant: Uuid, period: &str) -> Invoice {
        let raw: serde_json::Value = rpc::call(
            &self.bus,
            INVOICE_SUBJECT,
            &InvoiceRequest {
                tenant_id: tenant,
                period: period.into(),
            },
            Duration::from_secs(5),
        )
        .await
        .expect("invoice answered");
        assert!(raw["total"].is_string(), "total is a decimal string: {raw}");
        for line in raw["lines"].as_array().unwrap() {
            assert!(
                line["amount"].is_string() && line["unit_price"].is_string(),
                "{line}"
            );
        }
        let invoice: Invoice = serde_json::from_value(raw).expect("an invoice");
        assert!(invoice.verify(), "total and content hash match the lines");
        invoice
    }

    /// Asks until the invoice has `lines` lines (the projection is eventually consistent).
    async fn invoice_with(&self, tenant: Uuid, period: &str, lines: usize) -> Invoice {
        let deadline = Instant::now() + WAIT;
        loop {
            let invoice = self.invoice(tenant, period).await;
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

    let invoice = env.invoice_with(tenant, "2026-12", 1).await;
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
        derived_id(&["charge", &lease.to_string(), "2026-12"])
    );

    // Other tenants and periods are empty; a bad period is refused.
    assert!(env
        .invoice(Uuid::now_v7(), "2026-12")
        .await
        .lines
        .is_empty());
    assert_eq!(
        env.invoice(tenant, "2026-11").await.total.to_string(),
        "0.00"
    );
    let err = rpc::call::<_, Invoice>(
        &env.bus,
        INVOICE_SUBJECT,
        &InvoiceRequest {
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
    let before = env.invoice_with(tenant, "2026-12", 1).await;
    pricing.stop().await;

    // A lease that ends while pricing is down is charged when it is back.
    let (tenant2, lease2) = (Uuid::now_v7(), Uuid::now_v7());
    env.lease(tenant2, lease2, t, t + chrono::Duration::seconds(3600))
        .await;

    let pricing = env.start_pricing().await;
    let missed = env.invoice_with(tenant2, "2026-12", 1).await;
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
    let after = env.invoice(tenant, "2026-12").await;
    assert_eq!(after, before);
    pricing.stop().await;

    // A third start, with everything charged, publishes nothing.
    let pricing = env.start_pricing().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.charges_in_log().await.len(), 2);
    assert_eq!(
        env.invoice(tenant, "2026-12").await.content_hash,
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
    // 3 leases, the last one spans the month boundary: 4 lines.
    env.invoice_with(tenant, "2026-12", 1).await;
    let live = env.invoice_with(tenant, "2026-11", 3).await;

    let mut seen = 0;
    let report = lh_pricing::rebuild(&env.config, "pricing_rebuild", false, |_, _| seen += 1)
        .await
        .expect("rebuild runs");
    assert_eq!(seen, 4);
    let reached = report.reached;
    assert!(reached > 0);
    let lines = &report.tables[0];
    assert_eq!(lines.live.0, 4);
    assert!(lines.identical(), "live and rebuilt invoice_lines differ");

    // The rebuilt schema answers with the very same invoice (same content hash).
    let pool = lh_projection::connect_schema(&env.config.database_url, "pricing_rebuild")
        .await
        .unwrap();
    let request = InvoiceRequest {
        tenant_id: tenant,
        period: "2026-11".into(),
    };
    let rebuilt = lh_pricing::projection::read_invoice(&pool, &request)
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
        .env("DATABASE_URL", env.config.database_url.as_str())
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
    assert_eq!(env.invoice(tenant, "2026-11").await, live);
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

    let november = env.invoice_with(tenant, "2026-11", 1).await;
    let december = env.invoice_with(tenant, "2026-12", 1).await;
    let (n, d) = (&november.lines[0], &december.lines[0]);
    assert_eq!((n.lease_id, d.lease_id), (lease, lease));
    assert_eq!((n.from, n.to), (start, at(2026, 12, 1, 0, 0, 0)));
    assert_eq!((d.from, d.to), (at(2026, 12, 1, 0, 0, 0), end));
    assert_eq!((n.billed_seconds, d.billed_seconds), (60, 60));
    // 80 GB × 0.5 CNY/GB·h × 60 s / 3600 = 0.666… → 0.67 on each line.
    assert_eq!(
        (n.amount.to_string(), d.amount.to_string()),
        ("0.67".into(), "0.67".into())
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
    env.invoice_with(tenant, "2026-12", 1).await;
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
