//! The ledger: issues invoices, notes and SLA credits, on the decide loop
//! (`lh_service::decider`).
//!
//! [`Ledger`] folds `charge.accrued`, the ledger's own events and the lease
//! lifecycle (for availability). Once a month and its grace period are
//! over, it issues each tenant's invoice of that month: every charge of the
//! tenant and month it has read (the invoice records the log sequence it
//! read through), plus the credits granted to the month. A charge stored
//! after that sequence goes on a note instead; an issued invoice is never
//! rewritten. Every invoice and note is written to the one subject
//! [`lh_events::subject::invoices`] guarded by its last sequence, so two
//! replicas cannot give one number twice, nor skip one. A document with
//! more lines than one event holds is issued in consecutive parts; one
//! the log holds only some parts of is completed before anything else.
//! Charges of 0.00 make no note by themselves.
//!
//! Availability: a lease moved off a lost node or an unhealthy GPU is down
//! from the move's `billing_ends_at` until it runs again (or ends). Below
//! [`sla_percent`] for a tenant's month, a `credit.granted` with its whole
//! calculation is issued when that month's invoice is, and the next month's
//! invoice deducts it. The rule is [`share_percent`], documented in
//! docs/pricing.md.
//!
//! Numbers continue from the newest invoice and note the fold has read:
//! a month is invoiced every month, so the log's age limit (a year) never
//! takes all of them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use lh_bus::Expect;
use lh_events::{
    derived_id, subject, Actor, CreditGranted, Envelope, EventData, Interruption, InvoiceIssued,
    InvoiceNoteIssued, NoteKind,
};
use lh_rpc::invoice_document::{
    invoice_part_id, money, ChargePart, Credit, DocumentKind, DocumentStatus, InvoiceDocument,
    Line, LineAccumulator,
};
use lh_service::decider::{Batch, Decider, Pace};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::SERVICE;

/// Subjects the ledger folds.
pub const FILTERS: &[&str] = &[
    subject::CHARGES_ALL,
    subject::INVOICES_ALL,
    subject::CREDITS_ALL,
    subject::LEASES_ALL,
];
/// How long after its month an invoice stays a draft: late hourly charges
/// and a lease's final part land on it rather than on a note.
pub const DEFAULT_INVOICE_GRACE_SECS: i64 = 3 * 24 * 3600;
/// Longest grace period accepted: a year.
pub const MAX_INVOICE_GRACE_SECS: i64 = 366 * 24 * 3600;
/// Most lines one invoice or note event carries: it must fit in one
/// message (`max_payload`, 1 MiB; 2000 lines of the longest kind take
/// about 0.55 MiB, which a unit test holds under 3/4 of it). A month with
/// more lines is issued in consecutive parts.
pub const MAX_LINES_PER_DOCUMENT: usize = 2_000;
/// Most parts one invoice or note is issued in (200 000 lines). A month
/// with more waits, with an error in the log, until the limit is raised.
pub const MAX_PARTS_PER_DOCUMENT: usize = 100;
/// Most interruptions a credit lists (its totals count all of them).
pub const MAX_INTERRUPTIONS_LISTED: usize = 100;
/// Most leases whose availability is followed at once; past it, new
/// leases are not counted (with a warning).
pub const MAX_WATCHED_LEASES: usize = 1_000_000;
/// Months back from now an open interruption is counted in.
const MAX_OPEN_INTERRUPTION_MONTHS: u32 = 12;
/// Months back from now the ledger remembers issued months, their
/// downtime and credits: past the log's year a restarted replica has none
/// of them either, and one that runs for years must not hold them all.
const KEPT_MONTHS: u32 = 13;
/// The words of the credit rule, carried by every credit.
pub const CREDIT_RULE: &str = "availability = 100 x (1 - downtime / (billed time + downtime)) over the tenant's leases in the month; below 99.95 % the credit is 10 % of the month's charges of the interrupted leases, below 99.0 % 30 %, below 95.0 % 100 %";
/// A feed silent this long has delivered everything there is.
const QUIET: Duration = Duration::from_millis(300);

/// The availability the platform promises, in percent.
pub fn sla_percent() -> Decimal {
    Decimal::new(9995, 2)
}

/// The share of the affected charges credited at `availability_percent`
/// (none at or above the SLA).
pub fn share_percent(availability_percent: Decimal) -> Option<Decimal> {
    if availability_percent < Decimal::from(95) {
        Some(Decimal::from(100))
    } else if availability_percent < Decimal::from(99) {
        Some(Decimal::from(30))
    } else if availability_percent < sla_percent() {
        Some(Decimal::from(10))
    } else {
        None
    }
}

/// First instant of the month `period` (`YYYY-MM`) and of the next one.
pub fn month_bounds(period: &str) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let (year, month) = lh_rpc::invoice::parse_period(period).ok()?;
    let start = NaiveDate::from_ymd_opt(year, month, 1)?;
    let next = if month == 12 {
        NaiveDate::from_ymd_opt(year + 1, 1, 1)?
    } else {
        NaiveDate::from_ymd_opt(year, month + 1, 1)?
    };
    Some((
        Utc.from_utc_datetime(&start.and_hms_opt(0, 0, 0)?),
        Utc.from_utc_datetime(&next.and_hms_opt(0, 0, 0)?),
    ))
}

/// The month after `period`.
pub fn next_period(period: &str) -> Option<String> {
    let (_, end) = month_bounds(period)?;
    Some(period_of(end))
}

/// The oldest month the ledger still remembers at `now`.
fn oldest_kept(now: DateTime<Utc>) -> String {
    let mut start = now;
    for _ in 0..KEPT_MONTHS {
        start =
            month_bounds(&period_of(start)).map_or(start, |(s, _)| s) - chrono::Duration::days(1);
    }
    period_of(start)
}

fn period_of(at: DateTime<Utc>) -> String {
    format!("{:04}-{:02}", at.year(), at.month())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Charge {
    sequence: u64,
    id: Uuid,
    part: ChargePart,
}

/// What the ledger knows of one tenant's month.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Month {
    /// Charges on no issued document yet.
    open: Vec<Charge>,
    /// Ids of the `open` charges: a charge read twice counts once. Those
    /// on a document are forgotten (a month of hourly charges is many);
    /// the charge subject's guard keeps the log from holding one twice.
    /// Not in a snapshot: `open` says them again.
    #[serde(skip)]
    charge_ids: HashSet<Uuid>,
    /// Every charge of the month: seconds and amount per lease. Only the
    /// month's SLA credit reads them: emptied once it is settled.
    per_lease: HashMap<Uuid, (u64, Decimal)>,
    /// The month's SLA credit is granted or can no longer be: its invoice
    /// is issued whole and no lease of its tenant is still down from
    /// before the month's end (no more downtime can land in it).
    settled: bool,
    /// The issued invoice (its first part): its id and number.
    issued: Option<(Uuid, u64)>,
    /// Charges stored at or below this sequence are on a document.
    covered_through: u64,
    /// An invoice or note issued in parts, of which the log holds some:
    /// until all are read, its charges stay open and nothing else of the
    /// month is issued.
    partial: Option<Partial>,
}

impl Month {
    /// Whether the open charges call for a note: a charge of 0.00 (an hour
    /// a reservation covered) makes none by itself, it rides along on the
    /// next one. A fold of the same log gives the same notes.
    fn owes_a_note(&self) -> bool {
        self.open.iter().any(|c| !money(c.part.amount).is_zero())
    }

    /// The open charges stored at or below `through`.
    fn open_through(&self, through: u64) -> impl Iterator<Item = &Charge> {
        self.open.iter().filter(move |c| c.sequence <= through)
    }

    /// Records that the log holds part `part` of `set` (the set it started
    /// when it is the first part read); the whole set once it holds all.
    fn read_part(&mut self, set: Partial, part: u32, credits: &[Uuid]) -> Option<Partial> {
        let partial = self.partial.get_or_insert_with(|| set.clone());
        if (partial.kind, partial.first_part_id, partial.through)
            != (set.kind, set.first_part_id, set.through)
        {
            tracing::error!(part_of = %set.first_part_id, part, in_flight = %partial.first_part_id,
                "a part of another document than the one being issued; ignored");
            return None;
        }
        partial.read.insert(part);
        partial.credits.extend_from_slice(credits);
        if partial.read.len() >= partial.parts as usize {
            self.partial.take()
        } else {
            None
        }
    }
}

/// Which document a [`Partial`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum PartialKind {
    Invoice,
    /// A note of the month's invoice (its first part's id and number).
    Note {
        invoice_id: Uuid,
        invoice_number: u64,
    },
}

/// A document issued in parts as far as the log holds it. Its missing
/// parts are issued again from the same charges (those of the month at or
/// below `through`), split the same way, with the ids they had: a replay
/// completes the set and never doubles a part.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Partial {
    kind: PartialKind,
    first_part_id: Uuid,
    first_number: u64,
    parts: u32,
    read: BTreeSet<u32>,
    after: u64,
    through: u64,
    issued_at: DateTime<Utc>,
    /// Credits deducted by the parts read.
    credits: Vec<Uuid>,
}

/// Interruptions of one tenant's month.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Downtime {
    seconds: u64,
    leases: BTreeSet<Uuid>,
    listed: Vec<Interruption>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Watched {
    tenant_id: Option<Uuid>,
    down_since: Option<DateTime<Utc>>,
}

/// The ledger's state, folded from the log. Its snapshot is all of it but
/// the grace, which is this replica's configuration, not the log's.
#[derive(Debug, Serialize, Deserialize)]
pub struct Ledger {
    #[serde(skip)]
    grace: chrono::Duration,
    /// The newest sequence read from the log (not counting what this
    /// replica appended itself and has not read back yet).
    read_through: u64,
    /// Sequence of the newest event on the ledger subject.
    ledger_sequence: u64,
    last_invoice_number: u64,
    last_note_number: u64,
    #[serde(with = "pairs")]
    months: BTreeMap<(Uuid, String), Month>,
    /// Granted credits not on an issued invoice, by the (tenant, period)
    /// of the invoice that deducts them.
    #[serde(with = "pairs")]
    pending_credits: BTreeMap<(Uuid, String), Vec<Credit>>,
    /// (tenant, period measured) of every credit granted.
    credited: HashSet<(Uuid, String)>,
    credit_sequences: HashMap<Uuid, u64>,
    leases: HashMap<Uuid, Watched>,
    #[serde(with = "pairs")]
    downtime: BTreeMap<(Uuid, String), Downtime>,
}

impl Ledger {
    pub fn new(grace: chrono::Duration) -> Self {
        Self {
            grace,
            read_through: 0,
            ledger_sequence: 0,
            last_invoice_number: 0,
            last_note_number: 0,
            months: BTreeMap::new(),
            pending_credits: BTreeMap::new(),
            credited: HashSet::new(),
            credit_sequences: HashMap::new(),
            leases: HashMap::new(),
            downtime: BTreeMap::new(),
        }
    }

    /// Whether `period`'s month and grace are over at `now`.
    fn due(&self, period: &str, now: DateTime<Utc>) -> bool {
        month_bounds(period).is_some_and(|(_, end)| now >= end + self.grace)
    }

    fn fold(&mut self, sequence: u64, envelope: &Envelope) {
        match &envelope.data {
            EventData::ChargeAccrued(c) => {
                if month_bounds(&c.period).is_none() {
                    tracing::warn!(charge = %c.charge_id, period = c.period, "a charge of no valid period; ignored");
                    return;
                }
                let month = self
                    .months
                    .entry((c.tenant_id, c.period.clone()))
                    .or_default();
                // In the log's order a charge comes before any document
                // that carries it: one at or below the covered sequence
                // is a repeat.
                if sequence <= month.covered_through || !month.charge_ids.insert(c.charge_id) {
                    return;
                }
                // A reservation's commitment is paid for, not run: its
                // hours are no lease's time in the availability.
                if c.reservation_id != Some(c.lease_id) && !month.settled {
                    let lease = month.per_lease.entry(c.lease_id).or_default();
                    lease.0 = lease.0.saturating_add(c.billed_seconds);
                    lease.1 += c.amount;
                }
                month.open.push(Charge {
                    sequence,
                    id: c.charge_id,
                    part: ChargePart {
                        lease_id: c.lease_id,
                        tier: c.tier.as_str().to_string(),
                        price_book_version: c.price_book_version,
                        billed_seconds: c.billed_seconds,
                        from: c.from,
                        to: c.to,
                        amount: c.amount,
                    },
                });
            }
            EventData::InvoiceIssued(e) => {
                self.ledger_sequence = self.ledger_sequence.max(sequence);
                self.last_invoice_number = self.last_invoice_number.max(e.number);
                let key = (e.tenant_id, e.period.clone());
                let month = self.months.entry(key.clone()).or_default();
                if month.issued.is_some() {
                    return;
                }
                let credits: Vec<Uuid> = e.credits.iter().map(|c| c.credit_id).collect();
                let whole = if e.parts <= 1 {
                    Some((e.invoice_id, e.number, e.charges_through_sequence, credits))
                } else {
                    let set = Partial {
                        kind: PartialKind::Invoice,
                        first_part_id: e.first_part_id.unwrap_or(e.invoice_id),
                        first_number: e.number.saturating_sub(u64::from(e.part).saturating_sub(1)),
                        parts: e.parts,
                        read: BTreeSet::new(),
                        after: 0,
                        through: e.charges_through_sequence,
                        issued_at: e.issued_at,
                        credits: Vec::new(),
                    };
                    month
                        .read_part(set, e.part, &credits)
                        .map(|p| (p.first_part_id, p.first_number, p.through, p.credits))
                };
                let Some((invoice_id, number, through, credits)) = whole else {
                    return;
                };
                month.issued = Some((invoice_id, number));
                cover(month, through);
                // Credits it deducts are used; any other meant for this
                // month (granted while it was being issued) moves on.
                let mut pending = self.pending_credits.remove(&key).unwrap_or_default();
                pending.retain(|p| !credits.contains(&p.credit_id));
                if !pending.is_empty() {
                    if let Some(next) = next_period(&e.period) {
                        self.pending_credits
                            .entry((e.tenant_id, next))
                            .or_default()
                            .extend(pending);
                    }
                }
            }
            EventData::InvoiceNoteIssued(e) => {
                self.ledger_sequence = self.ledger_sequence.max(sequence);
                self.last_note_number = self.last_note_number.max(e.number);
                let month = self
                    .months
                    .entry((e.tenant_id, e.period.clone()))
                    .or_default();
                // A part of a set already whole is a repeat.
                if e.parts <= 1 || e.charges_through_sequence <= month.covered_through {
                    cover(month, e.charges_through_sequence);
                    return;
                }
                let set = Partial {
                    kind: PartialKind::Note {
                        invoice_id: e.invoice_id,
                        invoice_number: e.invoice_number,
                    },
                    first_part_id: e.first_part_id.unwrap_or(e.note_id),
                    first_number: e.number.saturating_sub(u64::from(e.part).saturating_sub(1)),
                    parts: e.parts,
                    read: BTreeSet::new(),
                    after: e.charges_after_sequence,
                    through: e.charges_through_sequence,
                    issued_at: e.issued_at,
                    credits: Vec::new(),
                };
                if let Some(whole) = month.read_part(set, e.part, &[]) {
                    cover(month, whole.through);
                }
            }
            EventData::CreditGranted(e) => {
                let seen = self.credit_sequences.entry(e.tenant_id).or_default();
                *seen = (*seen).max(sequence);
                if !self.credited.insert((e.tenant_id, e.period.clone())) {
                    return;
                }
                // Deducted by the first invoice not issued yet.
                let mut period = e.applies_to_period.clone();
                for _ in 0..MAX_OPEN_INTERRUPTION_MONTHS {
                    let issued = self
                        .months
                        .get(&(e.tenant_id, period.clone()))
                        .is_some_and(|m| m.issued.is_some());
                    match next_period(&period) {
                        Some(next) if issued => period = next,
                        _ => break,
                    }
                }
                self.pending_credits
                    .entry((e.tenant_id, period))
                    .or_default()
                    .push(Credit {
                        credit_id: e.credit_id,
                        period: e.period.clone(),
                        amount: e.amount,
                    });
            }
            EventData::LeaseRequested(e) => {
                if self.leases.len() >= MAX_WATCHED_LEASES {
                    tracing::warn!(lease = %e.lease_id, limit = MAX_WATCHED_LEASES,
                        "too many leases followed for availability; this one is not");
                    return;
                }
                self.leases.entry(e.lease_id).or_default().tenant_id = Some(e.tenant_id);
            }
            // A lost node or an unhealthy GPU; a drain is planned.
            EventData::LeaseMigrated(e) if lh_domain::moves::is_failure(&e.reason) => {
                if let Some(w) = self.leases.get_mut(&e.lease_id) {
                    w.down_since.get_or_insert(e.billing_ends_at);
                }
            }
            EventData::LeaseStarted(e) => {
                let down = self.leases.get_mut(&e.lease_id).and_then(|w| {
                    let since = w.down_since.take()?;
                    Some((w.tenant_id?, since))
                });
                if let Some((tenant, since)) = down {
                    self.record_down(tenant, e.lease_id, since, e.started_at);
                }
            }
            EventData::LeaseEnded(e) => {
                if let Some(w) = self.leases.remove(&e.lease_id) {
                    if let (Some(tenant), Some(since)) = (w.tenant_id, w.down_since) {
                        self.record_down(tenant, e.lease_id, since, e.ended_at);
                    }
                }
            }
            EventData::LeaseRejected(e) => {
                self.leases.remove(&e.lease_id);
            }
            // A lease whose request expired from the log before this fold
            // read it: its history, carried forward, tells who it is for
            // and whether it is down.
            EventData::LeaseRestated(r) if !self.leases.contains_key(&r.lease_id) => {
                for stated in &r.history {
                    self.fold(stated.sequence, &stated.envelope);
                }
                if let Some(w) = self.leases.get_mut(&r.lease_id) {
                    w.tenant_id.get_or_insert(r.tenant_id);
                }
            }
            _ => {}
        }
    }

    /// Forgets the issued months before [`KEPT_MONTHS`] back, with their
    /// downtime and credits.
    fn forget_old_months(&mut self, now: DateTime<Utc>) {
        let oldest = oldest_kept(now);
        // Charges of 0.00 left open make no note: they do not hold a month.
        self.months.retain(|(_, period), m| {
            *period >= oldest || m.issued.is_none() || m.partial.is_some() || m.owes_a_note()
        });
        self.downtime.retain(|(_, period), _| *period >= oldest);
        self.credited.retain(|(_, period)| *period >= oldest);
    }

    /// Settles the months whose SLA credit is decided: their per-lease sums
    /// go, so that a year of leases does not stay in memory for credits
    /// that can no longer come. What is decided does not change: a settled
    /// month is granted no credit, and was due none (or has its own).
    fn settle_months(&mut self, now: DateTime<Utc>) {
        let mut down_since: HashMap<Uuid, DateTime<Utc>> = HashMap::new();
        for w in self.leases.values() {
            if let (Some(tenant), Some(since)) = (w.tenant_id, w.down_since) {
                down_since
                    .entry(tenant)
                    .and_modify(|s| *s = (*s).min(since))
                    .or_insert(since);
            }
        }
        let settled: Vec<(Uuid, String)> = self
            .months
            .iter()
            .filter(|(_, m)| !m.settled && m.issued.is_some() && m.partial.is_none())
            .filter(|((tenant, period), _)| {
                let Some((_, end)) = month_bounds(period) else {
                    return false;
                };
                let key = (*tenant, period.clone());
                self.due(period, now)
                    && down_since.get(tenant).is_none_or(|since| *since >= end)
                    && (self.credited.contains(&key)
                        || !self.downtime.contains_key(&key)
                        || self.sla_credit(*tenant, period, now).is_none())
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in settled {
            if let Some(month) = self.months.get_mut(&key) {
                month.settled = true;
                month.per_lease = HashMap::new();
            }
        }
    }

    /// Records that `lease` was down over `[from, to)`, month by month.
    fn record_down(&mut self, tenant: Uuid, lease: Uuid, from: DateTime<Utc>, to: DateTime<Utc>) {
        for (period, interruption) in split_by_month(lease, from, to) {
            let d = self.downtime.entry((tenant, period)).or_default();
            d.seconds = d.seconds.saturating_add(interruption.seconds);
            d.leases.insert(lease);
            if d.listed.len() < MAX_INTERRUPTIONS_LISTED {
                d.listed.push(interruption);
            }
        }
    }

    /// The credit the tenant's availability in `period` calls for, if any.
    fn sla_credit(&self, tenant: Uuid, period: &str, now: DateTime<Utc>) -> Option<CreditGranted> {
        let (start, end) = month_bounds(period)?;
        let mut seconds = 0u64;
        let mut leases = BTreeSet::new();
        let mut listed = Vec::new();
        if let Some(d) = self.downtime.get(&(tenant, period.to_string())) {
            seconds = d.seconds;
            leases.extend(d.leases.iter().copied());
            listed.extend(d.listed.iter().cloned());
        }
        // Leases still down count until now or the month's end.
        let mut open: Vec<_> = self
            .leases
            .iter()
            .filter(|(_, w)| w.tenant_id == Some(tenant))
            .filter_map(|(id, w)| Some((*id, w.down_since?)))
            .collect();
        open.sort();
        for (lease, since) in open {
            let (from, to) = (since.max(start), now.min(end));
            if let Some((_, i)) = split_by_month(lease, from, to).into_iter().next() {
                seconds = seconds.saturating_add(i.seconds);
                leases.insert(lease);
                if listed.len() < MAX_INTERRUPTIONS_LISTED {
                    listed.push(i);
                }
            }
        }
        if seconds == 0 {
            return None;
        }
        let month = self.months.get(&(tenant, period.to_string()));
        let billed: u64 = month.map_or(0, |m| m.per_lease.values().map(|v| v.0).sum());
        let lease_seconds = billed.saturating_add(seconds);
        let availability = (Decimal::from(100)
            * (Decimal::ONE - Decimal::from(seconds) / Decimal::from(lease_seconds)))
        .trunc_with_scale(4);
        let share = share_percent(availability)?;
        let affected: Decimal = month.map_or(Decimal::ZERO, |m| {
            leases
                .iter()
                .filter_map(|l| m.per_lease.get(l))
                .map(|v| v.1)
                .sum()
        });
        let amount = money(-(affected * share / Decimal::from(100)));
        if amount >= Decimal::ZERO {
            return None;
        }
        Some(CreditGranted {
            credit_id: derived_id(&["credit", &tenant.to_string(), period]),
            tenant_id: tenant,
            period: period.to_string(),
            applies_to_period: next_period(period)?,
            currency: lh_domain::rating::CURRENCY.to_string(),
            downtime_seconds: seconds,
            lease_seconds,
            availability_percent: availability,
            sla_percent: sla_percent(),
            rule: CREDIT_RULE.to_string(),
            share_percent: share,
            affected_charges: money(affected),
            amount,
            interruptions: listed,
        })
    }

    /// Credits for every tenant's month that is due and not credited.
    fn credits(&self, now: DateTime<Utc>) -> Vec<CreditGranted> {
        let mut candidates: BTreeSet<(Uuid, String)> = self.downtime.keys().cloned().collect();
        for w in self.leases.values() {
            let (Some(tenant), Some(since)) = (w.tenant_id, w.down_since) else {
                continue;
            };
            let mut period = period_of(since);
            for _ in 0..MAX_OPEN_INTERRUPTION_MONTHS {
                if !self.due(&period, now) {
                    break;
                }
                candidates.insert((tenant, period.clone()));
                match next_period(&period) {
                    Some(next) => period = next,
                    None => break,
                }
            }
        }
        let oldest = oldest_kept(now);
        candidates
            .into_iter()
            .filter(|(tenant, period)| {
                *period >= oldest
                    && self.due(period, now)
                    && !self.credited.contains(&(*tenant, period.clone()))
                    && !self
                        .months
                        .get(&(*tenant, period.clone()))
                        .is_some_and(|m| m.settled)
            })
            .filter_map(|(tenant, period)| self.sla_credit(tenant, &period, now))
            .collect()
    }

    fn lines_of<'a>(charges: impl IntoIterator<Item = &'a Charge>) -> Vec<Line> {
        let mut acc = LineAccumulator::default();
        for c in charges {
            acc.add(&c.part);
        }
        acc.lines()
    }

    /// The invoices due now, numbered from the next free number on: first
    /// the missing parts of one the log holds some of, then the months due.
    fn invoices(&self, now: DateTime<Utc>) -> Vec<InvoiceIssued> {
        let mut number = self.last_invoice_number;
        let mut out = Vec::new();
        for ((tenant, period), month) in &self.months {
            let Some(p) = month
                .partial
                .as_ref()
                .filter(|p| p.kind == PartialKind::Invoice)
            else {
                continue;
            };
            let parts = split_lines(Self::lines_of(month.open_through(p.through)));
            if parts.len() != p.parts as usize {
                tracing::error!(%tenant, period, parts = p.parts, now = parts.len(),
                    "the charges of an invoice issued in parts no longer split as they did; it is not completed");
                continue;
            }
            let credits = self.credits_for(*tenant, period, &p.credits);
            let document = DocumentSet {
                tenant: *tenant,
                period,
                after: 0,
                through: p.through,
                issued_at: p.issued_at,
            };
            for (part, lines) in (1..).zip(parts) {
                if p.read.contains(&part) {
                    continue;
                }
                number += 1;
                let credits = if part == p.parts {
                    credits.clone()
                } else {
                    Vec::new()
                };
                out.push(document.invoice_part(part, p.parts, number, lines, credits));
            }
        }
        let mut keys: BTreeSet<(Uuid, String)> = self
            .months
            .iter()
            .filter(|(_, m)| m.issued.is_none() && m.partial.is_none() && !m.open.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        keys.extend(
            self.pending_credits
                .iter()
                .filter(|(k, credits)| {
                    !credits.is_empty()
                        && self
                            .months
                            .get(k)
                            .is_none_or(|m| m.issued.is_none() && m.partial.is_none())
                })
                .map(|(k, _)| k.clone()),
        );
        for (tenant, period) in keys {
            if !self.due(&period, now) {
                continue;
            }
            let open = self
                .months
                .get(&(tenant, period.clone()))
                .map_or(&[][..], |m| &m.open[..]);
            let parts = split_lines(Self::lines_of(open));
            if parts.len() > MAX_PARTS_PER_DOCUMENT {
                tracing::error!(%tenant, period, parts = parts.len(), limit = MAX_PARTS_PER_DOCUMENT,
                    "an invoice needs too many parts to issue; it stays a draft");
                continue;
            }
            let credits = self.credits_for(tenant, &period, &[]);
            let document = DocumentSet {
                tenant,
                period: &period,
                after: 0,
                through: self.read_through,
                issued_at: now,
            };
            let count = parts.len() as u32;
            for (part, lines) in (1..).zip(parts) {
                number += 1;
                // Credits are deducted once, on the last part.
                let credits = if part == count {
                    credits.clone()
                } else {
                    Vec::new()
                };
                out.push(document.invoice_part(part, count, number, lines, credits));
            }
        }
        out
    }

    /// The credits pending for the tenant's `period`, less those `used`.
    fn credits_for(&self, tenant: Uuid, period: &str, used: &[Uuid]) -> Vec<Credit> {
        let mut credits = self
            .pending_credits
            .get(&(tenant, period.to_string()))
            .cloned()
            .unwrap_or_default();
        credits.retain(|c| !used.contains(&c.credit_id));
        credits
    }

    /// Notes for charges that came after their invoice: first the missing
    /// parts of one the log holds some of.
    fn notes(&self, now: DateTime<Utc>) -> Vec<InvoiceNoteIssued> {
        let mut number = self.last_note_number;
        let mut out = Vec::new();
        for ((tenant, period), month) in &self.months {
            let Some((invoice_id, invoice_number)) = month.issued else {
                continue;
            };
            if let Some(p) = &month.partial {
                let PartialKind::Note {
                    invoice_id,
                    invoice_number,
                } = p.kind
                else {
                    continue;
                };
                let parts = split_lines(Self::lines_of(month.open_through(p.through)));
                if parts.len() != p.parts as usize {
                    tracing::error!(%tenant, period, parts = p.parts, now = parts.len(),
                        "the charges of a note issued in parts no longer split as they did; it is not completed");
                    continue;
                }
                let document = DocumentSet {
                    tenant: *tenant,
                    period,
                    after: p.after,
                    through: p.through,
                    issued_at: p.issued_at,
                };
                for (part, lines) in (1..).zip(parts) {
                    if !p.read.contains(&part) {
                        number += 1;
                        out.push(document.note_part(
                            (invoice_id, invoice_number),
                            part,
                            p.parts,
                            number,
                            lines,
                        ));
                    }
                }
                continue;
            }
            if !month.owes_a_note() {
                continue;
            }
            let parts = split_lines(Self::lines_of(&month.open));
            if parts.len() > MAX_PARTS_PER_DOCUMENT {
                tracing::error!(%tenant, period, parts = parts.len(), limit = MAX_PARTS_PER_DOCUMENT,
                    "a note needs too many parts to issue");
                continue;
            }
            let document = DocumentSet {
                tenant: *tenant,
                period,
                after: month.covered_through,
                through: self.read_through,
                issued_at: now,
            };
            let count = parts.len() as u32;
            for (part, lines) in (1..).zip(parts) {
                number += 1;
                out.push(document.note_part(
                    (invoice_id, invoice_number),
                    part,
                    count,
                    number,
                    lines,
                ));
            }
        }
        out
    }
}

/// The lines of one document in the parts it is issued in: consecutive
/// runs of at most [`MAX_LINES_PER_DOCUMENT`] in document order; one part
/// at least (an invoice of credits alone has no line).
fn split_lines(lines: Vec<Line>) -> Vec<Vec<Line>> {
    if lines.is_empty() {
        return vec![Vec::new()];
    }
    lines
        .chunks(MAX_LINES_PER_DOCUMENT)
        .map(<[Line]>::to_vec)
        .collect()
}

/// What the parts of one invoice or note share.
struct DocumentSet<'a> {
    tenant: Uuid,
    period: &'a str,
    after: u64,
    through: u64,
    issued_at: DateTime<Utc>,
}

impl DocumentSet<'_> {
    /// Part `part` of `parts` of the month's invoice, numbered `number`.
    fn invoice_part(
        &self,
        part: u32,
        parts: u32,
        number: u64,
        lines: Vec<Line>,
        credits: Vec<Credit>,
    ) -> InvoiceIssued {
        let first_part_id = (part > 1).then(|| invoice_part_id(self.tenant, self.period, 1));
        let document = InvoiceDocument {
            id: invoice_part_id(self.tenant, self.period, part),
            status: DocumentStatus::Issued,
            number: Some(lh_rpc::invoice_document::invoice_number(number)),
            issued_at: Some(self.issued_at),
            part,
            parts,
            first_part_id,
            ..InvoiceDocument::draft(self.tenant, self.period, self.through, lines, credits)
        }
        .sealed();
        InvoiceIssued {
            invoice_id: document.id,
            number,
            tenant_id: self.tenant,
            period: self.period.to_string(),
            currency: document.currency.clone(),
            issued_at: self.issued_at,
            charges_through_sequence: self.through,
            lines: document.lines.clone(),
            credits: document.credits.iter().map(Into::into).collect(),
            total: document.total,
            content_hash: document.content_hash,
            part,
            parts,
            first_part_id,
        }
    }

    /// Part `part` of `parts` of a note of `invoice` (its first part's id
    /// and number), numbered `number`.
    fn note_part(
        &self,
        invoice: (Uuid, u64),
        part: u32,
        parts: u32,
        number: u64,
        lines: Vec<Line>,
    ) -> InvoiceNoteIssued {
        let (invoice_id, invoice_number) = invoice;
        let note_id = |part: u32| {
            let (invoice, through) = (invoice_id.to_string(), self.through.to_string());
            if part <= 1 {
                derived_id(&["invoice_note", &invoice, &through])
            } else {
                derived_id(&[
                    "invoice_note",
                    &invoice,
                    &through,
                    "part",
                    &part.to_string(),
                ])
            }
        };
        let first_part_id = (part > 1).then(|| note_id(1));
        let mut document = InvoiceDocument {
            id: note_id(part),
            status: DocumentStatus::Issued,
            number: Some(lh_rpc::invoice_document::note_number(number)),
            refers_to: Some(invoice_id),
            refers_to_number: Some(lh_rpc::invoice_document::invoice_number(invoice_number)),
            issued_at: Some(self.issued_at),
            charges_after_sequence: self.after,
            part,
            parts,
            first_part_id,
            ..InvoiceDocument::draft(self.tenant, self.period, self.through, lines, vec![])
        }
        .sealed();
        // Each part is a document of its own: its total says which way.
        let kind = if document.total < Decimal::ZERO {
            document.kind = DocumentKind::CreditNote;
            NoteKind::Credit
        } else {
            document.kind = DocumentKind::DebitNote;
            NoteKind::Debit
        };
        let document = document.sealed();
        InvoiceNoteIssued {
            note_id: document.id,
            number,
            kind,
            invoice_id,
            invoice_number,
            tenant_id: self.tenant,
            period: self.period.to_string(),
            currency: document.currency.clone(),
            issued_at: self.issued_at,
            charges_after_sequence: self.after,
            charges_through_sequence: self.through,
            lines: document.lines.clone(),
            total: document.total,
            content_hash: document.content_hash,
            part,
            parts,
            first_part_id,
        }
    }
}

/// Marks the month's charges up to `through` as on a document.
fn cover(month: &mut Month, through: u64) {
    month.covered_through = month.covered_through.max(through);
    let ids = &mut month.charge_ids;
    month.open.retain(|c| {
        let keep = c.sequence > through;
        if !keep {
            ids.remove(&c.id);
        }
        keep
    });
}

/// `[from, to)` of `lease` cut at month boundaries, with each part's month.
fn split_by_month(
    lease: Uuid,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Vec<(String, Interruption)> {
    let mut out = Vec::new();
    let mut at = from;
    while at < to {
        let period = period_of(at);
        let Some((_, end)) = month_bounds(&period) else {
            break;
        };
        let part_end = end.min(to);
        let seconds = (part_end - at).num_seconds().max(0) as u64;
        out.push((
            period,
            Interruption {
                lease_id: lease,
                from: at,
                to: part_end,
                seconds,
            },
        ));
        at = part_end;
    }
    out
}

fn envelope(now: DateTime<Utc>, id: Uuid, data: EventData) -> Envelope {
    Envelope::new(Actor::Service(SERVICE.into()), now, data).with_id(id)
}

impl Decider for Ledger {
    type Signal = std::convert::Infallible;

    fn name(&self) -> &'static str {
        "lh-pricing-ledger"
    }

    fn filters(&self) -> &[&'static str] {
        FILTERS
    }

    fn pace(&self) -> Pace {
        Pace {
            quiet: QUIET,
            ..Pace::default()
        }
    }

    fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        self.fold(sequence, envelope);
    }

    fn apply_stored(&mut self, sequence: u64, _stored_at: DateTime<Utc>, envelope: &Envelope) {
        self.read_through = self.read_through.max(sequence);
        self.fold(sequence, envelope);
    }

    fn decide(&mut self, now: DateTime<Utc>) -> Vec<Batch> {
        self.forget_old_months(now);
        self.settle_months(now);
        let mut decisions: Vec<Batch> = Vec::new();
        for credit in self.credits(now) {
            let guard = self
                .credit_sequences
                .get(&credit.tenant_id)
                .copied()
                .unwrap_or(0);
            let id = credit.credit_id;
            decisions.push(vec![(
                envelope(now, id, EventData::CreditGranted(credit)),
                Expect::LastSubjectSequence(guard),
            )]);
        }
        // One guard for every document: the loop moves it along as each
        // is stored, and a conflict sends it back to read the log.
        let guard = Expect::LastSubjectSequence(self.ledger_sequence);
        for invoice in self.invoices(now) {
            let id = invoice.invoice_id;
            decisions.push(vec![(
                envelope(now, id, EventData::InvoiceIssued(invoice)),
                guard,
            )]);
        }
        for note in self.notes(now) {
            let id = note.note_id;
            decisions.push(vec![(
                envelope(now, id, EventData::InvoiceNoteIssued(note)),
                guard,
            )]);
        }
        decisions
    }

    fn appended(&mut self, batch: &Batch) {
        for (envelope, _) in batch {
            let kind = envelope.data.event_type();
            metrics::counter!("lh_ledger_documents_total", "type" => kind).increment(1);
            tracing::info!(event = kind, id = %envelope.id, "ledger: issued");
        }
    }

    // Without one, every start folded every charge, document and lease
    // event the log still holds: a start that grew with the history.
    fn snapshot(&self) -> Option<Box<serde_json::value::RawValue>> {
        lh_service::decider::snapshot_of(self)
    }

    fn restore(&mut self, state: &serde_json::value::RawValue) -> bool {
        match serde_json::from_str::<Ledger>(state.get()) {
            Ok(mut restored) => {
                for month in restored.months.values_mut() {
                    month.charge_ids = month.open.iter().map(|c| c.id).collect();
                }
                *self = Ledger {
                    grace: self.grace,
                    ..restored
                };
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "the ledger's snapshot does not decode");
                false
            }
        }
    }
}

/// A map whose keys are not strings (a tenant and a month), kept in a
/// snapshot as a list of pairs: JSON objects take only string keys.
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S, K, V>(map: &BTreeMap<K, V>, serializer: S) -> Result<S::Ok, S::Error>
    where
        S: Serializer,
        K: Serialize,
        V: Serialize,
    {
        serializer.collect_seq(map)
    }

    pub fn deserialize<'de, D, K, V>(deserializer: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        D: Deserializer<'de>,
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(deserializer)?
            .into_iter()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::{ChargeAccrued, DocumentLine, Tier};

    const TENANT: Uuid = Uuid::from_u128(1);
    const LEASE: Uuid = Uuid::from_u128(2);

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn charge(n: u128, from: &str, seconds: i64, amount: &str) -> Envelope {
        let from = at(from);
        envelope(
            from,
            Uuid::from_u128(100 + n),
            EventData::ChargeAccrued(ChargeAccrued {
                charge_id: Uuid::from_u128(100 + n),
                tenant_id: TENANT,
                lease_id: LEASE,
                period: period_of(from),
                tier: Tier::Basic,
                gpus: 1,
                vram_gb: 80,
                from,
                to: from + chrono::Duration::seconds(seconds),
                billed_seconds: seconds as u64,
                unit_price_cny_per_gb_hour: "0.5".parse().unwrap(),
                amount: amount.parse().unwrap(),
                currency: "CNY".into(),
                price_book_version: 1,
                age_seconds: None,
                priced_gb_seconds: None,
                reservation_id: None,
            }),
        )
    }

    /// Appends what the ledger decides, as the loop would, at `next` on.
    fn store(ledger: &mut Ledger, next: &mut u64, now: DateTime<Utc>) -> Vec<Envelope> {
        let mut out = Vec::new();
        for batch in ledger.decide(now) {
            for (env, expect) in batch {
                if let (
                    EventData::InvoiceIssued(_) | EventData::InvoiceNoteIssued(_),
                    Expect::LastSubjectSequence(s),
                ) = (&env.data, expect)
                {
                    assert!(s <= ledger.ledger_sequence);
                }
                *next += 1;
                ledger.apply(*next, &env);
                out.push(env);
            }
        }
        out
    }

    /// The one invoice among `out`.
    fn only_invoice(out: &[Envelope]) -> &InvoiceIssued {
        match out {
            [Envelope {
                data: EventData::InvoiceIssued(invoice),
                ..
            }] => invoice,
            other => panic!("{other:?}"),
        }
    }

    /// The one note among `out`.
    fn only_note(out: &[Envelope]) -> &InvoiceNoteIssued {
        match out {
            [Envelope {
                data: EventData::InvoiceNoteIssued(note),
                ..
            }] => note,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_month_is_issued_after_its_grace_and_late_charges_go_on_a_note() {
        let mut ledger = Ledger::new(chrono::Duration::hours(1));
        ledger.apply_stored(
            1,
            Utc::now(),
            &charge(1, "2026-11-03T01:00:00Z", 3600, "40.00"),
        );
        ledger.apply_stored(
            2,
            Utc::now(),
            &charge(2, "2026-11-30T23:00:00Z", 3600, "40.00"),
        );
        let mut next = 2;
        assert!(store(&mut ledger, &mut next, at("2026-12-01T00:59:59Z")).is_empty());
        let issued = store(&mut ledger, &mut next, at("2026-12-01T01:00:00Z"));
        let invoice = only_invoice(&issued);
        assert_eq!(
            (invoice.number, invoice.total.to_string()),
            (1, "80.00".into())
        );
        assert_eq!(invoice.lines.len(), 1);
        assert_eq!(invoice.lines[0].charges, 2);
        assert!(InvoiceDocument::from_invoice(invoice).verify());
        // Nothing more to do, however often it is asked.
        assert!(store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z")).is_empty());
        // A correction arrives: a note, the invoice untouched.
        next += 1;
        ledger.apply_stored(
            next,
            Utc::now(),
            &charge(3, "2026-11-30T23:00:00Z", 0, "-5.00"),
        );
        let notes = store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z"));
        let note = only_note(&notes);
        assert_eq!(
            (note.number, note.kind, note.invoice_number),
            (1, NoteKind::Credit, 1)
        );
        assert_eq!(note.total.to_string(), "-5.00");
        assert_eq!(
            note.charges_after_sequence,
            invoice.charges_through_sequence
        );
        assert!(InvoiceDocument::from_note(note).verify());
        assert!(store(&mut ledger, &mut next, at("2026-12-03T00:00:00Z")).is_empty());
    }

    #[test]
    fn a_charge_stored_while_the_invoice_was_decided_is_not_lost() {
        // Another replica issued through sequence 1; a charge stored at 2
        // came before its invoice (at 3) in the log.
        let mut other = Ledger::new(chrono::Duration::zero());
        other.apply_stored(
            1,
            Utc::now(),
            &charge(1, "2026-11-03T01:00:00Z", 3600, "1.00"),
        );
        let issued = other
            .decide(at("2026-12-01T00:00:00Z"))
            .remove(0)
            .remove(0)
            .0;
        let mut ledger = Ledger::new(chrono::Duration::zero());
        ledger.apply_stored(
            1,
            Utc::now(),
            &charge(1, "2026-11-03T01:00:00Z", 3600, "1.00"),
        );
        ledger.apply_stored(
            2,
            Utc::now(),
            &charge(2, "2026-11-03T02:00:00Z", 3600, "2.00"),
        );
        ledger.apply_stored(3, Utc::now(), &issued);
        let mut next = 3;
        let notes = store(&mut ledger, &mut next, at("2026-12-01T00:00:01Z"));
        let note = only_note(&notes);
        assert_eq!(
            (note.total.to_string(), note.kind),
            ("2.00".into(), NoteKind::Debit)
        );
        assert_eq!(
            (note.charges_after_sequence, note.charges_through_sequence),
            (1, 3)
        );
    }

    #[test]
    fn numbers_follow_each_other_without_gaps() {
        let mut ledger = Ledger::new(chrono::Duration::zero());
        let mut next = 0;
        for (n, month) in ["2026-09", "2026-10", "2026-11"].iter().enumerate() {
            next += 1;
            let from = format!("{month}-02T00:00:00Z");
            ledger.apply_stored(next, Utc::now(), &charge(n as u128, &from, 60, "1.00"));
        }
        let issued = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
        let numbers: Vec<u64> = issued
            .iter()
            .map(|e| match &e.data {
                EventData::InvoiceIssued(i) => i.number,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(numbers, [1, 2, 3]);
    }

    fn lease_event(data: EventData) -> Envelope {
        Envelope::new(Actor::Admin, Utc::now(), data)
    }

    /// A lease billed 100 hours in November and moved for `reason`, down
    /// for 1 hour.
    fn interrupted(reason: &str) -> Ledger {
        let mut ledger = Ledger::new(chrono::Duration::zero());
        let request =
            lh_events::fixtures::whole_request(LEASE, TENANT, 1, lh_events::fixtures::MODEL);
        let migrated = lh_events::LeaseMigrated {
            lease_id: LEASE,
            reason: reason.into(),
            from_node_id: "n1".into(),
            from_gpu_indices: vec![0],
            billing_ends_at: at("2026-11-10T00:00:00Z"),
            to: None,
        };
        let started = lh_events::fixtures::started(LEASE, "n2", at("2026-11-10T01:00:00Z"));
        for (sequence, event) in [
            lease_event(EventData::LeaseRequested(request)),
            charge(1, "2026-11-02T00:00:00Z", 360_000, "100.00"),
            lease_event(EventData::LeaseMigrated(migrated)),
            lease_event(EventData::LeaseStarted(started)),
        ]
        .iter()
        .enumerate()
        {
            ledger.apply_stored(sequence as u64 + 1, Utc::now(), event);
        }
        ledger
    }

    #[test]
    fn a_drain_is_no_failure() {
        let mut ledger = interrupted(&lh_domain::moves::node_drained("n1"));
        let mut next = 4;
        let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
        assert!(matches!(
            &out[..],
            [Envelope {
                data: EventData::InvoiceIssued(_),
                ..
            }]
        ));
        // A node that happens to be named so is still lost.
        let mut ledger = interrupted("node drained lost");
        let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
        assert!(
            matches!(&out[0].data, EventData::CreditGranted(_)),
            "{out:?}"
        );
    }

    #[test]
    fn a_lost_node_below_the_sla_earns_a_credit_on_the_next_invoice() {
        // 100 hours billed, 1 hour down: 99.0099 % available.
        let mut ledger = interrupted("node n1 lost");
        let mut next = 4;
        let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
        let EventData::CreditGranted(credit) = &out[0].data else {
            panic!("{out:?}");
        };
        assert_eq!(
            (credit.downtime_seconds, credit.lease_seconds),
            (3600, 363_600)
        );
        assert_eq!(credit.availability_percent.to_string(), "99.0099");
        assert_eq!(credit.share_percent, Decimal::from(10));
        assert_eq!(credit.amount.to_string(), "-10.00");
        assert_eq!(credit.applies_to_period, "2026-12");
        assert!(matches!(&out[1].data, EventData::InvoiceIssued(i) if i.credits.is_empty()));
        // December's invoice deducts it.
        next += 1;
        ledger.apply_stored(
            next,
            Utc::now(),
            &charge(9, "2026-12-02T00:00:00Z", 3600, "1.00"),
        );
        let out = store(&mut ledger, &mut next, at("2027-01-01T00:00:00Z"));
        let dec = only_invoice(&out);
        assert_eq!(dec.credits.len(), 1);
        assert_eq!(dec.total.to_string(), "-9.00");
        assert!(store(&mut ledger, &mut next, at("2027-02-01T00:00:00Z")).is_empty());
    }

    fn per_lease_of(ledger: &Ledger, period: &str) -> usize {
        ledger.months[&(TENANT, period.to_string())].per_lease.len()
    }

    #[test]
    fn a_month_lets_go_of_its_leases_once_its_credit_is_settled() {
        let mut ledger = interrupted("node n1 lost");
        let mut next = 4;
        // Issued and credited in one pass; the per-lease sums stay until the
        // credit is on the log.
        let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(per_lease_of(&ledger, "2026-11"), 1);
        assert!(store(&mut ledger, &mut next, at("2026-12-01T00:00:01Z")).is_empty());
        assert_eq!(per_lease_of(&ledger, "2026-11"), 0);

        // A lease down since before a month's end holds that month: its
        // downtime may still grow and earn a credit.
        let mut ledger = Ledger::new(chrono::Duration::zero());
        let request =
            lh_events::fixtures::whole_request(LEASE, TENANT, 1, lh_events::fixtures::MODEL);
        let migrated = lh_events::LeaseMigrated {
            lease_id: LEASE,
            reason: "node n1 lost".into(),
            from_node_id: "n1".into(),
            from_gpu_indices: vec![0],
            billing_ends_at: at("2026-11-30T23:00:00Z"),
            to: None,
        };
        for (sequence, event) in [
            lease_event(EventData::LeaseRequested(request)),
            charge(1, "2026-11-02T00:00:00Z", 360_000, "100.00"),
            lease_event(EventData::LeaseMigrated(migrated)),
        ]
        .iter()
        .enumerate()
        {
            ledger.apply_stored(sequence as u64 + 1, Utc::now(), event);
        }
        let mut next = 3;
        // 1 hour down of 101 by the month's end: a credit at once, and the
        // lease still down holds the month.
        let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
        assert!(
            matches!(&out[0].data, EventData::CreditGranted(_)),
            "{out:?}"
        );
        store(&mut ledger, &mut next, at("2026-12-01T00:00:01Z"));
        assert_eq!(per_lease_of(&ledger, "2026-11"), 1);
        // Running again: nothing more can land in November.
        next += 1;
        let started = lh_events::fixtures::started(LEASE, "n2", at("2026-12-01T02:00:00Z"));
        ledger.apply_stored(
            next,
            Utc::now(),
            &lease_event(EventData::LeaseStarted(started)),
        );
        store(&mut ledger, &mut next, at("2026-12-01T03:00:00Z"));
        assert_eq!(per_lease_of(&ledger, "2026-11"), 0);
    }

    #[test]
    fn a_gpu_turned_unhealthy_interrupts_its_lease_like_a_lost_node() {
        // What the scheduler writes when a lease's GPU fails (an XID 79, a
        // failed self-test): the lease is moved, down until it runs again.
        let mut ledger = interrupted(&lh_domain::moves::gpu_unhealthy(0, "n1"));
        let mut next = 4;
        let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
        let EventData::CreditGranted(credit) = &out[0].data else {
            panic!("{out:?}");
        };
        assert_eq!(credit.downtime_seconds, 3600);
        assert_eq!(credit.amount.to_string(), "-10.00");
    }

    #[test]
    fn a_reservations_commitment_does_not_dilute_the_availability() {
        let mut ledger = interrupted(&lh_domain::moves::node_lost("n1"));
        let reservation = Uuid::from_u128(50);
        let mut commitment = charge(7, "2026-11-01T00:00:00Z", 10_000_000, "500.00");
        if let EventData::ChargeAccrued(c) = &mut commitment.data {
            (c.lease_id, c.reservation_id, c.tier) =
                (reservation, Some(reservation), Tier::Reserved);
        }
        ledger.apply_stored(5, Utc::now(), &commitment);
        let mut next = 5;
        let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
        let EventData::CreditGranted(credit) = &out[0].data else {
            panic!("{out:?}");
        };
        assert_eq!(credit.availability_percent.to_string(), "99.0099");
        assert_eq!(credit.amount.to_string(), "-10.00");
        // It is on the invoice all the same.
        let EventData::InvoiceIssued(invoice) = &out[1].data else {
            panic!("{out:?}");
        };
        assert_eq!(invoice.total.to_string(), "600.00");
    }

    #[test]
    fn issued_months_older_than_what_the_log_holds_are_forgotten() {
        let mut ledger = interrupted(&lh_domain::moves::node_lost("n1"));
        let mut next = 4;
        let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(ledger.months.contains_key(&(TENANT, "2026-11".into())));
        // December's invoice deducts the credit; 13 months on, November
        // and its downtime are gone, and nothing is issued again.
        assert_eq!(oldest_kept(at("2027-12-15T00:00:00Z")), "2026-11");
        assert!(store(&mut ledger, &mut next, at("2027-12-15T00:00:00Z")).len() == 1);
        assert!(store(&mut ledger, &mut next, at("2028-01-01T00:00:00Z")).is_empty());
        assert!(!ledger.months.contains_key(&(TENANT, "2026-11".into())));
        assert!(ledger.downtime.is_empty() && ledger.credited.is_empty());
        assert_eq!(ledger.last_invoice_number, 2);
    }

    #[test]
    fn the_credit_bands() {
        let p = |s: &str| share_percent(s.parse().unwrap()).map(|d| d.to_string());
        assert_eq!(p("99.95"), None);
        assert_eq!(p("99.9499"), Some("10".into()));
        assert_eq!(p("99.0"), Some("10".into()));
        assert_eq!(p("98.9999"), Some("30".into()));
        assert_eq!(p("94.9"), Some("100".into()));
        assert_eq!(next_period("2026-12").as_deref(), Some("2027-01"));
        assert_eq!(
            split_by_month(
                LEASE,
                at("2026-11-30T23:00:00Z"),
                at("2026-12-01T01:00:00Z")
            )
            .len(),
            2
        );
    }

    /// A charge of an hour on lease `lease`.
    fn lease_charge(n: u128, lease: u128, from: &str, amount: &str) -> Envelope {
        let mut envelope = charge(n, from, 3600, amount);
        if let EventData::ChargeAccrued(c) = &mut envelope.data {
            c.lease_id = Uuid::from_u128(1_000_000 + lease);
        }
        envelope
    }

    /// A ledger that read one charge of each of `leases` leases in
    /// November (1.00 each, but 2.50 for every seventh lease), through
    /// sequence `leases`; and their sum.
    fn busy_november(leases: u128) -> (Ledger, Decimal) {
        let mut ledger = Ledger::new(chrono::Duration::zero());
        let mut sum = Decimal::ZERO;
        for n in 0..leases {
            let amount = if n % 7 == 0 { "2.50" } else { "1.00" };
            sum += amount.parse::<Decimal>().unwrap();
            let from = format!("2026-11-{:02}T{:02}:00:00Z", 1 + n % 28, n % 24);
            ledger.apply_stored(n as u64 + 1, Utc::now(), &lease_charge(n, n, &from, amount));
        }
        (ledger, sum)
    }

    fn invoices_of(out: &[Envelope]) -> Vec<&InvoiceIssued> {
        out.iter()
            .map(|e| match &e.data {
                EventData::InvoiceIssued(i) => i,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    fn notes_of(out: &[Envelope]) -> Vec<&InvoiceNoteIssued> {
        out.iter()
            .map(|e| match &e.data {
                EventData::InvoiceNoteIssued(n) => n,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_month_with_more_lines_than_one_event_holds_is_issued_in_parts() {
        let (mut ledger, sum) = busy_november(4_500);
        let credit = Credit {
            credit_id: Uuid::from_u128(77),
            period: "2026-10".into(),
            amount: "-3.00".parse().unwrap(),
        };
        ledger
            .pending_credits
            .insert((TENANT, "2026-11".into()), vec![credit.clone()]);
        let mut next = 4_500;
        let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
        let parts = invoices_of(&out);
        let shape: Vec<_> = parts
            .iter()
            .map(|p| (p.number, p.part, p.parts, p.lines.len(), p.credits.len()))
            .collect();
        assert_eq!(
            shape,
            [(1, 1, 3, 2000, 0), (2, 2, 3, 2000, 0), (3, 3, 3, 500, 1)]
        );
        let first = lh_rpc::invoice_document::invoice_id(TENANT, "2026-11");
        assert_eq!(parts[0].invoice_id, first);
        assert_eq!(parts[0].first_part_id, None);
        for p in &parts[1..] {
            assert_eq!(p.first_part_id, Some(first));
            assert_ne!(p.invoice_id, first);
        }
        // One issue: the same charges read, at the same instant.
        assert!(parts
            .iter()
            .all(|p| p.charges_through_sequence == 4_500 && p.issued_at == parts[0].issued_at));
        // Each part's total is its own; together they are the month's.
        let total: Decimal = parts.iter().map(|p| p.total).sum();
        assert_eq!(total, sum + credit.amount);
        for p in &parts {
            let document = InvoiceDocument::from_invoice(p);
            assert!(document.verify(), "{:?}", document.number);
            assert_eq!(
                p.total,
                money(
                    p.lines.iter().map(|l| l.amount).sum::<Decimal>()
                        + p.credits.iter().map(|c| c.amount).sum::<Decimal>()
                )
            );
        }
        assert_eq!(
            InvoiceDocument::from_invoice(parts[1])
                .shown_number()
                .as_deref(),
            Some("INV-000002 (part 2 of 3)")
        );
        // The lines in the order one document would have them.
        let whole =
            Ledger::lines_of(&busy_november(4_500).0.months[&(TENANT, "2026-11".into())].open);
        let split: Vec<Line> = parts.iter().flat_map(|p| p.lines.iter().cloned()).collect();
        assert_eq!(split, whole);
        assert_eq!(
            ledger.months[&(TENANT, "2026-11".into())].issued,
            Some((first, 1))
        );
        assert!(ledger.pending_credits.is_empty());
        assert!(store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z")).is_empty());
        // A late charge: a note of the first part.
        next += 1;
        ledger.apply_stored(
            next,
            Utc::now(),
            &lease_charge(9_000, 1, "2026-11-30T00:00:00Z", "4.00"),
        );
        let notes = store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z"));
        let note = only_note(&notes);
        assert_eq!((note.invoice_id, note.invoice_number), (first, 1));
        assert_eq!((note.part, note.parts), (1, 1));
    }

    #[test]
    fn a_half_issued_invoice_is_completed_with_the_parts_it_lacks() {
        let (mut ledger, _) = busy_november(4_500);
        let now = at("2026-12-01T00:00:00Z");
        let decided: Vec<Envelope> = ledger
            .decide(now)
            .into_iter()
            .flatten()
            .map(|(e, _)| e)
            .collect();
        assert_eq!(decided.len(), 3);
        // Stored: the first part, and a charge after it; then a restart.
        let (mut restarted, _) = busy_november(4_500);
        restarted.apply_stored(4_501, Utc::now(), &decided[0]);
        restarted.apply_stored(
            4_502,
            Utc::now(),
            &lease_charge(9_000, 1, "2026-11-30T00:00:00Z", "4.00"),
        );
        let mut next = 4_502;
        let later = at("2026-12-01T05:00:00Z");
        let mut out = store(&mut restarted, &mut next, later);
        // The two missing parts as they were decided (ids, numbers,
        // lines, hashes)...
        assert_eq!(out.len(), 2);
        for (again, first) in out.iter().zip(&decided[1..]) {
            assert_eq!(again.id, first.id);
            assert!(again.data == first.data, "part {:?} differs", again.id);
        }
        // ...then, the invoice whole, the late charge's note.
        out.extend(store(&mut restarted, &mut next, later));
        let note = only_note(&out[2..]);
        assert_eq!(note.charges_after_sequence, 4_500);
        assert_eq!(note.total.to_string(), "4.00");
        assert!(store(&mut restarted, &mut next, later).is_empty());
        // A fold of the whole log decides nothing more.
        let (mut refolded, _) = busy_november(4_500);
        let mut sequence = 4_500;
        for event in decided[..1]
            .iter()
            .chain(std::iter::once(&lease_charge(
                9_000,
                1,
                "2026-11-30T00:00:00Z",
                "4.00",
            )))
            .chain(&out)
        {
            sequence += 1;
            refolded.apply_stored(sequence, Utc::now(), event);
        }
        assert!(refolded.decide(later).is_empty());
        assert_eq!(refolded.last_invoice_number, 3);
        assert_eq!(refolded.last_note_number, 1);
    }

    /// A ledger taken back from its snapshot, as stored and read again,
    /// under a grace of its own.
    fn restarted_from_snapshot(ledger: &Ledger, grace: chrono::Duration) -> Ledger {
        let stored = serde_json::to_vec(&ledger.snapshot().expect("a snapshot")).unwrap();
        let mut restarted = Ledger::new(grace);
        assert!(restarted.restore(
            &serde_json::from_slice::<Box<serde_json::value::RawValue>>(&stored).unwrap()
        ));
        restarted
    }

    fn decided(out: &[Envelope]) -> Vec<(Uuid, &EventData)> {
        out.iter().map(|e| (e.id, &e.data)).collect()
    }

    #[test]
    fn a_ledger_started_from_its_snapshot_decides_what_the_fold_decides() {
        // A lost node's downtime, a month to issue and a credit to grant.
        let mut folded = interrupted("node n1 lost");
        let mut restarted = restarted_from_snapshot(&folded, chrono::Duration::zero());
        let (mut next_folded, mut next_restarted) = (4, 4);
        let now = at("2026-12-01T00:00:00Z");
        let out = store(&mut folded, &mut next_folded, now);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(
            decided(&out),
            decided(&store(&mut restarted, &mut next_restarted, now))
        );
        // The credit waits in both for December's invoice.
        let december = charge(9, "2026-12-02T00:00:00Z", 3600, "1.00");
        for (ledger, next) in [
            (&mut folded, &mut next_folded),
            (&mut restarted, &mut next_restarted),
        ] {
            *next += 1;
            ledger.apply_stored(*next, Utc::now(), &december);
        }
        let restarted = &mut restarted_from_snapshot(&restarted, chrono::Duration::zero());
        // Read twice (a replay after a restatement): counted once by both.
        for (ledger, next) in [
            (&mut folded, &mut next_folded),
            (&mut *restarted, &mut next_restarted),
        ] {
            *next += 1;
            ledger.apply_stored(*next, Utc::now(), &december);
        }
        let later = at("2027-01-01T00:00:00Z");
        let out = store(&mut folded, &mut next_folded, later);
        assert_eq!(only_invoice(&out).total.to_string(), "-9.00");
        assert_eq!(
            decided(&out),
            decided(&store(restarted, &mut next_restarted, later))
        );
    }

    #[test]
    fn a_snapshot_taken_mid_way_through_a_document_in_parts_completes_it_alike() {
        let (mut ledger, _) = busy_november(4_500);
        let now = at("2026-12-01T00:00:00Z");
        let parts: Vec<Envelope> = ledger
            .decide(now)
            .into_iter()
            .flatten()
            .map(|(e, _)| e)
            .collect();
        assert_eq!(parts.len(), 3);
        // The first part is stored, then the replica stops.
        ledger.apply_stored(4_501, Utc::now(), &parts[0]);
        let mut restarted = restarted_from_snapshot(&ledger, chrono::Duration::zero());
        let (mut a, mut b) = (4_501, 4_501);
        let out = store(&mut restarted, &mut b, now);
        assert_eq!(decided(&out), decided(&parts[1..]));
        assert_eq!(decided(&out), decided(&store(&mut ledger, &mut a, now)));
        assert_eq!(
            (restarted.last_invoice_number, restarted.read_through),
            (ledger.last_invoice_number, ledger.read_through)
        );
    }

    #[test]
    fn the_grace_is_the_replicas_own_not_the_snapshots() {
        let mut ledger = Ledger::new(chrono::Duration::zero());
        ledger.apply_stored(
            1,
            Utc::now(),
            &charge(1, "2026-11-03T01:00:00Z", 3600, "40.00"),
        );
        let mut restarted = restarted_from_snapshot(&ledger, chrono::Duration::days(2));
        let mut next = 1;
        let now = at("2026-12-01T12:00:00Z");
        assert_eq!(store(&mut ledger, &mut next, now).len(), 1);
        assert!(store(&mut restarted, &mut next, now).is_empty());
        assert_eq!(
            store(&mut restarted, &mut next, at("2026-12-03T00:00:00Z")).len(),
            1
        );
    }

    #[test]
    fn a_snapshot_of_another_shape_is_refused() {
        let mut ledger = Ledger::new(chrono::Duration::zero());
        let other = serde_json::json!({"months": {"not": "pairs"}});
        assert!(!ledger.restore(&serde_json::value::to_raw_value(&other).unwrap()));
        assert!(ledger.months.is_empty());
    }

    #[test]
    fn a_note_with_more_lines_than_one_event_holds_is_issued_in_parts() {
        let mut ledger = Ledger::new(chrono::Duration::zero());
        ledger.apply_stored(
            1,
            Utc::now(),
            &charge(1, "2026-11-03T01:00:00Z", 3600, "1.00"),
        );
        let mut next = 1;
        let invoice = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
        let invoice = only_invoice(&invoice).clone();
        for n in 0..2_500u128 {
            next += 1;
            ledger.apply_stored(
                next,
                Utc::now(),
                &lease_charge(10 + n, n, "2026-11-20T00:00:00Z", "-0.10"),
            );
        }
        let through = next;
        // Stored: the first part only; then a restart completes the note.
        let decided: Vec<Envelope> = ledger
            .decide(at("2026-12-02T00:00:00Z"))
            .into_iter()
            .flatten()
            .map(|(e, _)| e)
            .collect();
        let notes = notes_of(&decided);
        let shape: Vec<_> = notes
            .iter()
            .map(|n| (n.number, n.part, n.parts, n.lines.len(), n.kind))
            .collect();
        assert_eq!(
            shape,
            [
                (1, 1, 2, 2000, NoteKind::Credit),
                (2, 2, 2, 500, NoteKind::Credit)
            ]
        );
        for n in &notes {
            assert_eq!((n.invoice_id, n.invoice_number), (invoice.invoice_id, 1));
            assert_eq!(
                (n.charges_after_sequence, n.charges_through_sequence),
                (1, through)
            );
            assert!(InvoiceDocument::from_note(n).verify());
        }
        assert_eq!(notes[1].first_part_id, Some(notes[0].note_id));
        let total: Decimal = notes.iter().map(|n| n.total).sum();
        assert_eq!(total.to_string(), "-250.00");
        next += 1;
        ledger.apply_stored(next, Utc::now(), &decided[0]);
        let out = store(&mut ledger, &mut next, at("2026-12-03T00:00:00Z"));
        assert_eq!(out.len(), 1);
        assert!(out[0].data == decided[1].data);
        assert!(store(&mut ledger, &mut next, at("2026-12-03T00:00:00Z")).is_empty());
    }

    /// An hour of a lease a reservation covered: 0.00.
    fn covered(n: u128, from: &str) -> Envelope {
        let mut envelope = charge(n, from, 3600, "0.00");
        if let EventData::ChargeAccrued(c) = &mut envelope.data {
            (c.tier, c.reservation_id) = (Tier::Reserved, Some(Uuid::from_u128(50)));
        }
        envelope
    }

    #[test]
    fn covered_hours_after_the_invoice_make_no_note_by_themselves() {
        let mut log = vec![charge(1, "2026-11-03T01:00:00Z", 3600, "1.00")];
        let mut ledger = Ledger::new(chrono::Duration::zero());
        ledger.apply_stored(1, Utc::now(), &log[0]);
        let mut next = 1;
        log.extend(store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z")));
        assert_eq!(log.len(), 2);
        for (n, from) in [(2, "2026-11-30T22:00:00Z"), (3, "2026-11-30T23:00:00Z")] {
            next += 1;
            log.push(covered(n, from));
            ledger.apply_stored(next, Utc::now(), &covered(n, from));
        }
        assert!(store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z")).is_empty());
        // Refolded from the log after a restart: still none.
        let refold = |log: &[Envelope]| {
            let mut ledger = Ledger::new(chrono::Duration::zero());
            for (i, e) in log.iter().enumerate() {
                ledger.apply_stored(i as u64 + 1, Utc::now(), e);
            }
            ledger
        };
        assert!(refold(&log).decide(at("2026-12-02T00:00:00Z")).is_empty());
        // A charge that costs something: its note carries the covered
        // hours too.
        next += 1;
        let late = charge(4, "2026-11-30T21:00:00Z", 3600, "2.00");
        log.push(late.clone());
        ledger.apply_stored(next, Utc::now(), &late);
        let out = store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z"));
        let note = only_note(&out);
        assert_eq!(note.total.to_string(), "2.00");
        assert_eq!(note.charges_after_sequence, 1);
        let charges: u64 = note.lines.iter().map(|l| l.charges).sum();
        assert_eq!(charges, 3);
        assert!(note
            .lines
            .iter()
            .any(|l| l.tier == "reserved" && l.amount.is_zero()));
        log.extend(out);
        assert!(refold(&log).decide(at("2026-12-03T00:00:00Z")).is_empty());
        // Covered hours left open do not keep a month from being forgotten.
        next += 1;
        ledger.apply_stored(next, Utc::now(), &covered(5, "2026-11-30T20:00:00Z"));
        assert!(store(&mut ledger, &mut next, at("2028-01-01T00:00:00Z")).is_empty());
        assert!(!ledger.months.contains_key(&(TENANT, "2026-11".into())));
    }

    #[test]
    fn a_full_part_of_the_longest_lines_fits_in_one_message() {
        // The broker's limit, as deployed and as the tests run it.
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let max_payload = ["deploy/nats/nats.conf", "dev/nats.conf"]
            .iter()
            .map(|file| {
                let conf = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
                conf.lines()
                    .find_map(|l| l.trim().strip_prefix("max_payload:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or_else(|| panic!("no max_payload in {file}"))
            })
            .min()
            .unwrap();
        let instant = at("2026-11-30T23:59:59.999999Z");
        let line = DocumentLine {
            lease_id: Uuid::from_u128(u128::MAX),
            tier: Tier::Performance.as_str().into(),
            price_book_version: u32::MAX,
            charges: u64::MAX,
            billed_seconds: u64::MAX,
            from: instant,
            to: instant,
            amount: "-99999999999.99".parse().unwrap(),
        };
        let invoice = InvoiceIssued {
            invoice_id: Uuid::from_u128(u128::MAX),
            number: u64::MAX,
            tenant_id: Uuid::from_u128(u128::MAX),
            period: "2026-11".into(),
            currency: "CNY".into(),
            issued_at: instant,
            charges_through_sequence: u64::MAX,
            lines: vec![line; MAX_LINES_PER_DOCUMENT],
            credits: Vec::new(),
            total: "-99999999999.99".parse().unwrap(),
            content_hash: "f".repeat(64),
            part: MAX_PARTS_PER_DOCUMENT as u32,
            parts: MAX_PARTS_PER_DOCUMENT as u32,
            first_part_id: Some(Uuid::from_u128(u128::MAX)),
        };
        let bytes = envelope(
            instant,
            Uuid::from_u128(1),
            EventData::InvoiceIssued(invoice),
        )
        .to_json()
        .len();
        // A margin for the headers and what an envelope may gain.
        assert!(bytes * 4 < max_payload * 3, "{bytes} of {max_payload}");
    }
}
