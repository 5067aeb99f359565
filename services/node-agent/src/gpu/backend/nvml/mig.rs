//! MIG instances through NVML's raw functions: nvml-wrapper 0.13 wraps MIG
//! devices but not GPU or compute instances, so their calls go through the
//! library table it loaded (`Nvml::lib`) with the device's raw handle.
//!
//! Our profile names (`3g.40gb`) are matched to the GPU's own profile ids by
//! asking the GPU for every profile's info, not by a table of ids: ids and
//! memory sizes differ between models and drivers.
//!
//! Not run on a real GPU yet: the H200 we had was not in MIG mode, and the
//! agent never switches the mode (see docs/gpu-backends.md).

use std::ffi::CStr;
use std::mem;
use std::ptr;

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceProfileInfo_t, nvmlComputeInstance_t, nvmlDevice_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t, nvmlGpuInstanceProfileInfo_v2_t,
    nvmlGpuInstance_t, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT, NVML_GPU_INSTANCE_PROFILE_COUNT,
};

/// Most compute instances one GPU instance may hold (a 7-slice GI split
/// into 1-slice CIs).
const MAX_COMPUTE_INSTANCES_PER_GI: usize = 8;
/// Most placements one profile has (one per memory slice).
const MAX_PLACEMENTS: usize = 16;
/// `nvmlGpuInstanceProfileInfo_v2` in nvml.h: `NVML_STRUCT_VERSION(..., 2)`.
const GPU_INSTANCE_PROFILE_INFO_V2: u32 =
    mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);

/// What a GPU says about one of its GPU-instance profiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GiProfile {
    /// NVML's profile id (what creation takes).
    pub(crate) id: u32,
    /// The driver's name (`MIG 3g.40gb`), where it gives one (v2 info).
    pub(crate) name: Option<String>,
    /// Compute slices: the `Ng` of the name.
    pub(crate) slice_count: u32,
    pub(crate) memory_mib: u64,
    /// Optical flow accelerators: only media-extension (`+me`) and
    /// whole-GPU profiles have one.
    pub(crate) ofa_count: u32,
}

/// The GPU's profile id for our profile `name`. The driver's own name wins
/// where it gives one; otherwise compute slices must equal the name's `Ng`,
/// memory must be near the name's GB (nearest wins), and a `+me` name
/// takes the profile with an OFA, a plain name the one without when both
/// exist. `None`: the GPU has no such profile.
pub(crate) fn match_profile(name: &str, profiles: &[GiProfile]) -> Option<u32> {
    let by_name = profiles.iter().find(|p| {
        p.name
            .as_deref()
            .map(|n| n.trim().trim_start_matches("MIG ").trim())
            == Some(name)
    });
    if let Some(p) = by_name {
        return Some(p.id);
    }
    let (base, media) = match name.strip_suffix("+me") {
        Some(base) => (base, true),
        None => (name, false),
    };
    let (g, gb) = base.split_once("g.")?;
    let g: u32 = g.parse().ok()?;
    let gb: u64 = gb.strip_suffix("gb")?.parse().ok()?;
    let gb_of = |p: &GiProfile| (p.memory_mib as f64 / 1024.0).round() as u64;
    // Drivers give a profile less memory than its name says: 4864 MiB for
    // `5gb` on an A100, 16 GiB for `1g.18gb` and 69.75 GiB for `3g.71gb` on
    // the H200 we recorded. A seventh of the name's GB covers those and
    // still tells `1g.18gb` from `1g.35gb`.
    let tolerance_gb = gb.div_ceil(7).max(1);
    let candidates: Vec<&GiProfile> = profiles
        .iter()
        .filter(|p| p.slice_count == g && gb_of(p).abs_diff(gb) <= tolerance_gb)
        .collect();
    let nearest = candidates.iter().map(|p| gb_of(p).abs_diff(gb)).min()?;
    let sized: Vec<&&GiProfile> = candidates
        .iter()
        .filter(|p| gb_of(p).abs_diff(gb) == nearest)
        .collect();
    if media {
        sized.iter().find(|p| p.ofa_count > 0).map(|p| p.id)
    } else {
        sized
            .iter()
            .min_by_key(|p| (p.ofa_count > 0 && sized.len() > 1, p.id))
            .map(|p| p.id)
    }
}

/// The GPU instance profiles the GPU knows (ids it answers for).
pub(crate) fn gi_profiles(nvml: &Nvml, device: &Device<'static>) -> Vec<GiProfile> {
    let lib = nvml.lib();
    // SAFETY: the handle is valid for the leaked `Nvml`'s lifetime.
    let handle = unsafe { device.handle() };
    let mut out = Vec::new();
    for id in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
        // v2 carries the driver's name; drivers without it answer v1.
        let v2 = nvml_sym(lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref()).and_then(|sym| {
            // SAFETY: a zeroed plain C struct with its version set, as
            // nvml.h asks; NVML writes within its size.
            unsafe {
                let mut info: nvmlGpuInstanceProfileInfo_v2_t = mem::zeroed();
                info.version = GPU_INSTANCE_PROFILE_INFO_V2;
                nvml_try(sym(handle, id, &mut info))?;
                Ok(info)
            }
        });
        let profile = match v2 {
            Ok(info) => GiProfile {
                id: info.id,
                // SAFETY: NVML writes a NUL-terminated name into the array.
                name: unsafe { CStr::from_ptr(info.name.as_ptr()) }
                    .to_str()
                    .ok()
                    .map(str::to_string),
                slice_count: info.sliceCount,
                memory_mib: info.memorySizeMB,
                ofa_count: info.ofaCount,
            },
            Err(_) => {
                let v1 =
                    nvml_sym(lib.nvmlDeviceGetGpuInstanceProfileInfo.as_ref()).and_then(|sym| {
                        // SAFETY: as above, for the unversioned struct.
                        unsafe {
                            let mut info: nvmlGpuInstanceProfileInfo_t = mem::zeroed();
                            nvml_try(sym(handle, id, &mut info))?;
                            Ok(info)
                        }
                    });
                let Ok(info) = v1 else {
                    // Not a profile of this GPU.
                    continue;
                };
                GiProfile {
                    id: info.id,
                    name: None,
                    slice_count: info.sliceCount,
                    memory_mib: info.memorySizeMB,
                    ofa_count: info.ofaCount,
                }
            }
        };
        out.push(profile);
    }
    out
}

/// The size (memory slices) of profile `profile_id`'s placement at
/// `start`, from the GPU's list of every placement the profile allows
/// (whatever exists now). `None`: the profile does not start there.
pub(crate) fn placement_size(
    nvml: &Nvml,
    device: &Device<'static>,
    profile_id: u32,
    start: u32,
) -> Result<Option<u32>, NvmlError> {
    let sym = nvml_sym(
        nvml.lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref(),
    )?;
    // SAFETY: valid for the leaked `Nvml`'s lifetime.
    let handle = unsafe { device.handle() };
    let mut placements = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; MAX_PLACEMENTS];
    let mut count = MAX_PLACEMENTS as u32;
    // SAFETY: NVML writes at most `count` placements into the array.
    nvml_try(unsafe { sym(handle, profile_id, placements.as_mut_ptr(), &mut count) })?;
    Ok(placements
        .iter()
        .take(count as usize)
        .find(|p| p.start == start)
        .map(|p| p.size))
}

/// Creates a GPU instance of profile `profile_id` at `start` (its size is
/// the profile's), and one compute instance spanning it. Returns the GPU
/// instance's id. A compute instance that cannot be made takes its GPU
/// instance back down.
pub(crate) fn create(
    nvml: &Nvml,
    device: &Device<'static>,
    profile_id: u32,
    start: u32,
    memory_slices: u32,
) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    // SAFETY: valid for the leaked `Nvml`'s lifetime.
    let handle = unsafe { device.handle() };
    let create_gi = nvml_sym(lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let placement = nvmlGpuInstancePlacement_t {
        start,
        size: memory_slices,
    };
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: pointers to locals that outlive the call.
    nvml_try(unsafe { create_gi(handle, profile_id, &placement, &mut gi) })?;
    let made = (|| {
        let info = gi_info(nvml, gi)?;
        create_full_compute_instance(nvml, gi)?;
        Ok(info.id)
    })();
    if made.is_err() {
        let _ = destroy_gi(nvml, gi);
    }
    made
}

/// The compute instance profile whose slices fill the GPU instance.
fn create_full_compute_instance(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<(), NvmlError> {
    let lib = nvml.lib();
    let info = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())?;
    let create = nvml_sym(lib.nvmlGpuInstanceCreateComputeInstance.as_ref())?;
    let mut best: Option<nvmlComputeInstanceProfileInfo_t> = None;
    for p in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        // SAFETY: a zeroed plain C struct NVML fills.
        let got = unsafe {
            let mut i: nvmlComputeInstanceProfileInfo_t = mem::zeroed();
            nvml_try(info(
                gi,
                p,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut i,
            ))
            .map(|_| i)
        };
        if let Ok(i) = got {
            if best.is_none_or(|b| i.sliceCount > b.sliceCount) {
                best = Some(i);
            }
        }
    }
    let best = best.ok_or(NvmlError::NotSupported)?;
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: pointer to a local that outlives the call.
    nvml_try(unsafe { create(gi, best.id, &mut ci) })
}

fn gi_info(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<nvmlGpuInstanceInfo_t, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    // SAFETY: a zeroed plain C struct NVML fills.
    unsafe {
        let mut info: nvmlGpuInstanceInfo_t = mem::zeroed();
        nvml_try(sym(gi, &mut info))?;
        Ok(info)
    }
}

/// The placement start of GPU instance `gi_id` on `parent`.
pub(crate) fn gi_start(nvml: &Nvml, parent: nvmlDevice_t, gi_id: u32) -> Result<u32, NvmlError> {
    let gi = gi_by_id(nvml, parent, gi_id)?;
    Ok(gi_info(nvml, gi)?.placement.start)
}

fn gi_by_id(nvml: &Nvml, parent: nvmlDevice_t, gi_id: u32) -> Result<nvmlGpuInstance_t, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: pointer to a local that outlives the call.
    nvml_try(unsafe { sym(parent, gi_id, &mut gi) })?;
    Ok(gi)
}

/// The GPU instance id behind a MIG device handle.
pub(crate) fn gi_id_of(nvml: &Nvml, mig: &Device<'static>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref())?;
    let mut id = 0;
    // SAFETY: a MIG device handle from NVML; pointer to a local.
    nvml_try(unsafe { sym(mig.handle(), &mut id) })?;
    Ok(id)
}

/// Destroys the compute instances of GPU instance `gi_id`, then the GPU
/// instance. Gone already: fine.
pub(crate) fn destroy(nvml: &Nvml, parent: nvmlDevice_t, gi_id: u32) -> Result<(), NvmlError> {
    let gi = match gi_by_id(nvml, parent, gi_id) {
        Ok(gi) => gi,
        Err(NvmlError::NotFound | NvmlError::InvalidArg) => return Ok(()),
        Err(e) => return Err(e),
    };
    let lib = nvml.lib();
    let list = nvml_sym(lib.nvmlGpuInstanceGetComputeInstances.as_ref())?;
    let destroy_ci = nvml_sym(lib.nvmlComputeInstanceDestroy.as_ref())?;
    for p in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        let mut cis: [nvmlComputeInstance_t; MAX_COMPUTE_INSTANCES_PER_GI] =
            [ptr::null_mut(); MAX_COMPUTE_INSTANCES_PER_GI];
        let mut count = 0;
        // SAFETY: NVML writes at most the array's length of handles.
        let listed = unsafe { nvml_try(list(gi, p, cis.as_mut_ptr(), &mut count)) };
        if listed.is_err() {
            continue;
        }
        for ci in cis.iter().take(count as usize) {
            // SAFETY: a handle NVML just listed.
            nvml_try(unsafe { destroy_ci(*ci) })?;
        }
    }
    destroy_gi(nvml, gi)
}

fn destroy_gi(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<(), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
    // SAFETY: a GPU instance handle from NVML.
    nvml_try(unsafe { sym(gi) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: u32, name: Option<&str>, slices: u32, mib: u64, ofa: u32) -> GiProfile {
        GiProfile {
            id,
            name: name.map(str::to_string),
            slice_count: slices,
            memory_mib: mib,
            ofa_count: ofa,
        }
    }

    /// An H100's profiles as v1 info gives them (no names): ids and sizes
    /// from NVIDIA's go-nvml mocks, not our table.
    fn h100_unnamed() -> Vec<GiProfile> {
        vec![
            p(0, None, 1, 9856, 0),
            p(7, None, 1, 9856, 1),
            p(9, None, 1, 19968, 0),
            p(1, None, 2, 20096, 0),
            p(2, None, 3, 40320, 0),
            p(3, None, 4, 40320, 0),
            p(4, None, 7, 80384, 1),
        ]
    }

    #[test]
    fn names_match_by_slices_memory_and_media() {
        let ps = h100_unnamed();
        assert_eq!(match_profile("1g.10gb", &ps), Some(0));
        assert_eq!(match_profile("1g.10gb+me", &ps), Some(7));
        assert_eq!(match_profile("1g.20gb", &ps), Some(9));
        assert_eq!(match_profile("2g.20gb", &ps), Some(1));
        assert_eq!(match_profile("3g.40gb", &ps), Some(2));
        assert_eq!(match_profile("4g.40gb", &ps), Some(3));
        // The whole GPU has an OFA, and no plain twin to lose it to.
        assert_eq!(match_profile("7g.80gb", &ps), Some(4));
        // Not on this GPU, or not a profile name.
        assert_eq!(match_profile("1g.5gb", &ps), None);
        assert_eq!(match_profile("2g.20gb+me", &ps), None);
        assert_eq!(match_profile("3g", &ps), None);
        assert_eq!(match_profile("", &ps), None);
    }

    /// The H200 sizes recorded in docs/gpu-backends.md, without names.
    #[test]
    fn h200_sizes_below_their_names_still_match() {
        let ps = vec![
            p(0, None, 1, 16 * 1024, 0),
            p(7, None, 1, 16 * 1024, 1),
            p(9, None, 1, 32 * 1024 + 512, 0),
            p(2, None, 3, 71_424, 0),
        ];
        assert_eq!(match_profile("1g.18gb", &ps), Some(0));
        assert_eq!(match_profile("1g.18gb+me", &ps), Some(7));
        assert_eq!(match_profile("1g.35gb", &ps), Some(9));
        assert_eq!(match_profile("3g.71gb", &ps), Some(2));
        assert_eq!(match_profile("1g.10gb", &ps), None);
    }

    #[test]
    fn the_drivers_name_wins() {
        // Names decide even where sizes would say otherwise.
        let ps = vec![
            p(3, Some("MIG 1g.18gb"), 1, 33792, 0),
            p(7, Some("MIG 1g.18gb+me"), 1, 16384, 1),
            p(9, Some("MIG 1g.35gb"), 1, 16384, 0),
        ];
        assert_eq!(match_profile("1g.18gb", &ps), Some(3));
        assert_eq!(match_profile("1g.18gb+me", &ps), Some(7));
        assert_eq!(match_profile("1g.35gb", &ps), Some(9));
        assert_eq!(match_profile("2g.35gb", &ps), None);
    }

    #[test]
    fn profile_info_version_is_nvmls() {
        // NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2).
        assert_eq!(GPU_INSTANCE_PROFILE_INFO_V2 >> 24, 2);
        assert_eq!(
            GPU_INSTANCE_PROFILE_INFO_V2 & 0x00ff_ffff,
            mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32
        );
    }
}
