use clap::Parser;
use lh_service::ProjectionCommand;

/// Leasehold REST gateway. Flags of the service go before the subcommand,
/// or come from the environment.
#[derive(Parser)]
#[command(name = "lh-gateway")]
struct Cli {
    #[command(flatten)]
    config: lh_gateway::Config,
    #[command(subcommand)]
    command: Option<ProjectionCommand>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    lh_service::init_process("lh-gateway");
    match cli.command.unwrap_or(ProjectionCommand::Run) {
        ProjectionCommand::Run => {
            lh_gateway::start(cli.config, lh_service::shutdown_on_signal())
                .await?
                .wait()
                .await
        }
        ProjectionCommand::Rebuild(args) => {
            let into = args.into_schema(&cli.config.schema);
            let progress = lh_service::rebuild_progress();
            let report = lh_gateway::rebuild(&cli.config, &into, args.swap, progress).await?;
            lh_service::report_rebuild(&report)
        }
    }
}
