//! The placement-rate benchmark's short version: a small backlog through the
//! same binary, so the harness cannot rot into measuring nothing. The binary
//! itself fails when a lease stays unplaced or a GPU is given twice; 40
//! one-GPU leases fit 8 nodes of 8 GPUs with room to spare.

use std::process::Command;

#[test]
fn two_replicas_place_a_small_backlog_each_lease_once() {
    let output = Command::new(env!("CARGO_BIN_EXE_lease-rate"))
        .args([
            "--leases",
            "40",
            "--nodes",
            "8",
            "--replicas",
            "2",
            "--writers",
            "4",
        ])
        .output()
        .expect("lease-rate runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "lease-rate failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(" placed=40 "), "{stdout}");
}
