//! The gateway's read models: tenants and leases, from the log.

use std::collections::{HashMap, HashSet};

use futures::future::BoxFuture;
use lh_bus::Stored;
use lh_events::{subject, EventData};
use lh_projection::Projector;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::read_model::lease::{end_reason, failure, requested_view, LeaseView};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/gateway");

/// Tables this projection owns (compared by the rebuild check).
pub const TABLES: &[&str] = &["tenants", "tenant_keys", "leases"];

pub struct GatewayProjection;

impl Projector for GatewayProjection {
    fn name(&self) -> &'static str {
        "gateway"
    }

    fn filters(&self) -> &'static [&'static str] {
        &[
            subject::TENANTS_ALL,
            subject::LEASES_ALL,
            subject::BALANCES_ALL,
        ]
    }

    fn apply<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        event: &'c Stored,
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(apply(conn, event))
    }

    fn apply_batch<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        events: &'c [&'c Stored],
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(apply_batch(conn, events))
    }
}

/// Most leases one multi-row statement writes.
const MAX_LEASES_PER_STATEMENT: usize = 1024;

/// A lease's life as a backlog holds it most: these fold into one
/// statement per kind for many leases at once.
fn lease_of_common_event(event: &Stored) -> Option<uuid::Uuid> {
    match &event.envelope.data {
        EventData::LeaseRequested(e) => Some(e.lease_id),
        EventData::LeasePlaced(e) => Some(e.lease_id),
        EventData::LeaseStarted(e) => Some(e.lease_id),
        EventData::LeaseEnded(e) => Some(e.lease_id),
        EventData::LeaseStopRequested(e) => Some(e.lease_id),
        EventData::LeaseQueued(e) => Some(e.lease_id),
        EventData::LeaseRejected(e) => Some(e.lease_id),
        _ => None,
    }
}

/// Applies a run of events as [`apply`] one by one would. A lease's row
/// depends only on that lease's events, in order, so the common lease
/// events between two others are written together ([`write_run`]). Any
/// other event first writes the run before it and is then applied on its
/// own.
async fn apply_batch(conn: &mut PgConnection, events: &[&Stored]) -> sqlx::Result<()> {
    let mut run: Vec<&Stored> = Vec::new();
    for &event in events {
        if lease_of_common_event(event).is_some() {
            run.push(event);
        } else {
            write_run(conn, &run).await?;
            run.clear();
            apply(conn, event).await?;
        }
    }
    write_run(conn, &run).await
}

/// Writes a run of common lease events. A lease whose events in the run
/// begin with its request is folded into the row they leave ([`Born`]) and
/// inserted with the others in one statement, unless its row is there
/// already: in a backlog most leases live their whole life within a run,
/// and one row written beats one written and updated four times. The
/// events of every other lease are dealt out in waves: the n-th event of
/// each lease to wave n, and a wave (one event per lease at most) is
/// written with one statement per kind.
async fn write_run(conn: &mut PgConnection, run: &[&Stored]) -> sqlx::Result<()> {
    let mut lives: HashMap<Uuid, Vec<&Stored>> = HashMap::new();
    let mut order = Vec::new();
    for &event in run {
        let lease_id = lease_of_common_event(event).expect("a run holds lease events");
        lives
            .entry(lease_id)
            .or_insert_with(|| {
                order.push(lease_id);
                Vec::new()
            })
            .push(event);
    }
    let born: Vec<Born> = order
        .iter()
        .filter_map(|id| Born::fold(&lives[id]))
        .collect();
    let inserted = insert_born(conn, &born).await?;
    let mut waves: Vec<Vec<&Stored>> = Vec::new();
    let mut wave_of: HashMap<Uuid, usize> = HashMap::new();
    for &event in run {
        let lease_id = lease_of_common_event(event).expect("a run holds lease events");
        if inserted.contains(&lease_id) {
            continue;
        }
        let next = wave_of.entry(lease_id).or_insert(0);
        if waves.len() <= *next {
            waves.push(Vec::new());
        }
        waves[*next].push(event);
        *next += 1;
    }
    write_waves(conn, &mut waves).await
}

/// A lease's row as its request and the common events after it leave it,
/// computed as the statements of [`apply`] would change it, one event
/// after the other, from the row the request inserts.
struct Born {
    view: LeaseView,
    state: &'static str,
    last_sequence: i64,
    gpu_uuids: serde_json::Value,
    gpu_indices: serde_json::Value,
    mig_instance: Option<serde_json::Value>,
    end_reason: Option<String>,
    failure: Option<String>,
}

impl Born {
    /// The row `lease.requested` inserts.
    fn requested(view: LeaseView) -> Self {
        Born {
            state: "requested",
            last_sequence: view.requested_sequence,
            gpu_uuids: serde_json::json!([]),
            gpu_indices: serde_json::json!([]),
            mig_instance: None,
            end_reason: None,
            failure: None,
            view,
        }
    }

    /// The row of a lease whose `events` (its own, in order) begin with its
    /// request; `None` when they do not.
    fn fold(events: &[&Stored]) -> Option<Self> {
        let (first, rest) = events.split_first()?;
        let EventData::LeaseRequested(e) = &first.envelope.data else {
            return None;
        };
        let mut row = Born::requested(requested_view(
            e,
            first.sequence,
            first.envelope.occurred_at,
        ));
        for event in rest {
            row.then(event);
        }
        Some(row)
    }

    /// What each common event's statement does to the row.
    fn then(&mut self, event: &Stored) {
        let seq = event.sequence as i64;
        let waiting = matches!(self.state, "requested" | "queued");
        let v = &mut self.view;
        match &event.envelope.data {
            // A second request of the same lease inserts nothing.
            EventData::LeaseRequested(_) => return,
            EventData::LeaseQueued(e) if waiting => {
                self.state = "queued";
                v.queued_reason = Some(e.reason.clone());
                v.queue_position = Some(e.position as i32);
            }
            EventData::LeaseRejected(e) => {
                self.state = "rejected";
                v.rejected_reason = Some(e.reason.clone());
            }
            EventData::LeasePlaced(e) if waiting => {
                self.state = "placed";
                v.node_id = Some(e.node_id.clone());
                v.zone = Some(e.zone.clone());
                self.gpu_uuids = placed_gpu_uuids(e);
                self.gpu_indices = placed_gpu_indices(e);
                v.queued_reason = None;
                v.queue_position = None;
                v.placed_at = Some(event.envelope.occurred_at);
                v.last_placement_node_id = Some(e.node_id.clone());
                v.last_placement_sequence = Some(event.sequence as i64);
                self.mig_instance = placed_mig_instance(e);
            }
            EventData::LeaseStarted(e) if self.state == "placed" => {
                self.state = "running";
                v.started_at = v.started_at.or(Some(e.started_at));
            }
            EventData::LeaseStopRequested(_) => v.stop_requested = true,
            EventData::LeaseEnded(e) => {
                self.state = "ended";
                v.ended_at = Some(e.ended_at);
                self.end_reason = end_reason(e);
                v.queued_reason = None;
                v.queue_position = None;
                self.failure = failure(e);
            }
            // Its statement's condition does not hold: no row changes.
            _ => return,
        }
        self.last_sequence = seq;
    }
}

async fn write_waves(conn: &mut PgConnection, waves: &mut Vec<Vec<&Stored>>) -> sqlx::Result<()> {
    for wave in waves.drain(..) {
        for chunk in wave.chunks(MAX_LEASES_PER_STATEMENT) {
            write_wave(conn, chunk).await?;
        }
    }
    Ok(())
}

/// One statement per kind of event in `wave`, whose events are each on a
/// lease of their own.
async fn write_wave(conn: &mut PgConnection, wave: &[&Stored]) -> sqlx::Result<()> {
    let mut requested = Vec::new();
    let mut placed = Vec::new();
    let mut started = Vec::new();
    let mut ended = Vec::new();
    let mut stop_requested = Vec::new();
    let mut queued = Vec::new();
    let mut rejected = Vec::new();
    for &event in wave {
        match &event.envelope.data {
            EventData::LeaseRequested(e) => requested.push((event, e)),
            EventData::LeasePlaced(e) => placed.push((event, e)),
            EventData::LeaseStarted(e) => started.push((event, e)),
            EventData::LeaseEnded(e) => ended.push((event, e)),
            EventData::LeaseStopRequested(e) => stop_requested.push((event, e)),
            EventData::LeaseQueued(e) => queued.push((event, e)),
            EventData::LeaseRejected(e) => rejected.push((event, e)),
            _ => apply_event(conn, event).await?,
        }
    }
    if !stop_requested.is_empty() {
        update_stop_requested(conn, &stop_requested).await?;
    }
    if !queued.is_empty() {
        update_queued(conn, &queued).await?;
    }
    if !rejected.is_empty() {
        update_rejected(conn, &rejected).await?;
    }
    if !requested.is_empty() {
        insert_requested(conn, &requested).await?;
    }
    if !placed.is_empty() {
        update_placed(conn, &placed).await?;
    }
    if !started.is_empty() {
        update_started(conn, &started).await?;
    }
    if !ended.is_empty() {
        update_ended(conn, &ended).await?;
    }
    Ok(())
}

async fn insert_requested(
    conn: &mut PgConnection,
    events: &[(&Stored, &lh_events::LeaseRequested)],
) -> sqlx::Result<()> {
    let rows: Vec<Born> = events
        .iter()
        .map(|(s, e)| Born::requested(requested_view(e, s.sequence, s.envelope.occurred_at)))
        .collect();
    insert_born(conn, &rows).await?;
    Ok(())
}

/// Inserts the rows of leases that have none yet; the ids of those it
/// inserted (a lease whose row is there already keeps it).
async fn insert_born(conn: &mut PgConnection, rows: &[Born]) -> sqlx::Result<HashSet<Uuid>> {
    let mut inserted = HashSet::new();
    for chunk in rows.chunks(MAX_LEASES_PER_STATEMENT) {
        let views = || chunk.iter().map(|r| &r.view);
        let ids: Vec<Uuid> = views().map(|v| v.id).collect();
        let tenants: Vec<Uuid> = views().map(|v| v.tenant_id).collect();
        let states: Vec<&str> = chunk.iter().map(|r| r.state).collect();
        let gpus: Vec<i32> = views().map(|v| v.gpus).collect();
        let models: Vec<&str> = views().map(|v| v.gpu_model.as_str()).collect();
        let tiers: Vec<&str> = views().map(|v| v.tier.as_str()).collect();
        let idempotency: Vec<Option<&str>> =
            views().map(|v| v.idempotency_key.as_deref()).collect();
        let created: Vec<chrono::DateTime<chrono::Utc>> = views().map(|v| v.created_at).collect();
        let requested_seqs: Vec<i64> = views().map(|v| v.requested_sequence).collect();
        let last_seqs: Vec<i64> = chunk.iter().map(|r| r.last_sequence).collect();
        let priorities: Vec<i32> = views().map(|v| v.priority).collect();
        let fractions: Vec<Option<serde_json::Value>> = views()
            .map(|v| v.gpu_fraction.as_ref().map(|f| serde_json::json!(f.0)))
            .collect();
        let mig_profiles: Vec<Option<&str>> = views().map(|v| v.mig_profile.as_deref()).collect();
        let workloads: Vec<Option<&serde_json::Value>> =
            views().map(|v| v.workload.as_ref().map(|w| &w.0)).collect();
        let spots: Vec<Option<&serde_json::Value>> =
            views().map(|v| v.spot.as_ref().map(|w| &w.0)).collect();
        let constraints: Vec<Option<&serde_json::Value>> = views()
            .map(|v| v.constraints.as_ref().map(|w| &w.0))
            .collect();
        let nodes: Vec<Option<&str>> = views().map(|v| v.node_id.as_deref()).collect();
        let zones: Vec<Option<&str>> = views().map(|v| v.zone.as_deref()).collect();
        let uuids: Vec<&serde_json::Value> = chunk.iter().map(|r| &r.gpu_uuids).collect();
        let indices: Vec<&serde_json::Value> = chunk.iter().map(|r| &r.gpu_indices).collect();
        let queued_reasons: Vec<Option<&str>> =
            views().map(|v| v.queued_reason.as_deref()).collect();
        let positions: Vec<Option<i32>> = views().map(|v| v.queue_position).collect();
        let rejected_reasons: Vec<Option<&str>> =
            views().map(|v| v.rejected_reason.as_deref()).collect();
        let stops: Vec<bool> = views().map(|v| v.stop_requested).collect();
        let end_reasons: Vec<Option<&str>> =
            chunk.iter().map(|r| r.end_reason.as_deref()).collect();
        let placed_at: Vec<Option<chrono::DateTime<chrono::Utc>>> =
            views().map(|v| v.placed_at).collect();
        let started_at: Vec<Option<chrono::DateTime<chrono::Utc>>> =
            views().map(|v| v.started_at).collect();
        let ended_at: Vec<Option<chrono::DateTime<chrono::Utc>>> =
            views().map(|v| v.ended_at).collect();
        let mig_instances: Vec<Option<&serde_json::Value>> =
            chunk.iter().map(|r| r.mig_instance.as_ref()).collect();
        let failures: Vec<Option<&str>> = chunk.iter().map(|r| r.failure.as_deref()).collect();
        let placement_nodes: Vec<Option<&str>> = views()
            .map(|v| v.last_placement_node_id.as_deref())
            .collect();
        let placement_seqs: Vec<Option<i64>> = views().map(|v| v.last_placement_sequence).collect();
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "INSERT INTO leases (id, tenant_id, state, gpus, gpu_model, tier, idempotency_key,
                                 created_at, requested_sequence, last_sequence, priority, gpu_fraction,
                                 mig_profile, workload, spot, constraints, node_id, zone, gpu_uuids,
                                 gpu_indices, queued_reason, queue_position, rejected_reason,
                                 stop_requested, end_reason, placed_at, started_at, ended_at,
                                 mig_instance, failure, last_placement_node_id,
                                 last_placement_sequence)
             SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::int4[], $5::text[],
                                  $6::text[], $7::text[], $8::timestamptz[], $9::int8[], $10::int8[],
                                  $11::int4[], $12::jsonb[], $13::text[], $14::jsonb[], $15::jsonb[],
                                  $16::jsonb[], $17::text[], $18::text[], $19::jsonb[], $20::jsonb[],
                                  $21::text[], $22::int4[], $23::text[], $24::bool[], $25::text[],
                                  $26::timestamptz[], $27::timestamptz[], $28::timestamptz[],
                                  $29::jsonb[], $30::text[], $31::text[], $32::int8[])
             ON CONFLICT (id) DO NOTHING
             RETURNING id",
        )
        .bind(ids)
        .bind(tenants)
        .bind(states)
        .bind(gpus)
        .bind(models)
        .bind(tiers)
        .bind(idempotency)
        .bind(created)
        .bind(requested_seqs)
        .bind(last_seqs)
        .bind(priorities)
        .bind(fractions)
        .bind(mig_profiles)
        .bind(workloads)
        .bind(spots)
        .bind(constraints)
        .bind(nodes)
        .bind(zones)
        .bind(uuids)
        .bind(indices)
        .bind(queued_reasons)
        .bind(positions)
        .bind(rejected_reasons)
        .bind(stops)
        .bind(end_reasons)
        .bind(placed_at)
        .bind(started_at)
        .bind(ended_at)
        .bind(mig_instances)
        .bind(failures)
        .bind(placement_nodes)
        .bind(placement_seqs)
        .fetch_all(&mut *conn)
        .await?;
        inserted.extend(ids);
    }
    Ok(inserted)
}

/// The GPU UUIDs a placement gives a lease, as the read model keeps them.
fn placed_gpu_uuids(e: &lh_events::LeasePlaced) -> serde_json::Value {
    serde_json::json!(e.gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>())
}

fn placed_gpu_indices(e: &lh_events::LeasePlaced) -> serde_json::Value {
    serde_json::json!(e.gpus.iter().map(|g| g.index).collect::<Vec<_>>())
}

/// The MIG instance a placement gives a lease, if any.
fn placed_mig_instance(e: &lh_events::LeasePlaced) -> Option<serde_json::Value> {
    e.gpus
        .first()
        .and_then(|g| g.mig_instance.as_ref())
        .map(|m| serde_json::json!({"profile": m.profile, "start": m.start}))
}

async fn update_placed(
    conn: &mut PgConnection,
    events: &[(&Stored, &lh_events::LeasePlaced)],
) -> sqlx::Result<()> {
    let ids: Vec<uuid::Uuid> = events.iter().map(|(_, e)| e.lease_id).collect();
    let nodes: Vec<&str> = events.iter().map(|(_, e)| e.node_id.as_str()).collect();
    let zones: Vec<&str> = events.iter().map(|(_, e)| e.zone.as_str()).collect();
    let uuids: Vec<serde_json::Value> = events.iter().map(|(_, e)| placed_gpu_uuids(e)).collect();
    let indices: Vec<serde_json::Value> =
        events.iter().map(|(_, e)| placed_gpu_indices(e)).collect();
    let at: Vec<chrono::DateTime<chrono::Utc>> =
        events.iter().map(|(s, _)| s.envelope.occurred_at).collect();
    let seqs: Vec<i64> = events.iter().map(|(s, _)| s.sequence as i64).collect();
    let mig: Vec<Option<serde_json::Value>> =
        events.iter().map(|(_, e)| placed_mig_instance(e)).collect();
    sqlx::query(
        "UPDATE leases l SET state = 'placed', node_id = u.node_id, zone = u.zone, gpu_uuids = u.gpu_uuids,
                gpu_indices = u.gpu_indices, queued_reason = NULL, queue_position = NULL,
                placed_at = u.placed_at, last_sequence = u.seq, mig_instance = u.mig_instance,
                last_placement_node_id = u.node_id, last_placement_sequence = u.seq
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[], $6::timestamptz[],
                     $7::int8[], $8::jsonb[])
              AS u(id, node_id, zone, gpu_uuids, gpu_indices, placed_at, seq, mig_instance)
         WHERE l.id = u.id AND l.state IN ('requested', 'queued')",
    )
    .bind(ids)
    .bind(nodes)
    .bind(zones)
    .bind(uuids)
    .bind(indices)
    .bind(at)
    .bind(seqs)
    .bind(mig)
    .execute(conn)
    .await?;
    Ok(())
}

async fn update_started(
    conn: &mut PgConnection,
    events: &[(&Stored, &lh_events::LeaseStarted)],
) -> sqlx::Result<()> {
    let ids: Vec<uuid::Uuid> = events.iter().map(|(_, e)| e.lease_id).collect();
    let at: Vec<chrono::DateTime<chrono::Utc>> = events.iter().map(|(_, e)| e.started_at).collect();
    let seqs: Vec<i64> = events.iter().map(|(s, _)| s.sequence as i64).collect();
    sqlx::query(
        "UPDATE leases l SET state = 'running', started_at = COALESCE(l.started_at, u.started_at),
                last_sequence = u.seq
         FROM UNNEST($1::uuid[], $2::timestamptz[], $3::int8[]) AS u(id, started_at, seq)
         WHERE l.id = u.id AND l.state = 'placed'",
    )
    .bind(ids)
    .bind(at)
    .bind(seqs)
    .execute(conn)
    .await?;
    Ok(())
}

async fn update_ended(
    conn: &mut PgConnection,
    events: &[(&Stored, &lh_events::LeaseEnded)],
) -> sqlx::Result<()> {
    let ids: Vec<uuid::Uuid> = events.iter().map(|(_, e)| e.lease_id).collect();
    let at: Vec<chrono::DateTime<chrono::Utc>> = events.iter().map(|(_, e)| e.ended_at).collect();
    let reasons: Vec<Option<String>> = events.iter().map(|(_, e)| end_reason(e)).collect();
    let seqs: Vec<i64> = events.iter().map(|(s, _)| s.sequence as i64).collect();
    let failures: Vec<Option<String>> = events.iter().map(|(_, e)| failure(e)).collect();
    sqlx::query(
        "UPDATE leases l SET state = 'ended', ended_at = u.ended_at, end_reason = u.end_reason,
                queued_reason = NULL, queue_position = NULL, last_sequence = u.seq, failure = u.failure
         FROM UNNEST($1::uuid[], $2::timestamptz[], $3::text[], $4::int8[], $5::text[])
              AS u(id, ended_at, end_reason, seq, failure)
         WHERE l.id = u.id",
    )
    .bind(ids)
    .bind(at)
    .bind(reasons)
    .bind(seqs)
    .bind(failures)
    .execute(conn)
    .await?;
    Ok(())
}

async fn update_stop_requested(
    conn: &mut PgConnection,
    events: &[(&Stored, &lh_events::LeaseStopRequested)],
) -> sqlx::Result<()> {
    let ids: Vec<uuid::Uuid> = events.iter().map(|(_, e)| e.lease_id).collect();
    let seqs: Vec<i64> = events.iter().map(|(s, _)| s.sequence as i64).collect();
    sqlx::query(
        "UPDATE leases l SET stop_requested = TRUE, last_sequence = u.seq
         FROM UNNEST($1::uuid[], $2::int8[]) AS u(id, seq)
         WHERE l.id = u.id",
    )
    .bind(ids)
    .bind(seqs)
    .execute(conn)
    .await?;
    Ok(())
}

async fn update_queued(
    conn: &mut PgConnection,
    events: &[(&Stored, &lh_events::LeaseQueued)],
) -> sqlx::Result<()> {
    let ids: Vec<uuid::Uuid> = events.iter().map(|(_, e)| e.lease_id).collect();
    let reasons: Vec<&str> = events.iter().map(|(_, e)| e.reason.as_str()).collect();
    let positions: Vec<i32> = events.iter().map(|(_, e)| e.position as i32).collect();
    let seqs: Vec<i64> = events.iter().map(|(s, _)| s.sequence as i64).collect();
    sqlx::query(
        "UPDATE leases l SET state = 'queued', queued_reason = u.reason, queue_position = u.position,
                last_sequence = u.seq
         FROM UNNEST($1::uuid[], $2::text[], $3::int4[], $4::int8[]) AS u(id, reason, position, seq)
         WHERE l.id = u.id AND l.state IN ('requested', 'queued')",
    )
    .bind(ids)
    .bind(reasons)
    .bind(positions)
    .bind(seqs)
    .execute(conn)
    .await?;
    Ok(())
}

async fn update_rejected(
    conn: &mut PgConnection,
    events: &[(&Stored, &lh_events::LeaseRejected)],
) -> sqlx::Result<()> {
    let ids: Vec<uuid::Uuid> = events.iter().map(|(_, e)| e.lease_id).collect();
    let reasons: Vec<&str> = events.iter().map(|(_, e)| e.reason.as_str()).collect();
    let seqs: Vec<i64> = events.iter().map(|(s, _)| s.sequence as i64).collect();
    sqlx::query(
        "UPDATE leases l SET state = 'rejected', rejected_reason = u.reason, last_sequence = u.seq
         FROM UNNEST($1::uuid[], $2::text[], $3::int8[]) AS u(id, reason, seq)
         WHERE l.id = u.id",
    )
    .bind(ids)
    .bind(reasons)
    .bind(seqs)
    .execute(conn)
    .await?;
    Ok(())
}

async fn apply(conn: &mut PgConnection, event: &Stored) -> sqlx::Result<()> {
    let seq = event.sequence as i64;
    // A tenant or lease whose history expired before this projection began
    // (a rebuild, a new replica) comes from its restatement; one with a row
    // already is not folded again, but a lease's newest sequence moves up.
    let (known, history) = match &event.envelope.data {
        EventData::TenantRestated(r) => (
            sqlx::query("SELECT 1 FROM tenants WHERE id = $1")
                .bind(r.tenant_id)
                .fetch_optional(&mut *conn)
                .await?
                .is_some(),
            &r.history,
        ),
        EventData::LeaseRestated(r) => {
            let known = sqlx::query("SELECT 1 FROM leases WHERE id = $1")
                .bind(r.lease_id)
                .fetch_optional(&mut *conn)
                .await?
                .is_some();
            if known {
                sqlx::query("UPDATE leases SET last_sequence = $2 WHERE id = $1")
                    .bind(r.lease_id)
                    .bind(seq)
                    .execute(&mut *conn)
                    .await?;
            }
            (known, &r.history)
        }
        _ => return apply_event(conn, event).await,
    };
    if !known {
        for e in history {
            let stated = Stored {
                sequence: e.sequence,
                subject: event.subject.clone(),
                envelope: (*e.envelope).clone(),
                payload: Default::default(),
                pending: 0,
                stored_at: e.stored_at,
                trace_parent: None,
            };
            apply_event(conn, &stated).await?;
        }
        if let EventData::LeaseRestated(r) = &event.envelope.data {
            sqlx::query("UPDATE leases SET last_sequence = $2 WHERE id = $1")
                .bind(r.lease_id)
                .bind(seq)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(())
}

async fn apply_event(conn: &mut PgConnection, event: &Stored) -> sqlx::Result<()> {
    let seq = event.sequence as i64;
    let at = event.envelope.occurred_at;
    match &event.envelope.data {
        EventData::TenantCreated(e) => {
            sqlx::query(
                "INSERT INTO tenants (id, name_sealed, email_sealed, api_key_sha256, max_gpus, created_at, sequence,
                                      max_vram_gb, weight)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (id) DO NOTHING",
            )
            .bind(e.tenant_id)
            .bind(&e.name_sealed)
            .bind(&e.email_sealed)
            .bind(&e.api_key_sha256)
            .bind(e.quota.max_gpus as i32)
            .bind(at)
            .bind(seq)
            .bind(e.quota.max_vram_gb.map(|v| v as i32))
            .bind(e.weight as i32)
            .execute(&mut *conn)
            .await?;
            insert_key(
                conn,
                e.tenant_id,
                lh_events::FIRST_API_KEY_ID,
                e.api_key_prefix.as_deref(),
                &e.api_key_sha256,
                at,
                None,
                seq,
            )
            .await?;
        }
        EventData::TenantApiKeyIssued(e) => {
            insert_key(
                conn,
                e.tenant_id,
                e.key_id,
                Some(&e.prefix),
                &e.sha256,
                at,
                e.expires_at,
                seq,
            )
            .await?;
        }
        EventData::TenantApiKeyRevoked(e) => {
            sqlx::query(
                "UPDATE tenant_keys SET revoked_at = COALESCE(revoked_at, $3), sequence = $4
                 WHERE tenant_id = $1 AND key_id = $2",
            )
            .bind(e.tenant_id)
            .bind(e.key_id as i32)
            .bind(at)
            .bind(seq)
            .execute(conn)
            .await?;
        }
        EventData::TenantSuspended(e) => {
            // Older events carry the reason in clear; a sealed one never
            // has a clear twin.
            let clear = e.reason_sealed.is_none().then_some(e.reason.as_str());
            sqlx::query(
                "UPDATE tenants SET suspended = TRUE, suspended_reason = $2, suspended_reason_sealed = $3
                 WHERE id = $1",
            )
            .bind(e.tenant_id)
            .bind(clear)
            .bind(&e.reason_sealed)
            .execute(conn)
            .await?;
        }
        EventData::BalanceExhausted(e) => {
            sqlx::query("UPDATE tenants SET balance_exhausted = TRUE WHERE id = $1")
                .bind(e.tenant_id)
                .execute(conn)
                .await?;
        }
        EventData::BalanceRestored(e) => {
            sqlx::query("UPDATE tenants SET balance_exhausted = FALSE WHERE id = $1")
                .bind(e.tenant_id)
                .execute(conn)
                .await?;
        }
        EventData::TenantResumed(e) => {
            sqlx::query(
                "UPDATE tenants SET suspended = FALSE, suspended_reason = NULL, suspended_reason_sealed = NULL
                 WHERE id = $1",
            )
            .bind(e.tenant_id)
            .execute(conn)
            .await?;
        }
        EventData::TenantErased(e) => {
            // The row keeps the ciphertext (names, and a sealed suspension
            // reason): it is the log's, and without the key it is noise; a
            // rebuild writes the same.
            sqlx::query(
                "UPDATE tenants SET erased = TRUE, suspended = TRUE, suspended_reason = 'erased'
                 WHERE id = $1",
            )
            .bind(e.tenant_id)
            .execute(conn)
            .await?;
        }
        EventData::TenantQuotaChanged(e) => {
            sqlx::query(
                "UPDATE tenants SET max_gpus = $2, max_vram_gb = $3, weight = $4 WHERE id = $1",
            )
            .bind(e.tenant_id)
            .bind(e.quota.max_gpus as i32)
            .bind(e.quota.max_vram_gb.map(|v| v as i32))
            .bind(e.weight as i32)
            .execute(conn)
            .await?;
        }
        EventData::LeaseRequested(e) => insert_requested(conn, &[(event, e)]).await?,
        EventData::LeaseQueued(e) => {
            sqlx::query(
                "UPDATE leases SET state = 'queued', queued_reason = $2, queue_position = $3, last_sequence = $4
                 WHERE id = $1 AND state IN ('requested', 'queued')",
            )
            .bind(e.lease_id)
            .bind(&e.reason)
            .bind(e.position as i32)
            .bind(seq)
            .execute(conn)
            .await?;
        }
        EventData::LeaseRejected(e) => {
            sqlx::query(
                "UPDATE leases SET state = 'rejected', rejected_reason = $2, last_sequence = $3 WHERE id = $1",
            )
            .bind(e.lease_id)
            .bind(&e.reason)
            .bind(seq)
            .execute(conn)
            .await?;
        }
        EventData::LeasePlaced(e) => {
            sqlx::query(
                "UPDATE leases SET state = 'placed', node_id = $2, zone = $3, gpu_uuids = $4, gpu_indices = $5,
                        queued_reason = NULL, queue_position = NULL, placed_at = $6, last_sequence = $7,
                        mig_instance = $8, last_placement_node_id = $2, last_placement_sequence = $7
                 WHERE id = $1 AND state IN ('requested', 'queued')",
            )
            .bind(e.lease_id)
            .bind(&e.node_id)
            .bind(&e.zone)
            .bind(placed_gpu_uuids(e))
            .bind(placed_gpu_indices(e))
            .bind(at)
            .bind(seq)
            .bind(placed_mig_instance(e))
            .execute(conn)
            .await?;
        }
        EventData::LeaseStopRequested(e) => {
            sqlx::query(
                "UPDATE leases SET stop_requested = TRUE, last_sequence = $2 WHERE id = $1",
            )
            .bind(e.lease_id)
            .bind(seq)
            .execute(conn)
            .await?;
        }
        EventData::LeasePreemptionNoticed(e) => {
            sqlx::query(
                "UPDATE leases SET preemption_deadline = $2, preempted_for = $3, last_sequence = $4,
                        preemption_reason = $5 WHERE id = $1",
            )
            .bind(e.lease_id)
            .bind(e.deadline)
            .bind(e.preempted_for)
            .bind(seq)
            .bind(e.reason.as_str())
            .execute(conn)
            .await?;
        }
        EventData::LeaseStarted(e) => {
            sqlx::query(
                "UPDATE leases SET state = 'running', started_at = COALESCE(started_at, $2), last_sequence = $3
                 WHERE id = $1 AND state = 'placed'",
            )
            .bind(e.lease_id)
            .bind(e.started_at)
            .bind(seq)
            .execute(conn)
            .await?;
        }
        EventData::LeaseMigrated(e) => match &e.to {
            Some(to) => {
                let uuids: Vec<&str> = to.gpus.iter().map(|g| g.uuid.as_str()).collect();
                let indices: Vec<u32> = to.gpus.iter().map(|g| g.index).collect();
                sqlx::query(
                    "UPDATE leases SET state = 'placed', node_id = $2, zone = $3, gpu_uuids = $4, gpu_indices = $5,
                            mig_instance = $6, placed_at = $7, migrations = migrations + 1,
                            last_migration_reason = $8, last_sequence = $9,
                            last_placement_node_id = $2, last_placement_sequence = $9
                     WHERE id = $1 AND state IN ('placed', 'running')",
                )
                .bind(e.lease_id)
                .bind(&to.node_id)
                .bind(&to.zone)
                .bind(serde_json::json!(uuids))
                .bind(serde_json::json!(indices))
                .bind(
                    to.gpus
                        .first()
                        .and_then(|g| g.mig_instance.as_ref())
                        .map(|m| serde_json::json!({"profile": m.profile, "start": m.start})),
                )
                .bind(at)
                .bind(&e.reason)
                .bind(seq)
                .execute(conn)
                .await?;
            }
            None => {
                sqlx::query(
                    "UPDATE leases SET state = 'queued', node_id = NULL, zone = NULL, gpu_uuids = '[]', gpu_indices = '[]',
                            mig_instance = NULL, queued_reason = $2, migrations = migrations + 1,
                            last_migration_reason = $2, last_sequence = $3
                     WHERE id = $1 AND state IN ('placed', 'running')",
                )
                .bind(e.lease_id)
                .bind(format!("{}; waiting for capacity", e.reason))
                .bind(seq)
                .execute(conn)
                .await?;
            }
        },
        EventData::LeaseIdleDetected(e) => {
            sqlx::query("UPDATE leases SET idle_since = $2, last_sequence = $3 WHERE id = $1")
                .bind(e.lease_id)
                .bind(e.idle_since)
                .bind(seq)
                .execute(conn)
                .await?;
        }
        EventData::LeaseSuspended(e) => {
            sqlx::query(
                "UPDATE leases SET state = 'suspended', node_id = NULL, zone = NULL, gpu_uuids = '[]', gpu_indices = '[]',
                        mig_instance = NULL, suspended_at = $2, last_sequence = $3
                 WHERE id = $1 AND state IN ('placed', 'running')",
            )
            .bind(e.lease_id)
            .bind(e.suspended_at)
            .bind(seq)
            .execute(conn)
            .await?;
        }
        EventData::LeaseResumeRequested(e) => {
            sqlx::query(
                "UPDATE leases SET state = 'requested', last_sequence = $2 WHERE id = $1 AND state = 'suspended'",
            )
            .bind(e.lease_id)
            .bind(seq)
            .execute(conn)
            .await?;
        }
        EventData::LeaseEnded(e) => {
            let reason = end_reason(e);
            let failure = failure(e);
            sqlx::query(
                "UPDATE leases SET state = 'ended', ended_at = $2, end_reason = $3,
                        queued_reason = NULL, queue_position = NULL, last_sequence = $4,
                        failure = $5
                 WHERE id = $1",
            )
            .bind(e.lease_id)
            .bind(e.ended_at)
            .bind(reason)
            .bind(seq)
            .bind(failure)
            .execute(conn)
            .await?;
        }
        _ => {}
    }
    Ok(())
}

/// A key whose hash some other key has already is not taken: the first
/// holder keeps it, so no event can take over another tenant's key.
#[allow(clippy::too_many_arguments)]
async fn insert_key(
    conn: &mut PgConnection,
    tenant_id: uuid::Uuid,
    key_id: u32,
    prefix: Option<&str>,
    sha256: &str,
    at: chrono::DateTime<chrono::Utc>,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    seq: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO tenant_keys (tenant_id, key_id, prefix, sha256, created_at, expires_at, sequence)
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
    )
    .bind(tenant_id)
    .bind(key_id as i32)
    .bind(prefix)
    .bind(sha256)
    .bind(at)
    .bind(expires_at)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}
