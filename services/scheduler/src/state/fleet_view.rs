//! The fleet as the scheduler answers it on request (`lh_rpc::fleet`):
//! what its fold holds of each node, and when it last heard each.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use lh_events::telemetry::GpuReading;
use lh_rpc::fleet::{FleetView, GpuView, NodeState, NodeView, ShareView};

use super::State;

impl State {
    /// Every node the fleet holds, by id, as of `now`, each GPU with its
    /// node's last reading in `readings`.
    pub fn fleet_view(
        &self,
        now: DateTime<Utc>,
        readings: &HashMap<String, Vec<GpuReading>>,
    ) -> FleetView {
        let nodes = self
            .fleet
            .nodes
            .values()
            .map(|node| {
                let read = readings.get(&node.id);
                let reading = |index: u32| read.and_then(|r| r.iter().find(|g| g.index == index));
                NodeView {
                    id: node.id.clone(),
                    zone: node.zone.clone(),
                    state: match (node.lost, node.cordoned) {
                        (Some(_), _) => NodeState::Lost,
                        (None, Some(_)) => NodeState::Draining,
                        (None, None) => NodeState::Ready,
                    },
                    drain_mode: node.cordoned.flatten(),
                    lost_since: node.lost,
                    last_heartbeat_at: self.heard.get(&node.id).map(|h| h.local),
                    isolation: node.isolation,
                    gpu_sharing: node.gpu_sharing,
                    fabric: node.fabric.clone(),
                    gpus: node
                        .gpus
                        .iter()
                        .map(|gpu| {
                            let reading = reading(gpu.index);
                            GpuView {
                                index: gpu.index,
                                uuid: gpu.uuid.clone(),
                                model: gpu.model.clone(),
                                vram_gb: gpu.vram_gb,
                                health: gpu.health,
                                health_since: gpu.health_since,
                                mig: gpu.mig,
                                held_by: gpu.held_by,
                                shares: gpu
                                    .shares
                                    .iter()
                                    .map(|s| ShareView {
                                        lease_id: s.lease_id,
                                        milli: s.milli,
                                        vram_gb: s.vram_gb,
                                        mig_profile: s.mig.as_ref().map(|m| m.profile.clone()),
                                    })
                                    .collect(),
                                used_milli: gpu.used_milli(),
                                used_vram_gb: gpu.used_vram_gb(),
                                utilization_pct: reading.and_then(|r| r.utilization_pct),
                                memory_used_mib: reading.map(|r| r.memory_used_mib),
                                temperature_c: reading.map(|r| r.temperature_c),
                            }
                        })
                        .collect(),
                }
            })
            .collect();
        FleetView {
            as_of: Some(now),
            nodes,
        }
    }
}
