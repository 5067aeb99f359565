//! Leases go only where the node enforces what they need: a share's caps
//! (HAMi-core or MPS), and for an untrusted tenant a runtime that isolates its
//! workload (containers). Otherwise they wait, saying what is missing.

use super::given::*;
use crate::state::pending::{NO_ISOLATION, NO_SHARING};

fn queued_reason(s: &State, lease: Uuid) -> String {
    match &s.leases[&lease].status {
        Status::Queued { reason, .. } => reason.clone(),
        other => panic!("{lease} is {other:?}, not queued"),
    }
}

fn node_of(s: &State, lease: Uuid) -> String {
    where_is(s, lease).0
}

#[test]
fn given_no_node_enforcing_shares_when_a_share_is_requested_then_it_waits_saying_so() {
    let t = Uuid::from_u128(1);
    let share = Uuid::from_u128(2);
    let mut s = given(vec![
        node_enforcing("a", 2, Isolation::Container, GpuSharing::None),
        tenant(t, 8),
        request_frac(share, t, 500, 10),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    let reason = queued_reason(&s, share);
    assert!(reason.starts_with(NO_SHARING), "{reason}");
    // A whole GPU still goes there.
    let whole = Uuid::from_u128(3);
    s.apply(5000, &env(request(whole, t, 1)));
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(node_of(&s, whole), "a");
}

#[test]
fn given_one_node_enforcing_shares_when_a_share_is_requested_then_it_goes_there() {
    let t = Uuid::from_u128(1);
    let share = Uuid::from_u128(2);
    let mut s = given(vec![
        node_enforcing("a", 2, Isolation::Container, GpuSharing::None),
        node_enforcing("b", 2, Isolation::Container, GpuSharing::HamiCore),
        tenant(t, 8),
        request_frac(share, t, 500, 10),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(node_of(&s, share), "b");
}

#[test]
fn given_a_node_enforcing_shares_through_mps_when_a_share_is_requested_then_it_goes_there() {
    let t = Uuid::from_u128(1);
    let share = Uuid::from_u128(2);
    let mut s = given(vec![
        node_enforcing("a", 2, Isolation::Container, GpuSharing::None),
        node_enforcing("m", 2, Isolation::Container, GpuSharing::Mps),
        tenant(t, 8),
        request_frac(share, t, 500, 10),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(node_of(&s, share), "m");
}

#[test]
fn given_a_share_placed_before_its_node_stopped_enforcing_when_planning_then_its_gpu_is_busy() {
    let t = Uuid::from_u128(1);
    let share = Uuid::from_u128(2);
    let mut s = given(vec![
        node_enforcing("a", 1, Isolation::Container, GpuSharing::HamiCore),
        tenant(t, 8),
        request_frac(share, t, 500, 10),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(node_of(&s, share), "a");
    // The agent restarts without HAMi-core: the share runs on, and no
    // whole-GPU lease may take its GPU.
    s.apply(
        9000,
        &env(node_enforcing(
            "a",
            1,
            Isolation::Container,
            GpuSharing::None,
        )),
    );
    let whole = Uuid::from_u128(3);
    s.apply(9001, &env(request(whole, t, 1)));
    settle(&mut s, Utc::now(), &Rules::default());
    assert!(queued_reason(&s, whole).starts_with("waiting for capacity"));
}

#[test]
fn given_only_a_process_runtime_node_when_an_untrusted_tenant_asks_then_it_waits_saying_so() {
    let (untrusted, trusted) = (Uuid::from_u128(1), Uuid::from_u128(2));
    let (l1, l2) = (Uuid::from_u128(3), Uuid::from_u128(4));
    let mut s = given(vec![
        node_enforcing("p", 2, Isolation::Cgroup, GpuSharing::None),
        tenant(untrusted, 8),
        trusted_tenant(trusted, 8),
        request(l1, untrusted, 1),
        request(l2, trusted, 1),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(queued_reason(&s, l1), NO_ISOLATION);
    assert_eq!(node_of(&s, l2), "p", "a trusted tenant may use it");
}

#[test]
fn given_a_container_node_and_a_process_node_when_an_untrusted_tenant_asks_then_it_gets_the_container_node(
) {
    let t = Uuid::from_u128(1);
    let leases: Vec<Uuid> = (10..14).map(Uuid::from_u128).collect();
    let mut events = vec![
        node_enforcing("p", 8, Isolation::None, GpuSharing::HamiCore),
        node_enforcing("c", 2, Isolation::Container, GpuSharing::HamiCore),
        tenant(t, 100),
    ];
    events.extend(leases.iter().map(|l| request(*l, t, 1)));
    let mut s = given(events);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(node_of(&s, leases[0]), "c");
    assert_eq!(node_of(&s, leases[1]), "c");
    // The container node is full: the rest wait for it, not for "p".
    assert!(queued_reason(&s, leases[2]).starts_with("waiting for capacity"));
    assert!(!s.fleet.holdings.values().any(|(n, _)| n == "p"));
}

#[test]
fn given_a_registration_older_than_the_fields_when_folded_then_the_node_enforces_nothing() {
    let old = serde_json::json!({
        "node_id": "a", "zone": "z", "hostname": "a",
        "gpus": [{"index": 0, "uuid": "GPU-a-0", "model": fixtures::MODEL, "vram_gb": 40, "mig": false}]
    });
    let r: NodeRegistered = serde_json::from_value(old).unwrap();
    assert_eq!(
        (r.isolation, r.gpu_sharing),
        (Isolation::None, GpuSharing::None)
    );
    let t = Uuid::from_u128(1);
    let l = Uuid::from_u128(2);
    let mut s = given(vec![
        EventData::NodeRegistered(r),
        tenant(t, 8),
        request(l, t, 1),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(queued_reason(&s, l), NO_ISOLATION);
}
