//! The `invoices` projection: one `invoice_lines` row per `charge.accrued`,
//! one `invoice_documents` row per issued invoice or note, one `credits` row
//! per SLA credit; and the invoices and notes read from those rows.
//!
//! `writes` is the projector: each event into its rows, charges in
//! multi-row statements. `queries` reads those rows for the RPCs.

mod queries;
mod writes;

pub use queries::{
    cost_report, lines_between, list_documents, read_charge_statement, read_document, what_if,
};
pub use writes::InvoiceProjector;

/// Name of the projection's offset row.
pub const NAME: &str = "invoices";
/// The table of charges the projection writes.
pub const TABLE: &str = "invoice_lines";
/// Every table the projection writes, compared by a rebuild.
pub const TABLES: &[&str] = &[
    TABLE,
    "invoice_documents",
    "invoice_drafts",
    "credits",
    "price_books",
];
