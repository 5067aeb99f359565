//! Errors of `lh`, how they are shown and which exit code each gives.

use serde_json::Value;
use std::fmt;

/// Exit code: success.
pub const EXIT_OK: i32 = 0;
/// Exit code: the command ran but its answer is "no": the audit chain is
/// broken, a `--wait` timed out or the lease finished in another state, or
/// the output could not be written.
pub const EXIT_FAILURE: i32 = 1;
/// Exit code: bad usage (arguments, configuration), a 4xx from the gateway,
/// or a log `audit verify` could not read.
pub const EXIT_CLIENT_ERROR: i32 = 2;
/// Exit code: a 5xx from the gateway, an unusable answer, or the gateway
/// could not be reached.
pub const EXIT_SERVER_ERROR: i32 = 3;

/// An RFC 9457 problem document (`application/problem+json`) as the
/// gateway sends it with every error, read leniently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// HTTP status of the response (the document's own `status` is ignored).
    pub status: u16,
    /// `type`, a URI naming the kind of problem.
    pub kind: Option<String>,
    /// `title`; the status' reason phrase when the body has none.
    pub title: String,
    /// `detail`; for a body that is not a problem document, its text.
    pub detail: Option<String>,
    /// `field`: the request field at fault, if any.
    pub field: Option<String>,
}

/// Longest stretch of a non-JSON error body that is echoed back.
const MAX_RAW_DETAIL: usize = 300;

impl Problem {
    /// Reads an error response. Falls back to the HTTP reason phrase and the
    /// raw body text when the body is not a problem document.
    pub fn from_response(status: u16, body: &str) -> Self {
        let reason = reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .map(str::to_string)
            .unwrap_or_else(|| format!("HTTP {status}"));
        let text = |v: &Value, key: &str| -> Option<String> {
            match v.get(key)? {
                Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
                Value::Null | Value::String(_) => None,
                other => Some(other.to_string()),
            }
        };
        match serde_json::from_str::<Value>(body) {
            Ok(v @ Value::Object(_)) => Problem {
                status,
                kind: text(&v, "type"),
                title: text(&v, "title").unwrap_or(reason),
                detail: text(&v, "detail"),
                field: text(&v, "field"),
            },
            _ => {
                let trimmed = body.trim();
                let detail = (!trimmed.is_empty()).then(|| {
                    let mut s: String = trimmed.chars().take(MAX_RAW_DETAIL).collect();
                    if s.len() < trimmed.len() {
                        s.push('…');
                    }
                    s
                });
                Problem {
                    status,
                    kind: None,
                    title: reason,
                    detail,
                    field: None,
                }
            }
        }
    }
}

impl fmt::Display for Problem {
    /// `<title>: <detail> (field: <field>)`, leaving out what is missing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.title)?;
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        if let Some(field) = &self.field {
            write!(f, " (field: {field})")?;
        }
        Ok(())
    }
}

/// What can go wrong talking to the gateway.
#[derive(Debug)]
pub enum CliError {
    /// Bad configuration or input found before anything was sent.
    Usage(String),
    /// The gateway answered with an error status.
    Api(Problem),
    /// No answer: connection refused, DNS failure, TLS failure, timeout.
    Unreachable { url: String, reason: String },
    /// The gateway answered 2xx with something that is not the expected JSON.
    BadResponse { url: String, reason: String },
    /// `audit verify` could not read the log from NATS.
    LogUnreadable { url: String, reason: String },
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) | CliError::LogUnreadable { .. } => EXIT_CLIENT_ERROR,
            CliError::Api(p) if (400..500).contains(&p.status) => EXIT_CLIENT_ERROR,
            CliError::Api(_) | CliError::Unreachable { .. } | CliError::BadResponse { .. } => {
                EXIT_SERVER_ERROR
            }
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(msg) => f.write_str(msg),
            CliError::Api(p) => p.fmt(f),
            CliError::Unreachable { url, reason } => {
                write!(f, "could not reach the gateway at {url}: {reason}")
            }
            CliError::LogUnreadable { url, reason } => {
                write!(f, "could not read the log at {url}: {reason}")
            }
            CliError::BadResponse { url, reason } => {
                write!(f, "unexpected answer from {url}: {reason}")
            }
        }
    }
}

impl std::error::Error for CliError {}

/// Exit code for any error `run` returns: a [`CliError`]'s own, else
/// [`EXIT_FAILURE`] (e.g. stdout closed).
pub fn exit_code(err: &anyhow::Error) -> i32 {
    err.downcast_ref::<CliError>()
        .map_or(EXIT_FAILURE, CliError::exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_problem() {
        let body = r#"{"type":"https://leasehold.dev/problems/validation","title":"Invalid request","status":422,"detail":"gpus must be at least 1","field":"gpus"}"#;
        let p = Problem::from_response(422, body);
        assert_eq!(
            p.to_string(),
            "Invalid request: gpus must be at least 1 (field: gpus)"
        );
        assert_eq!(
            p.kind.as_deref(),
            Some("https://leasehold.dev/problems/validation")
        );
        let e = CliError::Api(p);
        assert_eq!(e.exit_code(), EXIT_CLIENT_ERROR);
    }

    #[test]
    fn problem_without_field_or_detail() {
        let p = Problem::from_response(
            404,
            r#"{"type":"about:blank","title":"Not Found","status":404,"detail":"no lease abc"}"#,
        );
        assert_eq!(p.to_string(), "Not Found: no lease abc");
        let p = Problem::from_response(409, r#"{"title":"Conflict","field":null}"#);
        assert_eq!(p.to_string(), "Conflict");
    }

    #[test]
    fn problem_missing_title_uses_reason_phrase() {
        let p = Problem::from_response(403, r#"{"detail":"quota exceeded"}"#);
        assert_eq!(p.to_string(), "Forbidden: quota exceeded");
    }

    #[test]
    fn non_json_error_body() {
        let p = Problem::from_response(502, "upstream connect error\n");
        assert_eq!(p.to_string(), "Bad Gateway: upstream connect error");
        assert_eq!(CliError::Api(p).exit_code(), EXIT_SERVER_ERROR);

        let p = Problem::from_response(500, "");
        assert_eq!(p.to_string(), "Internal Server Error");

        let p = Problem::from_response(599, "[1,2]");
        assert_eq!(p.title, "HTTP 599");

        let long = "x".repeat(1000);
        let p = Problem::from_response(500, &long);
        assert_eq!(p.detail.unwrap().chars().count(), MAX_RAW_DETAIL + 1);
    }

    #[test]
    fn exit_codes() {
        let unreachable = CliError::Unreachable {
            url: "http://127.0.0.1:1/v1/leases".into(),
            reason: "Connection refused".into(),
        };
        assert_eq!(
            unreachable.to_string(),
            "could not reach the gateway at http://127.0.0.1:1/v1/leases: Connection refused"
        );
        assert_eq!(
            exit_code(&anyhow::Error::new(unreachable)),
            EXIT_SERVER_ERROR
        );
        assert_eq!(
            exit_code(&anyhow::Error::new(CliError::Usage("bad".into()))),
            EXIT_CLIENT_ERROR
        );
        assert_eq!(exit_code(&anyhow::anyhow!("broken pipe")), EXIT_FAILURE);
    }
}
