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
//!
//! The rooms: `fold` reads the log into the [`Ledger`]'s months, credits
//! and downtime; `issue` works out the invoices and notes due; `sla`
//! the availability credits; `decider` puts them on the decide loop.

mod decider;
mod fold;
mod issue;
mod sla;

pub use decider::{DEFAULT_INVOICE_GRACE_SECS, FILTERS, MAX_INVOICE_GRACE_SECS};
pub use fold::{month_bounds, next_period, Ledger, MAX_INTERRUPTIONS_LISTED, MAX_WATCHED_LEASES};
pub use issue::{MAX_LINES_PER_DOCUMENT, MAX_PARTS_PER_DOCUMENT};
pub use sla::{share_percent, sla_percent, CREDIT_RULE};

#[cfg(test)]
mod tests;
