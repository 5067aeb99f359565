//! Who is calling: the admin token, the auditor token or a tenant's API
//! key, compared in constant time.

use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts, Method};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{ApiContext, ApiError};

/// Who is calling.
#[derive(Debug, Clone)]
pub enum Caller {
    Admin,
    Auditor,
    Tenant { id: Uuid, max_gpus: u32 },
}

impl Caller {
    pub fn tenant(&self) -> Result<(Uuid, u32), ApiError> {
        match self {
            Caller::Tenant { id, max_gpus } => Ok((*id, *max_gpus)),
            _ => Err(ApiError::forbidden("this call needs a tenant API key")),
        }
    }

    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Caller::Admin => Ok(()),
            _ => Err(ApiError::forbidden("this call needs the admin token")),
        }
    }
}

pub fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Compares secrets without leaking where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    let (ha, hb) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    ha.iter()
        .zip(hb.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

impl FromRequestParts<ApiContext> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, ctx: &ApiContext) -> Result<Self, ApiError> {
        let value = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer <key>"))?
            .to_str()
            .map_err(|_| ApiError::unauthorized("Authorization header is not text"))?;
        let token = value
            .strip_prefix("Bearer ")
            .ok_or_else(|| ApiError::unauthorized("Authorization must be `Bearer <key>`"))?
            .trim();
        if same_secret(token, &ctx.admin_token) {
            return Ok(Caller::Admin);
        }
        if let Some(auditor) = &ctx.auditor_token {
            if same_secret(token, auditor) {
                return Ok(Caller::Auditor);
            }
        }
        let row: Option<(Uuid, i32)> =
            sqlx::query_as("SELECT id, max_gpus FROM tenants WHERE api_key_sha256 = $1")
                .bind(sha256_hex(token))
                .fetch_optional(&ctx.pool)
                .await?;
        let Some((id, max_gpus)) = row else {
            return Err(ApiError::unauthorized("unknown API key"));
        };
        let write = !matches!(parts.method, Method::GET | Method::HEAD);
        if write {
            if let Err(wait) = ctx.write_budgets.spend(id, std::time::Instant::now()) {
                metrics::counter!("lh_gateway_writes_limited_total").increment(1);
                return Err(ApiError::too_many_requests(format!(
                    "this tenant's writes are limited to {} a second (bursts of {})",
                    ctx.limits.writes_per_s, ctx.limits.write_burst
                ))
                .retry_after(wait.as_secs_f64().ceil().max(1.0) as u32));
            }
        }
        Ok(Caller::Tenant {
            id,
            max_gpus: max_gpus as u32,
        })
    }
}
