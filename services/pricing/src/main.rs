use clap::Parser;
use lh_service::ProjectionCommand;

/// Leasehold pricing: charges and invoices. Flags of the service
/// (`--database-url`, `--nats-url`, …) go before the subcommand, or come
/// from the environment.
#[derive(Parser, Debug)]
#[command(name = "lh-pricing")]
struct Cli {
    #[command(flatten)]
    config: lh_pricing::Config,
    #[command(subcommand)]
    command: Option<ProjectionCommand>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    lh_service::init_process("lh-pricing");
    match cli.command.unwrap_or(ProjectionCommand::Run) {
        ProjectionCommand::Run => {
            lh_pricing::start(cli.config, lh_service::shutdown_on_signal())
                .await?
                .wait()
                .await
        }
        ProjectionCommand::Rebuild(args) => {
            let into = args.into_schema(&cli.config.schema);
            let progress = lh_service::rebuild_progress();
            let report = lh_pricing::rebuild(&cli.config, &into, args.swap, progress).await?;
            lh_service::report_rebuild(&report)
        }
    }
}
