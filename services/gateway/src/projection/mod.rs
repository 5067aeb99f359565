//! The gateway's read models: tenants, their API and SSH keys, datasets,
//! storage usage and leases, from the log. One room per table
//! (`tenants.rs`, `keys.rs`, `ssh_keys.rs`, `storage.rs`, `leases.rs`) holds the statement each event runs; `batch.rs` writes runs
//! of the commonest lease events in bulk. Here: the projector, the
//! restatement of aggregates whose history expired, and which statement
//! each event runs.

mod batch;
mod datasets;
mod keys;
mod leases;
mod ssh_keys;
mod storage;
mod tenants;

use futures::future::BoxFuture;
use lh_bus::Stored;
use lh_events::{subject, EventData};
use lh_projection::Projector;
use sqlx::PgConnection;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/gateway");

/// Tables this projection owns (compared by the rebuild check).
pub const TABLES: &[&str] = &[
    "tenants",
    "tenant_keys",
    "leases",
    "ssh_keys",
    "datasets",
    "storage_usage",
];

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
            subject::SSH_KEYS_ALL,
            subject::DATASETS_ALL,
            subject::STORAGE_ALL,
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
        Box::pin(batch::apply_batch(conn, events))
    }
}

/// Applies one event: a restatement by the history it carries, any other
/// by its statement.
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

/// Runs the statement of `event`'s kind; events of other kinds change no
/// table of this projection.
async fn apply_event(conn: &mut PgConnection, event: &Stored) -> sqlx::Result<()> {
    let seq = event.sequence as i64;
    let at = event.envelope.occurred_at;
    match &event.envelope.data {
        EventData::TenantCreated(e) => tenants::created(conn, e, seq, at).await,
        EventData::TenantApiKeyIssued(e) => keys::issued(conn, e, seq, at).await,
        EventData::TenantApiKeyRevoked(e) => keys::revoked(conn, e, seq, at).await,
        EventData::TenantSuspended(e) => tenants::suspended(conn, e).await,
        EventData::BalanceExhausted(e) => tenants::balance_exhausted(conn, e).await,
        EventData::BalanceRestored(e) => tenants::balance_restored(conn, e).await,
        EventData::TenantResumed(e) => tenants::resumed(conn, e).await,
        EventData::TenantErased(e) => {
            tenants::erased(conn, e).await?;
            ssh_keys::tenant_erased(conn, e).await?;
            datasets::tenant_erased(conn, e).await
        }
        EventData::TenantQuotaChanged(e) => tenants::quota_changed(conn, e).await,
        EventData::LeaseRequested(e) => batch::insert_requested(conn, &[(event, e)]).await,
        EventData::LeaseQueued(e) => leases::queued(conn, e, seq).await,
        EventData::LeaseRejected(e) => leases::rejected(conn, e, seq).await,
        EventData::LeasePlaced(e) => leases::placed(conn, e, seq, at).await,
        EventData::LeaseStopRequested(e) => leases::stop_requested(conn, e, seq).await,
        EventData::LeasePreemptionNoticed(e) => leases::preemption_noticed(conn, e, seq).await,
        EventData::LeaseStarted(e) => leases::started(conn, e, seq).await,
        EventData::LeaseMigrated(e) => leases::migrated(conn, e, seq, at).await,
        EventData::LeaseIdleDetected(e) => leases::idle_detected(conn, e, seq).await,
        EventData::LeaseSuspended(e) => leases::suspended(conn, e, seq).await,
        EventData::LeaseResumeRequested(e) => leases::resume_requested(conn, e, seq).await,
        EventData::LeaseEnded(e) => leases::ended(conn, e, seq).await,
        EventData::SshKeyAdded(e) => ssh_keys::added(conn, e, seq, at).await,
        EventData::SshKeyRemoved(e) => ssh_keys::removed(conn, e).await,
        EventData::DatasetVersionAdded(e) => datasets::version_added(conn, e, seq, at).await,
        EventData::DatasetRemoved(e) => datasets::removed(conn, e).await,
        EventData::StorageProvisioned(e) => storage::provisioned(conn, e, seq).await,
        EventData::StorageMeasured(e) => storage::measured(conn, e, seq).await,
        EventData::StorageErased(e) => storage::erased(conn, e, seq).await,
        _ => Ok(()),
    }
}
