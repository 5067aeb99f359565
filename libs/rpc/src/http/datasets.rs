//! A tenant's data on object storage (`/v1/datasets`, `/v1/storage`):
//! datasets, each a list of immutable versions addressed by content hash,
//! and the credentials of the tenant's own bucket, which `lh data` uploads
//! and downloads with (docs/adr/031).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/datasets`: a version whose chunks are in the tenant's bucket
/// already (`lh data put` sends them first).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddDatasetVersion {
    /// 1 to 63 of a-z, 0-9, `-`, `_` and `.`, starting with a letter or digit.
    pub name: String,
    /// The version's manifest: every file, directory and symbolic link, and
    /// the SHA-256 of each 8 MiB chunk of each file (`lh_storage::Manifest`).
    #[schema(value_type = Object)]
    pub manifest: serde_json::Value,
}

/// One version of a dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DatasetVersionView {
    /// Lowercase hex SHA-256 of its manifest.
    pub version: String,
    pub bytes: u64,
    pub files: u64,
    pub created_at: DateTime<Utc>,
}

/// A dataset, its newest version first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DatasetView {
    pub name: String,
    pub versions: Vec<DatasetVersionView>,
}

/// `GET /v1/datasets`
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DatasetList {
    pub datasets: Vec<DatasetView>,
}

/// `GET /v1/storage/credentials`: the tenant's own identity on the store,
/// which may use the tenant's bucket and nothing else.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct StorageCredentials {
    /// The S3 endpoint, as clients reach it.
    pub endpoint: String,
    pub region: String,
    pub bucket: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Plain HTTP to an endpoint off loopback, as the platform is set up
    /// (a private network); clients refuse it otherwise.
    #[serde(default)]
    pub allow_http: bool,
}

impl std::fmt::Debug for StorageCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageCredentials")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// `GET /v1/storage`: what the tenant's bucket held when last measured,
/// and how much it may hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StorageUsage {
    /// Bytes at the last measurement; 0 before the first.
    pub bytes: u64,
    /// When it was measured; none before the first measurement (the
    /// gateway measures each bucket once an interval).
    pub measured_at: Option<DateTime<Utc>>,
    /// The tenant's quota, in GB of 10^9 bytes; none: no limit.
    pub max_storage_gb: Option<u32>,
    /// The last measurement found the tenant over its quota: nothing may
    /// be written to its bucket (uploads, workspace syncs, containers)
    /// until it deletes enough and a measurement finds it under.
    #[serde(default)]
    pub writes_stopped: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_print_their_secret() {
        let c = StorageCredentials {
            endpoint: "http://127.0.0.1:8333".into(),
            region: "us-east-1".into(),
            bucket: "lh-t-x".into(),
            access_key_id: "AK".into(),
            secret_access_key: "very-secret".into(),
            allow_http: false,
        };
        assert!(!format!("{c:?}").contains("very-secret"));
    }

    #[test]
    fn an_add_request_naming_an_unknown_field_is_refused() {
        assert!(serde_json::from_str::<AddDatasetVersion>(
            r#"{"name":"mnist","manifest":{"files":[]}}"#
        )
        .is_ok());
        assert!(serde_json::from_str::<AddDatasetVersion>(
            r#"{"name":"mnist","manifest":{"files":[]},"public":true}"#
        )
        .is_err());
    }
}
