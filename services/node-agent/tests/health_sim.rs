//! The simulated backend and the health trackers together, driven through
//! a fault script by a manual clock, one tick a second, as the agent would
//! drive them (events first, then a sample), with the default rules.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_node_agent::gpu::backend::sim::fleet::{FleetFile, SimNode};
use lh_node_agent::gpu::backend::sim::{FaultScript, SimBackend};
use lh_node_agent::gpu::backend::GpuBackend;
use lh_node_agent::gpu::health::{GpuHealth, HealthRules, NodeHealth, Outcome};
use lh_service::clock::ManualClock;
use uuid::Uuid;

use GpuHealth::{Degraded, Healthy, Unhealthy};

#[derive(Debug, PartialEq)]
enum Seen {
    Transition {
        second: u64,
        gpu: u32,
        from: GpuHealth,
        to: GpuHealth,
    },
    Charged {
        second: u64,
        gpu: u32,
        xid: u64,
    },
    Ignored {
        second: u64,
        gpu: u32,
    },
    NodeStopped {
        second: u64,
    },
}

fn t0() -> DateTime<Utc> {
    "2026-12-01T08:00:00Z".parse().unwrap()
}

fn node(gpu_count: u32) -> SimNode {
    toml::from_str(&format!(
        "id = \"node-a\"\nzone = \"z\"\nhostname = \"h\"\ngpu_model = \"A100-40GB\"\ngpu_count = {gpu_count}\nvram_gb = 40\n"
    ))
    .unwrap()
}

/// Runs the agent's loop for `seconds` ticks (or until the node stops) and
/// returns what it saw. `leases` says which lease holds which GPU.
fn run(
    backend: &SimBackend,
    clock: &ManualClock,
    gpu_count: u32,
    leases: &BTreeMap<u32, Uuid>,
    seconds: u64,
) -> Vec<Seen> {
    let mut health = NodeHealth::new(0..gpu_count, HealthRules::default());
    let mut seen = Vec::new();
    for second in 0..=seconds {
        let now = clock.advance(Duration::from_secs(u64::from(second > 0)));
        assert_eq!(now, t0() + chrono::Duration::seconds(second as i64));
        let events = match backend.wait_events(Duration::ZERO) {
            Ok(e) => e,
            Err(e) if e.is_node_stopped() => {
                seen.push(Seen::NodeStopped { second });
                break;
            }
            Err(e) => panic!("{e}"),
        };
        for event in &events {
            match health.fault(event, leases.get(&event.index).copied(), now) {
                Outcome::Transition(x) => seen.push(Seen::Transition {
                    second,
                    gpu: x.gpu_index,
                    from: x.from,
                    to: x.to,
                }),
                Outcome::ChargedToLease {
                    gpu_index,
                    xid,
                    lease_id,
                    ..
                } => {
                    assert_eq!(Some(&lease_id), leases.get(&gpu_index));
                    seen.push(Seen::Charged {
                        second,
                        gpu: gpu_index,
                        xid,
                    })
                }
                Outcome::Ignored { gpu_index, .. } => seen.push(Seen::Ignored {
                    second,
                    gpu: gpu_index,
                }),
                Outcome::AlreadyUnhealthy { .. } => {}
            }
        }
        let samples = match backend.sample(now) {
            Ok(s) => s,
            Err(e) if e.is_node_stopped() => {
                seen.push(Seen::NodeStopped { second });
                break;
            }
            Err(e) => panic!("{e}"),
        };
        for x in health.observe(&samples, now) {
            seen.push(Seen::Transition {
                second,
                gpu: x.gpu_index,
                from: x.from,
                to: x.to,
            });
        }
    }
    seen
}

#[test]
fn a_scripted_run_gives_exactly_these_transitions() {
    let script = FaultScript::parse(
        r#"
        # GPU 0: hot from second 15 (40 → 92 °C over 10..15), cool at 60.
        [[fault]]
        after_secs = 10
        gpu = 0
        kind = "temperature"
        to_c = 92
        over_secs = 5
        [[fault]]
        after_secs = 60
        gpu = 0
        kind = "recover"

        # GPU 1: memory full from 5, then off the bus at 50, back at 100.
        [[fault]]
        after_secs = 5
        gpu = 1
        kind = "memory"
        to_pct = 97
        [[fault]]
        after_secs = 50
        gpu = 1
        kind = "xid"
        code = 79
        [[fault]]
        after_secs = 100
        gpu = 1
        kind = "recover"

        # XID 13 on GPU 2 (a lease holds it) and on GPU 3 (none does).
        [[fault]]
        after_secs = 30
        gpu = 2
        kind = "xid"
        code = 13
        [[fault]]
        after_secs = 31
        gpu = 3
        kind = "xid"
        code = 13

        # GPU 3: an uncorrectable ECC error at 40.
        [[fault]]
        after_secs = 40
        gpu = 3
        kind = "ecc_double_bit"

        # The node stops at 140.
        [[fault]]
        after_secs = 140
        kind = "node_stop"
        "#,
        "scripted run",
    )
    .unwrap();
    let clock = ManualClock::new(t0());
    let backend = SimBackend::new(node(4), script, t0(), clock.shared()).unwrap();
    let leases = BTreeMap::from([(2, Uuid::from_u128(2))]);

    let seen = run(&backend, &clock, 4, &leases, 300);

    let tr = |second, gpu, from, to| Seen::Transition {
        second,
        gpu,
        from,
        to,
    };
    assert_eq!(
        seen,
        [
            Seen::Charged {
                second: 30,
                gpu: 2,
                xid: 13
            },
            Seen::Ignored { second: 31, gpu: 3 },
            // Full since 5: the 30 s window has held at 35.
            tr(35, 1, Healthy, Degraded),
            // The ECC event comes before that second's sample, whose
            // counter delta then finds the GPU already unhealthy.
            tr(40, 3, Healthy, Unhealthy),
            // 92 °C from 15 (82 °C at 14): degraded at 45.
            tr(45, 0, Healthy, Degraded),
            tr(50, 1, Degraded, Unhealthy),
            // Clean samples 41..=70: thirty of them.
            tr(70, 3, Unhealthy, Healthy),
            // Cool from 60: 60..=89.
            tr(89, 0, Degraded, Healthy),
            // No samples while off the bus; they reappear at 100.
            tr(129, 1, Unhealthy, Healthy),
            Seen::NodeStopped { second: 140 },
        ]
    );
}

#[test]
fn the_example_fault_script_runs_every_path() {
    // dev/faults.toml against an 8-GPU node, as the docs describe it.
    let dir = tempfile::tempdir().unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dev/faults.toml");
    std::fs::copy(&example, dir.path().join("faults.toml")).unwrap();
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(
        &fleet,
        "[[node]]\nid = \"node-a\"\nzone = \"z\"\nhostname = \"h\"\ngpu_model = \"A100-40GB\"\ngpu_count = 8\nvram_gb = 40\nfaults = \"faults.toml\"\n",
    )
    .unwrap();
    let file = FleetFile::load(&fleet).unwrap();
    let node = file.node("node-a", &fleet).unwrap();
    let script = node.fault_script(&fleet).unwrap().expect("script named");
    let clock = ManualClock::new(t0());
    let backend = SimBackend::new(node.clone(), script, t0(), clock.shared()).unwrap();

    let seen = run(&backend, &clock, 8, &BTreeMap::new(), 400);

    let tr = |second, gpu, from, to| Seen::Transition {
        second,
        gpu,
        from,
        to,
    };
    assert_eq!(
        seen,
        [
            Seen::Ignored { second: 30, gpu: 2 },
            tr(40, 3, Healthy, Unhealthy),
            tr(40, 1, Healthy, Degraded),
            tr(45, 0, Healthy, Degraded),
            tr(50, 4, Healthy, Unhealthy),
            tr(80, 4, Unhealthy, Healthy),
            tr(99, 1, Degraded, Healthy),
            tr(119, 0, Degraded, Healthy),
            tr(149, 3, Unhealthy, Healthy),
            Seen::NodeStopped { second: 180 },
        ]
    );
}
