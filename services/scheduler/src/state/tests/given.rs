//! The fixtures every scheduler test builds its state from.

use std::cell::RefCell;
pub(super) use std::collections::HashMap;
use std::ops::{Deref, DerefMut};

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

/// A test's state and the placement engine its passes keep, as the decide
/// loop holds them: each pass starts from the engine the one before left.
/// The passes read the state as the assertions between them do, so the
/// engine sits in a cell.
#[derive(Default)]
pub(super) struct Given {
    state: State,
    engine: RefCell<PlacementEngineCache>,
}

impl Deref for Given {
    type Target = State;

    fn deref(&self) -> &State {
        &self.state
    }
}

impl DerefMut for Given {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl Given {
    /// [`State::restore`], forgetting the kept engine with the fleet it held.
    pub(super) fn restore(&mut self, snapshot: serde_json::Value) -> bool {
        let restored = self.state.restore(snapshot);
        if restored {
            self.engine.get_mut().clear();
        }
        restored
    }
}

pub(super) fn given(events: Vec<EventData>) -> Given {
    let mut s = Given::default();
    for (i, e) in events.into_iter().enumerate() {
        s.apply(i as u64 + 1, &env(e));
    }
    s
}

pub(super) fn decide(s: &Given) -> Decisions {
    decide_at(s, Utc::now(), &Rules::default())
}

/// A decision pass at `now` with the engine the last pass left (a kept one
/// decides as a fresh one: see `kept.rs`).
pub(super) fn decide_at(s: &Given, now: DateTime<Utc>, rules: &Rules) -> Decisions {
    s.state.decide(now, rules, &mut s.engine.borrow_mut())
}

/// Appends every decision to the state, as if the log had stored them.
pub(super) fn settle(s: &mut Given, now: DateTime<Utc>, rules: &Rules) {
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
