//! Why a lease leaves its node (`lease.migrated.reason`). The scheduler
//! writes these words and the ledger reads them back: a failure (a lost
//! node, an unhealthy GPU) counts against the SLA, a drain is planned.

const DRAINED: &str = " drained";

/// The node stopped answering.
pub fn node_lost(node_id: &str) -> String {
    format!("node {node_id} lost")
}

/// An operator drained the node with `move`.
pub fn node_drained(node_id: &str) -> String {
    format!("node {node_id}{DRAINED}")
}

/// One of the lease's GPUs turned unhealthy (an XID such as 79, a failed
/// self-test): the GPU's fault, not the workload's.
pub fn gpu_unhealthy(gpu_index: u32, node_id: &str) -> String {
    format!("GPU {gpu_index} of node {node_id} unhealthy")
}

/// Whether a move for `reason` is a failure that interrupts the lease:
/// anything but a drain, so that words this code does not know count in
/// the tenant's favour.
pub fn is_failure(reason: &str) -> bool {
    !reason.ends_with(DRAINED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_node_and_an_unhealthy_gpu_are_failures_a_drain_is_not() {
        assert!(is_failure(&node_lost("n1")));
        assert!(is_failure(&gpu_unhealthy(0, "n1")));
        assert!(!is_failure(&node_drained("n1")));
        // A node whose name happens to say so is still lost.
        assert!(is_failure(&node_lost("drained")));
    }
}
