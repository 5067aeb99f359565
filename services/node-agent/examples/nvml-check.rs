//! Exercises a GPU backend the way the agent uses it: the inventory as
//! JSON, one sample (or `--samples N`, a second apart), then the event
//! loop for a few seconds, one JSON line per event. `scripts/nvml-check.sh` runs it against NVML on a real GPU;
//! `--backend sim` runs the same path on a fleet-file node (and its fault
//! script), which is how it is checked on machines without a GPU.
//!
//! `--mig-check` then creates one instance of the smallest MIG profile on
//! the first GPU already in MIG mode and destroys it again, printing one
//! `mig_check` line: `pass`, `fail`, or `skip` when no GPU is in MIG mode.
//! It never switches MIG mode: that needs a GPU reset, an operator's act.
//!
//! Exit status: 0 after the event loop (and a MIG check that passed or
//! skipped); 1 when a step failed; 2 with one line on stderr when the
//! backend cannot start (no NVML library, driver not loaded).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::Utc;
use clap::Parser;
use lh_node_agent::gpu::backend::nvml::NvmlBackend;
use lh_node_agent::gpu::backend::sim::fleet::FleetFile;
use lh_node_agent::gpu::backend::sim::SimBackend;
use lh_node_agent::gpu::backend::{GpuBackend, GpuDevice};
use lh_node_agent::gpu::inventory::catalogue_model;

/// The longest one wait blocks, so the loop notices its deadline.
const WAIT_SLICE: Duration = Duration::from_millis(500);
/// Time between two samples, the agent's sampling period.
const SAMPLE_PERIOD: Duration = Duration::from_secs(1);
/// More samples than this are a load test, not a check.
const MAX_SAMPLES: u32 = 60;

#[derive(Parser)]
#[command(
    name = "nvml-check",
    about = "Inventory, one sample and the event loop of a GPU backend"
)]
struct Args {
    /// Which backend: `nvml` (a real NVIDIA host) or `sim`.
    #[arg(long, default_value = "nvml")]
    backend: String,
    /// Seconds to wait for events (XID, double-bit ECC, GPU lost).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Samples to print, a second apart (at most 60).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_SAMPLES as i64))]
    samples: u32,
    /// For `--backend sim`: the fleet file and node to play.
    #[arg(long, default_value = "dev/fleet.toml")]
    fleet_file: PathBuf,
    #[arg(long, default_value = "node-a")]
    node_id: String,
    /// After the event loop, create and destroy one smallest MIG instance
    /// on the first GPU already in MIG mode (skipped when there is none).
    #[arg(long)]
    mig_check: bool,
}

fn main() {
    let args = Args::parse();
    let backend: Box<dyn GpuBackend> = match open(&args) {
        Ok(b) => b,
        Err(line) => {
            eprintln!("{line}");
            std::process::exit(2);
        }
    };
    if let Err(e) = check(
        backend.as_ref(),
        args.samples,
        Duration::from_secs(args.seconds),
    ) {
        eprintln!("{e}");
        std::process::exit(1);
    }
    if args.mig_check {
        let outcome = mig_check(backend.as_ref());
        let (result, detail) = match &outcome {
            MigOutcome::Pass(d) => ("pass", d),
            MigOutcome::Skip(d) => ("skip", d),
            MigOutcome::Fail(d) => ("fail", d),
        };
        println!(
            "{}",
            serde_json::json!({"mig_check": {"result": result, "detail": detail}})
        );
        if matches!(outcome, MigOutcome::Fail(_)) {
            std::process::exit(1);
        }
    }
}

enum MigOutcome {
    Pass(String),
    Skip(String),
    Fail(String),
}

/// Creates one instance of the GPU model's smallest profile at the first
/// start the GPU accepts, checks the inventory lists it, and destroys it.
/// Only on a GPU already in MIG mode: switching the mode is never done here.
fn mig_check(backend: &dyn GpuBackend) -> MigOutcome {
    let inventory = match backend.inventory() {
        Ok(i) => i,
        Err(e) => return MigOutcome::Fail(format!("inventory: {e}")),
    };
    let Some(gpu) = inventory.iter().find(|d| d.mig_enabled) else {
        return MigOutcome::Skip(
            "no GPU is in MIG mode (switching it needs a GPU reset, which this check never does)"
                .into(),
        );
    };
    let model = model_of(gpu);
    let Some(geometry) = lh_placement::mig::geometry(&model) else {
        return MigOutcome::Skip(format!(
            "GPU {} ({model}) is in MIG mode but has no MIG geometry in our catalogue",
            gpu.index
        ));
    };
    let smallest = &geometry.profiles[0];
    let mut refusals = Vec::new();
    for &start in smallest.starts {
        match backend.create_mig_instance(gpu.index, smallest.name, u32::from(start)) {
            Ok(device) => {
                return listed_then_destroyed(
                    backend,
                    gpu.index,
                    &device.uuid,
                    smallest.name,
                    start,
                )
            }
            Err(e) => refusals.push(format!("start {start}: {e}")),
        }
    }
    MigOutcome::Fail(format!(
        "no {} instance could be created on GPU {}: {}",
        smallest.name,
        gpu.index,
        refusals.join("; ")
    ))
}

fn listed_then_destroyed(
    backend: &dyn GpuBackend,
    gpu: u32,
    uuid: &str,
    profile: &str,
    start: u8,
) -> MigOutcome {
    let listed = backend
        .inventory()
        .map(|i| {
            i.iter()
                .filter(|d| d.index == gpu)
                .flat_map(|d| &d.mig_devices)
                .any(|m| m.uuid == uuid)
        })
        .unwrap_or(false);
    let destroyed = backend.destroy_mig_instance(gpu, uuid);
    let gone = backend
        .inventory()
        .map(|i| {
            !i.iter()
                .flat_map(|d| &d.mig_devices)
                .any(|m| m.uuid == uuid)
        })
        .unwrap_or(false);
    match (listed, destroyed, gone) {
        (true, Ok(()), true) => MigOutcome::Pass(format!(
            "GPU {gpu}: created {profile} at start {start} ({uuid}), listed, destroyed"
        )),
        (listed, destroyed, gone) => MigOutcome::Fail(format!(
            "GPU {gpu}: created {profile} at start {start} ({uuid}); listed in the inventory: {listed}; destroy: {}; gone afterwards: {gone}",
            destroyed.map_or_else(|e| e.to_string(), |()| "ok".into())
        )),
    }
}

/// The catalogue's name for the GPU: NVML gives the driver's marketing name,
/// the simulated backend the catalogue's already.
fn model_of(gpu: &GpuDevice) -> String {
    if lh_placement::mig::geometry(&gpu.model).is_some() {
        gpu.model.clone()
    } else {
        catalogue_model(&gpu.model, gpu.vram_mib)
    }
}

fn open(args: &Args) -> Result<Box<dyn GpuBackend>, String> {
    match args.backend.as_str() {
        "nvml" => {
            let b = NvmlBackend::new().map_err(|e| e.to_string())?;
            let driver = b.driver_version().unwrap_or_else(|e| e.to_string());
            println!(
                "{}",
                serde_json::json!({"backend": "nvml", "driver_version": driver, "event_set": b.has_event_set()})
            );
            Ok(Box::new(b))
        }
        "sim" => {
            let fleet = FleetFile::load(&args.fleet_file).map_err(|e| e.to_string())?;
            let node = fleet
                .node(&args.node_id, &args.fleet_file)
                .map_err(|e| e.to_string())?;
            let b = SimBackend::for_node(node, &args.fleet_file).map_err(|e| e.to_string())?;
            println!(
                "{}",
                serde_json::json!({"backend": "sim", "node_id": node.id})
            );
            Ok(Box::new(b))
        }
        other => Err(format!("unknown backend {other:?}: use nvml or sim")),
    }
}

fn check(backend: &dyn GpuBackend, samples: u32, listen: Duration) -> Result<(), String> {
    let inventory = backend.inventory().map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({ "inventory": inventory }))
            .map_err(|e| e.to_string())?
    );
    for n in 0..samples {
        if n > 0 {
            std::thread::sleep(SAMPLE_PERIOD);
        }
        let sample = backend.sample(Utc::now()).map_err(|e| e.to_string())?;
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "sample": sample }))
                .map_err(|e| e.to_string())?
        );
    }
    eprintln!("waiting {} s for events…", listen.as_secs());
    let deadline = Instant::now() + listen;
    let mut count = 0;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        if left.is_zero() {
            break;
        }
        for event in backend
            .wait_events(left.min(WAIT_SLICE))
            .map_err(|e| e.to_string())?
        {
            count += 1;
            println!("{}", serde_json::json!({ "event": event }));
        }
    }
    println!(
        "{}",
        serde_json::json!({"done": {"events": count, "seconds": listen.as_secs()}})
    );
    Ok(())
}
