//! The deterministic placer for one GPU: plan, place, release, and what is
//! still placeable.

use super::*;

/// How a request would be satisfied on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Plan {
    pub profile: &'static MigProfile,
    /// Start slice of the instance the lease gets.
    pub start: u8,
    /// `true`: a free existing instance is handed out; `false`: a new GPU
    /// instance is created at `start`.
    pub reuse: bool,
    /// Starts of free instances destroyed first (re-slicing an idle GPU).
    pub destroy: Vec<u8>,
}

/// What [`place`] did.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Placement<L> {
    /// The instance the lease now holds.
    pub instance: Instance<L>,
    /// A new GPU instance was created for it.
    pub created: bool,
    /// Free instances destroyed to make room (idle GPU only), ascending start.
    pub destroyed: Vec<Instance<L>>,
}

/// Occupancy of one GPU reduced to what the placement rules look at.
#[derive(Clone, Copy)]
pub(super) struct Occupancy {
    mem: u16,
    cmp: u16,
    /// A `+me` instance exists.
    media: bool,
    /// Existing instances per profile index.
    count: [u8; MAX_PROFILES],
    /// Free instances per profile index.
    free: [u8; MAX_PROFILES],
    /// At least one instance is held.
    live: bool,
}

impl Occupancy {
    pub(super) fn of<'a, L: 'a>(
        g: &Geometry,
        instances: impl IntoIterator<Item = &'a Instance<L>>,
    ) -> Self {
        let mut o = Occupancy {
            mem: 0,
            cmp: 0,
            media: false,
            count: [0; MAX_PROFILES],
            free: [0; MAX_PROFILES],
            live: false,
        };
        for i in instances {
            o.add(g, i.profile, i.start, i.is_free());
        }
        o
    }

    pub(super) fn add(&mut self, g: &Geometry, p: &MigProfile, start: u8, free: bool) {
        self.mem |= p.memory_mask(start);
        self.cmp |= p.compute_mask(start);
        self.media |= p.media_extensions;
        if let Some(idx) = g.index_of(p) {
            self.count[idx] += 1;
            self.free[idx] += u8::from(free);
        }
        self.live |= !free;
    }

    /// A new instance of `p` fits at `start` next to everything that exists.
    pub(super) fn fits(&self, p: &MigProfile, start: u8) -> bool {
        p.memory_mask(start) & self.mem == 0 && p.compute_mask(start) & self.cmp == 0
    }

    /// How many more instances of profile `idx` alone could be held here.
    pub(super) fn placeable(&self, g: &Geometry, idx: usize) -> u8 {
        if !self.live {
            // Idle: may be re-sliced, so the whole GPU is available.
            return Occupancy::of::<()>(g, []).live_placeable(g, idx);
        }
        self.live_placeable(g, idx)
    }

    pub(super) fn live_placeable(&self, g: &Geometry, idx: usize) -> u8 {
        let p = &g.profiles[idx];
        // Every table's starts are aligned to the span (tested), and for
        // equal-length intervals taking the earliest free start is optimal.
        let (mut mem, mut cmp, mut new) = (self.mem, self.cmp, 0u8);
        for &s in p.starts {
            if p.memory_mask(s) & mem == 0 && p.compute_mask(s) & cmp == 0 {
                mem |= p.memory_mask(s);
                cmp |= p.compute_mask(s);
                new += 1;
            }
        }
        let cap = if p.media_extensions {
            u8::from(!self.media)
        } else {
            p.max_instances.saturating_sub(self.count[idx])
        };
        self.free[idx] + new.min(cap)
    }

    /// Placeable counts, largest profile first: compared lexicographically,
    /// a larger key keeps bigger profiles possible.
    pub(super) fn headroom_key(&self, g: &Geometry) -> [u8; MAX_PROFILES] {
        let (order, n) = g.priority();
        let mut key = [0u8; MAX_PROFILES];
        for (k, &idx) in key.iter_mut().zip(&order[..n]) {
            *k = self.placeable(g, idx);
        }
        key
    }
}

/// The deterministic plan for placing one `profile` instance on `layout`, or
/// `None` when it cannot be placed (unknown profile, invalid layout, no room).
///
/// Rule, in order:
/// 1. a free existing instance of the profile, lowest start first;
/// 2. otherwise each allowed start where a new instance is valid: next to all
///    existing instances on a live GPU; on an idle GPU, free instances in the
///    way (overlapping, or the other `+me` one) are destroyed. Candidates are
///    ranked by fewest destroyed instances, then by the headroom left after
///    placing — [`placeable_counts`] listed from the largest profile
///    (compute, then memory) to the smallest, compared lexicographically so
///    the biggest profile still placeable wins — then by lowest start.
pub fn plan<L: Clone + PartialEq>(layout: &MigLayout<L>, profile: &str) -> Option<Plan> {
    let g = layout.geometry;
    let p = g.profile(profile)?;
    if !is_valid(layout) {
        return None;
    }
    if let Some(free) = layout
        .instances
        .iter()
        .find(|i| i.is_free() && i.profile == p)
    {
        return Some(Plan {
            profile: p,
            start: free.start,
            reuse: true,
            destroy: Vec::new(),
        });
    }
    let idx = g.index_of(p)?;
    let idle = layout.is_idle();
    let mut best: Option<(usize, [u8; MAX_PROFILES], u8, Vec<u8>)> = None;
    for &start in p.starts {
        let (m, c) = (p.memory_mask(start), p.compute_mask(start));
        let in_the_way = |i: &Instance<L>| {
            i.memory_mask() & m != 0
                || i.compute_mask() & c != 0
                || (p.media_extensions && i.profile.media_extensions)
        };
        let destroy: Vec<u8> = layout
            .instances
            .iter()
            .filter(|i| in_the_way(i))
            .map(|i| i.start)
            .collect();
        if !destroy.is_empty() && !idle {
            continue;
        }
        let mut after = Occupancy::of(g, layout.instances.iter().filter(|i| !in_the_way(i)));
        if !after.fits(p, start) || after.count[idx] >= p.max_instances {
            continue;
        }
        after.add(g, p, start, false);
        let key = after.headroom_key(g);
        let better = match &best {
            None => true,
            Some((d, k, s, _)) => {
                (destroy.len(), std::cmp::Reverse(key), start) < (*d, std::cmp::Reverse(*k), *s)
            }
        };
        if better {
            best = Some((destroy.len(), key, start, destroy));
        }
    }
    best.map(|(_, _, start, destroy)| Plan {
        profile: p,
        start,
        reuse: false,
        destroy,
    })
}

/// Where an instance of `profile` would go on `layout` (its start slice), or
/// `None` if it cannot be placed. Deterministic; see [`plan`] for the rule.
pub fn can_place<L: Clone + PartialEq>(layout: &MigLayout<L>, profile: &str) -> Option<u8> {
    plan(layout, profile).map(|p| p.start)
}

/// Places one instance of `profile` for `lease` following [`plan`].
pub fn place<L: Clone + PartialEq>(
    layout: &mut MigLayout<L>,
    profile: &str,
    lease: L,
) -> Result<Placement<L>, MigError> {
    let g = layout.geometry;
    let p = g.profile(profile).ok_or_else(|| MigError::UnknownProfile {
        model: g.model,
        profile: profile.to_string(),
    })?;
    validate(layout)?;
    if layout.instance_of(&lease).is_some() {
        return Err(MigError::LeaseAlreadyPlaced);
    }
    let plan = plan(layout, profile).ok_or(MigError::NoFit {
        model: g.model,
        profile: p.name,
    })?;
    let mut destroyed = Vec::new();
    layout.instances.retain(|i| {
        let gone = plan.destroy.contains(&i.start);
        if gone {
            destroyed.push(i.clone());
        }
        !gone
    });
    let instance = if plan.reuse {
        let inst = layout
            .instances
            .iter_mut()
            .find(|i| i.start == plan.start)
            .expect("the plan reuses an existing instance");
        inst.lease = Some(lease);
        inst.clone()
    } else {
        let inst = Instance {
            profile: p,
            start: plan.start,
            lease: Some(lease),
            persistent: false,
            unowned: false,
        };
        let at = layout.instances.partition_point(|i| i.start < plan.start);
        layout.instances.insert(at, inst.clone());
        inst
    };
    debug_assert!(is_valid(layout));
    Ok(Placement {
        instance,
        created: !plan.reuse,
        destroyed,
    })
}

/// Records that `lease` holds a new instance of `profile` at `start`, as a
/// node (or the log) reports it: the scheduler rebuilds its layouts from the
/// instances leases hold. Refused when the result breaks a placement rule.
pub fn place_at<L: Clone + PartialEq>(
    layout: &mut MigLayout<L>,
    profile: &str,
    start: u8,
    lease: L,
) -> Result<Instance<L>, MigError> {
    let g = layout.geometry;
    let p = g.profile(profile).ok_or_else(|| MigError::UnknownProfile {
        model: g.model,
        profile: profile.to_string(),
    })?;
    if layout.instance_of(&lease).is_some() {
        return Err(MigError::LeaseAlreadyPlaced);
    }
    let instance = Instance {
        profile: p,
        start,
        lease: Some(lease),
        persistent: false,
        unowned: false,
    };
    let mut next = layout.instances.clone();
    next.push(instance.clone());
    *layout = MigLayout::from_instances(g, next)?;
    Ok(instance)
}

/// Ends `lease`'s hold on this GPU. A persistent instance becomes free; an
/// instance [`place`] created is destroyed. Returns the instance as it was
/// while held, or `None` if the lease holds nothing here.
pub fn release<L: Clone + PartialEq>(layout: &mut MigLayout<L>, lease: &L) -> Option<Instance<L>> {
    let at = layout
        .instances
        .iter()
        .position(|i| i.lease.as_ref() == Some(lease))?;
    let held = layout.instances[at].clone();
    if held.persistent {
        layout.instances[at].lease = None;
    } else {
        layout.instances.remove(at);
    }
    Some(held)
}

/// For each profile of the model (table order), how many more instances of
/// that profile alone could still be placed on this GPU: free instances of
/// it plus new ones in uncovered slices (respecting the `+me` limit). An idle
/// GPU may be re-sliced, so its counts are the model's full maxima. A packing
/// policy can prefer GPUs/offsets that keep the counts of large profiles up.
pub fn placeable_counts<L: Clone + PartialEq>(
    layout: &MigLayout<L>,
) -> Vec<(&'static MigProfile, u8)> {
    let g = layout.geometry;
    let occ = Occupancy::of(g, &layout.instances);
    g.profiles
        .iter()
        .enumerate()
        .map(|(idx, p)| (p, occ.placeable(g, idx)))
        .collect()
}

/// How many more `profile` instances alone could be placed (see
/// [`placeable_counts`]); 0 for a profile the model lacks.
pub fn placeable<L: Clone + PartialEq>(layout: &MigLayout<L>, profile: &str) -> u8 {
    let g = layout.geometry;
    match g.profile(profile).and_then(|p| g.index_of(p)) {
        Some(idx) => Occupancy::of(g, &layout.instances).placeable(g, idx),
        None => 0,
    }
}
