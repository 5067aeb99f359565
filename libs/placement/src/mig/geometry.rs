//! The MIG geometry of each GPU model, as data: profiles, allowed starts,
//! slices (see docs/mig.md for the sources).

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

pub(super) fn span_mask(start: u8, len: u8) -> u16 {
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

    /// Index of `profile` in `profiles`.
    pub(super) fn index_of(&self, profile: &MigProfile) -> Option<usize> {
        self.profiles.iter().position(|p| p == profile)
    }

    /// Profile indices from largest to smallest: compute slices, then memory
    /// slices, then memory GB, plain before `+me`, then table order. This is
    /// the order in which [`can_place`] protects headroom.
    pub(super) fn priority(&self) -> ([usize; MAX_PROFILES], usize) {
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
pub(super) const MAX_PROFILES: usize = 8;

pub(super) const fn profile(
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

pub(super) const fn media(base: MigProfile, name: &'static str) -> MigProfile {
    MigProfile {
        name,
        max_instances: 1,
        media_extensions: true,
        ..base
    }
}

// Allowed starts, from `nvidia-smi mig -lgipp` (see docs/mig.md).
pub(super) const EVERY_SLICE_OF_7: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
pub(super) const EVEN_SLICES_OF_8: &[u8] = &[0, 2, 4, 6];
pub(super) const TWO_G_OF_7: &[u8] = &[0, 2, 4];
pub(super) const HALVES_OF_8: &[u8] = &[0, 4];
pub(super) const FIRST: &[u8] = &[0];
pub(super) const EVERY_SLICE_OF_4: &[u8] = &[0, 1, 2, 3];
pub(super) const HALVES_OF_4: &[u8] = &[0, 2];

pub(super) const A100_40_1G: MigProfile = profile("1g.5gb", 1, 5, 1, EVERY_SLICE_OF_7, 7);
pub(super) const A100_80_1G: MigProfile = profile("1g.10gb", 1, 10, 1, EVERY_SLICE_OF_7, 7);
pub(super) const H200_1G: MigProfile = profile("1g.18gb", 1, 18, 1, EVERY_SLICE_OF_7, 7);
pub(super) const A30_1G: MigProfile = profile("1g.6gb", 1, 6, 1, EVERY_SLICE_OF_4, 4);
pub(super) const A30_2G: MigProfile = profile("2g.12gb", 2, 12, 2, HALVES_OF_4, 2);

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
