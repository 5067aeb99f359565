//! Issuing invoices and notes: which months are due, their lines and the
//! credits they deduct, split into parts that each fit one message and
//! numbered on from the last the log holds. Everything here reads the
//! fold and writes nothing; the decide loop appends what it returns.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use lh_events::{derived_id, InvoiceIssued, InvoiceNoteIssued, NoteKind};
use lh_rpc::invoice_document::{
    invoice_part_id, Credit, DocumentKind, DocumentStatus, InvoiceDocument, Line, LineAccumulator,
};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::fold::Ledger;
use super::fold::{Charge, PartialKind};

/// Most lines one invoice or note event carries: it must fit in one
/// message (`max_payload`, 1 MiB; 2000 lines of the longest kind take
/// about 0.55 MiB, which a unit test holds under 3/4 of it). A month with
/// more lines is issued in consecutive parts.
pub const MAX_LINES_PER_DOCUMENT: usize = 2_000;
/// Most parts one invoice or note is issued in (200 000 lines). A month
/// with more waits, with an error in the log, until the limit is raised.
pub const MAX_PARTS_PER_DOCUMENT: usize = 100;

impl Ledger {
    pub(super) fn lines_of<'a>(charges: impl IntoIterator<Item = &'a Charge>) -> Vec<Line> {
        let mut acc = LineAccumulator::default();
        for c in charges {
            acc.add(&c.part);
        }
        acc.lines()
    }

    /// The invoices due now, numbered from the next free number on: first
    /// the missing parts of one the log holds some of, then the months due.
    pub(super) fn invoices(&self, now: DateTime<Utc>) -> Vec<InvoiceIssued> {
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
    pub(super) fn notes(&self, now: DateTime<Utc>) -> Vec<InvoiceNoteIssued> {
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
