//! Exercises a GPU backend the way the agent uses it: the inventory as
//! JSON, one sample, then the event loop for a few seconds, one JSON line
//! per event. `scripts/nvml-check.sh` runs it against NVML on a real GPU;
//! `--backend sim` runs the same path on a fleet-file node (and its fault
//! script), which is how it is checked on machines without a GPU.
//!
//! Exit status: 0 after the event loop; 2 with one line on stderr when the
//! backend cannot start (no NVML library, driver not loaded).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::Utc;
use clap::Parser;
use lh_node_agent::gpu::backend::nvml::NvmlBackend;
use lh_node_agent::gpu::backend::sim::fleet::FleetFile;
use lh_node_agent::gpu::backend::sim::SimBackend;
use lh_node_agent::gpu::backend::GpuBackend;

/// The longest one wait blocks, so the loop notices its deadline.
const WAIT_SLICE: Duration = Duration::from_millis(500);

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
    /// For `--backend sim`: the fleet file and node to play.
    #[arg(long, default_value = "dev/fleet.toml")]
    fleet_file: PathBuf,
    #[arg(long, default_value = "node-a")]
    node_id: String,
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
    if let Err(e) = check(backend.as_ref(), Duration::from_secs(args.seconds)) {
        eprintln!("{e}");
        std::process::exit(1);
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

fn check(backend: &dyn GpuBackend, listen: Duration) -> Result<(), String> {
    let inventory = backend.inventory().map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({ "inventory": inventory }))
            .map_err(|e| e.to_string())?
    );
    let sample = backend.sample(Utc::now()).map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({ "sample": sample }))
            .map_err(|e| e.to_string())?
    );
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
