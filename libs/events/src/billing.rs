//! What is charged: service tiers, price books (`lh.evt.price_book.*`),
//! spot prices (`lh.evt.spot.<zone>.<model>`) and charges
//! (`lh.evt.charge.<lease id>`).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Service tier of a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    #[cfg_attr(feature = "clap", value(help = "Guaranteed capacity"))]
    Basic,
    #[cfg_attr(feature = "clap", value(help = "Cheaper, preemptible capacity"))]
    Spot,
    /// A price ladder by the lease's billable age.
    #[cfg_attr(
        feature = "clap",
        value(help = "Guaranteed capacity on a price ladder that falls with the lease's age")
    )]
    Performance,
    /// Covered by a tenant's commitment; what does not fit is billed as basic.
    #[cfg_attr(
        feature = "clap",
        value(help = "Covered by the tenant's reservation; beyond it, billed as basic")
    )]
    Reserved,
}

impl Tier {
    pub const ALL: [Tier; 4] = [Tier::Basic, Tier::Performance, Tier::Spot, Tier::Reserved];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Basic => "basic",
            Tier::Spot => "spot",
            Tier::Performance => "performance",
            Tier::Reserved => "reserved",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SpotPriceSet {
    pub zone: String,
    pub gpu_model: String,
    /// CNY per GB of VRAM per hour, as a decimal string.
    #[schemars(with = "String")]
    pub price_cny_per_gb_hour: Decimal,
    /// Share of this (zone, model)'s GPUs held by leases, 0..=1, as a decimal string.
    #[schemars(with = "String")]
    pub utilisation: Decimal,
    pub gpus_total: u32,
    pub gpus_used: u32,
}

/// The spot-broker chose where a spot request could run on external
/// capacity: the cheapest offer of the clouds it knows that satisfies the
/// request (model, GPUs on one instance, zones, regions, bid), with every
/// offer it weighed and why each other one was passed over. Stored on the
/// chosen `zone`'s spot subject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SpotCapacityChosen {
    pub lease_id: Uuid,
    pub tenant_id: Uuid,
    pub provider: String,
    pub region: String,
    pub zone: String,
    pub gpu_model: String,
    pub gpus: u32,
    /// CNY per GPU-hour, as a decimal string.
    #[schemars(with = "String")]
    pub price_cny_per_gpu_hour: Decimal,
    /// Cheapest first; the chosen one among them.
    pub candidates: Vec<CapacityCandidate>,
}

/// One cloud offer weighed for a spot request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CapacityCandidate {
    pub provider: String,
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub gpus_per_instance: u32,
    /// CNY per GPU-hour, as a decimal string.
    #[schemars(with = "String")]
    pub price_cny_per_gpu_hour: Decimal,
    /// Why it was passed over; absent for one that satisfies the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

/// A version of the price book. Every charge names the version it used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PriceBookPublished {
    pub version: u32,
    pub currency: String,
    pub effective_from: DateTime<Utc>,
    pub tiers: Vec<TierPrice>,
    /// What a tenant's object storage costs: CNY per GB (10^9 bytes) held
    /// for a month of 730 hours, charged by the second between the
    /// gateway's measurements. Absent (books published before storage was
    /// billed): storage is free on this book.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub storage_cny_per_gb_month: Option<Decimal>,
    /// Who asked pricing to publish this version (an admin through the
    /// gateway); absent for the default book.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<crate::Actor>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TierPrice {
    pub tier: Tier,
    /// The tier's headline price: the flat price, a ladder's first step, a
    /// package's price per hour, or for `market` the price charged while
    /// the market has published none. Readers that know `model` use it.
    #[schemars(with = "String")]
    pub price_cny_per_gb_hour: Decimal,
    /// How the tier is charged; absent (books published before charge
    /// models): flat at `price_cny_per_gb_hour`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ChargeModel>,
}

/// How a tier turns GB of VRAM and billable time into money. Prices are CNY
/// per GB of VRAM; the arithmetic is `lh_domain::rating`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ChargeModel {
    /// One price per GB-hour, per second.
    Flat {
        #[schemars(with = "String")]
        price_cny_per_gb_hour: Decimal,
    },
    /// Each second at the price of the step the lease's billable age is in.
    Graduated { steps: Vec<PriceStep> },
    /// All of the lease's billable time at the price of the step its total
    /// age has reached (the price can fall as it runs: a charge may be
    /// negative).
    Volume { steps: Vec<PriceStep> },
    /// Whole packages of `hours_per_package` hours, the last one rounded up.
    Package {
        hours_per_package: u32,
        #[schemars(with = "String")]
        price_cny_per_gb_package: Decimal,
    },
    /// The clearing price `spot.price_set` publishes for the lease's
    /// (zone, GPU model), each second at the price in force when it starts.
    Market,
}

/// One step of a ladder: its price from `from_hour` hours of billable age
/// on, until the next step's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PriceStep {
    pub from_hour: u32,
    #[schemars(with = "String")]
    pub price_cny_per_gb_hour: Decimal,
}

/// What one lease costs over `from..to`, all within one UTC hour (so
/// within one invoice period, a UTC calendar month). A lease's charges add
/// up to its rounded cumulative cost (see `lh_domain::rating`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChargeAccrued {
    pub charge_id: Uuid,
    pub tenant_id: Uuid,
    pub lease_id: Uuid,
    /// `YYYY-MM`.
    pub period: String,
    pub tier: Tier,
    pub gpus: u32,
    pub vram_gb: u32,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub billed_seconds: u64,
    #[schemars(with = "String")]
    pub unit_price_cny_per_gb_hour: Decimal,
    #[schemars(with = "String")]
    pub amount: Decimal,
    pub currency: String,
    pub price_book_version: u32,
    /// The lease's billable seconds from its start up to `to`. Absent on
    /// charges written before hourly accrual.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<u64>,
    /// The lease's exact cumulative cost up to `to`, times 3600 (the sum of
    /// price per GB-hour x GB x seconds): where the next charge continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub priced_gb_seconds: Option<Decimal>,
    /// The reservation whose commitment covered this time (the amount is
    /// then zero), or whose commitment this charge bills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<Uuid>,
}

/// A tenant commits to `gpus` GPUs of `gpu_model` in `zone` from
/// `starts_at` to `ends_at`: billed each hour at the reserved tier's price
/// whether used or not, and its leases of tier `reserved` that fit in it
/// are not billed again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReservationCommitted {
    pub reservation_id: Uuid,
    pub tenant_id: Uuid,
    pub gpu_model: String,
    pub zone: String,
    pub gpus: u32,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    /// Who asked for it (an admin through the gateway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<crate::Actor>,
}

/// One line of an issued invoice or note: the charges of one lease at one
/// tier and price book version, added up (a lease accrues a charge per
/// hour, so a line per charge would make a month's invoice unreadable).
/// A tenant's storage charges (`charge.storage_accrued`) make a line of
/// their own per price book version: tier `storage`, and in place of a
/// lease the tenant's storage id (`lh_events::storage_id`).
///
/// The same type is a line of the documents the gateway answers with
/// (`lh_rpc::invoice_document::Line`): one form, one hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = Line))]
pub struct DocumentLine {
    pub lease_id: Uuid,
    /// The tier's name (`basic`, `spot`, ...), or `storage`.
    #[cfg_attr(feature = "openapi", schema(example = "basic"))]
    pub tier: String,
    pub price_book_version: u32,
    /// How many `charge.accrued` (or `charge.storage_accrued`) events the
    /// line adds up.
    pub charges: u64,
    pub billed_seconds: u64,
    /// Earliest `from` of its charges.
    pub from: DateTime<Utc>,
    /// Latest `to` of its charges.
    pub to: DateTime<Utc>,
    /// Sum of the charges' amounts, 2 places.
    #[schemars(with = "String")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "1.00"))]
    pub amount: Decimal,
}

/// A granted credit as an invoice deducts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AppliedCredit {
    pub credit_id: Uuid,
    /// The month whose availability fell short.
    pub period: String,
    /// Negative: what the credit takes off the invoice.
    #[schemars(with = "String")]
    pub amount: Decimal,
}

/// A tenant's monthly invoice, issued once its month and the grace period
/// after it are over: immutable and numbered without gaps. Every
/// `charge.accrued` of the tenant and period stored at or below
/// `charges_through_sequence` is on it (on one of its parts, for a month
/// issued in parts: consecutive numbers, the lines in order, the credits on
/// the last); later ones go on notes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InvoiceIssued {
    pub invoice_id: Uuid,
    /// 1, 2, 3, ... over all invoices of the platform.
    pub number: u64,
    pub tenant_id: Uuid,
    /// `YYYY-MM`.
    pub period: String,
    pub currency: String,
    pub issued_at: DateTime<Utc>,
    pub charges_through_sequence: u64,
    pub lines: Vec<DocumentLine>,
    pub credits: Vec<AppliedCredit>,
    #[schemars(with = "String")]
    pub total: Decimal,
    /// Hex SHA-256 of the document's canonical form (docs/pricing.md).
    pub content_hash: String,
    /// Which of the month's invoice documents this is, from 1: a month
    /// with more lines than one message holds is issued in consecutive
    /// parts. Absent on a one-part invoice (and on every invoice issued
    /// before parts), whose form and hash stay as they were.
    #[serde(default = "one_part", skip_serializing_if = "is_one_part")]
    pub part: u32,
    /// How many parts the month's invoice has; absent when 1.
    #[serde(default = "one_part", skip_serializing_if = "is_one_part")]
    pub parts: u32,
    /// The first part's id, on every later part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_part_id: Option<Uuid>,
}

/// The `part` and `parts` of a document issued whole.
pub fn one_part() -> u32 {
    1
}

/// Whether a `part` or `parts` is the one a whole document leaves out.
pub fn is_one_part(n: &u32) -> bool {
    *n == 1
}

/// Which way a note corrects its invoice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NoteKind {
    /// The tenant owes more (its total is positive or zero).
    Debit,
    /// The tenant owes less (its total is negative).
    Credit,
}

/// Charges that arrived after their month's invoice was issued: the
/// invoice is never rewritten, a note referencing it carries them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InvoiceNoteIssued {
    pub note_id: Uuid,
    /// 1, 2, 3, ... over all notes (a series of its own).
    pub number: u64,
    pub kind: NoteKind,
    pub invoice_id: Uuid,
    pub invoice_number: u64,
    pub tenant_id: Uuid,
    pub period: String,
    pub currency: String,
    pub issued_at: DateTime<Utc>,
    /// The note carries the tenant's charges of `period` stored after this
    /// sequence and at or below `charges_through_sequence`.
    pub charges_after_sequence: u64,
    pub charges_through_sequence: u64,
    pub lines: Vec<DocumentLine>,
    #[schemars(with = "String")]
    pub total: Decimal,
    pub content_hash: String,
    /// As an invoice's: the note's part, from 1, when its charges need
    /// more lines than one message holds; absent when 1.
    #[serde(default = "one_part", skip_serializing_if = "is_one_part")]
    pub part: u32,
    /// How many parts the note has; absent when 1.
    #[serde(default = "one_part", skip_serializing_if = "is_one_part")]
    pub parts: u32,
    /// The first part's id, on every later part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_part_id: Option<Uuid>,
}

/// One interruption of a lease by the platform, within the credit's month.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Interruption {
    pub lease_id: Uuid,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub seconds: u64,
}

/// A tenant's availability in `period` fell below the SLA: a credit,
/// with its whole calculation, deducted on the invoice of
/// `applies_to_period`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CreditGranted {
    pub credit_id: Uuid,
    pub tenant_id: Uuid,
    /// The month the availability was measured over.
    pub period: String,
    /// The invoice that deducts it (the next month's).
    pub applies_to_period: String,
    pub currency: String,
    /// Seconds the tenant's leases were interrupted by the platform.
    pub downtime_seconds: u64,
    /// Billed seconds of the tenant's leases plus `downtime_seconds`.
    pub lease_seconds: u64,
    /// `100 × (1 − downtime / lease time)`, 4 places, truncated.
    #[schemars(with = "String")]
    pub availability_percent: Decimal,
    #[schemars(with = "String")]
    pub sla_percent: Decimal,
    /// The rule in words, as documented in docs/pricing.md.
    pub rule: String,
    /// Share of `affected_charges` credited.
    #[schemars(with = "String")]
    pub share_percent: Decimal,
    /// The month's charges of the interrupted leases.
    #[schemars(with = "String")]
    pub affected_charges: Decimal,
    /// Negative, 2 places.
    #[schemars(with = "String")]
    pub amount: Decimal,
    /// The interruptions counted (the first of them, at most a documented number).
    pub interruptions: Vec<Interruption>,
}

/// An admin added prepaid money to a tenant's balance. A tenant with a
/// top-up is prepaid from then on: its leases are stopped when the balance
/// runs out. One that never had one stays postpaid (invoiced, never
/// stopped).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BalanceToppedUp {
    pub top_up_id: Uuid,
    pub tenant_id: Uuid,
    /// Positive, 2 places.
    #[schemars(with = "String")]
    pub amount: Decimal,
    pub currency: String,
    /// Who added it (an admin through the gateway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<crate::Actor>,
}

/// A prepaid tenant's balance covers less than the warning time at the
/// rate its running leases cost now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BalanceLow {
    pub tenant_id: Uuid,
    /// Top-ups minus charges plus SLA credits, minus what the running
    /// leases cost since their last charge.
    #[schemars(with = "String")]
    pub balance: Decimal,
    #[schemars(with = "String")]
    pub burn_rate_cny_per_hour: Decimal,
    /// How long the balance lasts at that rate.
    pub covers_seconds: u64,
    /// The warning time it fell under.
    pub warn_seconds: u64,
}

/// A prepaid tenant's balance is at zero or below: pricing asks for each of
/// its running leases to stop (`lease.stop_requested`, caused by this
/// event) and the gateway refuses its new leases until a top-up restores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BalanceExhausted {
    pub tenant_id: Uuid,
    #[schemars(with = "String")]
    pub balance: Decimal,
    /// The leases asked to stop for it.
    pub stopped_leases: Vec<Uuid>,
}

/// A top-up brought an exhausted balance above zero: the tenant may lease again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BalanceRestored {
    pub tenant_id: Uuid,
    #[schemars(with = "String")]
    pub balance: Decimal,
}

/// Pricing priced a request for a duration on the book in force: a lease
/// asked for with this quote (the same tenant and spec, before
/// `expires_at`) is billed on `price_book_version`, whatever book is
/// published after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QuoteIssued {
    pub quote_id: Uuid,
    pub tenant_id: Uuid,
    pub gpu_model: String,
    pub tier: crate::Tier,
    /// Whole GPUs; 1 for a share or a MIG instance.
    pub gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<crate::GpuFraction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// The GB billed: the whole GPUs' VRAM, the share's or the slice's.
    pub vram_gb: u32,
    pub duration_seconds: u64,
    pub price_book_version: u32,
    /// The request's cost over `duration_seconds` at the quoted prices.
    #[schemars(with = "String")]
    pub amount: Decimal,
    /// `amount` per GB-hour.
    #[schemars(with = "String")]
    pub unit_price_cny_per_gb_hour: Decimal,
    pub currency: String,
    pub expires_at: DateTime<Utc>,
    /// Spot: `amount` is at the market price now, which moves; the lease is
    /// billed at the price of each moment.
    #[serde(default)]
    pub price_moves: bool,
}
