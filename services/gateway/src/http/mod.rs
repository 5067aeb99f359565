//! The REST API: one module per resource, one error type rendered as
//! `application/problem+json`, one authentication extractor.

pub mod audit;
pub mod invoices;
pub mod leases;
pub mod nodes;
pub mod tenants;

use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use lh_bus::Bus;
use lh_projection::Progress;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use utoipa::OpenApi;
use uuid::Uuid;

/// How long a write waits for its own event to show in the read model.
pub const READ_YOUR_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a call to another service may take.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

#[derive(Clone)]
pub struct ApiContext {
    pub bus: Bus,
    pub pool: PgPool,
    pub progress: Progress,
    pub admin_token: String,
    pub auditor_token: Option<String>,
}

pub fn router(ctx: ApiContext) -> Router {
    Router::new()
        .route("/v1/tenants", post(tenants::create))
        .route("/v1/leases", post(leases::create).get(leases::list))
        .route("/v1/leases/{id}", get(leases::get))
        .route("/v1/leases/{id}/stop", post(leases::stop))
        .route("/v1/leases/{id}/resume", post(leases::resume))
        .route("/v1/nodes/{id}/drain", post(nodes::drain))
        .route("/v1/nodes/{id}/uncordon", post(nodes::uncordon))
        .route("/v1/invoices", get(invoices::show))
        .route("/v1/audit/verify", get(audit::verify))
        .route("/openapi.json", get(openapi_json))
        .fallback(|| async { ApiError::not_found("no such route") })
        .with_state(ctx)
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Leasehold API", description = "Rent whole GPUs by the second."),
    paths(
        tenants::create,
        leases::create,
        leases::list,
        leases::get,
        leases::stop,
        leases::resume,
        nodes::drain,
        nodes::uncordon,
        invoices::show,
        audit::verify
    ),
    components(schemas(
        Problem,
        lh_rpc::invoice::Invoice,
        lh_rpc::invoice::InvoiceLine,
        lh_rpc::audit::VerifyResponse
    )),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
}

async fn openapi_json() -> impl IntoResponse {
    axum::Json(ApiDoc::openapi())
}

/// RFC 9457 problem details.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
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

/// Every error the API returns.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub slug: &'static str,
    pub title: &'static str,
    pub detail: String,
    pub field: Option<String>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            detail: detail.into(),
            field: None,
        }
    }

    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "Bad request",
            detail,
        )
    }

    pub fn unprocessable(detail: impl Into<String>, field: &str) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-field",
            "Invalid field",
            detail,
        )
        .field(field)
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            detail,
        )
        .field("Authorization")
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "Forbidden", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", "Conflict", detail)
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Service unavailable",
            detail,
        )
    }

    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "the gateway failed; the error is in its log",
        )
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        Self::internal(e)
    }
}

impl From<lh_bus::BusError> for ApiError {
    fn from(e: lh_bus::BusError) -> Self {
        Self::unavailable(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Problem {
            kind: format!("https://leasehold.dev/problems/{}", self.slug),
            title: self.title.to_string(),
            status: self.status.as_u16(),
            detail: self.detail,
            field: self.field,
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

/// JSON body that refuses malformed input with a problem naming the field.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
                "send the body as application/json",
            )
            .field("Content-Type"));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        if bytes.len() > MAX_BODY_BYTES {
            return Err(ApiError::bad_request("body too large"));
        }
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        serde_path_to_error::deserialize(de)
            .map(ApiJson)
            .map_err(|e| json_problem(&e))
    }
}

fn json_problem(e: &serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let inner = e.inner();
    let mut field = e.path().to_string();
    let message = inner.to_string();
    // serde names the unknown or missing field in its message; the path may
    // or may not include it already.
    for prefix in ["unknown field `", "missing field `"] {
        if let Some(name) = message
            .strip_prefix(prefix)
            .and_then(|r| r.split('`').next())
        {
            if field == "." || field.is_empty() {
                field = name.to_string();
            } else if !field.ends_with(name) {
                field = format!("{field}.{name}");
            }
        }
    }
    let detail = if inner.is_syntax() || inner.is_eof() {
        format!("malformed JSON: {message}")
    } else {
        message
    };
    let err = ApiError::bad_request(detail);
    if field == "." || field == "?" || field.is_empty() || inner.is_syntax() || inner.is_eof() {
        err
    } else {
        err.field(field)
    }
}

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
        match row {
            Some((id, max_gpus)) => Ok(Caller::Tenant {
                id,
                max_gpus: max_gpus as u32,
            }),
            None => Err(ApiError::unauthorized("unknown API key")),
        }
    }
}

/// Waits until the read model shows the event at `sequence`.
pub async fn read_your_write(ctx: &ApiContext, sequence: u64) -> Result<(), ApiError> {
    if ctx
        .progress
        .wait_for(sequence, READ_YOUR_WRITE_TIMEOUT)
        .await
    {
        Ok(())
    } else {
        Err(ApiError::unavailable(
            "the event was stored but the read model is behind; retry the GET shortly",
        ))
    }
}
