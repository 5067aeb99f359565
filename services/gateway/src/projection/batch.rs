//! The projection's bulk path: a run of the lease events a backlog holds
//! most, written with one statement per kind for many leases at once
//! rather than one statement per event. Each statement here writes what
//! the one-event statement of `leases.rs` writes, for many rows; a lease
//! whose whole life so far lies in the run is folded in memory and
//! inserted as the row its events leave.

use std::collections::{HashMap, HashSet};

use std::sync::LazyLock;

use lh_bus::Stored;
use lh_domain::lease::LeaseStep;
use lh_events::EventData;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::read_model::lease::{
    end_reason, failure, placed_gpu_indices, placed_gpu_uuids, placed_members, placed_mig_instance,
    requested_lease, Lease,
};

use super::leases::{started_set, state_guard};
use super::{apply, apply_event};

/// Most leases one multi-row statement writes.
const MAX_LEASES_PER_STATEMENT: usize = 1024;

/// The lease of an event the bulk path writes: a lease's life as a
/// backlog holds it most, folded into one statement per kind for many
/// leases at once.
fn lease_written_in_bulk(event: &Stored) -> Option<uuid::Uuid> {
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
pub(super) async fn apply_batch(conn: &mut PgConnection, events: &[&Stored]) -> sqlx::Result<()> {
    let mut run: Vec<&Stored> = Vec::new();
    for &event in events {
        if lease_written_in_bulk(event).is_some() {
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
/// begin with its request is folded into the row they leave ([`NewLeaseRow`]) and
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
        let lease_id = lease_written_in_bulk(event).expect("a run holds lease events");
        lives
            .entry(lease_id)
            .or_insert_with(|| {
                order.push(lease_id);
                Vec::new()
            })
            .push(event);
    }
    let born: Vec<NewLeaseRow> = order
        .iter()
        .filter_map(|id| NewLeaseRow::fold(&lives[id]))
        .collect();
    let inserted = insert_new_rows(conn, &born).await?;
    let mut waves: Vec<Vec<&Stored>> = Vec::new();
    let mut wave_of: HashMap<Uuid, usize> = HashMap::new();
    for &event in run {
        let lease_id = lease_written_in_bulk(event).expect("a run holds lease events");
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
/// after the other, from the row the request inserts; its state follows
/// the lifecycle those statements' guards are built from
/// ([`lh_domain::lease::LeaseState::after`]).
struct NewLeaseRow {
    lease: Lease,
    last_sequence: i64,
    gpu_uuids: serde_json::Value,
    gpu_indices: serde_json::Value,
    mig_instance: Option<serde_json::Value>,
    end_reason: Option<String>,
    failure: Option<String>,
    /// A gang's members (`leases.members`), and those started.
    members: serde_json::Value,
    members_started: Vec<String>,
}

impl NewLeaseRow {
    /// The row `lease.requested` inserts.
    fn requested(lease: Lease) -> Self {
        NewLeaseRow {
            last_sequence: lease.requested_sequence,
            gpu_uuids: serde_json::json!([]),
            gpu_indices: serde_json::json!([]),
            mig_instance: None,
            end_reason: None,
            failure: None,
            members: serde_json::json!([]),
            members_started: Vec::new(),
            lease,
        }
    }

    /// The row of a lease whose `events` (its own, in order) begin with its
    /// request; `None` when they do not.
    fn fold(events: &[&Stored]) -> Option<Self> {
        let (first, rest) = events.split_first()?;
        let EventData::LeaseRequested(e) = &first.envelope.data else {
            return None;
        };
        let mut row = NewLeaseRow::requested(requested_lease(
            e,
            first.sequence,
            first.envelope.occurred_at,
        ));
        for event in rest {
            row.follow(event);
        }
        Some(row)
    }

    /// What each common event's statement does to the row.
    fn follow(&mut self, event: &Stored) {
        let seq = event.sequence as i64;
        // A gang's member started: the gang runs once every member has
        // (`leases::started_set`).
        if let EventData::LeaseStarted(e) = &event.envelope.data {
            let gang = self.members.as_array().map_or(0, Vec::len);
            if gang > 0 && self.lease.view.state.after(LeaseStep::Start).is_some() {
                if !self.members_started.contains(&e.node_id) {
                    self.members_started.push(e.node_id.clone());
                }
                if self.members_started.len() < gang {
                    self.last_sequence = seq;
                    return;
                }
            }
        }
        let step = match &event.envelope.data {
            // A second request of the same lease inserts nothing.
            EventData::LeaseRequested(_) => return,
            EventData::LeaseQueued(_) => Some(LeaseStep::Queue),
            EventData::LeaseRejected(_) => Some(LeaseStep::Reject),
            EventData::LeasePlaced(_) => Some(LeaseStep::Place),
            EventData::LeaseStarted(_) => Some(LeaseStep::Start),
            EventData::LeaseEnded(_) => Some(LeaseStep::End),
            EventData::LeaseStopRequested(_) => None,
            _ => return,
        };
        if let Some(step) = step {
            // Its statement's state guard does not hold: no row changes.
            let Some(next) = self.lease.view.state.after(step) else {
                return;
            };
            self.lease.view.state = next;
        }
        let v = &mut self.lease.view;
        match &event.envelope.data {
            EventData::LeaseQueued(e) => {
                v.queued_reason = Some(e.reason.clone());
                v.queue_position = Some(e.position as i32);
            }
            EventData::LeaseRejected(e) => {
                v.rejected_reason = Some(e.reason.clone());
            }
            EventData::LeasePlaced(e) => {
                v.node_id = Some(e.node_id.clone());
                v.zone = Some(e.zone.clone());
                self.gpu_uuids = placed_gpu_uuids(e);
                self.gpu_indices = placed_gpu_indices(e);
                v.queued_reason = None;
                v.queue_position = None;
                v.placed_at = Some(event.envelope.occurred_at);
                self.lease.last_placement_node_id = Some(e.node_id.clone());
                self.lease.last_placement_sequence = Some(event.sequence as i64);
                self.mig_instance = placed_mig_instance(e);
                self.members = placed_members(e);
                self.members_started.clear();
            }
            EventData::LeaseStarted(e) => {
                v.started_at = v.started_at.or(Some(e.started_at));
            }
            EventData::LeaseStopRequested(_) => v.stop_requested = true,
            EventData::LeaseEnded(e) => {
                v.ended_at = Some(e.ended_at);
                self.end_reason = end_reason(e);
                v.queued_reason = None;
                v.queue_position = None;
                self.failure = failure(e);
            }
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

pub(super) async fn insert_requested(
    conn: &mut PgConnection,
    events: &[(&Stored, &lh_events::LeaseRequested)],
) -> sqlx::Result<()> {
    let rows: Vec<NewLeaseRow> = events
        .iter()
        .map(|(s, e)| {
            NewLeaseRow::requested(requested_lease(e, s.sequence, s.envelope.occurred_at))
        })
        .collect();
    insert_new_rows(conn, &rows).await?;
    Ok(())
}

/// Inserts the rows of leases that have none yet; the ids of those it
/// inserted (a lease whose row is there already keeps it).
async fn insert_new_rows(
    conn: &mut PgConnection,
    rows: &[NewLeaseRow],
) -> sqlx::Result<HashSet<Uuid>> {
    let mut inserted = HashSet::new();
    for chunk in rows.chunks(MAX_LEASES_PER_STATEMENT) {
        let leases = || chunk.iter().map(|r| &r.lease);
        let views = || leases().map(|l| &l.view);
        let ids: Vec<Uuid> = views().map(|v| v.id).collect();
        let tenants: Vec<Uuid> = views().map(|v| v.tenant_id).collect();
        let states: Vec<&str> = views().map(|v| v.state.as_str()).collect();
        let gpus: Vec<i32> = views().map(|v| v.gpus).collect();
        let models: Vec<&str> = views().map(|v| v.gpu_model.as_str()).collect();
        let tiers: Vec<&str> = views().map(|v| v.tier.as_str()).collect();
        let idempotency: Vec<Option<&str>> =
            leases().map(|l| l.idempotency_key.as_deref()).collect();
        let created: Vec<chrono::DateTime<chrono::Utc>> = views().map(|v| v.created_at).collect();
        let requested_seqs: Vec<i64> = leases().map(|l| l.requested_sequence).collect();
        let last_seqs: Vec<i64> = chunk.iter().map(|r| r.last_sequence).collect();
        let priorities: Vec<i32> = views().map(|v| v.priority).collect();
        let fractions: Vec<Option<serde_json::Value>> = views()
            .map(|v| v.gpu_fraction.as_ref().map(|f| serde_json::json!(f)))
            .collect();
        let mig_profiles: Vec<Option<&str>> = views().map(|v| v.mig_profile.as_deref()).collect();
        let workloads: Vec<Option<&serde_json::Value>> =
            views().map(|v| v.workload.as_ref()).collect();
        let spots: Vec<Option<&serde_json::Value>> = views().map(|v| v.spot.as_ref()).collect();
        let constraints: Vec<Option<&serde_json::Value>> =
            views().map(|v| v.constraints.as_ref()).collect();
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
        let placement_nodes: Vec<Option<&str>> = leases()
            .map(|l| l.last_placement_node_id.as_deref())
            .collect();
        let placement_seqs: Vec<Option<i64>> =
            leases().map(|l| l.last_placement_sequence).collect();
        let members: Vec<&serde_json::Value> = chunk.iter().map(|r| &r.members).collect();
        let members_started: Vec<serde_json::Value> = chunk
            .iter()
            .map(|r| serde_json::json!(r.members_started))
            .collect();
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "INSERT INTO leases (id, tenant_id, state, gpus, gpu_model, tier, idempotency_key,
                                 created_at, requested_sequence, last_sequence, priority, gpu_fraction,
                                 mig_profile, workload, spot, constraints, node_id, zone, gpu_uuids,
                                 gpu_indices, queued_reason, queue_position, rejected_reason,
                                 stop_requested, end_reason, placed_at, started_at, ended_at,
                                 mig_instance, failure, last_placement_node_id,
                                 last_placement_sequence, members, members_started)
             SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::int4[], $5::text[],
                                  $6::text[], $7::text[], $8::timestamptz[], $9::int8[], $10::int8[],
                                  $11::int4[], $12::jsonb[], $13::text[], $14::jsonb[], $15::jsonb[],
                                  $16::jsonb[], $17::text[], $18::text[], $19::jsonb[], $20::jsonb[],
                                  $21::text[], $22::int4[], $23::text[], $24::bool[], $25::text[],
                                  $26::timestamptz[], $27::timestamptz[], $28::timestamptz[],
                                  $29::jsonb[], $30::text[], $31::text[], $32::int8[],
                                  $33::jsonb[], $34::jsonb[])
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
        .bind(members)
        .bind(members_started)
        .fetch_all(&mut *conn)
        .await?;
        inserted.extend(ids);
    }
    Ok(inserted)
}

async fn update_placed(
    conn: &mut PgConnection,
    events: &[(&Stored, &lh_events::LeasePlaced)],
) -> sqlx::Result<()> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE leases l SET state = 'placed', node_id = u.node_id, zone = u.zone, gpu_uuids = u.gpu_uuids,
                gpu_indices = u.gpu_indices, queued_reason = NULL, queue_position = NULL,
                placed_at = u.placed_at, last_sequence = u.seq, mig_instance = u.mig_instance,
                last_placement_node_id = u.node_id, last_placement_sequence = u.seq,
                members = u.members, members_started = '[]'::jsonb
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[], $6::timestamptz[],
                     $7::int8[], $8::jsonb[], $9::jsonb[])
              AS u(id, node_id, zone, gpu_uuids, gpu_indices, placed_at, seq, mig_instance, members)
         WHERE l.id = u.id AND {}",
            state_guard("l.state", LeaseStep::Place)
        )
    });
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
    let members: Vec<serde_json::Value> = events.iter().map(|(_, e)| placed_members(e)).collect();
    sqlx::query(&SQL)
        .bind(ids)
        .bind(nodes)
        .bind(zones)
        .bind(uuids)
        .bind(indices)
        .bind(at)
        .bind(seqs)
        .bind(mig)
        .bind(members)
        .execute(conn)
        .await?;
    Ok(())
}

async fn update_started(
    conn: &mut PgConnection,
    events: &[(&Stored, &lh_events::LeaseStarted)],
) -> sqlx::Result<()> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE leases l SET {}
         FROM UNNEST($1::uuid[], $2::timestamptz[], $3::int8[], $4::text[])
              AS u(id, started_at, seq, node_id)
         WHERE l.id = u.id AND {}",
            started_set("l.", "u.node_id", "u.started_at", "u.seq"),
            state_guard("l.state", LeaseStep::Start)
        )
    });
    let ids: Vec<uuid::Uuid> = events.iter().map(|(_, e)| e.lease_id).collect();
    let at: Vec<chrono::DateTime<chrono::Utc>> = events.iter().map(|(_, e)| e.started_at).collect();
    let seqs: Vec<i64> = events.iter().map(|(s, _)| s.sequence as i64).collect();
    let nodes: Vec<&str> = events.iter().map(|(_, e)| e.node_id.as_str()).collect();
    sqlx::query(&SQL)
        .bind(ids)
        .bind(at)
        .bind(seqs)
        .bind(nodes)
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
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE leases l SET state = 'queued', queued_reason = u.reason, queue_position = u.position,
                last_sequence = u.seq
         FROM UNNEST($1::uuid[], $2::text[], $3::int4[], $4::int8[]) AS u(id, reason, position, seq)
         WHERE l.id = u.id AND {}",
            state_guard("l.state", LeaseStep::Queue)
        )
    });
    let ids: Vec<uuid::Uuid> = events.iter().map(|(_, e)| e.lease_id).collect();
    let reasons: Vec<&str> = events.iter().map(|(_, e)| e.reason.as_str()).collect();
    let positions: Vec<i32> = events.iter().map(|(_, e)| e.position as i32).collect();
    let seqs: Vec<i64> = events.iter().map(|(s, _)| s.sequence as i64).collect();
    sqlx::query(&SQL)
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
