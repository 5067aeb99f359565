//! The NVML backend: a real NVIDIA host, through nvml-wrapper.
//!
//! nvml-wrapper loads `libnvidia-ml.so.1` at run time (libloading), so the
//! agent builds and its tests run on machines without the driver; there
//! [`NvmlBackend::new`] returns [`BackendError::LibraryMissing`] and the
//! agent prints that one line and exits non-zero (or falls back to the
//! simulated backend when told to).
//!
//! NVML handles (`Device`, `EventSet`) borrow the `Nvml` value they came
//! from. The backend lives as long as the process, so the `Nvml` value is
//! leaked once to get `'static` handles instead of a self-referential
//! struct; the driver releases it when the process exits.
//!
//! What a call cannot tell (power on a board without a sensor, utilisation
//! of a GPU in MIG mode, ECC on a board without it) is reported as zero or
//! `None` rather than failing the whole sample. A GPU that answers
//! `GPU_IS_LOST` is left out of samples and reported once as
//! [`GpuEventKind::Lost`] by the next `wait_events`.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};

use super::{
    BackendError, GpuBackend, GpuDevice, GpuEvent, GpuEventKind, GpuSample, MigDevice,
    ProcessMemory, MAX_EVENTS_PER_WAIT,
};

mod mig;

/// `NVML_NVLINK_MAX_LINKS` in nvml.h (18 since NVML 11 / Hopper).
const NVLINK_MAX_LINKS: u32 = 18;
/// `NVML_DEVICE_MIG_ENABLE` in nvml.h; nvml-wrapper keeps its bindings private.
const NVML_DEVICE_MIG_ENABLE: u32 = 1;
const MIB: u64 = 1024 * 1024;

/// The events the health state machine acts on. Other event types (clock,
/// P-state, single-bit ECC) are noise for it.
fn health_event_types() -> EventTypes {
    EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR
}

pub struct NvmlBackend {
    nvml: &'static Nvml,
    devices: Vec<Device<'static>>,
    /// `None` when no GPU supports the health events (then ECC is still
    /// caught from the counters in samples, see `crate::gpu::health`).
    /// `EventSet` is `Send` but not `Sync`: NVML event sets are not
    /// thread-safe, hence the mutex.
    events: Option<Mutex<EventSet<'static>>>,
    /// GPUs already reported lost, so each loss is one event.
    lost: Mutex<BTreeSet<u32>>,
    /// Losses found while sampling, delivered by the next `wait_events`.
    pending: Mutex<Vec<GpuEvent>>,
}

impl NvmlBackend {
    /// Loads NVML from the default place (`libnvidia-ml.so.1` on the
    /// loader's path).
    pub fn new() -> Result<Self, BackendError> {
        Self::from_init(Nvml::init())
    }

    /// Loads NVML from an explicit library path (a driver installed outside
    /// the loader's path; tests use a path that does not exist).
    pub fn with_library_path(path: &OsStr) -> Result<Self, BackendError> {
        Self::from_init(Nvml::builder().lib_path(path).init())
    }

    fn from_init(init: Result<Nvml, NvmlError>) -> Result<Self, BackendError> {
        let nvml: &'static Nvml = Box::leak(Box::new(init.map_err(init_error)?));
        let count = nvml.device_count().map_err(nvml_error("device_count"))?;
        let devices = (0..count)
            .map(|i| nvml.device_by_index(i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(nvml_error("device_by_index"))?;
        let events = register_health_events(nvml, &devices).map(Mutex::new);
        Ok(Self {
            nvml,
            devices,
            events,
            lost: Mutex::default(),
            pending: Mutex::default(),
        })
    }

    /// The driver's version, for the check script and logs.
    pub fn driver_version(&self) -> Result<String, BackendError> {
        self.nvml
            .sys_driver_version()
            .map_err(nvml_error("sys_driver_version"))
    }

    /// Whether XID / double-bit ECC events are registered for any GPU.
    pub fn has_event_set(&self) -> bool {
        self.events.is_some()
    }

    fn note_lost(&self, index: u32, now: DateTime<Utc>) {
        let first = self.lost.lock().expect("lost set").insert(index);
        if first {
            self.pending.lock().expect("pending").push(GpuEvent {
                index,
                kind: GpuEventKind::Lost,
                at: now,
            });
        }
    }

    fn sample_one(&self, index: u32, device: &Device<'static>) -> Result<GpuSample, NvmlError> {
        // Memory and temperature are what health judges: without them the
        // sample is worthless, so their errors leave the GPU out.
        let memory = device.memory_info()?;
        let temperature_c = device.temperature(TemperatureSensor::Gpu)?;
        // The rest is best effort. Utilisation is not supported in MIG mode.
        let utilization_pct = optional(device.utilization_rates())?.map(|u| u.gpu);
        let power_w = optional(device.power_usage())?
            .map(|mw| f64::from(mw) / 1000.0)
            .unwrap_or(0.0);
        // Volatile counts: reset when the driver reloads, which cannot
        // happen while this agent holds NVML open; the health tracker treats
        // a decrease as a reset, not as errors.
        let ecc_double_bit_total =
            optional(device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile))?;
        let processes = optional(device.running_compute_processes())?
            .unwrap_or_default()
            .into_iter()
            .map(|p| ProcessMemory {
                pid: p.pid,
                used_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => bytes / MIB,
                    UsedGpuMemory::Unavailable => 0,
                },
            })
            .collect();
        Ok(GpuSample {
            index,
            utilization_pct,
            memory_used_mib: memory.used / MIB,
            memory_total_mib: memory.total / MIB,
            temperature_c,
            power_w,
            ecc_double_bit_total,
            processes,
        })
    }

    fn describe(&self, index: u32, device: &Device<'static>) -> Result<GpuDevice, BackendError> {
        let uuid = device.uuid().map_err(nvml_error("uuid"))?;
        let model = device.name().map_err(nvml_error("name"))?;
        let memory = device.memory_info().map_err(nvml_error("memory_info"))?;
        let mig_enabled = device
            .mig_mode()
            .map(|m| m.current == NVML_DEVICE_MIG_ENABLE)
            .unwrap_or(false);
        let mig_devices = if mig_enabled {
            mig_devices(self.nvml, device)
        } else {
            Vec::new()
        };
        Ok(GpuDevice {
            index,
            uuid,
            model,
            vram_mib: memory.total / MIB,
            mig_enabled,
            mig_devices,
            nvlink_peers: self.nvlink_peers(device),
            numa_node: numa_node(device),
        })
    }

    fn device(&self, gpu: u32) -> Result<&Device<'static>, BackendError> {
        self.devices
            .get(gpu as usize)
            .ok_or_else(|| BackendError::Mig {
                gpu,
                why: format!("no such GPU (the host has {})", self.devices.len()),
            })
    }

    /// The MIG device of GPU instance `gi_id`: the one compute instance
    /// the agent made in it.
    fn mig_device_of(&self, device: &Device<'static>, gi_id: u32) -> Option<String> {
        let max = device.mig_device_count().unwrap_or(0);
        (0..max)
            .filter_map(|i| device.mig_device_by_index(i).ok())
            .find(|m| mig::gi_id_of(self.nvml, m).ok() == Some(gi_id))
            .and_then(|m| m.uuid().ok())
    }

    /// Peers over active NVLinks: the remote end's PCI bus id, matched to
    /// our own GPUs (an NVSwitch or a CPU at the far end is not a peer).
    fn nvlink_peers(&self, device: &Device<'static>) -> Vec<u32> {
        let mut peers = BTreeSet::new();
        for link in 0..NVLINK_MAX_LINKS {
            let link = device.link_wrapper_for(link);
            if !link.is_active().unwrap_or(false) {
                continue;
            }
            let Ok(remote) = link.remote_pci_info() else {
                continue;
            };
            for (i, other) in self.devices.iter().enumerate() {
                let same = other
                    .pci_info()
                    .map(|p| p.bus_id.eq_ignore_ascii_case(&remote.bus_id))
                    .unwrap_or(false);
                if same {
                    peers.insert(i as u32);
                }
            }
        }
        peers.into_iter().collect()
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn inventory(&self) -> Result<Vec<GpuDevice>, BackendError> {
        self.devices
            .iter()
            .enumerate()
            .map(|(i, d)| self.describe(i as u32, d))
            .collect()
    }

    fn sample(&self, now: DateTime<Utc>) -> Result<Vec<GpuSample>, BackendError> {
        let mut samples = Vec::with_capacity(self.devices.len());
        for (i, device) in self.devices.iter().enumerate() {
            let index = i as u32;
            match self.sample_one(index, device) {
                Ok(s) => {
                    // Answers again (after a reset): a later loss is news.
                    self.lost.lock().expect("lost set").remove(&index);
                    samples.push(s);
                }
                Err(NvmlError::GpuLost) => self.note_lost(index, now),
                Err(e) => {
                    tracing::warn!(gpu = index, error = %e, "NVML sample failed; GPU left out")
                }
            }
        }
        Ok(samples)
    }

    fn create_mig_instance(
        &self,
        gpu: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigDevice, BackendError> {
        let refuse = |why: String| BackendError::Mig { gpu, why };
        let device = self.device(gpu)?;
        let enabled = device
            .mig_mode()
            .map(|m| m.current == NVML_DEVICE_MIG_ENABLE)
            .unwrap_or(false);
        if !enabled {
            return Err(refuse(
                "the GPU is not in MIG mode; switching it needs a GPU reset, which is an operator's action".into(),
            ));
        }
        let profiles = mig::gi_profiles(self.nvml, device);
        let id = mig::match_profile(profile, &profiles).ok_or_else(|| {
            refuse(format!(
                "the GPU has no profile {profile} (it has {} profiles)",
                profiles.len()
            ))
        })?;
        let size = mig::placement_size(self.nvml, device, id, start)
            .map_err(nvml_error("gpu_instance_possible_placements"))?
            .ok_or_else(|| refuse(format!("{profile} cannot start at slot {start}")))?;
        let gi_id = mig::create(self.nvml, device, id, start, size)
            .map_err(|e| refuse(format!("creating {profile} at slot {start}: {e}")))?;
        let uuid = self.mig_device_of(device, gi_id).ok_or_else(|| {
            // SAFETY: valid for the leaked `Nvml`'s lifetime.
            let _ = mig::destroy(self.nvml, unsafe { device.handle() }, gi_id);
            refuse(format!(
                "{profile} at slot {start} was made but shows no MIG device"
            ))
        })?;
        Ok(MigDevice {
            uuid,
            profile: profile.to_string(),
            gpu_instance_start: Some(start),
        })
    }

    fn destroy_mig_instance(&self, gpu: u32, uuid: &str) -> Result<(), BackendError> {
        let device = self.device(gpu)?;
        let max = device.mig_device_count().unwrap_or(0);
        let Some(found) = (0..max)
            .filter_map(|i| device.mig_device_by_index(i).ok())
            .find(|m| m.uuid().ok().as_deref() == Some(uuid))
        else {
            return Ok(());
        };
        let gi_id = mig::gi_id_of(self.nvml, &found).map_err(nvml_error("gpu_instance_id"))?;
        // SAFETY: valid for the leaked `Nvml`'s lifetime.
        mig::destroy(self.nvml, unsafe { device.handle() }, gi_id).map_err(|e| BackendError::Mig {
            gpu,
            why: format!("destroying {uuid}: {e}"),
        })
    }

    fn wait_events(&self, timeout: Duration) -> Result<Vec<GpuEvent>, BackendError> {
        let mut out: Vec<GpuEvent> = std::mem::take(&mut *self.pending.lock().expect("pending"));
        let Some(events) = &self.events else {
            if out.is_empty() {
                std::thread::sleep(timeout);
            }
            return Ok(out);
        };
        let set = events.lock().expect("event set");
        // Wait for the first event only when nothing is pending; then drain
        // whatever else is ready without waiting.
        let mut wait_ms = if out.is_empty() {
            u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX)
        } else {
            0
        };
        while out.len() < MAX_EVENTS_PER_WAIT {
            let data = match set.wait(wait_ms) {
                Ok(d) => d,
                Err(NvmlError::Timeout) => break,
                Err(e) => return Err(nvml_error("event_set.wait")(e)),
            };
            wait_ms = 0;
            let at = Utc::now();
            let Ok(index) = data.device.index() else {
                tracing::warn!(event = ?data.event_type, "NVML event from a device without an index; dropped");
                continue;
            };
            if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                match data.event_data {
                    Some(XidError::Value(code)) => out.push(GpuEvent {
                        index,
                        kind: GpuEventKind::Xid(code),
                        at,
                    }),
                    _ => tracing::warn!(gpu = index, "XID event without a code; dropped"),
                }
            }
            if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                out.push(GpuEvent {
                    index,
                    kind: GpuEventKind::EccDoubleBit,
                    at,
                });
            }
        }
        Ok(out)
    }
}

/// Registers XID and double-bit ECC events for every GPU that supports
/// them. nvml-wrapper frees the set when a registration fails, so a failure
/// starts a fresh set without that GPU.
fn register_health_events(
    nvml: &'static Nvml,
    devices: &[Device<'static>],
) -> Option<EventSet<'static>> {
    let wanted: Vec<(usize, EventTypes)> = devices
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            let supported = d.supported_event_types().ok()?;
            let types = supported & health_event_types();
            (!types.is_empty()).then_some((i, types))
        })
        .collect();
    let mut skip = BTreeSet::new();
    // Each failure removes one GPU, so this ends after at most n + 1 rounds.
    'rounds: for _ in 0..=wanted.len() {
        let mut set = match nvml.create_event_set() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "NVML event set unavailable; XID events will not be seen");
                return None;
            }
        };
        let mut registered = 0;
        for (i, types) in wanted.iter().filter(|(i, _)| !skip.contains(i)) {
            match devices[*i].register_events(*types, set) {
                Ok(s) => {
                    set = s;
                    registered += 1;
                }
                Err(e) => {
                    tracing::warn!(gpu = i, error = %e.error, "cannot register XID/ECC events for this GPU");
                    skip.insert(*i);
                    continue 'rounds;
                }
            }
        }
        return (registered > 0).then_some(set);
    }
    None
}

fn mig_devices(nvml: &Nvml, device: &Device<'static>) -> Vec<MigDevice> {
    let max = device.mig_device_count().unwrap_or(0);
    (0..max)
        .filter_map(|i| device.mig_device_by_index(i).ok())
        .filter_map(|mig| {
            let uuid = mig.uuid().ok()?;
            let profile = mig
                .name()
                .ok()
                .and_then(|n| mig_profile_from_name(&n))
                .or_else(|| {
                    let a = mig.attributes().ok()?;
                    Some(format!(
                        "{}g.{}gb",
                        a.gpu_instance_slice_count,
                        a.memory_size_mb.div_ceil(1024)
                    ))
                })
                .unwrap_or_else(|| "unknown".to_string());
            // SAFETY: valid for the leaked `Nvml`'s lifetime.
            let parent = unsafe { device.handle() };
            let gpu_instance_start = mig::gi_id_of(nvml, &mig)
                .and_then(|gi| mig::gi_start(nvml, parent, gi))
                .ok();
            Some(MigDevice {
                uuid,
                profile,
                gpu_instance_start,
            })
        })
        .collect()
}

/// NVML names a MIG device after its parent and profile:
/// `NVIDIA H100 80GB HBM3 MIG 1g.10gb` → `1g.10gb`.
pub(crate) fn mig_profile_from_name(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    (!profile.is_empty()).then(|| profile.to_string())
}

/// NUMA node: NVML's answer when the driver has it, else the kernel's view
/// of the GPU's PCI function (`-1` there means none).
fn numa_node(device: &Device<'static>) -> Option<u32> {
    if let Ok(node) = device.numa_node_id() {
        return Some(node);
    }
    let bus_id = device.pci_info().ok()?.bus_id;
    let path = format!(
        "/sys/bus/pci/devices/{}/numa_node",
        sysfs_pci_address(&bus_id)?
    );
    std::fs::read_to_string(path)
        .ok()?
        .trim()
        .parse::<u32>()
        .ok()
}

/// NVML writes a bus id as `00000000:3B:00.0` (32-bit domain, upper case);
/// sysfs as `0000:3b:00.0`.
pub(crate) fn sysfs_pci_address(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    Some(format!("{domain:04x}:{}", rest.to_ascii_lowercase()))
}

/// `Ok(None)` for answers that mean "this GPU cannot tell"; `GpuLost` and
/// everything unexpected stay errors.
fn optional<T>(r: Result<T, NvmlError>) -> Result<Option<T>, NvmlError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(NvmlError::GpuLost) => Err(NvmlError::GpuLost),
        Err(NvmlError::NotSupported | NvmlError::NoPermission | NvmlError::NotFound) => Ok(None),
        Err(e) => {
            tracing::debug!(error = %e, "optional NVML reading unavailable");
            Ok(None)
        }
    }
}

fn init_error(e: NvmlError) -> BackendError {
    match e {
        NvmlError::LibloadingError(e) => BackendError::LibraryMissing {
            detail: e.to_string(),
        },
        NvmlError::LibraryNotFound => BackendError::LibraryMissing {
            detail: "NVML_ERROR_LIBRARY_NOT_FOUND".to_string(),
        },
        NvmlError::FailedToLoadSymbol(s) => BackendError::LibraryMissing {
            detail: format!("nvmlInit_v2 missing: {s}"),
        },
        NvmlError::DriverNotLoaded => BackendError::DriverNotLoaded,
        other => nvml_error("init")(other),
    }
}

fn nvml_error(call: &'static str) -> impl Fn(NvmlError) -> BackendError {
    move |e| BackendError::Nvml {
        call,
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default path names the real library: on a machine without the
    /// NVIDIA driver this is the agent's start-up path.
    #[test]
    fn missing_library_is_library_missing() {
        match NvmlBackend::new() {
            Err(e @ BackendError::LibraryMissing { .. }) => {
                let line = e.to_string();
                assert!(!line.contains('\n'), "{line}");
                assert!(line.contains("libnvidia-ml.so.1"), "{line}");
                assert!(line.contains("--gpu-backend sim"), "{line}");
            }
            Ok(_) => eprintln!("skipped: NVML is present on this machine (a GPU host)"),
            Err(BackendError::DriverNotLoaded) => {
                eprintln!("skipped: NVML is present but the driver is not loaded")
            }
            Err(e) => panic!("expected LibraryMissing, got {e}"),
        }
    }

    /// Runs on every machine, GPU or not: a path with no library behind it.
    #[test]
    fn explicit_missing_path_is_library_missing() {
        let err = NvmlBackend::with_library_path(OsStr::new("/nonexistent/libnvidia-ml.so.1"))
            .err()
            .expect("no library there");
        assert!(
            matches!(err, BackendError::LibraryMissing { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn mig_profile_comes_from_the_device_name() {
        assert_eq!(
            mig_profile_from_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb").as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(
            mig_profile_from_name("NVIDIA A100-SXM4-40GB MIG 3g.20gb").as_deref(),
            Some("3g.20gb")
        );
        assert_eq!(mig_profile_from_name("NVIDIA A100-SXM4-40GB"), None);
    }

    #[test]
    fn nvml_bus_ids_map_to_sysfs_addresses() {
        assert_eq!(
            sysfs_pci_address("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            sysfs_pci_address("00000001:C1:00.0").as_deref(),
            Some("0001:c1:00.0")
        );
        assert_eq!(sysfs_pci_address("garbage"), None);
    }

    #[test]
    fn backend_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<NvmlBackend>();
    }
}
