//! A tenant's workspaces (`/v1/workspaces`), docs/adr/031: read from the
//! tenant's bucket, where the nodes that run its leases sync them (the
//! layout is `lh_storage::workspace`); snapshotted once a day by the
//! gateway ([`crate::workspaces`]) and when the tenant asks, restored from
//! a snapshot or removed while no lease holds them. Each workspace is an
//! aggregate of its own on the log (`lh.evt.workspace.<id>`), its id
//! derived from the tenant and the name.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use lh_bus::Expect;
use lh_events::{workspace_id, Envelope, EventData, WorkspaceRemoved, WorkspaceRestored};
use lh_rpc::http::workspaces::{
    RestoreWorkspace, WorkspaceList, WorkspaceSnapshotView, WorkspaceView,
};
use lh_storage::workspace::{self, Snapshot};
use lh_storage::TenantStore;
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::datasets::{check_name, storage_of, workspace_holder};
use super::{query_of, whose};
use super::{ApiContext, ApiError, ApiJson, Caller};
use crate::storage::StorageError;

/// Workspaces described at once by a listing.
const DESCRIBED_IN_FLIGHT: usize = 4;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct WorkspacesQuery {
    /// Whose workspaces: required of an operator; a tenant may name only itself.
    pub tenant_id: Option<Uuid>,
}

fn snapshot_view(s: &Snapshot) -> WorkspaceSnapshotView {
    WorkspaceSnapshotView {
        date: s.date.to_string(),
        manifest: s.manifest.clone(),
        bytes: s.bytes,
        files: s.files,
        taken_at: s.taken_at,
    }
}

/// Whether `e` says what the tenant's bucket holds cannot be read (it is
/// the tenant's to write), rather than that the store is out of reach.
fn unreadable(e: &lh_storage::Error) -> bool {
    matches!(
        e,
        lh_storage::Error::Invalid(_)
            | lh_storage::Error::Manifest(_)
            | lh_storage::Error::Limit(_)
    )
}

/// The tenant's bucket, `None` before its first use of storage and after
/// its erasure (or for a tenant there never was): a read makes nothing.
async fn existing_store(
    ctx: &ApiContext,
    tenant_id: Uuid,
) -> Result<Option<TenantStore>, ApiError> {
    let storage = storage_of(ctx)?;
    match storage
        .existing(&ctx.pool, ctx.keys.as_ref(), tenant_id)
        .await
    {
        Ok(Some(access)) => Ok(Some(storage.tenant_store(&access)?)),
        Ok(None) | Err(StorageError::Erased) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn no_workspace(name: &str) -> ApiError {
    ApiError::not_found(format!("no workspace {name:?}")).field("name")
}

/// Workspace `name` as its bucket holds it; `None` without a head (never
/// synced, or removed), and for one whose head or manifest cannot be read
/// (the tenant's bucket is the tenant's to write over; its other
/// workspaces are still shown).
async fn describe(
    ctx: &ApiContext,
    store: &TenantStore,
    tenant_id: Uuid,
    name: &str,
    objects: &[lh_storage::ObjectInfo],
) -> Result<Option<WorkspaceView>, ApiError> {
    let read = async {
        let Some(head) = workspace::read_head(store, name).await? else {
            return Ok(None);
        };
        let manifest = workspace::head_manifest(store, name, &head).await?;
        let snapshots = workspace::snapshots(store, name, objects).await?;
        Ok(Some((head, manifest, snapshots)))
    };
    let (head, manifest, snapshots) = match read.await {
        Ok(Some(found)) => found,
        Ok(None) => return Ok(None),
        Err(e) if unreadable(&e) => {
            tracing::info!(tenant = %tenant_id, workspace = name, error = %e,
                "a workspace cannot be read; left out");
            return Ok(None);
        }
        Err(e) => return Err(StorageError::from(e).into()),
    };
    Ok(Some(WorkspaceView {
        name: name.to_string(),
        manifest: head.manifest.clone(),
        bytes: manifest.total_bytes(),
        files: lh_storage::file_count(&manifest),
        synced_at: head.synced_at,
        lease_id: head.holder.lease_id,
        released: head.released,
        held_by: workspace_holder(ctx, tenant_id, name).await?,
        restored_from: head.restored.map(|r| r.snapshot.to_string()),
        snapshots: snapshots.iter().map(snapshot_view).collect(),
    }))
}

#[utoipa::path(
    get, path = "/v1/workspaces", params(WorkspacesQuery),
    responses(
        (status = 200, body = WorkspaceList),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 404, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
/// The tenant's workspaces as its bucket holds them now: each one's
/// current manifest and size, its last sync and the lease that wrote it,
/// whether a lease holds it now, and its snapshots, newest first.
pub async fn list(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<WorkspacesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<WorkspaceList>, ApiError> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    let tenant_id = whose(&caller, query_of(query)?.tenant_id)?;
    let Some(store) = existing_store(&ctx, tenant_id).await? else {
        return Ok(Json(WorkspaceList {
            workspaces: Vec::new(),
        }));
    };
    let objects = workspace::objects_by_name(&store)
        .await
        .map_err(StorageError::from)?;
    let (ctx, store) = (&ctx, &store);
    let found: Vec<Option<WorkspaceView>> = stream::iter(objects)
        .map(
            |(name, objects)| async move { describe(ctx, store, tenant_id, &name, &objects).await },
        )
        .buffered(DESCRIBED_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(Json(WorkspaceList {
        workspaces: found.into_iter().flatten().collect(),
    }))
}

#[utoipa::path(
    post, path = "/v1/workspaces/{name}/snapshots", params(("name" = String, Path)),
    responses(
        (status = 201, body = WorkspaceSnapshotView, description = "Taken: today's snapshot (UTC) now holds the workspace as it is (200: it did already)"),
        (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "Not a tenant"),
        (status = 404, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
/// Takes today's snapshot of the workspace now, as the daily one is taken
/// (replacing an earlier one of today): one to come back to before a risky
/// run. A lease may hold the workspace meanwhile: its last sync is copied.
pub async fn snapshot(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<WorkspaceSnapshotView>), ApiError> {
    caller.require_writer()?;
    let (tenant_id, _) = caller.tenant()?;
    check_name(&name, "name")?;
    let store = existing_store(&ctx, tenant_id)
        .await?
        .ok_or_else(|| no_workspace(&name))?;
    let today = Utc::now().date_naive();
    let taken =
        crate::workspaces::snapshot(&store, &ctx.bus, caller.actor(), tenant_id, &name, today)
            .await
            .map_err(|e| match e {
                StorageError::Store(e) if unreadable(&e) => ApiError::conflict(format!(
                    "workspace {name:?} cannot be read from the bucket: {e}"
                ))
                .field("name"),
                e => e.into(),
            })?
            .ok_or_else(|| no_workspace(&name))?;
    let status = if taken.written {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(snapshot_view(&taken.snapshot))))
}

/// Refuses a change to workspace `name` while a lease that has not ended
/// mounts it: its node would sync over the change.
async fn refuse_held(ctx: &ApiContext, tenant_id: Uuid, name: &str) -> Result<(), ApiError> {
    match workspace_holder(ctx, tenant_id, name).await? {
        Some(lease) => Err(ApiError::conflict(format!(
            "workspace {name:?} is held by lease {lease}, which has not ended; \
             stop it first (its node syncs the workspace a last time)"
        ))
        .field("name")),
        None => Ok(()),
    }
}

/// Records `data` on workspace `name`'s aggregate.
async fn record(ctx: &ApiContext, caller: &Caller, data: EventData) -> Result<(), ApiError> {
    let envelope = Envelope::new(caller.actor(), Utc::now(), data);
    ctx.bus.publish(&envelope, Expect::Any).await?;
    Ok(())
}

#[utoipa::path(
    post, path = "/v1/workspaces/{name}/restore", params(("name" = String, Path)),
    request_body = RestoreWorkspace,
    responses(
        (status = 200, body = WorkspaceView, description = "The workspace is the snapshot's again: the next lease that mounts it starts from there"),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "Not a tenant"),
        (status = 404, body = super::Problem, description = "No such workspace (`name`) or snapshot (`snapshot`)"),
        (status = 409, body = super::Problem, description = "A lease that has not ended holds the workspace (`name`)"),
        (status = 422, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
/// Sets the workspace back to one of its snapshots. Its current state is
/// not kept unless a snapshot holds it: take one first to come back.
pub async fn restore(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<RestoreWorkspace>,
) -> Result<Json<WorkspaceView>, ApiError> {
    caller.require_writer()?;
    let (tenant_id, _) = caller.tenant()?;
    check_name(&name, "name")?;
    let date = workspace::parse_date(&body.snapshot)
        .ok_or_else(|| ApiError::unprocessable("snapshot must be a day, YYYY-MM-DD", "snapshot"))?;
    refuse_held(&ctx, tenant_id, &name).await?;
    let store = existing_store(&ctx, tenant_id)
        .await?
        .ok_or_else(|| no_workspace(&name))?;
    if workspace::read_head(&store, &name)
        .await
        .map_err(StorageError::from)?
        .is_none()
    {
        return Err(no_workspace(&name));
    }
    let no_snapshot = || {
        ApiError::not_found(format!("workspace {name:?} has no snapshot of {date}"))
            .field("snapshot")
    };
    let manifest = store
        .get_manifest(&workspace::snapshot_key(&name, date))
        .await
        .map_err(StorageError::from)?
        .ok_or_else(no_snapshot)?;
    // Recorded first: a restore cut short after the record is told as
    // failed and asked again, never done unrecorded.
    record(
        &ctx,
        &caller,
        EventData::WorkspaceRestored(WorkspaceRestored {
            workspace_id: workspace_id(tenant_id, &name),
            tenant_id,
            workspace: name.clone(),
            snapshot: date.to_string(),
            manifest: manifest.digest(),
        }),
    )
    .await?;
    workspace::restore_snapshot(&store, &name, date)
        .await
        .map_err(StorageError::from)?
        .ok_or_else(no_snapshot)?;
    metrics::counter!("lh_gateway_workspace_restores_total").increment(1);
    let objects = store
        .list(&workspace::prefix(&name))
        .await
        .map_err(StorageError::from)?;
    describe(&ctx, &store, tenant_id, &name, &objects)
        .await?
        .map(Json)
        .ok_or_else(|| no_workspace(&name))
}

#[utoipa::path(
    delete, path = "/v1/workspaces/{name}", params(("name" = String, Path)),
    responses(
        (status = 204, description = "Removed with its snapshots; a lease mounting it from now on starts empty"),
        (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "Not a tenant"),
        (status = 404, body = super::Problem),
        (status = 409, body = super::Problem, description = "A lease that has not ended holds the workspace (`name`)"),
        (status = 503, body = super::Problem)
    )
)]
/// Removes the workspace and its snapshots. Its data goes at the next
/// collection, once nothing else names it.
pub async fn remove(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require_writer()?;
    let (tenant_id, _) = caller.tenant()?;
    check_name(&name, "name")?;
    refuse_held(&ctx, tenant_id, &name).await?;
    let store = existing_store(&ctx, tenant_id)
        .await?
        .ok_or_else(|| no_workspace(&name))?;
    // A removal cut short leaves objects and no head: removing again
    // finishes it.
    let objects = store
        .list(&workspace::prefix(&name))
        .await
        .map_err(StorageError::from)?;
    if objects.is_empty() {
        return Err(no_workspace(&name));
    }
    record(
        &ctx,
        &caller,
        EventData::WorkspaceRemoved(WorkspaceRemoved {
            workspace_id: workspace_id(tenant_id, &name),
            tenant_id,
            workspace: name.clone(),
        }),
    )
    .await?;
    workspace::delete(&store, &name)
        .await
        .map_err(StorageError::from)?;
    metrics::counter!("lh_gateway_workspaces_removed_total").increment(1);
    Ok(StatusCode::NO_CONTENT)
}
