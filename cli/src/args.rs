//! Command-line arguments of `lh`, parsed with clap's derive API.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Gateway used when neither `--gateway-url` nor `LH_GATEWAY_URL` is given.
pub const DEFAULT_GATEWAY_URL: &str = "http://127.0.0.1:8080";

const GLOBAL: &str = "Global options";

/// Command-line client for the Leasehold GPU leasing gateway.
#[derive(Debug, Clone, Parser)]
#[command(name = "lh", version, about, long_about = None)]
pub struct Cli {
    /// Base URL of the Leasehold gateway.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "LH_GATEWAY_URL",
        default_value = DEFAULT_GATEWAY_URL,
        value_name = "URL"
    )]
    pub gateway_url: String,

    /// Refused: a key on the command line shows in `ps` and in shell
    /// history. The key comes from `LH_API_KEY` or `--api-key-file`.
    #[arg(long, global = true, hide = true, value_name = "KEY")]
    pub api_key: Option<String>,

    /// File holding the API key (or admin token), sent as
    /// `Authorization: Bearer <key>`; else the key is read from `LH_API_KEY`.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "LH_API_KEY_FILE",
        value_name = "PATH"
    )]
    pub api_key_file: Option<std::path::PathBuf>,

    /// Print the gateway's JSON, pretty-printed, instead of a table.
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// Top-level command groups.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Manage tenants (admin token required).
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Request, inspect and stop GPU leases.
    #[command(subcommand)]
    Lease(LeaseCommand),
    /// Show invoices.
    #[command(subcommand)]
    Invoice(InvoiceCommand),
    /// Read the spot market.
    #[command(subcommand)]
    Spot(SpotCommand),
    /// Check the audit log.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Take GPU nodes out of placement and back (admin token required).
    #[command(subcommand)]
    Node(NodeCommand),
    /// Reports: spending in a week, a day of the fleet.
    #[command(subcommand)]
    Report(ReportCommand),
    /// Try a price book on a past month (admin token required).
    #[command(subcommand)]
    Billing(BillingCommand),
    /// List the price books, publish a new one (admin token required).
    #[command(subcommand)]
    PriceBook(PriceBookCommand),
    /// Reserve GPUs for a tenant (admin), list reservations.
    #[command(subcommand)]
    Reservation(ReservationCommand),
    /// Read a tenant's prepaid balance, top it up (admin token required).
    #[command(subcommand)]
    Balance(BalanceCommand),
    /// Price a lease for a duration on the current price book; the quote's
    /// id (`lh lease create --quote ID`) bills the lease on that book.
    Quote(QuoteCreate),
}

/// `lh quote`
#[derive(Debug, Clone, Args)]
pub struct QuoteCreate {
    #[command(flatten)]
    pub ask: GpuAskArgs,
    /// GPU model, e.g. `A100-40GB`.
    #[arg(long, value_name = "MODEL")]
    pub gpu_model: String,
    #[arg(long, value_enum, default_value_t = Tier::Basic)]
    pub tier: Tier,
    /// How long the lease would run, in hours (fractions allowed, e.g. 1.5).
    #[arg(long, value_name = "HOURS")]
    pub hours: f64,
}

/// `lh balance ...`
#[derive(Debug, Clone, Subcommand)]
pub enum BalanceCommand {
    /// The balance, what the running leases cost per hour, how long it lasts.
    Show(BalanceShow),
    /// Add prepaid money (CNY); the tenant is prepaid from its first top-up.
    TopUp(BalanceTopUp),
}

/// `lh balance show`
#[derive(Debug, Clone, Args)]
pub struct BalanceShow {
    #[arg(value_name = "TENANT_ID")]
    pub tenant: String,
}

/// `lh balance top-up`
#[derive(Debug, Clone, Args)]
pub struct BalanceTopUp {
    #[arg(value_name = "TENANT_ID")]
    pub tenant: String,
    /// CNY, e.g. `500` or `99.50`.
    #[arg(long)]
    pub amount: String,
}

/// `lh reservation ...`
#[derive(Debug, Clone, Subcommand)]
pub enum ReservationCommand {
    /// The reservations not yet over (a tenant sees its own).
    Ls(ReservationList),
    /// Commit a tenant to GPUs of a model in a zone for a term.
    Create(ReservationCreate),
}

/// `lh reservation ls`
#[derive(Debug, Clone, Args)]
pub struct ReservationList {
    /// Admin only: one tenant's reservations.
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
}

/// `lh reservation create`
#[derive(Debug, Clone, Args)]
pub struct ReservationCreate {
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: String,
    /// GPU model, e.g. `A100-40GB`.
    #[arg(long, value_name = "MODEL")]
    pub gpu_model: String,
    #[arg(long)]
    pub zone: String,
    #[arg(long)]
    pub gpus: u32,
    /// Days (30 by default).
    #[arg(long, value_name = "DAYS")]
    pub term_days: Option<u32>,
}

/// `lh price-book ...`
#[derive(Debug, Clone, Subcommand)]
pub enum PriceBookCommand {
    /// Every price book version, oldest first.
    Ls,
    /// Publish a new version from a JSON file (see docs/pricing.md).
    Publish(PriceBookPublish),
}

/// `lh price-book publish`
#[derive(Debug, Clone, Args)]
pub struct PriceBookPublish {
    /// JSON body of `POST /v1/price-books`:
    /// `{"version", "effective_from"?, "tiers": [...]}`.
    #[arg(long, value_name = "FILE")]
    pub file: std::path::PathBuf,
}

/// `lh report ...`
#[derive(Debug, Clone, Subcommand)]
pub enum ReportCommand {
    /// Spend by tier in an ISO week, the same usage at the on-demand price,
    /// and the saving.
    Cost(ReportCost),
    /// One UTC day of the fleet as a picture and numbers (operator token).
    #[command(long_about = DAILY_LONG_ABOUT)]
    Daily(ReportDaily),
}

const DAILY_LONG_ABOUT: &str = "\
One UTC day of the fleet, written to --out as HTML (the picture inline and \
the numbers as tables), SVG or PNG, chosen by the file's extension. Reads \
the log through GET /v1/audit/events (the admin or auditor token) and the \
usage through GET /v1/usage.

What it shows (times are UTC; an hour is [hh:00, hh+1:00)):
  - VRAM heat map: one row per GPU, one cell per hour; a cell is the \
average VRAM used on the GPU in that hour (each lease's average, summed \
over the leases on it) as % of the GPU's memory; 0 where nothing was used.
  - Timeline: one bar per lease run per GPU, coloured by tenant or tier; \
a triangle where a spot lease was preempted, a diamond where a lease failed \
over.
  - Per model and zone: idle rate, the share of GPU-hours in which no lease \
held the GPU; utilisation, the average of the GPU's utilisation over the \
leased GPU-hours that had a figure.
  - Peak hours: the 3 hours with the most GPUs leased.
  - Queue wait: request to first start of the leases requested that day, \
mean and p95 against the 15 s target.
  - Availability: 1 - interrupted / (run + interrupted) lease-seconds, \
against 99.95 %. An interruption runs from a failover (a lost node or an \
unhealthy GPU; the move's billing end) to the lease's next start or its \
end. Drains, preemptions, suspensions and stops are not interruptions.

With --tenant only that tenant's leases and usage count; the heat map \
still has a row for every GPU.";

/// `lh report daily`
#[derive(Debug, Clone, Args)]
pub struct ReportDaily {
    /// The day, `YYYY-MM-DD` (UTC); yesterday by default.
    #[arg(long, value_name = "YYYY-MM-DD")]
    pub date: Option<chrono::NaiveDate>,
    /// Only this tenant's leases and usage (every GPU still shows).
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
    /// Where to write: `.html`, `.svg` or `.png`.
    #[arg(long, value_name = "FILE")]
    pub out: std::path::PathBuf,
    /// What colours the timeline's bars.
    #[arg(long = "colour-by", value_enum, default_value_t = ReportColourBy::Tenant)]
    pub colour_by: ReportColourBy,
}

/// What colours the bars of `lh report daily`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportColourBy {
    Tenant,
    Tier,
}

/// `lh report cost`
#[derive(Debug, Clone, Args)]
pub struct ReportCost {
    /// ISO week, `YYYY-Www` (`2026-W49`).
    #[arg(long, value_name = "YYYY-Www", value_parser = parse_week)]
    pub week: String,
    /// Whose (admin token only; default: your own).
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
    /// Print CSV instead of a table.
    #[arg(long)]
    pub csv: bool,
}

/// `lh billing ...`
#[derive(Debug, Clone, Subcommand)]
pub enum BillingCommand {
    /// A past month's charges priced again on another price book: per
    /// tenant, what was charged, what the book would charge, the difference.
    WhatIf(BillingWhatIf),
}

/// `lh billing what-if`
#[derive(Debug, Clone, Args)]
pub struct BillingWhatIf {
    /// The other book, as `lh price-book publish --file` takes it:
    /// `{"version"?, "tiers": [...]}`; it is not published.
    #[arg(long, value_name = "FILE")]
    pub book: std::path::PathBuf,
    /// The month, `YYYY-MM`.
    #[arg(long, value_name = "YYYY-MM", value_parser = parse_period)]
    pub period: String,
    /// Print CSV instead of a table.
    #[arg(long)]
    pub csv: bool,
}

/// `lh node ...`
#[derive(Debug, Clone, Subcommand)]
pub enum NodeCommand {
    /// Place nothing new on a node; its running leases finish or move.
    Drain(NodeDrain),
    /// Let a drained node take new leases again.
    Uncordon(NodeId),
}

/// `lh node drain`
#[derive(Debug, Clone, Args)]
pub struct NodeDrain {
    /// Node id.
    pub id: String,
    /// `finish`: running leases end where they are; `move`: moved now.
    #[arg(long, value_enum)]
    pub mode: DrainMode,
    /// Why, for the log.
    #[arg(long)]
    pub reason: Option<String>,
}

/// `lh node uncordon`
#[derive(Debug, Clone, Args)]
pub struct NodeId {
    /// Node id.
    pub id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DrainMode {
    Finish,
    Move,
}

impl DrainMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DrainMode::Finish => "finish",
            DrainMode::Move => "move",
        }
    }
}

/// What a node-agent does with a tenant's idle lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IdleAction {
    Notify,
    Stop,
    Suspend,
}

impl IdleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Notify => "notify",
            IdleAction::Stop => "stop",
            IdleAction::Suspend => "suspend",
        }
    }
}

/// `lh tenant ...`
#[derive(Debug, Clone, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its API key (shown only once).
    Create(TenantCreate),
    /// Show a tenant: its name, e-mail, quota, weight and whether it is
    /// suspended or erased.
    Get(TenantId),
    /// Issue, list and revoke a tenant's API keys (admin or the tenant).
    #[command(subcommand)]
    Key(KeyCommand),
    /// Suspend a tenant: it may read but change nothing (admin).
    Suspend(TenantSuspend),
    /// Let a suspended tenant act again (admin).
    Resume(TenantId),
    /// Change a tenant's quota and fair-share weight (admin).
    SetQuota(TenantSetQuota),
    /// Erase a tenant: destroy its data key, so its name and e-mail read as
    /// `[erased]` for good; refused while a lease of it has not ended (admin).
    Erase(TenantId),
}

/// A tenant named by its id.
#[derive(Debug, Clone, Args)]
pub struct TenantId {
    /// Tenant id.
    pub id: String,
}

/// `lh tenant suspend`
#[derive(Debug, Clone, Args)]
pub struct TenantSuspend {
    /// Tenant id.
    pub id: String,
    /// Why; logged sealed with the tenant's key, unreadable once it is erased.
    #[arg(long)]
    pub reason: Option<String>,
    /// Also stop every lease of the tenant; otherwise running leases run
    /// on and waiting ones wait.
    #[arg(long)]
    pub stop_leases: bool,
}

/// `lh tenant set-quota`
#[derive(Debug, Clone, Args)]
pub struct TenantSetQuota {
    /// Tenant id.
    pub id: String,
    /// Most GPUs the tenant may hold at once.
    #[arg(long, value_name = "N")]
    pub max_gpus: u32,
    /// Most VRAM the tenant may hold at once, in GB; unlimited when absent.
    #[arg(long, value_name = "GB")]
    pub max_vram_gb: Option<u32>,
    /// Weight in fair sharing, 1 to 1000; unchanged when absent.
    #[arg(long)]
    pub weight: Option<u32>,
}

/// `lh tenant key ...`
#[derive(Debug, Clone, Subcommand)]
pub enum KeyCommand {
    /// Issue another key and print it (shown only once).
    Create(KeyCreate),
    /// List the tenant's keys (ids, prefixes, states; never the secrets).
    #[command(visible_alias = "list")]
    Ls(TenantId),
    /// Revoke a key: it is refused from the moment this returns.
    Revoke(KeyRevoke),
}

/// `lh tenant key create`
#[derive(Debug, Clone, Args)]
pub struct KeyCreate {
    /// Tenant id.
    pub id: String,
    /// When the key stops working (RFC 3339, e.g. 2027-06-30T00:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub expires_at: Option<String>,
}

/// `lh tenant key revoke`
#[derive(Debug, Clone, Args)]
pub struct KeyRevoke {
    /// Tenant id.
    pub id: String,
    /// The key's id, as `lh tenant key ls` shows it.
    pub key_id: u32,
}

/// `lh tenant create`
#[derive(Debug, Clone, Args)]
pub struct TenantCreate {
    /// Display name of the tenant.
    #[arg(long)]
    pub name: String,
    /// Contact e-mail address.
    #[arg(long)]
    pub email: String,
    /// Most GPUs the tenant may hold at once.
    #[arg(long, value_name = "N")]
    pub max_gpus: u32,
    /// Seconds of zero GPU use after which a lease is idle (with --idle-action).
    #[arg(long, value_name = "SECS", requires = "idle_action")]
    pub idle_window_secs: Option<u64>,
    /// What happens to an idle lease (the node-agents' default otherwise).
    #[arg(long, value_enum, requires = "idle_window_secs")]
    pub idle_action: Option<IdleAction>,
    /// Vouch for the tenant: its leases may also run on nodes that do not
    /// isolate workloads (process runtime).
    #[arg(long)]
    pub trusted: bool,
}

/// `lh lease ...`
#[derive(Debug, Clone, Subcommand)]
pub enum LeaseCommand {
    /// Request a new lease.
    Create(Box<LeaseCreate>),
    /// Show one lease, optionally waiting for it to reach a state.
    Get(LeaseGet),
    /// List your leases, newest first.
    #[command(visible_alias = "list")]
    Ls(LeaseList),
    /// Stop (end) a lease.
    Stop(LeaseStop),
    /// Queue a suspended lease again.
    Resume(LeaseStop),
    /// What a lease used of its GPUs: one row per step, one table per GPU.
    Usage(LeaseUsage),
    /// Print what the lease's workload wrote (stdout and stderr), raw.
    Logs(LeaseLogs),
}

/// What a lease or a quote asks for: whole GPUs, a share of one or a MIG
/// instance.
#[derive(Debug, Clone, Args)]
pub struct GpuAskArgs {
    /// Number of whole GPUs (or ask for a share of one with --milli and
    /// --vram-gb, or for a MIG instance with --mig).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..),
        required_unless_present_any = ["milli", "mig"],
        conflicts_with_all = ["milli", "mig"]
    )]
    pub gpus: Option<u32>,
    /// One MIG instance of this profile of the model, e.g. `3g.20gb`.
    #[arg(long, value_name = "PROFILE", conflicts_with = "milli")]
    pub mig: Option<String>,
    /// A share of one GPU's compute, in milli-GPU (1 to 1000).
    #[arg(
        long,
        value_name = "MILLI",
        value_parser = clap::value_parser!(u32).range(1..=1000),
        requires = "vram_gb"
    )]
    pub milli: Option<u32>,
    /// VRAM of the share, in GB (a hard limit).
    #[arg(
        long,
        value_name = "GB",
        value_parser = clap::value_parser!(u32).range(1..),
        requires = "milli"
    )]
    pub vram_gb: Option<u32>,
}

/// `lh lease create`
#[derive(Debug, Clone, Args)]
pub struct LeaseCreate {
    #[command(flatten)]
    pub ask: GpuAskArgs,
    /// Order among your own waiting leases, -1000 to 1000 (higher first).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub priority: i32,
    /// GPU model, e.g. `H100-80G`.
    #[arg(long, value_name = "MODEL")]
    pub gpu_model: String,
    /// Service tier.
    #[arg(long, value_enum, default_value_t = Tier::Basic)]
    pub tier: Tier,
    /// Sent as the `Idempotency-Key` header: retrying with the same key
    /// returns the lease created the first time.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Spot only: the most you pay, CNY per GPU-hour (e.g. `4.5`).
    #[arg(long, value_name = "CNY")]
    pub max_price: Option<String>,
    /// A quote of yours (`lh quote`) for these GPUs, model and tier: the
    /// lease is billed on the price book it names.
    #[arg(long, value_name = "QUOTE_ID")]
    pub quote: Option<String>,
    /// A zone the lease may run in (repeatable; none: any).
    #[arg(long = "zone", value_name = "ZONE")]
    pub zones: Vec<String>,
    /// A region the lease may run in (repeatable; none: any).
    #[arg(long = "region", value_name = "REGION")]
    pub regions: Vec<String>,
    /// Spot only: after a preemption, request the lease again up to this
    /// many times (0 to 10).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=10))]
    pub max_retries: Option<u32>,
    /// Where a recovered lease looks first: the zone it left, or any.
    #[arg(long, value_enum, default_value_t = ZoneFirst::Same, requires = "max_retries")]
    pub zone_first: ZoneFirst,
    /// Container image the workload runs (nodes with a container runtime).
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// An environment variable of the workload, NAME=VALUE (repeatable).
    /// The value is kept out of the event log, sealed with the tenant's key,
    /// and given only to the node the lease runs on.
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// The workload's command, after `--`: `lh lease create ... -- python train.py`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Where a recovered spot lease looks first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ZoneFirst {
    Same,
    Any,
}

impl ZoneFirst {
    pub fn as_str(self) -> &'static str {
        match self {
            ZoneFirst::Same => "same",
            ZoneFirst::Any => "any",
        }
    }
}

fn parse_env(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{raw:?} is not NAME=VALUE")),
    }
}

/// `lh lease get`
#[derive(Debug, Clone, Args)]
pub struct LeaseGet {
    /// Lease id.
    pub id: String,
    /// Poll every 200 ms until the lease reaches this state (or ends, or is rejected).
    #[arg(long, value_enum, value_name = "STATE")]
    pub wait: Option<LeaseState>,
    /// Give up waiting after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60, requires = "wait")]
    pub timeout: u64,
}

/// `lh lease ls`
#[derive(Debug, Clone, Args)]
pub struct LeaseList {
    /// Page size asked of the gateway.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: Option<u32>,
    /// Start from this cursor (the `next_cursor` of an earlier page).
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
    /// Follow `next_cursor` until the last page.
    #[arg(long)]
    pub all: bool,
}

/// `lh lease usage`
#[derive(Debug, Clone, Args)]
pub struct LeaseUsage {
    /// Lease id.
    pub id: String,
    /// Start of the window (RFC 3339); by default an hour before --to.
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// End of the window (RFC 3339); by default now.
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,
    /// Seconds per row: a multiple of 60, 60 to 86400 (60 by default).
    #[arg(long, value_name = "SECS")]
    pub step: Option<u32>,
}

/// `lh lease logs`
#[derive(Debug, Clone, Args)]
pub struct LeaseLogs {
    /// Lease id.
    pub id: String,
    /// Keep printing what the workload writes (polling every second) until
    /// it ends and all of it is printed; Ctrl-C stops.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Start this many bytes before the end instead of at the start of
    /// what the node keeps.
    #[arg(long, value_name = "BYTES")]
    pub tail: Option<u64>,
}

/// `lh lease stop`
#[derive(Debug, Clone, Args)]
pub struct LeaseStop {
    /// Lease id.
    pub id: String,
}

/// `lh invoice ...`
#[derive(Debug, Clone, Subcommand)]
pub enum InvoiceCommand {
    /// List invoices and notes, newest month first.
    Ls(InvoiceLs),
    /// Show one invoice or note: by id, or your invoice of a month.
    Show(InvoiceShow),
    /// Print one invoice or note as CSV.
    Export(InvoiceShow),
}

/// `lh invoice ls`
#[derive(Debug, Clone, Args)]
pub struct InvoiceLs {
    /// Only this month, `YYYY-MM`.
    #[arg(long, value_name = "YYYY-MM", value_parser = parse_period)]
    pub period: Option<String>,
    /// Only `draft` or `issued` ones.
    #[arg(long, value_parser = ["draft", "issued"])]
    pub status: Option<String>,
    /// Whose (admin token only; default: your own, or every tenant's for the admin).
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
    /// At most this many (1 to 500).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub limit: Option<u32>,
}

/// `lh invoice show` and `lh invoice export`
#[derive(Debug, Clone, Args)]
pub struct InvoiceShow {
    /// Invoice or note id.
    #[arg(
        value_name = "ID",
        required_unless_present = "period",
        conflicts_with = "period"
    )]
    pub id: Option<String>,
    /// Instead of an id: the invoice of this month, `YYYY-MM` (a draft until issued).
    #[arg(long, value_name = "YYYY-MM", value_parser = parse_period)]
    pub period: Option<String>,
    /// Tenant whose invoice of `--period` (admin token only; default: your own).
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
}

impl InvoiceShow {
    /// The path segment naming the document: its id or its month.
    pub fn target(&self) -> &str {
        self.id
            .as_deref()
            .or(self.period.as_deref())
            .unwrap_or_default()
    }
}

/// `lh spot ...`
#[derive(Debug, Clone, Subcommand)]
pub enum SpotCommand {
    /// Current spot price of each (zone, GPU model) and its recent history.
    Prices(SpotPrices),
}

/// `lh spot prices`
#[derive(Debug, Clone, Args)]
pub struct SpotPrices {
    /// Only this zone.
    #[arg(long)]
    pub zone: Option<String>,
    /// Only this GPU model.
    #[arg(long, value_name = "MODEL")]
    pub gpu_model: Option<String>,
    /// Past prices to show per market (0 to 60).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=60))]
    pub history: u32,
}

/// `lh audit ...`
#[derive(Debug, Clone, Subcommand)]
pub enum AuditCommand {
    /// Verify the audit log's hash chain; exits 1 when it is broken. With
    /// `--nats-url` and a pinned key, reads the log itself and trusts
    /// nothing but the key; without them, asks the gateway.
    Verify(AuditVerify),
    /// One page of the audit records, filtered (operators: any tenant's;
    /// a tenant: its own).
    Events(AuditEvents),
    /// Every record from a sequence or a time on, in log order, one JSON
    /// object a line, page after page until the end.
    Replay(AuditReplay),
    /// Every record of a tenant as JSON lines or CSV; or with `--subject`,
    /// everything the platform holds about a tenant, in one JSON document.
    Export(AuditExport),
}

/// Filters of the audit records.
#[derive(Debug, Clone, Default, Args)]
pub struct AuditFilter {
    /// Only this tenant's records.
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
    /// Only records caused by this principal (`tenant:<id>`,
    /// `admin:<name>`, `auditor:<name>`, `service:<name>`, `node:<id>`).
    #[arg(long, value_name = "PRINCIPAL")]
    pub actor: Option<String>,
    /// Only records of this event type, e.g. `lease.placed`.
    #[arg(long = "type", value_name = "EVENT_TYPE")]
    pub event_type: Option<String>,
    /// Only records that occurred at or after this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// Only records that occurred before this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,
}

/// `lh audit events`
#[derive(Debug, Clone, Args)]
pub struct AuditEvents {
    #[command(flatten)]
    pub filter: AuditFilter,
    /// Only records after this stream sequence (a page's `next`).
    #[arg(long, value_name = "SEQ")]
    pub after: Option<u64>,
    /// Records in the page (1 to 1000; 100 by default).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: Option<u32>,
}

/// `lh audit replay`
#[derive(Debug, Clone, Args)]
pub struct AuditReplay {
    /// Where to start: a stream sequence (that record included) or an RFC
    /// 3339 time.
    #[arg(long, value_name = "SEQ|TIME", default_value = "1")]
    pub from: String,
}

/// Format of `lh audit export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// One JSON record a line.
    Jsonl,
    /// One row a record; cells that could run as formulas are defused.
    Csv,
}

/// `lh audit export`
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("whose").required(true).args(["tenant", "subject"])))]
pub struct AuditExport {
    /// Whose records.
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
    #[arg(long, value_enum, default_value_t = ExportFormat::Jsonl)]
    pub format: ExportFormat,
    /// A data subject's access request: everything held about this tenant
    /// (the tenant, its invoices, every record of it) in one JSON document.
    #[arg(long, value_name = "TENANT_ID", conflicts_with = "format")]
    pub subject: Option<String>,
}

/// Stream the log read by `lh audit verify` when none is named.
pub const DEFAULT_AUDIT_STREAM: &str = "LH_EVENTS";

/// `lh audit verify`
#[derive(Debug, Clone, Default, Args)]
pub struct AuditVerify {
    /// NATS server(s) to read the log from, comma-separated. Credentials
    /// come from `LH_NATS_USER` with `LH_NATS_NKEY_SEED_FILE` (the
    /// deployment's `auditor` user), TLS from `LH_NATS_CA_FILE`.
    #[arg(long, env = "LH_NATS_URL", value_name = "URL")]
    pub nats_url: Option<String>,
    /// The audit service's ed25519 public key (64 hex digits), obtained out
    /// of band: every checkpoint must be signed by it.
    #[arg(long, value_name = "HEX", conflicts_with = "public_key_file")]
    pub public_key: Option<String>,
    /// A file holding the pinned public key as hex.
    #[arg(long, value_name = "PATH")]
    pub public_key_file: Option<std::path::PathBuf>,
    /// The JetStream stream holding the log.
    #[arg(long, default_value = DEFAULT_AUDIT_STREAM, value_name = "NAME")]
    pub stream: String,
    /// Start from a checkpoint an earlier run verified: its
    /// `SEQUENCE:EVENTS:HEAD:SIGNATURE`, or a file `--save-state` wrote.
    /// Its signature is checked again with the pinned key.
    #[arg(long, value_name = "TOKEN|PATH")]
    pub resume_from: Option<String>,
    /// When the chain verifies, write its last verified checkpoint here
    /// (JSON), for `--resume-from` next time.
    #[arg(long, value_name = "PATH")]
    pub save_state: Option<std::path::PathBuf>,
}

/// Service tier of a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Tier {
    /// Guaranteed capacity.
    Basic,
    /// Cheaper, preemptible capacity.
    Spot,
    /// Guaranteed capacity on a price ladder that falls with the lease's age.
    Performance,
    /// Covered by the tenant's reservation; beyond it, billed as basic.
    Reserved,
}

impl Tier {
    /// The tier as the gateway spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Basic => "basic",
            Tier::Spot => "spot",
            Tier::Performance => "performance",
            Tier::Reserved => "reserved",
        }
    }
}

/// Lifecycle state of a lease, as the gateway reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LeaseState {
    Requested,
    Queued,
    Placed,
    Running,
    Suspended,
    Ended,
    Rejected,
}

impl LeaseState {
    /// The state as the gateway spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Requested => "requested",
            LeaseState::Queued => "queued",
            LeaseState::Placed => "placed",
            LeaseState::Running => "running",
            LeaseState::Suspended => "suspended",
            LeaseState::Ended => "ended",
            LeaseState::Rejected => "rejected",
        }
    }

    /// Parses the gateway's spelling; `None` for a state this CLI does not know.
    pub fn from_wire(s: &str) -> Option<Self> {
        Some(match s {
            "requested" => LeaseState::Requested,
            "queued" => LeaseState::Queued,
            "placed" => LeaseState::Placed,
            "running" => LeaseState::Running,
            "suspended" => LeaseState::Suspended,
            "ended" => LeaseState::Ended,
            "rejected" => LeaseState::Rejected,
            _ => return None,
        })
    }

    /// `ended` and `rejected`: a lease in these states never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(self, LeaseState::Ended | LeaseState::Rejected)
    }

    /// Position along requested → queued → placed → running → ended.
    /// `rejected` and `suspended` are off that path and have no rank.
    fn rank(self) -> Option<u8> {
        match self {
            LeaseState::Requested => Some(0),
            LeaseState::Queued => Some(1),
            LeaseState::Placed => Some(2),
            LeaseState::Running => Some(3),
            LeaseState::Ended => Some(4),
            // Off the path: a resume sends it back to requested.
            LeaseState::Suspended | LeaseState::Rejected => None,
        }
    }

    /// Whether a lease now in `self` has passed `target` on its way forward
    /// without being finished (e.g. `running` has passed `placed`), so that a
    /// wait for `target` that missed the moment between two polls succeeds.
    pub fn is_past(self, target: LeaseState) -> bool {
        if self.is_terminal() {
            return false;
        }
        match (self.rank(), target.rank()) {
            (Some(now), Some(want)) => now > want,
            _ => false,
        }
    }
}

impl std::fmt::Display for LeaseState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Accepts `YYYY-MM` with a month from 01 to 12.
fn parse_week(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let shape_ok = bytes.len() == 8
        && &bytes[4..6] == b"-W"
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[6..].iter().all(u8::is_ascii_digit);
    let week: u8 = if shape_ok {
        s[6..].parse().unwrap_or(0)
    } else {
        0
    };
    if !(1..=53).contains(&week) {
        return Err(format!(
            "expected an ISO week YYYY-Www (2026-W49), got `{s}`"
        ));
    }
    Ok(s.to_string())
}

fn parse_period(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let shape_ok = bytes.len() == 7
        && bytes[4] == b'-'
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[5..].iter().all(u8::is_ascii_digit);
    if !shape_ok {
        return Err(format!("expected YYYY-MM, got `{s}`"));
    }
    let month: u8 = s[5..].parse().map_err(|_| format!("bad month in `{s}`"))?;
    if !(1..=12).contains(&month) {
        return Err(format!("month must be 01..12, got `{s}`"));
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("lh").chain(args.iter().copied()))
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn tenant_create() {
        let cli = parse(&[
            "tenant",
            "create",
            "--name",
            "acme",
            "--email",
            "ops@acme.test",
            "--max-gpus",
            "8",
        ])
        .unwrap();
        let Command::Tenant(TenantCommand::Create(t)) = cli.command else {
            panic!("wrong command: {:?}", cli.command)
        };
        assert_eq!(t.name, "acme");
        assert_eq!(t.email, "ops@acme.test");
        assert_eq!(t.max_gpus, 8);
        assert!(!t.trusted, "not trusted unless said");
        let cli = parse(&[
            "tenant",
            "create",
            "--name",
            "a",
            "--email",
            "e",
            "--max-gpus",
            "1",
            "--trusted",
        ])
        .unwrap();
        let Command::Tenant(TenantCommand::Create(t)) = cli.command else {
            panic!("wrong command: {:?}", cli.command)
        };
        assert!(t.trusted);
    }

    #[test]
    fn tenant_create_needs_all_fields() {
        let e = parse(&["tenant", "create", "--name", "acme"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        let e = parse(&[
            "tenant",
            "create",
            "--name",
            "a",
            "--email",
            "e",
            "--max-gpus",
            "-3",
        ])
        .unwrap_err();
        assert_ne!(e.kind(), ErrorKind::DisplayHelp);
    }

    #[test]
    fn lease_create_defaults_to_basic() {
        let cli = parse(&["lease", "create", "--gpus", "2", "--gpu-model", "H100"]).unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(c.ask.gpus, Some(2));
        assert_eq!(c.gpu_model, "H100");
        assert_eq!(c.priority, 0);
        assert_eq!(c.tier, Tier::Basic);
        assert_eq!(c.idempotency_key, None);
    }

    #[test]
    fn lease_create_spot_with_idempotency_key() {
        let cli = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A100",
            "--tier",
            "spot",
            "--idempotency-key",
            "k-1",
        ])
        .unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(c.tier, Tier::Spot);
        assert_eq!(c.idempotency_key.as_deref(), Some("k-1"));
    }

    #[test]
    fn lease_create_rejects_bad_values() {
        for args in [
            &["lease", "create", "--gpus", "0", "--gpu-model", "H100"][..],
            &["lease", "create", "--gpus", "two", "--gpu-model", "H100"],
            &[
                "lease",
                "create",
                "--gpus",
                "1",
                "--gpu-model",
                "H100",
                "--tier",
                "gold",
            ],
        ] {
            let e = parse(args).unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::ValueValidation | ErrorKind::InvalidValue
                ),
                "{args:?}: {:?}",
                e.kind()
            );
        }
        let e = parse(&["lease", "create", "--gpu-model", "H100"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        // A share needs both its compute and its VRAM, and excludes --gpus.
        let e = parse(&["lease", "create", "--milli", "300", "--gpu-model", "H100"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        let e = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--milli",
            "300",
            "--vram-gb",
            "10",
            "--gpu-model",
            "H100",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict);
        let e = parse(&[
            "lease",
            "create",
            "--milli",
            "1001",
            "--vram-gb",
            "1",
            "--gpu-model",
            "H100",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
    }

    #[test]
    fn lease_create_a_share_of_one_gpu_with_a_priority() {
        let cli = parse(&[
            "lease",
            "create",
            "--milli",
            "300",
            "--vram-gb",
            "10",
            "--gpu-model",
            "A100-40GB",
            "--priority",
            "-5",
        ])
        .unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(
            (c.ask.gpus, c.ask.milli, c.ask.vram_gb, c.priority),
            (None, Some(300), Some(10), -5)
        );
    }

    #[test]
    fn lease_create_a_mig_instance() {
        let cli = parse(&[
            "lease",
            "create",
            "--mig",
            "3g.20gb",
            "--gpu-model",
            "A100-40GB",
        ])
        .unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!((c.ask.gpus, c.ask.mig.as_deref()), (None, Some("3g.20gb")));
        for other in [
            &["--gpus", "1"][..],
            &["--milli", "300", "--vram-gb", "10"][..],
        ] {
            let mut args = vec![
                "lease",
                "create",
                "--mig",
                "1g.5gb",
                "--gpu-model",
                "A100-40GB",
            ];
            args.extend_from_slice(other);
            assert_eq!(
                parse(&args).unwrap_err().kind(),
                ErrorKind::ArgumentConflict
            );
        }
    }

    #[test]
    fn lease_create_with_a_workload() {
        let cli = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A100-40GB",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--",
            "python",
            "train.py",
            "--epochs",
            "3",
        ])
        .unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(c.command, ["python", "train.py", "--epochs", "3"]);
        assert_eq!(
            c.env,
            [("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
        let e = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A",
            "--env",
            "=1",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
    }

    #[test]
    fn lease_get_with_wait_and_timeout() {
        let cli = parse(&["lease", "get", "abc", "--wait", "running", "--timeout", "5"]).unwrap();
        let Command::Lease(LeaseCommand::Get(g)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(g.id, "abc");
        assert_eq!(g.wait, Some(LeaseState::Running));
        assert_eq!(g.timeout, 5);

        let cli = parse(&["lease", "get", "abc"]).unwrap();
        let Command::Lease(LeaseCommand::Get(g)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(g.wait, None);
        assert_eq!(g.timeout, 60);
    }

    #[test]
    fn lease_get_rejects_unknown_state_and_lone_timeout() {
        let e = parse(&["lease", "get", "abc", "--wait", "sleeping"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        let e = parse(&["lease", "get", "abc", "--timeout", "3"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        let e = parse(&["lease", "get"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn lease_ls_and_alias() {
        let cli = parse(&["lease", "ls", "--limit", "10", "--all"]).unwrap();
        let Command::Lease(LeaseCommand::Ls(l)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(l.limit, Some(10));
        assert!(l.all);
        assert_eq!(l.cursor, None);

        let cli = parse(&["lease", "list"]).unwrap();
        let Command::Lease(LeaseCommand::Ls(l)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(l.limit, None);
        assert!(!l.all);

        let e = parse(&["lease", "ls", "--limit", "0"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
    }

    #[test]
    fn lease_stop() {
        let cli = parse(&["lease", "stop", "L1"]).unwrap();
        let Command::Lease(LeaseCommand::Stop(s)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(s.id, "L1");
    }

    #[test]
    fn invoice_show_checks_period() {
        let cli = parse(&["invoice", "show", "--period", "2026-12", "--tenant", "T"]).unwrap();
        let Command::Invoice(InvoiceCommand::Show(i)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(i.period.as_deref(), Some("2026-12"));
        assert_eq!(i.tenant.as_deref(), Some("T"));
        assert_eq!(i.target(), "2026-12");
        let cli = parse(&["invoice", "export", "0193b7e2-0000-7000-8000-0000000000ff"]).unwrap();
        let Command::Invoice(InvoiceCommand::Export(e)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(e.target(), "0193b7e2-0000-7000-8000-0000000000ff");
        // One of the two, not both, not neither.
        assert!(parse(&["invoice", "show"]).is_err());
        assert!(parse(&["invoice", "show", "X", "--period", "2026-12"]).is_err());
        let cli = parse(&["invoice", "ls", "--status", "issued", "--period", "2026-11"]).unwrap();
        let Command::Invoice(InvoiceCommand::Ls(l)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(
            (l.status.as_deref(), l.period.as_deref()),
            (Some("issued"), Some("2026-11"))
        );
        assert!(parse(&["invoice", "ls", "--status", "paid"]).is_err());

        for bad in [
            "2026-13",
            "2026-00",
            "26-12",
            "2026/12",
            "2026-1",
            "２０２６-12",
            "",
        ] {
            let e = parse(&["invoice", "show", "--period", bad]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{bad}");
        }
    }

    #[test]
    fn report_cost_checks_the_week() {
        let cli = parse(&[
            "report", "cost", "--week", "2026-W49", "--tenant", "T", "--csv",
        ])
        .unwrap();
        let Command::Report(ReportCommand::Cost(r)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(
            (r.week.as_str(), r.tenant.as_deref(), r.csv),
            ("2026-W49", Some("T"), true)
        );
        for bad in [
            "2026-49",
            "2026-W54",
            "2026-W00",
            "2026-W4",
            "2026-w49",
            "２０２６-W49",
            "abc€49",
        ] {
            let e = parse(&["report", "cost", "--week", bad]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{bad}");
        }
    }

    #[test]
    fn report_daily_takes_a_day_a_file_and_a_colouring() {
        let cli = parse(&[
            "report",
            "daily",
            "--date",
            "2026-12-03",
            "--out",
            "day.png",
            "--colour-by",
            "tier",
        ])
        .unwrap();
        let Command::Report(ReportCommand::Daily(d)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(d.date, chrono::NaiveDate::from_ymd_opt(2026, 12, 3));
        assert_eq!(
            (d.out.to_str(), d.colour_by),
            (Some("day.png"), ReportColourBy::Tier)
        );
        let cli = parse(&["report", "daily", "--out", "day.html"]).unwrap();
        let Command::Report(ReportCommand::Daily(d)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!((d.date, d.colour_by), (None, ReportColourBy::Tenant));
        assert!(parse(&["report", "daily"]).is_err(), "--out is needed");
        for bad in ["2026-13-01", "03.12.2026", "yesterday"] {
            let e = parse(&["report", "daily", "--date", bad, "--out", "d.svg"]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{bad}");
        }
        assert!(parse(&["report", "daily", "--out", "d.svg", "--colour-by", "zone"]).is_err());
    }

    #[test]
    fn billing_what_if_needs_a_book_and_a_month() {
        let cli = parse(&[
            "billing", "what-if", "--book", "b.json", "--period", "2026-11", "--csv",
        ])
        .unwrap();
        let Command::Billing(BillingCommand::WhatIf(w)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(
            (w.book.to_str(), w.period.as_str(), w.csv),
            (Some("b.json"), "2026-11", true)
        );
        assert!(parse(&["billing", "what-if", "--period", "2026-11"]).is_err());
        let e = parse(&[
            "billing", "what-if", "--book", "b.json", "--period", "2026-13",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
    }

    #[test]
    fn audit_verify() {
        let cli = parse(&["audit", "verify"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Audit(AuditCommand::Verify(AuditVerify { nats_url: None, .. }))
        ));
        let cli = parse(&[
            "audit",
            "verify",
            "--nats-url",
            "nats://h:4222",
            "--public-key",
            "ab",
            "--stream",
            "COPY",
        ])
        .unwrap();
        let Command::Audit(AuditCommand::Verify(v)) = cli.command else {
            panic!("audit verify")
        };
        assert_eq!(v.nats_url.as_deref(), Some("nats://h:4222"));
        assert_eq!(v.stream, "COPY");
        assert!(parse(&[
            "audit",
            "verify",
            "--public-key",
            "ab",
            "--public-key-file",
            "k"
        ])
        .is_err());
    }

    #[test]
    fn audit_queries() {
        let cli = parse(&["audit", "events", "--type", "lease.placed", "--limit", "5"]).unwrap();
        let Command::Audit(AuditCommand::Events(e)) = cli.command else {
            panic!("not audit events");
        };
        assert_eq!(e.filter.event_type.as_deref(), Some("lease.placed"));
        assert_eq!(e.limit, Some(5));
        assert!(parse(&["audit", "events", "--limit", "1001"]).is_err());
        let cli = parse(&["audit", "export", "--tenant", "t", "--format", "csv"]).unwrap();
        let Command::Audit(AuditCommand::Export(x)) = cli.command else {
            panic!("not audit export");
        };
        assert_eq!(x.format, ExportFormat::Csv);
        assert!(parse(&["audit", "export"]).is_err(), "whose records?");
        assert!(parse(&["audit", "export", "--subject", "t", "--format", "csv"]).is_err());
    }

    #[test]
    fn global_flags_anywhere() {
        let cli = parse(&[
            "--gateway-url",
            "http://gw:9000",
            "lease",
            "ls",
            "--json",
            "--api-key-file",
            "/run/key",
        ])
        .unwrap();
        assert_eq!(cli.gateway_url, "http://gw:9000");
        assert_eq!(
            cli.api_key_file.as_deref(),
            Some(std::path::Path::new("/run/key"))
        );
        assert!(cli.json);
    }

    #[test]
    fn missing_subcommand_is_an_error() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["lease"]).is_err());
        assert!(parse(&["frobnicate"]).is_err());
    }

    #[test]
    fn state_progress() {
        use LeaseState::*;
        assert!(Running.is_past(Placed));
        assert!(Placed.is_past(Queued));
        assert!(!Queued.is_past(Placed));
        assert!(!Running.is_past(Running));
        assert!(!Ended.is_past(Running));
        assert!(!Rejected.is_past(Queued));
        assert!(!Running.is_past(Rejected));
        assert_eq!(LeaseState::from_wire("placed"), Some(Placed));
        assert_eq!(LeaseState::from_wire("paused"), None);
    }
}
