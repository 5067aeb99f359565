//! `ApiError`, every error the API returns, rendered as
//! `application/problem+json` (RFC 9457), and the JSON body extractor that
//! names the field at fault.

use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

pub use lh_rpc::http::Problem;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

use crate::seal::SealError;

/// Every error the API returns.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub slug: &'static str,
    pub title: &'static str,
    pub detail: String,
    pub field: Option<String>,
    /// Seconds after which a retry may succeed (`Retry-After`).
    pub retry_after_secs: Option<u32>,
}

/// What a client is told to wait before retrying while PostgreSQL or NATS
/// is out of reach, in seconds.
pub const RETRY_AFTER_OUTAGE_S: u32 = 2;

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
            retry_after_secs: None,
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

    /// A write that would take the tenant over a quota of its own; 422, as
    /// any field over a limit, with a type of its own so that a client can
    /// tell it from a malformed field.
    pub fn quota_exceeded(detail: impl Into<String>, field: &str) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "quota-exceeded",
            "Quota exceeded",
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

    /// A prepaid tenant whose balance is exhausted asks for more.
    pub fn payment_required(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYMENT_REQUIRED,
            "balance-exhausted",
            "Balance exhausted",
            detail,
        )
    }

    pub fn too_many_requests(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too-many-requests",
            "Too many requests",
            detail,
        )
    }

    /// What the API relays to failed on its far side (a lease's port).
    pub fn bad_gateway(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "bad-gateway",
            "Bad gateway",
            detail,
        )
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Service unavailable",
            detail,
        )
    }

    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after_secs = Some(seconds);
        self
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
        if lh_projection::is_unavailable(&e) {
            tracing::warn!(error = %e, "database unavailable");
            Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "database-unavailable",
                "Database unavailable",
                "the gateway's database is out of reach; retry shortly",
            )
            .retry_after(RETRY_AFTER_OUTAGE_S)
        } else {
            Self::internal(e)
        }
    }
}

impl From<lh_bus::BusError> for ApiError {
    fn from(e: lh_bus::BusError) -> Self {
        // The detail names subjects, servers and JetStream's own errors:
        // the operator's to read in the log, not the client's.
        tracing::warn!(error = %e, "event log or service call failed");
        Self::unavailable(
            "the event log or a service behind the gateway is out of reach; retry shortly",
        )
        .retry_after(RETRY_AFTER_OUTAGE_S)
    }
}

/// A tenant erased since is a conflict, as any write to it is; the
/// database as any read of it; a key or environment that cannot be sealed
/// is the gateway's own failure, its cause left to the log.
impl From<SealError> for ApiError {
    fn from(e: SealError) -> Self {
        match e {
            SealError::Erased(_) => Self::conflict(e.to_string()),
            SealError::Database(e) => e.into(),
            SealError::Wrap(_) | SealError::LoadKey(_) | SealError::Serialise(_) => {
                Self::internal(e)
            }
        }
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
        if let Some(seconds) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
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
