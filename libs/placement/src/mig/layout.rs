//! The instances that exist on one GPU, and the placement rules a layout
//! must keep.

use std::fmt;

use super::*;

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
    /// Exists on the GPU but belongs to no lease (an operator made it, or
    /// the log that named its lease was lost): taken, never handed out,
    /// never destroyed to re-slice the GPU. Held by no lease, and persistent.
    pub unowned: bool,
}

impl<L> Instance<L> {
    /// Neither a lease's nor unowned: a lease may be given it.
    pub fn is_free(&self) -> bool {
        self.lease.is_none() && !self.unowned
    }

    pub(super) fn memory_mask(&self) -> u16 {
        self.profile.memory_mask(self.start)
    }

    pub(super) fn compute_mask(&self) -> u16 {
        self.profile.compute_mask(self.start)
    }
}

/// The MIG state of one GPU: which instances exist where, and who holds them.
/// Instances are kept sorted by start.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigLayout<L> {
    pub(super) geometry: &'static Geometry,
    pub(super) instances: Vec<Instance<L>>,
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

    /// No instance is held by a lease nor unowned: the GPU may be re-sliced.
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

    /// Compute slices held by leases or unowned.
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
        self.add_persistent(profile, start, false)
    }

    /// Records an instance of `profile` at `start` that exists on the GPU
    /// but belongs to no lease. Only into slices no instance covers.
    pub fn add_unowned(&mut self, profile: &str, start: u8) -> Result<(), MigError> {
        self.add_persistent(profile, start, true)
    }

    fn add_persistent(&mut self, profile: &str, start: u8, unowned: bool) -> Result<(), MigError> {
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
            unowned,
        });
        *self = Self::from_instances(self.geometry, next)?;
        Ok(())
    }

    /// The GPU as it would be once every lease on it ended: only its
    /// unowned instances (and free persistent ones) remain.
    pub fn without_leases(&self) -> Self {
        Self {
            geometry: self.geometry,
            instances: self
                .instances
                .iter()
                .filter(|i| i.lease.is_none())
                .cloned()
                .collect(),
        }
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
            Some(_) if inst.unowned => {
                return invalid(format!(
                    "unowned {} at {} is held by a lease",
                    p.name, inst.start
                ));
            }
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
