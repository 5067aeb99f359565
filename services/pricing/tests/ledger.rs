//! The ledger against a real nats-server and a real PostgreSQL (lh-testkit):
//! a generated month across a price book change issued and rebuilt to the
//! same hashes, a late charge that yields a note and leaves the invoice as
//! it was, a month of more leases than one event holds issued in parts (and
//! completed by the next ledger when only its first part was stored), and a
//! lost node that costs the tenant its SLA and earns a credit on the next
//! invoice; and the weekly cost report. The ledger's clock is moved by hand past a month's
//! grace period; lease events are published as the gateway, scheduler and
//! node agents would.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use lh_bus::{Bus, BusConfig, Expect};
use lh_events::*;
use lh_pricing::Config;
use lh_rpc::invoice_document::{
    DocumentKind, DocumentList, DocumentRequest, DocumentStatus, InvoiceDocument, ListRequest,
};
use lh_service::clock::ManualClock;
use lh_service::{CancellationToken, Running};
use lh_testkit::Nats;
use rust_decimal::Decimal;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);
const RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// The grace period these tests run with, in seconds.
const GRACE_SECS: i64 = 60;
const VRAM_GB: u32 = 2 * fixtures::MODEL_VRAM_GB;

fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
}

/// Just past the grace period of the month that ends at `month_end`.
fn after_grace(month_end: DateTime<Utc>) -> DateTime<Utc> {
    month_end + chrono::Duration::seconds(GRACE_SECS + 1)
}

struct Env {
    _nats: Nats,
    config: Config,
    bus: Bus,
    clock: ManualClock,
}

struct Pricing {
    running: Running,
    shutdown: CancellationToken,
}

impl Env {
    async fn new(now: DateTime<Utc>) -> Env {
        let (nats, database_url) = lh_testkit::nats_and_database().await;
        let config = Config {
            invoice_grace_secs: GRACE_SECS,
            accrual_grace_secs: GRACE_SECS,
            ..Config::for_replayed_reports(&nats.url(), &database_url, at(2026, 1, 1, 0, 0, 0))
        };
        let bus = Bus::connect(&BusConfig::new(nats.url(), "ledger-test"))
            .await
            .expect("bus connects");
        Env {
            _nats: nats,
            config,
            bus,
            clock: ManualClock::new(now),
        }
    }

    async fn start_pricing(&self) -> Pricing {
        let shutdown = CancellationToken::new();
        let mut config = self.config.clone();
        config.clocks.ledger = Some(self.clock.shared());
        let running = lh_pricing::start(config, shutdown.clone())
            .await
            .expect("pricing starts");
        lh_testkit::wait_ready("pricing", &running, WAIT).await;
        Pricing { running, shutdown }
    }

    async fn publish(&self, actor: Actor, occurred_at: DateTime<Utc>, data: EventData) {
        self.bus
            .publish(&Envelope::new(actor, occurred_at, data), Expect::Any)
            .await
            .expect("event stored");
    }

    /// A lease of 2 GPUs, tier basic, requested and placed on `node`.
    async fn lease_placed(&self, tenant: Uuid, lease: Uuid, node: &str, at: DateTime<Utc>) {
        let request = fixtures::whole_request(lease, tenant, 2, fixtures::MODEL);
        self.publish(
            Actor::Tenant(tenant),
            at,
            EventData::LeaseRequested(request),
        )
        .await;
        let placed = fixtures::placed(
            lease,
            node,
            "cn-north-1",
            fixtures::MODEL,
            fixtures::MODEL_VRAM_GB,
            &[0, 1],
        );
        self.publish(by_scheduler(), at, EventData::LeasePlaced(placed))
            .await;
    }

    async fn started(&self, lease: Uuid, node: &str, at: DateTime<Utc>) {
        let started = fixtures::started(lease, node, at);
        self.publish(
            Actor::Node(node.into()),
            at,
            EventData::LeaseStarted(started),
        )
        .await;
    }

    async fn ended(&self, lease: Uuid, node: &str, at: DateTime<Utc>) {
        let ended = fixtures::ended(lease, node, at, EndReason::Stopped);
        self.publish(Actor::Node(node.into()), at, EventData::LeaseEnded(ended))
            .await;
    }

    /// A lease that runs on one node from `from` to `to`.
    async fn lease(&self, tenant: Uuid, from: DateTime<Utc>, to: DateTime<Utc>) -> Uuid {
        let lease = Uuid::now_v7();
        self.lease_placed(tenant, lease, "node-1", from).await;
        self.started(lease, "node-1", from).await;
        self.ended(lease, "node-1", to).await;
        lease
    }

    /// A second price book version, effective from `from`, with `basic` at
    /// `basic_price` CNY per GB-hour.
    async fn price_book(&self, version: u32, from: DateTime<Utc>, basic_price: Decimal) {
        let mut book = lh_domain::rating::default_price_book(from);
        book.version = version;
        for tier in &mut book.tiers {
            if tier.tier == Tier::Basic {
                tier.price_cny_per_gb_hour = basic_price;
                tier.model = Some(lh_events::ChargeModel::Flat {
                    price_cny_per_gb_hour: basic_price,
                });
            }
        }
        let data = EventData::PriceBookPublished(book);
        self.publish(fixtures::owner_of(&data), from, data).await;
    }

    async fn document(&self, request: DocumentRequest) -> InvoiceDocument {
        let document = lh_rpc::invoice_document::document(&self.bus, &request, RPC_TIMEOUT)
            .await
            .expect("pricing answers")
            .expect("the document exists");
        assert!(document.verify(), "total and hash match: {document:?}");
        document
    }

    /// The tenant's invoice of `period` once `ready` says it is as wanted.
    async fn invoice_when(
        &self,
        tenant: Uuid,
        period: &str,
        ready: impl Fn(&InvoiceDocument) -> bool,
    ) -> InvoiceDocument {
        let deadline = Instant::now() + WAIT;
        loop {
            let document = self
                .document(DocumentRequest::ByPeriod {
                    tenant_id: tenant,
                    period: period.into(),
                })
                .await;
            if ready(&document) {
                return document;
            }
            assert!(Instant::now() < deadline, "never ready: {document:#?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The draft of `period` once it bills `seconds` in all.
    async fn draft_billing(&self, tenant: Uuid, period: &str, seconds: u64) -> InvoiceDocument {
        let draft = self
            .invoice_when(tenant, period, |d| billed(d) >= seconds)
            .await;
        assert_eq!(draft.status, DocumentStatus::Draft);
        assert_eq!(billed(&draft), seconds, "{draft:#?}");
        draft
    }

    async fn list(&self, tenant: Option<Uuid>, period: Option<&str>) -> DocumentList {
        let request = ListRequest {
            tenant_id: tenant,
            period: period.map(str::to_string),
            status: None,
            limit: 100,
        };
        lh_rpc::invoice_document::list(&self.bus, &request, RPC_TIMEOUT)
            .await
            .expect("pricing lists")
    }

    /// An hour of each of `leases` leases of `tenant` in October, as
    /// pricing would charge it, stored 64 at a time (a line each); and
    /// their sum.
    async fn charge_leases(&self, tenant: Uuid, leases: usize) -> (Vec<ChargeAccrued>, Decimal) {
        let charges: Vec<ChargeAccrued> = (0..leases)
            .map(|n| {
                let from = at(2026, 10, 1 + (n % 30) as u32, (n % 24) as u32, 0, 0);
                let amount = Decimal::new(100 + (n % 13) as i64, 2);
                ChargeAccrued {
                    charge_id: Uuid::now_v7(),
                    tenant_id: tenant,
                    lease_id: Uuid::now_v7(),
                    period: "2026-10".into(),
                    tier: Tier::Basic,
                    gpus: 2,
                    vram_gb: VRAM_GB,
                    from,
                    to: from + chrono::Duration::hours(1),
                    billed_seconds: 3600,
                    unit_price_cny_per_gb_hour: "0.5".parse().unwrap(),
                    amount,
                    currency: "CNY".into(),
                    price_book_version: 1,
                    age_seconds: None,
                    priced_gb_seconds: None,
                    reservation_id: None,
                }
            })
            .collect();
        let envelopes: Vec<(Envelope, Expect)> = charges
            .iter()
            .map(|c| {
                let data = EventData::ChargeAccrued(c.clone());
                let envelope = Envelope::new(fixtures::owner_of(&data), Utc::now(), data);
                (envelope, Expect::Any)
            })
            .collect();
        for batch in envelopes.chunks(lh_bus::MAX_BATCH_MESSAGES) {
            self.bus
                .publish_atomic(batch)
                .await
                .expect("charges stored");
        }
        let sum = charges.iter().map(|c| c.amount).sum();
        (charges, sum)
    }

    /// Every event of `filter` in the log.
    async fn log(&self, filter: &'static str) -> Vec<EventData> {
        let mut feed = self.bus.feed(&[filter], 1).await.unwrap();
        let mut out = Vec::new();
        while let Some(event) = feed.next_within(Duration::from_secs(1)).await {
            let event = event.unwrap();
            out.push(event.envelope.data);
            if event.pending == 0 {
                break;
            }
        }
        out
    }
}

impl Pricing {
    async fn stop(self) {
        self.shutdown.cancel();
        self.running.wait().await.expect("pricing stops cleanly");
    }
}

fn by_scheduler() -> Actor {
    Actor::Service("lh-scheduler".into())
}

fn billed(document: &InvoiceDocument) -> u64 {
    document.lines.iter().map(|l| l.billed_seconds).sum()
}

fn seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    (to - from).num_seconds() as u64
}

/// What `seconds` of the test lease cost at `price` per GB-hour, to the fen.
fn cost(seconds: u64, price: &str) -> Decimal {
    let price: Decimal = price.parse().unwrap();
    lh_domain::rating::round_amount(
        Decimal::from(VRAM_GB) * price * Decimal::from(seconds) / Decimal::from(3600),
    )
}

/// A small deterministic generator (the same month on every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

#[tokio::test]
async fn a_rebuilt_projection_gives_every_invoice_the_same_hash() {
    let october_end = at(2026, 11, 1, 0, 0, 0);
    let env = Env::new(at(2026, 10, 20, 0, 0, 0)).await;
    // basic costs 0.5 until mid-October, then 0.8.
    let change = at(2026, 10, 15, 0, 0, 0);
    env.price_book(1, at(2026, 9, 1, 0, 0, 0), "0.5".parse().unwrap())
        .await;
    let pricing = env.start_pricing().await;
    env.price_book(2, change, "0.8".parse().unwrap()).await;

    let tenants = [Uuid::now_v7(), Uuid::now_v7()];
    let mut october_seconds = [0u64; 2];
    let mut rng = Lcg(13);
    let mut whole_in_october = Vec::new();
    for i in 0..10 {
        let t = i % 2;
        let from = at(2026, 10, 1, 0, 0, 0)
            + chrono::Duration::seconds(rng.next(28 * 24 * 3600) as i64 + 1);
        let to = from + chrono::Duration::seconds(rng.next(40 * 3600) as i64 + 60);
        // The last one runs into November.
        let to = if i == 9 {
            october_end + chrono::Duration::hours(3)
        } else {
            to
        };
        let lease = env.lease(tenants[t], from, to).await;
        october_seconds[t] += seconds(from, to.min(october_end));
        if to <= october_end {
            let price = if from >= change { "0.8" } else { "0.5" };
            whole_in_october.push((lease, cost(seconds(from, to), price), from >= change));
        }
    }
    for (t, tenant) in tenants.iter().enumerate() {
        env.draft_billing(*tenant, "2026-10", october_seconds[t])
            .await;
    }

    env.clock.set(after_grace(october_end));
    let mut live = Vec::new();
    for tenant in tenants {
        let invoice = env
            .invoice_when(tenant, "2026-10", |d| d.status == DocumentStatus::Issued)
            .await;
        assert_eq!(billed(&invoice), october_seconds[live.len()]);
        live.push(invoice);
    }
    // Numbered 1 and 2, in the tenants' order of ids.
    let mut numbers: Vec<_> = live.iter().map(|d| d.number.clone().unwrap()).collect();
    numbers.sort();
    assert_eq!(numbers, ["INV-000001", "INV-000002"]);
    // Each lease of the month on the book its start chose, to the fen.
    let lines: Vec<_> = live.iter().flat_map(|d| d.lines.iter()).collect();
    for (lease, amount, on_new_book) in &whole_in_october {
        let line = lines.iter().find(|l| l.lease_id == *lease).expect("a line");
        assert_eq!(line.amount, *amount, "{line:?}");
        assert_eq!(line.price_book_version, if *on_new_book { 2 } else { 1 });
    }
    assert!(lines.iter().any(|l| l.price_book_version == 1));
    assert!(lines.iter().any(|l| l.price_book_version == 2));
    // November's part is on November's draft, not on October's invoice.
    let november = env.draft_billing(tenants[1], "2026-11", 3 * 3600).await;
    assert_eq!(november.status, DocumentStatus::Draft);

    // An auditor's recomputation: the charges of the tenant and month up to
    // the invoice's sequence give its lines.
    let pool = lh_projection::connect_schema(env.config.database_url.expose(), "pricing")
        .await
        .unwrap();
    for invoice in &live {
        let mut lines = lh_pricing::projection::lines_between(
            &pool,
            invoice.tenant_id,
            &invoice.period,
            0,
            invoice.charges_through_sequence,
        )
        .await
        .unwrap();
        lh_rpc::invoice_document::sort_lines(&mut lines);
        assert_eq!(lines, invoice.lines);
    }
    pool.close().await;

    let report = lh_pricing::rebuild(&env.config, "pricing_rebuild", false, |_, _| {})
        .await
        .expect("rebuild runs");
    for table in &report.tables {
        assert!(table.identical(), "{table:?} differs");
    }
    let rebuilt =
        lh_projection::connect_schema(env.config.database_url.expose(), "pricing_rebuild")
            .await
            .unwrap();
    for invoice in &live {
        let again = lh_pricing::projection::read_document(
            &rebuilt,
            &DocumentRequest::ById {
                id: invoice.id,
                tenant_id: None,
            },
        )
        .await
        .unwrap()
        .expect("the rebuilt projection has it");
        assert_eq!(again.content_hash, invoice.content_hash);
        assert_eq!(&again, invoice);
    }
    rebuilt.close().await;

    // A restarted ledger issues nothing twice.
    pricing.stop().await;
    let pricing = env.start_pricing().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let issued = env.log(subject::INVOICES_ALL).await;
    assert_eq!(issued.len(), 2, "{issued:#?}");
    pricing.stop().await;
}

#[tokio::test]
async fn a_late_charge_yields_a_note_and_the_invoice_stays_as_issued() {
    let october_end = at(2026, 11, 1, 0, 0, 0);
    let env = Env::new(at(2026, 10, 20, 0, 0, 0)).await;
    let pricing = env.start_pricing().await;
    let tenant = Uuid::now_v7();
    let (from, to) = (at(2026, 10, 3, 8, 0, 0), at(2026, 10, 3, 12, 0, 0));
    env.lease(tenant, from, to).await;
    env.draft_billing(tenant, "2026-10", 4 * 3600).await;
    env.clock.set(after_grace(october_end));
    let invoice = env
        .invoice_when(tenant, "2026-10", |d| d.status == DocumentStatus::Issued)
        .await;
    assert_eq!(invoice.total, cost(4 * 3600, "0.5"));

    // A usage event arrives after the invoice: a correction of -1.50 and a
    // late lease's charge, as pricing would publish them.
    let late_lease = Uuid::now_v7();
    let late = |amount: &str, n: u32| ChargeAccrued {
        charge_id: Uuid::now_v7(),
        tenant_id: tenant,
        lease_id: late_lease,
        period: "2026-10".into(),
        tier: Tier::Basic,
        gpus: 2,
        vram_gb: VRAM_GB,
        from: at(2026, 10, 31, 22, n, 0),
        to: at(2026, 10, 31, 22, n + 1, 0),
        billed_seconds: 60,
        unit_price_cny_per_gb_hour: "0.5".parse().unwrap(),
        amount: amount.parse().unwrap(),
        currency: "CNY".into(),
        price_book_version: 1,
        age_seconds: None,
        priced_gb_seconds: None,
        reservation_id: None,
    };
    let data = EventData::ChargeAccrued(late("-1.50", 0));
    env.publish(fixtures::owner_of(&data), Utc::now(), data)
        .await;
    let deadline = Instant::now() + WAIT;
    let note = loop {
        let list = env.list(Some(tenant), Some("2026-10")).await;
        if let Some(note) = list
            .invoices
            .iter()
            .find(|d| d.kind != DocumentKind::Invoice)
        {
            break note.clone();
        }
        assert!(Instant::now() < deadline, "no note: {list:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let note = env
        .document(DocumentRequest::ById {
            id: note.id,
            tenant_id: Some(tenant),
        })
        .await;
    assert_eq!(note.kind, DocumentKind::CreditNote);
    assert_eq!(note.number.as_deref(), Some("NOTE-000001"));
    assert_eq!(note.refers_to, Some(invoice.id));
    assert_eq!(note.refers_to_number, invoice.number);
    assert_eq!(note.total.to_string(), "-1.50");
    assert_eq!(
        note.charges_after_sequence,
        invoice.charges_through_sequence
    );
    // The invoice is as it was issued.
    let again = env
        .document(DocumentRequest::ById {
            id: invoice.id,
            tenant_id: Some(tenant),
        })
        .await;
    assert_eq!(again, invoice);

    // A later one, positive: a debit note, numbered next.
    let data = EventData::ChargeAccrued(late("0.70", 1));
    env.publish(fixtures::owner_of(&data), Utc::now(), data)
        .await;
    let deadline = Instant::now() + WAIT;
    loop {
        let list = env.list(Some(tenant), None).await;
        let notes: Vec<_> = list
            .invoices
            .iter()
            .filter(|d| d.kind != DocumentKind::Invoice)
            .collect();
        if notes.len() == 2 {
            let debit = notes
                .iter()
                .find(|d| d.kind == DocumentKind::DebitNote)
                .unwrap();
            assert_eq!(debit.number.as_deref(), Some("NOTE-000002"));
            assert_eq!(debit.total.to_string(), "0.70");
            break;
        }
        assert!(Instant::now() < deadline, "no second note: {list:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(env.log(subject::INVOICES_ALL).await.len(), 3);
    pricing.stop().await;
}

#[tokio::test]
async fn a_month_of_more_leases_than_one_event_holds_is_issued_in_parts() {
    const LEASES: usize = 2_100;
    let october_end = at(2026, 11, 1, 0, 0, 0);
    let env = Env::new(at(2026, 10, 20, 0, 0, 0)).await;
    let pricing = env.start_pricing().await;
    let tenant = Uuid::now_v7();
    let (charges, sum) = env.charge_leases(tenant, LEASES).await;
    env.invoice_when(tenant, "2026-10", |d| d.lines.len() == LEASES)
        .await;

    env.clock.set(after_grace(october_end));
    let deadline = Instant::now() + WAIT;
    let listed = loop {
        let list = env.list(Some(tenant), Some("2026-10")).await;
        let issued: Vec<_> = list
            .invoices
            .into_iter()
            .filter(|d| d.status == DocumentStatus::Issued)
            .collect();
        if issued.len() == 2 {
            break issued;
        }
        assert!(
            Instant::now() < deadline,
            "not issued in 2 parts: {issued:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let first_id = lh_rpc::invoice_document::invoice_id(tenant, "2026-10");
    let shape: Vec<_> = listed
        .iter()
        .map(|d| (d.number.clone().unwrap(), d.part, d.parts, d.first_part_id))
        .collect();
    assert_eq!(
        shape,
        [
            ("INV-000001".to_string(), 1, 2, None),
            ("INV-000002".to_string(), 2, 2, Some(first_id)),
        ]
    );
    let mut parts = Vec::new();
    for summary in &listed {
        parts.push(
            env.document(DocumentRequest::ById {
                id: summary.id,
                tenant_id: Some(tenant),
            })
            .await,
        );
    }
    assert_eq!(parts[0].id, first_id);
    assert_eq!(
        parts.iter().map(|d| d.lines.len()).collect::<Vec<_>>(),
        [2000, LEASES - 2000]
    );
    assert_eq!(parts.iter().map(|d| d.total).sum::<Decimal>(), sum);
    assert_eq!(
        parts[0].charges_through_sequence,
        parts[1].charges_through_sequence
    );
    // The month's invoice by its period is its first part.
    let by_period = env
        .invoice_when(tenant, "2026-10", |d| d.status == DocumentStatus::Issued)
        .await;
    assert_eq!(by_period, parts[0]);
    // The auditor's recomputation: the parts' lines, in order, are the
    // charges up to their sequence.
    let pool = lh_projection::connect_schema(env.config.database_url.expose(), "pricing")
        .await
        .unwrap();
    let mut lines = lh_pricing::projection::lines_between(
        &pool,
        tenant,
        "2026-10",
        0,
        parts[0].charges_through_sequence,
    )
    .await
    .unwrap();
    pool.close().await;
    lh_rpc::invoice_document::sort_lines(&mut lines);
    let split: Vec<_> = parts.iter().flat_map(|d| d.lines.clone()).collect();
    assert!(lines == split, "the parts' lines are not the month's");
    let csv = parts[1].to_csv();
    assert!(
        csv.lines()
            .nth(1)
            .unwrap()
            .starts_with("invoice,INV-000002 (part 2 of 2),issued,"),
        "{}",
        &csv[..300]
    );

    // A late charge: a note of the invoice, referring to its first part.
    let late = ChargeAccrued {
        charge_id: Uuid::now_v7(),
        amount: "-0.40".parse().unwrap(),
        ..charges[0].clone()
    };
    let data = EventData::ChargeAccrued(late);
    env.publish(fixtures::owner_of(&data), Utc::now(), data)
        .await;
    let deadline = Instant::now() + WAIT;
    let note = loop {
        let list = env.list(Some(tenant), Some("2026-10")).await;
        if let Some(note) = list
            .invoices
            .iter()
            .find(|d| d.kind != DocumentKind::Invoice)
        {
            break note.clone();
        }
        assert!(Instant::now() < deadline, "no note: {list:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(note.refers_to, Some(first_id));
    assert_eq!((note.part, note.parts), (1, 1));

    // A restarted ledger issues nothing again.
    pricing.stop().await;
    let pricing = env.start_pricing().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.log(subject::INVOICES_ALL).await.len(), 3);
    pricing.stop().await;
}

#[tokio::test]
async fn an_invoice_half_issued_in_parts_is_completed_by_the_next_ledger() {
    use lh_service::decider::Decider;
    const LEASES: usize = 2_050;
    let october_end = at(2026, 11, 1, 0, 0, 0);
    let env = Env::new(after_grace(october_end)).await;
    let tenant = Uuid::now_v7();
    env.charge_leases(tenant, LEASES).await;
    // A ledger decides the month from the log and stops after storing its
    // first part.
    let mut ledger = lh_pricing::ledger::Ledger::new(chrono::Duration::seconds(GRACE_SECS));
    let mut feed = env.bus.feed(&[subject::CHARGES_ALL], 1).await.unwrap();
    while let Some(stored) = feed.next_within(Duration::from_secs(1)).await {
        let stored = stored.unwrap();
        ledger.apply_stored(stored.sequence, stored.stored_at, &stored.envelope);
        if stored.pending == 0 {
            break;
        }
    }
    let decided: Vec<Envelope> = ledger
        .decide(after_grace(october_end))
        .into_iter()
        .flatten()
        .map(|(e, _)| e)
        .collect();
    assert_eq!(decided.len(), 2, "two parts");
    env.bus
        .publish(&decided[0], Expect::LastSubjectSequence(0))
        .await
        .expect("the first part stored");

    // Pricing's ledger reads it and issues the second part as it was
    // decided; the first is not issued again.
    let pricing = env.start_pricing().await;
    let deadline = Instant::now() + WAIT;
    let issued = loop {
        let issued = env.log(subject::INVOICES_ALL).await;
        if issued.len() >= 2 {
            break issued;
        }
        assert!(
            Instant::now() < deadline,
            "never completed: {} stored",
            issued.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(issued.len(), 2);
    assert!(issued[1] == decided[1].data, "the second part differs");
    let EventData::InvoiceIssued(second) = &issued[1] else {
        panic!("not an invoice");
    };
    assert_eq!((second.number, second.part, second.parts), (2, 2, 2));
    // And the projection lists both.
    let deadline = Instant::now() + WAIT;
    loop {
        let list = env.list(Some(tenant), Some("2026-10")).await;
        let parts: Vec<_> = list
            .invoices
            .iter()
            .filter(|d| d.status == DocumentStatus::Issued)
            .map(|d| (d.number.clone().unwrap(), d.part, d.parts))
            .collect();
        if parts.len() == 2 {
            assert_eq!(
                parts,
                [("INV-000001".into(), 1, 2), ("INV-000002".into(), 2, 2)]
            );
            break;
        }
        assert!(Instant::now() < deadline, "not listed: {list:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.log(subject::INVOICES_ALL).await.len(), 2);
    pricing.stop().await;
}

#[tokio::test]
async fn a_lost_node_below_the_sla_earns_a_credit_on_the_next_invoice() {
    let (october_end, november_end) = (at(2026, 11, 1, 0, 0, 0), at(2026, 12, 1, 0, 0, 0));
    let env = Env::new(at(2026, 10, 25, 0, 0, 0)).await;
    let pricing = env.start_pricing().await;
    let tenant = Uuid::now_v7();
    let lease = Uuid::now_v7();
    let start = at(2026, 10, 1, 0, 0, 0);
    let lost = at(2026, 10, 10, 0, 0, 0);
    let again = at(2026, 10, 10, 6, 0, 0);
    let end = at(2026, 10, 20, 0, 0, 0);
    env.lease_placed(tenant, lease, "node-1", start).await;
    env.started(lease, "node-1", start).await;
    // node-1 is lost: the lease waits for capacity for 6 hours, then runs
    // on node-2.
    let migrated = LeaseMigrated {
        lease_id: lease,
        reason: "node node-1 lost".into(),
        from_node_id: "node-1".into(),
        from_gpu_indices: vec![0, 1],
        billing_ends_at: lost,
        to: None,
    };
    env.publish(by_scheduler(), lost, EventData::LeaseMigrated(migrated))
        .await;
    let placed = fixtures::placed(
        lease,
        "node-2",
        "cn-north-1",
        fixtures::MODEL,
        fixtures::MODEL_VRAM_GB,
        &[0, 1],
    );
    env.publish(by_scheduler(), again, EventData::LeasePlaced(placed))
        .await;
    env.started(lease, "node-2", again).await;
    env.ended(lease, "node-2", end).await;
    let run_seconds = seconds(start, lost) + seconds(again, end);
    let october = env.draft_billing(tenant, "2026-10", run_seconds).await;
    // Not billed: the 6 hours between the lost node and the new start.
    assert_eq!(october.total, cost(run_seconds, "0.5"));

    env.clock.set(after_grace(october_end));
    let issued = env
        .invoice_when(tenant, "2026-10", |d| d.status == DocumentStatus::Issued)
        .await;
    assert!(issued.credits.is_empty());
    // 6 h down in 456 h: 98.6842 %, under 99 %: 30 % of the lease's charges.
    let credits: Vec<CreditGranted> = env
        .log(subject::CREDITS_ALL)
        .await
        .into_iter()
        .filter_map(|e| match e {
            EventData::CreditGranted(c) => Some(c),
            _ => None,
        })
        .collect();
    let [credit] = &credits[..] else {
        panic!("{credits:#?}")
    };
    assert_eq!(credit.downtime_seconds, 6 * 3600);
    assert_eq!(credit.lease_seconds, run_seconds + 6 * 3600);
    assert_eq!(credit.availability_percent.to_string(), "98.6842");
    assert_eq!(credit.share_percent, Decimal::from(30));
    assert_eq!(credit.affected_charges, issued.total);
    let expected = -lh_domain::rating::round_amount(issued.total * Decimal::new(3, 1));
    assert_eq!(credit.amount, expected);
    assert_eq!(credit.applies_to_period, "2026-11");
    assert_eq!(credit.interruptions.len(), 1);
    assert_eq!(
        (credit.interruptions[0].from, credit.interruptions[0].to),
        (lost, again)
    );

    // November's draft shows it; November's invoice deducts it.
    let november = env
        .invoice_when(tenant, "2026-11", |d| !d.credits.is_empty())
        .await;
    assert_eq!(november.status, DocumentStatus::Draft);
    assert_eq!(november.total, expected);
    env.clock.set(after_grace(november_end));
    let november = env
        .invoice_when(tenant, "2026-11", |d| d.status == DocumentStatus::Issued)
        .await;
    assert_eq!(november.credits.len(), 1);
    assert_eq!(november.credits[0].credit_id, credit.credit_id);
    assert_eq!(november.total, expected);
    assert_eq!(november.number.as_deref(), Some("INV-000002"));
    // Granted once, however often the ledger decides.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.log(subject::CREDITS_ALL).await.len(), 1);
    pricing.stop().await;
}

#[tokio::test]
async fn the_weekly_cost_report_compares_each_tier_with_on_demand() {
    let env = Env::new(at(2026, 11, 20, 0, 0, 0)).await;
    env.price_book(1, at(2026, 9, 1, 0, 0, 0), "0.5".parse().unwrap())
        .await;
    let pricing = env.start_pricing().await;
    let tenant = Uuid::now_v7();
    // ISO week 2026-W45: Monday 2 to Sunday 8 November.
    let (from, to) = (at(2026, 11, 3, 8, 0, 0), at(2026, 11, 3, 10, 0, 0));
    env.lease(tenant, from, to).await;
    // The week after: not in the report.
    env.lease(tenant, at(2026, 11, 9, 0, 0, 0), at(2026, 11, 9, 1, 0, 0))
        .await;
    // An hour of spot, as pricing would charge it.
    let spot = ChargeAccrued {
        charge_id: Uuid::now_v7(),
        tenant_id: tenant,
        lease_id: Uuid::now_v7(),
        period: "2026-11".into(),
        tier: Tier::Spot,
        gpus: 2,
        vram_gb: VRAM_GB,
        from: at(2026, 11, 8, 23, 0, 0),
        to: at(2026, 11, 9, 0, 0, 0),
        billed_seconds: 3600,
        unit_price_cny_per_gb_hour: "0.2".parse().unwrap(),
        amount: "16.00".parse().unwrap(),
        currency: "CNY".into(),
        price_book_version: 1,
        age_seconds: None,
        priced_gb_seconds: None,
        reservation_id: None,
    };
    // An hour of a reservation's commitment, and a lease it covers for
    // that hour: the usage on demand is the lease's hour, not two.
    let reservation = Uuid::now_v7();
    let commitment = ChargeAccrued {
        charge_id: Uuid::now_v7(),
        lease_id: reservation,
        tier: Tier::Reserved,
        from: at(2026, 11, 4, 0, 0, 0),
        to: at(2026, 11, 4, 1, 0, 0),
        unit_price_cny_per_gb_hour: "0.35".parse().unwrap(),
        amount: "28.00".parse().unwrap(),
        reservation_id: Some(reservation),
        ..spot.clone()
    };
    let covered = ChargeAccrued {
        charge_id: Uuid::now_v7(),
        lease_id: Uuid::now_v7(),
        unit_price_cny_per_gb_hour: Decimal::ZERO,
        amount: "0.00".parse().unwrap(),
        ..commitment.clone()
    };
    for charge in [spot, commitment, covered] {
        let data = EventData::ChargeAccrued(charge);
        env.publish(fixtures::owner_of(&data), Utc::now(), data)
            .await;
    }
    env.draft_billing(tenant, "2026-11", 6 * 3600).await;

    let request = lh_rpc::cost_report::CostReportRequest {
        tenant_id: tenant,
        week: "2026-W45".into(),
    };
    let report = lh_rpc::cost_report::call(&env.bus, &request, RPC_TIMEOUT)
        .await
        .expect("pricing answers");
    let tiers: Vec<_> = report
        .tiers
        .iter()
        .map(|t| {
            (
                t.tier.as_str(),
                t.billed_seconds,
                t.spend.to_string(),
                t.on_demand.to_string(),
                t.saving.to_string(),
            )
        })
        .collect();
    let basic = cost(2 * 3600, "0.5").to_string();
    assert_eq!(
        tiers,
        [
            ("basic", 7200, basic.clone(), basic.clone(), "0.00".into()),
            (
                "reserved",
                7200,
                "28.00".into(),
                "40.00".into(),
                "12.00".into()
            ),
            ("spot", 3600, "16.00".into(), "40.00".into(), "24.00".into()),
        ]
    );
    assert_eq!(report.saving.to_string(), "36.00");
    assert_eq!(report.from, at(2026, 11, 2, 0, 0, 0));
    let bad = lh_rpc::cost_report::CostReportRequest {
        tenant_id: tenant,
        week: "2026-W54".into(),
    };
    let err = lh_rpc::cost_report::call(&env.bus, &bad, RPC_TIMEOUT)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ISO week"), "{err}");
    pricing.stop().await;
}
