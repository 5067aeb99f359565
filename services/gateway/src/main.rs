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
    Rebuild {
        /// Schema to rebuild into.
        #[arg(long, default_value = "gateway_rebuild")]
        into: String,
        /// Replace the live schema with the rebuilt one.
        #[arg(long)]
        swap: bool,
    },
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
        Command::Rebuild { into, swap } => {
            let mut differ = false;
            for c in lh_gateway::rebuild(&cli.config, &into, swap).await? {
                let same = c.live == c.rebuilt;
                differ |= !same;
                println!(
                    "{:<10} live rows={:<8} rebuilt rows={:<8} {}",
                    c.table,
                    c.live.0,
                    c.rebuilt.0,
                    if same { "identical" } else { "DIFFERENT" }
                );
            }
            if differ && !swap {
                anyhow::bail!("rebuilt tables differ from the live ones");
            }
            Ok(())
        }
    }
}
