//! A decision pass keeps its placement engine for the next, loading again
//! only the nodes that changed, and plans on a planned fleet that copies only
//! what it changes; liveness and migrations look only at the nodes filed as
//! needing it. Every pass must decide exactly as one that takes neither
//! shortcut ([`FromScratch`]): same events, same nodes and GPUs,
//! same seeded draws among ties. Held to it over random runs of requests,
//! ends, starts, node joins (and re-registrations of another shape),
//! losses, rejoins, cordons, GPU health changes, and passes whose decisions
//! are stored whole, in part, or not at all.

use super::given::*;
use proptest::prelude::*;

use crate::planner::Planner;
use crate::state::decide::EngineSource;
use lh_placement::ShapeMix;

/// The reference a kept engine is held to: a new engine at every sync,
/// and every held lease looked at for a move.
#[derive(Default)]
struct FromScratch {
    planner: Option<Planner>,
}

impl EngineSource for FromScratch {
    fn sync(&mut self, planned: &PlannedFleet, shape_mix: &ShapeMix) -> &mut Planner {
        self.planner = None;
        Planner::sync(&mut self.planner, planned, shape_mix)
    }

    fn synced(&mut self) -> &mut Planner {
        self.planner
            .as_mut()
            .expect("a synced pass holds an engine")
    }

    fn trusts_node_watch(&self) -> bool {
        false
    }
}

/// Nodes the runs use, by number.
const NODES: u8 = 6;

#[derive(Debug, Clone)]
enum Op {
    /// A request of one of a few shapes, on-demand or spot, of tenant 0
    /// (trusted) or 1 (not).
    Request {
        shape: u8,
        spot: bool,
        tenant: u8,
    },
    End(usize),
    /// A placed lease starts (an hour ago: old enough to preempt).
    Start(usize),
    /// Node `node` registers (again) with `gpus` GPUs of one kind.
    Join {
        node: u8,
        gpus: u32,
        kind: u8,
    },
    Lose(u8),
    Rejoin(u8),
    Health {
        node: u8,
        gpu: u32,
        healthy: bool,
    },
    Cordon {
        node: u8,
        moving: bool,
    },
    Uncordon(u8),
    /// A pass whose first `stored` batches are stored (a lost race keeps
    /// the rest out).
    Pass {
        stored: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..7, any::<bool>(), 0u8..2)
            .prop_map(|(shape, spot, tenant)| Op::Request { shape, spot, tenant }),
        2 => any::<usize>().prop_map(Op::End),
        2 => any::<usize>().prop_map(Op::Start),
        2 => (0..NODES, 1u32..=4, 0u8..4).prop_map(|(node, gpus, kind)| Op::Join { node, gpus, kind }),
        1 => (0..NODES).prop_map(Op::Lose),
        1 => (0..NODES).prop_map(Op::Rejoin),
        2 => (0..NODES, 0u32..4, any::<bool>())
            .prop_map(|(node, gpu, healthy)| Op::Health { node, gpu, healthy }),
        1 => (0..NODES, any::<bool>()).prop_map(|(node, moving)| Op::Cordon { node, moving }),
        1 => (0..NODES).prop_map(Op::Uncordon),
        4 => (0usize..4).prop_map(|stored| Op::Pass { stored: stored * 3 }),
    ]
}

fn node_id(n: u8) -> String {
    format!("n{n}")
}

fn joined(n: u8, gpus: u32, kind: u8) -> EventData {
    let id = node_id(n);
    match kind {
        0 => node(&id, gpus),
        // In MIG mode, an instance no lease holds on its first GPU.
        1 => {
            let EventData::NodeRegistered(mut r) = node_mig(&id, gpus) else {
                unreachable!()
            };
            r.gpus[0].unowned_mig_instances = vec![MigInstance {
                profile: "1g.5gb".into(),
                start: 6,
            }];
            EventData::NodeRegistered(r)
        }
        2 => node_enforcing(&id, gpus, Isolation::Container, GpuSharing::Mps),
        _ => node_enforcing(&id, gpus, Isolation::None, GpuSharing::None),
    }
}

fn requested(shape: u8, spot: bool, lease: Uuid, t: Uuid) -> EventData {
    let tier = if spot { Tier::Spot } else { Tier::Basic };
    match shape {
        0..=2 => request_full(lease, t, u32::from(shape) + 1, tier, 0),
        3 => request_frac(lease, t, 250, 10),
        4 => request_frac(lease, t, 500, 20),
        5 => request_mig(lease, t, "1g.5gb"),
        _ => request_mig(lease, t, "3g.20gb"),
    }
}

/// What a pass decided, to compare: every event's data and guard.
fn decided(d: &Decisions) -> Vec<Vec<(serde_json::Value, String)>> {
    d.batches
        .iter()
        .map(|b| {
            b.iter()
                .map(|(e, expect)| {
                    (
                        serde_json::to_value(&e.data).expect("events serialise"),
                        format!("{expect:?}"),
                    )
                })
                .collect()
        })
        .collect()
}

/// The event `op` stands for, if any.
fn event_of(
    s: &State,
    op: &Op,
    lease: Uuid,
    tenants: &[Uuid],
    now: DateTime<Utc>,
) -> Option<EventData> {
    let pick = |i: usize, holding: bool| {
        let mut live: Vec<Uuid> = s
            .leases
            .values()
            .filter(|l| !holding || l.status == Status::Holding)
            .map(|l| l.id)
            .collect();
        live.sort();
        (!live.is_empty()).then(|| live[i % live.len()])
    };
    Some(match *op {
        Op::Request {
            shape,
            spot,
            tenant,
        } => requested(shape, spot, lease, tenants[usize::from(tenant)]),
        Op::End(i) => EventData::LeaseEnded(LeaseEnded {
            lease_id: pick(i, false)?,
            node_id: None,
            ended_at: now,
            reason: EndReason::Stopped,
            exit_code: None,
            failure: None,
        }),
        Op::Start(i) => started(pick(i, true)?, now - Duration::hours(1)),
        Op::Join {
            node: n,
            gpus,
            kind,
        } => joined(n, gpus, kind),
        Op::Lose(n) => EventData::NodeLost(NodeLost {
            node_id: node_id(n),
            last_heard_at: now,
            silence_ms: 5_000,
        }),
        Op::Rejoin(n) => EventData::NodeRejoined(NodeRejoined {
            node_id: node_id(n),
            heard_at: now,
        }),
        Op::Health {
            node: n,
            gpu,
            healthy,
        } => {
            let to = if healthy {
                GpuHealth::Healthy
            } else {
                GpuHealth::Unhealthy
            };
            health(&node_id(n), gpu, to, now)
        }
        Op::Cordon { node: n, moving } => EventData::NodeCordoned(NodeCordoned {
            node_id: node_id(n),
            drain: moving.then_some(DrainMode::Move),
            reason: "test".into(),
        }),
        Op::Uncordon(n) => EventData::NodeUncordoned(NodeUncordoned {
            node_id: node_id(n),
        }),
        Op::Pass { .. } => return None,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn a_kept_engine_decides_as_a_fresh_one(
        start in proptest::collection::vec((0..NODES, 1u32..=4, 0u8..4), 1..5),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let tenants = [Uuid::from_u128(1), Uuid::from_u128(2)];
        let mut events = vec![trusted_tenant(tenants[0], 1000), tenant(tenants[1], 1000)];
        events.extend(start.iter().map(|&(n, gpus, kind)| joined(n, gpus, kind)));
        let mut s = given(events);
        // Long after the requests: a whole lease that waits starves, and
        // holds GPUs back for itself.
        let now = Utc::now() + Duration::hours(2);
        let rules = Rules::default();
        let mut engine = PlacementEngineCache::default();
        let mut seq = 100u64;
        for (k, op) in ops.iter().enumerate() {
            let lease = Uuid::from_u128(1000 + k as u128);
            if let Some(data) = event_of(&s, op, lease, &tenants, now) {
                seq += 1;
                s.apply(seq, &env_at(data, now - Duration::hours(1)));
            }
            prop_assert!(s.watch_is_current(), "after {:?}", op);
            let fresh = s.decide_with(now, &rules, &mut FromScratch::default());
            let kept = s.decide(now, &rules, &mut engine);
            prop_assert_eq!(decided(&kept), decided(&fresh), "after {:?}", op);
            if let Op::Pass { stored } = *op {
                for batch in kept.batches.iter().take(stored.max(1)) {
                    for (e, _) in batch {
                        seq += 1;
                        s.apply(seq, e);
                    }
                }
            }
        }
    }

    #[test]
    fn filed_nodes_say_what_walking_the_fleet_says(
        ops in proptest::collection::vec((0u8..4, 0..NODES, 0i64..12_000), 1..60),
        checks in proptest::collection::vec(0i64..20_000, 1..8),
    ) {
        let t0 = Utc::now();
        let rules = Rules::default();
        let mut s = given(vec![node("n0", 1), node("n1", 2)]);
        s.liveness_since = Some(t0);
        let mut seq = 100u64;
        let at = |ms: i64| t0 + Duration::milliseconds(ms);
        for (k, &(what, n, ms)) in ops.iter().enumerate() {
            let id = node_id(n);
            match what {
                0 => s.heard_live(&id, at(ms), at(ms), &rules),
                1 => s.heard(&id, at(ms - 500), at(ms)),
                _ => {
                    let data = match (what, k % 3) {
                        (2, 0) => node(&id, 2),
                        (2, _) => EventData::NodeLost(NodeLost {
                            node_id: id.clone(),
                            last_heard_at: at(ms),
                            silence_ms: 1,
                        }),
                        _ => EventData::NodeRejoined(NodeRejoined {
                            node_id: id.clone(),
                            heard_at: at(ms),
                        }),
                    };
                    seq += 1;
                    s.apply(seq, &env(data));
                }
            }
            prop_assert!(s.watch_is_current());
            for &c in &checks {
                prop_assert_eq!(
                    s.liveness_changes(at(c), &rules),
                    s.liveness_changes_walking(at(c), &rules)
                );
            }
        }
    }
}
