//! The ledger on the decide loop: [`Ledger`] applies stored events
//! through its fold, and at each pass appends the
//! credits, invoices and notes due, each guarded by the last sequence of
//! its subject so that two replicas never number one document twice.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::Expect;
use lh_events::{subject, Actor, Envelope, EventData};
use lh_service::decider::{Batch, Decider, Pace};
use uuid::Uuid;

use super::fold::Ledger;
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
/// A feed silent this long has delivered everything there is.
const QUIET: Duration = Duration::from_millis(300);

pub(super) fn envelope(now: DateTime<Utc>, id: Uuid, data: EventData) -> Envelope {
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

    fn node_clock_skew(&self) -> Option<chrono::Duration> {
        Some(self.node_clock_skew)
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
                    node_clock_skew: self.node_clock_skew,
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
