use clap::{Parser, Subcommand};
use lh_pricing::{Config, DEFAULT_REBUILD_SCHEMA};

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
    /// Replay the log from sequence 1 into a fresh schema and compare its
    /// digest with the live one; exits 2 when they differ (without --swap).
    Rebuild {
        /// Schema to rebuild into; dropped first.
        #[arg(long, default_value = DEFAULT_REBUILD_SCHEMA)]
        into: String,
        /// Replace the live schema by the rebuilt one (stop the service first).
        #[arg(long)]
        swap: bool,
    },
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
        Command::Rebuild { into, swap } => rebuild(&cli.config, &into, swap).await,
    }
}

async fn rebuild(config: &Config, into: &str, swap: bool) -> anyhow::Result<()> {
    let mut count = 0u64;
    let reached = lh_pricing::rebuild(config, into, |sequence, head| {
        count += 1;
        if count.is_multiple_of(1000) {
            eprintln!("rebuilt {count} events (sequence {sequence} of {head})");
        }
    })
    .await?;
    eprintln!("rebuilt {count} events up to sequence {reached}");
    let live = config.schema.as_str();
    let digests = lh_pricing::digests(&config.database_url, &[live, into]).await?;
    let table = lh_pricing::projection::TABLE;
    for (schema, (rows, digest)) in [live, into].iter().zip(&digests) {
        println!("{schema}.{table}: {rows} rows, md5 {digest}");
    }
    let equal = digests[0] == digests[1];
    println!(
        "{}",
        if equal {
            "digests equal"
        } else {
            "digests DIFFER"
        }
    );
    if swap {
        lh_projection::swap_schemas(&config.database_url, live, into).await?;
        println!("schema {into} is now the live schema {live}");
    } else if !equal {
        std::process::exit(2);
    }
    Ok(())
}
