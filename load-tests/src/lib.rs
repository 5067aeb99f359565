//! Load harnesses for Leasehold. Each binary starts the servers it needs on
//! loopback, runs a bounded amount of work and prints its figures with the
//! method, so results in docs/benchmarks.md can be reproduced.
