//! `lh`: command-line client of the Leasehold gateway. All logic lives in
//! the `lh_cli` library; see its documentation.

use std::process::ExitCode;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let code = lh_cli::run_with(std::env::args_os(), &mut stdout, &mut stderr).await;
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
