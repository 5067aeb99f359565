//! Fault scripts: TOML files of `[[fault]]` entries, parsed and checked
//! (see the simulated backend's module documentation and
//! `docs/gpu-backends.md`).

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// Longest script the backend accepts; a limit on everything.
const MAX_FAULTS: usize = 10_000;

/// One scheduled fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Time from the backend's start.
    pub after: Duration,
    /// The GPU it hits; `None` for node-wide faults.
    pub gpu: Option<u32>,
    pub action: FaultAction,
    /// An `xid` or `ecc_double_bit` fault that also kills the workloads
    /// running on the GPU, as a real one does (`kills_workloads = true`).
    pub kills_workloads: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Temperature goes linearly from where it is to `to_c` over `over`.
    Temperature { to_c: u32, over: Duration },
    /// Memory in use goes linearly to `to_pct` of the GPU's over `over`.
    Memory { to_pct: f64, over: Duration },
    /// Utilisation goes linearly to `to_pct` over `over`, busy or not.
    Utilization { to_pct: f64, over: Duration },
    /// The driver reports this XID; 79 also takes the GPU off the bus.
    Xid { code: u64 },
    /// One uncorrectable ECC error: event and counter.
    EccDoubleBit,
    /// The whole node stops: every backend call fails.
    NodeStop,
    /// Clean readings resume on the GPU (or everywhere, node included).
    Recover,
}

/// A parsed, validated fault script, ordered by time (ties keep file order).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultScript {
    pub faults: Vec<Fault>,
}

#[derive(Debug, thiserror::Error)]
pub enum FaultScriptError {
    #[error("cannot read fault script {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("fault script {path} is invalid: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
    #[error("fault script {path}, fault {number}: {why}")]
    Invalid {
        path: String,
        /// 1-based position in the file.
        number: usize,
        why: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    #[serde(default)]
    fault: Vec<RawFault>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    after_secs: f64,
    gpu: Option<u32>,
    kind: RawKind,
    to_c: Option<u32>,
    to_pct: Option<f64>,
    over_secs: Option<f64>,
    code: Option<u64>,
    kills_workloads: Option<bool>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Debug)]
#[serde(rename_all = "snake_case")]
enum RawKind {
    Temperature,
    Memory,
    Utilization,
    Xid,
    EccDoubleBit,
    NodeStop,
    Recover,
}

impl RawFault {
    fn validate(self) -> Result<Fault, String> {
        let seconds = |what: &str, s: f64| {
            Duration::try_from_secs_f64(s)
                .map_err(|_| format!("{what} must be a number ≥ 0, got {s}"))
        };
        let after = seconds("after_secs", self.after_secs)?;
        // Each kind takes exactly its own fields: a stray one is a typo.
        let allowed: &[&str] = match self.kind {
            RawKind::Temperature => &["to_c", "over_secs"],
            RawKind::Memory | RawKind::Utilization => &["to_pct", "over_secs"],
            RawKind::Xid => &["code", "kills_workloads"],
            RawKind::EccDoubleBit => &["kills_workloads"],
            RawKind::NodeStop | RawKind::Recover => &[],
        };
        let given = [
            ("to_c", self.to_c.is_some()),
            ("to_pct", self.to_pct.is_some()),
            ("over_secs", self.over_secs.is_some()),
            ("code", self.code.is_some()),
            ("kills_workloads", self.kills_workloads.is_some()),
        ];
        if let Some((field, _)) = given.iter().find(|(f, set)| *set && !allowed.contains(f)) {
            return Err(format!("{field} does not apply to kind {:?}", self.kind));
        }
        match (self.kind, self.gpu) {
            (RawKind::NodeStop, Some(_)) => return Err("node_stop takes no gpu".into()),
            (RawKind::NodeStop | RawKind::Recover, _) => {}
            (kind, None) => return Err(format!("kind {kind:?} needs a gpu")),
            _ => {}
        }
        let over = seconds("over_secs", self.over_secs.unwrap_or(0.0))?;
        let action = match self.kind {
            RawKind::Temperature => FaultAction::Temperature {
                to_c: self.to_c.ok_or("temperature needs to_c")?,
                over,
            },
            RawKind::Memory => {
                let to_pct = self.to_pct.ok_or("memory needs to_pct")?;
                if !(0.0..=100.0).contains(&to_pct) {
                    return Err(format!("to_pct must be within 0..=100, got {to_pct}"));
                }
                FaultAction::Memory { to_pct, over }
            }
            RawKind::Utilization => {
                let to_pct = self.to_pct.ok_or("utilization needs to_pct")?;
                if !(0.0..=100.0).contains(&to_pct) {
                    return Err(format!("to_pct must be within 0..=100, got {to_pct}"));
                }
                FaultAction::Utilization { to_pct, over }
            }
            RawKind::Xid => FaultAction::Xid {
                code: self.code.ok_or("xid needs code")?,
            },
            RawKind::EccDoubleBit => FaultAction::EccDoubleBit,
            RawKind::NodeStop => FaultAction::NodeStop,
            RawKind::Recover => FaultAction::Recover,
        };
        Ok(Fault {
            after,
            gpu: self.gpu,
            action,
            kills_workloads: self.kills_workloads.unwrap_or(false),
        })
    }
}

impl FaultScript {
    pub fn load(path: &Path) -> Result<Self, FaultScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| FaultScriptError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses a script; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, FaultScriptError> {
        let file: ScriptFile = toml::from_str(text).map_err(|source| FaultScriptError::Parse {
            path: origin.to_string(),
            source,
        })?;
        if file.fault.len() > MAX_FAULTS {
            return Err(FaultScriptError::Invalid {
                path: origin.to_string(),
                number: MAX_FAULTS + 1,
                why: format!("more than {MAX_FAULTS} faults"),
            });
        }
        let mut faults = file
            .fault
            .into_iter()
            .enumerate()
            .map(|(i, raw)| {
                raw.validate().map_err(|why| FaultScriptError::Invalid {
                    path: origin.to_string(),
                    number: i + 1,
                    why,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        faults.sort_by_key(|f| f.after);
        Ok(Self { faults })
    }

    /// Checks the GPU indices against a node with `gpu_count` GPUs.
    pub fn check_gpus(&self, gpu_count: u32, origin: &str) -> Result<(), FaultScriptError> {
        match self
            .faults
            .iter()
            .enumerate()
            .find(|(_, f)| f.gpu.is_some_and(|g| g >= gpu_count))
        {
            Some((i, f)) => Err(FaultScriptError::Invalid {
                path: origin.to_string(),
                number: i + 1,
                why: format!(
                    "gpu {} but the node has {gpu_count} GPUs",
                    f.gpu.unwrap_or_default()
                ),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_ordered_by_time() {
        let s = FaultScript::parse(
            "[[fault]]\nafter_secs = 9\ngpu = 0\nkind = \"recover\"\n[[fault]]\nafter_secs = 1\ngpu = 0\nkind = \"ecc_double_bit\"\n",
            "f",
        )
        .unwrap();
        assert_eq!(s.faults[0].action, FaultAction::EccDoubleBit);
        assert_eq!(s.faults[1].after, Duration::from_secs(9));
        assert!(!s.faults[0].kills_workloads);
    }

    #[test]
    fn only_a_gpu_fault_kills_workloads() {
        let s = FaultScript::parse(
            "[[fault]]\nafter_secs = 1\ngpu = 0\nkind = \"xid\"\ncode = 79\nkills_workloads = true\n",
            "f",
        )
        .unwrap();
        assert!(s.faults[0].kills_workloads);
        let e = FaultScript::parse(
            "[[fault]]\nafter_secs = 1\ngpu = 0\nkind = \"temperature\"\nto_c = 90\nkills_workloads = true\n",
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("kills_workloads does not apply"), "{e}");
    }

    #[test]
    fn the_example_script_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dev/faults.toml");
        let script = FaultScript::load(&path).unwrap();
        assert!(!script.faults.is_empty());
        script.check_gpus(8, "dev/faults.toml").unwrap();
    }
}
