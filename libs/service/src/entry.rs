//! The whole `main` of every service, in two shapes: a service parses its
//! flags, starts, and runs until a signal; a service that owns a projection
//! may instead rebuild it (the `rebuild` subcommand). Either way a failure
//! ends the process with status 1 and one line on stderr that an operator
//! can act on (NVML missing, a database that refuses the password), rather
//! than a debug dump.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use crate::{init_process, shutdown_on_signal, Running};

/// A long-running service, started from its configuration.
pub trait Service: Sized {
    /// The binary's name (`lh-scheduler`), for its `--help`, its logs and
    /// its errors.
    const NAME: &'static str;

    fn start(
        self,
        shutdown: CancellationToken,
    ) -> impl std::future::Future<Output = anyhow::Result<Running>>;
}

/// The whole `main` of a service without a projection.
pub async fn service_main<S: Service + clap::Parser>() -> ExitCode {
    run_service(S::parse()).await
}

/// Runs a service from its parsed configuration until a signal stops it.
pub async fn run_service<S: Service>(config: S) -> ExitCode {
    init_process(S::NAME);
    let run = async { config.start(shutdown_on_signal()).await?.wait().await };
    exit_code(S::NAME, run.await)
}

fn exit_code(name: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "{name} failed");
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Subcommands of a service that owns a projection.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum ProjectionCommand {
    /// Run the service (the default).
    Run,
    /// Replay the log from sequence 1 into a fresh schema and compare it
    /// with the live one; fails when they differ (without --swap).
    Rebuild(RebuildArgs),
}

/// The `rebuild` subcommand shared by every service that owns a projection.
#[derive(clap::Args, Debug, Clone)]
pub struct RebuildArgs {
    /// Schema to rebuild into; dropped first (default: `<live schema>_rebuild`).
    #[arg(long)]
    pub into: Option<String>,
    /// Replace the live schema by the rebuilt one (stop the service first).
    #[arg(long)]
    pub swap: bool,
}

impl RebuildArgs {
    pub fn into_schema(&self, live: &str) -> String {
        self.into
            .clone()
            .unwrap_or_else(|| format!("{live}_rebuild"))
    }
}

/// Progress of a rebuild on stderr: every 1,000 events and at the head.
pub fn rebuild_progress() -> impl FnMut(u64, u64) {
    let mut applied = 0u64;
    move |sequence, head| {
        applied += 1;
        if applied.is_multiple_of(1000) || sequence == head {
            eprintln!("rebuild: {applied} events applied (sequence {sequence} of {head})");
        }
    }
}

/// Prints how the rebuilt tables compare; an error when they differ and
/// were not swapped in.
pub fn report_rebuild(report: &lh_projection::RebuildReport) -> anyhow::Result<()> {
    for t in &report.tables {
        println!(
            "{:<16} live rows={:<8} rebuilt rows={:<8} {}",
            t.table,
            t.live.0,
            t.rebuilt.0,
            if t.identical() {
                "identical"
            } else {
                "DIFFERENT"
            }
        );
    }
    println!(
        "rebuilt {} up to sequence {}",
        report.rebuilt_schema, report.reached
    );
    if report.swapped {
        println!(
            "schema {} is now the live schema {}",
            report.rebuilt_schema, report.live_schema
        );
    } else if !report.identical() {
        anyhow::bail!(
            "the rebuilt tables differ from the live ones in {}",
            report.live_schema
        );
    }
    Ok(())
}

/// A service that owns a projection: it runs, or rebuilds its projection
/// into a fresh schema (the `rebuild` subcommand).
pub trait ProjectionService: Service + clap::Args {
    /// One line for `--help`.
    const ABOUT: &'static str;

    /// The schema of the live projection.
    fn schema(&self) -> &str;

    fn rebuild(
        &self,
        into: &str,
        swap: bool,
        on_event: impl FnMut(u64, u64),
    ) -> impl std::future::Future<Output = anyhow::Result<lh_projection::RebuildReport>>;
}

/// The command line of a service that owns a projection: flags of the
/// service (or their environment variables), then an optional subcommand.
#[derive(clap::Parser, Debug)]
struct ProjectionCli<S: clap::Args> {
    #[command(flatten)]
    config: S,
    #[command(subcommand)]
    command: Option<ProjectionCommand>,
}

/// The whole `main` of a service that owns a projection.
pub async fn projection_main<S: ProjectionService>() -> ExitCode {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let matches = ProjectionCli::<S>::command()
        .name(S::NAME)
        .about(S::ABOUT)
        .get_matches();
    let cli = ProjectionCli::<S>::from_arg_matches(&matches)
        .unwrap_or_else(|e| e.format(&mut ProjectionCli::<S>::command()).exit());
    match cli.command.unwrap_or(ProjectionCommand::Run) {
        ProjectionCommand::Run => run_service(cli.config).await,
        ProjectionCommand::Rebuild(args) => {
            init_process(S::NAME);
            let into = args.into_schema(cli.config.schema());
            let rebuilt = async {
                let report = cli
                    .config
                    .rebuild(&into, args.swap, rebuild_progress())
                    .await?;
                report_rebuild(&report)
            };
            exit_code(S::NAME, rebuilt.await)
        }
    }
}
