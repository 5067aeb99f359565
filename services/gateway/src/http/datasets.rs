//! A tenant's datasets (`/v1/datasets`), its storage identity
//! (`/v1/storage/credentials`) and usage (`/v1/storage`), docs/adr/031.
//! `lh data put` sends a version's chunks to the tenant's bucket with the
//! tenant's own identity, then asks for the version here: the gateway
//! checks every chunk is there with the same identity, checks the tenant's
//! storage quota, stores the manifest beside them and records
//! `dataset.version_added`. A dataset is an aggregate of its own
//! (`lh.evt.dataset.<id>`), its id derived from the tenant and the name.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use lh_events::{dataset_id, subject, DatasetRemoved, DatasetVersionAdded, EventData};
use lh_rpc::http::datasets::{
    AddDatasetVersion, DatasetList, DatasetVersionView, DatasetView, StorageCredentials,
    StorageUsage,
};
use lh_storage::Manifest;
use serde::Deserialize;
use sqlx::FromRow;
use utoipa::IntoParams;
use uuid::Uuid;

use super::{
    append_guarded, query_of, read_your_write, whose, ApiContext, ApiError, ApiJson, Caller,
};
use crate::storage::{StorageError, TenantAccess, TenantStorage};

/// Where a dataset version's manifest is kept in its tenant's bucket.
pub fn manifest_key(name: &str, version: &str) -> String {
    format!("datasets/{name}/{version}.json")
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct DatasetsQuery {
    /// Whose datasets: required of an operator; a tenant may name only itself.
    pub tenant_id: Option<Uuid>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct RemoveQuery {
    /// Whose dataset: required of an operator; a tenant may name only itself.
    pub tenant_id: Option<Uuid>,
    /// Remove this version only; every version when absent.
    pub version: Option<String>,
}

#[derive(FromRow)]
struct VersionRow {
    name: String,
    version: String,
    bytes: i64,
    files: i64,
    created_at: DateTime<Utc>,
}

impl From<&VersionRow> for DatasetVersionView {
    fn from(row: &VersionRow) -> Self {
        DatasetVersionView {
            version: row.version.clone(),
            bytes: row.bytes.max(0) as u64,
            files: row.files.max(0) as u64,
            created_at: row.created_at,
        }
    }
}

/// Rows of one tenant, ordered by name then newest first, as views.
fn group(rows: &[VersionRow]) -> Vec<DatasetView> {
    let mut out: Vec<DatasetView> = Vec::new();
    for row in rows {
        match out.last_mut() {
            Some(last) if last.name == row.name => last.versions.push(row.into()),
            _ => out.push(DatasetView {
                name: row.name.clone(),
                versions: vec![row.into()],
            }),
        }
    }
    out
}

const COLUMNS: &str = "name, version, bytes, files, created_at";
const DATASET_CHANGED: &str = "this dataset changed while this call was decided; retry";
const ORDER: &str = "ORDER BY name, created_at DESC, version";

/// The storage, or 503 where this platform keeps no tenant data.
pub(super) fn storage_of(ctx: &ApiContext) -> Result<&TenantStorage, ApiError> {
    ctx.storage.as_deref().ok_or_else(|| {
        ApiError::unavailable(
            "this platform keeps no tenant data: its gateway has no object store \
             (LH_STORAGE_ENDPOINT)",
        )
    })
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::Erased => {
                ApiError::conflict("the tenant is erased; it takes no further changes")
            }
            StorageError::Database(e) => e.into(),
            StorageError::Bus(e) => e.into(),
            StorageError::Store(e) => {
                tracing::warn!(error = %e, "object store");
                ApiError::unavailable("the object store is out of reach or refused; retry shortly")
                    .retry_after(5)
            }
            StorageError::Other(e) => ApiError::internal(format!("{e:#}")),
        }
    }
}

/// The tenant's access, made on first use.
pub(super) async fn access(ctx: &ApiContext, tenant_id: Uuid) -> Result<TenantAccess, ApiError> {
    Ok(storage_of(ctx)?
        .ensure(&ctx.pool, ctx.keys.as_ref(), &ctx.bus, tenant_id)
        .await?)
}

pub(super) fn check_name(name: &str, field: &str) -> Result<(), ApiError> {
    match lh_domain::storage::bad_name(name) {
        Some(why) => Err(ApiError::unprocessable(format!("{field} {why}"), field)),
        None => Ok(()),
    }
}

/// The dataset's versions once the read model shows everything on its
/// subject, and that subject's last sequence, which the next write expects.
async fn dataset_now(
    ctx: &ApiContext,
    tenant_id: Uuid,
    name: &str,
) -> Result<(Vec<VersionRow>, u64), ApiError> {
    let id = dataset_id(tenant_id, name);
    let last = ctx.bus.subject_last_sequence(&subject::dataset(id)).await?;
    if last > 0 {
        read_your_write(ctx, last).await?;
    }
    Ok((versions(ctx, tenant_id, name).await?, last))
}

async fn versions(
    ctx: &ApiContext,
    tenant_id: Uuid,
    name: &str,
) -> Result<Vec<VersionRow>, ApiError> {
    let rows = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM datasets WHERE tenant_id = $1 AND name = $2 {ORDER}"
    ))
    .bind(tenant_id)
    .bind(name)
    .fetch_all(&ctx.pool)
    .await?;
    Ok(rows)
}

#[utoipa::path(
    get, path = "/v1/storage/credentials",
    responses(
        (status = 200, body = StorageCredentials),
        (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "Not a tenant: each identity is its tenant's alone"),
        (status = 409, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
/// The tenant's own identity on the object store, made on first use: it
/// may read, write and list the tenant's bucket and nothing else.
pub async fn credentials(
    State(ctx): State<ApiContext>,
    caller: Caller,
) -> Result<Json<StorageCredentials>, ApiError> {
    let (tenant_id, _) = caller.tenant()?;
    let access = access(&ctx, tenant_id).await?;
    let public = storage_of(&ctx)?.public();
    Ok(Json(StorageCredentials {
        endpoint: public.endpoint.clone(),
        region: public.region.clone(),
        bucket: access.bucket,
        access_key_id: access.credentials.access_key_id,
        secret_access_key: access.credentials.secret_access_key,
        allow_http: public.allow_http,
    }))
}

#[utoipa::path(
    post, path = "/v1/datasets", request_body = AddDatasetVersion,
    responses(
        (status = 201, body = DatasetView, description = "The version is stored (200: it was already)"),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "Not a tenant, or a suspended one"),
        (status = 409, body = super::Problem),
        (status = 422, body = super::Problem, description = "`name`, or `manifest`: unreadable, over a limit, naming chunks the bucket does not hold, or taking the tenant over its storage quota (type `quota-exceeded`)"),
        (status = 503, body = super::Problem)
    )
)]
pub async fn add(
    State(ctx): State<ApiContext>,
    caller: Caller,
    ApiJson(body): ApiJson<AddDatasetVersion>,
) -> Result<(StatusCode, Json<DatasetView>), ApiError> {
    caller.require_writer()?;
    let (tenant_id, _) = caller.tenant()?;
    check_name(&body.name, "name")?;
    let manifest: Manifest = serde_json::from_value(body.manifest).map_err(|e| {
        ApiError::unprocessable(format!("manifest cannot be read: {e}"), "manifest")
    })?;
    manifest
        .validate(&lh_storage::ManifestLimits::default())
        .map_err(|e| ApiError::unprocessable(format!("manifest: {e}"), "manifest"))?;
    let version = manifest.digest();
    let (rows, last) = dataset_now(&ctx, tenant_id, &body.name).await?;
    if rows.iter().any(|r| r.version == version) {
        let view = group(&rows).pop().expect("a row was found");
        return Ok((StatusCode::OK, Json(view)));
    }
    let access = access(&ctx, tenant_id).await?;
    let store = storage_of(&ctx)?.tenant_store(&access)?;
    let missing = missing_chunks(&store, &manifest).await?;
    if let Some(first) = missing.first() {
        return Err(ApiError::unprocessable(
            format!(
                "{} of the manifest's chunks are not in the bucket (the first: {first}); \
                 send them first (lh data put does)",
                missing.len()
            ),
            "manifest",
        ));
    }
    check_quota(&ctx, &store, tenant_id, &body.name, &rows, &manifest).await?;
    store
        .put_manifest(&manifest_key(&body.name, &version), &manifest)
        .await
        .map_err(StorageError::from)?;
    let data = EventData::DatasetVersionAdded(DatasetVersionAdded {
        dataset_id: dataset_id(tenant_id, &body.name),
        tenant_id,
        name: body.name.clone(),
        version,
        bytes: manifest.total_bytes(),
        files: lh_storage::file_count(&manifest),
    });
    append_guarded(&ctx, &caller, last, data, DATASET_CHANGED).await?;
    metrics::counter!("lh_gateway_dataset_versions_added_total").increment(1);
    let rows = versions(&ctx, tenant_id, &body.name).await?;
    let view = group(&rows).pop().ok_or_else(|| {
        ApiError::conflict(format!(
            "tenant {tenant_id} is erased; it takes no further changes"
        ))
    })?;
    Ok((StatusCode::CREATED, Json(view)))
}

/// A tenant's bytes and time of its last measurement, its quota, and
/// whether its writes are stopped.
type UsageRow = (
    Option<i64>,
    Option<DateTime<Utc>>,
    Option<i32>,
    Option<bool>,
);

/// The tenant's last measurement and storage quota.
async fn usage_of(ctx: &ApiContext, tenant_id: Uuid) -> Result<StorageUsage, ApiError> {
    let row: Option<UsageRow> = sqlx::query_as(
        "SELECT s.bytes, s.measured_at, t.max_storage_gb, s.writes_stopped
         FROM tenants t LEFT JOIN storage_usage s ON s.tenant_id = t.id
         WHERE t.id = $1",
    )
    .bind(tenant_id)
    .fetch_optional(&ctx.pool)
    .await?;
    let (bytes, measured_at, max_storage_gb, writes_stopped) = row
        .ok_or_else(|| ApiError::not_found(format!("no tenant {tenant_id}")).field("tenant_id"))?;
    Ok(StorageUsage {
        bytes: bytes.unwrap_or(0).max(0) as u64,
        measured_at,
        max_storage_gb: max_storage_gb.map(|gb| gb.max(0) as u32),
        writes_stopped: writes_stopped.unwrap_or(false),
    })
}

/// Bytes of `manifest`'s distinct chunks that `held` (the chunks of the
/// dataset's newest version) does not name.
fn new_bytes(manifest: &Manifest, held: &std::collections::BTreeSet<&str>) -> u64 {
    let mut seen = std::collections::BTreeSet::new();
    let mut bytes = 0u64;
    for entry in &manifest.files {
        if let lh_storage::EntryKind::File {
            bytes: size,
            chunks,
            ..
        } = &entry.kind
        {
            for (i, chunk) in chunks.iter().enumerate() {
                if !held.contains(chunk.as_str()) && seen.insert(chunk.as_str()) {
                    bytes = bytes.saturating_add(lh_storage::chunk_len(*size, i));
                }
            }
        }
    }
    bytes
}

/// Refuses a version that would take the tenant over its storage quota.
/// Used is counted as the bytes the bucket held at its last measurement
/// plus what the version adds: its chunks that the dataset's newest
/// version does not hold already. An approximation, on the safe side for
/// the platform: chunks shared with another dataset count again, and so do
/// chunks sent since the last measurement and measured already. A version
/// that adds nothing is never refused.
async fn check_quota(
    ctx: &ApiContext,
    store: &lh_storage::TenantStore,
    tenant_id: Uuid,
    name: &str,
    rows: &[VersionRow],
    manifest: &Manifest,
) -> Result<(), ApiError> {
    let usage = usage_of(ctx, tenant_id).await?;
    let Some(max_gb) = usage.max_storage_gb else {
        return Ok(());
    };
    let newest = match rows.first() {
        Some(row) => store
            .get_manifest(&manifest_key(name, &row.version))
            .await
            .map_err(StorageError::from)?,
        None => None,
    };
    let held = newest.as_ref().map(Manifest::chunk_set).unwrap_or_default();
    let adds = new_bytes(manifest, &held);
    let limit = u64::from(max_gb).saturating_mul(lh_domain::storage_rating::BYTES_PER_GB);
    let total = usage.bytes.saturating_add(adds);
    if adds == 0 || total <= limit {
        return Ok(());
    }
    let measured = usage
        .measured_at
        .map_or("not measured yet".to_string(), |at| {
            format!("measured {}", at.to_rfc3339())
        });
    Err(ApiError::quota_exceeded(
        format!(
            "manifest: this version adds {adds} bytes to the {} bytes the tenant's bucket holds \
             ({measured}): {total} bytes, over the storage quota of {max_gb} GB ({limit} bytes); \
             remove datasets (lh data rm) or ask for a larger quota",
            usage.bytes
        ),
        "manifest",
    ))
}

#[utoipa::path(
    get, path = "/v1/storage", params(DatasetsQuery),
    responses(
        (status = 200, body = StorageUsage),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 404, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
/// What the tenant's bucket held when last measured, and its storage quota.
pub async fn usage(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<DatasetsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<StorageUsage>, ApiError> {
    let tenant_id = whose(&caller, query_of(query)?.tenant_id)?;
    storage_of(&ctx)?;
    Ok(Json(usage_of(&ctx, tenant_id).await?))
}

#[utoipa::path(
    get, path = "/v1/datasets", params(DatasetsQuery),
    responses(
        (status = 200, body = DatasetList),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 404, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn list(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<DatasetsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<DatasetList>, ApiError> {
    let tenant_id = whose(&caller, query_of(query)?.tenant_id)?;
    let rows: Vec<VersionRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM datasets WHERE tenant_id = $1 {ORDER}"
    ))
    .bind(tenant_id)
    .fetch_all(&ctx.pool)
    .await?;
    Ok(Json(DatasetList {
        datasets: group(&rows),
    }))
}

#[utoipa::path(
    get, path = "/v1/datasets/{name}", params(("name" = String, Path), DatasetsQuery),
    responses(
        (status = 200, body = DatasetView),
        (status = 401, body = super::Problem), (status = 404, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn get(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(name): Path<String>,
    query: Result<Query<DatasetsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<DatasetView>, ApiError> {
    let tenant_id = whose(&caller, query_of(query)?.tenant_id)?;
    let rows = versions(&ctx, tenant_id, &name).await?;
    group(&rows)
        .pop()
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no dataset {name:?}")).field("name"))
}

#[utoipa::path(
    get, path = "/v1/datasets/{name}/versions/{version}/manifest",
    params(("name" = String, Path), ("version" = String, Path)),
    responses(
        (status = 200, description = "The version's manifest (`lh_storage::Manifest`)"),
        (status = 401, body = super::Problem), (status = 403, body = super::Problem),
        (status = 404, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
/// A version's manifest, from the tenant's bucket: what `lh data get`
/// fetches the chunks of. The tenant's alone (it names the tenant's files).
pub async fn manifest(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (tenant_id, _) = caller.tenant()?;
    let not_found = || {
        ApiError::not_found(format!("dataset {name:?} has no version {version}")).field("version")
    };
    if !versions(&ctx, tenant_id, &name)
        .await?
        .iter()
        .any(|r| r.version == version)
    {
        return Err(not_found());
    }
    let access = access(&ctx, tenant_id).await?;
    let store = storage_of(&ctx)?.tenant_store(&access)?;
    let manifest = store
        .get_manifest(&manifest_key(&name, &version))
        .await
        .map_err(StorageError::from)?
        .ok_or_else(not_found)?;
    if manifest.digest() != version {
        return Err(ApiError::internal(format!(
            "dataset {name:?} version {version}: the stored manifest hashes otherwise"
        )));
    }
    Ok(Json(
        serde_json::to_value(manifest).map_err(ApiError::internal)?,
    ))
}

#[utoipa::path(
    delete, path = "/v1/datasets/{name}", params(("name" = String, Path), RemoveQuery),
    responses(
        (status = 204, description = "Removed: new leases cannot name it; running ones keep their copy"),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 404, body = super::Problem),
        (status = 409, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn remove(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(name): Path<String>,
    query: Result<Query<RemoveQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode, ApiError> {
    caller.require_writer()?;
    let query = query_of(query)?;
    let tenant_id = whose(&caller, query.tenant_id)?;
    let (rows, last) = dataset_now(&ctx, tenant_id, &name).await?;
    let gone: Vec<&VersionRow> = rows
        .iter()
        .filter(|r| query.version.as_ref().is_none_or(|v| *v == r.version))
        .collect();
    if gone.is_empty() {
        return Err(match &query.version {
            Some(v) => {
                ApiError::not_found(format!("dataset {name:?} has no version {v}")).field("version")
            }
            None => ApiError::not_found(format!("no dataset {name:?}")).field("name"),
        });
    }
    let data = EventData::DatasetRemoved(DatasetRemoved {
        dataset_id: dataset_id(tenant_id, &name),
        tenant_id,
        version: query.version.clone(),
    });
    append_guarded(&ctx, &caller, last, data, DATASET_CHANGED).await?;
    // The manifests go after the record: a crash between leaves objects
    // nobody names, never a version that names a missing manifest.
    if let Ok(Some(access)) = storage_of(&ctx)?
        .existing(&ctx.pool, ctx.keys.as_ref(), tenant_id)
        .await
    {
        let store = storage_of(&ctx)?.tenant_store(&access)?;
        for row in gone {
            if let Err(e) = store.delete(&manifest_key(&name, &row.version)).await {
                tracing::warn!(error = %e, dataset = %name, version = %row.version, "a removed version's manifest stays");
            }
        }
    }
    metrics::counter!("lh_gateway_dataset_versions_removed_total").increment(1);
    Ok(StatusCode::NO_CONTENT)
}

/// Chunks checked at once when a version is added.
const CHUNK_CHECKS_IN_FLIGHT: usize = 16;

/// The manifest's chunks the bucket does not hold at their size.
async fn missing_chunks(
    store: &lh_storage::TenantStore,
    manifest: &Manifest,
) -> Result<Vec<String>, ApiError> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    // Owned, not borrowed from the manifest: a stream of borrowed items
    // makes the handler's future `Send` for some lifetimes only.
    let mut expected: std::collections::BTreeMap<String, u64> = Default::default();
    for entry in &manifest.files {
        if let lh_storage::EntryKind::File { bytes, chunks, .. } = &entry.kind {
            for (i, chunk) in chunks.iter().enumerate() {
                expected.insert(chunk.clone(), lh_storage::chunk_len(*bytes, i));
            }
        }
    }
    let found: Vec<Option<String>> = stream::iter(expected)
        .map(|(chunk, bytes): (String, u64)| async move {
            let stored = store.chunk_bytes(&chunk).await?;
            Ok::<_, lh_storage::Error>((stored != Some(bytes)).then_some(chunk))
        })
        .buffer_unordered(CHUNK_CHECKS_IN_FLIGHT)
        .try_collect()
        .await
        .map_err(StorageError::from)?;
    Ok(found.into_iter().flatten().collect())
}

/// A lease of the tenant's that has not ended and mounts workspace `name`:
/// its node may still write it.
pub(super) async fn workspace_holder(
    ctx: &ApiContext,
    tenant_id: Uuid,
    name: &str,
) -> Result<Option<Uuid>, ApiError> {
    holder_other_than(ctx, tenant_id, name, None).await
}

/// [`workspace_holder`], leaving `lease_id` out: the same request again
/// does not hold its own workspace against itself.
async fn holder_other_than(
    ctx: &ApiContext,
    tenant_id: Uuid,
    name: &str,
    lease_id: Option<Uuid>,
) -> Result<Option<Uuid>, ApiError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM leases WHERE tenant_id = $1 AND state NOT IN ('ended', 'rejected')
         AND workload->'workspaces' @> $2 AND id IS DISTINCT FROM $3 LIMIT 1",
    )
    .bind(tenant_id)
    .bind(serde_json::json!([{ "name": name }]))
    .bind(lease_id)
    .fetch_optional(&ctx.pool)
    .await?)
}

/// How long a claim on a workspace holds for a lease the read model has
/// not shown: its request was never appended (the gateway failed between
/// the claim and the append), or the projection is that far behind.
const UNSEEN_CLAIM_SECS: i64 = 300;

/// Claims workspace `name` for `lease_id`, atomically among gateways: the
/// claim is taken when none is held, when it is this lease's own (the same
/// request again), or when its lease has ended, was rejected, or never
/// appeared within [`UNSEEN_CLAIM_SECS`]. `Some(holder)` when another lease
/// holds it.
async fn claim_workspace(
    ctx: &ApiContext,
    tenant_id: Uuid,
    name: &str,
    lease_id: Uuid,
) -> Result<Option<Uuid>, ApiError> {
    use crate::seal::{KEYS_SCHEMA, WORKSPACE_CLAIMS_TABLE};
    let claimed: Option<Uuid> = sqlx::query_scalar(&format!(
        "INSERT INTO {KEYS_SCHEMA}.{WORKSPACE_CLAIMS_TABLE} AS c (tenant_id, workspace, lease_id)
         VALUES ($1, $2, $3)
         ON CONFLICT (tenant_id, workspace) DO UPDATE
             SET lease_id = EXCLUDED.lease_id, claimed_at = now()
             WHERE c.lease_id = EXCLUDED.lease_id
                OR EXISTS (SELECT 1 FROM leases l WHERE l.id = c.lease_id
                           AND l.state IN ('ended', 'rejected'))
                OR (NOT EXISTS (SELECT 1 FROM leases l WHERE l.id = c.lease_id)
                    AND c.claimed_at < now() - make_interval(secs => $4))
         RETURNING lease_id"
    ))
    .bind(tenant_id)
    .bind(name)
    .bind(lease_id)
    .bind(UNSEEN_CLAIM_SECS as f64)
    .fetch_optional(&ctx.pool)
    .await?;
    if claimed.is_some() {
        return Ok(None);
    }
    Ok(sqlx::query_scalar(&format!(
        "SELECT lease_id FROM {KEYS_SCHEMA}.{WORKSPACE_CLAIMS_TABLE}
         WHERE tenant_id = $1 AND workspace = $2"
    ))
    .bind(tenant_id)
    .bind(name)
    .fetch_optional(&ctx.pool)
    .await?
    // Let go between the two statements: the next request takes it.
    .or(Some(Uuid::nil())))
}

/// Lets go of the workspace claims of `lease_id`, whose request did not
/// reach the log. A failure only delays the next claim by
/// [`UNSEEN_CLAIM_SECS`].
pub(super) async fn release_workspace_claims(ctx: &ApiContext, tenant_id: Uuid, lease_id: Uuid) {
    use crate::seal::{KEYS_SCHEMA, WORKSPACE_CLAIMS_TABLE};
    let released = sqlx::query(&format!(
        "DELETE FROM {KEYS_SCHEMA}.{WORKSPACE_CLAIMS_TABLE} WHERE tenant_id = $1 AND lease_id = $2"
    ))
    .bind(tenant_id)
    .bind(lease_id)
    .execute(&ctx.pool)
    .await;
    if let Err(e) = released {
        tracing::warn!(lease = %lease_id, error = %e, "workspace claims kept until they lapse");
    }
}

/// Fixes each dataset a lease asks for to one version the tenant holds
/// (the newest when none is named), with its size.
pub(super) async fn resolve_mounts(
    ctx: &ApiContext,
    tenant_id: Uuid,
    lease_id: Uuid,
    workload: &mut lh_events::WorkloadSpec,
) -> Result<(), ApiError> {
    if workload.uses_storage() {
        storage_of(ctx)?;
    }
    for (i, mount) in workload.datasets.iter_mut().enumerate() {
        let rows = versions(ctx, tenant_id, &mount.name).await?;
        let field = format!("workload.datasets[{i}]");
        let found = if mount.version.is_empty() {
            rows.first()
        } else {
            rows.iter().find(|r| r.version == mount.version)
        };
        let Some(row) = found else {
            return Err(if rows.is_empty() {
                ApiError::unprocessable(
                    format!("{field}.name: no dataset {:?} (lh data ls)", mount.name),
                    &format!("{field}.name"),
                )
            } else {
                ApiError::unprocessable(
                    format!(
                        "{field}.version: dataset {:?} has no version {}",
                        mount.name, mount.version
                    ),
                    &format!("{field}.version"),
                )
            });
        };
        mount.version = row.version.clone();
        mount.bytes = row.bytes.max(0) as u64;
    }
    for (i, mount) in workload.workspaces.iter().enumerate() {
        // One lease at a time: two writing one workspace would each sync
        // over the other's work. The read model shows the leases asked for
        // before claims were kept; the claim settles leases asked for at
        // once.
        let holder = match holder_other_than(ctx, tenant_id, &mount.name, Some(lease_id)).await? {
            Some(holder) => Some(holder),
            None => claim_workspace(ctx, tenant_id, &mount.name, lease_id).await?,
        };
        if let Some(holder) = holder {
            if i > 0 {
                release_workspace_claims(ctx, tenant_id, lease_id).await;
            }
            return Err(ApiError::conflict(format!(
                "workspace {:?} is held by lease {holder}, which has not ended; \
                 a workspace is one lease's at a time",
                mount.name
            ))
            .field(format!("workload.workspaces[{i}].name")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, version: &str) -> VersionRow {
        VersionRow {
            name: name.into(),
            version: version.into(),
            bytes: 1,
            files: 1,
            created_at: Utc::now(),
        }
    }

    #[test]
    fn rows_group_by_name_in_order() {
        let views = group(&[row("a", "2"), row("a", "1"), row("b", "9")]);
        assert_eq!(views.len(), 2);
        assert_eq!(views[0].name, "a");
        assert_eq!(
            views[0]
                .versions
                .iter()
                .map(|v| v.version.as_str())
                .collect::<Vec<_>>(),
            ["2", "1"]
        );
        assert_eq!(views[1].versions.len(), 1);
    }
}
