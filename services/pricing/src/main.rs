use clap::{Parser, Subcommand};
use lh_pricing::Config;

/// Leasehold pricing: charges and invoices.
///
/// Flags of the service (`--database-url`, `--nats-url`, …) go before the
/// subcommand, or come from the environment.
#[derive(Parser, Debug)]
#[command(name = "lh-pricing")]
struct Cli {
    #[command(flatten)]
    config: Config,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the service (the default).
    Run,
    /// Replay the log from sequence 1 into a fresh schema and compare it
    /// with the live one; fails when they differ (without --swap).
    Rebuild(lh_service::RebuildArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    lh_service::init_process("lh-pricing");
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => {
            lh_pricing::start(cli.config, lh_service::shutdown_on_signal())
                .await?
                .wait()
                .await
        }
        Command::Rebuild(args) => {
            let into = args.into_schema(&cli.config.schema);
            let report = lh_pricing::rebuild(
                &cli.config,
                &into,
                args.swap,
                lh_service::rebuild_progress(),
            )
            .await?;
            lh_service::report_rebuild(&report)
        }
    }
}
