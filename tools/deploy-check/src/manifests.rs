//! Reading the deployment files: YAML documents with merge keys applied,
//! the Kubernetes manifests of `k8s/` and `k8s/simulated/` in a stable
//! order, and a path lookup into a document. Every reader panics with the
//! file it could not read, since a check on a half-read file proves nothing.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml_ng::Value;

use crate::workspace::workspace_root;

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

/// Every YAML document of a file, with `<<` merge keys applied.
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = read(path);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| {
            let mut value = Value::deserialize(document)
                .unwrap_or_else(|err| panic!("{} is not valid YAML: {err}", path.display()));
            value
                .apply_merge()
                .unwrap_or_else(|err| panic!("{}: bad merge key: {err}", path.display()));
            value
        })
        .filter(|value| !value.is_null())
        .collect()
}

/// The directories of Kubernetes manifests: the deployment (GPU nodes) and
/// the simulated fleet for a cluster without GPUs, applied after it.
const K8S_DIRS: &[&str] = &["k8s", "k8s/simulated"];

pub(crate) fn yaml_files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("reading {}: {err}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    files
}

pub fn k8s_manifests() -> Vec<PathBuf> {
    K8S_DIRS
        .iter()
        .flat_map(|dir| yaml_files_in(&workspace_root().join(dir)))
        .collect()
}

/// Every document of every manifest, with the file it is in.
pub fn k8s_documents() -> Vec<(PathBuf, Value)> {
    k8s_manifests()
        .into_iter()
        .flat_map(|file| {
            yaml_documents(&file)
                .into_iter()
                .map(move |doc| (file.clone(), doc))
        })
        .collect()
}

pub fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(value, |value, key| value.get(*key))
        .and_then(Value::as_str)
}
