//! What the workspace builds: the binary targets of its members, and the
//! six services among them, so that every image a deployment runs can be
//! traced to a Cargo target and every service to a deployment.

use std::collections::BTreeSet;
use std::process::Command;

use crate::command::run;
use crate::workspace::workspace_root;

/// The binaries of the six services, the ones every deployment must run.
pub const SERVICE_BINARIES: &[&str] = &[
    "lh-gateway",
    "lh-scheduler",
    "lh-node-agent",
    "lh-pricing",
    "lh-spot-broker",
    "lh-audit",
];

/// Names of the binary targets of every workspace member, from `cargo metadata`.
pub fn workspace_binaries() -> BTreeSet<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let run = run(Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--manifest-path",
        ])
        .arg(workspace_root().join("Cargo.toml")));
    assert!(run.success, "cargo metadata failed:\n{}", run.output);
    let json_start = run.output.find('{').expect("cargo metadata printed JSON");
    let metadata: serde_json::Value = serde_json::Deserializer::from_str(&run.output[json_start..])
        .into_iter()
        .next()
        .expect("one JSON document")
        .expect("cargo metadata JSON");
    metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .flat_map(|package| package["targets"].as_array().cloned().unwrap_or_default())
        .filter(|target| {
            target["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|kind| kind == "bin"))
        })
        .map(|target| target["name"].as_str().unwrap().to_string())
        .collect()
}
