//! A tenant's SSH public keys (`/v1/ssh-keys`), with which its people
//! enter its leases through the gateway's SSH endpoint.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// `POST /v1/ssh-keys`
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddSshKey {
    /// 1 to 64 printable characters, to tell the keys apart.
    pub name: String,
    /// One line of an OpenSSH `.pub` file (`ssh-ed25519 AAAA... comment`):
    /// ssh-ed25519, ecdsa-sha2-nistp256/384/521, or ssh-rsa of 2048 bits
    /// or more. The comment is not kept.
    pub public_key: String,
}

/// One SSH key as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SshKeyView {
    pub id: Uuid,
    pub name: String,
    /// `SHA256:...`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
    /// The key in OpenSSH's one-line form, without a comment.
    pub public_key: String,
    pub created_at: DateTime<Utc>,
}

/// `GET /v1/ssh-keys`
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SshKeyList {
    pub ssh_keys: Vec<SshKeyView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_add_request_naming_an_unknown_field_is_refused() {
        let key =
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICwrvRQo4fBsmsPgL/+PUCnKbEL6OH8oNHiWJMzu55pN";
        let ok = format!(r#"{{"name":"laptop","public_key":"{key}"}}"#);
        assert!(serde_json::from_str::<AddSshKey>(&ok).is_ok());
        let extra = format!(r#"{{"name":"laptop","public_key":"{key}","options":"no-pty"}}"#);
        assert!(serde_json::from_str::<AddSshKey>(&extra).is_err());
    }
}
