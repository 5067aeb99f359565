//! The one error of the bus: what a caller tells apart (a conflict to
//! decide again on, a batch stored before, a stream weaker than required,
//! bad settings) and, as text, everything else NATS says. Every room of the
//! bus returns it, so it stands apart from all of them.

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        url: String,
        source: async_nats::ConnectError,
    },
    #[error("bad NATS credentials: {0}")]
    BadCredentials(String),
    #[error("bad NATS server address {addr:?}: {reason}")]
    BadServerAddr { addr: String, reason: String },
    #[error("stream {stream} is weaker than required: {problems}")]
    WeakStream { stream: String, problems: String },
    /// Someone else appended to an aggregate this write expected to be at a
    /// given sequence: reload and decide again.
    #[error("optimistic concurrency conflict: {0}")]
    Conflict(String),
    /// An atomic batch repeated an event id JetStream already holds: the
    /// batch was stored before (a retry of a decision that went through).
    #[error("duplicate atomic batch: {0}")]
    DuplicateBatch(String),
    #[error("JetStream error: {0}")]
    JetStream(String),
}

pub type Result<T, E = BusError> = std::result::Result<T, E>;

pub(crate) fn js_err(e: impl std::fmt::Display) -> BusError {
    BusError::JetStream(e.to_string())
}
