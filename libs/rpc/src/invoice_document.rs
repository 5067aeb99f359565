//! Invoices and notes as documents: a tenant's monthly invoice (a `draft`
//! while its month and grace period last, then `issued`) and the credit and
//! debit notes that correct an issued one. Pricing answers them on
//! [`LIST_SUBJECT`] and [`DOCUMENT_SUBJECT`]; the gateway and the CLI show
//! them; an auditor recomputes their hash.
//!
//! A document's lines add up a lease's charges per (lease, tier, price book
//! version): [`LineAccumulator`] is the one place that does it, used by
//! pricing when it issues and when it reads a draft back.
//!
//! # Content hash
//!
//! `content_hash` is the lowercase hex SHA-256 of the canonical JSON (see
//! [`crate::charges::canonical_json`]) of the document without its
//! `content_hash` and `status` fields. An issued document's hash is fixed
//! when it is issued and carried by its event; a draft's is provisional.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use lh_bus::Bus;
use lh_events::{is_one_part, one_part, AppliedCredit, InvoiceIssued, InvoiceNoteIssued, NoteKind};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::charges::canonical_json;

/// Subject on which pricing lists invoices and notes.
pub const LIST_SUBJECT: &str = lh_events::subject::RPC_PRICING_INVOICE_LIST;
/// Subject on which pricing answers one invoice or note.
pub const DOCUMENT_SUBJECT: &str = lh_events::subject::RPC_PRICING_INVOICE_DOCUMENT;
/// Most documents one list answer carries.
pub const MAX_LIST_LIMIT: u32 = 500;
/// Documents a list answers when the caller names no limit.
pub const DEFAULT_LIST_LIMIT: u32 = 100;
/// Fields the hash leaves out: the hash itself, and the status, which a
/// draft changes into `issued` without changing what it says.
const UNHASHED_FIELDS: [&str; 2] = ["content_hash", "status"];

/// An invoice number as shown: the series and 6 digits at least.
pub fn invoice_number(number: u64) -> String {
    format!("INV-{number:06}")
}

/// A note number as shown.
pub fn note_number(number: u64) -> String {
    format!("NOTE-{number:06}")
}

/// The id of a tenant's invoice for `period`, the same for its draft and
/// once issued (its first part, when issued in parts).
pub fn invoice_id(tenant_id: Uuid, period: &str) -> Uuid {
    lh_events::derived_id(&["invoice", &tenant_id.to_string(), period])
}

/// The id of part `part` (from 1) of a tenant's invoice for `period`: the
/// first is [`invoice_id`], so that a one-part invoice keeps the id it
/// always had; a republished part is the same event.
pub fn invoice_part_id(tenant_id: Uuid, period: &str, part: u32) -> Uuid {
    if part <= 1 {
        return invoice_id(tenant_id, period);
    }
    lh_events::derived_id(&[
        "invoice",
        &tenant_id.to_string(),
        period,
        "part",
        &part.to_string(),
    ])
}

/// A document's number as people read it: `INV-000011`, or
/// `INV-000011 (part 2 of 3)` for a part.
pub fn shown_number(number: &str, part: u32, parts: u32) -> String {
    if parts > 1 {
        format!("{number} (part {part} of {parts})")
    } else {
        number.to_string()
    }
}

/// Money as documents carry it: 2 places, and a zero never negative (a
/// sum of opposite charges must read the same whichever side it came from).
pub fn money(amount: Decimal) -> Decimal {
    let mut rounded = lh_domain::rating::round_amount(amount);
    if rounded.is_zero() {
        rounded.set_sign_positive(true);
    }
    rounded
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DocumentKind {
    Invoice,
    CreditNote,
    DebitNote,
}

impl DocumentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DocumentKind::Invoice => "invoice",
            DocumentKind::CreditNote => "credit_note",
            DocumentKind::DebitNote => "debit_note",
        }
    }

    pub fn parse(kind: &str) -> Option<Self> {
        [Self::Invoice, Self::CreditNote, Self::DebitNote]
            .into_iter()
            .find(|k| k.as_str() == kind)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DocumentStatus {
    /// The month or its grace period is not over: lines may still come.
    Draft,
    /// Immutable.
    Issued,
}

impl DocumentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DocumentStatus::Draft => "draft",
            DocumentStatus::Issued => "issued",
        }
    }
}

/// One line: a lease's charges at one tier and price book version, as
/// the events carry it.
pub use lh_events::DocumentLine as Line;

/// A credit deducted on an invoice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Credit {
    pub credit_id: Uuid,
    /// The month whose availability fell short of the SLA.
    #[schema(example = "2026-11")]
    pub period: String,
    /// Negative, 2 places.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "-3.20")]
    pub amount: Decimal,
}

/// An invoice or a note.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InvoiceDocument {
    pub id: Uuid,
    pub kind: DocumentKind,
    pub status: DocumentStatus,
    /// `INV-000042` or `NOTE-000007`; none on a draft.
    pub number: Option<String>,
    /// A note's invoice.
    pub refers_to: Option<Uuid>,
    pub refers_to_number: Option<String>,
    pub tenant_id: Uuid,
    #[schema(example = "2026-12")]
    pub period: String,
    #[schema(example = "CNY")]
    pub currency: String,
    pub issued_at: Option<DateTime<Utc>>,
    /// The charges on it were stored after this sequence of the log...
    pub charges_after_sequence: u64,
    /// ...and at or below this one.
    pub charges_through_sequence: u64,
    /// Ordered by (`from`, `lease_id`, `tier`, `price_book_version`).
    pub lines: Vec<Line>,
    pub credits: Vec<Credit>,
    /// Lines plus credits, 2 places.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "1.00")]
    pub total: Decimal,
    pub content_hash: String,
    /// Which part this is, from 1, of an invoice or note issued in parts
    /// (more lines than one event holds); absent when it is whole, so that
    /// a whole document's form and hash are what they always were.
    #[serde(default = "one_part", skip_serializing_if = "is_one_part")]
    #[schema(default = 1, minimum = 1)]
    pub part: u32,
    /// How many parts; absent when 1.
    #[serde(default = "one_part", skip_serializing_if = "is_one_part")]
    #[schema(default = 1, minimum = 1)]
    pub parts: u32,
    /// The first part's id, on every later part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_part_id: Option<Uuid>,
}

impl InvoiceDocument {
    /// A tenant's invoice for `period` as far as it goes: lines and credits
    /// in any order; total and hash computed.
    pub fn draft(
        tenant_id: Uuid,
        period: &str,
        through_sequence: u64,
        lines: Vec<Line>,
        credits: Vec<Credit>,
    ) -> Self {
        Self {
            id: invoice_id(tenant_id, period),
            kind: DocumentKind::Invoice,
            status: DocumentStatus::Draft,
            number: None,
            refers_to: None,
            refers_to_number: None,
            tenant_id,
            period: period.to_string(),
            currency: lh_domain::rating::CURRENCY.to_string(),
            issued_at: None,
            charges_after_sequence: 0,
            charges_through_sequence: through_sequence,
            lines,
            credits,
            total: Decimal::ZERO,
            content_hash: String::new(),
            part: 1,
            parts: 1,
            first_part_id: None,
        }
        .sealed()
    }

    /// Its number as people read it (see [`shown_number`]).
    pub fn shown_number(&self) -> Option<String> {
        self.number
            .as_deref()
            .map(|n| shown_number(n, self.part, self.parts))
    }

    /// Orders lines and credits, then sets the total and the hash.
    pub fn sealed(mut self) -> Self {
        sort_lines(&mut self.lines);
        self.credits
            .sort_by_key(|c| (c.period.clone(), c.credit_id));
        self.total = money(
            self.lines.iter().map(|l| l.amount).sum::<Decimal>()
                + self.credits.iter().map(|c| c.amount).sum::<Decimal>(),
        );
        self.content_hash = document_hash(&self);
        self
    }

    /// The issued invoice an `invoice.issued` event records.
    pub fn from_invoice(e: &InvoiceIssued) -> Self {
        Self {
            id: e.invoice_id,
            kind: DocumentKind::Invoice,
            status: DocumentStatus::Issued,
            number: Some(invoice_number(e.number)),
            refers_to: None,
            refers_to_number: None,
            tenant_id: e.tenant_id,
            period: e.period.clone(),
            currency: e.currency.clone(),
            issued_at: Some(e.issued_at),
            charges_after_sequence: 0,
            charges_through_sequence: e.charges_through_sequence,
            lines: e.lines.clone(),
            credits: e
                .credits
                .iter()
                .map(|c| Credit {
                    credit_id: c.credit_id,
                    period: c.period.clone(),
                    amount: c.amount,
                })
                .collect(),
            total: e.total,
            content_hash: e.content_hash.clone(),
            part: e.part,
            parts: e.parts,
            first_part_id: e.first_part_id,
        }
    }

    /// The issued note an `invoice.note_issued` event records.
    pub fn from_note(e: &InvoiceNoteIssued) -> Self {
        Self {
            id: e.note_id,
            kind: match e.kind {
                NoteKind::Debit => DocumentKind::DebitNote,
                NoteKind::Credit => DocumentKind::CreditNote,
            },
            status: DocumentStatus::Issued,
            number: Some(note_number(e.number)),
            refers_to: Some(e.invoice_id),
            refers_to_number: Some(invoice_number(e.invoice_number)),
            tenant_id: e.tenant_id,
            period: e.period.clone(),
            currency: e.currency.clone(),
            issued_at: Some(e.issued_at),
            charges_after_sequence: e.charges_after_sequence,
            charges_through_sequence: e.charges_through_sequence,
            lines: e.lines.clone(),
            credits: Vec::new(),
            total: e.total,
            content_hash: e.content_hash.clone(),
            part: e.part,
            parts: e.parts,
            first_part_id: e.first_part_id,
        }
    }

    /// True when the total and the hash match what the document says.
    pub fn verify(&self) -> bool {
        let resealed = self.clone().sealed();
        resealed.total == self.total
            && resealed.total.to_string() == self.total.to_string()
            && resealed.content_hash == self.content_hash
            && resealed.lines == self.lines
    }

    /// The document as CSV: a header row, one row per line and per
    /// credit, and a total row (`docs/pricing.md`).
    pub fn to_csv(&self) -> String {
        let number = self.shown_number().unwrap_or_default();
        let mut out = String::from(
            "document,number,status,tenant_id,period,row,lease_id,tier,price_book_version,charges,billed_seconds,from,to,amount,currency\n",
        );
        let head = format!(
            "{},{},{},{},{}",
            self.kind.as_str(),
            csv_field(&number),
            self.status.as_str(),
            self.tenant_id,
            csv_field(&self.period)
        );
        for l in &self.lines {
            out.push_str(&format!(
                "{head},line,{},{},{},{},{},{},{},{},{}\n",
                l.lease_id,
                csv_field(&l.tier),
                l.price_book_version,
                l.charges,
                l.billed_seconds,
                l.from.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
                l.to.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
                l.amount,
                csv_field(&self.currency)
            ));
        }
        for c in &self.credits {
            out.push_str(&format!(
                "{head},credit {},{},,,,,,,{},{}\n",
                csv_field(&c.period),
                c.credit_id,
                c.amount,
                csv_field(&self.currency)
            ));
        }
        out.push_str(&format!(
            "{head},total,,,,,,,,{},{}\n",
            self.total,
            csv_field(&self.currency)
        ));
        out
    }
}

/// A CSV field that cannot break the row or run as a spreadsheet formula.
fn csv_field(value: &str) -> String {
    let defused = if value.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{value}")
    } else {
        value.to_string()
    };
    if defused.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", defused.replace('"', "\"\""))
    } else {
        defused
    }
}

impl From<&Credit> for AppliedCredit {
    fn from(c: &Credit) -> Self {
        Self {
            credit_id: c.credit_id,
            period: c.period.clone(),
            amount: c.amount,
        }
    }
}

/// The document order of lines.
pub fn sort_lines(lines: &mut [Line]) {
    lines.sort_by(|a, b| {
        (a.from, a.lease_id, &a.tier, a.price_book_version).cmp(&(
            b.from,
            b.lease_id,
            &b.tier,
            b.price_book_version,
        ))
    });
}

/// The hash a document carries (module docs).
pub fn document_hash(document: &InvoiceDocument) -> String {
    let mut value = serde_json::to_value(document).expect("a document serialises");
    if let serde_json::Value::Object(map) = &mut value {
        for field in UNHASHED_FIELDS {
            map.remove(field);
        }
    }
    hex::encode(Sha256::digest(canonical_json(&value).as_bytes()))
}

/// What a document line needs of one `charge.accrued`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargePart {
    pub lease_id: Uuid,
    pub tier: String,
    pub price_book_version: u32,
    pub billed_seconds: u64,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub amount: Decimal,
}

/// The tier an invoice line of storage charges names.
pub const STORAGE_TIER: &str = "storage";

/// What a line needs of one `charge.storage_accrued`: a line of the
/// tenant's storage (its storage id where a lease's line has the lease).
pub fn storage_part(c: &lh_events::StorageChargeAccrued) -> ChargePart {
    ChargePart {
        lease_id: c.storage_id,
        tier: STORAGE_TIER.to_string(),
        price_book_version: c.price_book_version,
        billed_seconds: c.billed_seconds,
        from: c.from,
        to: c.to,
        amount: c.amount,
    }
}

/// Adds charges up into lines.
#[derive(Debug, Clone, Default)]
pub struct LineAccumulator {
    lines: BTreeMap<(Uuid, String, u32), Line>,
}

impl LineAccumulator {
    pub fn add(&mut self, part: &ChargePart) {
        // PostgreSQL keeps instants to the microsecond: a line read back
        // from it must equal the one built from the events.
        let (from, to) = (part.from.trunc_subsecs(6), part.to.trunc_subsecs(6));
        let key = (part.lease_id, part.tier.clone(), part.price_book_version);
        let line = self.lines.entry(key).or_insert_with(|| Line {
            lease_id: part.lease_id,
            tier: part.tier.clone(),
            price_book_version: part.price_book_version,
            charges: 0,
            billed_seconds: 0,
            from,
            to,
            amount: Decimal::ZERO,
        });
        line.charges += 1;
        line.billed_seconds = line.billed_seconds.saturating_add(part.billed_seconds);
        line.from = line.from.min(from);
        line.to = line.to.max(to);
        line.amount += part.amount;
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// The lines in document order, amounts to 2 places.
    pub fn lines(&self) -> Vec<Line> {
        let mut lines: Vec<Line> = self
            .lines
            .values()
            .map(|l| Line {
                amount: money(l.amount),
                ..l.clone()
            })
            .collect();
        sort_lines(&mut lines);
        lines
    }
}

/// Lists documents. A tenant's caller names its tenant; the admin may not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRequest {
    pub tenant_id: Option<Uuid>,
    pub period: Option<String>,
    pub status: Option<DocumentStatus>,
    /// At most [`MAX_LIST_LIMIT`].
    pub limit: u32,
}

/// One document in a list, without its lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DocumentSummary {
    pub id: Uuid,
    pub kind: DocumentKind,
    pub status: DocumentStatus,
    pub number: Option<String>,
    pub refers_to: Option<Uuid>,
    pub tenant_id: Uuid,
    #[schema(example = "2026-12")]
    pub period: String,
    pub currency: String,
    pub issued_at: Option<DateTime<Utc>>,
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "1.00")]
    pub total: Decimal,
    pub content_hash: String,
    /// As the document's: absent when it is whole.
    #[serde(default = "one_part", skip_serializing_if = "is_one_part")]
    #[schema(default = 1, minimum = 1)]
    pub part: u32,
    #[serde(default = "one_part", skip_serializing_if = "is_one_part")]
    #[schema(default = 1, minimum = 1)]
    pub parts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_part_id: Option<Uuid>,
}

impl From<&InvoiceDocument> for DocumentSummary {
    fn from(d: &InvoiceDocument) -> Self {
        Self {
            id: d.id,
            kind: d.kind,
            status: d.status,
            number: d.number.clone(),
            refers_to: d.refers_to,
            tenant_id: d.tenant_id,
            period: d.period.clone(),
            currency: d.currency.clone(),
            issued_at: d.issued_at,
            total: d.total,
            content_hash: d.content_hash.clone(),
            part: d.part,
            parts: d.parts,
            first_part_id: d.first_part_id,
        }
    }
}

/// Newest period first, then invoices before their notes, in number order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DocumentList {
    pub invoices: Vec<DocumentSummary>,
}

/// Which document: by id, or a tenant's invoice of a period (its draft,
/// empty when nothing was charged yet, or the issued one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DocumentRequest {
    ById {
        id: Uuid,
        /// When set, a document of another tenant is not found.
        tenant_id: Option<Uuid>,
    },
    ByPeriod {
        tenant_id: Uuid,
        period: String,
    },
}

/// Lists documents from a running pricing service.
pub async fn list(
    bus: &Bus,
    request: &ListRequest,
    timeout: Duration,
) -> lh_bus::Result<DocumentList> {
    lh_bus::rpc::call(bus, LIST_SUBJECT, request, timeout).await
}

/// One document from a running pricing service; `None` when there is none.
pub async fn document(
    bus: &Bus,
    request: &DocumentRequest,
    timeout: Duration,
) -> lh_bus::Result<Option<InvoiceDocument>> {
    lh_bus::rpc::call(bus, DOCUMENT_SUBJECT, request, timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn part(lease: u128, hour: u32, amount: &str) -> ChargePart {
        let from = Utc.with_ymd_and_hms(2026, 11, 3, hour, 0, 0).unwrap();
        ChargePart {
            lease_id: Uuid::from_u128(lease),
            tier: "basic".into(),
            price_book_version: 1,
            billed_seconds: 3600,
            from,
            to: from + chrono::Duration::hours(1),
            amount: amount.parse().unwrap(),
        }
    }

    #[test]
    fn charges_add_up_per_lease_tier_and_book() {
        let mut acc = LineAccumulator::default();
        for p in [part(2, 1, "0.50"), part(1, 2, "1.25"), part(2, 2, "-0.50")] {
            acc.add(&p);
        }
        let lines = acc.lines();
        assert_eq!(lines.len(), 2);
        // Lease 2 began first.
        assert_eq!(lines[0].lease_id, Uuid::from_u128(2));
        assert_eq!(lines[0].charges, 2);
        assert_eq!(lines[0].billed_seconds, 7200);
        assert_eq!(lines[0].amount.to_string(), "0.00");
        assert_eq!(lines[0].to - lines[0].from, chrono::Duration::hours(2));
        let doc = InvoiceDocument::draft(Uuid::nil(), "2026-11", 9, lines, vec![]);
        assert_eq!(doc.total.to_string(), "1.25");
        assert!(doc.verify());
    }

    #[test]
    fn the_hash_ignores_status_and_covers_everything_else() {
        let mut acc = LineAccumulator::default();
        acc.add(&part(1, 1, "1.00"));
        let credit = Credit {
            credit_id: Uuid::from_u128(5),
            period: "2026-10".into(),
            amount: "-0.40".parse().unwrap(),
        };
        let draft = InvoiceDocument::draft(Uuid::nil(), "2026-11", 9, acc.lines(), vec![credit]);
        assert_eq!(draft.total.to_string(), "0.60");
        let issued = InvoiceDocument {
            status: DocumentStatus::Issued,
            ..draft.clone()
        };
        assert_eq!(document_hash(&issued), draft.content_hash);
        let numbered = InvoiceDocument {
            number: Some(invoice_number(1)),
            ..draft.clone()
        };
        assert!(!numbered.verify());
        let mut tampered = draft.clone();
        tampered.credits.clear();
        assert!(!tampered.verify());
        // Pinned: a change here changes every issued document's hash.
        let canonical = r#"{"charges_after_sequence":0,"charges_through_sequence":9,"credits":[{"amount":"-0.40","credit_id":"00000000-0000-0000-0000-000000000005","period":"2026-10"}],"currency":"CNY","id":"ID","issued_at":null,"kind":"invoice","lines":[{"amount":"1.00","billed_seconds":3600,"charges":1,"from":"2026-11-03T01:00:00Z","lease_id":"00000000-0000-0000-0000-000000000001","price_book_version":1,"tier":"basic","to":"2026-11-03T02:00:00Z"}],"number":null,"period":"2026-11","refers_to":null,"refers_to_number":null,"tenant_id":"00000000-0000-0000-0000-000000000000","total":"0.60"}"#
            .replace("ID", &draft.id.to_string());
        assert_eq!(
            draft.content_hash,
            hex::encode(Sha256::digest(canonical.as_bytes()))
        );
        // The worked example of docs/pricing.md.
        assert_eq!(draft.id.to_string(), "a209c0df-d469-5393-a51c-3f3b318ff803");
        assert_eq!(
            draft.content_hash,
            "8400cf1355f8177e1608ba34e18bda5b415f2ac76b15db1c49c50e254bd50fef"
        );
    }

    #[test]
    fn an_event_and_its_document_agree() {
        let mut acc = LineAccumulator::default();
        acc.add(&part(1, 1, "1.00"));
        let draft = InvoiceDocument::draft(Uuid::nil(), "2026-11", 9, acc.lines(), vec![]);
        let issued_at = Utc.with_ymd_and_hms(2026, 12, 4, 0, 0, 0).unwrap();
        let mut doc = InvoiceDocument {
            status: DocumentStatus::Issued,
            number: Some(invoice_number(7)),
            issued_at: Some(issued_at),
            ..draft
        }
        .sealed();
        let event = InvoiceIssued {
            invoice_id: doc.id,
            number: 7,
            tenant_id: doc.tenant_id,
            period: doc.period.clone(),
            currency: doc.currency.clone(),
            issued_at,
            charges_through_sequence: 9,
            lines: doc.lines.clone(),
            credits: vec![],
            total: doc.total,
            content_hash: doc.content_hash.clone(),
            part: 1,
            parts: 1,
            first_part_id: None,
        };
        assert_eq!(InvoiceDocument::from_invoice(&event), doc);
        assert!(doc.verify());
        doc.lines[0].billed_seconds += 1;
        assert!(!doc.verify());
    }

    #[test]
    fn a_whole_invoice_issued_before_parts_reads_and_hashes_as_it_did() {
        // An `invoice.issued` as stored before parts existed, with the
        // hash it was issued with.
        let stored = r#"{"invoice_id":"a209c0df-d469-5393-a51c-3f3b318ff803","number":1,"tenant_id":"00000000-0000-0000-0000-000000000000","period":"2026-11","currency":"CNY","issued_at":"2026-12-04T00:00:00Z","charges_through_sequence":9,"lines":[{"lease_id":"00000000-0000-0000-0000-000000000001","tier":"basic","price_book_version":1,"charges":1,"billed_seconds":3600,"from":"2026-11-03T01:00:00Z","to":"2026-11-03T02:00:00Z","amount":"1.00"}],"credits":[],"total":"1.00","content_hash":"HASH"}"#;
        let canonical = r#"{"charges_after_sequence":0,"charges_through_sequence":9,"credits":[],"currency":"CNY","id":"a209c0df-d469-5393-a51c-3f3b318ff803","issued_at":"2026-12-04T00:00:00Z","kind":"invoice","lines":[{"amount":"1.00","billed_seconds":3600,"charges":1,"from":"2026-11-03T01:00:00Z","lease_id":"00000000-0000-0000-0000-000000000001","price_book_version":1,"tier":"basic","to":"2026-11-03T02:00:00Z"}],"number":"INV-000001","period":"2026-11","refers_to":null,"refers_to_number":null,"tenant_id":"00000000-0000-0000-0000-000000000000","total":"1.00"}"#;
        let hash = hex::encode(Sha256::digest(canonical.as_bytes()));
        let event: InvoiceIssued = serde_json::from_str(&stored.replace("HASH", &hash)).unwrap();
        assert_eq!((event.part, event.parts, event.first_part_id), (1, 1, None));
        let document = InvoiceDocument::from_invoice(&event);
        assert!(document.verify());
        assert_eq!(document_hash(&document), hash);
        assert_eq!(document.shown_number().as_deref(), Some("INV-000001"));
        // Written again, neither the event nor the document says "part".
        for json in [
            serde_json::to_string(&event).unwrap(),
            serde_json::to_string(&document).unwrap(),
            serde_json::to_string(&DocumentSummary::from(&document)).unwrap(),
        ] {
            assert!(!json.contains("part"), "{json}");
        }
        // A part says which, and its hash covers it.
        let second = InvoiceDocument {
            id: invoice_part_id(document.tenant_id, &document.period, 2),
            part: 2,
            parts: 3,
            first_part_id: Some(document.id),
            ..document.clone()
        };
        assert!(!second.verify());
        let second = second.sealed();
        assert_ne!(second.content_hash, document.content_hash);
        assert_eq!(
            second.shown_number().as_deref(),
            Some("INV-000001 (part 2 of 3)")
        );
        assert_eq!(
            invoice_part_id(document.tenant_id, &document.period, 1),
            document.id
        );
        let csv = second.to_csv();
        assert!(
            csv.lines()
                .nth(1)
                .unwrap()
                .starts_with("invoice,INV-000001 (part 2 of 3),issued,"),
            "{csv}"
        );
        let mut round_trip = serde_json::to_value(&second).unwrap();
        assert_eq!(round_trip["part"], 2);
        round_trip["part"] = 3.into();
        let tampered: InvoiceDocument = serde_json::from_value(round_trip).unwrap();
        assert!(!tampered.verify());
    }

    #[test]
    fn a_line_keeps_its_form_as_the_events_type() {
        // Amounts as strings with their places, whatever their sign: the
        // form every issued document was hashed in.
        for amount in ["1.00", "-0.50", "0.00", "12345678.90", "-0.01"] {
            let mut acc = LineAccumulator::default();
            acc.add(&part(1, 1, amount));
            let line = serde_json::to_value(&acc.lines()[0]).unwrap();
            assert_eq!(line["amount"], amount);
            assert_eq!(line["from"], "2026-11-03T01:00:00Z");
            let back: Line = serde_json::from_value(line).unwrap();
            assert_eq!(back, acc.lines()[0]);
        }
    }

    #[test]
    fn csv_rows_cannot_break_out() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("=1+1"), "'=1+1");
        assert_eq!(csv_field("\t=1+1"), "'\t=1+1");
        assert_eq!(csv_field("\r=1"), "\"'\r=1\"");
        assert_eq!(csv_field("say \"x\""), "\"say \"\"x\"\"\"");
        let mut acc = LineAccumulator::default();
        acc.add(&part(1, 1, "1.00"));
        let doc = InvoiceDocument::draft(Uuid::nil(), "2026-11", 9, acc.lines(), vec![]);
        let csv = doc.to_csv();
        let rows: Vec<&str> = csv.lines().collect();
        assert_eq!(rows.len(), 3, "{csv}");
        assert!(rows[1].contains(",line,00000000-0000-0000-0000-000000000001,basic,1,1,3600,"));
        assert!(rows[2].ends_with(",total,,,,,,,,1.00,CNY"), "{csv}");
        assert!(rows.iter().all(|r| r.split(',').count() == 15), "{csv}");
    }
}
