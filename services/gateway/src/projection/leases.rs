//! The leases table, one event at a time: the statement each lease event
//! runs. The bulk path (`batch.rs`) writes the commonest of these events
//! for many leases at once, with statements that change a row as these do.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use lh_domain::lease::{LeaseState, LeaseStep};
use sqlx::PgConnection;

use crate::read_model::lease::{
    end_reason, failure, placed_gpu_indices, placed_gpu_uuids, placed_members, placed_mig_instance,
};

pub(super) async fn queued(
    conn: &mut PgConnection,
    e: &lh_events::LeaseQueued,
    seq: i64,
) -> sqlx::Result<()> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE leases SET state = 'queued', queued_reason = $2, queue_position = $3, last_sequence = $4
                 WHERE id = $1 AND {}",
            state_guard("state", LeaseStep::Queue)
        )
    });
    sqlx::query(&SQL)
        .bind(e.lease_id)
        .bind(&e.reason)
        .bind(e.position as i32)
        .bind(seq)
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn rejected(
    conn: &mut PgConnection,
    e: &lh_events::LeaseRejected,
    seq: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE leases SET state = 'rejected', rejected_reason = $2, last_sequence = $3 WHERE id = $1",
    )
    .bind(e.lease_id)
    .bind(&e.reason)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) async fn placed(
    conn: &mut PgConnection,
    e: &lh_events::LeasePlaced,
    seq: i64,
    at: DateTime<Utc>,
) -> sqlx::Result<()> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE leases SET state = 'placed', node_id = $2, zone = $3, gpu_uuids = $4, gpu_indices = $5,
                        queued_reason = NULL, queue_position = NULL, placed_at = $6, last_sequence = $7,
                        mig_instance = $8, last_placement_node_id = $2, last_placement_sequence = $7,
                        members = $9, members_started = '[]'::jsonb
                 WHERE id = $1 AND {}",
            state_guard("state", LeaseStep::Place)
        )
    });
    sqlx::query(&SQL)
        .bind(e.lease_id)
        .bind(&e.node_id)
        .bind(&e.zone)
        .bind(placed_gpu_uuids(e))
        .bind(placed_gpu_indices(e))
        .bind(at)
        .bind(seq)
        .bind(placed_mig_instance(e))
        .bind(placed_members(e))
        .execute(conn)
        .await?;
    Ok(())
}

/// What `lease.started` does to a lease's row, read as `{row}` (`""` or
/// an alias with its dot), `{node}`, `{started_at}` and `{seq}` being where
/// the statement finds the event's values: a lease on one node runs; a
/// gang's member is marked started, and the gang runs once every member is.
pub(super) fn started_set(row: &str, node: &str, started_at: &str, seq: &str) -> String {
    let counted = format!(
        "jsonb_array_length({row}members) <= jsonb_array_length({row}members_started)
             + (CASE WHEN {row}members_started ? {node} THEN 0 ELSE 1 END)"
    );
    format!(
        "members_started = CASE WHEN jsonb_array_length({row}members) = 0
                                     OR {row}members_started ? {node}
                                THEN {row}members_started
                                ELSE {row}members_started || to_jsonb({node}::text) END,
         state = CASE WHEN {counted} THEN 'running' ELSE {row}state END,
         started_at = CASE WHEN {counted} THEN COALESCE({row}started_at, {started_at})
                           ELSE {row}started_at END,
         last_sequence = {seq}"
    )
}

pub(super) async fn stop_requested(
    conn: &mut PgConnection,
    e: &lh_events::LeaseStopRequested,
    seq: i64,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE leases SET stop_requested = TRUE, last_sequence = $2 WHERE id = $1")
        .bind(e.lease_id)
        .bind(seq)
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn preemption_noticed(
    conn: &mut PgConnection,
    e: &lh_events::LeasePreemptionNoticed,
    seq: i64,
) -> sqlx::Result<()> {
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
    Ok(())
}

pub(super) async fn started(
    conn: &mut PgConnection,
    e: &lh_events::LeaseStarted,
    seq: i64,
) -> sqlx::Result<()> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE leases SET {} WHERE id = $1 AND {}",
            started_set("", "$4", "$2", "$3"),
            state_guard("state", LeaseStep::Start)
        )
    });
    sqlx::query(&SQL)
        .bind(e.lease_id)
        .bind(e.started_at)
        .bind(seq)
        .bind(&e.node_id)
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn migrated(
    conn: &mut PgConnection,
    e: &lh_events::LeaseMigrated,
    seq: i64,
    at: DateTime<Utc>,
) -> sqlx::Result<()> {
    static MIGRATE_SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE leases SET state = 'placed', node_id = $2, zone = $3, gpu_uuids = $4, gpu_indices = $5,
                            mig_instance = $6, placed_at = $7, migrations = migrations + 1,
                            last_migration_reason = $8, last_sequence = $9,
                            last_placement_node_id = $2, last_placement_sequence = $9,
                            members = '[]'::jsonb, members_started = '[]'::jsonb
                     WHERE id = $1 AND {}",
            state_guard("state", LeaseStep::Migrate)
        )
    });
    static REQUEUE_SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE leases SET state = 'queued', node_id = NULL, zone = NULL, gpu_uuids = '[]', gpu_indices = '[]',
                            mig_instance = NULL, queued_reason = $2, migrations = migrations + 1,
                            last_migration_reason = $2, last_sequence = $3,
                            members = '[]'::jsonb, members_started = '[]'::jsonb
                     WHERE id = $1 AND {}",
            state_guard("state", LeaseStep::Requeue)
        )
    });
    match &e.to {
        Some(to) => {
            let uuids: Vec<&str> = to.gpus.iter().map(|g| g.uuid.as_str()).collect();
            let indices: Vec<u32> = to.gpus.iter().map(|g| g.index).collect();
            sqlx::query(&MIGRATE_SQL)
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
            sqlx::query(&REQUEUE_SQL)
                .bind(e.lease_id)
                .bind(format!("{}; waiting for capacity", e.reason))
                .bind(seq)
                .execute(conn)
                .await?;
        }
    }
    Ok(())
}

pub(super) async fn idle_detected(
    conn: &mut PgConnection,
    e: &lh_events::LeaseIdleDetected,
    seq: i64,
) -> sqlx::Result<()> {
    // A gang's later member reports only its own GPUs: the lease is idle
    // when its first member (its node) says so.
    sqlx::query(
        "UPDATE leases SET last_sequence = $3,
                idle_since = CASE WHEN node_id = $4 THEN $2 ELSE idle_since END
          WHERE id = $1",
    )
    .bind(e.lease_id)
    .bind(e.idle_since)
    .bind(seq)
    .bind(&e.node_id)
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) async fn suspended(
    conn: &mut PgConnection,
    e: &lh_events::LeaseSuspended,
    seq: i64,
) -> sqlx::Result<()> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE leases SET state = 'suspended', node_id = NULL, zone = NULL, gpu_uuids = '[]', gpu_indices = '[]',
                        mig_instance = NULL, suspended_at = $2, last_sequence = $3,
                        members = '[]'::jsonb, members_started = '[]'::jsonb
                 WHERE id = $1 AND {}",
            state_guard("state", LeaseStep::Suspend)
        )
    });
    sqlx::query(&SQL)
        .bind(e.lease_id)
        .bind(e.suspended_at)
        .bind(seq)
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn resume_requested(
    conn: &mut PgConnection,
    e: &lh_events::LeaseResumeRequested,
    seq: i64,
) -> sqlx::Result<()> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE leases SET state = 'requested', last_sequence = $2 WHERE id = $1 AND {}",
            state_guard("state", LeaseStep::RequestResume)
        )
    });
    sqlx::query(&SQL)
        .bind(e.lease_id)
        .bind(seq)
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn ended(
    conn: &mut PgConnection,
    e: &lh_events::LeaseEnded,
    seq: i64,
) -> sqlx::Result<()> {
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
    Ok(())
}

/// The condition on a lease row's state (`column`) under which `step`
/// changes it, from the one lifecycle ([`LeaseState::before`]): `= 'x'`
/// for one state, `IN ('x', 'y')` for several.
pub(super) fn state_guard(column: &str, step: LeaseStep) -> String {
    let states: Vec<String> = LeaseState::before(step)
        .into_iter()
        .map(|state| format!("'{}'", state.as_str()))
        .collect();
    match states.as_slice() {
        [one] => format!("{column} = {one}"),
        _ => format!("{column} IN ({})", states.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_guards_read_as_the_statements_spell_them() {
        let guard = |step| state_guard("state", step);
        assert_eq!(guard(LeaseStep::Queue), "state IN ('requested', 'queued')");
        assert_eq!(guard(LeaseStep::Place), "state IN ('requested', 'queued')");
        assert_eq!(guard(LeaseStep::Start), "state = 'placed'");
        assert_eq!(guard(LeaseStep::Migrate), "state IN ('placed', 'running')");
        assert_eq!(guard(LeaseStep::Requeue), "state IN ('placed', 'running')");
        assert_eq!(guard(LeaseStep::Suspend), "state IN ('placed', 'running')");
        assert_eq!(guard(LeaseStep::RequestResume), "state = 'suspended'");
        assert_eq!(
            state_guard("l.state", LeaseStep::Place),
            "l.state IN ('requested', 'queued')"
        );
    }
}
