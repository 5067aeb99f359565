//! What auditors can ask of the audit copy: its records, filtered by
//! tenant, principal, event type and time, in stream order, a page at a
//! time. Paging is by keyset on the stream sequence, so a page costs the
//! same wherever it starts and rows appended meanwhile neither shift nor
//! repeat a page.

use chrono::{DateTime, Utc};
use lh_events::trail::Outcome;
use lh_rpc::audit::{AuditRecord, EventsPage, EventsRequest};
use sqlx::{PgPool, QueryBuilder};
use uuid::Uuid;

#[derive(sqlx::FromRow)]
struct Row {
    sequence: i64,
    subject: String,
    event_type: Option<String>,
    occurred_at: Option<DateTime<Utc>>,
    skip_reason: Option<String>,
    tenant_id: Option<Uuid>,
    actor: Option<String>,
    object: Option<String>,
    outcome: Option<String>,
    payload: Vec<u8>,
}

/// One page of records matching `request`; `next` is set when more follow.
pub async fn events(pool: &PgPool, request: &EventsRequest) -> anyhow::Result<EventsPage> {
    if let Some((field, why)) = request.problem() {
        anyhow::bail!("{field}: {why}");
    }
    let mut query = QueryBuilder::new(
        "SELECT sequence, subject, event_type, occurred_at, skip_reason, tenant_id, actor, \
         object, outcome, payload FROM events WHERE sequence > ",
    );
    query.push_bind(request.after.min(i64::MAX as u64) as i64);
    if let Some(tenant_id) = request.tenant_id {
        query.push(" AND tenant_id = ").push_bind(tenant_id);
    }
    if let Some(actor) = &request.actor {
        query.push(" AND actor = ").push_bind(actor);
    }
    if let Some(event_type) = &request.event_type {
        query.push(" AND event_type = ").push_bind(event_type);
    }
    if let Some(from) = request.from {
        query.push(" AND occurred_at >= ").push_bind(from);
    }
    if let Some(to) = request.to {
        query.push(" AND occurred_at < ").push_bind(to);
    }
    // One more than asked tells whether another page follows.
    query
        .push(" ORDER BY sequence LIMIT ")
        .push_bind(i64::from(request.limit) + 1);
    let mut rows: Vec<Row> = query.build_query_as().fetch_all(pool).await?;
    let more = rows.len() > request.limit as usize;
    rows.truncate(request.limit as usize);
    let next = if more {
        rows.last().map(|r| r.sequence as u64)
    } else {
        None
    };
    Ok(EventsPage {
        events: rows.into_iter().map(record).collect(),
        next,
    })
}

fn record(row: Row) -> AuditRecord {
    let payload = serde_json::from_slice(&row.payload).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&row.payload).into_owned())
    });
    AuditRecord {
        sequence: row.sequence as u64,
        occurred_at: row.occurred_at,
        actor: row.actor,
        event_type: row.event_type,
        object: row.object,
        tenant_id: row.tenant_id,
        outcome: row.outcome.as_deref().and_then(Outcome::parse),
        subject: row.subject,
        skip_reason: row.skip_reason,
        payload,
    }
}
