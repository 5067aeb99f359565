//! Command-line arguments of `lh`, parsed with clap's derive API. The
//! global options and the list of command groups are in [`cli`]; each
//! group's flags are in the room of the same name, as its handler is in
//! `crate::commands` and its tables in `crate::render`.

mod audit;
mod balance;
mod billing;
mod cli;
pub(crate) mod data;
mod invoice;
mod lease;
mod node;
mod period;
mod price_book;
mod quote;
mod report;
mod reservation;
mod spot;
mod ssh_key;
mod template;
mod tenant;
#[cfg(test)]
mod test_parse;
mod workspace;

pub use audit::{
    AuditCommand, AuditEvents, AuditExport, AuditFilter, AuditReplay, AuditVerify, ExportFormat,
    DEFAULT_AUDIT_STREAM,
};
pub use balance::{BalanceCommand, BalanceShow, BalanceTopUp};
pub use billing::{BillingCommand, BillingWhatIf};
pub use cli::{Cli, Command, DEFAULT_GATEWAY_URL};
pub use data::{DataCommand, DataGet, DataList, DataPut, DataRemove, DataUsage};
pub use invoice::{InvoiceCommand, InvoiceShow};
pub use lease::{
    parse_port_spec, GpuAskArgs, LeaseCommand, LeaseCreate, LeaseExec, LeaseGet, LeaseList,
    LeaseLogs, LeaseOpen, LeasePortForward, LeaseShell, LeaseStop, PortSpec,
};
pub use node::{NodeCommand, NodeDrain, NodeId};
pub use price_book::{PriceBookCommand, PriceBookPublish};
pub use quote::QuoteCreate;
pub use report::{ReportColourBy, ReportCommand, ReportDaily};
pub use reservation::{ReservationCommand, ReservationCreate, ReservationList};
pub use spot::SpotCommand;
pub use ssh_key::{SshKeyAdd, SshKeyCommand, SshKeyList, SshKeyRemove};
pub use template::TemplateCommand;
pub use tenant::{
    KeyCommand, KeyCreate, KeyRevoke, TenantCommand, TenantCreate, TenantId, TenantSetQuota,
    TenantSuspend,
};
pub use workspace::{WorkspaceCommand, WorkspaceList, WorkspaceName, WorkspaceRestore};
