//! Workload environments, kept out of the log. A tenant's values (tokens,
//! addresses, whatever a job is given) would stay readable in an immutable
//! log after the tenant is erased, and every node may read the whole log.
//! So `lease.requested` carries only the variables' names and a salted hash
//! ([`WorkloadEnvRef`]); the values are sealed with the tenant's data key in
//! `gateway_keys.workload_env`, and the node the lease is placed on fetches
//! them on its own subject when it starts the workload. Destroying the
//! tenant's key destroys them with everything else it sealed.

use std::collections::BTreeMap;
use std::sync::Arc;

use lh_bus::Bus;
use lh_events::{subject, WorkloadEnvRef, WorkloadSpec};
use lh_rpc::workload_env::{StorageGrant, WorkloadEnvReply, WorkloadEnvRequest};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::keyring::KeyProvider;
use crate::seal::{self, SealError, KEYS_SCHEMA, WORKLOAD_ENV_TABLE};
use crate::storage::{StorageError, TenantStorage};

/// Queue group the gateways answer in: one answer per request.
const QUEUE_GROUP: &str = "gateway";

/// The secret salt a lease's environment hashes with: derived from the
/// tenant's key, so that a retried request hashes the same values the same
/// way, and nobody without the key (anyone, once it is destroyed) can test
/// a guess against the hash in the log.
fn salt(key: &[u8; 32], lease_id: Uuid) -> [u8; lh_domain::workload::ENV_SALT_BYTES] {
    let mut hash = Sha256::new();
    hash.update(b"leasehold workload env salt\0");
    hash.update(key);
    hash.update(lease_id.as_bytes());
    hash.finalize().into()
}

/// Values taken out of a request, to store once its event is on the log.
pub struct PendingEnv {
    key: [u8; 32],
    lease_id: Uuid,
    values: BTreeMap<String, String>,
}

/// Moves `workload`'s values out of it, leaving their names and hash
/// (`env_ref`). `None` when there are none.
pub async fn take_values(
    pool: &PgPool,
    keys: &dyn KeyProvider,
    tenant_id: Uuid,
    lease_id: Uuid,
    workload: &mut WorkloadSpec,
) -> Result<Option<PendingEnv>, SealError> {
    if workload.env.is_empty() {
        return Ok(None);
    }
    let key = seal::ensure_key(pool, keys, tenant_id)
        .await
        .map_err(SealError::LoadKey)?
        .ok_or(SealError::Erased(tenant_id))?;
    let values = std::mem::take(&mut workload.env);
    workload.env_ref = Some(WorkloadEnvRef {
        lease_id,
        names: values.keys().cloned().collect(),
        sha256: lh_domain::workload::env_digest(&salt(&key, lease_id), &values),
    });
    Ok(Some(PendingEnv {
        key,
        lease_id,
        values,
    }))
}

/// Stores the values sealed. A retried request finds them stored already:
/// the first request's values are the ones its event hashes.
pub async fn store(pool: &PgPool, tenant_id: Uuid, pending: PendingEnv) -> Result<(), SealError> {
    let json = serde_json::to_string(&pending.values).map_err(SealError::Serialise)?;
    sqlx::query(&format!(
        "INSERT INTO {KEYS_SCHEMA}.{WORKLOAD_ENV_TABLE} (lease_id, tenant_id, sealed) VALUES ($1, $2, $3)
         ON CONFLICT (lease_id) DO NOTHING"
    ))
    .bind(pending.lease_id)
    .bind(tenant_id)
    .bind(seal::seal(&pending.key, &json))
    .execute(pool)
    .await?;
    Ok(())
}

/// What the gateway's view says of a lease an environment is asked for.
#[derive(sqlx::FromRow)]
struct LeaseRow {
    tenant_id: Uuid,
    node_id: Option<String>,
    state: String,
    workload: Option<sqlx::types::Json<serde_json::Value>>,
    /// A gang's members' nodes.
    members: Vec<String>,
}

/// The answer to node `node_token` (its subject token) asking for
/// `lease_id`'s environment.
async fn answer(
    pool: &PgPool,
    keys: &dyn KeyProvider,
    storage: Option<(&TenantStorage, &Bus)>,
    node_token: &str,
    request: &WorkloadEnvRequest,
) -> anyhow::Result<WorkloadEnvReply> {
    let lease_id = request.lease_id;
    let not_yet = |why: &str| Ok(WorkloadEnvReply::NotYet { why: why.into() });
    let refused = |why: &str| Ok(WorkloadEnvReply::Refused { why: why.into() });
    let lease: Option<LeaseRow> = sqlx::query_as(
        "SELECT tenant_id, node_id, state, workload,
                    ARRAY(SELECT m->>'node_id' FROM jsonb_array_elements(members) m) AS members
             FROM leases WHERE id = $1",
    )
    .bind(lease_id)
    .fetch_optional(pool)
    .await?;
    let Some(lease) = lease else {
        return not_yet("the gateway does not know the lease yet");
    };
    if matches!(lease.state.as_str(), "ended" | "rejected") {
        return refused("the lease has ended");
    }
    // The view may lag behind a placement or a move to this node: that
    // is worth asking again, and says nothing of another node's lease.
    let on_this_node = lease
        .node_id
        .iter()
        .chain(&lease.members)
        .any(|node| subject::token(node) == node_token);
    if !on_this_node {
        return not_yet("the gateway does not show the lease on this node yet");
    }
    let env_ref = lease
        .workload
        .as_ref()
        .and_then(|w| w.0.get("env").cloned())
        .and_then(|env| serde_json::from_value::<WorkloadEnvRef>(env).ok());
    let Some(key) = seal::load_key(pool, keys, lease.tenant_id).await? else {
        return refused("the lease's tenant is erased");
    };
    let grant = match (request.storage, storage) {
        (false, _) => None,
        (true, None) => return refused("this platform keeps no tenant data (no object store)"),
        (true, Some((storage, bus))) => {
            match storage.ensure(pool, keys, bus, lease.tenant_id).await {
                Ok(access) => Some(StorageGrant {
                    endpoint: storage.public().endpoint.clone(),
                    region: storage.public().region.clone(),
                    bucket: access.bucket,
                    access_key_id: access.credentials.access_key_id,
                    secret_access_key: access.credentials.secret_access_key,
                    allow_http: storage.public().allow_http,
                }),
                Err(StorageError::Erased) => return refused("the lease's tenant is erased"),
                Err(e) => return not_yet(&format!("the tenant's storage: {e}")),
            }
        }
    };
    let Some(env_ref) = env_ref else {
        if grant.is_some() {
            return Ok(WorkloadEnvReply::Values {
                values: BTreeMap::new(),
                salt: String::new(),
                storage: grant,
            });
        }
        return refused("the lease's request keeps no environment");
    };
    let sealed: Option<String> = sqlx::query_scalar(&format!(
        "SELECT sealed FROM {KEYS_SCHEMA}.{WORKLOAD_ENV_TABLE} WHERE lease_id = $1 AND tenant_id = $2"
    ))
    .bind(env_ref.lease_id)
    .bind(lease.tenant_id)
    .fetch_optional(pool)
    .await?;
    let Some(sealed) = sealed else {
        return not_yet("the environment is not stored yet");
    };
    let values = seal::open(&key, &sealed)
        .and_then(|json| serde_json::from_str(&json).ok())
        .ok_or_else(|| anyhow::anyhow!("lease {lease_id}: the stored environment does not open"))?;
    Ok(WorkloadEnvReply::Values {
        values,
        salt: hex::encode(salt(&key, env_ref.lease_id)),
        storage: grant,
    })
}

/// Answers nodes' requests for environments until the connection ends.
pub async fn serve(
    bus: Bus,
    pool: PgPool,
    keys: Arc<dyn KeyProvider>,
    storage: Option<Arc<TenantStorage>>,
) -> anyhow::Result<()> {
    lh_bus::rpc::serve_subjects(
        &bus,
        subject::RPC_GATEWAY_WORKLOAD_ENV_ALL,
        QUEUE_GROUP,
        |on: &str, request: WorkloadEnvRequest| {
            let (pool, keys, storage, bus) =
                (pool.clone(), keys.clone(), storage.clone(), bus.clone());
            let node_token = on
                .strip_prefix(subject::RPC_GATEWAY_WORKLOAD_ENV_PREFIX)
                .unwrap_or_default()
                .to_string();
            async move {
                let storage = storage.as_deref().map(|s| (s, &bus));
                let reply = answer(&pool, keys.as_ref(), storage, &node_token, &request).await;
                match &reply {
                    Ok(WorkloadEnvReply::Values { .. }) => {
                        tracing::info!(lease = %request.lease_id, node = %node_token, "environment given to its node");
                    }
                    Ok(WorkloadEnvReply::Refused { why }) => {
                        tracing::warn!(lease = %request.lease_id, node = %node_token, why, "environment refused");
                    }
                    Ok(WorkloadEnvReply::NotYet { .. }) => {}
                    Err(e) => {
                        tracing::warn!(lease = %request.lease_id, node = %node_token, error = %e, "cannot answer for an environment");
                    }
                }
                reply.map_err(|e| format!("{e:#}"))
            }
        },
    )
    .await?;
    anyhow::bail!("the workload environment subscription ended")
}
