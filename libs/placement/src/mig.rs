//! MIG (Multi-Instance GPU): per-model geometries as data, NVIDIA's slot
//! placement rules, and a deterministic placer for one GPU.
//!
//! Pure: no I/O, no clock, no randomness. See `docs/mig.md` for the tables,
//! the sources they come from and the rules in prose.
//!
//! # Model
//!
//! A MIG-capable GPU has `compute_slices` compute slices (7 on A100, H100 and
//! H200; 4 on A30) and `memory_slices` memory slices (8, or 4 on A30). A GPU
//! instance (GI) of a profile starts at one of the profile's allowed
//! `starts` (NVML's `GpuInstancePlacement.start`, what `nvidia-smi mig -lgipp`
//! prints) and occupies
//!
//! * memory slices `start .. start + memory_slices` (NVML's `size`), and
//! * compute slices `start .. start + compute_slices`.
//!
//! Two instances may coexist when neither their memory slices nor their
//! compute slices overlap, and at most one instance on a GPU may be a
//! media-extension (`+me`) profile: each of those takes the GPU's only OFA
//! (and its only JPEG engine on A100/A30), so NVIDIA lists one instance of
//! each and a single one per GPU.
//!
//! A [`MigLayout`] is the set of GPU instances that exist on one GPU, each free
//! or held by a lease. Placement follows the dynamic-MIG rule:
//!
//! * a GPU with at least one held instance is *live*: its existing instances
//!   stay as they are. A request may take a free existing instance of its
//!   profile, or a new instance may be created in slices no existing instance
//!   covers (NVIDIA allows creating a GI next to running ones as long as the
//!   placement is valid);
//! * a GPU with no held instance is *idle* and may be re-sliced: free
//!   instances that are in the way are destroyed (as few as possible).
//!
//! Instances created by [`place`] are destroyed again by [`release`];
//! instances provisioned ahead of time ([`MigLayout::provision`], or free
//! instances given to [`MigLayout::from_instances`]) are *persistent* and only
//! become free on release.

use std::fmt;

/// One GPU instance profile of one GPU model, with where it may be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MigProfile {
    /// NVIDIA's short name, e.g. `3g.20gb` or `1g.10gb+me`.
    pub name: &'static str,
    /// Compute slices (the `Ng` in the name).
    pub compute_slices: u8,
    /// Memory in GB as in the name.
    pub memory_gb: u32,
    /// Memory slices spanned (NVML placement `size`).
    pub memory_slices: u8,
    /// Allowed start slices (NVML placement `start`s), ascending.
    pub starts: &'static [u8],
    /// NVIDIA's "Number of Instances Available" for this profile alone. Kept
    /// as data to cross-check: tests derive the same number from `starts`.
    pub max_instances: u8,
    /// A `+me` profile (all media engines); at most one per GPU.
    pub media_extensions: bool,
}

impl MigProfile {
    /// Bit `i` set for each memory slice an instance at `start` occupies.
    pub fn memory_mask(&self, start: u8) -> u16 {
        span_mask(start, self.memory_slices)
    }

    /// Bit `i` set for each compute slice an instance at `start` occupies.
    pub fn compute_mask(&self, start: u8) -> u16 {
        span_mask(start, self.compute_slices)
    }
}

fn span_mask(start: u8, len: u8) -> u16 {
    debug_assert!(u32::from(start) + u32::from(len) <= 16);
    (((1u32 << len) - 1) << start) as u16
}

/// The MIG geometry of one GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Model name as in the catalog (`lh_domain::catalog`), e.g. `A100-40GB`.
    pub model: &'static str,
    /// The GPU's memory in GB.
    pub memory_gb: u32,
    pub compute_slices: u8,
    pub memory_slices: u8,
    /// Profiles in NVIDIA's table order (smallest first).
    pub profiles: &'static [MigProfile],
}

impl Geometry {
    /// The profile called `name` on this model.
    pub fn profile(&'static self, name: &str) -> Option<&'static MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Position of the profile called `name` in `profiles` (a stable small
    /// id for interning).
    pub fn profile_index(&self, name: &str) -> Option<usize> {
        self.profiles.iter().position(|p| p.name == name)
    }

    /// Index of `profile` in `profiles`.
    fn index_of(&self, profile: &MigProfile) -> Option<usize> {
        self.profiles.iter().position(|p| p == profile)
    }

    /// Profile indices from largest to smallest: compute slices, then memory
    /// slices, then memory GB, plain before `+me`, then table order. This is
    /// the order in which [`can_place`] protects headroom.
    fn priority(&self) -> ([usize; MAX_PROFILES], usize) {
        let n = self.profiles.len().min(MAX_PROFILES);
        let mut order = [0usize; MAX_PROFILES];
        for (i, slot) in order.iter_mut().enumerate().take(n) {
            *slot = i;
        }
        order[..n].sort_by(|&a, &b| {
            let (pa, pb) = (&self.profiles[a], &self.profiles[b]);
            pb.compute_slices
                .cmp(&pa.compute_slices)
                .then(pb.memory_slices.cmp(&pa.memory_slices))
                .then(pb.memory_gb.cmp(&pa.memory_gb))
                .then(pa.media_extensions.cmp(&pb.media_extensions))
                .then(a.cmp(&b))
        });
        (order, n)
    }
}

/// Most profiles one model has (H100/H200: 7 with `+me`).
const MAX_PROFILES: usize = 8;

const fn profile(
    name: &'static str,
    compute_slices: u8,
    memory_gb: u32,
    memory_slices: u8,
    starts: &'static [u8],
    max_instances: u8,
) -> MigProfile {
    MigProfile {
        name,
        compute_slices,
        memory_gb,
        memory_slices,
        starts,
        max_instances,
        media_extensions: false,
    }
}

const fn media(base: MigProfile, name: &'static str) -> MigProfile {
    MigProfile {
        name,
        max_instances: 1,
        media_extensions: true,
        ..base
    }
}

// Allowed starts, from `nvidia-smi mig -lgipp` (see docs/mig.md).
const EVERY_SLICE_OF_7: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const EVEN_SLICES_OF_8: &[u8] = &[0, 2, 4, 6];
const TWO_G_OF_7: &[u8] = &[0, 2, 4];
const HALVES_OF_8: &[u8] = &[0, 4];
const FIRST: &[u8] = &[0];
const EVERY_SLICE_OF_4: &[u8] = &[0, 1, 2, 3];
const HALVES_OF_4: &[u8] = &[0, 2];

const A100_40_1G: MigProfile = profile("1g.5gb", 1, 5, 1, EVERY_SLICE_OF_7, 7);
const A100_80_1G: MigProfile = profile("1g.10gb", 1, 10, 1, EVERY_SLICE_OF_7, 7);
const H200_1G: MigProfile = profile("1g.18gb", 1, 18, 1, EVERY_SLICE_OF_7, 7);
const A30_1G: MigProfile = profile("1g.6gb", 1, 6, 1, EVERY_SLICE_OF_4, 4);
const A30_2G: MigProfile = profile("2g.12gb", 2, 12, 2, HALVES_OF_4, 2);

static A100_40GB: &[MigProfile] = &[
    A100_40_1G,
    media(A100_40_1G, "1g.5gb+me"),
    profile("2g.10gb", 2, 10, 2, TWO_G_OF_7, 3),
    profile("3g.20gb", 3, 20, 4, HALVES_OF_8, 2),
    profile("4g.20gb", 4, 20, 4, FIRST, 1),
    profile("7g.40gb", 7, 40, 8, FIRST, 1),
];

static A100_80GB: &[MigProfile] = &[
    A100_80_1G,
    media(A100_80_1G, "1g.10gb+me"),
    profile("2g.20gb", 2, 20, 2, TWO_G_OF_7, 3),
    profile("3g.40gb", 3, 40, 4, HALVES_OF_8, 2),
    profile("4g.40gb", 4, 40, 4, FIRST, 1),
    profile("7g.80gb", 7, 80, 8, FIRST, 1),
];

static H100_80GB: &[MigProfile] = &[
    A100_80_1G,
    media(A100_80_1G, "1g.10gb+me"),
    profile("1g.20gb", 1, 20, 2, EVEN_SLICES_OF_8, 4),
    profile("2g.20gb", 2, 20, 2, TWO_G_OF_7, 3),
    profile("3g.40gb", 3, 40, 4, HALVES_OF_8, 2),
    profile("4g.40gb", 4, 40, 4, FIRST, 1),
    profile("7g.80gb", 7, 80, 8, FIRST, 1),
];

static H200_141GB: &[MigProfile] = &[
    H200_1G,
    media(H200_1G, "1g.18gb+me"),
    profile("1g.35gb", 1, 35, 2, EVEN_SLICES_OF_8, 4),
    profile("2g.35gb", 2, 35, 2, TWO_G_OF_7, 3),
    profile("3g.71gb", 3, 71, 4, HALVES_OF_8, 2),
    profile("4g.71gb", 4, 71, 4, FIRST, 1),
    profile("7g.141gb", 7, 141, 8, FIRST, 1),
];

static A30_24GB: &[MigProfile] = &[
    A30_1G,
    media(A30_1G, "1g.6gb+me"),
    A30_2G,
    media(A30_2G, "2g.12gb+me"),
    profile("4g.24gb", 4, 24, 4, FIRST, 1),
];

static GEOMETRIES: &[Geometry] = &[
    Geometry {
        model: "A100-40GB",
        memory_gb: 40,
        compute_slices: 7,
        memory_slices: 8,
        profiles: A100_40GB,
    },
    Geometry {
        model: "A100-80GB",
        memory_gb: 80,
        compute_slices: 7,
        memory_slices: 8,
        profiles: A100_80GB,
    },
    Geometry {
        model: "H100-80GB",
        memory_gb: 80,
        compute_slices: 7,
        memory_slices: 8,
        profiles: H100_80GB,
    },
    Geometry {
        model: "H200-141GB",
        memory_gb: 141,
        compute_slices: 7,
        memory_slices: 8,
        profiles: H200_141GB,
    },
    Geometry {
        model: "A30-24GB",
        memory_gb: 24,
        compute_slices: 4,
        memory_slices: 4,
        profiles: A30_24GB,
    },
];

/// Every MIG-capable model this engine knows.
pub fn geometries() -> &'static [Geometry] {
    GEOMETRIES
}

/// The MIG geometry of `model` (exact catalog name), `None` when the model
/// does not support MIG or is unknown.
pub fn geometry(model: &str) -> Option<&'static Geometry> {
    GEOMETRIES.iter().find(|g| g.model == model)
}

/// Every distinct profile name over all geometries, in a fixed order: the
/// engine's small id for a MIG demand (a request may accept several models,
/// so the id cannot be a position in one model's table).
pub fn profile_names() -> &'static [&'static str] {
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let mut names: Vec<&'static str> = Vec::new();
        for p in GEOMETRIES.iter().flat_map(|g| g.profiles) {
            if !names.contains(&p.name) {
                names.push(p.name);
            }
        }
        names
    })
}

/// Share of the GPU's compute an instance of `profile` holds, in milli-GPU
/// (compute slices over the model's slices), and its memory in GB.
pub fn size(profile: &MigProfile, geometry: &Geometry) -> (u16, u32) {
    let milli = u32::from(profile.compute_slices) * 1000 / u32::from(geometry.compute_slices);
    (milli as u16, profile.memory_gb)
}

/// The MIG profiles of `model`; empty when it has none.
pub fn profiles(model: &str) -> &'static [MigProfile] {
    geometry(model).map_or(&[], |g| g.profiles)
}

/// A GPU instance that exists on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Instance<L> {
    pub profile: &'static MigProfile,
    /// Start slice; unique on a GPU, so it also names the instance.
    pub start: u8,
    /// The lease holding it, `None` when free.
    pub lease: Option<L>,
    /// Survives [`release`] (provisioned ahead of time). Instances created by
    /// [`place`] are not persistent and are destroyed on release. A free
    /// instance is always persistent.
    pub persistent: bool,
}

impl<L> Instance<L> {
    pub fn is_free(&self) -> bool {
        self.lease.is_none()
    }

    fn memory_mask(&self) -> u16 {
        self.profile.memory_mask(self.start)
    }

    fn compute_mask(&self) -> u16 {
        self.profile.compute_mask(self.start)
    }
}

/// The MIG state of one GPU: which instances exist where, and who holds them.
/// Instances are kept sorted by start.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigLayout<L> {
    geometry: &'static Geometry,
    instances: Vec<Instance<L>>,
}

impl<L: Clone + PartialEq> MigLayout<L> {
    /// A GPU of `model` in MIG mode with no instances.
    pub fn new(model: &str) -> Option<Self> {
        geometry(model).map(Self::empty)
    }

    /// A GPU with this geometry and no instances.
    pub fn empty(geometry: &'static Geometry) -> Self {
        Self {
            geometry,
            instances: Vec::new(),
        }
    }

    /// A layout from existing instances (e.g. as a node reports them), checked
    /// with [`validate`].
    pub fn from_instances(
        geometry: &'static Geometry,
        mut instances: Vec<Instance<L>>,
    ) -> Result<Self, MigError> {
        instances.sort_by_key(|i| i.start);
        let layout = Self {
            geometry,
            instances,
        };
        validate(&layout)?;
        Ok(layout)
    }

    pub fn geometry(&self) -> &'static Geometry {
        self.geometry
    }

    /// Existing instances, sorted by start.
    pub fn instances(&self) -> &[Instance<L>] {
        &self.instances
    }

    /// No instance is held: the GPU may be re-sliced.
    pub fn is_idle(&self) -> bool {
        self.instances.iter().all(Instance::is_free)
    }

    /// The instance `lease` holds on this GPU.
    pub fn instance_of(&self, lease: &L) -> Option<&Instance<L>> {
        self.instances
            .iter()
            .find(|i| i.lease.as_ref() == Some(lease))
    }

    /// Memory slices covered by existing instances (bit per slice).
    pub fn memory_mask(&self) -> u16 {
        self.instances.iter().fold(0, |m, i| m | i.memory_mask())
    }

    /// Compute slices covered by existing instances (bit per slice).
    pub fn compute_mask(&self) -> u16 {
        self.instances.iter().fold(0, |m, i| m | i.compute_mask())
    }

    /// Compute slices held by leases.
    pub fn held_compute_slices(&self) -> u8 {
        self.instances
            .iter()
            .filter(|i| !i.is_free())
            .map(|i| i.profile.compute_slices)
            .sum()
    }

    /// Creates a free, persistent instance of `profile` at `start` (an
    /// operator pre-slicing the GPU). Only into slices no instance covers.
    pub fn provision(&mut self, profile: &str, start: u8) -> Result<(), MigError> {
        let prof = self
            .geometry
            .profile(profile)
            .ok_or_else(|| MigError::UnknownProfile {
                model: self.geometry.model,
                profile: profile.to_string(),
            })?;
        let mut next = self.instances.clone();
        next.push(Instance {
            profile: prof,
            start,
            lease: None,
            persistent: true,
        });
        *self = Self::from_instances(self.geometry, next)?;
        Ok(())
    }
}

/// Why a MIG operation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigError {
    UnknownProfile {
        model: &'static str,
        profile: String,
    },
    /// No free instance and no valid slot for the profile on this GPU.
    NoFit {
        model: &'static str,
        profile: &'static str,
    },
    /// The lease already holds an instance on this GPU.
    LeaseAlreadyPlaced,
    /// The layout breaks a placement rule.
    Invalid(String),
}

impl fmt::Display for MigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigError::UnknownProfile { model, profile } => {
                write!(f, "{model} has no MIG profile {profile}")
            }
            MigError::NoFit { model, profile } => {
                write!(f, "no room for a {profile} instance on this {model}")
            }
            MigError::LeaseAlreadyPlaced => {
                write!(f, "the lease already holds an instance on this GPU")
            }
            MigError::Invalid(why) => write!(f, "invalid MIG layout: {why}"),
        }
    }
}

impl std::error::Error for MigError {}

/// Checks a layout against the placement rules: every profile belongs to the
/// model, every start is an allowed one, spans stay within the GPU's compute
/// and memory slices, no two instances share a memory or compute slice, at
/// most one `+me` instance, no profile over its instance count, no lease
/// twice, and free instances are persistent.
pub fn validate<L: PartialEq>(layout: &MigLayout<L>) -> Result<(), MigError> {
    let g = layout.geometry;
    let invalid = |why: String| Err(MigError::Invalid(why));
    let (mut mem, mut cmp) = (0u16, 0u16);
    let mut counts = [0u8; MAX_PROFILES];
    let mut media = 0;
    for (n, inst) in layout.instances.iter().enumerate() {
        let p = inst.profile;
        let Some(idx) = g.index_of(p) else {
            return invalid(format!("{} is not a {} profile", p.name, g.model));
        };
        if !p.starts.contains(&inst.start) {
            return invalid(format!("{} may not start at slice {}", p.name, inst.start));
        }
        if u32::from(inst.start) + u32::from(p.memory_slices) > u32::from(g.memory_slices)
            || u32::from(inst.start) + u32::from(p.compute_slices) > u32::from(g.compute_slices)
        {
            return invalid(format!("{} at {} runs past the GPU", p.name, inst.start));
        }
        if mem & inst.memory_mask() != 0 || cmp & inst.compute_mask() != 0 {
            return invalid(format!(
                "{} at {} overlaps another instance",
                p.name, inst.start
            ));
        }
        mem |= inst.memory_mask();
        cmp |= inst.compute_mask();
        counts[idx] += 1;
        if counts[idx] > p.max_instances {
            return invalid(format!(
                "more than {} {} instances",
                p.max_instances, p.name
            ));
        }
        if p.media_extensions {
            media += 1;
            if media > 1 {
                return invalid("more than one +me instance".to_string());
            }
        }
        match &inst.lease {
            None if !inst.persistent => {
                return invalid(format!(
                    "free {} at {} is not persistent",
                    p.name, inst.start
                ));
            }
            Some(l)
                if layout.instances[..n]
                    .iter()
                    .any(|o| o.lease.as_ref() == Some(l)) =>
            {
                return invalid("a lease holds two instances".to_string());
            }
            _ => {}
        }
    }
    Ok(())
}

/// [`validate`] as a yes/no.
pub fn is_valid<L: PartialEq>(layout: &MigLayout<L>) -> bool {
    validate(layout).is_ok()
}

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
struct Occupancy {
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
    fn of<'a, L: 'a>(g: &Geometry, instances: impl IntoIterator<Item = &'a Instance<L>>) -> Self {
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

    fn add(&mut self, g: &Geometry, p: &MigProfile, start: u8, free: bool) {
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
    fn fits(&self, p: &MigProfile, start: u8) -> bool {
        p.memory_mask(start) & self.mem == 0 && p.compute_mask(start) & self.cmp == 0
    }

    /// How many more instances of profile `idx` alone could be held here.
    fn placeable(&self, g: &Geometry, idx: usize) -> u8 {
        if !self.live {
            // Idle: may be re-sliced, so the whole GPU is available.
            return Occupancy::of::<()>(g, []).live_placeable(g, idx);
        }
        self.live_placeable(g, idx)
    }

    fn live_placeable(&self, g: &Geometry, idx: usize) -> u8 {
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
    fn headroom_key(&self, g: &Geometry) -> [u8; MAX_PROFILES] {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// NVIDIA's profile table: per model, each profile and how many instances
    /// of it alone fit on one GPU. `+me` profiles are NVIDIA's, one each.
    const PROFILE_COUNTS: &[(&str, &[(&str, u8)])] = &[
        (
            "A100-40GB",
            &[
                ("1g.5gb", 7),
                ("2g.10gb", 3),
                ("3g.20gb", 2),
                ("4g.20gb", 1),
                ("7g.40gb", 1),
            ],
        ),
        (
            "A100-80GB",
            &[
                ("1g.10gb", 7),
                ("2g.20gb", 3),
                ("3g.40gb", 2),
                ("4g.40gb", 1),
                ("7g.80gb", 1),
            ],
        ),
        (
            "H100-80GB",
            &[
                ("1g.10gb", 7),
                ("2g.20gb", 3),
                ("3g.40gb", 2),
                ("4g.40gb", 1),
                ("7g.80gb", 1),
                ("1g.20gb", 4),
            ],
        ),
        (
            "H200-141GB",
            &[
                ("1g.18gb", 7),
                ("1g.35gb", 4),
                ("2g.35gb", 3),
                ("3g.71gb", 2),
                ("4g.71gb", 1),
                ("7g.141gb", 1),
            ],
        ),
        ("A30-24GB", &[("1g.6gb", 4), ("2g.12gb", 2), ("4g.24gb", 1)]),
    ];

    fn held(g: &'static Geometry, name: &str, start: u8, lease: u32) -> Instance<u32> {
        Instance {
            profile: g
                .profile(name)
                .unwrap_or_else(|| panic!("{} has {name}", g.model)),
            start,
            lease: Some(lease),
            persistent: false,
        }
    }

    fn layout_of(model: &str, parts: &[(&str, u8)]) -> Result<MigLayout<u32>, MigError> {
        let g = geometry(model).unwrap();
        let instances = parts
            .iter()
            .zip(0u32..)
            .map(|(&(name, start), lease)| held(g, name, start, lease))
            .collect();
        MigLayout::from_instances(g, instances)
    }

    /// Most instances of `p` alone, by trying every subset of its starts
    /// against `validate` (independent of the placer's greedy count).
    fn brute_force_max(g: &'static Geometry, p: &'static MigProfile) -> u8 {
        let n = p.starts.len();
        (0u32..1 << n)
            .filter_map(|bits| {
                let inst: Vec<_> = (0..n)
                    .filter(|i| bits & (1 << i) != 0)
                    .map(|i| Instance {
                        profile: p,
                        start: p.starts[i],
                        lease: Some(i as u32),
                        persistent: false,
                    })
                    .collect();
                MigLayout::from_instances(g, inst)
                    .ok()
                    .map(|l| l.instances().len() as u8)
            })
            .max()
            .unwrap()
    }

    #[test]
    fn models_have_exactly_the_nvidia_profiles_plus_media_variants() {
        assert_eq!(geometries().len(), PROFILE_COUNTS.len());
        for &(model, expected) in PROFILE_COUNTS {
            let g = geometry(model).unwrap();
            let mut plain: Vec<_> = g
                .profiles
                .iter()
                .filter(|p| !p.media_extensions)
                .map(|p| p.name)
                .collect();
            let mut want: Vec<_> = expected.iter().map(|(n, _)| *n).collect();
            plain.sort_unstable();
            want.sort_unstable();
            assert_eq!(plain, want, "{model}");
            for me in g.profiles.iter().filter(|p| p.media_extensions) {
                let base = me.name.strip_suffix("+me").unwrap();
                let base = g.profile(base).unwrap();
                assert_eq!(
                    (
                        base.compute_slices,
                        base.memory_gb,
                        base.memory_slices,
                        base.starts
                    ),
                    (me.compute_slices, me.memory_gb, me.memory_slices, me.starts),
                    "{model} {}",
                    me.name
                );
            }
        }
    }

    #[test]
    fn profile_counts_follow_from_the_offsets() {
        for &(model, expected) in PROFILE_COUNTS {
            let g = geometry(model).unwrap();
            let mut all: Vec<(&str, u8)> = expected.to_vec();
            all.extend(
                g.profiles
                    .iter()
                    .filter(|p| p.media_extensions)
                    .map(|p| (p.name, 1)),
            );
            let empty = MigLayout::<u32>::empty(g);
            let counts = placeable_counts(&empty);
            for (name, count) in all {
                let p = g.profile(name).unwrap();
                assert_eq!(p.max_instances, count, "{model} {name} table");
                assert_eq!(brute_force_max(g, p), count, "{model} {name} brute force");
                let c = counts.iter().find(|(q, _)| q.name == name).unwrap().1;
                assert_eq!(c, count, "{model} {name} placeable_counts");
                let mut l = empty.clone();
                let mut placed = 0u8;
                while place(&mut l, name, u32::from(placed)).is_ok() {
                    placed += 1;
                    assert!(placed <= 8);
                }
                assert_eq!(placed, count, "{model} {name} successive place");
                assert!(placeable_counts(&l)
                    .iter()
                    .all(|(q, n)| *n == 0 || q.name != name));
            }
        }
    }

    #[test]
    fn tables_respect_the_slice_rules() {
        for g in geometries() {
            let (c, m) = (g.compute_slices, g.memory_slices);
            match g.model {
                "A30-24GB" => assert_eq!((c, m), (4, 4)),
                _ => assert_eq!((c, m), (7, 8), "{}", g.model),
            }
            assert!(g.profiles.len() <= MAX_PROFILES);
            let mut names: Vec<_> = g.profiles.iter().map(|p| p.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), g.profiles.len(), "{} duplicate names", g.model);
            let full = g
                .profiles
                .iter()
                .find(|p| p.compute_slices == c)
                .expect("a whole-GPU profile");
            assert_eq!(
                (full.memory_slices, full.memory_gb, full.starts),
                (m, g.memory_gb, &[0u8][..])
            );
            for p in g.profiles {
                let what = format!("{} {}", g.model, p.name);
                let suffix = if p.media_extensions { "+me" } else { "" };
                assert_eq!(
                    p.name,
                    format!("{}g.{}gb{suffix}", p.compute_slices, p.memory_gb),
                    "{what}"
                );
                // Memory in the name is the GPU's memory times the span's
                // fraction of the memory slices, rounded (within 1 GB).
                let exact = u32::from(p.memory_slices) * g.memory_gb;
                let named = p.memory_gb * u32::from(m);
                assert!(
                    named.abs_diff(exact) <= u32::from(m),
                    "{what} memory {named} vs {exact}"
                );
                assert!(
                    p.compute_slices >= 1 && p.compute_slices <= p.memory_slices,
                    "{what}"
                );
                assert!(
                    !p.starts.is_empty() && p.starts.windows(2).all(|w| w[0] < w[1]),
                    "{what}"
                );
                for &s in p.starts {
                    assert!(s + p.memory_slices <= m, "{what} at {s} past memory slices");
                    assert!(
                        s + p.compute_slices <= c,
                        "{what} at {s} past compute slices"
                    );
                    assert_eq!(
                        s % p.memory_slices,
                        0,
                        "{what} at {s} not aligned to its span"
                    );
                }
            }
        }
    }

    #[test]
    fn nvidia_combinations_are_valid() {
        let ok: &[(&str, &[(&str, u8)])] = &[
            ("A100-40GB", &[("7g.40gb", 0)]),
            ("A100-40GB", &[("4g.20gb", 0), ("3g.20gb", 4)]),
            (
                "A100-40GB",
                &[("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)],
            ),
            (
                "A100-40GB",
                &[("4g.20gb", 0), ("1g.5gb", 4), ("1g.5gb", 5), ("1g.5gb", 6)],
            ),
            ("A100-40GB", &[("3g.20gb", 0), ("3g.20gb", 4)]),
            (
                "A100-40GB",
                &[("3g.20gb", 0), ("2g.10gb", 4), ("1g.5gb+me", 6)],
            ),
            (
                "A100-40GB",
                &[("2g.10gb", 0), ("2g.10gb", 2), ("3g.20gb", 4)],
            ),
            (
                "A100-40GB",
                &[
                    ("2g.10gb", 0),
                    ("2g.10gb", 2),
                    ("2g.10gb", 4),
                    ("1g.5gb", 6),
                ],
            ),
            (
                "A100-40GB",
                &[("1g.5gb", 0), ("1g.5gb", 1), ("2g.10gb", 2), ("3g.20gb", 4)],
            ),
            (
                "A100-80GB",
                &[
                    ("1g.10gb", 0),
                    ("1g.10gb", 1),
                    ("1g.10gb", 2),
                    ("1g.10gb", 3),
                    ("1g.10gb", 4),
                    ("1g.10gb", 5),
                    ("1g.10gb", 6),
                ],
            ),
            (
                "H100-80GB",
                &[
                    ("1g.20gb", 0),
                    ("1g.20gb", 2),
                    ("1g.20gb", 4),
                    ("1g.20gb", 6),
                ],
            ),
            (
                "H100-80GB",
                &[("3g.40gb", 0), ("2g.20gb", 4), ("1g.20gb", 6)],
            ),
            (
                "H200-141GB",
                &[("4g.71gb", 0), ("1g.35gb", 4), ("1g.18gb+me", 6)],
            ),
            ("A30-24GB", &[("2g.12gb", 0), ("1g.6gb", 2), ("1g.6gb", 3)]),
            (
                "A30-24GB",
                &[("1g.6gb+me", 0), ("1g.6gb", 1), ("2g.12gb", 2)],
            ),
        ];
        for (model, parts) in ok {
            let l = layout_of(model, parts).unwrap_or_else(|e| panic!("{model} {parts:?}: {e}"));
            let compute: u8 = l.instances().iter().map(|i| i.profile.compute_slices).sum();
            assert!(compute <= l.geometry().compute_slices);
        }
    }

    #[test]
    fn rule_breaking_layouts_are_rejected() {
        let bad: &[(&str, &[(&str, u8)])] = &[
            ("A100-40GB", &[("4g.20gb", 0), ("3g.20gb", 0)]),
            // 3g at 0 spans memory slices 0..4: its 4th compute slice is lost.
            ("A100-40GB", &[("3g.20gb", 0), ("1g.5gb", 3)]),
            ("A100-40GB", &[("4g.20gb", 0), ("4g.20gb", 0)]),
            ("A100-40GB", &[("7g.40gb", 0), ("1g.5gb", 6)]),
            ("A100-40GB", &[("1g.5gb+me", 0), ("1g.5gb+me", 1)]),
            ("H100-80GB", &[("1g.20gb", 0), ("1g.10gb", 1)]),
            ("H100-80GB", &[("3g.40gb", 4), ("1g.20gb", 6)]),
            ("A30-24GB", &[("1g.6gb+me", 0), ("2g.12gb+me", 2)]),
            ("A30-24GB", &[("4g.24gb", 0), ("1g.6gb", 3)]),
        ];
        for (model, parts) in bad {
            assert!(
                layout_of(model, parts).is_err(),
                "{model} {parts:?} accepted"
            );
        }
        let g = geometry("A100-40GB").unwrap();
        let p = g.profile("1g.5gb").unwrap();
        let at = |start: u8, lease: Option<u32>, persistent: bool| Instance {
            profile: p,
            start,
            lease,
            persistent,
        };
        // Not an allowed start: 1g may not sit on memory slice 7.
        assert!(MigLayout::from_instances(g, vec![at(7, Some(1), false)]).is_err());
        assert!(
            MigLayout::from_instances(g, vec![at(1, Some(1), false), at(2, Some(1), false)])
                .is_err()
        );
        assert!(MigLayout::from_instances(g, vec![at(1, None, false)]).is_err());
        let other = geometry("H100-80GB").unwrap().profile("1g.20gb").unwrap();
        let foreign = Instance::<u32> {
            profile: other,
            start: 0,
            lease: None,
            persistent: true,
        };
        assert!(MigLayout::from_instances(g, vec![foreign]).is_err());
    }

    #[test]
    fn offsets_keep_the_largest_profiles_possible() {
        let cases: &[(&str, &str, u8)] = &[
            ("A100-40GB", "1g.5gb", 6),
            ("A100-40GB", "2g.10gb", 4),
            ("A100-40GB", "3g.20gb", 4),
            ("A100-40GB", "4g.20gb", 0),
            ("A100-40GB", "7g.40gb", 0),
            ("H100-80GB", "1g.20gb", 6),
            ("H200-141GB", "1g.35gb", 6),
            ("A30-24GB", "1g.6gb", 0),
            ("A30-24GB", "2g.12gb", 0),
        ];
        for &(model, name, start) in cases {
            let l = MigLayout::<u32>::new(model).unwrap();
            assert_eq!(can_place(&l, name), Some(start), "{model} {name}");
        }
        let mut l = MigLayout::<u32>::new("A100-40GB").unwrap();
        let a = place(&mut l, "3g.20gb", 1).unwrap();
        assert_eq!((a.instance.start, a.created), (4, true));
        let counts: Vec<_> = placeable_counts(&l)
            .iter()
            .map(|(p, n)| (p.name, *n))
            .collect();
        assert_eq!(
            counts,
            [
                ("1g.5gb", 4),
                ("1g.5gb+me", 1),
                ("2g.10gb", 2),
                ("3g.20gb", 1),
                ("4g.20gb", 1),
                ("7g.40gb", 0)
            ]
        );
        assert_eq!(place(&mut l, "4g.20gb", 2).unwrap().instance.start, 0);
        assert!(placeable_counts(&l).iter().all(|(_, n)| *n == 0));
        assert_eq!(
            place(&mut l, "1g.5gb", 3),
            Err(MigError::NoFit {
                model: "A100-40GB",
                profile: "1g.5gb"
            })
        );
        // Small instances pack from the top down, leaving 4g at 0 possible.
        let mut l = MigLayout::<u32>::new("A100-40GB").unwrap();
        let starts: Vec<u8> = (0..3)
            .map(|i| place(&mut l, "1g.5gb", i).unwrap().instance.start)
            .collect();
        assert_eq!(starts, [6, 4, 5]);
        assert_eq!(placeable(&l, "4g.20gb"), 1);
    }

    #[test]
    fn a_live_gpu_is_not_resliced() {
        let mut l = MigLayout::<u32>::new("A100-40GB").unwrap();
        for s in 0..7 {
            l.provision("1g.5gb", s).unwrap();
        }
        assert!(l.is_idle());
        let first = place(&mut l, "1g.5gb", 1).unwrap();
        assert_eq!((first.instance.start, first.created), (0, false));
        assert!(!l.is_idle());
        assert_eq!(can_place(&l, "2g.10gb"), None);
        assert_eq!(placeable(&l, "2g.10gb"), 0);
        assert_eq!(placeable(&l, "1g.5gb"), 6);
        assert_eq!(can_place(&l, "1g.5gb"), Some(1));
        // Releasing a provisioned instance keeps it, free.
        let before = l.clone();
        place(&mut l, "1g.5gb", 2).unwrap();
        let gone = release(&mut l, &2).unwrap();
        assert_eq!((gone.start, gone.lease), (1, Some(2)));
        assert_eq!(l, before);
        assert_eq!(release(&mut l, &99), None);
    }

    #[test]
    fn an_idle_gpu_is_resliced_destroying_as_few_as_possible() {
        let mut l = MigLayout::<u32>::new("A100-40GB").unwrap();
        for s in 0..7 {
            l.provision("1g.5gb", s).unwrap();
        }
        let p = plan(&l, "3g.20gb").unwrap();
        assert_eq!(
            (p.start, p.reuse, p.destroy.clone()),
            (4, false, vec![4, 5, 6])
        );
        let placed = place(&mut l, "3g.20gb", 1).unwrap();
        assert_eq!(
            placed.destroyed.iter().map(|i| i.start).collect::<Vec<_>>(),
            [4, 5, 6]
        );
        assert!(placed.created);
        release(&mut l, &1).unwrap();
        let left: Vec<u8> = l.instances().iter().map(|i| i.start).collect();
        assert_eq!(left, [0, 1, 2, 3]);
        assert!(l.instances().iter().all(|i| i.is_free() && i.persistent));
        // A free instance of the profile is reused before anything is created.
        let mut l = MigLayout::<u32>::new("A30-24GB").unwrap();
        l.provision("2g.12gb", 0).unwrap();
        let p = place(&mut l, "2g.12gb", 7).unwrap();
        assert_eq!((p.instance.start, p.created), (0, false));
    }

    #[test]
    fn one_media_extension_instance_per_gpu() {
        let mut l = MigLayout::<u32>::new("H100-80GB").unwrap();
        place(&mut l, "1g.10gb+me", 1).unwrap();
        assert_eq!(placeable(&l, "1g.10gb+me"), 0);
        assert!(matches!(
            place(&mut l, "1g.10gb+me", 2),
            Err(MigError::NoFit { .. })
        ));
        let mut l = MigLayout::<u32>::new("A30-24GB").unwrap();
        place(&mut l, "1g.6gb+me", 1).unwrap();
        assert_eq!(can_place(&l, "2g.12gb+me"), None);
        assert!(can_place(&l, "2g.12gb").is_some());
        // On an idle GPU the free +me instance is destroyed to make way.
        let mut l = MigLayout::<u32>::new("A30-24GB").unwrap();
        l.provision("1g.6gb+me", 0).unwrap();
        let p = place(&mut l, "2g.12gb+me", 1).unwrap();
        assert_eq!(p.destroyed.len(), 1);
        assert!(is_valid(&l));
    }

    #[test]
    fn errors_and_unknowns() {
        assert!(geometry("L4-24GB").is_none());
        assert!(profiles("L4-24GB").is_empty());
        assert_eq!(profiles("H100-80GB").len(), 7);
        assert!(MigLayout::<u32>::new("nope").is_none());
        let mut l = MigLayout::<u32>::new("A100-80GB").unwrap();
        // 1g.20gb is an H100 profile, not an A100-80GB one.
        assert!(matches!(
            place(&mut l, "1g.20gb", 1),
            Err(MigError::UnknownProfile { .. })
        ));
        assert_eq!(can_place(&l, "1g.20gb"), None);
        assert_eq!(placeable(&l, "1g.20gb"), 0);
        place(&mut l, "1g.10gb", 1).unwrap();
        assert_eq!(
            place(&mut l, "2g.20gb", 1),
            Err(MigError::LeaseAlreadyPlaced)
        );
        assert!(l.provision("7g.80gb", 0).is_err());
        assert!(l.provision("1g.10gb", 7).is_err());
        assert_eq!(l.held_compute_slices(), 1);
        assert_eq!(l.instance_of(&1).map(|i| i.start), Some(6));
        assert!(MigError::LeaseAlreadyPlaced.to_string().contains("lease"));
    }

    mod props {
        use super::super::*;
        use super::brute_force_max;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Place(usize, u32),
            Release(u32),
            Provision(usize, usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (0usize..8, 0u32..10).prop_map(|(p, l)| Op::Place(p, l)),
                3 => (0u32..10).prop_map(Op::Release),
                1 => (0usize..8, 0usize..8).prop_map(|(p, s)| Op::Provision(p, s)),
            ]
        }

        fn apply(layout: &mut MigLayout<u32>, op: &Op) {
            let ps = layout.geometry().profiles;
            match *op {
                Op::Place(p, lease) => match place(layout, ps[p % ps.len()].name, lease) {
                    Ok(_) | Err(MigError::NoFit { .. }) | Err(MigError::LeaseAlreadyPlaced) => {}
                    Err(e) => panic!("unexpected {e}"),
                },
                Op::Release(lease) => {
                    release(layout, &lease);
                }
                Op::Provision(p, s) => {
                    let p = &ps[p % ps.len()];
                    let _ = layout.provision(p.name, p.starts[s % p.starts.len()]);
                }
            }
        }

        fn build(gi: usize, ops: &[Op]) -> MigLayout<u32> {
            let mut l = MigLayout::empty(&geometries()[gi]);
            for op in ops {
                apply(&mut l, op);
            }
            l
        }

        fn check_slices(l: &MigLayout<u32>) -> Result<(), TestCaseError> {
            let g = l.geometry();
            let compute: u32 = l
                .instances()
                .iter()
                .map(|i| u32::from(i.profile.compute_slices))
                .sum();
            let memory: u32 = l
                .instances()
                .iter()
                .map(|i| u32::from(i.profile.memory_slices))
                .sum();
            prop_assert!(compute <= u32::from(g.compute_slices));
            prop_assert!(memory <= u32::from(g.memory_slices));
            prop_assert_eq!(l.compute_mask().count_ones(), compute);
            prop_assert_eq!(l.memory_mask().count_ones(), memory);
            prop_assert!(l.compute_mask() < 1 << g.compute_slices);
            prop_assert!(l.memory_mask() < 1 << g.memory_slices);
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn any_sequence_keeps_the_layout_valid(
                gi in 0usize..5,
                ops in prop::collection::vec(op(), 0..48),
            ) {
                let mut l = MigLayout::empty(&geometries()[gi]);
                for op in &ops {
                    apply(&mut l, op);
                    prop_assert!(is_valid(&l), "{:?} after {:?}", l, op);
                    check_slices(&l)?;
                }
            }

            #[test]
            fn place_then_release_restores_the_layout(
                gi in 0usize..5,
                ops in prop::collection::vec(op(), 0..32),
            ) {
                let before = build(gi, &ops);
                for p in before.geometry().profiles {
                    let mut l = before.clone();
                    let expected = can_place(&before, p.name);
                    match place(&mut l, p.name, 1000) {
                        Ok(placed) => {
                            prop_assert_eq!(Some(placed.instance.start), expected);
                            prop_assert!(is_valid(&l));
                            check_slices(&l)?;
                            let released = release(&mut l, &1000).unwrap();
                            prop_assert_eq!(released, placed.instance);
                            let mut want = before.clone();
                            want.instances.retain(|i| !placed.destroyed.contains(i));
                            prop_assert!(placed.destroyed.is_empty() || before.is_idle());
                            prop_assert_eq!(l, want);
                        }
                        Err(e) => {
                            prop_assert_eq!(expected, None);
                            prop_assert_eq!(l, before.clone(), "a refused place changed the layout: {}", e);
                        }
                    }
                }
            }

            #[test]
            fn can_place_is_deterministic(
                gi in 0usize..5,
                ops in prop::collection::vec(op(), 0..32),
            ) {
                let l = build(gi, &ops);
                prop_assert_eq!(&l, &build(gi, &ops));
                for p in l.geometry().profiles {
                    let copy = l.clone();
                    prop_assert_eq!(plan(&l, p.name), plan(&l, p.name));
                    prop_assert_eq!(can_place(&l, p.name), can_place(&copy, p.name));
                    let (mut a, mut b) = (l.clone(), l.clone());
                    prop_assert_eq!(place(&mut a, p.name, 77), place(&mut b, p.name, 77));
                    prop_assert_eq!(a, b);
                }
            }

            #[test]
            fn can_place_finds_a_slot_whenever_one_exists(
                gi in 0usize..5,
                ops in prop::collection::vec(op(), 0..32),
            ) {
                let l = build(gi, &ops);
                let g = l.geometry();
                for p in g.profiles {
                    // Oracle from `validate` alone: a free instance of the
                    // profile, an idle GPU (re-sliced), or some allowed start
                    // where a new instance is valid next to all others.
                    let free = l.instances().iter().any(|i| i.is_free() && i.profile == p);
                    let slot = p.starts.iter().any(|&s| {
                        let mut inst = l.instances().to_vec();
                        inst.push(Instance { profile: p, start: s, lease: Some(1000), persistent: false });
                        MigLayout::from_instances(g, inst).is_ok()
                    });
                    let exists = free || l.is_idle() || slot;
                    prop_assert_eq!(can_place(&l, p.name).is_some(), exists, "{} on {:?}", p.name, l);
                    prop_assert_eq!(placeable(&l, p.name) > 0, exists);
                }
            }

            #[test]
            fn placeable_counts_are_what_successive_places_achieve(
                gi in 0usize..5,
                ops in prop::collection::vec(op(), 0..32),
            ) {
                let l = build(gi, &ops);
                let g = l.geometry();
                for (p, count) in placeable_counts(&l) {
                    if l.is_idle() {
                        prop_assert_eq!(count, p.max_instances);
                        prop_assert_eq!(count, brute_force_max(g, p));
                        continue;
                    }
                    let mut m = l.clone();
                    let mut placed = 0u8;
                    while place(&mut m, p.name, 1000 + u32::from(placed)).is_ok() {
                        placed += 1;
                    }
                    prop_assert_eq!(placed, count, "{} on {:?}", p.name, l);
                }
            }
        }
    }
}
