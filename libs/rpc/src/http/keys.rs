//! A tenant's API keys (`/v1/tenants/{id}/keys`): a new one, shown once,
//! and the keys as listed, never with their secrets.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueKey {
    /// When the key stops working (RFC 3339, in the future, at most
    /// three years ahead); never when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct IssuedKey {
    pub key_id: u32,
    /// Shown once; only its SHA-256 is kept.
    pub api_key: String,
    pub prefix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

/// One of a tenant's keys, without its secret.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KeyView {
    pub key_id: u32,
    /// The key's visible beginning.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// `active`, `expired` or `revoked`.
    pub state: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KeyList {
    pub items: Vec<KeyView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issue_request_naming_an_unknown_field_is_refused() {
        assert!(
            serde_json::from_str::<IssueKey>(r#"{"expires_at":"2030-01-01T00:00:00Z"}"#).is_ok()
        );
        assert!(serde_json::from_str::<IssueKey>(r#"{"expiry":"2030-01-01T00:00:00Z"}"#).is_err());
    }
}
