//! `lh audit events | replay | export`: the audit records the gateway
//! answers on `GET /v1/audit/events`, a page, every page, or a tenant's
//! whole trail as a file. Every page an operator reads is recorded by the
//! gateway (`audit.accessed`), so a replay leaves one trace per page.

use lh_rpc::audit::EventsPage;
use serde_json::{json, Value};

use crate::args::{AuditEvents, AuditExport, AuditFilter, AuditReplay, ExportFormat};
use crate::client::{Gateway, MAX_PAGES};
use crate::error::{CliError, EXIT_OK};
use crate::output::{emit, write_out, Out};
use crate::render;

/// Records asked per page when reading every page: the gateway's most.
const REPLAY_PAGE_RECORDS: &str = "1000";

const EVENTS: [&str; 3] = ["v1", "audit", "events"];

fn filter_query(f: &AuditFilter) -> Vec<(&'static str, String)> {
    let mut query = Vec::new();
    for (name, value) in [
        ("tenant_id", &f.tenant),
        ("actor", &f.actor),
        ("type", &f.event_type),
        ("from", &f.from),
        ("to", &f.to),
    ] {
        if let Some(value) = value {
            query.push((name, value.clone()));
        }
    }
    query
}

/// `lh audit events`: one page.
pub async fn events(
    gw: &Gateway,
    e: &AuditEvents,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    let mut query = filter_query(&e.filter);
    if let Some(after) = e.after {
        query.push(("after", after.to_string()));
    }
    if let Some(limit) = e.limit {
        query.push(("limit", limit.to_string()));
    }
    let pairs: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let page = gw.get(&EVENTS, &pairs).await?;
    emit(out, json, &page, render::audit_events)?;
    Ok(EXIT_OK)
}

/// Calls `each` with every record matching `query` after `after`, page by
/// page in log order, until a page says it is the last.
pub(crate) async fn every_record(
    gw: &Gateway,
    query: &[(&'static str, String)],
    mut after: u64,
    mut each: impl FnMut(&Value) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    for _ in 0..MAX_PAGES {
        let after_text = after.to_string();
        let mut pairs: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
        pairs.push(("after", &after_text));
        pairs.push(("limit", REPLAY_PAGE_RECORDS));
        let (page, answer) = gw.get_as::<EventsPage>(&EVENTS, &pairs).await?;
        let bad = |reason: &str| CliError::BadResponse {
            url: gw.url(&EVENTS, &pairs).to_string(),
            reason: reason.to_string(),
        };
        // Records are handed on as the gateway wrote them: what is printed
        // is its JSON.
        for record in answer["events"].as_array().into_iter().flatten() {
            each(record)?;
        }
        match page.next {
            None => return Ok(()),
            Some(next) if next > after => after = next,
            Some(_) => return Err(bad("the next page does not move forward").into()),
        }
    }
    Err(CliError::BadResponse {
        url: gw.url(&EVENTS, &[]).to_string(),
        reason: format!("still more pages after {MAX_PAGES}"),
    }
    .into())
}

fn json_line(out: Out<'_>, record: &Value) -> anyhow::Result<()> {
    let mut line = serde_json::to_string(record)?;
    line.push('\n');
    write_out(out, &line)
}

/// `lh audit replay --from SEQ|TIME`: every record from there on, as JSON lines.
pub async fn replay(gw: &Gateway, r: &AuditReplay, out: Out<'_>) -> anyhow::Result<i32> {
    let (query, after) = match r.from.parse::<u64>() {
        Ok(sequence) => (Vec::new(), sequence.saturating_sub(1)),
        // Not a sequence: a time, which the gateway checks.
        Err(_) => (vec![("from", r.from.clone())], 0),
    };
    every_record(gw, &query, after, |record| json_line(&mut *out, record)).await?;
    Ok(EXIT_OK)
}

/// `lh audit export`: a tenant's records as JSON lines or CSV, or with
/// `--subject` everything held about it as one JSON document.
pub async fn export(gw: &Gateway, x: &AuditExport, out: Out<'_>) -> anyhow::Result<i32> {
    if let Some(subject) = &x.subject {
        return subject_access(gw, subject, out).await;
    }
    let tenant = x
        .tenant
        .clone()
        .ok_or_else(|| CliError::Usage("--tenant or --subject is required".to_string()))?;
    let query = vec![("tenant_id", tenant)];
    match x.format {
        ExportFormat::Jsonl => {
            every_record(gw, &query, 0, |record| json_line(&mut *out, record)).await?
        }
        ExportFormat::Csv => {
            write_out(&mut *out, &render::audit_csv_header())?;
            every_record(gw, &query, 0, |record| {
                write_out(&mut *out, &render::audit_csv_row(record))
            })
            .await?
        }
    }
    Ok(EXIT_OK)
}

/// Most leases an access request shows one by one (each is a request);
/// past it the document says so and the leases' records still hold them.
pub const MAX_SUBJECT_ACCESS_LEASES: usize = 10_000;

/// A data subject's access request: the tenant as the gateway shows it,
/// its balance, its invoices and notes, each lease it asked for, and every
/// audit record of it, in one document.
async fn subject_access(gw: &Gateway, tenant: &str, out: Out<'_>) -> anyhow::Result<i32> {
    let profile = gw.get(&["v1", "tenants", tenant], &[]).await?;
    let balance = gw.get(&["v1", "tenants", tenant, "balance"], &[]).await?;
    let invoices = gw
        .get(
            &["v1", "invoices"],
            &[("tenant_id", tenant), ("limit", "500")],
        )
        .await?;
    let mut records = Vec::new();
    let query = vec![("tenant_id", tenant.to_string())];
    every_record(gw, &query, 0, |record| {
        records.push(record.clone());
        Ok(())
    })
    .await?;
    // The gateway lists leases by tenant only for the tenant itself: the
    // tenant's own requests on the trail name them.
    let lease_ids: Vec<&str> = records
        .iter()
        .filter(|r| r["event_type"] == "lease.requested")
        .filter_map(|r| r["payload"]["data"]["lease_id"].as_str())
        .collect();
    let mut leases = Vec::new();
    for id in lease_ids.iter().take(MAX_SUBJECT_ACCESS_LEASES) {
        leases.push(gw.get(&["v1", "leases", id], &[]).await?);
    }
    let document = json!({
        "tenant_id": tenant,
        "exported_at": chrono::Utc::now().to_rfc3339(),
        "tenant": profile,
        "balance": balance,
        "invoices": invoices,
        "leases": leases,
        "leases_truncated": lease_ids.len() > MAX_SUBJECT_ACCESS_LEASES,
        "audit_records": records,
    });
    let mut text = serde_json::to_string_pretty(&document)?;
    text.push('\n');
    write_out(out, &text)?;
    Ok(EXIT_OK)
}
