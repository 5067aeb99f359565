//! One transaction of a projection: its events applied in runs, the
//! messages it steps over recorded, and its offset moved (unless its own
//! rows are the offset), all committed together so a crash neither loses
//! nor doubles a row. The live loop and
//! a replay both commit through here.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use lh_bus::{FeedItem, Sample, Skipped, Stored};
use lh_domain::authority::{Authority, LeaseHold};
use sqlx::{PgConnection, PgPool};
use tracing::Instrument;
use uuid::Uuid;

use crate::stream::Item;
use crate::{Projector, Result};

/// Applies events (in stream order), records the skipped ones, and stores
/// the last one's sequence, in one transaction; events at or below the
/// committed sequence are left alone.
pub(crate) async fn apply_batch<P: Projector>(
    pool: &PgPool,
    projector: &P,
    events: &[Item],
) -> Result<()> {
    let Some(last) = events.last() else {
        return Ok(());
    };
    let mut tx = pool.begin().await?;
    let own_offset = projector.own_offset(&mut tx).await?;
    let committed = match own_offset {
        Some(sequence) => sequence,
        None => {
            let committed: Option<i64> = sqlx::query_scalar(
                "SELECT sequence FROM projection_offsets WHERE name = $1 FOR UPDATE",
            )
            .bind(projector.name())
            .fetch_optional(&mut *tx)
            .await?;
            committed.unwrap_or(0) as u64
        }
    };
    // A second runner of the same projection (or a replay) already did them.
    if committed >= last.sequence() {
        return Ok(());
    }
    let mut messages: Vec<&FeedItem> = Vec::new();
    // A projection reads one stream: samples never come between events.
    let mut samples: Vec<&Sample> = Vec::new();
    for item in events.iter().filter(|e| e.sequence() > committed) {
        match item {
            Item::Log(message) => messages.push(message),
            Item::Sample(sample) => samples.push(sample),
        }
    }
    if !messages.is_empty() {
        projector.apply_messages(&mut tx, &messages).await?;
    }
    match samples.as_slice() {
        [] => {}
        [sample] => projector.apply_sample(&mut tx, sample).await?,
        _ => projector.apply_samples(&mut tx, &samples).await?,
    }
    if own_offset.is_none() {
        sqlx::query(
            "INSERT INTO projection_offsets (name, sequence) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET sequence = EXCLUDED.sequence",
        )
        .bind(projector.name())
        .bind(last.sequence() as i64)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// What [`Projector::apply_messages`] does unless a projection says
/// otherwise: each event judged (its node times held to the log, then the
/// authority rule), runs of events applied, and each message stepped over
/// recorded, the refused ones included.
pub(crate) async fn apply_events_recording_skips<P: Projector + ?Sized>(
    projector: &P,
    conn: &mut PgConnection,
    messages: &[&FeedItem],
) -> sqlx::Result<()> {
    let skew = chrono::Duration::seconds(projector.node_clock_skew_secs());
    let judged = judge_messages(conn, projector.name(), messages, skew).await?;
    let mut run: Vec<&Stored> = Vec::new();
    for (message, judged) in messages.iter().zip(&judged) {
        let skipped = match (message, &judged.verdict) {
            (FeedItem::Event(_), Verdict::Refused(skipped)) => Some(&**skipped),
            (FeedItem::Skipped(skipped), _) => Some(skipped),
            _ => None,
        };
        if let Some(skipped) = skipped {
            apply_run(conn, projector, &mut run).await?;
            record_skip(conn, projector.name(), skipped).await?;
            continue;
        }
        match (message, &judged.verdict) {
            (FeedItem::Event(event), Verdict::AsStored) => run.push(event),
            (FeedItem::Event(_), Verdict::Taken(taken)) => run.push(taken),
            _ => {}
        }
    }
    apply_run(conn, projector, &mut run).await
}

/// How a projection takes one message of the log.
pub struct Judged {
    pub verdict: Verdict,
    /// The tenant whose lease the message is on, as the log holds it (not
    /// as the message claims): what an audit trail tags it with.
    pub lease_tenant: Option<Uuid>,
}

/// Whether and how a message is taken. Boxed: a backlog's transaction
/// holds thousands, nearly all `AsStored`.
pub enum Verdict {
    /// As stored (or a message that does not decode, skipped already).
    AsStored,
    /// With its node times held to the log or put in order.
    Taken(Box<Stored>),
    /// Its publisher may not write it now (`lh_domain::authority`).
    Refused(Box<Skipped>),
}

/// Judges `messages`, in order, by the one authority rule with the holds
/// projection `projection` keeps in `lease_holds`, and keeps the holds as
/// they leave them, inside the caller's transaction: what
/// [`Projector::apply_messages`] does by default before applying, for a
/// projection that overrides it.
pub async fn judge_messages(
    conn: &mut PgConnection,
    projection: &str,
    messages: &[&FeedItem],
    skew: chrono::Duration,
) -> sqlx::Result<Vec<Judged>> {
    let leases = leases_of(messages);
    let nodes = nodes_of(messages);
    let mut authority = load_holds(conn, projection, &leases).await?;
    load_enrollments(conn, projection, &nodes, &mut authority).await?;
    let judged: Vec<Judged> = messages
        .iter()
        .map(|message| judge(&mut authority, projection, message, skew))
        .collect();
    store_holds(conn, projection, &leases, &authority).await?;
    store_enrollments(conn, projection, &nodes, &authority).await?;
    Ok(judged)
}

/// Judges one message as the decide loop does (`lh_service::decider`), so
/// that a view shows what the services obeyed and the times the bills
/// count: a node's clock, wrong or lying, moves neither by more than the
/// skew, and a node's word on a lease not placed on it moves nothing.
fn judge(
    authority: &mut Authority,
    projection: &str,
    message: &FeedItem,
    skew: chrono::Duration,
) -> Judged {
    let FeedItem::Event(event) = message else {
        return Judged {
            verdict: Verdict::AsStored,
            lease_tenant: None,
        };
    };
    let data = &event.envelope.data;
    let lease_tenant = data
        .lease_id()
        .and_then(|id| authority.lease(id))
        .and_then(|hold| hold.tenant_id)
        .or_else(|| data.lease_id().and(data.tenant_id()));
    let verdict = match authority.admit_stored(&event.envelope, event.stored_at, Some(skew)) {
        Ok(Cow::Borrowed(_)) => Verdict::AsStored,
        Ok(Cow::Owned(envelope)) => Verdict::Taken(Box::new(Stored {
            envelope,
            ..event.clone()
        })),
        Err(why) => {
            let refused = if first_judgement(projection, event.sequence) {
                event.clone().refused(projection, why.reason, why.detail)
            } else {
                event.clone().into_refused(why.reason, why.detail)
            };
            Verdict::Refused(Box::new(refused))
        }
    };
    Judged {
        verdict,
        lease_tenant,
    }
}

/// Whether this process judges `sequence` for `projection` for the first
/// time: a transaction tried again judges its messages again, and a
/// refusal is counted and logged once.
fn first_judgement(projection: &str, sequence: u64) -> bool {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static JUDGED_THROUGH: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    let mut through = JUDGED_THROUGH
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    match through.get_mut(projection) {
        Some(last) if *last >= sequence => false,
        Some(last) => {
            *last = sequence;
            true
        }
        None => {
            through.insert(projection.to_string(), sequence);
            true
        }
    }
}

/// The leases the events of `messages` are on, each once.
fn leases_of(messages: &[&FeedItem]) -> Vec<Uuid> {
    let mut leases: Vec<Uuid> = messages
        .iter()
        .filter_map(|m| match m {
            FeedItem::Event(e) => e.envelope.data.lease_id(),
            FeedItem::Skipped(_) => None,
        })
        .collect();
    leases.sort_unstable();
    leases.dedup();
    leases
}

/// The nodes whose enrollment the events of `messages` may need or change
/// (every event on a node's subject), each once.
fn nodes_of(messages: &[&FeedItem]) -> Vec<String> {
    let mut nodes: Vec<String> = messages
        .iter()
        .filter_map(|m| match m {
            FeedItem::Event(e) => node_of(&e.envelope.data),
            FeedItem::Skipped(_) => None,
        })
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}

/// The node of an event the rule judges or folds by its enrollment.
fn node_of(data: &lh_events::EventData) -> Option<String> {
    use lh_events::EventData;
    match data {
        EventData::NodeRegistered(e) => Some(e.node_id.clone()),
        EventData::NodeEnrolled(e) => Some(e.node_id.clone()),
        EventData::NodeRestated(e) => Some(e.node_id.clone()),
        _ => None,
    }
}

/// The enrollments of `nodes` as this projection's last transaction left
/// them, into `authority`.
async fn load_enrollments(
    conn: &mut PgConnection,
    projection: &str,
    nodes: &[String],
    authority: &mut Authority,
) -> sqlx::Result<()> {
    if nodes.is_empty() {
        return Ok(());
    }
    let rows: Vec<(String, sqlx::types::Json<lh_events::NodeEnrolled>)> = sqlx::query_as(
        "SELECT node_id, enrollment FROM node_enrollments
         WHERE projection = $1 AND node_id = ANY($2)",
    )
    .bind(projection)
    .bind(nodes)
    .fetch_all(conn)
    .await?;
    for (node_id, enrollment) in rows {
        authority.set_enrollment(&node_id, Some(enrollment.0));
    }
    Ok(())
}

/// Keeps the enrollments of `nodes` as `authority` has them now.
async fn store_enrollments(
    conn: &mut PgConnection,
    projection: &str,
    nodes: &[String],
    authority: &Authority,
) -> sqlx::Result<()> {
    for node_id in nodes {
        let Some(enrollment) = authority.enrollment(node_id) else {
            continue;
        };
        sqlx::query(
            "INSERT INTO node_enrollments (projection, node_id, enrollment) VALUES ($1, $2, $3)
             ON CONFLICT (projection, node_id) DO UPDATE SET enrollment = EXCLUDED.enrollment",
        )
        .bind(projection)
        .bind(node_id)
        .bind(sqlx::types::Json(enrollment))
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The authority rule's holds of `leases`, as this projection's last
/// transaction left them.
async fn load_holds(
    conn: &mut PgConnection,
    projection: &str,
    leases: &[Uuid],
) -> sqlx::Result<Authority> {
    let mut authority = Authority::default();
    if leases.is_empty() {
        return Ok(authority);
    }
    type Row = (
        Uuid,
        Option<Uuid>,
        Option<String>,
        Option<DateTime<Utc>>,
        Option<String>,
        Option<sqlx::types::Json<Vec<String>>>,
        Option<sqlx::types::Json<Vec<String>>>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT lease_id, tenant_id, node_id, started_at, previous_node, members, previous_members
         FROM lease_holds WHERE projection = $1 AND lease_id = ANY($2)",
    )
    .bind(projection)
    .bind(leases)
    .fetch_all(conn)
    .await?;
    for (lease_id, tenant_id, node_id, started_at, previous_node, members, previous_members) in rows
    {
        let hold = LeaseHold {
            tenant_id,
            node_id,
            started_at,
            previous_node,
            members: members.map(|m| m.0).unwrap_or_default(),
            previous_members: previous_members.map(|m| m.0).unwrap_or_default(),
        };
        authority.set_hold(lease_id, Some(hold));
    }
    Ok(authority)
}

/// Keeps the holds of `leases` as `authority` has them now: a lease that
/// ended has none.
async fn store_holds(
    conn: &mut PgConnection,
    projection: &str,
    leases: &[Uuid],
    authority: &Authority,
) -> sqlx::Result<()> {
    if leases.is_empty() {
        return Ok(());
    }
    sqlx::query("DELETE FROM lease_holds WHERE projection = $1 AND lease_id = ANY($2)")
        .bind(projection)
        .bind(leases)
        .execute(&mut *conn)
        .await?;
    let (mut ids, mut tenants, mut nodes, mut starts) = (vec![], vec![], vec![], vec![]);
    let (mut previous, mut members, mut previous_members) = (vec![], vec![], vec![]);
    for (lease_id, hold) in authority.holds_of(leases.iter().copied()) {
        if let Some(hold) = hold {
            ids.push(lease_id);
            tenants.push(hold.tenant_id);
            nodes.push(hold.node_id.clone());
            starts.push(hold.started_at);
            previous.push(hold.previous_node.clone());
            let listed =
                |nodes: &Vec<String>| (!nodes.is_empty()).then(|| sqlx::types::Json(nodes.clone()));
            members.push(listed(&hold.members));
            previous_members.push(listed(&hold.previous_members));
        }
    }
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO lease_holds (projection, lease_id, tenant_id, node_id, started_at,
                previous_node, members, previous_members)
         SELECT $1, * FROM UNNEST($2::uuid[], $3::uuid[], $4::text[], $5::timestamptz[],
                $6::text[], $7::jsonb[], $8::jsonb[])",
    )
    .bind(projection)
    .bind(&ids)
    .bind(&tenants)
    .bind(&nodes)
    .bind(&starts)
    .bind(&previous)
    .bind(&members)
    .bind(&previous_members)
    .execute(conn)
    .await?;
    Ok(())
}

/// Applies a run of consecutive events and empties it.
async fn apply_run<P: Projector + ?Sized>(
    conn: &mut PgConnection,
    projector: &P,
    run: &mut Vec<&Stored>,
) -> sqlx::Result<()> {
    match run.as_slice() {
        [] => {}
        [event] => {
            let span = project_span(projector, event);
            projector.apply(conn, event).instrument(span).await?
        }
        [first, .., last] => {
            let span = tracing::info_span!(
                "lh.project_batch",
                projection = projector.name(),
                events = run.len(),
                first_sequence = first.sequence,
                last_sequence = last.sequence,
            );
            // A few events (a runner that fell a little behind) still read
            // each in its own request's trace, spanning the statements
            // that applied them; a backlog is many requests' events, no
            // one trace to join.
            let _each: Vec<tracing::Span> = if run.len() <= MAX_EVENTS_TRACED_EACH {
                run.iter()
                    .map(|event| project_span(projector, event))
                    .collect()
            } else {
                Vec::new()
            };
            projector.apply_batch(conn, run).instrument(span).await?
        }
    }
    run.clear();
    Ok(())
}

/// Most events of one run that each get a span in their own trace.
const MAX_EVENTS_TRACED_EACH: usize = 16;

/// The span of applying `event`, in the trace of the request that wrote
/// it: one request reads as one trace, its read models included.
fn project_span<P: Projector + ?Sized>(projector: &P, event: &Stored) -> tracing::Span {
    let span = tracing::info_span!(
        "lh.project",
        projection = projector.name(),
        event = event.envelope.event_type.as_str(),
        sequence = event.sequence,
    );
    lh_bus::continue_trace(&span, event.trace_parent.as_deref());
    span
}

async fn record_skip(
    conn: &mut PgConnection,
    projection: &str,
    skipped: &Skipped,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO skipped_events (projection, sequence, subject, reason, stored_at)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
    )
    .bind(projection)
    .bind(skipped.sequence as i64)
    .bind(&skipped.subject)
    .bind(skipped.reason().as_str())
    .bind(skipped.stored_at)
    .execute(conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::first_judgement;

    #[test]
    fn a_message_judged_again_is_not_counted_again() {
        assert!(first_judgement("judged-once", 5));
        assert!(!first_judgement("judged-once", 5), "the same, tried again");
        assert!(!first_judgement("judged-once", 3), "an earlier one");
        assert!(first_judgement("judged-once", 6));
        assert!(
            first_judgement("judged-elsewhere", 5),
            "each projection its own"
        );
    }
}
