//! What can go wrong. Messages name the operation, the object or path, and
//! for a service's refusal its HTTP status and error code; never a secret.

use crate::manifest::ManifestError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid storage configuration: {0}")]
    Config(String),

    /// The service answered, and not with success.
    #[error("{op}: HTTP {status} {code}: {message}")]
    Service {
        op: String,
        status: u16,
        code: String,
        message: String,
    },

    /// No answer: connection, TLS or timeout.
    #[error("{op}: {source}")]
    Transport {
        op: String,
        #[source]
        source: reqwest::Error,
    },

    /// A tenant store's call failed; the source names the status and the
    /// service's answer.
    #[error("{op} {key}: {source}")]
    Object {
        op: &'static str,
        key: String,
        #[source]
        source: Box<object_store::Error>,
    },

    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("invalid manifest: {0}")]
    Manifest(#[from] ManifestError),

    /// An object under `chunks/sha256/` whose bytes are not the ones its
    /// name says.
    #[error("chunk {chunk} is not what its name says: {why}")]
    ChunkMismatch { chunk: String, why: String },

    #[error("{path} changed since it was scanned: {what}")]
    Changed { path: String, what: String },

    #[error("limit reached: {0}")]
    Limit(String),

    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// The HTTP status the service answered, where it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Service { status, .. } => Some(*status),
            Error::Object { source, .. } => match source.as_ref() {
                object_store::Error::NotFound { .. } => Some(404),
                object_store::Error::PermissionDenied { .. } => Some(403),
                object_store::Error::Unauthenticated { .. } => Some(401),
                object_store::Error::AlreadyExists { .. } => Some(409),
                object_store::Error::Precondition { .. } => Some(412),
                // A listing's refusal comes as a generic error, and the
                // type that holds its status is private to object_store:
                // its message is what says it.
                other => status_in_message(&other.to_string()),
            },
            _ => None,
        }
    }

    /// The credentials may not do this (or are no longer valid).
    pub fn is_denied(&self) -> bool {
        matches!(self.status(), Some(401 | 403))
    }

    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    pub(crate) fn io(path: impl std::fmt::Display, source: std::io::Error) -> Error {
        Error::Io {
            path: path.to_string(),
            source,
        }
    }

    pub(crate) fn object(op: &'static str, key: &str, source: object_store::Error) -> Error {
        Error::Object {
            op,
            key: key.to_owned(),
            source: Box::new(source),
        }
    }
}

/// The status in object_store's "Server returned non-2xx status code: 403
/// Forbidden: ..." message.
fn status_in_message(message: &str) -> Option<u16> {
    const MARK: &str = "non-2xx status code: ";
    let at = message.find(MARK)? + MARK.len();
    message.get(at..at + 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_status_is_read_from_object_stores_message() {
        let message = "Error performing GET http://127.0.0.1:1/b?list-type=2 in 1ms - \
                       Server returned non-2xx status code: 403 Forbidden: <Error>";
        assert_eq!(super::status_in_message(message), Some(403));
        assert_eq!(super::status_in_message("connection refused"), None);
    }
}
