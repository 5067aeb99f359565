//! What each lease uses of its GPUs, and the DCGM-named metrics per lease.
//! Pure: samples and `now` in, figures out. Whether a lease sits idle is
//! judged from these figures by the state's idle watch.
//!
//! dcgm-exporter labels a GPU's series with the one pod that holds it and
//! cannot attribute a GPU that several pods share (NVIDIA/dcgm-exporter#307).
//! Here every series of a held GPU is per lease: a GPU shared by three
//! leases gives three series, each with its lease's share of the memory.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use lh_events::telemetry::{LeaseGpuUsage, LeaseUsage};
use lh_events::AssignedGpu;
use uuid::Uuid;

use super::backend::GpuSample;

/// A lease running on this node, as usage sees it.
#[derive(Debug, Clone)]
pub struct RunningLease {
    pub lease_id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub gpus: Vec<AssignedGpu>,
}

/// Splits one round of samples over the leases that hold the GPUs.
pub fn attribute(
    node_id: &str,
    leases: &[RunningLease],
    samples: &[GpuSample],
    at: DateTime<Utc>,
) -> Vec<LeaseUsage> {
    let by_index: BTreeMap<u32, &GpuSample> = samples.iter().map(|s| (s.index, s)).collect();
    // VRAM each lease holds per GPU, to share a device's memory among them.
    let mut holders: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for lease in leases {
        for g in &lease.gpus {
            holders
                .entry(g.index)
                .or_default()
                .push(held_mib(g, by_index.get(&g.index)));
        }
    }
    leases
        .iter()
        .map(|lease| LeaseUsage {
            lease_id: lease.lease_id,
            tenant_id: lease.tenant_id,
            node_id: node_id.to_string(),
            at,
            gpus: lease
                .gpus
                .iter()
                .filter_map(|g| {
                    let sample = by_index.get(&g.index)?;
                    let on_gpu = &holders[&g.index];
                    let shared = on_gpu.len() > 1;
                    let memory_used_mib = if shared {
                        let total: u64 = on_gpu.iter().sum();
                        let mine = held_mib(g, Some(sample));
                        if total == 0 {
                            sample.memory_used_mib / on_gpu.len() as u64
                        } else {
                            // u128: MiB × MiB overflows nothing, but be plain.
                            (u128::from(sample.memory_used_mib) * u128::from(mine)
                                / u128::from(total)) as u64
                        }
                    } else {
                        sample.memory_used_mib
                    };
                    Some(LeaseGpuUsage {
                        index: g.index,
                        uuid: g.uuid.clone(),
                        utilization_pct: sample.utilization_pct,
                        memory_used_mib,
                        shared,
                        temperature_c: Some(sample.temperature_c),
                        // NVML reads an unsupported power sensor as 0 W;
                        // no running board draws nothing.
                        power_w: (sample.power_w > 0.0).then_some(sample.power_w),
                    })
                })
                .collect(),
        })
        .collect()
}

/// VRAM (MiB) a lease holds on a GPU: its share, its MIG instance's, or the
/// device's.
fn held_mib(gpu: &AssignedGpu, sample: Option<&&GpuSample>) -> u64 {
    if let Some(gb) = gpu.vram_gb {
        return u64::from(gb) * 1024;
    }
    if let Some(m) = &gpu.mig_instance {
        // Profile names end in their memory: `3g.20gb`.
        let gb = m
            .profile
            .split_once('.')
            .and_then(|(_, mem)| mem.strip_suffix("gb").and_then(|n| n.parse::<u64>().ok()));
        if let Some(gb) = gb {
            return gb * 1024;
        }
    }
    sample.map_or(0, |s| s.memory_total_mib)
}

/// Labels dcgm-exporter puts on every series, plus ours.
struct Labels<'a> {
    gpu: u32,
    uuid: &'a str,
    model: &'a str,
    hostname: &'a str,
    lease: Option<Uuid>,
    tenant: Option<Uuid>,
}

impl Labels<'_> {
    fn render(&self) -> String {
        let id = |u: Option<Uuid>| u.map(|u| u.to_string()).unwrap_or_default();
        format!(
            "gpu=\"{}\",UUID=\"{}\",modelName=\"{}\",Hostname=\"{}\",lease=\"{}\",tenant=\"{}\"",
            self.gpu,
            escape(self.uuid),
            escape(self.model),
            escape(self.hostname),
            id(self.lease),
            id(self.tenant)
        )
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A GPU of the node, for the metrics of free GPUs.
#[derive(Debug, Clone)]
pub struct NodeGpu {
    pub index: u32,
    pub uuid: String,
    pub model: String,
}

/// The families [`render_dcgm`] writes, in order: (name, type, help), as
/// dcgm-exporter names them, so that dashboards built for it read them.
pub const DCGM_FAMILIES: [(&str, &str, &str); 5] = [
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    (
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
];

/// The DCGM-named gauges of one round: a series per (lease, GPU) for held
/// GPUs, and one with empty `lease` and `tenant` for each free GPU.
/// Temperature and power are the device's; memory is the lease's share.
pub fn render_dcgm(
    hostname: &str,
    gpus: &[NodeGpu],
    samples: &[GpuSample],
    usage: &[LeaseUsage],
) -> String {
    let by_index: BTreeMap<u32, &GpuSample> = samples.iter().map(|s| (s.index, s)).collect();
    let model = |index: u32| {
        gpus.iter()
            .find(|g| g.index == index)
            .map_or("", |g| g.model.as_str())
    };
    // (labels, util, fb used, fb free, temperature, power)
    let mut rows: Vec<(String, Option<u32>, u64, u64, u32, f64)> = Vec::new();
    let mut held = std::collections::BTreeSet::new();
    for lease in usage {
        for g in &lease.gpus {
            let Some(s) = by_index.get(&g.index) else {
                continue;
            };
            held.insert(g.index);
            let labels = Labels {
                gpu: g.index,
                uuid: &g.uuid,
                model: model(g.index),
                hostname,
                lease: Some(lease.lease_id),
                tenant: lease.tenant_id,
            };
            rows.push((
                labels.render(),
                g.utilization_pct,
                g.memory_used_mib,
                s.memory_total_mib.saturating_sub(s.memory_used_mib),
                s.temperature_c,
                s.power_w,
            ));
        }
    }
    for gpu in gpus.iter().filter(|g| !held.contains(&g.index)) {
        let Some(s) = by_index.get(&gpu.index) else {
            continue;
        };
        let labels = Labels {
            gpu: gpu.index,
            uuid: &gpu.uuid,
            model: &gpu.model,
            hostname,
            lease: None,
            tenant: None,
        };
        rows.push((
            labels.render(),
            s.utilization_pct,
            s.memory_used_mib,
            s.memory_total_mib.saturating_sub(s.memory_used_mib),
            s.temperature_c,
            s.power_w,
        ));
    }
    let mut out = String::new();
    for (i, (name, kind, help)) in DCGM_FAMILIES.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, util, used, free, temp, power) in &rows {
            let value = match (i, util) {
                // No reading is no series, not a zero.
                (0, None) => continue,
                (0, Some(util)) => util.to_string(),
                (1, _) => used.to_string(),
                (2, _) => free.to_string(),
                (3, _) => temp.to_string(),
                _ => format!("{power:.1}"),
            };
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        "2026-12-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + chrono::Duration::seconds(s)
    }

    fn sample(index: u32, util: u32, used: u64) -> GpuSample {
        GpuSample {
            index,
            utilization_pct: Some(util),
            memory_used_mib: used,
            memory_total_mib: 40_960,
            temperature_c: 50,
            power_w: 120.0,
            ecc_double_bit_total: Some(0),
            processes: Vec::new(),
        }
    }

    fn gpu(index: u32, vram_gb: Option<u32>) -> AssignedGpu {
        AssignedGpu {
            index,
            uuid: format!("GPU-{index}"),
            milli: vram_gb.map(|_| 500),
            vram_gb,
            mig_instance: None,
        }
    }

    fn lease(n: u128, gpus: Vec<AssignedGpu>) -> RunningLease {
        RunningLease {
            lease_id: Uuid::from_u128(n),
            tenant_id: Some(Uuid::from_u128(100 + n)),
            gpus,
        }
    }

    #[test]
    fn a_shared_gpu_s_memory_is_split_by_the_vram_each_lease_holds() {
        let leases = [
            lease(1, vec![gpu(0, Some(10))]),
            lease(2, vec![gpu(0, Some(30))]),
            lease(3, vec![gpu(1, None), gpu(2, None)]),
        ];
        let samples = [
            sample(0, 80, 20_000),
            sample(1, 10, 1_000),
            sample(2, 0, 500),
        ];
        let u = attribute("n", &leases, &samples, t(0));
        assert_eq!(u[0].gpus[0].memory_used_mib, 5_000);
        assert_eq!(u[1].gpus[0].memory_used_mib, 15_000);
        assert!(u[0].gpus[0].shared && u[1].gpus[0].shared);
        assert_eq!(u[0].gpus[0].utilization_pct, Some(80));
        assert_eq!(u[2].gpus.len(), 2);
        assert!(!u[2].gpus[0].shared);
        assert_eq!(u[2].gpus[1].memory_used_mib, 500);
    }

    #[test]
    fn every_lease_on_a_gpu_sees_the_device_s_temperature_and_power() {
        let leases = [
            lease(1, vec![gpu(0, Some(10))]),
            lease(2, vec![gpu(0, Some(30))]),
        ];
        let mut hot = sample(0, 80, 20_000);
        hot.temperature_c = 77;
        hot.power_w = 312.5;
        let u = attribute("n", &leases, std::slice::from_ref(&hot), t(0));
        for lease in &u {
            assert_eq!(lease.gpus[0].temperature_c, Some(77));
            assert_eq!(lease.gpus[0].power_w, Some(312.5));
        }
        // A board without a power sensor reads 0 W: reported as unknown.
        hot.power_w = 0.0;
        let u = attribute("n", &leases[..1], &[hot], t(0));
        assert_eq!(u[0].gpus[0].power_w, None);
        assert_eq!(u[0].gpus[0].temperature_c, Some(77));
    }

    #[test]
    fn a_lost_gpu_is_left_out_of_the_lease_s_usage() {
        let leases = [lease(1, vec![gpu(0, None), gpu(1, None)])];
        let u = attribute("n", &leases, &[sample(1, 5, 1)], t(0));
        assert_eq!(u[0].gpus.len(), 1);
        assert_eq!(u[0].gpus[0].index, 1);
    }

    #[test]
    fn dcgm_series_per_lease_including_a_shared_gpu() {
        let leases = [
            lease(1, vec![gpu(0, Some(10))]),
            lease(2, vec![gpu(0, Some(30))]),
        ];
        let samples = [sample(0, 80, 20_000), sample(1, 0, 0)];
        let u = attribute("n", &leases, &samples, t(0));
        let gpus: Vec<NodeGpu> = (0..2)
            .map(|i| NodeGpu {
                index: i,
                uuid: format!("GPU-{i}"),
                model: "A100-40GB".into(),
            })
            .collect();
        let text = render_dcgm("host-1", &gpus, &samples, &u);
        let l1 = Uuid::from_u128(1);
        let t1 = Uuid::from_u128(101);
        assert!(text.contains(&format!(
            "DCGM_FI_DEV_FB_USED{{gpu=\"0\",UUID=\"GPU-0\",modelName=\"A100-40GB\",Hostname=\"host-1\",lease=\"{l1}\",tenant=\"{t1}\"}} 5000\n"
        )), "{text}");
        assert_eq!(text.matches("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"").count(), 2);
        // The free GPU has one series, without a lease.
        assert!(text.contains(
            "DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",UUID=\"GPU-1\",modelName=\"A100-40GB\",Hostname=\"host-1\",lease=\"\",tenant=\"\"} 50\n"
        ));
        assert_eq!(text.matches("# TYPE DCGM_FI_DEV_GPU_UTIL gauge").count(), 1);
    }
}
