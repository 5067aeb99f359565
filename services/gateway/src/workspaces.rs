//! Keeping tenants' workspaces (docs/adr/031; the layout is
//! `lh_storage::workspace`): once an interval, for every tenant with a
//! bucket, each workspace's head is copied to the day's snapshot
//! (`workspace.snapshotted`), snapshots past the retention and per-sync
//! manifests no longer current are deleted, and then the chunks nothing
//! names any more. A tenant's own `POST /v1/workspaces/{name}/snapshots`
//! takes the same snapshot now.
//!
//! Passes start at the same instants on every replica (intervals counted
//! from the Unix epoch, so a day's pass starts at midnight UTC), and once
//! when a replica starts, in case none ran at the last instant. A second
//! pass over the same heads writes nothing and records nothing; two at
//! once write the same objects and record events of the same derived id,
//! which the log keeps once. A store that is out of reach costs a pass,
//! never the gateway: the next interval tries again.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Days, NaiveDate, Utc};
use futures::stream::{self, StreamExt};
use lh_bus::{Bus, BusError, Expect};
use lh_events::{derived_id, workspace_id, Actor, Envelope, EventData, WorkspaceSnapshotted};
use lh_storage::workspace::{self, Taken};
use lh_storage::TenantStore;
use sqlx::PgPool;
use uuid::Uuid;

use crate::keyring::KeyProvider;
use crate::seal::{KEYS_SCHEMA, STORAGE_ACCESS_TABLE};
use crate::storage::{Keeping, StorageError, TenantStorage};

/// Where the datasets' manifests are, which name chunks too.
const DATASETS_PREFIX: &str = "datasets/";
/// Tenants kept at once.
const TENANTS_IN_FLIGHT: usize = 4;

/// The start of the interval of `interval_secs` that `now` is in.
pub fn interval_start(now: DateTime<Utc>, interval_secs: u64) -> DateTime<Utc> {
    let secs = interval_secs.clamp(1, i64::MAX as u64) as i64;
    let start = now.timestamp().div_euclid(secs) * secs;
    DateTime::from_timestamp(start, 0).unwrap_or(now)
}

/// The id of the record of workspace `name`'s snapshot of `date` copying
/// `manifest`: every replica, and every pass that finds the same head,
/// derives the same.
pub fn snapshot_event_id(tenant_id: Uuid, name: &str, date: NaiveDate, manifest: &str) -> Uuid {
    derived_id(&[
        "workspace.snapshotted",
        &tenant_id.to_string(),
        name,
        &date.to_string(),
        manifest,
    ])
}

/// Takes workspace `name`'s snapshot of `date` and records it when it was
/// written: a head unchanged since that day's snapshot writes and records
/// nothing. `None` when there is no such workspace.
pub async fn snapshot(
    store: &TenantStore,
    bus: &Bus,
    actor: Actor,
    tenant_id: Uuid,
    name: &str,
    date: NaiveDate,
) -> Result<Option<Taken>, StorageError> {
    let Some(taken) = workspace::take_snapshot(store, name, date).await? else {
        return Ok(None);
    };
    if !taken.written {
        return Ok(Some(taken));
    }
    let s = &taken.snapshot;
    let envelope = Envelope::new(
        actor,
        Utc::now(),
        EventData::WorkspaceSnapshotted(WorkspaceSnapshotted {
            workspace_id: workspace_id(tenant_id, name),
            tenant_id,
            workspace: name.to_string(),
            snapshot: date.to_string(),
            manifest: s.manifest.clone(),
            bytes: s.bytes,
            files: s.files,
        }),
    )
    .with_id(snapshot_event_id(tenant_id, name, date, &s.manifest));
    match bus.publish(&envelope, Expect::Any).await {
        Ok(_) | Err(BusError::Conflict(_)) => {}
        Err(e) => return Err(e.into()),
    }
    metrics::counter!("lh_gateway_workspace_snapshots_total").increment(1);
    Ok(Some(taken))
}

/// What one tenant's pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TenantPass {
    pub snapshots: u64,
    pub collected: workspace::Collected,
}

/// One tenant's pass: the day's snapshot of each workspace, then the
/// collection. A workspace whose snapshot fails is logged and left for the
/// next pass; the collection still runs, keeping what its manifests name.
pub async fn keep_tenant(
    store: &TenantStore,
    bus: &Bus,
    tenant_id: Uuid,
    now: DateTime<Utc>,
    keeping: Keeping,
) -> Result<TenantPass, StorageError> {
    let today = now.date_naive();
    let mut pass = TenantPass::default();
    for name in workspace::objects_by_name(store).await?.into_keys() {
        let actor = Actor::Service("gateway".into());
        match snapshot(store, bus, actor, tenant_id, &name, today).await {
            Ok(Some(taken)) => pass.snapshots += u64::from(taken.written),
            Ok(None) => {}
            Err(e) => tracing::warn!(tenant = %tenant_id, workspace = %name, error = %e,
                "cannot snapshot a workspace; trying next pass"),
        }
    }
    let keep_from = today
        .checked_sub_days(Days::new(keeping.keep_days))
        .unwrap_or(NaiveDate::MIN);
    pass.collected =
        workspace::collect(store, keep_from, keeping.grace, &[DATASETS_PREFIX]).await?;
    let chunks = &pass.collected.chunks;
    metrics::counter!("lh_gateway_workspace_objects_collected_total", "kind" => "snapshot")
        .increment(pass.collected.snapshots_deleted);
    metrics::counter!("lh_gateway_workspace_objects_collected_total", "kind" => "manifest")
        .increment(pass.collected.manifests_deleted + pass.collected.leftovers_deleted);
    metrics::counter!("lh_gateway_workspace_objects_collected_total", "kind" => "chunk")
        .increment(chunks.chunks_deleted);
    Ok(pass)
}

/// Every tenant with a bucket, not erased, kept once.
pub async fn keep_all(
    storage: &TenantStorage,
    pool: &PgPool,
    keys: &dyn KeyProvider,
    bus: &Bus,
    keeping: Keeping,
) -> Result<(), sqlx::Error> {
    let tenants: Vec<Uuid> = sqlx::query_scalar(&format!(
        "SELECT tenant_id FROM {KEYS_SCHEMA}.{STORAGE_ACCESS_TABLE} ORDER BY tenant_id"
    ))
    .fetch_all(pool)
    .await?;
    let now = Utc::now();
    stream::iter(tenants)
        .for_each_concurrent(TENANTS_IN_FLIGHT, |tenant_id| async move {
            let access = match storage.existing(pool, keys, tenant_id).await {
                Ok(Some(access)) => access,
                Ok(None) | Err(StorageError::Erased) => return,
                Err(e) => {
                    tracing::warn!(tenant = %tenant_id, error = %e,
                        "cannot reach a tenant's storage to keep its workspaces; trying next pass");
                    return;
                }
            };
            let outcome = match storage.tenant_store(&access) {
                Ok(store) => keep_tenant(&store, bus, tenant_id, now, keeping).await,
                Err(e) => Err(e),
            };
            match outcome {
                Ok(pass) => {
                    metrics::counter!("lh_gateway_workspace_passes_total", "result" => "kept")
                        .increment(1);
                    if pass != TenantPass::default() {
                        tracing::info!(tenant = %tenant_id, snapshots = pass.snapshots,
                            collected = ?pass.collected, "workspaces kept");
                    }
                }
                Err(e) => {
                    metrics::counter!("lh_gateway_workspace_passes_total", "result" => "failed")
                        .increment(1);
                    tracing::warn!(tenant = %tenant_id, error = %e,
                        "cannot keep a tenant's workspaces; trying next pass");
                }
            }
        })
        .await;
    Ok(())
}

/// Keeps every tenant's workspaces once now and then at the start of every
/// interval, for as long as the gateway runs.
pub async fn every_interval(
    storage: Arc<TenantStorage>,
    pool: PgPool,
    keys: Arc<dyn KeyProvider>,
    bus: Bus,
    keeping: Keeping,
) -> std::convert::Infallible {
    loop {
        if let Err(e) = keep_all(&storage, &pool, keys.as_ref(), &bus, keeping).await {
            tracing::warn!(error = %e, "cannot list the tenants with storage; trying next interval");
        }
        let secs = keeping.interval_secs.max(1);
        let next = interval_start(Utc::now(), secs) + chrono::Duration::seconds(secs as i64);
        let wait = (next - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn replicas_share_the_instants_and_the_ids() {
        let at = |d, h, m| Utc.with_ymd_and_hms(2026, 12, d, h, m, 0).unwrap();
        assert_eq!(interval_start(at(7, 23, 59), 86_400), at(7, 0, 0));
        assert_eq!(interval_start(at(8, 0, 0), 86_400), at(8, 0, 0));
        let tenant = Uuid::from_u128(1);
        let day = at(7, 0, 0).date_naive();
        let id = snapshot_event_id(tenant, "ws", day, "aa");
        assert_eq!(id, snapshot_event_id(tenant, "ws", day, "aa"));
        assert_ne!(
            id,
            snapshot_event_id(tenant, "ws", day, "bb"),
            "a changed head"
        );
        assert_ne!(
            id,
            snapshot_event_id(tenant, "ws", at(8, 0, 0).date_naive(), "aa")
        );
        assert_ne!(id, snapshot_event_id(tenant, "other", day, "aa"));
    }
}
