//! On an MPS node every client of a GPU gets the smallest share that GPU has
//! hosted since it was last empty, so a GPU there hosts shares of one size
//! at a time; a HAMi-core node holds each share to its own size and mixes
//! them.

use super::given::*;
use crate::state::pending::NO_GPU_OF_THIS_SHARE_SIZE;

fn queued_reason(s: &State, lease: Uuid) -> String {
    match &s.leases[&lease].status {
        Status::Queued { reason, .. } => reason.clone(),
        other => panic!("{lease} is {other:?}, not queued"),
    }
}

fn l(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

fn ended(lease: Uuid, node: &str) -> EventData {
    EventData::LeaseEnded(fixtures::ended(lease, node, Utc::now(), EndReason::Stopped))
}

#[test]
fn given_an_mps_node_when_shares_of_one_size_arrive_then_they_share_a_gpu() {
    let t = l(1);
    let mut s = given(vec![
        node_enforcing("m", 2, Isolation::Container, GpuSharing::Mps),
        tenant(t, 8),
        request_frac(l(2), t, 250, 10),
        request_frac(l(3), t, 250, 10),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(where_is(&s, l(2)), where_is(&s, l(3)));
}

#[test]
fn given_an_mps_gpu_hosting_one_size_when_another_size_arrives_then_it_goes_to_another_gpu() {
    let t = l(1);
    let mut s = given(vec![
        node_enforcing("m", 2, Isolation::Container, GpuSharing::Mps),
        tenant(t, 8),
        request_frac(l(2), t, 250, 10),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    s.apply(5000, &env(request_frac(l(3), t, 500, 20)));
    settle(&mut s, Utc::now(), &Rules::default());
    let (small, large) = (where_is(&s, l(2)), where_is(&s, l(3)));
    assert_eq!(small.0, large.0);
    assert_ne!(small.1, large.1, "sizes on separate GPUs");
}

#[test]
fn given_a_one_gpu_mps_node_hosting_one_size_when_another_size_arrives_then_it_waits_until_the_gpu_empties(
) {
    let t = l(1);
    let mut s = given(vec![
        node_enforcing("m", 1, Isolation::Container, GpuSharing::Mps),
        tenant(t, 8),
        request_frac(l(2), t, 250, 10),
        request_frac(l(3), t, 250, 10),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    s.apply(5000, &env(request_frac(l(4), t, 500, 20)));
    settle(&mut s, Utc::now(), &Rules::default());
    let reason = queued_reason(&s, l(4));
    assert!(reason.starts_with(NO_GPU_OF_THIS_SHARE_SIZE), "{reason}");

    // One of the two ends: the other keeps the GPU to its size.
    s.apply(6000, &env(ended(l(2), "m")));
    settle(&mut s, Utc::now(), &Rules::default());
    assert!(matches!(s.leases[&l(4)].status, Status::Queued { .. }));
    // The GPU empties: it takes the other size.
    s.apply(7000, &env(ended(l(3), "m")));
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(where_is(&s, l(4)), ("m".to_string(), vec![0]));
}

#[test]
fn given_a_hami_core_node_when_shares_of_two_sizes_arrive_then_they_share_a_gpu() {
    let t = l(1);
    let mut s = given(vec![
        node_enforcing("h", 1, Isolation::Container, GpuSharing::HamiCore),
        tenant(t, 8),
        request_frac(l(2), t, 250, 10),
        request_frac(l(3), t, 500, 20),
    ]);
    settle(&mut s, Utc::now(), &Rules::default());
    assert_eq!(where_is(&s, l(2)), ("h".to_string(), vec![0]));
    assert_eq!(where_is(&s, l(3)), ("h".to_string(), vec![0]));
}

#[test]
fn given_an_empty_mps_gpu_when_any_size_arrives_then_it_takes_it() {
    let t = l(1);
    for (milli, vram_gb) in [(1, 1), (250, 10), (1000, fixtures::MODEL_VRAM_GB)] {
        let mut s = given(vec![
            node_enforcing("m", 1, Isolation::Container, GpuSharing::Mps),
            tenant(t, 8),
            request_frac(l(2), t, milli, vram_gb),
        ]);
        settle(&mut s, Utc::now(), &Rules::default());
        assert_eq!(where_is(&s, l(2)), ("m".to_string(), vec![0]));
    }
}
