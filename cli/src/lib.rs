//! `lh`: the command-line client of Leasehold, the GPU leasing platform.
//!
//! Tenants use it to request GPU leases, watch them get queued, placed and
//! started, stop them, and read their monthly invoices; operators use it
//! (with the admin token as API key) to create tenants, to check that the
//! audit log's hash chain is intact, to read, replay and export the audit
//! records, and to draw a day of the fleet (`report daily`, see [`report`]).
//! It is a thin HTTP client of the gateway's `/v1` API: each command
//! is one request (or a short series, for `--all`, `--wait` and the audit
//! replay and exports, which page to the end), shown as a compact table or, with `--json`, as the gateway's
//! own JSON, pretty-printed.
//!
//! Three commands hold a session into a running lease instead, each over
//! a WebSocket at the gateway (docs/adr/030): `lease exec` runs a command
//! in the lease's workload with its output here (and, with `-i`, this
//! stdin; with `-t`, on this terminal, raw), `lease shell` opens a login
//! shell there, and `lease port-forward` relays a local TCP port to one in
//! the workload, a WebSocket per connection ([`forward`]). `lease open`
//! uses both to reach the web page of a lease made from a template: the
//! page's token read by an exec inside the lease, its port forwarded, the
//! URL printed ([`open`]).
//!
//! One command can also skip the gateway: `audit verify` with `--nats-url`
//! and a pinned `--public-key` reads the log from NATS itself (as the
//! read-only `auditor` user named by `LH_NATS_USER` and
//! `LH_NATS_NKEY_SEED_FILE`) and checks the chain and every signed
//! checkpoint against that key (see docs/audit.md, "Verifying without
//! trusting us").
//!
//! # Configuration
//!
//! | flag            | environment      | default                 |
//! |-----------------|------------------|-------------------------|
//! | `--gateway-url` | `LH_GATEWAY_URL` | `http://127.0.0.1:8080` |
//! | (none)          | `LH_API_KEY`     | none (no `Authorization`) |
//! | `--api-key-file`| `LH_API_KEY_FILE`| none                    |
//! | `--json`        |                  | off                     |
//!
//! The key is sent as `Authorization: Bearer <key>`. It is never taken
//! from the command line, where `ps` and shell history would show it:
//! `--api-key` is refused with a message saying what to use instead, and
//! giving both `LH_API_KEY` and a key file is refused as ambiguous.
//!
//! # Exit codes
//!
//! * [`EXIT_OK`] (0): success.
//! * [`EXIT_FAILURE`] (1): the answer is "no": `audit verify` found the chain
//!   broken; `lease get --wait` timed out or the lease ended or was rejected
//!   instead (the last lease view is still printed); stdout could not be written.
//! * [`EXIT_CLIENT_ERROR`] (2): bad arguments or configuration, a 4xx answer,
//!   or a log `audit verify` could not read from NATS.
//! * [`EXIT_SERVER_ERROR`] (3): a 5xx answer, an answer that is not the expected
//!   JSON, or the gateway could not be reached.
//!
//! `lease exec` and `lease shell` exit with the remote command's own code
//! once the session is open; before that (a refused upgrade) as above.
//! Besides the command's codes:
//!
//! * [`EXIT_SESSION_ERROR`] (255, as `ssh`): the session ended without the
//!   command's exit code: the gateway closed it (the close code and reason
//!   are printed), the connection was lost, or the command could not run.
//! * [`EXIT_INTERRUPTED`] (130): Ctrl-C, without `-t` (with it, Ctrl-C is
//!   the remote terminal's); [`EXIT_TERMINATED`] (143): SIGTERM.
//!
//! `lease port-forward` and `lease open` exit 0 on Ctrl-C or SIGTERM, 1
//! when the lease does not run (`lease open` also when it has no web page).
//!
//! Errors go to stderr as `error: <title>: <detail> (field: <field>)`, read
//! from the gateway's `application/problem+json` body.
//!
//! # Use from tests
//!
//! The binary is `main` calling [`run_with`] on the process' arguments and
//! stdio. Tests call the same code with their own arguments and buffers:
//!
//! ```no_run
//! # async fn demo() {
//! let out = lh_cli::capture([
//!     "lh", "--gateway-url", "http://127.0.0.1:18080", "--api-key-file", "/run/lh-key",
//!     "--json", "lease", "ls", "--all",
//! ])
//! .await;
//! assert_eq!(out.code, lh_cli::EXIT_OK, "stderr: {}", out.stderr);
//! let page: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
//! # }
//! ```
//!
//! * [`run_with`]`(args, &mut out, &mut err).await -> i32` writes to any
//!   `Write + Send` pair; [`capture`]`(args).await -> Captured` collects both
//!   into strings; [`run_blocking`] does the same from synchronous code (it
//!   runs its own runtime, on a separate thread if called inside one).
//! * [`run`] takes an already parsed [`Cli`] and returns `anyhow::Result<i32>`:
//!   `Ok(code)` for commands that ran, `Err` (see [`exit_code`]) for errors.
//! * `args` starts with the program name, as with `std::env::args`.
//!   Flags given in `args` override `LH_GATEWAY_URL` / `LH_API_KEY_FILE`,
//!   which are read from the process environment (as is `LH_API_KEY`); pass
//!   `--gateway-url` explicitly.
//! * `--json` output is exactly one pretty-printed JSON document on stdout:
//!   the gateway's answer, or for `lease ls --all` the merged
//!   `{"items":[...],"next_cursor":null}`.

mod api_key;
mod args;
mod audit;
mod audit_trail;
mod client;
mod commands;
mod error;
mod output;
mod render;
pub mod report;
mod terminal;

pub use api_key::MAX_KEY_FILE_BYTES;
pub use args::LeaseLogs;
pub use args::{parse_port_spec, LeaseExec, LeaseOpen, LeasePortForward, LeaseShell, PortSpec};
pub use args::{
    AuditCommand, AuditEvents, AuditExport, AuditFilter, AuditReplay, AuditVerify, BalanceCommand,
    BalanceShow, BalanceTopUp, BillingCommand, BillingWhatIf, Cli, Command, ExportFormat,
    InvoiceCommand, InvoiceShow, KeyCommand, KeyCreate, KeyRevoke, LeaseCommand, LeaseCreate,
    LeaseGet, LeaseList, LeaseStop, NodeCommand, NodeDrain, NodeId, PriceBookCommand,
    PriceBookPublish, QuoteCreate, ReportColourBy, ReportCommand, ReportDaily, ReservationCommand,
    ReservationCreate, ReservationList, SpotCommand, TemplateCommand, TenantCommand, TenantCreate,
    TenantId, TenantSetQuota, TenantSuspend, DEFAULT_AUDIT_STREAM, DEFAULT_GATEWAY_URL,
};
pub use args::{DataCommand, DataGet, DataList, DataPut, DataRemove, DataUsage};
pub use args::{SshKeyAdd, SshKeyCommand, SshKeyList, SshKeyRemove};
pub use args::{WorkspaceCommand, WorkspaceList, WorkspaceName, WorkspaceRestore};
pub use client::Gateway;
pub use commands::billing::WHAT_IF_REQUEST_TIMEOUT;
pub use commands::lease::{
    forward, open, EXIT_INTERRUPTED, EXIT_SESSION_ERROR, EXIT_TERMINATED, LOGS_POLL_INTERVAL,
    OPEN_WAIT, SHELL_COMMAND, WAIT_POLL_INTERVAL,
};
pub use commands::MAX_JSON_FILE_BYTES;
pub use error::{
    exit_code, CliError, Problem, EXIT_CLIENT_ERROR, EXIT_FAILURE, EXIT_OK, EXIT_SERVER_ERROR,
};
pub use output::Out;

use clap::Parser as _;
use std::ffi::OsString;
use std::io::Write;

use api_key::api_key;

/// Parses `args` (program name first) and runs the command, writing results
/// to `out` and errors and progress to `err`. Returns the exit code; never
/// panics on bad input. Help and `--version` go to `out` with code 0.
pub async fn run_with<I, T>(args: I, out: Out<'_>, err: Out<'_>) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let sink: &mut dyn Write = if e.use_stderr() { &mut *err } else { &mut *out };
            let _ = write!(sink, "{}", e.render());
            return e.exit_code();
        }
    };
    match run(cli, out, err).await {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(err, "error: {e:#}");
            exit_code(&e)
        }
    }
}

/// What one `lh` invocation printed, and its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// [`run_with`] into in-memory buffers.
pub async fn capture<I, T>(args: I) -> Captured
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_with(args, &mut out, &mut err).await;
    Captured {
        code,
        stdout: String::from_utf8_lossy(&out).into_owned(),
        stderr: String::from_utf8_lossy(&err).into_owned(),
    }
}

/// [`run_with`] for synchronous callers. Builds a single-threaded runtime;
/// when called from inside a Tokio runtime it runs on a scoped helper thread
/// (blocking the caller's thread meanwhile) instead of panicking.
pub fn run_blocking<I, T>(args: I, out: Out<'_>, err: Out<'_>) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let go = move || match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(run_with(args, out, err)),
        Err(e) => {
            let _ = writeln!(err, "error: cannot start the async runtime: {e}");
            EXIT_FAILURE
        }
    };
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| s.spawn(go).join().unwrap_or(EXIT_FAILURE))
    } else {
        go()
    }
}

/// Runs a parsed command. `Ok(code)` when the command ran (code 0, or 1 for a
/// negative answer such as a broken audit chain); `Err` for failures, whose
/// exit code [`exit_code`] gives (a [`CliError`] inside for gateway errors).
pub async fn run(cli: Cli, out: Out<'_>, err: Out<'_>) -> anyhow::Result<i32> {
    let key = api_key(&cli)?;
    let gw = Gateway::new(&cli.gateway_url, key.as_deref())?;
    let json = cli.json;
    match cli.command {
        Command::Tenant(command) => commands::tenant::run(&gw, command, json, out).await,
        Command::Lease(command) => commands::lease::run(&gw, command, json, out, err).await,
        Command::Node(command) => commands::node::run(&gw, command, json, out).await,
        Command::Invoice(command) => commands::invoice::run(&gw, command, json, out).await,
        Command::Report(command) => commands::report::run(&gw, command, json, out, err).await,
        Command::Billing(command) => commands::billing::run(&gw, command, json, out).await,
        Command::Spot(command) => commands::spot::run(&gw, command, json, out).await,
        Command::Gpus => {
            let catalogue = gw.get(&["v1", "gpus"], &[]).await?;
            output::emit(out, json, &catalogue, render::gpu_catalogue)?;
            Ok(EXIT_OK)
        }
        Command::SshKey(command) => commands::ssh_key::run(&gw, command, json, out).await,
        Command::Data(command) => commands::data::run(&gw, command, json, out, err).await,
        Command::Workspace(command) => commands::workspace::run(&gw, command, json, out).await,
        Command::Template(command) => commands::template::run(&gw, command, json, out).await,
        Command::PriceBook(command) => commands::price_book::run(&gw, command, json, out).await,
        Command::Reservation(command) => commands::reservation::run(&gw, command, json, out).await,
        Command::Quote(q) => commands::quote::run(&gw, q, json, out).await,
        Command::Balance(command) => commands::balance::run(&gw, command, json, out).await,
        Command::Audit(command) => commands::audit::run(&gw, command, json, out, err).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn usage_errors_exit_2_without_network() {
        let out = capture(["lh", "lease", "create", "--gpus", "0", "--gpu-model", "x"]).await;
        assert_eq!(out.code, EXIT_CLIENT_ERROR);
        assert!(out.stdout.is_empty());
        assert!(out.stderr.contains("--gpus"), "{}", out.stderr);

        let out = capture(["lh", "--gateway-url", "not a url", "audit", "verify"]).await;
        assert_eq!(out.code, EXIT_CLIENT_ERROR);
        assert!(
            out.stderr
                .starts_with("error: invalid gateway URL `not a url`"),
            "{}",
            out.stderr
        );
    }

    #[tokio::test]
    async fn help_and_version_go_to_stdout() {
        let out = capture(["lh", "--help"]).await;
        assert_eq!(out.code, EXIT_OK);
        assert!(out.stdout.contains("lease"), "{}", out.stdout);
        let out = capture(["lh", "--version"]).await;
        assert_eq!(out.code, EXIT_OK);
        assert!(out.stdout.starts_with("lh "));
    }

    #[test]
    fn run_blocking_works_inside_and_outside_a_runtime() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(
            run_blocking(["lh", "--version"], &mut out, &mut err),
            EXIT_OK
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let code = rt.block_on(async {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            run_blocking(["lh", "--version"], &mut out, &mut err)
        });
        assert_eq!(code, EXIT_OK);
    }
}
