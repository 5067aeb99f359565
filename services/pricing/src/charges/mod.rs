//! Charges: turns running and finished leases into `charge.accrued`
//! events, priced by `lh_domain::rating`.
//!
//! [`ChargingState`] is the in-memory state rebuilt from the log (price books, spot
//! prices, the billing facts of each open lease and how far each is
//! charged); it does no I/O. [`Charges`] puts it on the decide loop
//! (`lh_service::decider`), which feeds it from sequence 1 (or a snapshot)
//! and, once it has caught up with the head of the log, publishes:
//!
//! * for a running lease, one charge per UTC hour once that hour is over
//!   and a grace after it ([`DEFAULT_ACCRUAL_GRACE_SECS`]) has passed, so
//!   that a late report of its end is in, and
//! * for an ended lease, the charges of the hours not yet charged, up to
//!   the end of its billable time.
//!
//! A charge's id is derived from (lease, hour); its amount is
//! `round(C(to)) - round(C(from))` ([`lh_domain::rating`]), continuing from
//! the cumulative cost the lease's previous charge carries. All charges a
//! pass writes for a lease go in one atomic batch whose first message
//! expects the sequence of the lease's last charge on
//! `lh.evt.charge.<lease_id>` (0 for the first), so a restarted or second
//! replica never charges an hour twice: the log already holds the charge
//! (the fold saw it), or the server refuses the batch.
//!
//! Object storage is charged beside the leases: each `storage.measured`
//! closes a span of its tenant's storage (the bytes the measurement before
//! it counted, held until it), priced by `lh_domain::storage_rating` into
//! `charge.storage_accrued` events on `lh.evt.charge.<storage id>`, guarded
//! and continued in the same way as a lease's, with ids derived from
//! (tenant, start of the span).
//!
//! The rooms: `fold` folds stored events into [`ChargingState`];
//! `plan` works out and prices the charges due from it; `storage` does
//! both for tenants' storage; `decider` puts them on the decide loop and
//! shares what the RPCs read.

mod decider;
mod fold;
mod plan;
mod storage;
mod storage_facts;

pub use decider::{default_book_id, ensure_price_book, Charges, FILTERS, MAX_SPEND_SERIES_TENANTS};
pub use fold::{
    book_in_force, ChargingState, MAX_REMEMBERED_CHARGED_LEASES, QUOTE_KEPT_AFTER_EXPIRY,
};
pub use plan::{
    bill_batches, envelopes, tier_pricing, Bill, Plan, DEFAULT_ACCRUAL_GRACE_SECS,
    MAX_ACCRUAL_GRACE_SECS,
};

#[cfg(test)]
mod tests;
