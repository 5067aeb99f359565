//! Validating manifests against schemas with the outside validators:
//! built-in kinds against the Kubernetes API (`kubernetes-validate`), custom
//! resources against the vendored CRDs made strict JSON Schemas
//! (`scripts/crd-to-jsonschema.py`, then `check-jsonschema`). Documents are
//! written out as JSON, one a file, so the validator reads exactly what the
//! checks parsed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml_ng::Value;

use crate::command::{run, tool};
use crate::k8s::api_group;
use crate::manifests::{str_at, yaml_files_in};
use crate::workspace::workspace_root;

/// Kubernetes minor versions the manifests must be valid for: the oldest we
/// support and the newest the validator knows.
pub const KUBERNETES_VERSIONS: &[&str] = &["1.30", "1.37"];

/// Built-in kinds are in the core group or a group of Kubernetes' own
/// (`apps`, `batch`, `policy`, `*.k8s.io`); anything else is a custom
/// resource, which needs a vendored CRD.
pub fn is_built_in(doc: &Value) -> bool {
    let group = api_group(doc);
    !group.contains('.') || group.ends_with(".k8s.io")
}

/// The strict JSON Schemas of the vendored CRDs, written by
/// `scripts/crd-to-jsonschema.py` into `dir`: one per kind and version,
/// named `<kind>-<group>-<version>.json`.
pub fn crd_json_schemas(dir: &Path) -> BTreeMap<String, PathBuf> {
    let root = workspace_root();
    let crds = yaml_files_in(&root.join("deploy/schemas/crds"));
    let run = run(Command::new(tool("python"))
        .arg(root.join("scripts/crd-to-jsonschema.py"))
        .arg(dir)
        .args(&crds));
    assert!(run.success, "crd-to-jsonschema.py failed:\n{}", run.output);
    let schemas: BTreeMap<String, PathBuf> = run
        .output
        .lines()
        .map(PathBuf::from)
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            (name, path)
        })
        .collect();
    assert!(
        schemas.len() >= crds.len(),
        "fewer schemas than CRDs: {schemas:?}"
    );
    schemas
}

/// The schema name a custom resource is checked against.
fn custom_resource_schema_name(doc: &Value) -> String {
    let api_version = str_at(doc, &["apiVersion"]).unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = str_at(doc, &["kind"]).unwrap_or_default();
    format!("{}-{group}-{version}", kind.to_lowercase())
}

/// Checks each custom resource against its CRD's schema; the failures, one
/// entry per schema run that failed or kind without a schema.
pub fn check_custom_resources(
    schemas: &BTreeMap<String, PathBuf>,
    resources: &[(String, Value)],
    dir: &Path,
) -> Vec<String> {
    let checker = tool("check-jsonschema");
    let mut by_schema: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut failures = Vec::new();
    for (index, (origin, doc)) in resources.iter().enumerate() {
        let schema = custom_resource_schema_name(doc);
        if !schemas.contains_key(&schema) {
            failures.push(format!(
                "{origin}: no vendored CRD in deploy/schemas/crds/ for {schema}"
            ));
            continue;
        }
        // JSON, one document a file: what check-jsonschema reads is exactly
        // what this test parsed.
        let file = dir.join(format!(
            "{index:03}-{}.json",
            origin.replace(['/', ' '], "_")
        ));
        std::fs::write(&file, serde_json::to_string_pretty(doc).unwrap()).unwrap();
        by_schema.entry(schema).or_default().push(file);
    }
    for (schema, files) in by_schema {
        let run = run(Command::new(&checker)
            .args(["--color", "never", "--schemafile"])
            .arg(&schemas[&schema])
            .args(&files));
        if !run.success {
            failures.push(format!("{schema}:\n{}", run.output));
        }
    }
    failures
}
