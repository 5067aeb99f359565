//! A tenant's data on object storage (docs/adr/031): its bucket and
//! identity (`lh.evt.storage.<tenant>`), and its datasets, each an
//! aggregate of its own (`lh.evt.dataset.<dataset id>`), so that adding a
//! version never moves the guarded sequence of the tenant, and its
//! workspaces' snapshots, restores and removals, likewise each workspace's
//! own (`lh.evt.workspace.<workspace id>`). What the data
//! holds (file names, bytes) stays in the tenant's bucket: the log, which
//! an erasure cannot reach, records names, sizes and content hashes only.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
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

/// What a tenant's bucket held when the gateway listed it: every object's
/// size added up. Measured once an interval (`LH_STORAGE_MEASURE_INTERVAL_SECS`);
/// pricing charges the bytes of one measurement for the time until the next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageMeasured {
    pub tenant_id: Uuid,
    pub bucket: String,
    pub bytes: u64,
    /// When the listing that counted `bytes` ended, by the gateway's clock.
    pub measured_at: DateTime<Utc>,
    /// Over the tenant's storage quota then: its identity may read, list
    /// and delete but not write, until a measurement finds it under.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub writes_stopped: bool,
}

/// What a tenant's storage cost over `from..to` (one measurement's bytes
/// held until the next measurement, or until the erasure), within one
/// invoice period and one price book. A tenant's storage charges of a
/// period add up to the rounded cost of all its storage in that period
/// (see `lh_domain::storage_rating`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageChargeAccrued {
    pub charge_id: Uuid,
    pub tenant_id: Uuid,
    /// [`storage_id`] of the tenant: the charge subject its storage charges
    /// are written on, and the id an invoice line of them carries where a
    /// lease's line carries the lease's.
    pub storage_id: Uuid,
    /// `YYYY-MM`.
    pub period: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// The bytes held over `from..to`.
    pub bytes: u64,
    /// `to - from` in whole seconds, rounded down (the amount is priced on
    /// the exact span).
    pub billed_seconds: u64,
    /// The book's price, CNY per GB (10^9 bytes) per month of 730 hours.
    #[schemars(with = "String")]
    pub price_cny_per_gb_month: Decimal,
    #[schemars(with = "String")]
    pub amount: Decimal,
    pub currency: String,
    pub price_book_version: u32,
    /// The exact cost of the tenant's storage in `period` up to `to`, as
    /// bytes x seconds x CNY per GB-month summed (divided by 10^9 x 730 x
    /// 3600 it is CNY): where the next charge of the period continues.
    #[schemars(with = "String")]
    pub priced_byte_seconds: Decimal,
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

/// A workspace's head was copied to its snapshot of a day: a copy of the
/// manifest, the chunks shared, so it holds no data of its own. Taken once
/// a day by the gateway for every workspace, and when the tenant asks;
/// taken again the same day over a changed head, it replaces that day's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkspaceSnapshotted {
    /// Derived from the tenant and the name (`workspace_id`).
    pub workspace_id: Uuid,
    pub tenant_id: Uuid,
    pub workspace: String,
    /// The day it is the snapshot of (UTC), `YYYY-MM-DD`.
    pub snapshot: String,
    /// Lowercase hex SHA-256 of the manifest it copies.
    pub manifest: String,
    /// Bytes of all its files.
    pub bytes: u64,
    pub files: u64,
}

/// A workspace's head was set to one of its snapshots: the next lease that
/// mounts it starts from there. Only while no lease holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkspaceRestored {
    pub workspace_id: Uuid,
    pub tenant_id: Uuid,
    pub workspace: String,
    /// The snapshot's day, `YYYY-MM-DD`.
    pub snapshot: String,
    /// The digest of the manifest now current.
    pub manifest: String,
}

/// A workspace and its snapshots were deleted; its chunks go at the next
/// collection. Only while no lease holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkspaceRemoved {
    pub workspace_id: Uuid,
    pub tenant_id: Uuid,
    pub workspace: String,
}

/// The id of tenant `tenant_id`'s workspace `name`: its aggregate.
pub fn workspace_id(tenant_id: Uuid, name: &str) -> Uuid {
    crate::derived_id(&["workspace", &tenant_id.to_string(), name])
}

/// The id of tenant `tenant_id`'s dataset `name`.
pub fn dataset_id(tenant_id: Uuid, name: &str) -> Uuid {
    crate::derived_id(&["dataset", &tenant_id.to_string(), name])
}

/// The id of tenant `tenant_id`'s storage as billing knows it: its storage
/// charges are written on `lh.evt.charge.<this id>` and its invoice lines
/// carry it where a lease's carry the lease's id.
pub fn storage_id(tenant_id: Uuid) -> Uuid {
    crate::derived_id(&["storage", &tenant_id.to_string()])
}
