//! `lh report daily`: one UTC day of the fleet in a picture and a few
//! numbers: a VRAM heat map (GPUs × hours), a task timeline (leases as bars
//! per GPU, preemptions and failovers marked), idle rate and utilisation
//! per model and zone, peak hours, queue wait against 15 s and availability
//! against 99.95 %.
//!
//! Three layers: this module reads (the log's events through
//! `GET /v1/audit/events`, the usage through `GET /v1/usage`); [`model`]
//! folds what was read into a [`DayInput`] and [`engine`] computes the
//! [`DailyReport`], both pure; [`render`] draws it. The engine lives in the
//! CLI, not in lh-domain: only `lh` reads it, and its renderers bring
//! plotting crates no service should link.

pub mod engine;
mod glyph;
pub mod model;
pub mod render;

pub use engine::DailyReport;
pub use model::{DayInput, LoggedEvent};
pub use render::ColourBy;

use std::collections::BTreeSet;
use std::io::IsTerminal as _;
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::{NaiveDate, SecondsFormat, Utc};
use lh_rpc::http::usage::UsageReport;
use serde_json::Value;
use uuid::Uuid;

use crate::args::{ReportColourBy, ReportDaily};
use crate::client::Gateway;
use crate::error::{CliError, EXIT_OK};
use crate::output::{write_out, Out};

/// Most events one report reads from the log, all types together.
pub const MAX_REPORT_EVENTS: usize = 1_000_000;
/// How far before the day lease events are read, to find the leases
/// already running at 00:00: a lease started earlier than this and still
/// running is left out unless it starts again during the day.
pub const MAX_LOOKBACK_DAYS: i64 = 35;
/// Least time between two redraws of the progress line.
const PROGRESS_REDRAW_MILLIS: u64 = 200;
/// Width of the progress bar, in characters.
const PROGRESS_BAR_CHARS: usize = 30;

/// Lease events read over the look-back and the day.
const LEASE_EVENT_TYPES: [&str; 8] = [
    "lease.requested",
    "lease.rejected",
    "lease.placed",
    "lease.started",
    "lease.migrated",
    "lease.suspended",
    "lease.ended",
    "lease.restated",
];

/// Node events read from the log's start to the day's end: the inventory.
const NODE_EVENT_TYPES: [&str; 2] = ["node.registered", "node.restated"];

/// What the output file is, by its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    Html,
    Svg,
    Png,
}

impl OutputKind {
    pub fn of(path: &Path) -> Result<OutputKind, CliError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("html" | "htm") => Ok(OutputKind::Html),
            Some("svg") => Ok(OutputKind::Svg),
            Some("png") => Ok(OutputKind::Png),
            _ => Err(CliError::Usage(format!(
                "--out {}: the file's extension says what to write: .html, .svg or .png",
                path.display()
            ))),
        }
    }
}

/// The report drawn as `kind`.
pub fn render_as(report: &DailyReport, by: ColourBy, kind: OutputKind) -> anyhow::Result<Vec<u8>> {
    Ok(match kind {
        OutputKind::Html => render::html(report, by)?.into_bytes(),
        OutputKind::Svg => render::svg(report, by)?.0.into_bytes(),
        OutputKind::Png => render::png(report, by)?.0,
    })
}

/// A one-line progress bar over the event types read, on a terminal only.
struct Progress {
    shown: bool,
    drawn_at: Option<Instant>,
    total: usize,
}

impl Progress {
    fn update(&mut self, err: Out<'_>, done: usize, what: &str, records: usize) {
        if !self.shown
            || self
                .drawn_at
                .is_some_and(|t| t.elapsed() < Duration::from_millis(PROGRESS_REDRAW_MILLIS))
        {
            return;
        }
        self.drawn_at = Some(Instant::now());
        let filled = done * PROGRESS_BAR_CHARS / self.total.max(1);
        let _ = write!(
            err,
            "\r[{}{}] {done}/{} reads, {records} events ({what})\x1b[K",
            "#".repeat(filled),
            "-".repeat(PROGRESS_BAR_CHARS - filled),
            self.total,
        );
        let _ = err.flush();
    }

    fn finish(&self, err: Out<'_>) {
        if self.shown && self.drawn_at.is_some() {
            let _ = writeln!(err);
        }
    }
}

/// Reads every record of `event_type` in [from, to), page by page, adding
/// the decodable ones to `events`.
#[allow(clippy::too_many_arguments)]
async fn read_type(
    gw: &Gateway,
    event_type: &str,
    from: Option<&str>,
    to: &str,
    tenant: Option<&str>,
    events: &mut Vec<LoggedEvent>,
    undecodable: &mut usize,
    mut tick: impl FnMut(usize),
) -> anyhow::Result<()> {
    let mut query: Vec<(&'static str, String)> =
        vec![("type", event_type.to_string()), ("to", to.to_string())];
    if let Some(from) = from {
        query.push(("from", from.to_string()));
    }
    if let Some(tenant) = tenant {
        query.push(("tenant_id", tenant.to_string()));
    }
    crate::audit_trail::every_record(gw, &query, 0, |record| {
        let sequence = record.get("sequence").and_then(Value::as_u64);
        // A record the services stepped over (undecodable, forged, or by a
        // publisher without authority over its lease) changed nothing: the
        // report draws what they obeyed.
        let stepped_over = record
            .get("skip_reason")
            .is_some_and(|reason| !reason.is_null());
        let envelope = record
            .get("payload")
            .filter(|_| !stepped_over)
            .and_then(|p| serde_json::from_value::<lh_events::Envelope>(p.clone()).ok());
        match (sequence, envelope) {
            (Some(sequence), Some(envelope)) => events.push(LoggedEvent { sequence, envelope }),
            _ => *undecodable += 1,
        }
        if events.len() + *undecodable > MAX_REPORT_EVENTS {
            return Err(CliError::Usage(format!(
                "the day needs more than {MAX_REPORT_EVENTS} events from the log; \
                 report on one tenant (--tenant)"
            ))
            .into());
        }
        tick(events.len());
        Ok(())
    })
    .await
}

fn rfc3339(at: chrono::DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Says why the heat map (or part of it) is empty; `which` names the part.
fn usage_missing(err: Out<'_>, status: u16, which: &str) {
    // A gateway without the usage API, or one that does not show it to
    // this caller, still lets the leases be drawn.
    let why = match status {
        404 => "the gateway has no usage API",
        403 => "this key may not read the usage",
        422 => "the usage holds more points than one answer, or took too long to sum",
        _ => "the gateway could not read the usage now",
    };
    let _ = writeln!(
        err,
        "warning: {why} (GET /v1/usage{which}: {status}); the heat map and utilisation are empty{}",
        if which.is_empty() { "" } else { " there" }
    );
}

/// The day's usage one node at a time, for a fleet whose day holds more
/// points than one answer: each node that registered by the day's end.
async fn read_usage_by_node(
    gw: &Gateway,
    query: &[(&str, &str)],
    input: &mut DayInput,
    err: Out<'_>,
) -> anyhow::Result<()> {
    let nodes: BTreeSet<String> = input.gpus.iter().map(|g| g.node_id.clone()).collect();
    let _ = writeln!(
        err,
        "the day's usage is more than one answer holds; reading it node by node ({} nodes)",
        nodes.len()
    );
    for (done, node) in nodes.iter().enumerate() {
        let mut by_node = query.to_vec();
        by_node.push(("node", node.as_str()));
        match gw.get_as::<UsageReport>(&["v1", "usage"], &by_node).await {
            Ok((answer, _)) => {
                input.add_usage(&answer);
            }
            Err(CliError::Api(p)) if p.status == 422 => {
                usage_missing(&mut *err, p.status, &format!(" of node {node}"));
            }
            Err(CliError::Api(p)) if matches!(p.status, 403 | 404 | 503) => {
                usage_missing(&mut *err, p.status, &format!(" of node {node}"));
                let after = nodes.len() - done - 1;
                if after > 0 {
                    let (nodes_after, were) = if after == 1 {
                        ("node", "was")
                    } else {
                        ("nodes", "were")
                    };
                    let _ = writeln!(
                        err,
                        "warning: the usage of the {after} {nodes_after} after {node} {were} not \
                         read either; their heat map and utilisation are empty too"
                    );
                }
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        if (done + 1) % USAGE_NODES_PER_PROGRESS_LINE == 0 && done + 1 < nodes.len() {
            let _ = writeln!(err, "usage: {} of {} nodes read", done + 1, nodes.len());
        }
    }
    Ok(())
}

/// Nodes read between two progress lines when the usage is read node by
/// node.
const USAGE_NODES_PER_PROGRESS_LINE: usize = 100;

/// Reads what the day's report needs and folds it into a [`DayInput`].
pub async fn read_day(
    gw: &Gateway,
    date: NaiveDate,
    tenant: Option<Uuid>,
    err: Out<'_>,
) -> anyhow::Result<DayInput> {
    let start = model::day_start(date);
    let end = model::day_end(date);
    let to = rfc3339(end);
    let lookback = rfc3339(start - chrono::Duration::days(MAX_LOOKBACK_DAYS));
    let mut progress = Progress {
        shown: std::io::stderr().is_terminal(),
        drawn_at: None,
        total: NODE_EVENT_TYPES.len() + LEASE_EVENT_TYPES.len() + 1,
    };
    let mut events = Vec::new();
    let mut undecodable = 0;
    // One tenant's lease events are read filtered by it (the scheduler
    // and the node-agents name the tenant on every lease event); the
    // inventory belongs to no tenant.
    let tenant_text = tenant.map(|t| t.to_string());
    let reads = NODE_EVENT_TYPES.iter().map(|t| (*t, None, None)).chain(
        LEASE_EVENT_TYPES
            .iter()
            .map(|t| (*t, Some(lookback.as_str()), tenant_text.as_deref())),
    );
    for (done, (event_type, from, tenant)) in reads.enumerate() {
        progress.update(&mut *err, done, event_type, events.len());
        read_type(
            gw,
            event_type,
            from,
            &to,
            tenant,
            &mut events,
            &mut undecodable,
            |n| progress.update(&mut *err, done, event_type, n),
        )
        .await?;
    }
    progress.update(&mut *err, progress.total - 1, "usage", events.len());
    // Today is reported as far as it has come.
    let mut input = DayInput::from_events_as_of(date, tenant, Utc::now(), events);
    let from_text = rfc3339(start);
    let mut query = vec![
        ("from", from_text.as_str()),
        ("to", to.as_str()),
        ("step", "3600"),
    ];
    if let Some(t) = &tenant_text {
        query.push(("tenant", t.as_str()));
    }
    let usage = gw.get_as::<UsageReport>(&["v1", "usage"], &query).await;
    progress.drawn_at = None;
    progress.update(&mut *err, progress.total, "done", 0);
    progress.finish(&mut *err);
    match usage {
        Ok((answer, _)) => {
            input.add_usage(&answer);
        }
        // More points than one answer holds, or a sum too long for the
        // database: the fleet's day is read node by node.
        Err(CliError::Api(p)) if p.status == 422 && p.field.as_deref() == Some("step") => {
            read_usage_by_node(gw, &query, &mut input, &mut *err).await?
        }
        Err(CliError::Api(p)) if p.status == 422 => usage_missing(&mut *err, p.status, ""),
        Err(CliError::Api(p)) if matches!(p.status, 403 | 404 | 503) => {
            usage_missing(&mut *err, p.status, "");
        }
        Err(e) => return Err(e.into()),
    }
    if input.gpus.is_empty() {
        let _ = writeln!(
            err,
            "warning: no node registered by the day's end is in the records this key reads; \
             the report needs the admin or auditor token"
        );
    }
    if undecodable > 0 {
        let _ = writeln!(
            err,
            "warning: {undecodable} records of the log could not be decoded or were refused by the services, and were left out"
        );
    }
    Ok(input)
}

/// `lh report daily`: reads, computes, writes the file and says what it wrote.
/// With `--json`, the report's numbers go to stdout as JSON.
pub async fn daily(
    gw: &Gateway,
    args: &ReportDaily,
    json: bool,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    let kind = OutputKind::of(&args.out)?;
    let today = Utc::now().date_naive();
    let date = match args.date {
        Some(date) if date > today => {
            return Err(CliError::Usage(format!("--date {date} is in the future")).into())
        }
        Some(date) => date,
        None => today.pred_opt().expect("yesterday exists"),
    };
    let tenant = args
        .tenant
        .as_deref()
        .map(|t| {
            t.parse::<Uuid>()
                .map_err(|_| CliError::Usage(format!("--tenant {t}: not a tenant id (a UUID)")))
        })
        .transpose()?;
    let input = read_day(gw, date, tenant, &mut *err).await?;
    if input.gpus.len() > render::MAX_REPORT_GPUS {
        return Err(CliError::Usage(format!(
            "{} GPUs are more than one report draws ({})",
            input.gpus.len(),
            render::MAX_REPORT_GPUS
        ))
        .into());
    }
    let report = DailyReport::compute(&input);
    let by = match args.colour_by {
        ReportColourBy::Tenant => ColourBy::Tenant,
        ReportColourBy::Tier => ColourBy::Tier,
    };
    let bytes = render_as(&report, by, kind)?;
    std::fs::write(&args.out, bytes)
        .map_err(|e| CliError::Usage(format!("cannot write {}: {e}", args.out.display())))?;
    if json {
        let mut text = serde_json::to_string_pretty(&report)?;
        text.push('\n');
        return write_out(out, &text).map(|()| EXIT_OK);
    }
    write_out(
        out,
        &format!(
            "{}: {} (UTC), {} GPUs, {} leases, {} of {} GPU-hours leased\n",
            args.out.display(),
            date,
            report.gpus.len(),
            report.leases,
            report.leased_gpu_hours,
            report.gpu_hours,
        ),
    )?;
    Ok(EXIT_OK)
}
