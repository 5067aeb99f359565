//! A tenant's SSH public keys (`lh.evt.ssh_key.<key id>`), which let its
//! people into its leases through the gateway's SSH endpoint (docs/adr/030).
//! Each key is an aggregate of its own: adding or removing one never moves
//! the guarded sequence of its tenant, whose writers would otherwise have
//! to count it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A tenant registered an SSH public key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SshKeyAdded {
    /// Derived from the tenant and the key's fingerprint, so that one key
    /// added twice at once lands on one subject and its guard refuses the
    /// second.
    pub key_id: Uuid,
    pub tenant_id: Uuid,
    /// The tenant's label for the key.
    pub name: String,
    /// The key in OpenSSH's one-line form, algorithm and base64 only: the
    /// comment the tenant's file carried is not kept.
    pub public_key: String,
    /// `SHA256:` and the unpadded base64 of the key's SHA-256, as
    /// `ssh-keygen -l` prints it.
    pub fingerprint: String,
}

/// A tenant's SSH key lets nobody in from now on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SshKeyRemoved {
    pub key_id: Uuid,
    pub tenant_id: Uuid,
}
