use super::given::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Whole(u32),
    Frac(u32, u32),
    Mig(&'static str),
    End(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u32..=4).prop_map(Op::Whole),
        (1u32..=1000, 1u32..=40).prop_map(|(m, v)| Op::Frac(m, v)),
        proptest::sample::select(
            lh_placement::mig::profiles("A100-40GB")
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
        )
        .prop_map(Op::Mig),
        any::<usize>().prop_map(Op::End),
    ]
}

/// Every GPU within 1000 milli and its VRAM; a whole GPU held by
/// one lease and shared with none.
fn check(s: &State) {
    let mut whole: HashMap<(String, u32), Uuid> = HashMap::new();
    let mut shared: HashMap<(String, u32), (u32, u32)> = HashMap::new();
    for (lease, (node, indices)) in &s.fleet.holdings {
        for &i in indices {
            let key = (node.clone(), i);
            match s.fleet.shares.get(lease) {
                Some(&(m, v)) => {
                    let e = shared.entry(key).or_default();
                    e.0 += m;
                    e.1 += v;
                }
                None => {
                    assert!(whole.insert(key, *lease).is_none(), "GPU held twice");
                }
            }
        }
    }
    for (key, (m, v)) in &shared {
        assert!(!whole.contains_key(key), "whole and shared at once");
        assert!(*m <= 1000, "{key:?} over 1000 milli: {m}");
        assert!(*v <= 40, "{key:?} over its VRAM: {v}");
    }
    for n in s.fleet.nodes.values() {
        for g in &n.gpus {
            assert!(g.used_milli() <= 1000 && g.used_vram_gb() <= g.vram_gb);
            // MIG GPUs hold MIG instances only, laid out by NVIDIA's rules.
            if g.mig {
                assert!(g.held_by.is_none() && g.shares.iter().all(|x| x.mig.is_some()));
            } else {
                assert!(g.shares.iter().all(|x| x.mig.is_none()));
            }
            if g.mig {
                let geometry = lh_placement::mig::geometry(&g.model).unwrap();
                let instances = g
                    .shares
                    .iter()
                    .map(|x| {
                        let m = x.mig.as_ref().unwrap();
                        lh_placement::mig::Instance {
                            profile: geometry.profile(&m.profile).unwrap(),
                            start: m.start,
                            lease: Some(x.lease_id),
                            persistent: false,
                            unowned: false,
                        }
                    })
                    .collect();
                lh_placement::mig::MigLayout::from_instances(geometry, instances)
                    .expect("a valid MIG layout");
            }
        }
    }
}

/// Applies `op` (a request of tenant `t` as `lease`, or the end of
/// one live lease) and every decision that follows it, decided with the
/// engine the case's passes before left.
fn step(s: &mut Given, seq: &mut u64, op: Op, lease: Uuid, t: Uuid, now: DateTime<Utc>) {
    let data = match op {
        Op::Whole(n) => request(lease, t, n),
        Op::Frac(m, v) => request_frac(lease, t, m, v),
        Op::Mig(p) => request_mig(lease, t, p),
        Op::End(i) => {
            let mut live: Vec<Uuid> = s.leases.keys().copied().collect();
            if live.is_empty() {
                return;
            }
            live.sort();
            EventData::LeaseEnded(LeaseEnded {
                lease_id: live[i % live.len()],
                node_id: None,
                ended_at: now,
                reason: EndReason::Stopped,
                exit_code: None,
                failure: None,
            })
        }
    };
    *seq += 1;
    s.apply(*seq, &env(data));
    for batch in decide_at(s, now, &Rules::default()).batches {
        for (e, _) in batch {
            *seq += 1;
            s.apply(*seq, &e);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn gpus_are_never_oversubscribed(ops in proptest::collection::vec(op(), 1..60)) {
        let t = Uuid::from_u128(1);
        let mut s = given(vec![node("a", 4), node("b", 2), node_mig("m", 2), tenant(t, 1000)]);
        let mut seq = 100u64;
        let now = Utc::now();
        for (k, op) in ops.into_iter().enumerate() {
            let lease = Uuid::from_u128(1000 + k as u128);
            step(&mut s, &mut seq, op, lease, t, now);
            check(&s);
        }
    }

    #[test]
    fn quotas_are_never_exceeded(
        quotas in proptest::collection::vec((1u32..=4, proptest::option::of(5u32..=120)), 3),
        ops in proptest::collection::vec((0usize..3, op()), 1..60),
    ) {
        let tenants: Vec<Uuid> = (0..3).map(|i| Uuid::from_u128(10 + i)).collect();
        let mut events = vec![node("a", 4), node("b", 4), node_mig("m", 2)];
        for (t, (gpus, vram)) in tenants.iter().zip(&quotas) {
            events.push(tenant_with(*t, *gpus, *vram, 1));
        }
        let mut s = given(events);
        let mut seq = 100u64;
        let now = Utc::now();
        for (k, (who, op)) in ops.into_iter().enumerate() {
            let (lease, t) = (Uuid::from_u128(1000 + k as u128), tenants[who]);
            step(&mut s, &mut seq, op, lease, t, now);
            // What each tenant holds, from the fleet (not from the
            // scheduler's own counters): whole GPUs at 1000 milli
            // and their VRAM, shares and MIG instances by size.
            let mut held: HashMap<Uuid, (u64, u64)> = HashMap::new();
            for (lease, (node, indices)) in &s.fleet.holdings {
                let tenant = s.leases[lease].tenant_id;
                let h = held.entry(tenant).or_default();
                match s.fleet.shares.get(lease) {
                    Some(&(m, v)) => {
                        h.0 += u64::from(m);
                        h.1 += u64::from(v);
                    }
                    None => {
                        for i in indices {
                            let g = &s.fleet.nodes[node].gpus[*i as usize];
                            h.0 += 1000;
                            h.1 += u64::from(g.vram_gb);
                        }
                    }
                }
            }
            for (t, (gpus, vram)) in tenants.iter().zip(&quotas) {
                let (m, v) = held.get(t).copied().unwrap_or_default();
                prop_assert!(m <= u64::from(*gpus) * 1000, "{t}: {m} milli over {gpus} GPUs");
                if let Some(max) = vram {
                    prop_assert!(v <= u64::from(*max), "{t}: {v} GB over {max} GB");
                }
            }
        }
    }
}
