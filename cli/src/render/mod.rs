//! Human-readable tables for the gateway's JSON answers, one room per
//! resource as in `crate::commands`; what they are all made of (lenient
//! field reading, borderless tables, defused CSV cells) is in [`table`].

mod audit;
mod balance;
mod billing;
mod data;
mod invoice;
mod key;
mod lease;
mod node;
mod price_book;
mod quote;
mod report;
mod reservation;
mod spot;
mod ssh_key;
mod table;
mod template;
mod tenant;
#[cfg(test)]
mod test_rows;
mod workspace;

pub(crate) use audit::{audit, audit_csv_header, audit_csv_row, audit_events};
pub(crate) use balance::{balance, top_up};
pub(crate) use billing::{what_if, what_if_csv};
pub(crate) use data::{bytes_text, dataset_list, dataset_view, storage_usage};
pub(crate) use invoice::{invoice, invoice_list};
pub(crate) use key::{key_issued, key_list, key_view};
pub(crate) use lease::{lease_list, lease_usage, lease_view};
pub(crate) use node::{gpu_catalogue, node_cordon, node_enrollment, node_list, node_view};
pub(crate) use price_book::price_books;
pub(crate) use quote::quote;
pub(crate) use report::{cost_report, cost_report_csv};
pub(crate) use reservation::reservations;
pub(crate) use spot::spot_prices;
pub(crate) use ssh_key::{ssh_key_list, ssh_key_view};
pub(crate) use template::templates;
pub(crate) use tenant::{tenant_changed, tenant_created, tenant_list, tenant_view};
pub(crate) use workspace::{workspace_list, workspace_snapshot, workspace_view};
