//! The agent's GPU flags: which backend it reads and the thresholds and
//! schedules of health, usage, idle leases and self-tests.

use std::time::Duration;

use lh_events::IdleAction;

use super::health::HealthRules;
pub use crate::state::{DEFAULT_GPU_FAULT_HOLD_SECS, DEFAULT_GPU_FAULT_MOVE_WAIT_SECS};
/// Most either of those may be: a held lease keeps its GPUs from others.
pub const MAX_GPU_FAULT_WAIT_SECS: u64 = 3_600;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The GPUs of the fleet file's node, with its fault script.
    Sim,
    /// The host's NVIDIA GPUs through NVML.
    Nvml,
}

#[derive(clap::Args, Debug, Clone)]
pub struct GpuArgs {
    /// Where the GPUs are read from.
    #[arg(long, env = "LH_GPU_BACKEND", value_enum, default_value_t = BackendKind::Sim)]
    pub gpu_backend: BackendKind,
    /// With `--gpu-backend nvml`: play the fleet file's node instead when
    /// the NVIDIA library or driver is missing (otherwise the agent exits).
    #[arg(long, env = "LH_SIM_FALLBACK")]
    pub sim_fallback: bool,
    /// This host's zone (NVML backend; a simulated node's is in the fleet file).
    #[arg(long, env = "LH_ZONE")]
    pub zone: Option<String>,
    /// This host's name as registered (NVML backend; default: the OS's).
    #[arg(long, env = "LH_HOSTNAME")]
    pub hostname: Option<String>,
    /// The interconnect this node's GPUs share with other nodes' (an
    /// NVLink switch domain, an InfiniBand fabric), as the operator labels
    /// it: a lease across nodes prefers members of one. 1 to 63 of ASCII
    /// letters, digits, `.`, `_`, `-`.
    #[arg(long, env = "LH_NODE_FABRIC", value_parser = parse_fabric)]
    pub fabric: Option<String>,
    /// How often the GPUs are sampled, for health and usage.
    #[arg(long, env = "LH_SAMPLE_MS", default_value_t = 1_000)]
    pub sample_ms: u64,
    /// How often each lease's usage goes to the telemetry stream.
    #[arg(long, env = "LH_USAGE_INTERVAL_SECS", default_value_t = 5)]
    pub usage_interval_secs: u64,
    /// At or above this temperature (°C) for the window, a GPU is degraded.
    #[arg(long, env = "LH_DEGRADED_TEMPERATURE_C", default_value_t = 85)]
    pub degraded_temperature_c: u32,
    /// At or above this share of VRAM in use for the window, degraded.
    #[arg(long, env = "LH_DEGRADED_MEMORY_PCT", default_value_t = 95.0)]
    pub degraded_memory_pct: f64,
    /// How long hot or full must last to degrade a GPU.
    #[arg(long, env = "LH_DEGRADED_WINDOW_SECS", default_value_t = 30)]
    pub degraded_window_secs: u64,
    /// Clean samples in a row that bring a GPU back to healthy.
    #[arg(long, env = "LH_RECOVER_AFTER_CLEAN_SAMPLES", default_value_t = 30)]
    pub recover_after_clean_samples: u32,
    /// Zero utilisation this long makes a lease idle, for tenants without
    /// an idle policy of their own.
    #[arg(long, env = "LH_IDLE_WINDOW_SECS", default_value_t = 300)]
    pub idle_window_secs: u64,
    /// What happens to an idle lease of such a tenant: notify, stop or
    /// suspend.
    #[arg(long, env = "LH_IDLE_ACTION", default_value = "notify", value_parser = parse_idle_action)]
    pub idle_action: IdleAction,
    /// The MIG instances on GPUs in MIG mode are read this often (at most
    /// 600; 0: never, and what the log last declared stands), to tell the
    /// scheduler of those no lease holds; a change is told once two reads
    /// in a row agree.
    #[arg(long, env = "LH_MIG_READ_EVERY_SECS", default_value_t = 10)]
    pub mig_read_every_secs: u64,
    /// A free GPU is self-tested this often (0: never).
    #[arg(long, env = "LH_SELF_TEST_EVERY_SECS", default_value_t = 7_200)]
    pub self_test_every_secs: u64,
    /// How long one self-test lasts.
    #[arg(long, env = "LH_SELF_TEST_SECS", default_value_t = 600)]
    pub self_test_secs: u64,
    /// A load test run on the GPU under test (`sh -c`, with
    /// CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES set to its UUID,
    /// LH_GPU_INDEX and LH_SELF_TEST_SECS), e.g. `dcgmi diag -r 3 -i
    /// $LH_GPU_INDEX`; the test passes only when it exits 0. Without one a
    /// self-test watches the idle GPU for the duration.
    #[arg(long, env = "LH_SELF_TEST_COMMAND")]
    pub self_test_command: Option<String>,
    /// A workload that exits non-zero while a GPU of its lease is unhealthy,
    /// or with one turning unhealthy within these seconds of its exit, died
    /// of the GPU's fault: its lease is held for the scheduler to move, not
    /// failed.
    #[arg(long, env = "LH_GPU_FAULT_HOLD_SECS", default_value_t = DEFAULT_GPU_FAULT_HOLD_SECS)]
    pub gpu_fault_hold_secs: u64,
    /// How long such a lease waits for the scheduler's move before it ends
    /// `failed` after all.
    #[arg(long, env = "LH_GPU_FAULT_MOVE_WAIT_SECS", default_value_t = DEFAULT_GPU_FAULT_MOVE_WAIT_SECS)]
    pub gpu_fault_move_wait_secs: u64,
}

fn parse_fabric(text: &str) -> Result<String, String> {
    if lh_events::fabric_label_is_valid(text) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "a fabric label is 1 to {} of ASCII letters, digits, '.', '_' and '-'",
            lh_events::MAX_FABRIC_LABEL_BYTES
        ))
    }
}

fn parse_idle_action(text: &str) -> Result<IdleAction, String> {
    match text {
        "notify" => Ok(IdleAction::Notify),
        "stop" => Ok(IdleAction::Stop),
        "suspend" => Ok(IdleAction::Suspend),
        other => Err(format!(
            "idle action must be notify, stop or suspend, not {other:?}"
        )),
    }
}

impl GpuArgs {
    pub fn for_test() -> Self {
        Self {
            gpu_backend: BackendKind::Sim,
            sim_fallback: false,
            zone: None,
            hostname: None,
            fabric: None,
            sample_ms: 200,
            usage_interval_secs: 1,
            degraded_temperature_c: 85,
            degraded_memory_pct: 95.0,
            degraded_window_secs: 30,
            recover_after_clean_samples: 30,
            mig_read_every_secs: 1,
            idle_window_secs: 300,
            idle_action: IdleAction::Notify,
            self_test_every_secs: 0,
            self_test_secs: 600,
            self_test_command: None,
            // Sampled every 200 ms here: the fault is heard well within it.
            gpu_fault_hold_secs: 2,
            gpu_fault_move_wait_secs: 30,
        }
    }

    pub fn rules(&self) -> HealthRules {
        HealthRules {
            degraded_temperature_c: self.degraded_temperature_c,
            degraded_memory_pct: self.degraded_memory_pct,
            degraded_window: Duration::from_secs(self.degraded_window_secs),
            recover_after_clean_samples: self.recover_after_clean_samples,
            ..HealthRules::default()
        }
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.rules().validate().map_err(anyhow::Error::msg)?;
        if self.sample_ms == 0 {
            anyhow::bail!("--sample-ms must be at least 1");
        }
        if self.idle_window_secs == 0 {
            anyhow::bail!("--idle-window-secs must be at least 1");
        }
        if self.self_test_every_secs > 0 && self.self_test_secs == 0 {
            anyhow::bail!("--self-test-secs must be at least 1");
        }
        const YEAR: u64 = 366 * 24 * 3600;
        if self.self_test_every_secs > YEAR || self.self_test_secs > YEAR {
            anyhow::bail!("--self-test-every-secs and --self-test-secs must be at most a year");
        }
        if self.idle_window_secs > YEAR {
            anyhow::bail!("--idle-window-secs must be at most a year");
        }
        if self.gpu_fault_hold_secs > MAX_GPU_FAULT_WAIT_SECS
            || self.gpu_fault_move_wait_secs > MAX_GPU_FAULT_WAIT_SECS
        {
            anyhow::bail!(
                "--gpu-fault-hold-secs and --gpu-fault-move-wait-secs must be at most {MAX_GPU_FAULT_WAIT_SECS}"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_actions_parse() {
        assert_eq!(parse_idle_action("stop"), Ok(IdleAction::Stop));
        assert_eq!(parse_idle_action("suspend"), Ok(IdleAction::Suspend));
        assert!(parse_idle_action("hibernate").is_err());
    }

    #[test]
    fn the_waits_for_a_gpu_fault_are_bounded() {
        let mut args = GpuArgs::for_test();
        args.validate().unwrap();
        args.gpu_fault_move_wait_secs = MAX_GPU_FAULT_WAIT_SECS + 1;
        let e = args.validate().unwrap_err().to_string();
        assert!(e.contains("--gpu-fault-move-wait-secs"), "{e}");
        args.gpu_fault_move_wait_secs = MAX_GPU_FAULT_WAIT_SECS;
        args.gpu_fault_hold_secs = MAX_GPU_FAULT_WAIT_SECS + 1;
        assert!(args.validate().is_err());
    }
}
