//! `lh lease logs`: the raw output of a lease's workload, read from the node
//! that runs it through the gateway, page by page; with `--follow` until
//! the workload ends. A lease placed anew (on another node, or again on
//! the same one) has a new log, read from its start.

use std::time::Duration;

use anyhow::Context as _;
use lh_rpc::http::lease_logs::LeaseLogsView;

use crate::args::LeaseLogs;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::Out;

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
/// start. A lease across nodes keeps a log on each member: without
/// `--node` and `--follow`, each is printed in turn, after a line on
/// standard error naming it.
pub(super) async fn lease_logs(
    gw: &Gateway,
    args: &LeaseLogs,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    let (code, members) = read_log(gw, args, args.node.as_deref(), out, err).await?;
    if args.node.is_some() || args.follow || members.len() < 2 {
        return Ok(code);
    }
    for member in &members[1..] {
        let _ = writeln!(
            err,
            "lease {}: the log of its part on node {member}",
            args.id
        );
        read_log(gw, args, Some(member), out, err).await?;
    }
    Ok(code)
}

/// One member's log (`None`: the lease's own node, a gang's first), as
/// [`lease_logs`] prints it; the exit code and the gang's members.
async fn read_log(
    gw: &Gateway,
    args: &LeaseLogs,
    member: Option<&str>,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<(i32, Vec<String>)> {
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
        let mut query = vec![("max_bytes", max_bytes.as_str()), (position.0, &position.1)];
        if let Some(member) = member {
            query.push(("node", member));
        }
        let path = ["v1", "leases", &args.id, "logs"];
        let (page, _) = tokio::select! {
            page = gw.get_as::<LeaseLogsView>(&path, &query) => page?,
            _ = &mut interrupted, if args.follow => return Ok((EXIT_OK, Vec::new())),
        };
        let members = page.members.clone();
        let on = page.node_id;
        let on_placement = page.placement;
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
        out.write_all(page.data.as_bytes())
            .and_then(|()| out.flush())
            .context("writing the log to stdout")?;
        let next = page.next_offset;
        let drained = next >= page.size;
        let finished = page.finished;
        let moved = offset != Some(next);
        offset = Some(next);
        reads += 1;
        if drained && (finished || !args.follow) {
            return Ok((EXIT_OK, members));
        }
        if !args.follow && (!moved || reads >= MAX_LOG_READS) {
            return Ok((EXIT_OK, members));
        }
        if drained || !moved {
            tokio::select! {
                _ = tokio::time::sleep(LOGS_POLL_INTERVAL) => {}
                _ = &mut interrupted, if args.follow => return Ok((EXIT_OK, members)),
            }
        }
    }
}
