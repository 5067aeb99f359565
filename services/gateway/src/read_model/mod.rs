//! What the API reads, below the API: the lease view the projection writes
//! and the handlers answer with, and the copy of those views kept in
//! memory. It knows nothing of HTTP, so the projection and the handlers can
//! both stand on it without leaning on each other.

pub mod lease;
pub mod lease_views;
