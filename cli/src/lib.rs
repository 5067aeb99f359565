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

mod args;
mod audit;
mod audit_trail;
mod client;
mod error;
mod render;
pub mod report;

pub use args::LeaseLogs;
pub use args::{
    AuditCommand, AuditEvents, AuditExport, AuditFilter, AuditReplay, AuditVerify, BalanceCommand,
    BalanceShow, BalanceTopUp, BillingCommand, BillingWhatIf, Cli, Command, DrainMode,
    ExportFormat, IdleAction, InvoiceCommand, InvoiceShow, KeyCommand, KeyCreate, KeyRevoke,
    LeaseCommand, LeaseCreate, LeaseGet, LeaseList, LeaseState, LeaseStop, NodeCommand, NodeDrain,
    NodeId, PriceBookCommand, PriceBookPublish, QuoteCreate, ReportColourBy, ReportCommand,
    ReportDaily, ReservationCommand, ReservationCreate, ReservationList, SpotCommand,
    TenantCommand, TenantCreate, TenantId, TenantSetQuota, TenantSuspend, Tier,
    DEFAULT_AUDIT_STREAM, DEFAULT_GATEWAY_URL,
};
pub use client::Gateway;
pub use error::{
    exit_code, CliError, Problem, EXIT_CLIENT_ERROR, EXIT_FAILURE, EXIT_OK, EXIT_SERVER_ERROR,
};

use anyhow::Context as _;
use clap::Parser as _;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::ffi::OsString;
use std::io::Write;
use std::time::Duration;
use tokio::time::Instant;

/// How often `lease get --wait` polls.
pub const WAIT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// How long `billing what-if` waits for its answer: the gateway gives
/// pricing two minutes to read the month.
pub const WHAT_IF_REQUEST_TIMEOUT: Duration = Duration::from_secs(150);

/// Largest key file read, in bytes.
pub const MAX_KEY_FILE_BYTES: u64 = 8 * 1024;

/// The key to call with: from the key file (`--api-key-file` or
/// `LH_API_KEY_FILE`) or `LH_API_KEY`, never from the command line.
fn api_key(cli: &Cli) -> Result<Option<String>, CliError> {
    if cli.api_key.is_some() {
        return Err(CliError::Usage(
            "--api-key is no longer accepted: a key on the command line shows in `ps` and \
             shell history. Set LH_API_KEY, or put the key in a file and pass \
             --api-key-file PATH (or set LH_API_KEY_FILE)"
                .into(),
        ));
    }
    let from_env = std::env::var("LH_API_KEY")
        .ok()
        .filter(|k| !k.trim().is_empty());
    let Some(path) = &cli.api_key_file else {
        return Ok(from_env);
    };
    if from_env.is_some() {
        return Err(CliError::Usage(
            "both LH_API_KEY and a key file (--api-key-file or LH_API_KEY_FILE) are set; \
             keep one"
                .into(),
        ));
    }
    let unreadable = |e: std::io::Error| {
        CliError::Usage(format!("cannot read the key file {}: {e}", path.display()))
    };
    let len = std::fs::metadata(path).map_err(unreadable)?.len();
    if len > MAX_KEY_FILE_BYTES {
        return Err(CliError::Usage(format!(
            "the key file {} is larger than {MAX_KEY_FILE_BYTES} bytes",
            path.display()
        )));
    }
    let key = std::fs::read_to_string(path).map_err(unreadable)?;
    let key = key.trim();
    if key.is_empty() {
        return Err(CliError::Usage(format!(
            "the key file {} is empty",
            path.display()
        )));
    }
    Ok(Some(key.to_string()))
}

/// Most pages `lease ls --all` follows before giving up on the gateway.
const MAX_PAGES: usize = 10_000;

/// Output sink: anything writable that may cross threads.
pub type Out<'a> = &'a mut (dyn Write + Send);

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
        Command::Tenant(TenantCommand::Create(t)) => {
            let mut body = json!({
                "name": t.name,
                "email": t.email,
                "quota": {"max_gpus": t.max_gpus},
            });
            if let (Some(window_s), Some(action)) = (t.idle_window_secs, t.idle_action) {
                body["idle_policy"] = json!({"window_s": window_s, "action": action.as_str()});
            }
            if t.trusted {
                body["trusted"] = json!(true);
            }
            let tenant = gw.post(&["v1", "tenants"], Some(&body), &[]).await?;
            emit(out, json, &tenant, render::tenant_created)?;
            Ok(EXIT_OK)
        }
        Command::Tenant(TenantCommand::Get(t)) => {
            let tenant = gw.get(&["v1", "tenants", &t.id], &[]).await?;
            emit(out, json, &tenant, render::tenant_view)?;
            Ok(EXIT_OK)
        }
        Command::Tenant(TenantCommand::Suspend(t)) => {
            let mut body = json!({"stop_leases": t.stop_leases});
            if let Some(reason) = &t.reason {
                body["reason"] = json!(reason);
            }
            let changed = gw
                .post(&["v1", "tenants", &t.id, "suspend"], Some(&body), &[])
                .await?;
            emit(out, json, &changed, render::tenant_changed)?;
            Ok(EXIT_OK)
        }
        Command::Tenant(TenantCommand::Resume(t)) => {
            let changed = gw
                .post(&["v1", "tenants", &t.id, "resume"], None, &[])
                .await?;
            emit(out, json, &changed, render::tenant_changed)?;
            Ok(EXIT_OK)
        }
        Command::Tenant(TenantCommand::Erase(t)) => {
            let tenant = gw
                .post(&["v1", "tenants", &t.id, "erase"], None, &[])
                .await?;
            emit(out, json, &tenant, render::tenant_view)?;
            Ok(EXIT_OK)
        }
        Command::Tenant(TenantCommand::SetQuota(q)) => {
            let mut body = json!({"quota": {"max_gpus": q.max_gpus}});
            if let Some(vram) = q.max_vram_gb {
                body["quota"]["max_vram_gb"] = json!(vram);
            }
            if let Some(weight) = q.weight {
                body["weight"] = json!(weight);
            }
            let tenant = gw.put(&["v1", "tenants", &q.id, "quota"], &body).await?;
            emit(out, json, &tenant, render::tenant_view)?;
            Ok(EXIT_OK)
        }
        Command::Tenant(TenantCommand::Key(KeyCommand::Create(k))) => {
            let mut body = json!({});
            if let Some(at) = &k.expires_at {
                body["expires_at"] = json!(at);
            }
            let key = gw
                .post(&["v1", "tenants", &k.id, "keys"], Some(&body), &[])
                .await?;
            emit(out, json, &key, render::key_issued)?;
            Ok(EXIT_OK)
        }
        Command::Tenant(TenantCommand::Key(KeyCommand::Ls(t))) => {
            let keys = gw.get(&["v1", "tenants", &t.id, "keys"], &[]).await?;
            emit(out, json, &keys, render::key_list)?;
            Ok(EXIT_OK)
        }
        Command::Tenant(TenantCommand::Key(KeyCommand::Revoke(k))) => {
            let key = gw
                .delete(&["v1", "tenants", &k.id, "keys", &k.key_id.to_string()])
                .await?;
            emit(out, json, &key, render::key_view)?;
            Ok(EXIT_OK)
        }
        Command::Lease(LeaseCommand::Create(c)) => {
            let mut body = json!({
                "gpu_model": c.gpu_model,
                "tier": c.tier.as_str(),
                "priority": c.priority,
            });
            gpu_fields(&mut body, &c.ask);
            if let Some(quote) = &c.quote {
                body["quote_id"] = json!(quote);
            }
            if let Some(price) = &c.max_price {
                body["max_price_cny_per_gpu_hour"] = json!(price);
            }
            if !c.zones.is_empty() {
                body["zones"] = json!(c.zones);
            }
            if !c.regions.is_empty() {
                body["regions"] = json!(c.regions);
            }
            if let Some(max_retries) = c.max_retries {
                body["recovery"] =
                    json!({"max_retries": max_retries, "zone_first": c.zone_first.as_str()});
            }
            if !c.command.is_empty() || c.image.is_some() || !c.env.is_empty() {
                let env: serde_json::Map<String, Value> =
                    c.env.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                body["workload"] = json!({"command": c.command, "image": c.image, "env": env});
                if c.image.is_none() {
                    body["workload"].as_object_mut().unwrap().remove("image");
                }
            }
            let headers: Vec<(&str, &str)> = c
                .idempotency_key
                .as_deref()
                .map(|k| ("Idempotency-Key", k))
                .into_iter()
                .collect();
            let lease = gw.post(&["v1", "leases"], Some(&body), &headers).await?;
            emit(out, json, &lease, render::lease_view)?;
            Ok(EXIT_OK)
        }
        Command::Lease(LeaseCommand::Get(g)) => match g.wait {
            None => {
                let lease = gw.get(&["v1", "leases", &g.id], &[]).await?;
                emit(out, json, &lease, render::lease_view)?;
                Ok(EXIT_OK)
            }
            Some(target) => {
                let timeout = Duration::from_secs(g.timeout);
                let (lease, code) = wait_for(&gw, &g.id, target, timeout, err).await?;
                emit(out, json, &lease, render::lease_view)?;
                Ok(code)
            }
        },
        Command::Lease(LeaseCommand::Ls(l)) => list_leases(&gw, &l, json, out).await,
        Command::Lease(LeaseCommand::Stop(s)) => {
            let lease = gw.post(&["v1", "leases", &s.id, "stop"], None, &[]).await?;
            emit(out, json, &lease, render::lease_view)?;
            Ok(EXIT_OK)
        }
        Command::Lease(LeaseCommand::Usage(u)) => {
            let step = u.step.map(|s| s.to_string());
            let query: Vec<(&str, &str)> = [
                ("from", u.from.as_deref()),
                ("to", u.to.as_deref()),
                ("step", step.as_deref()),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect();
            let usage = gw.get(&["v1", "leases", &u.id, "usage"], &query).await?;
            emit(out, json, &usage, render::lease_usage)?;
            Ok(EXIT_OK)
        }
        Command::Lease(LeaseCommand::Logs(l)) => lease_logs(&gw, &l, out, err).await,
        Command::Lease(LeaseCommand::Resume(s)) => {
            let lease = gw
                .post(&["v1", "leases", &s.id, "resume"], None, &[])
                .await?;
            emit(out, json, &lease, render::lease_view)?;
            Ok(EXIT_OK)
        }
        Command::Node(NodeCommand::Drain(d)) => {
            let mut body = json!({"mode": d.mode.as_str()});
            if let Some(reason) = &d.reason {
                body["reason"] = json!(reason);
            }
            let node = gw
                .post(&["v1", "nodes", &d.id, "drain"], Some(&body), &[])
                .await?;
            emit(out, json, &node, render::node_cordon)?;
            Ok(EXIT_OK)
        }
        Command::Node(NodeCommand::Uncordon(n)) => {
            let node = gw
                .post(&["v1", "nodes", &n.id, "uncordon"], None, &[])
                .await?;
            emit(out, json, &node, render::node_cordon)?;
            Ok(EXIT_OK)
        }
        Command::Invoice(InvoiceCommand::Ls(l)) => {
            let limit = l.limit.map(|n| n.to_string());
            let query: Vec<(&str, &str)> = [
                ("period", l.period.as_deref()),
                ("status", l.status.as_deref()),
                ("tenant_id", l.tenant.as_deref()),
                ("limit", limit.as_deref()),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect();
            let list = gw.get(&["v1", "invoices"], &query).await?;
            emit(out, json, &list, render::invoice_list)?;
            Ok(EXIT_OK)
        }
        Command::Invoice(InvoiceCommand::Show(i)) => {
            let query: Vec<(&str, &str)> =
                i.tenant.iter().map(|t| ("tenant_id", t.as_str())).collect();
            let invoice = gw.get(&["v1", "invoices", i.target()], &query).await?;
            emit(out, json, &invoice, render::invoice)?;
            Ok(EXIT_OK)
        }
        Command::Invoice(InvoiceCommand::Export(i)) => {
            let query: Vec<(&str, &str)> =
                i.tenant.iter().map(|t| ("tenant_id", t.as_str())).collect();
            let csv = gw
                .get_text(&["v1", "invoices", i.target(), "csv"], &query)
                .await?;
            write_out(out, &csv)?;
            Ok(EXIT_OK)
        }
        Command::Report(ReportCommand::Cost(r)) => {
            let mut query = vec![("week", r.week.as_str())];
            if let Some(tenant) = &r.tenant {
                query.push(("tenant_id", tenant.as_str()));
            }
            let report = gw.get(&["v1", "reports", "cost"], &query).await?;
            if r.csv {
                write_out(out, &render::cost_report_csv(&report))?;
            } else {
                emit(out, json, &report, render::cost_report)?;
            }
            Ok(EXIT_OK)
        }
        Command::Report(ReportCommand::Daily(d)) => report::daily(&gw, &d, json, out, err).await,
        Command::Billing(BillingCommand::WhatIf(w)) => {
            let book = read_json_file(&w.book)?;
            if !book.is_object() {
                return Err(CliError::Usage(format!(
                    "{} must hold a price book, a JSON object: {{\"version\"?, \"tiers\": [...]}}",
                    w.book.display()
                ))
                .into());
            }
            let body = json!({"period": w.period, "book": book});
            let report = gw
                .post_slow(
                    &["v1", "billing", "what-if"],
                    &body,
                    WHAT_IF_REQUEST_TIMEOUT,
                )
                .await
                .map_err(|e| match e {
                    // A field of the book is one of the file's.
                    CliError::Api(mut p)
                        if p.field.as_deref().is_some_and(|f| f.starts_with("book.")) =>
                    {
                        p.field = p
                            .field
                            .map(|f| format!("{} in {}", &f["book.".len()..], w.book.display()));
                        CliError::Api(p)
                    }
                    other => other,
                })?;
            if w.csv {
                write_out(out, &render::what_if_csv(&report))?;
            } else {
                emit(out, json, &report, render::what_if)?;
            }
            Ok(EXIT_OK)
        }
        Command::Spot(SpotCommand::Prices(p)) => {
            let history = p.history.to_string();
            let mut query = vec![("history", history.as_str())];
            if let Some(zone) = &p.zone {
                query.push(("zone", zone.as_str()));
            }
            if let Some(model) = &p.gpu_model {
                query.push(("gpu_model", model.as_str()));
            }
            let prices = gw.get(&["v1", "spot", "prices"], &query).await?;
            emit(out, json, &prices, render::spot_prices)?;
            Ok(EXIT_OK)
        }
        Command::PriceBook(PriceBookCommand::Ls) => {
            let books = gw.get(&["v1", "price-books"], &[]).await?;
            emit(out, json, &books, render::price_books)?;
            Ok(EXIT_OK)
        }
        Command::PriceBook(PriceBookCommand::Publish(p)) => {
            let body = read_json_file(&p.file)?;
            let published = gw.post(&["v1", "price-books"], Some(&body), &[]).await?;
            emit(out, json, &published, render::audit)?;
            Ok(EXIT_OK)
        }
        Command::Reservation(ReservationCommand::Ls(r)) => {
            let query: Vec<(&str, &str)> =
                r.tenant.iter().map(|t| ("tenant_id", t.as_str())).collect();
            let list = gw.get(&["v1", "reservations"], &query).await?;
            emit(out, json, &list, render::reservations)?;
            Ok(EXIT_OK)
        }
        Command::Reservation(ReservationCommand::Create(r)) => {
            let mut body = json!({
                "tenant_id": r.tenant, "gpu_model": r.gpu_model, "zone": r.zone, "gpus": r.gpus
            });
            if let Some(days) = r.term_days {
                body["term_days"] = json!(days);
            }
            let made = gw.post(&["v1", "reservations"], Some(&body), &[]).await?;
            emit(
                out,
                json,
                &json!({"reservations": [made]}),
                render::reservations,
            )?;
            Ok(EXIT_OK)
        }
        Command::Quote(q) => {
            if !(q.hours > 0.0 && q.hours <= 366.0 * 24.0) {
                return Err(CliError::Usage(
                    "--hours must be above 0 and at most 8784 (366 days)".into(),
                )
                .into());
            }
            let mut body = json!({
                "gpu_model": q.gpu_model,
                "tier": q.tier.as_str(),
                "duration_seconds": (q.hours * 3600.0).round() as u64,
            });
            gpu_fields(&mut body, &q.ask);
            let quote = gw.post(&["v1", "quotes"], Some(&body), &[]).await?;
            emit(out, json, &quote, render::quote)?;
            Ok(EXIT_OK)
        }
        Command::Balance(BalanceCommand::Show(b)) => {
            let balance = gw
                .get(&["v1", "tenants", &b.tenant, "balance"], &[])
                .await?;
            emit(out, json, &balance, render::balance)?;
            Ok(EXIT_OK)
        }
        Command::Balance(BalanceCommand::TopUp(b)) => {
            let body = json!({ "amount": b.amount });
            let path = ["v1", "tenants", &b.tenant, "balance", "top-ups"];
            let made = gw.post(&path, Some(&body), &[]).await?;
            emit(out, json, &made, render::top_up)?;
            Ok(EXIT_OK)
        }
        Command::Audit(AuditCommand::Verify(v)) if audit::reads_the_log(&v)? => {
            let report = audit::verify_stream(&v, err).await?;
            let value = serde_json::to_value(&report)?;
            emit(out, json, &value, render::audit)?;
            if report.ok {
                if let Some(path) = &v.save_state {
                    audit::save_state(path, &report)?;
                }
                Ok(EXIT_OK)
            } else {
                let why = match (&report.first_bad, &report.problem) {
                    (Some(bad), _) => format!(
                        "the checkpoint at stream sequence {} signing sequence {} fails: {}",
                        bad.checkpoint_at,
                        bad.sequence,
                        serde_json::to_value(bad.reason)?
                            .as_str()
                            .unwrap_or_default()
                    ),
                    (None, Some(problem)) => problem.clone(),
                    (None, None) => "not ok".into(),
                };
                let _ = writeln!(err, "error: audit chain verification failed: {why}");
                Ok(EXIT_FAILURE)
            }
        }
        Command::Audit(AuditCommand::Verify(_)) => {
            let report = gw.get(&["v1", "audit", "verify"], &[]).await?;
            emit(out, json, &report, render::audit)?;
            if report.get("ok").and_then(Value::as_bool) == Some(true) {
                Ok(EXIT_OK)
            } else {
                let _ = writeln!(err, "error: audit chain verification failed");
                Ok(EXIT_FAILURE)
            }
        }
        Command::Audit(AuditCommand::Events(e)) => audit_trail::events(&gw, &e, json, out).await,
        Command::Audit(AuditCommand::Replay(r)) => audit_trail::replay(&gw, &r, out).await,
        Command::Audit(AuditCommand::Export(x)) => audit_trail::export(&gw, &x, out).await,
    }
}

/// Prints `value` as pretty JSON or through `table`.
fn emit(
    out: Out<'_>,
    json: bool,
    value: &Value,
    table: fn(&Value) -> String,
) -> anyhow::Result<()> {
    if json {
        let mut text = serde_json::to_string_pretty(value)?;
        text.push('\n');
        write_out(out, &text)
    } else {
        write_out(out, &table(value))
    }
}

/// Largest JSON file a command sends: what the gateway takes as a body.
pub const MAX_JSON_FILE_BYTES: u64 = 64 * 1024;

/// A JSON file to send as a body, refused before anything is sent when it
/// is too large or not JSON.
fn read_json_file(path: &std::path::Path) -> Result<Value, CliError> {
    let unreadable =
        |e: std::io::Error| CliError::Usage(format!("cannot read {}: {e}", path.display()));
    let size = std::fs::metadata(path).map_err(unreadable)?.len();
    if size > MAX_JSON_FILE_BYTES {
        return Err(CliError::Usage(format!(
            "{} is larger than {MAX_JSON_FILE_BYTES} bytes",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    serde_json::from_str(&text)
        .map_err(|e| CliError::Usage(format!("{} is not JSON: {e}", path.display())))
}

fn write_out(out: Out<'_>, text: &str) -> anyhow::Result<()> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("cannot write output")
}

/// `lease ls`: one page, or with `--all` every page from the cursor on.
async fn list_leases(gw: &Gateway, l: &LeaseList, json: bool, out: Out<'_>) -> anyhow::Result<i32> {
    let limit = l.limit.map(|n| n.to_string());
    let mut cursor = l.cursor.clone();
    let mut seen: HashSet<String> = cursor.iter().cloned().collect();
    let mut items = Vec::new();
    for _ in 0..MAX_PAGES {
        let mut query = Vec::new();
        if let Some(limit) = &limit {
            query.push(("limit", limit.as_str()));
        }
        if let Some(c) = &cursor {
            query.push(("cursor", c.as_str()));
        }
        let page = gw.get(&["v1", "leases"], &query).await?;
        let bad = |reason: &str| CliError::BadResponse {
            url: gw.url(&["v1", "leases"], &query).to_string(),
            reason: reason.to_string(),
        };
        let page_items = page
            .get("items")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no `items` array in the lease list"))?;
        let next = page
            .get("next_cursor")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
            .map(str::to_string);

        if !l.all {
            if json {
                emit(out, true, &page, render::lease_view)?;
            } else {
                let mut table = render::lease_list(page_items);
                if let Some(next) = &next {
                    table.push_str(&format!(
                        "\nmore: lh lease ls --cursor {next}  (or --all)\n"
                    ));
                }
                write_out(out, &table)?;
            }
            return Ok(EXIT_OK);
        }

        items.extend(page_items.iter().cloned());
        match next {
            None => {
                let all = json!({"items": items, "next_cursor": null});
                emit(out, json, &all, |v| {
                    render::lease_list(v["items"].as_array().map_or(&[], Vec::as_slice))
                })?;
                return Ok(EXIT_OK);
            }
            Some(next) => {
                if !seen.insert(next.clone()) {
                    return Err(bad(&format!("cursor `{next}` came back twice")).into());
                }
                cursor = Some(next);
            }
        }
    }
    Err(CliError::BadResponse {
        url: gw.url(&["v1", "leases"], &[]).to_string(),
        reason: format!("still more pages after {MAX_PAGES}"),
    }
    .into())
}

/// What a poll of `lease get --wait` found.
#[derive(Debug, PartialEq, Eq)]
enum WaitStep {
    /// The lease is in the state waited for, or has passed it.
    Reached,
    /// The lease ended or was rejected and will never get there.
    Finished,
    /// Not yet.
    Pending,
}

fn wait_step(state: &str, target: LeaseState) -> WaitStep {
    match LeaseState::from_wire(state) {
        Some(now) if now == target || now.is_past(target) => WaitStep::Reached,
        Some(now) if now.is_terminal() => WaitStep::Finished,
        _ => WaitStep::Pending,
    }
}

/// One line of progress: `lease L: queued (#3, no capacity)`.
fn progress_line(id: &str, lease: &Value, target: LeaseState) -> String {
    let state = lease.get("state").and_then(Value::as_str).unwrap_or("?");
    let mut notes = Vec::new();
    if let Some(pos) = lease.get("queue_position").filter(|v| !v.is_null()) {
        notes.push(format!("#{pos}"));
    }
    for key in ["queued_reason", "rejected_reason", "end_reason", "failure"] {
        if let Some(reason) = lease.get(key).and_then(Value::as_str) {
            notes.push(reason.to_string());
        }
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    format!("waiting for lease {id} to be {target}: {state}{notes}")
}

/// Polls the lease every [`WAIT_POLL_INTERVAL`] until it reaches `target`,
/// finishes, or `timeout` passes; reports each state change on `err`.
/// Returns the last lease view and the exit code.
/// How often `lease logs --follow` asks for more.
pub const LOGS_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes asked for per read of a lease log (the gateway's most).
const LOGS_READ_BYTES: u64 = 256 * 1024;
/// Most reads one `lease logs` makes without following (a log is at most
/// 64 MiB, 256 reads).
const MAX_LOG_READS: usize = 1_000;

/// `lease logs`: prints the log raw from the start of what is kept (or
/// `--tail` bytes before the end) to its end; with `--follow`, then every
/// second what came since, until the workload ended and all of it is out,
/// or Ctrl-C. A lease that moved to another node is read there from its
/// start.
async fn lease_logs(
    gw: &Gateway,
    args: &LeaseLogs,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    let max_bytes = LOGS_READ_BYTES.to_string();
    let mut offset: Option<u64> = None;
    let mut node: Option<String> = None;
    let mut placement: Option<u64> = None;
    let mut reads = 0usize;
    // One listener for the whole run: a Ctrl-C during a request is not lost.
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let position = match (offset, args.tail) {
            (Some(o), _) => ("offset", o.to_string()),
            (None, Some(tail)) => ("tail", tail.to_string()),
            (None, None) => ("offset", "0".to_string()),
        };
        let query = [("max_bytes", max_bytes.as_str()), (position.0, &position.1)];
        let path = ["v1", "leases", &args.id, "logs"];
        let page = tokio::select! {
            page = gw.get(&path, &query) => page?,
            _ = &mut interrupted, if args.follow => return Ok(EXIT_OK),
        };
        let field = |name: &str| page.get(name).and_then(Value::as_u64).unwrap_or(0);
        let on = page
            .get("node_id")
            .and_then(Value::as_str)
            .map(str::to_string);
        let on_placement = page.get("placement").and_then(Value::as_u64);
        if node.is_some() && on.is_some() && on != node {
            let _ = writeln!(
                err,
                "lease {} is now on node {}: its log there follows from its start",
                args.id,
                on.as_deref().unwrap_or("?")
            );
            (node, placement) = (on, on_placement);
            offset = Some(0);
            continue;
        }
        // Placed anew on the same node (other GPUs, or away and back): a
        // new log, from its start.
        if placement.is_some() && on_placement.is_some() && on_placement != placement {
            let _ = writeln!(
                err,
                "lease {} was placed again on node {}: its new log follows from its start",
                args.id,
                on.as_deref().unwrap_or("?")
            );
            placement = on_placement;
            offset = Some(0);
            continue;
        }
        node = node.or(on);
        placement = placement.or(on_placement);
        let data = page.get("data").and_then(Value::as_str).unwrap_or_default();
        out.write_all(data.as_bytes())
            .and_then(|()| out.flush())
            .context("writing the log to stdout")?;
        let next = field("next_offset");
        let drained = next >= field("size");
        let finished = page
            .get("finished")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let moved = offset != Some(next);
        offset = Some(next);
        reads += 1;
        if drained && (finished || !args.follow) {
            return Ok(EXIT_OK);
        }
        if !args.follow && (!moved || reads >= MAX_LOG_READS) {
            return Ok(EXIT_OK);
        }
        if drained || !moved {
            tokio::select! {
                _ = tokio::time::sleep(LOGS_POLL_INTERVAL) => {}
                _ = &mut interrupted, if args.follow => return Ok(EXIT_OK),
            }
        }
    }
}

async fn wait_for(
    gw: &Gateway,
    id: &str,
    target: LeaseState,
    timeout: Duration,
    err: Out<'_>,
) -> anyhow::Result<(Value, i32)> {
    let deadline = Instant::now() + timeout;
    let mut last_line = String::new();
    loop {
        let lease = gw.get(&["v1", "leases", id], &[]).await?;
        let state = lease
            .get("state")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let line = progress_line(id, &lease, target);
        if line != last_line {
            let _ = writeln!(err, "{line}");
            last_line = line;
        }
        match wait_step(&state, target) {
            WaitStep::Reached => return Ok((lease, EXIT_OK)),
            WaitStep::Finished => {
                let _ = writeln!(
                    err,
                    "error: lease {id} is {state} and will not become {target}"
                );
                return Ok((lease, EXIT_FAILURE));
            }
            WaitStep::Pending => {}
        }
        let now = Instant::now();
        if now >= deadline {
            let _ = writeln!(
                err,
                "error: timed out after {}s waiting for lease {id} to become {target} (state: {state})",
                timeout.as_secs()
            );
            return Ok((lease, EXIT_FAILURE));
        }
        tokio::time::sleep(WAIT_POLL_INTERVAL.min(deadline - now)).await;
    }
}

/// Puts what a request asks for (whole GPUs, a share or a MIG instance) in `body`.
fn gpu_fields(body: &mut Value, ask: &args::GpuAskArgs) {
    match (ask.gpus, ask.milli, ask.vram_gb, &ask.mig) {
        (Some(gpus), _, _, _) => body["gpus"] = json!(gpus),
        (None, Some(milli), Some(vram_gb), _) => {
            body["gpu_fraction"] = json!({"milli": milli, "vram_gb": vram_gb})
        }
        (None, None, None, Some(profile)) => body["mig_profile"] = json!(profile),
        _ => unreachable!("clap requires --gpus, --milli with --vram-gb, or --mig"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_steps() {
        use LeaseState::*;
        assert_eq!(wait_step("running", Running), WaitStep::Reached);
        assert_eq!(wait_step("running", Placed), WaitStep::Reached);
        assert_eq!(wait_step("queued", Running), WaitStep::Pending);
        assert_eq!(wait_step("requested", Queued), WaitStep::Pending);
        assert_eq!(wait_step("ended", Running), WaitStep::Finished);
        assert_eq!(wait_step("rejected", Running), WaitStep::Finished);
        assert_eq!(wait_step("ended", Ended), WaitStep::Reached);
        assert_eq!(wait_step("rejected", Rejected), WaitStep::Reached);
        assert_eq!(wait_step("ended", Rejected), WaitStep::Finished);
        assert_eq!(wait_step("hibernating", Running), WaitStep::Pending);
        assert_eq!(wait_step("", Running), WaitStep::Pending);
    }

    #[test]
    fn progress_lines() {
        let lease = json!({"state": "queued", "queue_position": 2, "queued_reason": "no capacity"});
        assert_eq!(
            progress_line("L1", &lease, LeaseState::Running),
            "waiting for lease L1 to be running: queued (#2, no capacity)"
        );
        let lease = json!({"state": "placed", "queue_position": null});
        assert_eq!(
            progress_line("L1", &lease, LeaseState::Running),
            "waiting for lease L1 to be running: placed"
        );
    }

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
