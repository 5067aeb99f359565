//! The flags of `lh template ...`.

use clap::Subcommand;

/// `lh template ...`
#[derive(Debug, Clone, Subcommand)]
pub enum TemplateCommand {
    /// The workload templates the gateway offers: `lh lease create
    /// --template NAME` runs one, `lh lease open` reaches its web page.
    #[command(visible_alias = "list")]
    Ls,
}
