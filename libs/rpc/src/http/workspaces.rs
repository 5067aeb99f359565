//! A tenant's workspaces (`/v1/workspaces`): each the directory its leases
//! read and write, synced to the tenant's bucket by the node that runs the
//! lease, snapshotted once a day (and when the tenant asks) and restorable
//! from a snapshot while no lease holds it (docs/adr/031).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// One snapshot of a workspace: a copy of its manifest on that day (UTC).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkspaceSnapshotView {
    /// The day, `YYYY-MM-DD`: what `POST .../restore` names.
    pub date: String,
    /// Lowercase hex SHA-256 of the manifest it copies.
    pub manifest: String,
    pub bytes: u64,
    pub files: u64,
    /// When it was last written (a snapshot taken again the same day over
    /// a changed workspace replaces that day's).
    pub taken_at: DateTime<Utc>,
}

/// A workspace as its bucket holds it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkspaceView {
    pub name: String,
    /// Lowercase hex SHA-256 of the current manifest.
    pub manifest: String,
    pub bytes: u64,
    pub files: u64,
    /// The last sync of the lease that wrote it.
    pub synced_at: DateTime<Utc>,
    /// The lease whose node wrote it last.
    pub lease_id: Uuid,
    /// That lease's node synced it a last time: nothing more comes from it.
    pub released: bool,
    /// A lease that has not ended and mounts it now: while there is one,
    /// the workspace cannot be restored or removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<Uuid>,
    /// The snapshot it was set back to since its last sync, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<String>,
    /// Newest first.
    pub snapshots: Vec<WorkspaceSnapshotView>,
}

/// `GET /v1/workspaces`
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkspaceList {
    pub workspaces: Vec<WorkspaceView>,
}

/// `POST /v1/workspaces/{name}/restore`
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreWorkspace {
    /// The snapshot's day, `YYYY-MM-DD` (`GET /v1/workspaces` lists them).
    pub snapshot: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_naming_an_unknown_field_is_refused() {
        assert!(serde_json::from_str::<RestoreWorkspace>(r#"{"snapshot":"2026-12-07"}"#).is_ok());
        assert!(serde_json::from_str::<RestoreWorkspace>(
            r#"{"snapshot":"2026-12-07","force":true}"#
        )
        .is_err());
    }
}
