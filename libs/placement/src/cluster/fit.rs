//! Whether a node can take a demand, why not when it cannot, and which of
//! its GPUs the default choice would use. Read-only: policies call these
//! in their scoring loops, so they stay cheap and allocate nothing.

use super::{Cluster, Demand, GpuSet, Kind, Reject, MILLI};
use crate::mig;
use crate::model::{GpuDemand, Request, SharingMode};

impl Cluster {
    /// Mask of the named models; names the cluster has never seen match
    /// nothing. Empty means any.
    pub fn model_mask<S: AsRef<str>>(&self, names: &[S]) -> u64 {
        if names.is_empty() {
            return u64::MAX;
        }
        names
            .iter()
            .filter_map(|n| self.model_id(n.as_ref()))
            .fold(0, |m, i| m | (1 << i))
    }

    fn zone_mask<S: AsRef<str>>(&self, names: &[S]) -> u64 {
        if names.is_empty() {
            return u64::MAX;
        }
        names
            .iter()
            .filter_map(|n| self.zone_id(n.as_ref()))
            .fold(0, |m, i| m | (1 << i))
    }

    /// Compiles a request against this cluster's names.
    pub fn demand(&self, r: &Request) -> Demand {
        let kind = match &r.gpu {
            GpuDemand::None => Kind::None,
            GpuDemand::Whole { count } => Kind::Whole(*count),
            GpuDemand::Fraction { milli, vram_gb } => Kind::Frac {
                milli: *milli,
                vram_gb: *vram_gb,
            },
            GpuDemand::Mig { profile } => Kind::Mig(
                mig::profile_names()
                    .iter()
                    .position(|n| n == profile)
                    .map_or(u16::MAX, |i| i as u16),
            ),
        };
        Demand {
            cpu_milli: r.cpu_milli,
            memory_mib: r.memory_mib,
            kind,
            models: self.model_mask(&r.models),
            zones: self.zone_mask(&r.zones),
            needs_isolation: r.needs_isolation,
        }
    }

    /// Can node `i` take `d` now? The first failing check.
    #[inline]
    pub fn check(&self, i: usize, d: &Demand) -> Result<(), Reject> {
        let n = &self.nodes[i];
        if d.needs_isolation && !n.isolates_workloads {
            return Err(Reject::Isolation);
        }
        if d.zones & (1u64 << n.zone) == 0 {
            return Err(Reject::Zone);
        }
        if d.kind != Kind::None && d.models & n.model_mask == 0 {
            return Err(Reject::Model);
        }
        if n.cpu_free < d.cpu_milli {
            return Err(Reject::Cpu);
        }
        if n.memory_free < d.memory_mib {
            return Err(Reject::Memory);
        }
        let ok = match d.kind {
            Kind::None => true,
            Kind::Whole(k) => {
                let mut need = k;
                if need == 0 {
                    true
                } else {
                    let mut ok = false;
                    for g in &n.gpus {
                        if g.fits_whole(d.models) {
                            need -= 1;
                            if need == 0 {
                                ok = true;
                                break;
                            }
                        }
                    }
                    ok
                }
            }
            Kind::Frac { milli, vram_gb } => {
                n.gpus.iter().any(|g| g.fits_frac(milli, vram_gb, d.models))
            }
            Kind::Mig(p) => (0..n.gpus.len()).any(|j| n.mig_plan(j, p, d.models).is_some()),
        };
        if ok {
            Ok(())
        } else {
            Err(self.gpu_reject(i, d))
        }
    }

    /// Why node `i`'s GPUs refuse `d`, which they do now: busy, or never
    /// (as the node is).
    fn gpu_reject(&self, i: usize, d: &Demand) -> Reject {
        let n = &self.nodes[i];
        let of_model = || n.gpus.iter().filter(|g| g.allowed(d.models));
        match d.kind {
            Kind::None => Reject::GpuBusy,
            Kind::Whole(k) => {
                let usable = of_model().filter(|g| g.mode != SharingMode::Mig).count();
                if usable == 0 {
                    Reject::GpuMode
                } else if usable < usize::from(k) {
                    Reject::GpuTooSmall
                } else {
                    Reject::GpuBusy
                }
            }
            Kind::Frac { milli, vram_gb } => {
                let mut sharing = of_model()
                    .filter(|g| g.mode == SharingMode::VGpu)
                    .peekable();
                if sharing.peek().is_none() {
                    Reject::GpuMode
                } else if milli > MILLI || sharing.clone().all(|g| g.vram_total < vram_gb) {
                    Reject::GpuTooSmall
                } else if sharing.any(|g| g.has_room_for(milli, vram_gb, d.models)) {
                    // Room enough, but only beside shares of another size.
                    Reject::ShareSize
                } else {
                    Reject::GpuBusy
                }
            }
            Kind::Mig(p) => {
                let in_mig: Vec<usize> = (0..n.gpus.len())
                    .filter(|&j| n.gpus[j].allowed(d.models) && n.gpus[j].mode == SharingMode::Mig)
                    .collect();
                let name = mig::profile_names().get(usize::from(p));
                let has_profile = |j: &usize| {
                    let layout = n.mig[*j].as_ref();
                    name.is_some_and(|name| {
                        layout.is_some_and(|l| l.geometry().profile(name).is_some())
                    })
                };
                // Room once its leases end: waiting helps. None even then,
                // with instances no lease holds in the way: it waits for an
                // operator.
                let room_without_leases = |j: &usize| {
                    let layout = n.mig[*j].as_ref();
                    name.is_some_and(|name| {
                        layout.is_some_and(|l| mig::plan(&l.without_leases(), name).is_some())
                    })
                };
                if in_mig.is_empty() {
                    Reject::GpuMode
                } else if !in_mig.iter().any(has_profile) {
                    Reject::MigProfile
                } else if in_mig
                    .iter()
                    .filter(|j| has_profile(j))
                    .any(room_without_leases)
                {
                    Reject::GpuBusy
                } else {
                    Reject::MigUnowned
                }
            }
        }
    }

    /// The first `count` GPUs free for a whole-GPU lease. When the node
    /// declares NVLink/NUMA domains, the tightest domain that holds them all
    /// is preferred (so a large domain stays whole for a large request).
    pub fn pick_whole(&self, i: usize, count: u8, models: u64) -> GpuSet {
        let n = &self.nodes[i];
        let usable: GpuSet = n
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.fits_whole(models))
            .fold(0, |m, (j, _)| m | (1 << j));
        let count = u32::from(count);
        if usable.count_ones() < count || count == 0 {
            return 0;
        }
        if !n.domains.is_empty() {
            let best = n
                .domains
                .iter()
                .map(|&d| d & usable)
                .filter(|m| m.count_ones() >= count)
                .min_by_key(|m| m.count_ones());
            if let Some(m) = best {
                return lowest_bits(m, count);
            }
        }
        lowest_bits(usable, count)
    }

    /// The GPU whose free milli fits `milli` most tightly (first index among
    /// equals); `None` when none fits.
    pub fn pick_frac_tightest(
        &self,
        i: usize,
        milli: u16,
        vram_gb: u32,
        models: u64,
    ) -> Option<u8> {
        let mut best: Option<(u16, u8)> = None;
        for (j, g) in self.nodes[i].gpus.iter().enumerate() {
            if g.fits_frac(milli, vram_gb, models) && best.is_none_or(|(m, _)| g.milli_free < m) {
                best = Some((g.milli_free, j as u8));
            }
        }
        best.map(|(_, j)| j)
    }

    /// The default GPU choice for `d` on node `i`: first free GPUs for whole
    /// leases (domain-aware), the tightest GPU for a slice.
    pub fn pick_default(&self, i: usize, d: &Demand) -> GpuSet {
        match d.kind {
            Kind::None => 0,
            Kind::Mig(p) => self.nodes[i]
                .pick_mig(p, d.models)
                .map_or(0, |(j, _, _)| 1 << j),
            Kind::Whole(k) => self.pick_whole(i, k, d.models),
            Kind::Frac { milli, vram_gb } => self
                .pick_frac_tightest(i, milli, vram_gb, d.models)
                .map_or(0, |j| 1 << j),
        }
    }
}

fn lowest_bits(mut m: GpuSet, count: u32) -> GpuSet {
    let mut out = 0;
    for _ in 0..count {
        let b = m & m.wrapping_neg();
        out |= b;
        m &= !b;
    }
    out
}
