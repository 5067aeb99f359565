//! `lh-audit` runs the audit service; `lh-audit init-keys DIR` is the
//! deployment's init step that makes the keys the service is then handed
//! read-only. One binary serves both so an image ships a single program.

use clap::{CommandFactory as _, FromArgMatches as _};
use lh_audit::keys::InitKeys;
use lh_audit::Config;

/// The init step's subcommand; without a subcommand the binary is the service.
const INIT_KEYS: &str = "init-keys";

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut command = Config::command()
        .subcommand(InitKeys::command().name(INIT_KEYS))
        // The init step runs before the service's settings exist: it takes
        // none of them and must not demand the required ones.
        .args_conflicts_with_subcommands(true)
        .subcommand_negates_reqs(true)
        .disable_help_subcommand(true);
    let mut matches = command.get_matches_mut();
    if let Some(init) = matches.subcommand_matches(INIT_KEYS) {
        let init =
            InitKeys::from_arg_matches(init).unwrap_or_else(|e| e.format(&mut command).exit());
        return match init.run() {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lh-audit {INIT_KEYS}: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let config = Config::from_arg_matches_mut(&mut matches)
        .unwrap_or_else(|e| e.format(&mut command).exit());
    lh_service::run_service(config).await
}
