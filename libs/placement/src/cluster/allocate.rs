//! Taking and giving back: an allocation on chosen GPUs, the records of
//! what already exists when the cluster is rebuilt from leases, and the
//! release that returns every milli, byte and MIG slice it held.

use super::{
    gpu_indices, AllocError, AllocId, Allocation, Cluster, Demand, GpuSet, Kind, MigHold, Reject,
    MILLI, MIXED_SHARES,
};
use crate::mig;
use crate::model::SharingMode;

impl Cluster {
    /// Takes `d` on node `i` on the GPUs in `gpus`. Checks everything. A MIG
    /// demand gets the instance [`mig::plan`] chooses on its one GPU.
    pub fn allocate(&mut self, i: usize, d: &Demand, gpus: GpuSet) -> Result<AllocId, AllocError> {
        self.allocate_at(i, d, gpus, Existing::No)
    }

    /// Records a share of `d` that exists on GPU `gpu` of node `i` (rebuilding
    /// the cluster from what leases hold): it needs room, but may sit beside
    /// shares of another size, placed before its node took one size per GPU.
    pub fn allocate_existing_share(
        &mut self,
        i: usize,
        d: &Demand,
        gpu: u8,
    ) -> Result<AllocId, AllocError> {
        self.allocate_at(i, d, 1 << gpu, Existing::Share)
    }

    /// Records a MIG instance of `d`'s profile that exists at `start` on GPU
    /// `gpu` of node `i` (rebuilding the cluster from what leases hold).
    pub fn allocate_mig_at(
        &mut self,
        i: usize,
        d: &Demand,
        gpu: u8,
        start: u8,
    ) -> Result<AllocId, AllocError> {
        self.allocate_at(i, d, 1 << gpu, Existing::Mig { start })
    }

    /// Records a MIG instance of `profile` at `start` on GPU `gpu` of node
    /// `i` that belongs to no lease (as the node declares it): its slices
    /// are taken, by no allocation, so no policy places an instance over
    /// it, and the GPU is never re-sliced around it.
    pub fn add_unowned_mig(
        &mut self,
        i: usize,
        gpu: u8,
        profile: &str,
        start: u8,
    ) -> Result<(), AllocError> {
        let n = self.nodes.get_mut(i).ok_or(AllocError::NoSuchNode)?;
        let j = usize::from(gpu);
        if j >= n.gpus.len() || n.gpus[j].mode != SharingMode::Mig {
            return Err(AllocError::BadGpus);
        }
        let layout = n.mig[j].as_mut().ok_or(AllocError::MigUnsupported)?;
        layout
            .add_unowned(profile, start)
            .map_err(AllocError::Mig)?;
        let taken = layout
            .instances()
            .iter()
            .find(|x| x.start == start)
            .expect("the instance was just added")
            .profile;
        let (milli, vram_gb) = mig::size(taken, layout.geometry());
        let g = &mut n.gpus[j];
        g.milli_free = g.milli_free.saturating_sub(milli);
        g.vram_free = g.vram_free.saturating_sub(vram_gb);
        self.changed(i);
        Ok(())
    }

    fn allocate_at(
        &mut self,
        i: usize,
        d: &Demand,
        gpus: GpuSet,
        existing: Existing,
    ) -> Result<AllocId, AllocError> {
        if i >= self.nodes.len() {
            return Err(AllocError::NoSuchNode);
        }
        let mig_start = match existing {
            Existing::Mig { start } => Some(start),
            _ => None,
        };
        match existing {
            Existing::No => self.check(i, d).map_err(AllocError::NotFeasible)?,
            // Restoring what exists: an instance's slot, not a fresh plan; a
            // share beside others of any size.
            Existing::Mig { .. } | Existing::Share => {
                let n = &self.nodes[i];
                if n.cpu_free < d.cpu_milli {
                    return Err(AllocError::NotFeasible(Reject::Cpu));
                }
                if n.memory_free < d.memory_mib {
                    return Err(AllocError::NotFeasible(Reject::Memory));
                }
            }
        }
        let n = &self.nodes[i];
        if gpus as u64 >> n.gpus.len() != 0 {
            return Err(AllocError::BadGpus);
        }
        match d.kind {
            Kind::None => {
                if gpus != 0 {
                    return Err(AllocError::BadGpus);
                }
            }
            Kind::Whole(k) => {
                if gpus.count_ones() != u32::from(k)
                    || !gpu_indices(gpus).all(|j| n.gpus[usize::from(j)].fits_whole(d.models))
                {
                    return Err(AllocError::BadGpus);
                }
            }
            Kind::Frac { milli, vram_gb } => {
                if gpus.count_ones() != 1 {
                    return Err(AllocError::BadGpus);
                }
                let g = &n.gpus[gpus.trailing_zeros() as usize];
                let fits = match existing {
                    Existing::Share => g.has_room_for(milli, vram_gb, d.models),
                    _ => g.fits_frac(milli, vram_gb, d.models),
                };
                if !fits {
                    return Err(AllocError::BadGpus);
                }
            }
            Kind::Mig(_) => {
                if gpus.count_ones() != 1 {
                    return Err(AllocError::BadGpus);
                }
            }
        }
        let slot = self
            .free_slots
            .last()
            .copied()
            .unwrap_or(self.allocs.len() as u32);
        let mig = match d.kind {
            Kind::Mig(p) => {
                Some(self.take_mig(i, d, gpus.trailing_zeros() as usize, p, mig_start, slot)?)
            }
            _ => None,
        };
        let n = &mut self.nodes[i];
        n.cpu_free -= d.cpu_milli;
        n.memory_free -= d.memory_mib;
        for j in gpu_indices(gpus) {
            let g = &mut n.gpus[usize::from(j)];
            match d.kind {
                Kind::Whole(_) => {
                    g.milli_free = 0;
                    g.vram_free = 0;
                }
                Kind::Frac { milli, vram_gb } => {
                    g.milli_free -= milli;
                    g.vram_free -= vram_gb;
                    if g.one_share_size {
                        g.share_size = if g.leases == 0 || g.share_size == (milli, vram_gb) {
                            (milli, vram_gb)
                        } else {
                            MIXED_SHARES
                        };
                    }
                }
                Kind::Mig(_) => {
                    let h = mig.expect("a MIG allocation holds an instance");
                    g.milli_free = g.milli_free.saturating_sub(h.milli);
                    g.vram_free = g.vram_free.saturating_sub(h.vram_gb);
                }
                Kind::None => {}
            }
            g.leases += 1;
        }
        if let Some(t) = d.tag() {
            n.tags[t] += 1;
        }
        self.changed(i);
        self.gpu_milli_used += d.gpu_milli() + mig.map_or(0, |h| u64::from(h.milli));
        let a = Allocation {
            node: i as u32,
            demand: *d,
            gpus,
            mig,
        };
        let id = match self.free_slots.pop() {
            Some(s) => {
                self.allocs[s as usize] = Some(a);
                s
            }
            None => {
                self.allocs.push(Some(a));
                (self.allocs.len() - 1) as u32
            }
        };
        self.node_allocs[i].push(id);
        Ok(AllocId(id))
    }

    /// Gives back everything allocation `id` held.
    pub fn release(&mut self, id: AllocId) -> Result<Allocation, AllocError> {
        let a = self
            .allocs
            .get_mut(id.0 as usize)
            .and_then(Option::take)
            .ok_or(AllocError::UnknownAllocation)?;
        self.free_slots.push(id.0);
        let d = a.demand;
        let n = &mut self.nodes[a.node as usize];
        n.cpu_free += d.cpu_milli;
        n.memory_free += d.memory_mib;
        for j in gpu_indices(a.gpus) {
            let g = &mut n.gpus[usize::from(j)];
            match d.kind {
                Kind::Whole(_) => {
                    g.milli_free = MILLI;
                    g.vram_free = g.vram_total;
                }
                Kind::Frac { milli, vram_gb } => {
                    g.milli_free += milli;
                    g.vram_free += vram_gb;
                }
                Kind::Mig(_) => {
                    if let Some(h) = a.mig {
                        g.milli_free = (g.milli_free + h.milli).min(MILLI);
                        g.vram_free = (g.vram_free + h.vram_gb).min(g.vram_total);
                    }
                    if let Some(layout) = n.mig[usize::from(j)].as_mut() {
                        mig::release(layout, &id.0);
                    }
                }
                Kind::None => {}
            }
            g.leases -= 1;
            if g.leases == 0 {
                // Its enforcement's limits come back up once it is empty.
                g.share_size = (0, 0);
            }
        }
        if let Some(t) = d.tag() {
            n.tags[t] -= 1;
        }
        let held = &mut self.node_allocs[a.node as usize];
        if let Some(at) = held.iter().position(|&s| s == id.0) {
            held.swap_remove(at);
        }
        self.changed(a.node as usize);
        self.gpu_milli_used -= d.gpu_milli() + a.mig.map_or(0, |h| u64::from(h.milli));
        Ok(a)
    }

    /// Creates the MIG instance of allocation `slot` on GPU `j` of node `i`:
    /// at `start` when given, else where [`mig::plan`] says.
    fn take_mig(
        &mut self,
        i: usize,
        d: &Demand,
        j: usize,
        profile: u16,
        start: Option<u8>,
        slot: u32,
    ) -> Result<MigHold, AllocError> {
        let n = &mut self.nodes[i];
        if j >= n.gpus.len() || n.gpus[j].mode != SharingMode::Mig || !n.gpus[j].allowed(d.models) {
            return Err(AllocError::BadGpus);
        }
        let name = mig::profile_names()
            .get(usize::from(profile))
            .ok_or(AllocError::BadGpus)?;
        let layout = n.mig[j].as_mut().ok_or(AllocError::MigUnsupported)?;
        let instance = match start {
            Some(s) => mig::place_at(layout, name, s, slot),
            None => mig::place(layout, name, slot).map(|p| p.instance),
        }
        .map_err(AllocError::Mig)?;
        let (milli, vram_gb) = mig::size(instance.profile, layout.geometry());
        Ok(MigHold {
            profile: instance.profile,
            start: instance.start,
            milli,
            vram_gb,
        })
    }

    pub fn allocation(&self, id: AllocId) -> Option<&Allocation> {
        self.allocs.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// Live allocations.
    pub fn allocations(&self) -> impl Iterator<Item = (AllocId, &Allocation)> {
        self.allocs
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.as_ref().map(|a| (AllocId(i as u32), a)))
    }
}

/// What [`Cluster::allocate_at`] records: a new allocation, or one that
/// exists already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Existing {
    No,
    Mig { start: u8 },
    Share,
}
