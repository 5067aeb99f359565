//! The red-team harness, short: each node, each service, a tenant, the
//! auditor and a stranger try everything their credentials let them send
//! at two leases they do not hold, one on each node, which fill the
//! fleet: forged reports, foreign ids, extreme and reversed times, types
//! and subjects not theirs, junk, oversized payloads and floods. Then:
//! nothing obeyed, no GPU given twice, each lease billed its real run
//! once, every service ready. The long run is `load-tests/red-team.sh`.

use lh_test_stack::red_team;
use lh_test_stack::{Stack, TWO_NODES};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_principal_moves_what_it_does_not_hold() {
    let stack = Stack::start(TWO_NODES).await;
    let (report, found) = red_team::run(&stack, &["node-a", "node-b"], 1).await;
    eprintln!("{report}");
    assert!(report.attempts >= 100, "{report}");
    assert_eq!(report.principals, 10, "{report}");
    assert!(report.is_clean(), "{report}\n{}", found.join("\n"));
    stack.assert_none_stopped();
}
