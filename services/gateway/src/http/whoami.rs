//! `GET /v1/whoami`: who the key is, so that a client (the console, a
//! script) shows what this caller may do without trying each thing.

use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::Caller;

/// The caller a key names.
#[derive(Debug, Serialize, ToSchema)]
pub struct Whoami {
    /// `tenant` or `operator`.
    pub kind: &'static str,
    /// An operator's role: `admin` or `auditor`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// An operator's name: its named key's, its OIDC subject, or `bootstrap`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A tenant's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<Uuid>,
}

#[utoipa::path(
    get, path = "/v1/whoami",
    responses((status = 200, body = Whoami), (status = 401, body = super::Problem))
)]
pub async fn whoami(caller: Caller) -> Json<Whoami> {
    Json(match caller {
        Caller::Operator(o) => Whoami {
            kind: "operator",
            role: Some(o.role.as_str()),
            name: Some(o.name),
            tenant_id: None,
        },
        Caller::Tenant { id, .. } => Whoami {
            kind: "tenant",
            role: None,
            name: None,
            tenant_id: Some(id),
        },
    })
}
