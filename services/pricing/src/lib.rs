//! Pricing: price books, charges and invoices.
//!
//! [`start`] runs, side by side:
//!
//! 1. **Charges** ([`charges`]): folds price books, spot prices, lease
//!    lifecycles and existing charges, and once at the head of the log
//!    publishes a `charge.accrued` per running lease and UTC hour that is
//!    over, and the rest of a lease at its end — exactly once (ids derived
//!    from lease and hour, and a guard chained per lease on
//!    `lh.evt.charge.<lease_id>`). The pure arithmetic and its rounding
//!    rule live in [`lh_domain::rating`].
//! 2. **Price books** ([`books`]): lists them and publishes a new version
//!    for the gateway, over NATS request/reply.
//!    Reservations ([`reservations`]) likewise.
//! 3. **Invoice projection** ([`projection`]): `charge.accrued` into the
//!    `invoice_lines` table of the service's Postgres schema.
//! 4. **Ledger** ([`ledger`]): once a month and its grace period are over,
//!    issues each tenant's invoice (`invoice.issued`, numbered without
//!    gaps), notes for charges that come after it (`invoice.note_issued`)
//!    and SLA credits (`credit.granted`).
//! 5. **Invoice RPC**: answers [`lh_rpc::charges::CHARGES_SUBJECT`] (a
//!    month's charges, [`lh_rpc::charges::ChargeStatement`]) and the invoices and
//!    notes of [`lh_rpc::invoice_document`] from the projection; and the
//!    cost report and the what-if ([`what_if`]: a past month on another
//!    price book) from its charges.
//!
//! The service is ready once the charges fold, the ledger and the
//! projection have caught up with the log. See `docs/pricing.md`.

pub mod balances;
pub mod books;
pub mod charges;
pub mod ledger;
pub mod projection;
pub mod quotes;
pub mod reservations;
mod rpc;
pub mod shelf;
pub mod what_if;

use std::time::Duration;

use anyhow::Context as _;
use chrono::Utc;
use lh_bus::Bus;
use lh_service::clock::{SharedClock, SystemClock};
use lh_service::decider;
use lh_service::{CancellationToken, CommonArgs, Readiness, Running, Secret};
use sqlx::migrate::Migrator;
use sqlx::PgPool;

use crate::projection::InvoiceProjector;

/// Queue group of the pricing replicas answering
/// [`lh_rpc::charges::CHARGES_SUBJECT`] and the other pricing RPCs.
pub const QUEUE_GROUP: &str = "lh-pricing";
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9103";

/// Metrics this service records, with their `# HELP` text.
pub const METRICS: &[lh_service::MetricHelp] = &[
    (
        "lh_pricing_projection_sequence",
        "Log sequence the pricing projection has applied.",
    ),
    (
        "lh_pricing_open_leases",
        "Leases pricing is charging for now.",
    ),
    (
        "lh_charges_published_total",
        "Charge events this replica appended.",
    ),
    (
        "lh_charged_fen_total",
        "Amounts of the charges this replica appended, in fen (0.01 CNY), by tier (storage for object storage).",
    ),
    (
        "lh_tenant_charged_fen_total",
        "Amounts of the charges this replica appended, in fen (0.01 CNY), by tenant (the first 10000 tenants charged; the rest as other).",
    ),
    (
        "lh_ledger_documents_total",
        "Ledger documents (invoices, credit notes...) this replica issued, by type.",
    ),
];

/// Name of the service: its actor name on the events it publishes.
pub const SERVICE: &str = "lh-pricing";
/// Default schema of the live projection.
pub const DEFAULT_SCHEMA: &str = "pricing";
/// First wait before publishing the default price book again; it doubles
/// up to the max.
const PRICE_BOOK_RETRY_MIN_WAIT: Duration = Duration::from_millis(200);
const PRICE_BOOK_RETRY_MAX_WAIT: Duration = Duration::from_secs(5);
/// How often readiness is looked at again.
const READINESS_CHECK_EVERY: Duration = Duration::from_millis(200);

/// The migrations of pricing's schema (`migrations/pricing`).
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations/pricing");

#[derive(clap::Parser, Debug, Clone)]
#[command(name = "lh-pricing", about = "Leasehold pricing: charges and invoices")]
pub struct Config {
    #[command(flatten)]
    pub common: CommonArgs,
    /// PostgreSQL database holding the invoice projection.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Secret,
    /// Postgres schema of the live projection.
    #[arg(long, env = "LH_PRICING_SCHEMA", default_value = DEFAULT_SCHEMA)]
    pub schema: String,
    /// How far, in seconds, a node's clock may be from the log server's:
    /// a lease's start and end as the node reports them are held to within
    /// this of when the log stored the report.
    #[arg(long, env = "LH_NODE_CLOCK_SKEW_SECS", default_value_t = lh_events::node_time::DEFAULT_NODE_CLOCK_SKEW_SECS)]
    pub node_clock_skew_secs: i64,
    /// Seconds after the end of its month that a tenant's invoice stays a
    /// draft before it is issued.
    #[arg(long, env = "LH_INVOICE_GRACE_SECS", default_value_t = ledger::DEFAULT_INVOICE_GRACE_SECS,
        value_parser = clap::value_parser!(i64).range(0..=ledger::MAX_INVOICE_GRACE_SECS))]
    pub invoice_grace_secs: i64,
    /// How long, in seconds, after a UTC hour ends the running leases'
    /// charges for it are written: long enough for a late report of a
    /// lease's end (the node clock skew) or of a lost node to be in the log.
    #[arg(long, env = "LH_ACCRUAL_GRACE_SECS", default_value_t = charges::DEFAULT_ACCRUAL_GRACE_SECS,
        value_parser = clap::value_parser!(i64).range(0..=charges::MAX_ACCRUAL_GRACE_SECS))]
    pub accrual_grace_secs: i64,
    /// `balance.low` is published when a prepaid tenant's balance lasts
    /// less than this many seconds at what its running leases cost now.
    #[arg(long, env = "LH_BALANCE_WARN_SECS", default_value_t = balances::DEFAULT_BALANCE_WARN_SECS,
        value_parser = clap::value_parser!(u64).range(0..=balances::MAX_BALANCE_WARN_SECS))]
    pub balance_warn_secs: u64,
    /// How long, in seconds, a quote may be used to ask for a lease.
    #[arg(long, env = "LH_QUOTE_VALID_SECS", default_value_t = lh_rpc::quote::DEFAULT_QUOTE_VALID_SECS,
        value_parser = clap::value_parser!(u64).range(1..=lh_rpc::quote::MAX_QUOTE_VALID_SECS))]
    pub quote_valid_secs: u64,
    /// The clocks pricing decides by (tests move manual ones).
    #[arg(skip)]
    pub clocks: Clocks,
}

/// The clocks pricing decides by: the wall clock where a test sets none.
/// Apart, because the ledger's tests end a month's grace without making
/// every running lease's hours due, and the charges' tests the other way.
#[derive(Clone, Default)]
pub struct Clocks {
    /// Of the charges: which hours are over and due.
    pub charges: Option<SharedClock>,
    /// Of the ledger: which months and graces are over.
    pub ledger: Option<SharedClock>,
}

impl std::fmt::Debug for Clocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |c: &Option<SharedClock>| if c.is_some() { "manual" } else { "system" };
        f.debug_struct("Clocks")
            .field("charges", &name(&self.charges))
            .field("ledger", &name(&self.ledger))
            .finish()
    }
}

impl Config {
    /// Refuses graces that would put a month's last hour on a note: its
    /// charges are written `accrual_grace_secs` after the month, so its
    /// invoice must stay a draft at least that long.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (0..=self.invoice_grace_secs).contains(&self.accrual_grace_secs),
            "LH_INVOICE_GRACE_SECS ({}) must be at least LH_ACCRUAL_GRACE_SECS ({}): \
             the charges of a month's last hour are written that long after it",
            self.invoice_grace_secs,
            self.accrual_grace_secs
        );
        Ok(())
    }

    /// For tests: pricing on `nats_url` and `database_url`, on a free port.
    pub fn for_test(nats_url: &str, database_url: &str) -> Self {
        Self {
            common: CommonArgs::for_test(nats_url),
            database_url: database_url.into(),
            schema: DEFAULT_SCHEMA.to_string(),
            node_clock_skew_secs: lh_events::node_time::DEFAULT_NODE_CLOCK_SKEW_SECS,
            invoice_grace_secs: ledger::DEFAULT_INVOICE_GRACE_SECS,
            accrual_grace_secs: charges::DEFAULT_ACCRUAL_GRACE_SECS,
            balance_warn_secs: balances::DEFAULT_BALANCE_WARN_SECS,
            quote_valid_secs: lh_rpc::quote::DEFAULT_QUOTE_VALID_SECS,
            clocks: Clocks::default(),
        }
    }

    /// For tests that play a node's reports of times long past as if they
    /// arrived now: the node clock check is opened wide (pricing's charge
    /// tests cover it), and charges are decided by a clock held at
    /// `charges_at`, before every lease of the test, as if the reports had
    /// come as they happened. Otherwise a running lease would be accrued up
    /// to today before its end, stored later, says it ended long ago.
    pub fn for_replayed_reports(
        nats_url: &str,
        database_url: &str,
        charges_at: chrono::DateTime<Utc>,
    ) -> Self {
        Self {
            node_clock_skew_secs: 400 * 24 * 3600,
            clocks: Clocks {
                charges: Some(lh_service::clock::ManualClock::new(charges_at).shared()),
                ledger: None,
            },
            ..Self::for_test(nats_url, database_url)
        }
    }
}

/// Starts pricing: charges, the ledger, the invoice projection and the
/// invoice RPC.
pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    lh_service::describe_metrics(METRICS);
    config.check()?;
    let bus = config.common.connect_bus(SERVICE).await?;
    let pool = lh_projection::connect_schema(config.database_url.expose(), &config.schema)
        .await
        .context("pricing: connecting to PostgreSQL")?;
    lh_projection::migrate(&pool, &MIGRATOR)
        .await
        .context("pricing: migrating its schema")?;
    // Like every other write, the default price book waits out a log that
    // refuses it for now, rather than failing the start.
    let mut wait = PRICE_BOOK_RETRY_MIN_WAIT;
    while let Err(e) = charges::ensure_price_book(&bus, Utc::now()).await {
        tracing::warn!(error = %format!("{e:#}"), retry_in_ms = wait.as_millis() as u64,
            "cannot publish the default price book; will retry");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(PRICE_BOOK_RETRY_MAX_WAIT);
    }
    lh_service::restate::spawn(
        &bus,
        &config.common,
        SERVICE,
        &[lh_service::restate::Family::PriceBook],
        shutdown.clone(),
    )?;
    let readiness = Readiness::default();
    // The loops' futures are large: on the heap they stay off the stacks
    // of the tasks that start and poll them.
    let work = Box::pin(run_loops_and_rpcs(
        bus,
        pool,
        readiness.clone(),
        shutdown.clone(),
        config.clone(),
        ledger::Ledger::new(chrono::Duration::seconds(config.invoice_grace_secs))
            .with_node_clock_skew(chrono::Duration::seconds(config.node_clock_skew_secs)),
    ));
    Running::spawn(
        config.common.http_addr_or(DEFAULT_HTTP_ADDR),
        axum::Router::new(),
        readiness,
        shutdown,
        work,
    )
    .await
}

/// Runs the charges and ledger decide loops, the invoice projection, the
/// RPCs and the readiness watch, until shutdown or the first of them fails.
async fn run_loops_and_rpcs(
    bus: Bus,
    pool: PgPool,
    ready: Readiness,
    shutdown: CancellationToken,
    config: Config,
    mut ledger: ledger::Ledger,
) -> anyhow::Result<()> {
    let charges_caught_up = Readiness::default();
    let ledger_caught_up = Readiness::default();
    let (progress_tx, progress_rx) = tokio::sync::oneshot::channel();

    let mut charges = charges::Charges::new(
        chrono::Duration::seconds(config.node_clock_skew_secs),
        chrono::Duration::seconds(config.accrual_grace_secs),
    )
    .with_balance_warn_secs(config.balance_warn_secs);
    let shelf = charges.shelf();
    let clock = config
        .clocks
        .charges
        .clone()
        .unwrap_or_else(SystemClock::shared);
    let ledger_clock = config
        .clocks
        .ledger
        .clone()
        .unwrap_or_else(SystemClock::shared);
    let charges = Box::pin(async {
        decider::run(
            &bus,
            &mut charges,
            clock.as_ref(),
            shutdown.clone(),
            charges_caught_up.clone(),
        )
        .await
        .context("charges")
    });

    let ledger = Box::pin(async {
        decider::run(
            &bus,
            &mut ledger,
            ledger_clock.as_ref(),
            shutdown.clone(),
            ledger_caught_up.clone(),
        )
        .await
        .context("ledger")
    });

    let projection = async {
        lh_projection::run(
            &bus,
            &pool,
            &InvoiceProjector,
            shutdown.clone().cancelled_owned(),
            |progress| {
                let _ = progress_tx.send(progress);
            },
        )
        .await
        .context("invoice projection")
    };

    let sources = rpc::RpcSources {
        bus: &bus,
        pool: &pool,
        shelf: &shelf,
        quote_valid_secs: config.quote_valid_secs,
    };
    let monitor = watch_readiness(
        progress_rx,
        [charges_caught_up.clone(), ledger_caught_up.clone()],
        ready,
        shutdown.clone(),
    );

    tokio::try_join!(
        charges,
        ledger,
        Box::pin(projection),
        Box::pin(rpc::serve_all(&sources)),
        Box::pin(monitor)
    )?;
    Ok(())
}

/// Keeps `ready` in step with the decide loops and the projection: not
/// ready while the log is out of reach (a loop says so) or while the
/// invoice projection cannot write to the database (it retries until it
/// can).
async fn watch_readiness(
    progress_rx: tokio::sync::oneshot::Receiver<lh_projection::Progress>,
    loops_caught_up: [Readiness; 2],
    ready: Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Ok(progress) = progress_rx.await else {
        // The projection failed before it started; its error ends the service.
        return std::future::pending().await;
    };
    loop {
        metrics::gauge!("lh_pricing_projection_sequence").set(progress.applied() as f64);
        let now_ready = loops_caught_up.iter().all(Readiness::is_ready)
            && progress.caught_up()
            && !progress.stalled();
        if now_ready != ready.is_ready() {
            tracing::info!(
                sequence = progress.applied(),
                ready = now_ready,
                "pricing readiness changed"
            );
            ready.set(now_ready);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok::<(), anyhow::Error>(()),
            _ = tokio::time::sleep(READINESS_CHECK_EVERY) => {}
        }
    }
}

/// Replays the log from sequence 1 into the fresh schema `into` (dropped
/// first) with the live projection's code, compares its tables with the
/// live schema, and with `swap` makes the rebuilt schema the live one (stop
/// pricing first). `on_event(sequence, head)` is told every applied event.
pub async fn rebuild(
    config: &Config,
    into: &str,
    swap: bool,
    on_event: impl FnMut(u64, u64),
) -> anyhow::Result<lh_projection::RebuildReport> {
    let bus = config.common.connect_bus("lh-pricing-rebuild").await?;
    lh_projection::rebuild_and_compare(
        &bus,
        config.database_url.expose(),
        &config.schema,
        into,
        &MIGRATOR,
        &InvoiceProjector,
        projection::TABLES,
        swap,
        on_event,
    )
    .await
    .with_context(|| format!("rebuilding into schema {into}"))
}

impl lh_service::Service for Config {
    const NAME: &'static str = "lh-pricing";

    async fn start(self, shutdown: CancellationToken) -> anyhow::Result<Running> {
        start(self, shutdown).await
    }
}

impl lh_service::ProjectionService for Config {
    const ABOUT: &'static str = "Leasehold pricing: charges and invoices. Flags of the service \
        (--database-url, --nats-url, ...) go before the subcommand, or come from the environment.";

    fn schema(&self) -> &str {
        &self.schema
    }

    async fn rebuild(
        &self,
        into: &str,
        swap: bool,
        on_event: impl FnMut(u64, u64),
    ) -> anyhow::Result<lh_projection::RebuildReport> {
        rebuild(self, into, swap, on_event).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invoice_grace_shorter_than_the_accrual_grace_is_refused() {
        let mut config = Config::for_test("nats://127.0.0.1:1", "postgres://x");
        assert!(config.check().is_ok());
        config.invoice_grace_secs = 60;
        config.accrual_grace_secs = 300;
        let error = config.check().unwrap_err().to_string();
        assert!(error.contains("LH_INVOICE_GRACE_SECS (60)"), "{error}");
        config.accrual_grace_secs = 60;
        assert!(config.check().is_ok());
    }

    #[test]
    fn the_config_prints_no_secret() {
        let config = Config::for_test("nats://127.0.0.1:1", "postgres://lh:db-secret@db/lh");
        let printed = format!("{config:?}");
        assert!(!printed.contains("db-secret"), "{printed}");
        assert_eq!(
            config.database_url.expose(),
            "postgres://lh:db-secret@db/lh"
        );
    }
}
