//! Queue order (tiers, weighted fair share, priority) and quotas.

use std::collections::{BTreeMap, HashMap};

use lh_events::Quota;
use uuid::Uuid;

use super::{Lease, State, Status, MILLI_PER_GPU};

impl State {
    /// `(milli, VRAM GB)` each tenant's placed leases use now.
    pub(super) fn tenant_usage(&self) -> HashMap<Uuid, (u64, u64)> {
        let mut usage: HashMap<Uuid, (u64, u64)> = HashMap::new();
        for l in self.leases.values().filter(|l| l.status == Status::Holding) {
            let used = usage.entry(l.tenant_id).or_default();
            used.0 += l.milli();
            used.1 += u64::from(l.vram_gb);
        }
        usage
    }

    /// Waiting leases in queue order (see the module docs), with each
    /// tenant's usage evolving as if each lease before were placed.
    pub fn queue_order(&self) -> Vec<Uuid> {
        let mut usage = self.tenant_usage();
        // tier → tenant → leases by (priority desc, sequence asc)
        let mut per_tier: BTreeMap<u8, HashMap<Uuid, Vec<&Lease>>> = BTreeMap::new();
        for id in self.waiting.values() {
            let Some(l) = self.leases.get(id) else {
                continue;
            };
            let tier_rank = match l.is_on_demand() {
                true => 0,
                false => 1,
            };
            per_tier
                .entry(tier_rank)
                .or_default()
                .entry(l.tenant_id)
                .or_default()
                .push(l);
        }
        let mut order = Vec::with_capacity(self.waiting.len());
        for (_, mut tenants) in per_tier {
            for queue in tenants.values_mut() {
                queue.sort_by_key(|l| (std::cmp::Reverse(l.priority), l.requested_sequence));
                queue.reverse(); // pop from the back
            }
            loop {
                // The tenant with the smallest weighted share goes next;
                // ties by who asked first.
                let next = tenants
                    .iter()
                    .filter_map(|(t, q)| q.last().map(|l| (*t, l)))
                    .min_by(|(ta, la), (tb, lb)| {
                        let share = |t: &Uuid| {
                            let weight = self.tenants.get(t).map(|x| x.weight).unwrap_or(1);
                            usage.get(t).map(|u| u.0).unwrap_or(0) as f64 / f64::from(weight)
                        };
                        share(ta)
                            .total_cmp(&share(tb))
                            .then(la.requested_sequence.cmp(&lb.requested_sequence))
                    })
                    .map(|(t, _)| t);
                let Some(tenant) = next else { break };
                let lease = tenants.get_mut(&tenant).and_then(Vec::pop).expect("head");
                usage.entry(tenant).or_default().0 += lease.milli();
                order.push(lease.id);
            }
        }
        order
    }
}

pub(super) fn quota_breach(
    quota: &Quota,
    used_milli: u64,
    used_vram_gb: u64,
    lease: &Lease,
) -> Option<String> {
    let max_milli = u64::from(quota.max_gpus) * MILLI_PER_GPU;
    if used_milli + lease.milli() > max_milli {
        return Some(format!(
            "quota exceeded: tenant holds {} GPUs, asks for {} more, quota is {}",
            used_milli as f64 / MILLI_PER_GPU as f64,
            lease.milli() as f64 / MILLI_PER_GPU as f64,
            quota.max_gpus
        ));
    }
    if let Some(max_vram) = quota.max_vram_gb {
        if used_vram_gb + u64::from(lease.vram_gb) > u64::from(max_vram) {
            return Some(format!(
                "VRAM quota exceeded: tenant holds {used_vram_gb} GB, asks for {} GB more, quota is {max_vram} GB",
                lease.vram_gb
            ));
        }
    }
    None
}
