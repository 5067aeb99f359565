//! The fixtures every scheduler test builds its state from.

pub(super) use std::collections::HashMap;

pub(super) use chrono::{DateTime, Duration, Utc};
pub(super) use lh_events::Expect;
pub(super) use lh_events::*;
pub(super) use uuid::Uuid;

pub(super) use crate::state::*;

pub(super) fn env(data: EventData) -> Envelope {
    Envelope::new(Actor::Admin, Utc::now(), data)
}

pub(super) fn env_at(data: EventData, at: DateTime<Utc>) -> Envelope {
    Envelope::new(Actor::Admin, at, data)
}

pub(super) fn node(id: &str, n: u32) -> EventData {
    EventData::NodeRegistered(fixtures::node(
        id,
        "z",
        n,
        fixtures::MODEL,
        fixtures::MODEL_VRAM_GB,
    ))
}

/// A node of `n` GPUs that declares what it enforces.
pub(super) fn node_enforcing(
    id: &str,
    n: u32,
    isolation: Isolation,
    gpu_sharing: GpuSharing,
) -> EventData {
    let EventData::NodeRegistered(mut r) = node(id, n) else {
        unreachable!()
    };
    (r.isolation, r.gpu_sharing) = (isolation, gpu_sharing);
    EventData::NodeRegistered(r)
}

pub(super) fn trusted_tenant(id: Uuid, max_gpus: u32) -> EventData {
    EventData::TenantCreated(TenantCreated {
        trusted: true,
        ..fixtures::tenant(id, max_gpus)
    })
}

pub(super) fn node_mig(id: &str, n: u32) -> EventData {
    let EventData::NodeRegistered(mut r) = node(id, n) else {
        unreachable!()
    };
    r.gpus.iter_mut().for_each(|g| g.mig = true);
    EventData::NodeRegistered(r)
}

pub(super) fn request_mig(lease: Uuid, tenant: Uuid, profile: &str) -> EventData {
    let EventData::LeaseRequested(mut r) = request(lease, tenant, 1) else {
        unreachable!()
    };
    r.mig_profile = Some(profile.into());
    EventData::LeaseRequested(r)
}

pub(super) fn tenant_with(
    id: Uuid,
    max_gpus: u32,
    max_vram_gb: Option<u32>,
    weight: u32,
) -> EventData {
    let mut tenant = fixtures::tenant(id, max_gpus);
    tenant.quota.max_vram_gb = max_vram_gb;
    tenant.weight = weight;
    EventData::TenantCreated(tenant)
}

pub(super) fn tenant(id: Uuid, max_gpus: u32) -> EventData {
    tenant_with(id, max_gpus, None, 1)
}

pub(super) fn request_full(
    lease: Uuid,
    tenant: Uuid,
    gpus: u32,
    tier: Tier,
    priority: i32,
) -> EventData {
    EventData::LeaseRequested(LeaseRequested {
        tier,
        priority,
        ..fixtures::whole_request(lease, tenant, gpus, fixtures::MODEL)
    })
}

pub(super) fn request(lease: Uuid, tenant: Uuid, gpus: u32) -> EventData {
    request_full(lease, tenant, gpus, Tier::Basic, 0)
}

pub(super) fn request_frac(lease: Uuid, tenant: Uuid, milli: u32, vram_gb: u32) -> EventData {
    EventData::LeaseRequested(fixtures::fraction_request(
        lease,
        tenant,
        fixtures::MODEL,
        milli,
        vram_gb,
    ))
}

/// `(node, GPU index)` of a holding lease's GPUs.
pub(super) fn where_is(s: &State, lease: Uuid) -> (String, Vec<u32>) {
    s.fleet.holdings[&lease].clone()
}

pub(super) fn events_of(d: &Decisions) -> Vec<&EventData> {
    d.batches.iter().flatten().map(|(e, _)| &e.data).collect()
}

pub(super) fn health(node: &str, gpu: u32, to: GpuHealth, at: DateTime<Utc>) -> EventData {
    EventData::NodeGpuHealthChanged(NodeGpuHealthChanged {
        node_id: node.into(),
        gpu_index: gpu,
        gpu_uuid: format!("GPU-{node}-{gpu}"),
        from: GpuHealth::Healthy,
        to,
        reason: "test".into(),
        evidence: HealthEvidence::default(),
        at,
    })
}

/// Lease `id`'s GPU 0 on `node` freed for being idle.
pub(super) fn suspended(id: Uuid, node: &str, at: DateTime<Utc>) -> EventData {
    EventData::LeaseSuspended(lh_events::LeaseSuspended {
        lease_id: id,
        node_id: node.into(),
        gpu_indices: vec![0],
        suspended_at: at,
        reason: "idle".into(),
    })
}

pub(super) fn given(events: Vec<EventData>) -> State {
    let mut s = State::default();
    for (i, e) in events.into_iter().enumerate() {
        s.apply(i as u64 + 1, &env(e));
    }
    s
}

pub(super) fn decide(s: &State) -> Decisions {
    decide_at(s, Utc::now(), &Rules::default())
}

/// A decision pass at `now` with a placement engine of its own, kept for no
/// later pass (a kept one decides the same: see `kept.rs`).
pub(super) fn decide_at(s: &State, now: DateTime<Utc>, rules: &Rules) -> Decisions {
    s.decide(now, rules, &mut PlacementEngineCache::default())
}

/// Appends every decision to the state, as if the log had stored them.
pub(super) fn settle(s: &mut State, now: DateTime<Utc>, rules: &Rules) {
    // Past every sequence applied so far, like the log would be.
    let mut seq = s
        .leases
        .values()
        .map(|l| l.subject_sequence)
        .max()
        .unwrap_or(0)
        + 1_000;
    let d = decide_at(s, now, rules);
    for batch in &d.batches {
        for (e, _) in batch {
            seq += 1;
            s.apply(seq, e);
        }
    }
}

pub(super) fn placed(s: &State) -> Vec<Uuid> {
    let mut v: Vec<Uuid> = s
        .leases
        .values()
        .filter(|l| l.status == Status::Holding)
        .map(|l| l.id)
        .collect();
    v.sort();
    v
}

pub(super) fn started(lease: Uuid, at: DateTime<Utc>) -> EventData {
    EventData::LeaseStarted(LeaseStarted {
        lease_id: lease,
        node_id: "a".into(),
        started_at: at,
        mig_devices: Vec::new(),
    })
}
