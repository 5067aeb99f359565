//! Self-tests of free GPUs on a schedule: every `every`, a GPU that no
//! lease holds is watched for `duration`; it passes when it answered every
//! sample and each one was clean (under the temperature and memory
//! thresholds). A lease placed on the GPU meanwhile aborts the test: the
//! lease comes first, the test is due again a period later.
//!
//! With a load command (`--self-test-command`, e.g. `dcgmi diag -r 3` or
//! `gpu_burn 600` on a real host) the test is also that command, run on the
//! GPU by the agent: it ends when the command exits, and passes only when
//! it exited 0 and every sample was clean; a command still running a grace
//! after the duration fails the test and is killed. Without one (the
//! simulated backend) the watch alone is the test: the script decides how
//! the GPU reads.
//!
//! Pure: samples, the free GPUs, command exits and `now` in; tests started,
//! aborted and finished out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::backend::GpuSample;
use super::health::HealthRules;
use super::usage::NodeGpu;

#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub gpu_index: u32,
    pub passed: bool,
    pub duration: Duration,
    pub detail: String,
    pub at: DateTime<Utc>,
}

/// What one round of samples did to the tests.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A test began on this GPU: start its load command, if there is one.
    Started(u32),
    /// A lease took the GPU: stop its load command.
    Aborted(u32),
    Finished(Finished),
}

/// A load command gets this long past the test's duration to exit.
pub const COMMAND_GRACE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Running {
    started: DateTime<Utc>,
    samples: u32,
    /// The first thing that failed it.
    failure: Option<String>,
}

#[derive(Debug, Clone)]
pub struct SelfTests {
    every: Duration,
    duration: Duration,
    rules: HealthRules,
    next_due: BTreeMap<u32, DateTime<Utc>>,
    running: BTreeMap<u32, Running>,
    /// Tests end when their load command exits, not at the duration.
    with_command: bool,
}

impl SelfTests {
    /// Tests of `gpus`, the first one `every` after `now` (a fresh agent
    /// does not test at once: the GPUs have just been seen).
    pub fn new(
        gpus: impl IntoIterator<Item = u32>,
        every: Duration,
        duration: Duration,
        rules: HealthRules,
        now: DateTime<Utc>,
    ) -> Self {
        let first = now + chrono::Duration::from_std(every).unwrap_or(chrono::Duration::MAX);
        Self {
            every,
            duration,
            rules,
            next_due: gpus.into_iter().map(|g| (g, first)).collect(),
            running: BTreeMap::new(),
            with_command: false,
        }
    }

    /// Tests that end with a load command's exit ([`SelfTests::command_exited`]).
    pub fn with_command(mut self) -> Self {
        self.with_command = true;
        self
    }

    /// The load command of `gpu`'s test exited (`ok`: status 0).
    pub fn command_exited(
        &mut self,
        gpu: u32,
        ok: bool,
        detail: String,
        now: DateTime<Utc>,
    ) -> Option<Finished> {
        let mut test = self.running.remove(&gpu)?;
        if !ok {
            test.failure.get_or_insert(detail);
        }
        Some(self.finish(gpu, test, now))
    }

    fn finish(&mut self, gpu: u32, test: Running, now: DateTime<Utc>) -> Finished {
        let ran = (now - test.started).to_std().unwrap_or_default();
        let passed = test.failure.is_none();
        let detail = test.failure.unwrap_or_else(|| {
            format!(
                "{} clean samples in {:.0} s",
                test.samples,
                ran.as_secs_f64()
            )
        });
        let due = self.due_after(now);
        self.next_due.insert(gpu, due);
        Finished {
            gpu_index: gpu,
            passed,
            duration: ran,
            detail,
            at: now,
        }
    }

    /// GPUs under test now.
    pub fn running(&self) -> impl Iterator<Item = u32> + '_ {
        self.running.keys().copied()
    }

    fn due_after(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now + chrono::Duration::from_std(self.every).unwrap_or(chrono::Duration::MAX)
    }

    /// One round of samples at `now`; `free` are the GPUs no lease holds.
    pub fn observe(
        &mut self,
        samples: &[GpuSample],
        free: &BTreeSet<u32>,
        now: DateTime<Utc>,
    ) -> Vec<Step> {
        let mut steps = Vec::new();
        let gpus: Vec<u32> = self.next_due.keys().copied().collect();
        for gpu in gpus {
            let sample = samples.iter().find(|s| s.index == gpu);
            if let Some(test) = self.running.get_mut(&gpu) {
                if !free.contains(&gpu) {
                    tracing::info!(gpu, "self-test aborted: a lease took the GPU");
                    self.running.remove(&gpu);
                    let due = self.due_after(now);
                    self.next_due.insert(gpu, due);
                    steps.push(Step::Aborted(gpu));
                    continue;
                }
                match sample {
                    None => {
                        test.failure
                            .get_or_insert_with(|| "the GPU did not answer a sample".into());
                    }
                    Some(s) => {
                        test.samples += 1;
                        if let Some(why) = unclean(s, &self.rules) {
                            test.failure.get_or_insert(why);
                        }
                    }
                }
                let ran = (now - test.started).to_std().unwrap_or_default();
                let over = match self.with_command {
                    false => ran >= self.duration,
                    true => ran >= self.duration + COMMAND_GRACE,
                };
                if over {
                    let mut test = self.running.remove(&gpu).expect("running test");
                    if self.with_command {
                        test.failure.get_or_insert_with(|| {
                            format!(
                                "the load command did not finish in {:.0} s",
                                ran.as_secs_f64()
                            )
                        });
                    }
                    steps.push(Step::Finished(self.finish(gpu, test, now)));
                }
            } else if free.contains(&gpu) && self.next_due[&gpu] <= now {
                tracing::info!(gpu, "self-test started");
                let failure = match sample {
                    None => Some("the GPU did not answer a sample".to_string()),
                    Some(s) => unclean(s, &self.rules),
                };
                self.running.insert(
                    gpu,
                    Running {
                        started: now,
                        samples: u32::from(sample.is_some()),
                        failure,
                    },
                );
                steps.push(Step::Started(gpu));
            }
        }
        steps
    }
}

fn unclean(s: &GpuSample, rules: &HealthRules) -> Option<String> {
    if s.temperature_c >= rules.degraded_temperature_c {
        return Some(format!(
            "temperature {} °C ≥ {} °C",
            s.temperature_c, rules.degraded_temperature_c
        ));
    }
    let used = s.memory_used_pct();
    if used >= rules.degraded_memory_pct {
        return Some(format!(
            "memory {used:.1} % used ≥ {} %",
            rules.degraded_memory_pct
        ));
    }
    None
}

/// Starts a self-test's load command on one GPU, in its own process group
/// so that whatever it starts dies with it.
pub(crate) fn spawn_load(
    command: &str,
    gpu: &NodeGpu,
    secs: u64,
) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt as _;
    use std::process::Stdio;
    std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("CUDA_VISIBLE_DEVICES", &gpu.uuid)
        .env("NVIDIA_VISIBLE_DEVICES", &gpu.uuid)
        .env("LH_GPU_INDEX", gpu.index.to_string())
        .env("LH_SELF_TEST_SECS", secs.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
}

pub(crate) fn kill_load(child: &mut std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) with a negative pid signals that process group; the
        // group is the child's own (process_group(0)), so nothing else is hit.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `s` seconds after the tests' epoch.
    pub(super) fn t(s: i64) -> DateTime<Utc> {
        "2026-12-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + chrono::Duration::seconds(s)
    }

    fn sample(index: u32, temperature_c: u32) -> GpuSample {
        GpuSample {
            index,
            utilization_pct: Some(0),
            memory_used_mib: 0,
            memory_total_mib: 1024,
            temperature_c,
            power_w: 0.0,
            ecc_double_bit_total: Some(0),
            processes: Vec::new(),
        }
    }

    fn tests() -> SelfTests {
        SelfTests::new(
            0..2,
            Duration::from_secs(100),
            Duration::from_secs(10),
            HealthRules::default(),
            t(0),
        )
    }

    fn free(gpus: &[u32]) -> BTreeSet<u32> {
        gpus.iter().copied().collect()
    }

    fn finished(steps: Vec<Step>) -> Vec<Finished> {
        steps
            .into_iter()
            .filter_map(|s| match s {
                Step::Finished(f) => Some(f),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn free_gpus_are_tested_every_period_and_pass_when_clean() {
        let mut st = tests();
        let both = [sample(0, 40), sample(1, 40)];
        assert!(st.observe(&both, &free(&[0, 1]), t(99)).is_empty());
        assert_eq!(
            st.observe(&both, &free(&[0, 1]), t(100)),
            vec![Step::Started(0), Step::Started(1)]
        );
        assert_eq!(st.running().collect::<Vec<_>>(), vec![0, 1]);
        assert!(st.observe(&both, &free(&[0, 1]), t(105)).is_empty());
        let done = finished(st.observe(&both, &free(&[0, 1]), t(110)));
        assert_eq!(done.len(), 2);
        assert!(done
            .iter()
            .all(|f| f.passed && f.duration == Duration::from_secs(10)));
        assert_eq!(done[0].detail, "3 clean samples in 10 s");
        // Next one a period after the end.
        assert!(st.observe(&both, &free(&[0, 1]), t(209)).is_empty());
        assert_eq!(st.running().count(), 0);
        st.observe(&both, &free(&[0, 1]), t(210));
        assert_eq!(st.running().count(), 2);
    }

    #[test]
    fn a_hot_or_silent_gpu_fails_and_a_held_one_is_not_tested() {
        let mut st = tests();
        st.observe(&[sample(0, 40)], &free(&[0]), t(100));
        assert_eq!(st.running().collect::<Vec<_>>(), vec![0]);
        st.observe(&[sample(0, 90)], &free(&[0]), t(105));
        let done = finished(st.observe(&[], &free(&[0]), t(110)));
        assert_eq!(done.len(), 1);
        assert!(!done[0].passed);
        assert_eq!(done[0].detail, "temperature 90 °C ≥ 85 °C");
    }

    #[test]
    fn a_lease_aborts_the_test() {
        let mut st = tests();
        st.observe(&[sample(0, 40)], &free(&[0]), t(100));
        assert_eq!(
            st.observe(&[sample(0, 40)], &free(&[]), t(101)),
            vec![Step::Aborted(0)]
        );
        assert_eq!(st.running().count(), 0);
        assert!(st.observe(&[sample(0, 40)], &free(&[0]), t(200)).is_empty());
        assert_eq!(st.running().count(), 0);
        st.observe(&[sample(0, 40)], &free(&[0]), t(201));
        assert_eq!(st.running().count(), 1);
    }
}

#[cfg(test)]
mod command_tests {
    use super::tests::t;
    use super::*;

    fn cool() -> GpuSample {
        GpuSample {
            index: 0,
            utilization_pct: Some(100),
            memory_used_mib: 10,
            memory_total_mib: 1024,
            temperature_c: 60,
            power_w: 300.0,
            ecc_double_bit_total: Some(0),
            processes: Vec::new(),
        }
    }

    fn tests() -> SelfTests {
        SelfTests::new(
            [0],
            Duration::from_secs(100),
            Duration::from_secs(10),
            HealthRules::default(),
            t(0),
        )
        .with_command()
    }

    #[test]
    fn a_command_test_ends_with_the_command_and_needs_exit_zero() {
        let free = BTreeSet::from([0]);
        let mut st = tests();
        assert_eq!(st.observe(&[cool()], &free, t(100)), vec![Step::Started(0)]);
        // Past the duration it still waits for the command.
        assert!(st.observe(&[cool()], &free, t(111)).is_empty());
        let f = st.command_exited(0, true, String::new(), t(112)).unwrap();
        assert!(f.passed, "{f:?}");
        assert_eq!(f.duration, Duration::from_secs(12));
        st.observe(&[cool()], &free, t(212));
        let f = st
            .command_exited(0, false, "exit code 3".into(), t(215))
            .unwrap();
        assert!(!f.passed);
        assert_eq!(f.detail, "exit code 3");
        assert_eq!(st.command_exited(0, true, String::new(), t(216)), None);
    }

    #[test]
    fn a_command_that_hangs_fails_after_the_grace() {
        let free = BTreeSet::from([0]);
        let mut st = tests();
        st.observe(&[cool()], &free, t(100));
        assert!(st.observe(&[cool()], &free, t(169)).is_empty());
        match &st.observe(&[cool()], &free, t(170))[..] {
            [Step::Finished(f)] => {
                assert!(!f.passed);
                assert_eq!(f.detail, "the load command did not finish in 70 s");
            }
            other => panic!("{other:?}"),
        }
    }
}
