//! A tenant's data on object storage (docs/adr/031): its bucket and
//! identity (`lh.evt.storage.<tenant>`), and its datasets, each an
//! aggregate of its own (`lh.evt.dataset.<dataset id>`), so that adding a
//! version never moves the guarded sequence of the tenant. What the data
//! holds (file names, bytes) stays in the tenant's bucket: the log, which
//! an erasure cannot reach, records names, sizes and content hashes only.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A tenant's storage is ready: its bucket exists, and an identity of its
/// own may use that bucket and nothing else. The secret is never logged:
/// the gateway keeps it sealed with the tenant's key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageProvisioned {
    pub tenant_id: Uuid,
    pub bucket: String,
    /// The access key the tenant's identity signs with (not a secret).
    pub access_key_id: String,
}

/// A tenant's objects, snapshots and identity were deleted, as its erasure
/// asks: nothing of its data is left on the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageErased {
    pub tenant_id: Uuid,
    pub bucket: String,
    /// Objects deleted from the bucket before it was removed.
    pub objects_deleted: u64,
}

/// A version of a tenant's dataset was stored: immutable, addressed by the
/// SHA-256 of its manifest (which names every file and the chunks it is
/// made of), readable by the tenant's leases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DatasetVersionAdded {
    /// Derived from the tenant and the name (`dataset_id`), so that two
    /// versions added at once land on one subject and its guard orders them.
    pub dataset_id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    /// Lowercase hex SHA-256 of the version's manifest.
    pub version: String,
    /// Bytes of all its files.
    pub bytes: u64,
    pub files: u64,
}

/// A dataset's version, or the whole dataset, is gone: leases asked for
/// from now on cannot name it. Leases that hold it keep their copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DatasetRemoved {
    pub dataset_id: Uuid,
    pub tenant_id: Uuid,
    /// The one version removed; every version when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The id of tenant `tenant_id`'s dataset `name`.
pub fn dataset_id(tenant_id: Uuid, name: &str) -> Uuid {
    crate::derived_id(&["dataset", &tenant_id.to_string(), name])
}
