//! The body of every error the API answers: RFC 9457 problem details, as
//! `application/problem+json`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// RFC 9457 problem details.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// The request field at fault, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}
