//! End-to-end suites that start the whole platform in one test process; the
//! suites are in `tests/`, the harness is `lh_test_stack` (`tests/stack`).
//!
//! They live here, not in one service's crate, because each exercises several
//! services at once and a service crate must not depend on its peers.
