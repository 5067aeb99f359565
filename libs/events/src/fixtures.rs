//! Ready-made events for tests (feature `fixtures`): one place for the
//! shapes that tests of every service need, so that a change to an event
//! type is made once here rather than in each crate's copy.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::*;

/// The GPU model the fixtures use unless told otherwise.
pub const MODEL: &str = "A100-40GB";
/// VRAM of one [`MODEL`] GPU, GB.
pub const MODEL_VRAM_GB: u32 = 40;

/// A node of `gpus` GPUs of `model` (`vram_gb` each), indices `0..gpus`,
/// UUIDs `GPU-<node>-<index>`.
pub fn node(node_id: &str, zone: &str, gpus: u32, model: &str, vram_gb: u32) -> NodeRegistered {
    NodeRegistered {
        node_id: node_id.into(),
        zone: zone.into(),
        hostname: node_id.into(),
        gpus: (0..gpus)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-{node_id}-{index}"),
                model: model.into(),
                vram_gb,
                mig: false,
                unowned_mig_instances: Vec::new(),
            })
            .collect(),
        // A node that enforces what the platform asks of it: the tests of
        // placement rules other than these run on it unchanged.
        isolation: Isolation::Container,
        gpu_sharing: GpuSharing::HamiCore,
        fabric: None,
    }
}

/// A tenant that may hold `max_gpus` GPUs, with no VRAM limit and weight 1.
pub fn tenant(tenant_id: Uuid, max_gpus: u32) -> TenantCreated {
    TenantCreated {
        tenant_id,
        name_sealed: String::new(),
        email_sealed: String::new(),
        api_key_sha256: String::new(),
        api_key_prefix: format!("lh_{}", &tenant_id.simple().to_string()[..8]),
        quota: Quota {
            max_gpus,
            max_vram_gb: None,
            max_storage_gb: None,
        },
        weight: 1,
        idle_policy: None,
        trusted: false,
    }
}

/// A basic-tier request for `gpus` whole GPUs of `model`.
pub fn whole_request(lease_id: Uuid, tenant_id: Uuid, gpus: u32, model: &str) -> LeaseRequested {
    LeaseRequested {
        lease_id,
        tenant_id,
        gpus,
        gpu_model: model.into(),
        tier: Tier::Basic,
        priority: 0,
        idempotency_key: None,
        fraction: None,
        mig_profile: None,
        workload: None,
        max_price_cny_per_gpu_hour: None,
        zones: Vec::new(),
        regions: Vec::new(),
        recovery: None,
        recovery_of: None,
        quote_id: None,
    }
}

/// A basic-tier request for a share of one GPU of `model`.
pub fn fraction_request(
    lease_id: Uuid,
    tenant_id: Uuid,
    model: &str,
    milli: u32,
    vram_gb: u32,
) -> LeaseRequested {
    LeaseRequested {
        fraction: Some(GpuFraction { milli, vram_gb }),
        ..whole_request(lease_id, tenant_id, 1, model)
    }
}

/// The lease placed on whole GPUs `gpu_indices` of `node_id` (UUIDs as
/// [`node`] gives them), by the default policy.
pub fn placed(
    lease_id: Uuid,
    node_id: &str,
    zone: &str,
    model: &str,
    vram_gb_per_gpu: u32,
    gpu_indices: &[u32],
) -> LeasePlaced {
    LeasePlaced {
        lease_id,
        node_id: node_id.into(),
        zone: zone.into(),
        gpu_model: model.into(),
        vram_gb_per_gpu,
        gpus: gpu_indices
            .iter()
            .map(|&index| AssignedGpu {
                index,
                uuid: format!("GPU-{node_id}-{index}"),
                milli: None,
                vram_gb: None,
                mig_instance: None,
            })
            .collect(),
        decision: Decision {
            policy: "leasehold".into(),
            policy_version: 3,
            candidates: 1,
            winner_score: 0.0,
            runner_up_score: None,
        },
        members: Vec::new(),
    }
}

pub fn started(lease_id: Uuid, node_id: &str, started_at: DateTime<Utc>) -> LeaseStarted {
    LeaseStarted {
        lease_id,
        node_id: node_id.into(),
        started_at,
        mig_devices: Vec::new(),
    }
}

pub fn ended(
    lease_id: Uuid,
    node_id: &str,
    ended_at: DateTime<Utc>,
    reason: EndReason,
) -> LeaseEnded {
    LeaseEnded {
        lease_id,
        node_id: Some(node_id.into()),
        ended_at,
        reason,
        exit_code: None,
        failure: None,
    }
}

/// An operator's enrollment for exactly what `node` claims: what a test or
/// a harness writes before a node's registration, which counts only
/// within one (`lh_domain::authority`).
pub fn enrollment_of(node: &crate::NodeRegistered) -> crate::NodeEnrolled {
    let mut gpu_models: Vec<String> = node.gpus.iter().map(|g| g.model.clone()).collect();
    gpu_models.sort();
    gpu_models.dedup();
    let mut gpu_sharing = Vec::new();
    if node.gpus.iter().any(|g| g.mig) {
        gpu_sharing.push(crate::GpuSharing::Mig);
    }
    if !node.gpu_sharing.is_none() && !gpu_sharing.contains(&node.gpu_sharing) {
        gpu_sharing.push(node.gpu_sharing);
    }
    crate::NodeEnrolled {
        node_id: node.node_id.clone(),
        zone: node.zone.clone(),
        max_gpus: node.gpus.len() as u32,
        gpu_models,
        max_isolation: node.isolation,
        gpu_sharing,
    }
}

/// The node a fixture's node event is by where its payload names none.
pub const FIXTURE_NODE: &str = "fixture-node";

/// An actor that may publish `data` (the first of its type's owners): what
/// a test that stands in for a service or a node publishes as, so that
/// readers do not skip its events as foreign.
pub fn owner_of(data: &EventData) -> Actor {
    match crate::subject::owners(data.event_type()).first() {
        // A node reports only on itself.
        Some(crate::subject::Publisher::Node) => {
            Actor::Node(data.reporting_node().unwrap_or(FIXTURE_NODE).into())
        }
        Some(service) => match service.service_name() {
            Some("gateway") | None => Actor::Admin,
            Some(name) => Actor::Service(format!("lh-{name}")),
        },
        None => Actor::Admin,
    }
}

/// `data` in a new envelope by one of its owners (see [`owner_of`]).
pub fn by_owner(data: EventData) -> Envelope {
    Envelope::new(owner_of(&data), Utc::now(), data)
}

/// An event of no consequence on a fresh lease's subject, for tests of
/// the log itself.
pub fn stop_request() -> Envelope {
    Envelope::new(
        Actor::Admin,
        Utc::now(),
        EventData::LeaseStopRequested(LeaseStopRequested {
            lease_id: Uuid::now_v7(),
        }),
    )
}

/// Stored messages no reader of this code can use, one of each kind a
/// reader must step over, with the reason it should give: junk bytes, an
/// unknown event type, a known type at a version above the known one (with
/// a field the current struct lacks), and a known type whose payload does
/// not decode.
pub fn undecodable() -> Vec<(SkipReason, Vec<u8>)> {
    let envelope = |event_type: &str, version: u16, data: serde_json::Value| {
        serde_json::json!({
            "id": Uuid::now_v7(),
            "type": event_type,
            "version": version,
            "occurred_at": Utc::now(),
            "actor": {"kind": "admin"},
            "correlation_id": Uuid::now_v7(),
            "data": data,
        })
        .to_string()
        .into_bytes()
    };
    vec![
        (SkipReason::Junk, b"\x00junk, not JSON\xff".to_vec()),
        (
            SkipReason::UnknownType,
            envelope(
                "lease.teleported",
                1,
                serde_json::json!({"type": "lease.teleported", "lease_id": Uuid::now_v7()}),
            ),
        ),
        (
            SkipReason::FutureVersion,
            envelope(
                "lease.stop_requested",
                2,
                serde_json::json!({"type": "lease.stop_requested", "lease_id": Uuid::now_v7(), "why": "v2"}),
            ),
        ),
        (
            SkipReason::BadPayload,
            envelope(
                "lease.stop_requested",
                1,
                serde_json::json!({"type": "lease.stop_requested", "lease_id": 7}),
            ),
        ),
    ]
}
