use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "lh-gateway", about = "Leasehold REST gateway")]
struct Cli {
    #[command(flatten)]
    config: lh_gateway::Config,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API (the default).
    Run,
    /// Replay the log from sequence 1 into a fresh schema and compare.
    Rebuild(lh_service::RebuildArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    lh_service::init_process("lh-gateway");
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => {
            lh_gateway::start(cli.config, lh_service::shutdown_on_signal())
                .await?
                .wait()
                .await
        }
        Command::Rebuild(args) => {
            let into = args.into_schema(&cli.config.schema);
            let report = lh_gateway::rebuild(
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
