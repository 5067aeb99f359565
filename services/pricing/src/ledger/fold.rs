//! The ledger's state and its fold: [`Ledger`] holds what the log said,
//! charges into each tenant's month, invoices, notes
//! and their parts marking what is covered, credits waiting for the
//! invoice that deducts them, and leases' downtime for availability. It
//! decides nothing, so a replay and a snapshot restore agree.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use lh_events::{
    ChargeAccrued, CreditGranted, Envelope, EventData, Interruption, InvoiceIssued,
    InvoiceNoteIssued, StorageChargeAccrued,
};
use lh_rpc::invoice_document::{money, storage_part, ChargePart, Credit};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Most interruptions a credit lists (its totals count all of them).
pub const MAX_INTERRUPTIONS_LISTED: usize = 100;

/// The ledger's state, folded from the log. Its snapshot is all of it but
/// the grace and the node clock skew, which are this replica's
/// configuration, not the log's.
#[derive(Debug, Serialize, Deserialize)]
pub struct Ledger {
    #[serde(skip)]
    pub(super) grace: chrono::Duration,
    /// How far a node's timestamps may be from the log server's clock: the
    /// starts and ends that close a lease's downtime are held to it.
    #[serde(skip)]
    pub(super) node_clock_skew: chrono::Duration,
    /// The newest sequence read from the log (not counting what this
    /// replica appended itself and has not read back yet).
    pub(super) read_through: u64,
    /// Sequence of the newest event on the ledger subject.
    pub(super) ledger_sequence: u64,
    pub(super) last_invoice_number: u64,
    pub(super) last_note_number: u64,
    #[serde(with = "pairs")]
    pub(super) months: BTreeMap<(Uuid, String), Month>,
    /// Granted credits not on an issued invoice, by the (tenant, period)
    /// of the invoice that deducts them.
    #[serde(with = "pairs")]
    pub(super) pending_credits: BTreeMap<(Uuid, String), Vec<Credit>>,
    /// (tenant, period measured) of every credit granted.
    pub(super) credited: HashSet<(Uuid, String)>,
    pub(super) credit_sequences: HashMap<Uuid, u64>,
    pub(super) leases: HashMap<Uuid, Watched>,
    #[serde(with = "pairs")]
    pub(super) downtime: BTreeMap<(Uuid, String), Downtime>,
}

impl Ledger {
    pub fn new(grace: chrono::Duration) -> Self {
        Self {
            grace,
            node_clock_skew: chrono::Duration::seconds(
                lh_events::node_time::DEFAULT_NODE_CLOCK_SKEW_SECS,
            ),
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

    /// Holds the node's times it reads to `skew` of when the log stored
    /// them.
    pub fn with_node_clock_skew(mut self, skew: chrono::Duration) -> Self {
        self.node_clock_skew = skew;
        self
    }

    /// Whether `period`'s month and grace are over at `now`.
    pub(super) fn due(&self, period: &str, now: DateTime<Utc>) -> bool {
        month_bounds(period).is_some_and(|(_, end)| now >= end + self.grace)
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

/// Most leases whose availability is followed at once; past it, new
/// leases are not counted (with a warning).
pub const MAX_WATCHED_LEASES: usize = 1_000_000;
/// Months back from now an open interruption is counted in.
pub(super) const MAX_OPEN_INTERRUPTION_MONTHS: u32 = 12;
/// Months back from now the ledger remembers issued months, their
/// downtime and credits: past the log's year a restarted replica has none
/// of them either, and one that runs for years must not hold them all.
const KEPT_MONTHS: u32 = 13;

/// First instant of the month `period` (`YYYY-MM`) and of the next one.
pub fn month_bounds(period: &str) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let (year, month) = lh_rpc::charges::parse_period(period).ok()?;
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
pub(super) fn oldest_kept(now: DateTime<Utc>) -> String {
    let mut start = now;
    for _ in 0..KEPT_MONTHS {
        start =
            month_bounds(&period_of(start)).map_or(start, |(s, _)| s) - chrono::Duration::days(1);
    }
    period_of(start)
}

pub(super) fn period_of(at: DateTime<Utc>) -> String {
    format!("{:04}-{:02}", at.year(), at.month())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Charge {
    pub(super) sequence: u64,
    pub(super) id: Uuid,
    pub(super) part: ChargePart,
}

/// What the ledger knows of one tenant's month.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Month {
    /// Charges on no issued document yet.
    pub(super) open: Vec<Charge>,
    /// Ids of the `open` charges: a charge read twice counts once. Those
    /// on a document are forgotten (a month of hourly charges is many);
    /// the charge subject's guard keeps the log from holding one twice.
    /// Not in a snapshot: `open` says them again.
    #[serde(skip)]
    pub(super) charge_ids: HashSet<Uuid>,
    /// Every charge of the month: seconds and amount per lease. Only the
    /// month's SLA credit reads them: emptied once it is settled.
    pub(super) per_lease: HashMap<Uuid, (u64, Decimal)>,
    /// The month's SLA credit is granted or can no longer be: its invoice
    /// is issued whole and no lease of its tenant is still down from
    /// before the month's end (no more downtime can land in it).
    pub(super) settled: bool,
    /// The issued invoice (its first part): its id and number.
    pub(super) issued: Option<(Uuid, u64)>,
    /// Charges stored at or below this sequence are on a document.
    pub(super) covered_through: u64,
    /// An invoice or note issued in parts, of which the log holds some:
    /// until all are read, its charges stay open and nothing else of the
    /// month is issued.
    pub(super) partial: Option<Partial>,
}

impl Month {
    /// Whether the open charges call for a note: a charge of 0.00 (an hour
    /// a reservation covered) makes none by itself, it rides along on the
    /// next one. A fold of the same log gives the same notes.
    pub(super) fn owes_a_note(&self) -> bool {
        self.open.iter().any(|c| !money(c.part.amount).is_zero())
    }

    /// The open charges stored at or below `through`.
    pub(super) fn open_through(&self, through: u64) -> impl Iterator<Item = &Charge> {
        self.open.iter().filter(move |c| c.sequence <= through)
    }

    /// Records that the log holds part `part` of `set` (the set it started
    /// when it is the first part read); the whole set once it holds all.
    pub(super) fn read_part(
        &mut self,
        set: Partial,
        part: u32,
        credits: &[Uuid],
    ) -> Option<Partial> {
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
pub(super) enum PartialKind {
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
pub(super) struct Partial {
    pub(super) kind: PartialKind,
    pub(super) first_part_id: Uuid,
    pub(super) first_number: u64,
    pub(super) parts: u32,
    pub(super) read: BTreeSet<u32>,
    pub(super) after: u64,
    pub(super) through: u64,
    pub(super) issued_at: DateTime<Utc>,
    /// Credits deducted by the parts read.
    pub(super) credits: Vec<Uuid>,
}

/// Interruptions of one tenant's month.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Downtime {
    pub(super) seconds: u64,
    pub(super) leases: BTreeSet<Uuid>,
    pub(super) listed: Vec<Interruption>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Watched {
    pub(super) tenant_id: Option<Uuid>,
    pub(super) down_since: Option<DateTime<Utc>>,
    /// A gang's members that have not started since its last placement:
    /// it is down until every one has, as it is billed from then.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) members_to_start: Vec<String>,
    /// The latest start of those members so far: the gang runs again from
    /// the last of them, whatever order the log holds them in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) members_started_by: Option<DateTime<Utc>>,
}

impl Ledger {
    /// Folds one event of the log: charges, documents and credits each in
    /// their own step, the lease lifecycle here.
    pub(super) fn fold(&mut self, sequence: u64, envelope: &Envelope) {
        match &envelope.data {
            EventData::ChargeAccrued(c) => self.fold_charge(sequence, c),
            EventData::StorageChargeAccrued(c) => self.fold_storage_charge(sequence, c),
            EventData::InvoiceIssued(e) => self.fold_invoice(sequence, e),
            EventData::InvoiceNoteIssued(e) => self.fold_note(sequence, e),
            EventData::CreditGranted(e) => self.fold_credit(sequence, e),
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
            EventData::LeasePlaced(e) => {
                if let Some(w) = self.leases.get_mut(&e.lease_id) {
                    w.members_to_start = e.members.iter().map(|m| m.node_id.clone()).collect();
                    w.members_started_by = None;
                }
            }
            EventData::LeaseStarted(e) => {
                let down = self.leases.get_mut(&e.lease_id).and_then(|w| {
                    let mut up_at = e.started_at;
                    if !w.members_to_start.is_empty() {
                        w.members_to_start.retain(|n| *n != e.node_id);
                        let latest = w.members_started_by.map_or(up_at, |at| at.max(up_at));
                        w.members_started_by = Some(latest);
                        if !w.members_to_start.is_empty() {
                            return None;
                        }
                        up_at = latest;
                    }
                    let since = w.down_since.take()?;
                    Some((w.tenant_id?, since, up_at))
                });
                if let Some((tenant, since, up_at)) = down {
                    self.record_down(tenant, e.lease_id, since, up_at);
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

    /// A charge: onto its tenant's month, once.
    fn fold_charge(&mut self, sequence: u64, c: &ChargeAccrued) {
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

    /// A storage charge: onto its tenant's month, once, as a line of its
    /// own (tier `storage`, the tenant's storage id for a lease). It is no
    /// lease's time: the availability credit leaves it out.
    fn fold_storage_charge(&mut self, sequence: u64, c: &StorageChargeAccrued) {
        if month_bounds(&c.period).is_none() {
            tracing::warn!(charge = %c.charge_id, period = c.period, "a storage charge of no valid period; ignored");
            return;
        }
        let month = self
            .months
            .entry((c.tenant_id, c.period.clone()))
            .or_default();
        if sequence <= month.covered_through || !month.charge_ids.insert(c.charge_id) {
            return;
        }
        month.open.push(Charge {
            sequence,
            id: c.charge_id,
            part: storage_part(c),
        });
    }

    /// An invoice (or a part of one): its month's charges through its
    /// sequence are covered, and the credits it deducts used.
    fn fold_invoice(&mut self, sequence: u64, e: &InvoiceIssued) {
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

    /// A note (or a part of one): its month's charges through its sequence
    /// are covered.
    fn fold_note(&mut self, sequence: u64, e: &InvoiceNoteIssued) {
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

    /// A credit: pending on the first invoice of its tenant not issued yet.
    fn fold_credit(&mut self, sequence: u64, e: &CreditGranted) {
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

    /// Forgets the issued months before [`KEPT_MONTHS`] back, with their
    /// downtime and credits.
    pub(super) fn forget_old_months(&mut self, now: DateTime<Utc>) {
        let oldest = oldest_kept(now);
        // Charges of 0.00 left open make no note: they do not hold a month.
        self.months.retain(|(_, period), m| {
            *period >= oldest || m.issued.is_none() || m.partial.is_some() || m.owes_a_note()
        });
        self.downtime.retain(|(_, period), _| *period >= oldest);
        self.credited.retain(|(_, period)| *period >= oldest);
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
}

/// Marks the month's charges up to `through` as on a document.
pub(super) fn cover(month: &mut Month, through: u64) {
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
pub(super) fn split_by_month(
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
