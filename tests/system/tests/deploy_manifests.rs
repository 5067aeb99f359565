//! The deployment files stay deployable:
//!
//! - `docker-compose.yml` validates against the official Compose
//!   Specification schema (vendored in `deploy/schemas/compose-spec.json`),
//!   checked by `check-jsonschema`;
//! - every manifest in `k8s/` and `k8s/simulated/` validates, strictly (no
//!   unknown fields): built-in kinds against the Kubernetes API schemas,
//!   checked by `kubernetes-validate`, custom resources (CloudNativePG,
//!   Prometheus Operator) against the CRDs vendored in
//!   `deploy/schemas/crds/`, made strict JSON Schemas by
//!   `scripts/crd-to-jsonschema.py` and checked by `check-jsonschema`;
//! - the PrometheusRule carries exactly the rules of
//!   `deploy/prometheus/rules/`, and a monitor scrapes every service's
//!   `/metrics` port under the job name the rules and dashboards use;
//! - the NetworkPolicies allow every flow the manifests need (derived from
//!   them: NATS and database URLs, metrics ports, NATS routes, the
//!   CloudNativePG operator) and no rule that no such flow uses;
//! - the node-agent runs as a DaemonSet on GPU nodes with what NVML, MIG and
//!   MPS need, and keeps its state on the host;
//! - NATS and PostgreSQL are production-shaped: three members or instances
//!   on different hosts, persistent volumes, disruption budgets, and each
//!   service a role of its own;
//! - every image in either file runs a binary that the workspace builds, and
//!   every service binary is deployed by both;
//! - the simulated fleet and the NATS settings the files carry agree with
//!   `dev/`;
//! - NATS is a three-node JetStream cluster in both, and every service is
//!   given every member's URL and three stream replicas.
//! - compose's Prometheus scrapes every service on the port it serves
//!   `/metrics` on, by its compose name, and Grafana is provisioned with
//!   that Prometheus and the dashboards of `deploy/grafana/dashboards/`;
//!   nothing is published beyond 127.0.0.1.
//!
//! The validators come from `make deps` (`.data/venv`). A missing validator
//! fails the test, it never skips it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use lh_testkit::workspace_root;
use serde::Deserialize;
use serde_yaml_ng::Value;

/// Kubernetes minor versions the manifests must be valid for: the oldest we
/// support and the newest the validator knows.
const KUBERNETES_VERSIONS: &[&str] = &["1.30", "1.37"];

/// The binaries of the six services, the ones every deployment must run.
const SERVICE_BINARIES: &[&str] = &[
    "lh-gateway",
    "lh-scheduler",
    "lh-node-agent",
    "lh-pricing",
    "lh-spot-broker",
    "lh-audit",
];

/// A validator from `.data/venv/bin`, else from `PATH`; panics with the fix
/// when neither has it.
fn tool(name: &str) -> PathBuf {
    let venv = workspace_root().join(".data/venv/bin").join(name);
    if venv.is_file() {
        return venv;
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(found) = std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
        {
            return found;
        }
    }
    panic!(
        "{name} is not installed (looked in {} and on PATH): run `make deps`",
        venv.display()
    );
}

struct Run {
    success: bool,
    output: String,
}

fn run(command: &mut Command) -> Run {
    let output = command
        .output()
        .unwrap_or_else(|err| panic!("running {command:?}: {err}"));
    Run {
        success: output.status.success(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

/// Every YAML document of a file, with `<<` merge keys applied.
fn yaml_documents(path: &Path) -> Vec<Value> {
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

fn yaml_files_in(dir: &Path) -> Vec<PathBuf> {
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

fn k8s_manifests() -> Vec<PathBuf> {
    K8S_DIRS
        .iter()
        .flat_map(|dir| yaml_files_in(&workspace_root().join(dir)))
        .collect()
}

/// Every document of every manifest, with the file it is in.
fn k8s_documents() -> Vec<(PathBuf, Value)> {
    k8s_manifests()
        .into_iter()
        .flat_map(|file| {
            yaml_documents(&file)
                .into_iter()
                .map(move |doc| (file.clone(), doc))
        })
        .collect()
}

/// Names of the binary targets of every workspace member, from `cargo metadata`.
fn workspace_binaries() -> BTreeSet<String> {
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

fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(value, |value, key| value.get(*key))
        .and_then(Value::as_str)
}

#[test]
fn compose_file_matches_the_compose_specification() {
    let root = workspace_root();
    let checker = tool("check-jsonschema");
    let schema = root.join("deploy/schemas/compose-spec.json");
    let validate = |file: &Path| {
        run(Command::new(&checker)
            .args(["--color", "never", "--schemafile"])
            .arg(&schema)
            .arg(file))
    };

    let run = validate(&root.join("docker-compose.yml"));
    assert!(
        run.success,
        "docker-compose.yml does not match the Compose specification:\n{}",
        run.output
    );

    // The same check rejects a compose file with a misspelt key, so the pass
    // above means something.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("compose.yml");
    std::fs::write(
        &broken,
        "services:\n  web:\n    image: nginx\n    depends_onn: [db]\n",
    )
    .unwrap();
    let run = validate(&broken);
    assert!(
        !run.success,
        "a misspelt key passed the Compose schema:\n{}",
        run.output
    );
}

/// The API group of a document's `apiVersion` (empty for the core group).
fn api_group(doc: &Value) -> &str {
    let api_version = str_at(doc, &["apiVersion"]).unwrap_or_default();
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// Built-in kinds are in the core group or a group of Kubernetes' own
/// (`apps`, `batch`, `policy`, `*.k8s.io`); anything else is a custom
/// resource, which needs a vendored CRD.
fn is_built_in(doc: &Value) -> bool {
    let group = api_group(doc);
    !group.contains('.') || group.ends_with(".k8s.io")
}

/// The strict JSON Schemas of the vendored CRDs, written by
/// `scripts/crd-to-jsonschema.py` into `dir`: one per kind and version,
/// named `<kind>-<group>-<version>.json`.
fn crd_json_schemas(dir: &Path) -> BTreeMap<String, PathBuf> {
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
fn check_custom_resources(
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

#[test]
fn kubernetes_manifests_match_the_kubernetes_api_schemas() {
    let validator = tool("kubernetes-validate");
    let dir = tempfile::tempdir().unwrap();
    let built_in_dir = dir.path().join("built-in");
    let custom_dir = dir.path().join("custom");
    std::fs::create_dir_all(&built_in_dir).unwrap();
    std::fs::create_dir_all(&custom_dir).unwrap();

    let mut built_in = Vec::new();
    let mut custom = Vec::new();
    for (index, (file, doc)) in k8s_documents().into_iter().enumerate() {
        let origin = format!(
            "{} {}/{}",
            file.strip_prefix(workspace_root()).unwrap().display(),
            str_at(&doc, &["kind"]).unwrap_or_default(),
            str_at(&doc, &["metadata", "name"]).unwrap_or_default()
        );
        if is_built_in(&doc) {
            let path = built_in_dir.join(format!(
                "{index:03}-{}.json",
                origin.replace(['/', ' '], "_")
            ));
            std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
            built_in.push(path);
        } else {
            custom.push((origin, doc));
        }
    }
    assert!(!built_in.is_empty() && !custom.is_empty());

    for version in KUBERNETES_VERSIONS {
        let run = run(Command::new(&validator)
            .args(["--strict", "--kubernetes-version", version])
            .args(&built_in));
        // WARN: a kind without a schema, i.e. not checked at all.
        let unchecked: Vec<&str> = run
            .output
            .lines()
            .filter(|line| line.starts_with("WARN") || line.starts_with("ERROR"))
            .collect();
        assert!(
            run.success && unchecked.is_empty(),
            "k8s/ is not valid for Kubernetes {version}:\n{}",
            run.output
        );
    }

    let schemas = crd_json_schemas(&dir.path().join("schemas"));
    let failures = check_custom_resources(&schemas, &custom, &custom_dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for kind in ["Cluster", "ServiceMonitor", "PodMonitor", "PrometheusRule"] {
        assert!(
            custom
                .iter()
                .any(|(_, doc)| str_at(doc, &["kind"]) == Some(kind)),
            "k8s/ has no {kind}"
        );
    }

    // A misspelt field fails strict validation, so the pass above means something.
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  portz:\n    - port: 80\n",
    )
    .unwrap();
    let run = run(Command::new(&validator).arg("--strict").arg(&broken));
    assert!(
        !run.success,
        "a misspelt field passed strict validation:\n{}",
        run.output
    );

    // And so do a misspelt field in a custom resource, at the top of its
    // spec and deep in it, and a custom kind without a vendored CRD.
    let find = |kind: &str| {
        custom
            .iter()
            .find(|(_, doc)| str_at(doc, &["kind"]) == Some(kind))
            .unwrap_or_else(|| panic!("no {kind}"))
            .1
            .clone()
    };
    let mut misspelt_cluster = find("Cluster");
    let instances = misspelt_cluster["spec"]
        .as_mapping_mut()
        .unwrap()
        .remove("instances")
        .expect("instances");
    misspelt_cluster["spec"]["instancez"] = instances;
    let mut misspelt_role = find("Cluster");
    misspelt_role["spec"]["managed"]["roles"][0]["passwordSecrett"] =
        misspelt_role["spec"]["managed"]["roles"][0]["passwordSecret"].clone();
    let mut misspelt_monitor = find("ServiceMonitor");
    misspelt_monitor["spec"]["endpoints"][0]["intervall"] = Value::from("15s");
    let mut misspelt_rule = find("PrometheusRule");
    misspelt_rule["spec"]["groups"][0]["rules"][0]["expresion"] = Value::from("up == 0");
    let mut unknown_kind = find("ServiceMonitor");
    unknown_kind["kind"] = Value::from("ServiceMonitr");
    for (index, what, doc) in [
        ("a Cluster's spec.instancez", misspelt_cluster),
        ("a Cluster's managed role passwordSecrett", misspelt_role),
        ("a ServiceMonitor endpoint's intervall", misspelt_monitor),
        ("a PrometheusRule rule's expresion", misspelt_rule),
        ("a ServiceMonitr", unknown_kind),
    ]
    .into_iter()
    .enumerate()
    .map(|(index, (what, doc))| (index, what, doc))
    {
        let broken_dir = dir.path().join(format!("broken-{index}"));
        std::fs::create_dir_all(&broken_dir).unwrap();
        let failures = check_custom_resources(&schemas, &[(what.to_string(), doc)], &broken_dir);
        assert!(!failures.is_empty(), "{what} passed validation");
    }
}

#[test]
fn every_compose_service_runs_a_workspace_binary() {
    let root = workspace_root();
    let binaries = workspace_binaries();
    let compose = yaml_documents(&root.join("docker-compose.yml")).remove(0);
    let services = compose["services"].as_mapping().expect("services");

    let mut deployed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, service) in services {
        let name = name.as_str().unwrap();
        if service.get("build").is_none() {
            // nats and postgres: official images.
            continue;
        }
        let binary = str_at(service, &["build", "args", "BIN"]).unwrap_or_else(|| {
            panic!("compose service {name} builds an image without a BIN build argument")
        });
        assert!(
            binaries.contains(binary),
            "compose service {name} runs {binary}, which no workspace Cargo.toml builds (binaries: {binaries:?})"
        );
        if let Some(image) = str_at(service, &["image"]) {
            assert!(
                image.starts_with(&format!("leasehold/{binary}:")),
                "compose service {name} tags its {binary} image as {image}"
            );
        }
        deployed
            .entry(binary.to_string())
            .or_default()
            .push(name.to_string());
    }
    for binary in SERVICE_BINARIES {
        assert!(
            deployed.contains_key(*binary),
            "docker-compose.yml runs no {binary}"
        );
    }
    for image in ["nats:2.", "postgres:15"] {
        assert!(
            services
                .values()
                .any(|s| str_at(s, &["image"]).is_some_and(|i| i.starts_with(image))),
            "docker-compose.yml has no {image}* service"
        );
    }
}

#[test]
fn every_kubernetes_workload_runs_a_workspace_binary_with_probes() {
    let binaries = workspace_binaries();
    let mut deployed = BTreeSet::new();
    for file in k8s_manifests() {
        for doc in yaml_documents(&file) {
            let kind = str_at(&doc, &["kind"]).unwrap_or_default().to_string();
            let name = str_at(&doc, &["metadata", "name"])
                .unwrap_or_default()
                .to_string();
            if kind != "Namespace" {
                assert_eq!(
                    str_at(&doc, &["metadata", "namespace"]),
                    Some("leasehold"),
                    "{} {kind}/{name} is not in namespace leasehold",
                    file.display()
                );
            }
            if !matches!(kind.as_str(), "Deployment" | "DaemonSet" | "StatefulSet") {
                continue;
            }
            let containers = doc["spec"]["template"]["spec"]["containers"]
                .as_sequence()
                .unwrap_or_else(|| panic!("{kind}/{name} has no containers"));
            for container in containers {
                let image = str_at(container, &["image"]).unwrap_or_default();
                let Some(rest) = image.strip_prefix("leasehold/") else {
                    continue; // nats, postgres
                };
                let binary = rest.split(':').next().unwrap();
                assert!(
                    binaries.contains(binary),
                    "{kind}/{name} runs image {image}, but no workspace Cargo.toml builds {binary}"
                );
                deployed.insert(binary.to_string());
                assert_eq!(
                    str_at(container, &["readinessProbe", "httpGet", "path"]),
                    Some("/readyz"),
                    "{kind}/{name}: readiness probe"
                );
                assert_eq!(
                    str_at(container, &["livenessProbe", "httpGet", "path"]),
                    Some("/healthz"),
                    "{kind}/{name}: liveness probe"
                );
            }
        }
    }
    for binary in SERVICE_BINARIES {
        assert!(deployed.contains(*binary), "k8s/ runs no {binary}");
    }
}

#[test]
fn deployments_carry_the_dev_fleet_and_fsync_every_write() {
    let root = workspace_root();
    let fleet = read(&root.join("dev/fleet.toml"));

    // Each compose node-agent plays one node of dev/fleet.toml.
    let compose = yaml_documents(&root.join("docker-compose.yml")).remove(0);
    let mut compose_nodes: Vec<String> = compose["services"]
        .as_mapping()
        .unwrap()
        .values()
        .filter(|s| str_at(s, &["build", "args", "BIN"]) == Some("lh-node-agent"))
        .map(|s| {
            str_at(s, &["environment", "LH_NODE_ID"])
                .expect("LH_NODE_ID")
                .to_string()
        })
        .collect();
    compose_nodes.sort();
    let mut fleet_nodes: Vec<String> = fleet
        .lines()
        .filter_map(|line| line.trim().strip_prefix("id = "))
        .map(|id| id.trim_matches('"').to_string())
        .collect();
    fleet_nodes.sort();
    assert_eq!(
        compose_nodes, fleet_nodes,
        "compose node-agents vs dev/fleet.toml"
    );
    assert_eq!(fleet_nodes.len(), 4);

    let mut k8s_fleet = None;
    let mut k8s_nats_conf = None;
    for file in k8s_manifests() {
        for doc in yaml_documents(&file) {
            if str_at(&doc, &["kind"]) != Some("ConfigMap") {
                continue;
            }
            match str_at(&doc, &["metadata", "name"]) {
                Some("fleet") => {
                    k8s_fleet = str_at(&doc, &["data", "fleet.toml"]).map(str::to_string)
                }
                Some("nats-config") => {
                    k8s_nats_conf = str_at(&doc, &["data", "nats.conf"]).map(str::to_string)
                }
                _ => {}
            }
        }
    }
    assert_eq!(
        k8s_fleet.as_deref(),
        Some(fleet.as_str()),
        "k8s ConfigMap fleet differs from dev/fleet.toml"
    );

    for (what, conf) in [
        ("dev/nats.conf", Some(read(&root.join("dev/nats.conf")))),
        (
            "dev/nats-cluster.conf",
            Some(read(&root.join("dev/nats-cluster.conf"))),
        ),
        ("k8s ConfigMap nats-config", k8s_nats_conf),
    ] {
        let conf = conf.unwrap_or_else(|| panic!("{what} is missing"));
        assert!(
            conf.lines()
                .any(|line| line.trim() == "sync_interval: always"),
            "{what} must set `sync_interval: always` in its jetstream block"
        );
    }
}

/// Members of the NATS cluster every deployment runs.
const NATS_CLUSTER_MEMBERS: usize = 3;

/// The hosts of a comma-separated NATS URL list (`nats://host:port,...`).
fn nats_url_hosts(urls: &str) -> BTreeSet<String> {
    urls.split(',')
        .map(|url| {
            let rest = url.trim().strip_prefix("nats://").unwrap_or_else(|| {
                panic!("{url:?} in LH_NATS_URL is not a nats:// URL");
            });
            rest.split(':').next().unwrap().to_string()
        })
        .collect()
}

/// The hosts the `routes` list of a nats-server config names (any scheme).
fn route_hosts(conf: &str) -> BTreeSet<String> {
    conf.lines()
        .skip_while(|line| !line.trim_start().starts_with("routes"))
        .skip(1)
        .take_while(|line| line.trim() != "]")
        .filter_map(|line| line.trim().trim_matches('"').split_once("://"))
        .map(|(_, rest)| rest.split(':').next().unwrap().to_string())
        .collect()
}

#[test]
fn nats_is_a_three_node_cluster_that_every_service_lists_whole() {
    let root = workspace_root();

    // Compose: three members on one config whose routes name all three.
    let compose = yaml_documents(&root.join("docker-compose.yml")).remove(0);
    let services = compose["services"].as_mapping().expect("services");
    let members: BTreeSet<String> = services
        .iter()
        .filter(|(_, s)| str_at(s, &["image"]).is_some_and(|i| i.starts_with("nats:2.")))
        .map(|(name, _)| name.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        members.len(),
        NATS_CLUSTER_MEMBERS,
        "compose NATS members: {members:?}"
    );
    let conf = read(&root.join("dev/nats-cluster.conf"));
    assert_eq!(route_hosts(&conf), members, "dev/nats-cluster.conf routes");
    assert!(conf.lines().any(|l| l.trim() == "sync_interval: always"));
    for name in &members {
        let service = &services[name.as_str()];
        let mounts: Vec<&str> = service["volumes"]
            .as_sequence()
            .expect("volumes")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            mounts.contains(&"./dev/nats-cluster.conf:/etc/nats/nats.conf:ro"),
            "compose {name} does not run dev/nats-cluster.conf: {mounts:?}"
        );
        assert_eq!(
            str_at(service, &["environment", "NATS_SERVER_NAME"]),
            Some(name.as_str()),
            "compose {name}: server name"
        );
    }
    for (name, service) in services {
        if service.get("build").is_none() {
            continue;
        }
        let urls = str_at(service, &["environment", "LH_NATS_URL"])
            .unwrap_or_else(|| panic!("compose {name:?} has no LH_NATS_URL"));
        assert_eq!(
            nats_url_hosts(urls),
            members,
            "compose {name:?}: LH_NATS_URL"
        );
        assert_eq!(
            str_at(service, &["environment", "LH_STREAM_REPLICAS"]),
            Some("3"),
            "compose {name:?}: LH_STREAM_REPLICAS"
        );
    }

    // Kubernetes: a StatefulSet of three behind a headless service, routes
    // to each pod by name, and every service container lists every pod.
    let mut pods = BTreeSet::new();
    let mut routes = BTreeSet::new();
    let mut service_urls = Vec::new();
    for file in k8s_manifests() {
        for doc in yaml_documents(&file) {
            let kind = str_at(&doc, &["kind"]).unwrap_or_default();
            let name = str_at(&doc, &["metadata", "name"]).unwrap_or_default();
            match (kind, name) {
                ("StatefulSet", "nats") => {
                    let replicas = doc["spec"]["replicas"].as_u64().expect("replicas");
                    assert_eq!(replicas as usize, NATS_CLUSTER_MEMBERS, "nats replicas");
                    let headless = str_at(&doc, &["spec", "serviceName"]).expect("serviceName");
                    pods = (0..replicas)
                        .map(|i| format!("nats-{i}.{headless}.leasehold.svc"))
                        .collect();
                }
                ("ConfigMap", "nats-config") => {
                    routes = route_hosts(str_at(&doc, &["data", "nats.conf"]).unwrap());
                }
                ("Deployment" | "DaemonSet" | "StatefulSet", _) => {
                    let containers = doc["spec"]["template"]["spec"]["containers"]
                        .as_sequence()
                        .unwrap();
                    for container in containers {
                        if !str_at(container, &["image"])
                            .unwrap()
                            .starts_with("leasehold/")
                        {
                            continue;
                        }
                        let env = container["env"].as_sequence().expect("env");
                        let var = |wanted: &str| {
                            env.iter()
                                .find(|e| str_at(e, &["name"]) == Some(wanted))
                                .and_then(|e| str_at(e, &["value"]))
                                .unwrap_or_else(|| panic!("{kind}/{name} has no {wanted}"))
                                .to_string()
                        };
                        assert_eq!(var("LH_STREAM_REPLICAS"), "3", "{kind}/{name}");
                        service_urls.push((format!("{kind}/{name}"), var("LH_NATS_URL")));
                    }
                }
                _ => {}
            }
        }
    }
    assert_eq!(
        pods.len(),
        NATS_CLUSTER_MEMBERS,
        "no nats StatefulSet in k8s/"
    );
    let route_pods: BTreeSet<String> = routes
        .iter()
        .map(|host| host.trim_end_matches(".cluster.local").to_string())
        .collect();
    assert_eq!(route_pods, pods, "k8s nats-config routes");
    assert!(!service_urls.is_empty());
    for (workload, urls) in service_urls {
        assert_eq!(nats_url_hosts(&urls), pods, "{workload}: LH_NATS_URL");
    }
}

/// Both deployments give the gateway, pricing and audit their own
/// PostgreSQL roles from the one script, and the gateway its master key.
#[test]
fn services_connect_as_their_own_roles_in_both_deployments() {
    let root = workspace_root();
    let roles_sql = read(&root.join("deploy/postgres/roles.sql"));

    let compose = yaml_documents(&root.join("docker-compose.yml")).remove(0);
    let services = &compose["services"];
    let mounts = |name: &str| -> Vec<String> {
        services[name]["volumes"]
            .as_sequence()
            .map(|v| {
                v.iter()
                    .filter_map(|m| m.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(
        mounts("postgres-roles")
            .contains(&"./deploy/postgres/roles.sql:/etc/leasehold/roles.sql:ro".to_string()),
        "compose postgres-roles does not run deploy/postgres/roles.sql"
    );
    for svc in ["gateway", "pricing", "audit"] {
        let url = str_at(&services[svc], &["environment", "DATABASE_URL"])
            .unwrap_or_else(|| panic!("compose {svc} has no DATABASE_URL"));
        assert!(
            url.starts_with(&format!("postgres://lh_{svc}:")),
            "compose {svc} connects as {url}, not as lh_{svc}"
        );
    }
    assert!(
        str_at(&services["gateway"], &["environment", "LH_MASTER_KEY_FILE"]).is_some(),
        "compose gateway has no master key"
    );

    // Kubernetes: CloudNativePG creates each role with its password from a
    // basic-auth Secret of that username; the service reads the password
    // from that Secret into its URL, on the cluster's primary; the Job runs
    // the same roles.sql as compose.
    let docs = k8s_documents();
    let find = |kind: &str, name: &str| -> &Value {
        docs.iter()
            .map(|(_, doc)| doc)
            .find(|d| {
                str_at(d, &["kind"]) == Some(kind) && str_at(d, &["metadata", "name"]) == Some(name)
            })
            .unwrap_or_else(|| panic!("k8s has no {kind}/{name}"))
    };
    assert_eq!(
        str_at(
            find("ConfigMap", "leasehold-postgres-roles"),
            &["data", "roles.sql"]
        ),
        Some(roles_sql.as_str()),
        "k8s ConfigMap leasehold-postgres-roles differs from deploy/postgres/roles.sql"
    );
    let clusters: Vec<&Value> = docs
        .iter()
        .map(|(_, doc)| doc)
        .filter(|d| str_at(d, &["kind"]) == Some("Cluster"))
        .collect();
    assert_eq!(clusters.len(), 1, "one CloudNativePG Cluster");
    let cluster = clusters[0];
    let cluster_name = str_at(cluster, &["metadata", "name"]).unwrap();
    let primary = format!("{cluster_name}-rw.leasehold.svc");
    let database =
        str_at(cluster, &["spec", "bootstrap", "initdb", "database"]).expect("initdb database");
    let roles: BTreeMap<&str, &Value> = cluster["spec"]["managed"]["roles"]
        .as_sequence()
        .expect("managed roles")
        .iter()
        .map(|role| (str_at(role, &["name"]).unwrap(), role))
        .collect();

    for svc in ["gateway", "pricing", "audit"] {
        let role_name = format!("lh_{svc}");
        let role = roles
            .get(role_name.as_str())
            .unwrap_or_else(|| panic!("the Cluster manages no role {role_name}"));
        assert_eq!(role["login"].as_bool(), Some(true), "{role_name}: login");
        for attribute in [
            "superuser",
            "createdb",
            "createrole",
            "replication",
            "bypassrls",
        ] {
            assert_eq!(
                role[attribute].as_bool(),
                Some(false),
                "{role_name}: {attribute}"
            );
        }
        let secret_name = str_at(role, &["passwordSecret", "name"]).expect("passwordSecret");
        let secret = find("Secret", secret_name);
        assert_eq!(
            str_at(secret, &["type"]),
            Some("kubernetes.io/basic-auth"),
            "{secret_name}"
        );
        assert_eq!(
            str_at(secret, &["stringData", "username"]),
            Some(role_name.as_str()),
            "{secret_name} names another role"
        );

        let deployment = find("Deployment", svc);
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let env = container["env"].as_sequence().expect("env");
        let password_from = env
            .iter()
            .find(|e| str_at(e, &["name"]) == Some("DATABASE_PASSWORD"))
            .unwrap_or_else(|| panic!("k8s {svc} has no DATABASE_PASSWORD"));
        assert_eq!(
            (
                str_at(password_from, &["valueFrom", "secretKeyRef", "name"]),
                str_at(password_from, &["valueFrom", "secretKeyRef", "key"])
            ),
            (Some(secret_name), Some("password")),
            "k8s {svc} must read its own role's password"
        );
        let url = env_value(container, "DATABASE_URL")
            .unwrap_or_else(|| panic!("k8s {svc} has no DATABASE_URL value"));
        let expected =
            format!("postgres://{role_name}:$(DATABASE_PASSWORD)@{primary}:5432/{database}?");
        assert!(
            url.starts_with(&expected),
            "k8s {svc} connects with {url}, not {expected}…"
        );
        assert!(
            url.contains("sslmode=verify-full") && url.contains("sslrootcert="),
            "k8s {svc} does not check the server's certificate: {url}"
        );
        // The password must be defined before the URL that refers to it.
        let position = |name: &str| env.iter().position(|e| str_at(e, &["name"]) == Some(name));
        assert!(
            position("DATABASE_PASSWORD") < position("DATABASE_URL"),
            "k8s {svc}: env order"
        );
    }

    let job = find("Job", "postgres-roles");
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env_value(container, "PGHOST").as_deref(),
        Some(primary.as_str()),
        "roles Job host"
    );
    assert_eq!(
        env_value(container, "PGSSLMODE").as_deref(),
        Some("verify-full")
    );
    let superuser = str_at(cluster, &["spec", "superuserSecret", "name"]).expect("superuserSecret");
    assert_eq!(
        str_at(find("Secret", superuser), &["stringData", "username"]),
        Some("postgres"),
        "the superuser Secret"
    );
}

/// Every NATS config a deployment runs includes its users (no anonymous
/// clients), and every service connects as its own user with a seed from a
/// file: compose from the nats-auth volume, k8s from its own Secret.
#[test]
fn every_deployment_runs_nats_with_users_and_each_service_as_itself() {
    let root = workspace_root();
    let mut configs = vec![
        (
            "deploy/nats/nats.conf",
            read(&root.join("deploy/nats/nats.conf")),
        ),
        ("dev/nats.conf", read(&root.join("dev/nats.conf"))),
        (
            "dev/nats-cluster.conf",
            read(&root.join("dev/nats-cluster.conf")),
        ),
    ];
    for file in k8s_manifests() {
        for doc in yaml_documents(&file) {
            if str_at(&doc, &["metadata", "name"]) == Some("nats-config") {
                let conf = str_at(&doc, &["data", "nats.conf"]).expect("nats.conf");
                configs.push(("k8s ConfigMap nats-config", conf.to_string()));
            }
        }
    }
    assert_eq!(configs.len(), 4, "the k8s nats-config is missing");
    for (what, conf) in &configs {
        let lines: Vec<&str> = conf.lines().map(str::trim).collect();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("include") && l.contains("users.conf")),
            "{what} does not include users.conf"
        );
        assert!(
            !lines.iter().any(|l| l.starts_with("no_auth_user")),
            "{what} lets anonymous clients in"
        );
    }

    let compose = yaml_documents(&root.join("docker-compose.yml")).remove(0);
    let services = compose["services"].as_mapping().expect("services");
    let mut users = BTreeSet::new();
    for (name, service) in services {
        let name = name.as_str().unwrap();
        if service.get("build").is_none() || name == "nats-auth" {
            continue;
        }
        let user = str_at(service, &["environment", "LH_NATS_USER"])
            .unwrap_or_else(|| panic!("compose {name} has no LH_NATS_USER"));
        assert_eq!(
            str_at(service, &["environment", "LH_NATS_NKEY_SEED_FILE"]),
            Some(format!("/run/nats-auth/keys/{user}.nk").as_str()),
            "compose {name}"
        );
        assert!(users.insert(user.to_string()), "compose {user} twice");
    }
    let mut k8s_users = BTreeSet::new();
    for file in k8s_manifests() {
        for doc in yaml_documents(&file) {
            if str_at(&doc, &["kind"]) != Some("Deployment") {
                continue;
            }
            let spec = &doc["spec"]["template"]["spec"];
            let env = spec["containers"][0]["env"].as_sequence().expect("env");
            let value = |key: &str| {
                env.iter()
                    .find(|e| str_at(e, &["name"]) == Some(key))
                    .and_then(|e| str_at(e, &["value"]))
                    .map(str::to_string)
            };
            let name = str_at(&doc, &["metadata", "name"]).unwrap_or_default();
            let user = value("LH_NATS_USER").unwrap_or_else(|| panic!("k8s {name}: no user"));
            assert!(value("LH_NATS_NKEY_SEED_FILE").is_some(), "k8s {name}");
            let expected = format!("nats-{user}");
            let secrets: Vec<&str> = spec["volumes"]
                .as_sequence()
                .expect("volumes")
                .iter()
                .filter_map(|v| str_at(v, &["secret", "secretName"]))
                .collect();
            assert!(
                secrets.contains(&expected.as_str()),
                "k8s {name} mounts no {expected}: {secrets:?}"
            );
            assert!(k8s_users.insert(user), "k8s {name}: a user twice");
        }
    }
    assert_eq!(users, k8s_users, "compose and k8s users differ");
}

/// Where each scrape target of a Prometheus config fails to meet a compose
/// service serving `/metrics` on that port, and which service binaries no
/// target scrapes. A service serves metrics on `LH_METRICS_ADDR` where it
/// has one (the gateway), else on its health listener `LH_HTTP_ADDR`.
fn scrape_target_mismatches(compose: &Value, prometheus: &Value) -> Vec<String> {
    let services = compose["services"].as_mapping().expect("services");
    let mut problems = Vec::new();
    let mut scraped = BTreeSet::new();
    for job in prometheus["scrape_configs"]
        .as_sequence()
        .into_iter()
        .flatten()
    {
        let name = str_at(job, &["job_name"]).unwrap_or_default();
        for target in job["static_configs"]
            .as_sequence()
            .into_iter()
            .flatten()
            .flat_map(|c| c["targets"].as_sequence().into_iter().flatten())
            .filter_map(Value::as_str)
        {
            let Some((host, port)) = target.rsplit_once(':') else {
                problems.push(format!("job {name}: target {target} has no port"));
                continue;
            };
            let Some(service) = services.get(host) else {
                problems.push(format!("job {name}: {host} is no compose service"));
                continue;
            };
            let image = str_at(service, &["image"]).unwrap_or_default();
            let exporter_port = COMPOSE_EXPORTERS
                .iter()
                .find(|(prefix, _)| image.starts_with(prefix))
                .map(|(_, port)| format!("0.0.0.0:{port}"));
            let listen = str_at(service, &["environment", "LH_METRICS_ADDR"])
                .or_else(|| str_at(service, &["environment", "LH_HTTP_ADDR"]))
                .or(exporter_port.as_deref());
            if listen != Some(&format!("0.0.0.0:{port}")) {
                problems.push(format!(
                    "job {name}: {host} serves /metrics on {listen:?}, not on 0.0.0.0:{port}"
                ));
            }
            scraped.insert(host.to_string());
        }
    }
    for (name, service) in services {
        let name = name.as_str().unwrap();
        let runs_a_service = str_at(service, &["build", "args", "BIN"])
            .is_some_and(|bin| SERVICE_BINARIES.contains(&bin));
        let runs_an_exporter = str_at(service, &["image"]).is_some_and(|image| {
            COMPOSE_EXPORTERS
                .iter()
                .any(|(prefix, _)| image.starts_with(prefix))
        });
        if (runs_a_service || runs_an_exporter) && !scraped.contains(name) {
            problems.push(format!("no scrape target for compose service {name}"));
        }
    }
    problems
}

#[test]
fn compose_prometheus_scrapes_every_service_and_grafana_loads_the_dashboards() {
    let root = workspace_root();
    let compose = yaml_documents(&root.join("docker-compose.yml")).remove(0);
    let prometheus_yml = yaml_documents(&root.join("deploy/prometheus/prometheus.yml")).remove(0);
    let problems = scrape_target_mismatches(&compose, &prometheus_yml);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // A target on the wrong port, or naming no service, is caught.
    let mut wrong = prometheus_yml.clone();
    wrong["scrape_configs"][0]["static_configs"][0]["targets"][0] = Value::from("gateway:8080");
    wrong["scrape_configs"][1]["static_configs"][0]["targets"][0] = Value::from("sheduler:9101");
    let problems = scrape_target_mismatches(&compose, &wrong);
    assert!(
        problems.iter().any(|p| p.contains("not on 0.0.0.0:8080"))
            && problems
                .iter()
                .any(|p| p.contains("sheduler is no compose service"))
            && problems
                .iter()
                .any(|p| p.contains("no scrape target for compose service scheduler")),
        "{problems:?}"
    );

    // So is an exporter no job scrapes.
    let mut unscraped = prometheus_yml.clone();
    unscraped["scrape_configs"]
        .as_sequence_mut()
        .unwrap()
        .retain(|job| str_at(job, &["job_name"]) != Some("postgres"));
    let problems = scrape_target_mismatches(&compose, &unscraped);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("no scrape target for compose service postgres-exporter")),
        "{problems:?}"
    );

    let services = &compose["services"];
    let volumes = |name: &str| -> Vec<String> {
        services[name]["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|m| m.as_str().map(str::to_string))
            .collect()
    };
    let pinned = |name: &str, repository: &str| {
        let image = str_at(&services[name], &["image"])
            .unwrap_or_else(|| panic!("compose has no {name} image"));
        let tag = image
            .strip_prefix(&format!("{repository}:"))
            .unwrap_or_else(|| panic!("compose {name} runs {image}, not {repository}"));
        assert!(
            tag.starts_with(|c: char| c.is_ascii_digit() || c == 'v') && tag.contains('.'),
            "compose {name}'s image tag {tag} is not a pinned version"
        );
    };

    pinned("prometheus", "prom/prometheus");
    pinned(
        "postgres-exporter",
        "quay.io/prometheuscommunity/postgres-exporter",
    );
    let command: Vec<&str> = services["prometheus"]["command"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        command.contains(&"--config.file=/etc/prometheus/prometheus.yml"),
        "{command:?}"
    );
    let mounts = volumes("prometheus");
    for mount in [
        "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro",
        // prometheus.yml loads rules/*.yml beside itself.
        "./deploy/prometheus/rules:/etc/prometheus/rules:ro",
    ] {
        assert!(
            mounts.iter().any(|m| m == mount),
            "prometheus lacks {mount}"
        );
    }

    pinned("grafana", "grafana/grafana");
    let mounts = volumes("grafana");
    assert!(
        mounts
            .iter()
            .any(|m| m == "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro"),
        "grafana is not provisioned from deploy/grafana/provisioning: {mounts:?}"
    );
    let provider =
        yaml_documents(&root.join("deploy/grafana/provisioning/dashboards/leasehold.yml"))
            .remove(0);
    let path = str_at(&provider["providers"][0], &["options", "path"]).expect("provider path");
    assert!(
        mounts
            .iter()
            .any(|m| *m == format!("./deploy/grafana/dashboards:{path}:ro")),
        "the dashboards provider reads {path}, where compose mounts no deploy/grafana/dashboards: {mounts:?}"
    );
    let datasources =
        yaml_documents(&root.join("deploy/grafana/provisioning/datasources/prometheus.yml"))
            .remove(0);
    let source = &datasources["datasources"][0];
    assert_eq!(str_at(source, &["uid"]), Some("prometheus"));
    assert_eq!(str_at(source, &["url"]), Some("http://prometheus:9090"));
    let password = str_at(
        &services["grafana"],
        &["environment", "GF_SECURITY_ADMIN_PASSWORD"],
    );
    assert!(
        password.is_some_and(|p| p.starts_with("${LH_GRAFANA_ADMIN_PASSWORD")),
        "grafana's admin password does not come from LH_GRAFANA_ADMIN_PASSWORD: {password:?}"
    );

    // Nothing is published beyond this machine.
    for (name, service) in services.as_mapping().unwrap() {
        for port in service["ports"].as_sequence().into_iter().flatten() {
            let port = port.as_str().unwrap_or_default();
            assert!(
                port.starts_with("127.0.0.1:"),
                "compose {} publishes {port} beyond 127.0.0.1",
                name.as_str().unwrap()
            );
        }
    }
}

/// The namespace everything of Leasehold's runs in.
const NAMESPACE: &str = "leasehold";

type Labels = BTreeMap<String, String>;

fn labels_at(value: &Value) -> Labels {
    value
        .as_mapping()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
        .collect()
}

/// Whether a label selector (`matchLabels`, `matchExpressions`) selects
/// `labels`; an empty selector selects everything.
fn selects(selector: &Value, labels: &Labels) -> bool {
    let wanted = labels_at(&selector["matchLabels"]);
    if !wanted.iter().all(|(k, v)| labels.get(k) == Some(v)) {
        return false;
    }
    selector["matchExpressions"]
        .as_sequence()
        .into_iter()
        .flatten()
        .all(|expression| {
            let key = str_at(expression, &["key"]).unwrap_or_default();
            let values: Vec<&str> = expression["values"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let value = labels.get(key).map(String::as_str);
            match str_at(expression, &["operator"]) {
                Some("In") => value.is_some_and(|v| values.contains(&v)),
                Some("NotIn") => !value.is_some_and(|v| values.contains(&v)),
                Some("Exists") => value.is_some(),
                Some("DoesNotExist") => value.is_none(),
                other => panic!("selector operator {other:?}"),
            }
        })
}

/// A pod that some workload of the manifests runs (its template), or one
/// that the CloudNativePG operator runs for a `Cluster`.
#[derive(Clone, Debug)]
struct PodTemplate {
    what: String,
    labels: Labels,
    spec: Value,
}

fn pod_templates(docs: &[(PathBuf, Value)]) -> Vec<PodTemplate> {
    let mut pods = Vec::new();
    for (_, doc) in docs {
        let kind = str_at(doc, &["kind"]).unwrap_or_default();
        let name = str_at(doc, &["metadata", "name"]).unwrap_or_default();
        match kind {
            "Deployment" | "DaemonSet" | "StatefulSet" | "Job" => pods.push(PodTemplate {
                what: format!("{kind}/{name}"),
                labels: labels_at(&doc["spec"]["template"]["metadata"]["labels"]),
                spec: doc["spec"]["template"]["spec"].clone(),
            }),
            // The operator labels every pod of a cluster (instances, and the
            // Jobs that initialise and join them) with the cluster's name.
            "Cluster" if api_group(doc) == "postgresql.cnpg.io" => pods.push(PodTemplate {
                what: format!("Cluster/{name} instance"),
                labels: [("cnpg.io/cluster".to_string(), name.to_string())].into(),
                spec: Value::Null,
            }),
            _ => {}
        }
    }
    pods
}

fn containers(pod: &PodTemplate) -> Vec<Value> {
    pod.spec["containers"]
        .as_sequence()
        .cloned()
        .unwrap_or_default()
}

/// The literal value of a container's environment variable.
fn env_value(container: &Value, name: &str) -> Option<String> {
    container["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|e| str_at(e, &["name"]) == Some(name))
        .and_then(|e| str_at(e, &["value"]))
        .map(str::to_string)
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("{addr:?} has no port"))
}

/// Where a Leasehold container serves `/metrics`: `LH_METRICS_ADDR` where it
/// has one (the gateway), else its health listener `LH_HTTP_ADDR`.
fn metrics_port(container: &Value) -> Option<u16> {
    env_value(container, "LH_METRICS_ADDR")
        .or_else(|| env_value(container, "LH_HTTP_ADDR"))
        .map(|addr| port_of(&addr))
}

fn is_leasehold_container(container: &Value) -> bool {
    str_at(container, &["image"]).is_some_and(|image| image.starts_with("leasehold/"))
}

/// The named ports of every CloudNativePG instance: PostgreSQL, the
/// instance manager's status, and its metrics exporter (`cnpg_*` series).
const CNPG_INSTANCE_PORTS: &[(&str, u16)] =
    &[("postgresql", 5432), ("status", 8000), ("metrics", 9187)];

/// Compose services running a third-party exporter, by the image they run
/// (a version tag follows), with the port it serves `/metrics` on.
const COMPOSE_EXPORTERS: &[(&str, u16)] =
    &[("quay.io/prometheuscommunity/postgres-exporter:", 9187)];

/// A scrape target: which pod, which port, under which job name.
#[derive(Debug)]
struct ScrapeTarget {
    pod: String,
    port: u16,
    job: String,
    monitor: String,
}

/// The targets the ServiceMonitors and PodMonitors of `docs` make of the
/// pods of `docs`, resolving ports by name the way the operator does.
fn scrape_targets(docs: &[(PathBuf, Value)]) -> Vec<ScrapeTarget> {
    let pods = pod_templates(docs);
    let services: Vec<&Value> = docs
        .iter()
        .map(|(_, doc)| doc)
        .filter(|doc| str_at(doc, &["kind"]) == Some("Service"))
        .collect();
    let container_port = |pod: &PodTemplate, port: &Value| -> Option<u16> {
        if pod.spec.is_null() {
            // The operator's pods: their ports are its own.
            return CNPG_INSTANCE_PORTS.iter().find_map(|(name, number)| {
                let hit = match port {
                    Value::String(wanted) => wanted == name,
                    Value::Number(n) => n.as_u64() == Some(u64::from(*number)),
                    _ => false,
                };
                hit.then_some(*number)
            });
        }
        containers(pod).iter().find_map(|c| {
            c["ports"]
                .as_sequence()
                .into_iter()
                .flatten()
                .find_map(|p| {
                    let number = p["containerPort"].as_u64()? as u16;
                    let hit = match port {
                        Value::String(name) => str_at(p, &["name"]) == Some(name.as_str()),
                        Value::Number(n) => n.as_u64() == Some(number as u64),
                        _ => false,
                    };
                    hit.then_some(number)
                })
        })
    };
    let mut targets = Vec::new();
    for (_, monitor) in docs {
        let kind = str_at(monitor, &["kind"]).unwrap_or_default();
        let name = str_at(monitor, &["metadata", "name"]).unwrap_or_default();
        let spec = &monitor["spec"];
        match kind {
            "PodMonitor" => {
                for pod in pods
                    .iter()
                    .filter(|p| selects(&spec["selector"], &p.labels))
                {
                    for endpoint in spec["podMetricsEndpoints"]
                        .as_sequence()
                        .into_iter()
                        .flatten()
                    {
                        if str_at(endpoint, &["path"]).unwrap_or("/metrics") != "/metrics" {
                            continue;
                        }
                        let Some(port) = container_port(pod, &endpoint["port"]) else {
                            continue;
                        };
                        let job = match str_at(spec, &["jobLabel"]) {
                            Some(label) => pod.labels.get(label).cloned().unwrap_or_default(),
                            None => format!("{NAMESPACE}/{name}"),
                        };
                        targets.push(ScrapeTarget {
                            pod: pod.what.clone(),
                            port,
                            job,
                            monitor: format!("PodMonitor/{name}"),
                        });
                    }
                }
            }
            "ServiceMonitor" => {
                for service in services
                    .iter()
                    .filter(|s| selects(&spec["selector"], &labels_at(&s["metadata"]["labels"])))
                {
                    let service_name = str_at(service, &["metadata", "name"]).unwrap_or_default();
                    let pod_selector = labels_at(&service["spec"]["selector"]);
                    for pod in pods
                        .iter()
                        .filter(|p| pod_selector.iter().all(|(k, v)| p.labels.get(k) == Some(v)))
                    {
                        for endpoint in spec["endpoints"].as_sequence().into_iter().flatten() {
                            if str_at(endpoint, &["path"]).unwrap_or("/metrics") != "/metrics" {
                                continue;
                            }
                            let Some(service_port) = service["spec"]["ports"]
                                .as_sequence()
                                .into_iter()
                                .flatten()
                                .find(|p| str_at(p, &["name"]) == str_at(endpoint, &["port"]))
                            else {
                                continue;
                            };
                            let target_port = match &service_port["targetPort"] {
                                Value::Null => service_port["port"].clone(),
                                other => other.clone(),
                            };
                            let Some(port) = container_port(pod, &target_port) else {
                                continue;
                            };
                            let job = match str_at(spec, &["jobLabel"]) {
                                Some(label) => labels_at(&service["metadata"]["labels"])
                                    .get(label)
                                    .cloned()
                                    .unwrap_or_default(),
                                None => service_name.to_string(),
                            };
                            targets.push(ScrapeTarget {
                                pod: pod.what.clone(),
                                port,
                                job,
                                monitor: format!("ServiceMonitor/{name}"),
                            });
                        }
                    }
                }
            }
            _ => {}
        }
    }
    targets
}

/// What is wrong with how the monitors of `docs` scrape the Leasehold
/// containers: a container's metrics port scraped by no monitor or by
/// several, or under a job other than its service's name (the job names of
/// compose's Prometheus, which the rules and dashboards read).
fn scrape_problems(docs: &[(PathBuf, Value)]) -> Vec<String> {
    let targets = scrape_targets(docs);
    let mut problems = Vec::new();
    for pod in pod_templates(docs) {
        for container in containers(&pod)
            .iter()
            .filter(|c| is_leasehold_container(c))
        {
            let port = metrics_port(container)
                .unwrap_or_else(|| panic!("{}: no metrics listener", pod.what));
            let scraping: Vec<&ScrapeTarget> = targets
                .iter()
                .filter(|t| t.pod == pod.what && t.port == port)
                .collect();
            let service = pod
                .labels
                .get("app.kubernetes.io/name")
                .cloned()
                .unwrap_or_default();
            match scraping.as_slice() {
                [] => problems.push(format!("{} :{port} is scraped by no monitor", pod.what)),
                [target] if target.job != service => problems.push(format!(
                    "{} :{port} is scraped by {} as job {:?}, not {service:?}",
                    pod.what, target.monitor, target.job
                )),
                [_] => {}
                several => problems.push(format!(
                    "{} :{port} is scraped {} times: {several:?}",
                    pod.what,
                    several.len()
                )),
            }
        }
    }
    for target in &targets {
        let pod = pod_templates(docs)
            .into_iter()
            .find(|p| p.what == target.pod)
            .unwrap();
        if pod.spec.is_null() {
            continue; // the operator's pods: their ports are its own
        }
        let serves_metrics = containers(&pod)
            .iter()
            .any(|c| metrics_port(c) == Some(target.port));
        if !serves_metrics {
            problems.push(format!(
                "{} scrapes {} :{}, where nothing serves /metrics",
                target.monitor, target.pod, target.port
            ));
        }
    }
    problems
}

fn alert_rules_file() -> Value {
    yaml_documents(&workspace_root().join("deploy/prometheus/rules/leasehold.rules.yml")).remove(0)
}

#[test]
fn the_prometheus_rule_carries_exactly_the_alert_rules_file() {
    let rules = alert_rules_file();
    let carried: Vec<Value> = k8s_documents()
        .into_iter()
        .filter(|(_, doc)| str_at(doc, &["kind"]) == Some("PrometheusRule"))
        .map(|(_, doc)| doc["spec"].clone())
        .collect();
    assert_eq!(carried.len(), 1, "one PrometheusRule in k8s/");
    assert!(
        rules["groups"].as_sequence().is_some_and(|g| !g.is_empty()),
        "no rule groups in the rules file"
    );
    assert_eq!(
        carried[0], rules,
        "the PrometheusRule in k8s/40-monitoring.yaml differs from deploy/prometheus/rules/leasehold.rules.yml"
    );
}

#[test]
fn every_service_is_scraped_once_under_its_job_name() {
    let docs = k8s_documents();
    let problems = scrape_problems(&docs);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // Every job the alert rules name is one the monitors make.
    let jobs: BTreeSet<String> = scrape_targets(&docs).into_iter().map(|t| t.job).collect();
    let rules = serde_yaml_ng::to_string(&alert_rules_file()).unwrap();
    let named: BTreeSet<&str> = rules
        .split("job=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    assert!(!named.is_empty(), "the rules name no job");

    // Each PostgreSQL instance's exporter is scraped once, under the job
    // compose's Prometheus gives postgres_exporter.
    let targets = scrape_targets(&docs);
    let postgres: Vec<&ScrapeTarget> = targets
        .iter()
        .filter(|t| t.pod == "Cluster/postgres instance")
        .collect();
    assert!(
        matches!(postgres.as_slice(), [t] if t.port == 9187 && t.job == "postgres"),
        "the CloudNativePG instances are not scraped once on 9187 as job postgres: {postgres:?}"
    );
    for job in named {
        assert!(
            jobs.contains(job),
            "the rules read job {job:?}; k8s scrapes {jobs:?}"
        );
    }

    // A monitor on the wrong port, or one under another job name, is caught.
    let mutate = |kind: &str, name: &str, change: &dyn Fn(&mut Value)| {
        let mut docs = docs.clone();
        let (_, doc) = docs
            .iter_mut()
            .find(|(_, d)| {
                str_at(d, &["kind"]) == Some(kind) && str_at(d, &["metadata", "name"]) == Some(name)
            })
            .unwrap_or_else(|| panic!("no {kind}/{name}"));
        change(doc);
        scrape_problems(&docs)
    };
    let problems = mutate("PodMonitor", "gateway", &|d| {
        d["spec"]["podMetricsEndpoints"][0]["port"] = Value::from("http");
    });
    assert!(
        problems
            .iter()
            .any(|p| p.contains("Deployment/gateway :9100 is scraped by no monitor"))
            && problems
                .iter()
                .any(|p| p.contains("where nothing serves /metrics")),
        "{problems:?}"
    );
    let problems = mutate("PodMonitor", "node-agent", &|d| {
        d["spec"].as_mapping_mut().unwrap().remove("jobLabel");
    });
    assert!(
        problems
            .iter()
            .any(|p| p.contains("as job \"leasehold/node-agent\"")),
        "{problems:?}"
    );
}

/// One end of a network flow: a pod (its namespace and labels) or, for the
/// Kubernetes API server, an address outside any pod network.
#[derive(Clone, Debug)]
enum Peer {
    Pod {
        what: String,
        namespace: String,
        labels: Labels,
    },
    ApiServer,
}

impl Peer {
    fn outside(what: &str, namespace: &str, labels: &[(&str, &str)]) -> Self {
        Peer::Pod {
            what: what.to_string(),
            namespace: namespace.to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn inside(pod: &PodTemplate) -> Self {
        Peer::Pod {
            what: pod.what.clone(),
            namespace: NAMESPACE.to_string(),
            labels: pod.labels.clone(),
        }
    }

    fn name(&self) -> &str {
        match self {
            Peer::Pod { what, .. } => what,
            Peer::ApiServer => "the API server",
        }
    }
}

/// A connection the platform needs, and why.
#[derive(Clone, Debug)]
struct Flow {
    from: Peer,
    to: Peer,
    port: u16,
    protocol: &'static str,
    why: &'static str,
}

/// The flows the manifests need, derived from what they run: each pod
/// resolves names; a container with `LH_NATS_URL` reaches the NATS members
/// on the URL's port, one with `DATABASE_URL` or `PGHOST` the instances of
/// the CloudNativePG cluster it names; NATS members reach each other on
/// their route port; Prometheus reaches every scrape target; anyone
/// reaches the gateway's API; the CloudNativePG operator reaches its
/// instances, which reach each other and the API server.
fn needed_flows(docs: &[(PathBuf, Value)]) -> Vec<Flow> {
    let dns = Peer::outside("kube-dns", "kube-system", &[("k8s-app", "kube-dns")]);
    let prometheus = Peer::outside(
        "Prometheus",
        "monitoring",
        &[("app.kubernetes.io/name", "prometheus")],
    );
    let operator = Peer::outside(
        "the CloudNativePG operator",
        "cnpg-system",
        &[("app.kubernetes.io/name", "cloudnative-pg")],
    );
    let anyone = Peer::outside("a client of the API", "ingress", &[]);
    let pods = pod_templates(docs);
    let by_name = |what: &str| pods.iter().find(|p| p.what == what).cloned();
    let nats = by_name("StatefulSet/nats").expect("a nats StatefulSet");
    let route_port = docs
        .iter()
        .find(|(_, d)| str_at(d, &["metadata", "name"]) == Some("nats-config"))
        .and_then(|(_, d)| str_at(d, &["data", "nats.conf"]).map(str::to_string))
        .and_then(|conf| {
            conf.lines()
                .find(|l| l.trim().starts_with("nats://nats-0."))
                .map(|l| port_of(l.trim()))
        })
        .expect("nats-config routes");
    let instances: BTreeMap<String, PodTemplate> = pods
        .iter()
        .filter(|p| p.what.starts_with("Cluster/"))
        .map(|p| (p.labels["cnpg.io/cluster"].clone(), p.clone()))
        .collect();

    let mut flows = Vec::new();
    let mut flow =
        |from: &Peer, to: &Peer, port: u16, protocol: &'static str, why: &'static str| {
            flows.push(Flow {
                from: from.clone(),
                to: to.clone(),
                port,
                protocol,
                why,
            })
        };
    for pod in &pods {
        let me = Peer::inside(pod);
        flow(&me, &dns, 53, "UDP", "names");
        flow(&me, &dns, 53, "TCP", "names");
        for container in containers(pod) {
            if let Some(urls) = env_value(&container, "LH_NATS_URL") {
                for url in urls.split(',') {
                    flow(
                        &me,
                        &Peer::inside(&nats),
                        port_of(url),
                        "TCP",
                        "LH_NATS_URL",
                    );
                }
            }
            let database_host = env_value(&container, "DATABASE_URL")
                .map(|url| {
                    let after_at = url
                        .rsplit_once('@')
                        .map_or(url.as_str(), |(_, h)| h)
                        .to_string();
                    after_at.split(['/', '?']).next().unwrap().to_string()
                })
                .or_else(|| env_value(&container, "PGHOST").map(|h| format!("{h}:5432")));
            if let Some(host_port) = database_host {
                let host = host_port.split(':').next().unwrap();
                let cluster = host
                    .split('.')
                    .next()
                    .and_then(|service| service.strip_suffix("-rw"))
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: database host {host} is no CloudNativePG -rw service",
                            pod.what
                        )
                    });
                let instance = instances
                    .get(cluster)
                    .unwrap_or_else(|| panic!("{}: no Cluster {cluster}", pod.what));
                flow(
                    &me,
                    &Peer::inside(instance),
                    port_of(&host_port),
                    "TCP",
                    "its database",
                );
            }
            if let Some(addr) = env_value(&container, "LH_GATEWAY_ADDR") {
                flow(&anyone, &me, port_of(&addr), "TCP", "the API");
            }
        }
    }
    let nats_peer = Peer::inside(&nats);
    flow(&nats_peer, &nats_peer, route_port, "TCP", "NATS routes");
    for instance in instances.values() {
        let me = Peer::inside(instance);
        flow(
            &operator,
            &me,
            5432,
            "TCP",
            "the operator manages PostgreSQL",
        );
        flow(
            &operator,
            &me,
            8000,
            "TCP",
            "the operator reads the instance manager's status",
        );
        flow(&me, &me, 5432, "TCP", "replication");
        flow(
            &me,
            &Peer::ApiServer,
            443,
            "TCP",
            "the instance manager watches its Cluster",
        );
        flow(
            &me,
            &Peer::ApiServer,
            6443,
            "TCP",
            "the instance manager watches its Cluster",
        );
    }
    for target in scrape_targets(docs) {
        let pod = by_name(&target.pod).expect("scraped pod");
        flow(
            &prometheus,
            &Peer::inside(&pod),
            target.port,
            "TCP",
            "metrics",
        );
    }
    flows
}

/// Which rule, peer and port entry of which policy a flow went through.
type RulePart = (String, &'static str, usize, &'static str, usize);

/// Whether a NetworkPolicy peer (`podSelector`, `namespaceSelector`,
/// `ipBlock`) covers `peer`, for a policy in the namespace leasehold.
fn peer_matches(rule_peer: &Value, peer: &Peer) -> bool {
    match peer {
        Peer::ApiServer => {
            str_at(rule_peer, &["ipBlock", "cidr"]).is_some_and(|c| c.ends_with("/32"))
        }
        Peer::Pod {
            namespace, labels, ..
        } => {
            if rule_peer.get("ipBlock").is_some() {
                return false;
            }
            let namespace_ok = match rule_peer.get("namespaceSelector") {
                Some(selector) => selects(
                    selector,
                    &[("kubernetes.io/metadata.name".to_string(), namespace.clone())].into(),
                ),
                None => namespace == NAMESPACE,
            };
            let pod_ok = rule_peer
                .get("podSelector")
                .is_none_or(|selector| selects(selector, labels));
            namespace_ok && pod_ok
        }
    }
}

/// The rule parts of `policies` that let `flow` out of its source (egress)
/// or into its destination (ingress); `None` when no policy applies to that
/// end in that direction (everything passes), `Some(empty)` when policies
/// apply and none allows it.
fn allowing_parts(
    policies: &[Value],
    flow: &Flow,
    direction: &'static str,
) -> Option<Vec<RulePart>> {
    let (me, other) = match direction {
        "Egress" => (&flow.from, &flow.to),
        _ => (&flow.to, &flow.from),
    };
    let Peer::Pod {
        namespace, labels, ..
    } = me
    else {
        return None;
    };
    if namespace != NAMESPACE {
        return None; // not ours to police
    }
    let (rules_key, peers_key) = match direction {
        "Egress" => ("egress", "to"),
        _ => ("ingress", "from"),
    };
    let applying: Vec<&Value> = policies
        .iter()
        .filter(|p| selects(&p["spec"]["podSelector"], labels))
        .filter(|p| {
            p["spec"]["policyTypes"]
                .as_sequence()
                .is_some_and(|types| types.iter().any(|t| t.as_str() == Some(direction)))
        })
        .collect();
    if applying.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    for policy in applying {
        let name = str_at(policy, &["metadata", "name"])
            .unwrap_or_default()
            .to_string();
        for (rule_index, rule) in policy["spec"][rules_key]
            .as_sequence()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let peers = rule[peers_key].as_sequence().cloned().unwrap_or_default();
            let peer_index = if peers.is_empty() {
                Some(usize::MAX) // every peer
            } else {
                peers.iter().position(|p| peer_matches(p, other))
            };
            let ports = rule["ports"].as_sequence().cloned().unwrap_or_default();
            let port_index = if ports.is_empty() {
                Some(usize::MAX) // every port
            } else {
                ports.iter().position(|p| {
                    p["port"].as_u64() == Some(flow.port as u64)
                        && str_at(p, &["protocol"]).unwrap_or("TCP") == flow.protocol
                })
            };
            if let (Some(peer), Some(port)) = (peer_index, port_index) {
                parts.push((name.clone(), rules_key, rule_index, peers_key, peer));
                parts.push((name.clone(), rules_key, rule_index, "ports", port));
            }
        }
    }
    Some(parts)
}

/// What is wrong with the NetworkPolicies of `docs`: a needed flow they
/// refuse, a rule without peers or ports (open to all; only the gateway's
/// API may be), a peer or port no needed flow goes through, and a
/// namespace without its default deny.
fn network_policy_problems(docs: &[(PathBuf, Value)]) -> Vec<String> {
    let policies: Vec<Value> = docs
        .iter()
        .map(|(_, d)| d.clone())
        .filter(|d| str_at(d, &["kind"]) == Some("NetworkPolicy"))
        .collect();
    let mut problems = Vec::new();

    let default_deny = policies.iter().any(|p| {
        let spec = &p["spec"];
        selects(&spec["podSelector"], &Labels::new())
            && spec["podSelector"]
                .as_mapping()
                .is_none_or(|m| m.is_empty())
            && ["Ingress", "Egress"].iter().all(|t| {
                spec["policyTypes"]
                    .as_sequence()
                    .is_some_and(|types| types.iter().any(|x| x.as_str() == Some(*t)))
            })
            && spec.get("ingress").is_none()
            && spec.get("egress").is_none()
    });
    if !default_deny {
        problems
            .push("no default-deny policy (every pod, Ingress and Egress, no rules)".to_string());
    }

    let mut used: BTreeSet<RulePart> = BTreeSet::new();
    for flow in needed_flows(docs) {
        for direction in ["Egress", "Ingress"] {
            match allowing_parts(&policies, &flow, direction) {
                None => {}
                Some(parts) if parts.is_empty() => problems.push(format!(
                    "{} → {} :{}/{} ({}) is refused ({direction})",
                    flow.from.name(),
                    flow.to.name(),
                    flow.port,
                    flow.protocol,
                    flow.why
                )),
                Some(parts) => used.extend(parts),
            }
        }
    }

    let gateway_api_ports: BTreeSet<u64> = pod_templates(docs)
        .iter()
        .flat_map(containers)
        .filter_map(|c| env_value(&c, "LH_GATEWAY_ADDR"))
        .map(|addr| port_of(&addr) as u64)
        .collect();
    for policy in &policies {
        let name = str_at(policy, &["metadata", "name"])
            .unwrap_or_default()
            .to_string();
        for (rules_key, peers_key) in [("ingress", "from"), ("egress", "to")] {
            for (index, rule) in policy["spec"][rules_key]
                .as_sequence()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let peers = rule[peers_key].as_sequence().cloned().unwrap_or_default();
                let ports = rule["ports"].as_sequence().cloned().unwrap_or_default();
                let only_the_api = rules_key == "ingress"
                    && !ports.is_empty()
                    && ports.iter().all(|p| {
                        p["port"]
                            .as_u64()
                            .is_some_and(|port| gateway_api_ports.contains(&port))
                    });
                if peers.is_empty() && !only_the_api {
                    problems.push(format!(
                        "{name} {rules_key}[{index}] has no `{peers_key}`: open to all"
                    ));
                }
                if ports.is_empty() {
                    problems.push(format!(
                        "{name} {rules_key}[{index}] has no ports: every port"
                    ));
                }
                for (peer_index, peer) in peers.iter().enumerate() {
                    if let Some(cidr) = str_at(peer, &["ipBlock", "cidr"]) {
                        if !cidr.ends_with("/32") {
                            problems.push(format!(
                                "{name} {rules_key}[{index}]: ipBlock {cidr} is not one address"
                            ));
                        }
                    }
                    let part = (name.clone(), rules_key, index, peers_key, peer_index);
                    if !used.contains(&part) {
                        problems.push(format!("{name} {rules_key}[{index}].{peers_key}[{peer_index}] is used by no needed flow"));
                    }
                }
                for (port_index, port) in ports.iter().enumerate() {
                    let part = (name.clone(), rules_key, index, "ports", port_index);
                    if !used.contains(&part) {
                        problems.push(format!(
                            "{name} {rules_key}[{index}] port {:?} is used by no needed flow",
                            port["port"]
                        ));
                    }
                }
            }
        }
    }
    problems
}

#[test]
fn network_policies_allow_the_needed_flows_and_nothing_more() {
    let docs = k8s_documents();
    let flows = needed_flows(&docs);
    for (from, to, port) in [
        ("Deployment/pricing", "Cluster/postgres instance", 5432),
        ("Deployment/gateway", "StatefulSet/nats", 4222),
        ("DaemonSet/node-agent-cn-north-1a", "StatefulSet/nats", 4222),
        ("Deployment/node-agent-a", "StatefulSet/nats", 4222),
        ("Job/postgres-roles", "Cluster/postgres instance", 5432),
        ("StatefulSet/nats", "StatefulSet/nats", 6222),
        ("Prometheus", "Deployment/gateway", 9100),
        ("Prometheus", "DaemonSet/node-agent-cn-north-1a", 9110),
    ] {
        assert!(
            flows
                .iter()
                .any(|f| f.from.name() == from && f.to.name() == to && f.port == port),
            "the derived flows lack {from} → {to} :{port}"
        );
    }
    let problems = network_policy_problems(&docs);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // Each kind of mistake is caught.
    let with_policy = |name: &str, change: &dyn Fn(&mut Value)| {
        let mut docs = docs.clone();
        let (_, policy) = docs
            .iter_mut()
            .find(|(_, d)| {
                str_at(d, &["kind"]) == Some("NetworkPolicy")
                    && str_at(d, &["metadata", "name"]) == Some(name)
            })
            .unwrap_or_else(|| panic!("no NetworkPolicy/{name}"));
        change(policy);
        network_policy_problems(&docs)
    };
    // pricing loses its database
    let problems = with_policy("pricing", &|p| {
        p["spec"]["egress"].as_sequence_mut().unwrap().truncate(1);
    });
    assert!(
        problems.iter().any(|p| p.contains(
            "Deployment/pricing → Cluster/postgres instance :5432/TCP (its database) is refused"
        )),
        "{problems:?}"
    );
    // NATS opened to every pod
    let problems = with_policy("nats", &|p| {
        p["spec"]["ingress"][0]
            .as_mapping_mut()
            .unwrap()
            .remove("from");
    });
    assert!(
        problems
            .iter()
            .any(|p| p.contains("nats ingress[0] has no `from`")),
        "{problems:?}"
    );
    // a port nothing uses (the NATS monitor port)
    let problems = with_policy("nats", &|p| {
        p["spec"]["ingress"][0]["ports"]
            .as_sequence_mut()
            .unwrap()
            .push(serde_yaml_ng::from_str("{protocol: TCP, port: 8222}").unwrap());
    });
    assert!(
        problems
            .iter()
            .any(|p| p.contains("port Number(8222) is used by no needed flow")),
        "{problems:?}"
    );
    // no default deny
    let problems = with_policy("default-deny", &|p| {
        p["spec"]["policyTypes"] = serde_yaml_ng::from_str("[Ingress]").unwrap();
    });
    assert!(
        problems
            .iter()
            .any(|p| p.contains("no default-deny policy")),
        "{problems:?}"
    );
}

/// What a GPU node's agent needs of its pod, per the manifests: where
/// problems are, empty when none.
fn gpu_node_agent_problems(agent: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let name = str_at(agent, &["metadata", "name"]).unwrap_or_default();
    let pod = &agent["spec"]["template"]["spec"];
    let mut problem = |what: String| problems.push(format!("DaemonSet/{name}: {what}"));

    // Only on GPU nodes, as the GPU operator's feature discovery labels them.
    let terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    let gpu_label = |term: &Value| {
        term["matchExpressions"]
            .as_sequence()
            .into_iter()
            .flatten()
            .any(|e| {
                str_at(e, &["key"]) == Some("nvidia.com/gpu.present")
                    && str_at(e, &["operator"]) == Some("In")
                    && e["values"]
                        .as_sequence()
                        .is_some_and(|v| v.len() == 1 && v[0].as_str() == Some("true"))
            })
    };
    let by_selector = str_at(pod, &["nodeSelector", "nvidia.com/gpu.present"]) == Some("true");
    if !(by_selector || (!terms.is_empty() && terms.iter().all(gpu_label))) {
        problem("not restricted to nodes labelled nvidia.com/gpu.present=true".into());
    }
    if str_at(pod, &["runtimeClassName"]) != Some("nvidia") {
        problem("runtimeClassName is not nvidia".into());
    }

    let container = &pod["containers"][0];
    let env = container["env"].as_sequence().cloned().unwrap_or_default();
    let from_field = |var: &str| {
        env.iter()
            .find(|e| str_at(e, &["name"]) == Some(var))
            .and_then(|e| str_at(e, &["valueFrom", "fieldRef", "fieldPath"]))
    };
    if from_field("LH_NODE_ID") != Some("spec.nodeName") {
        problem("LH_NODE_ID does not come from spec.nodeName".into());
    }
    if env_value(container, "LH_GPU_BACKEND").as_deref() != Some("nvml") {
        problem("LH_GPU_BACKEND is not nvml".into());
    }
    if env_value(container, "LH_SIM_FALLBACK").is_some() {
        problem("a GPU node falls back to a simulated one".into());
    }
    if env_value(container, "LH_ZONE").is_none() {
        problem("no LH_ZONE (the NVML backend needs it)".into());
    }
    if env_value(container, "NVIDIA_VISIBLE_DEVICES").as_deref() != Some("all") {
        problem("NVIDIA_VISIBLE_DEVICES is not all".into());
    }
    let capabilities = env_value(container, "NVIDIA_DRIVER_CAPABILITIES").unwrap_or_default();
    for wanted in ["utility", "compute"] {
        if !capabilities.split(',').any(|c| c == wanted || c == "all") {
            problem(format!("NVIDIA_DRIVER_CAPABILITIES lacks {wanted}"));
        }
    }
    if env_value(container, "NVIDIA_MIG_CONFIG_DEVICES").as_deref() != Some("all") {
        problem("no NVIDIA_MIG_CONFIG_DEVICES=all: MIG instances cannot be created".into());
    }
    let added: Vec<&str> = container["securityContext"]["capabilities"]["add"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !added.contains(&"SYS_ADMIN") {
        problem("no SYS_ADMIN: NVML refuses MIG instance changes".into());
    }
    if pod["hostIPC"].as_bool() != Some(true) {
        problem("not in the host's IPC namespace: MPS clients cannot reach the daemon".into());
    }

    // Host paths: the state directory (at the same path, since dockerd
    // resolves what the agent passes it), the NATS seed.
    let host_path = |mount_path: &str| -> Option<String> {
        let mount = container["volumeMounts"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|m| str_at(m, &["mountPath"]) == Some(mount_path))?;
        let volume = str_at(mount, &["name"])?;
        pod["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|v| str_at(v, &["name"]) == Some(volume))
            .and_then(|v| str_at(v, &["hostPath", "path"]))
            .map(str::to_string)
    };
    match env_value(container, "LH_NODE_STATE_DIR") {
        Some(dir) if host_path(&dir).as_deref() == Some(dir.as_str()) => {}
        other => problem(format!(
            "the state dir {other:?} is not the host's same directory"
        )),
    }
    let seed = env_value(container, "LH_NATS_NKEY_SEED_FILE").unwrap_or_default();
    let seed_dir = Path::new(&seed)
        .parent()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    if host_path(&seed_dir).is_none() {
        problem(format!("the NATS seed {seed} is not on the host"));
    }
    if env_value(container, "LH_NATS_USER").as_deref() != Some("node-$(LH_NODE_ID)") {
        problem("the NATS user is not the node's own".into());
    }
    if let Some(runtime) = env_value(container, "LH_RUNTIME") {
        if runtime == "docker" && host_path("/var/run/docker.sock").is_none() {
            problem("the docker runtime without the host's docker socket".into());
        }
    }
    problems
}

#[test]
fn the_node_agent_runs_on_every_gpu_node_with_what_nvml_mig_and_mps_need() {
    let docs = k8s_documents();
    let agents: Vec<&Value> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| {
            str_at(d, &["kind"]) == Some("DaemonSet")
                && d["spec"]["template"]["spec"]["containers"][0]["image"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("leasehold/lh-node-agent:"))
        })
        .collect();
    assert!(!agents.is_empty(), "no node-agent DaemonSet in k8s/");
    for agent in &agents {
        let problems = gpu_node_agent_problems(agent);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    // The simulated fleet stays: one Deployment per node of dev/fleet.toml
    // (their ConfigMap equals it: deployments_carry_the_dev_fleet_…).
    let simulated: BTreeSet<String> = docs
        .iter()
        .filter(|(file, _)| file.parent().is_some_and(|d| d.ends_with("k8s/simulated")))
        .filter(|(_, d)| str_at(d, &["kind"]) == Some("Deployment"))
        .filter_map(|(_, d)| {
            env_value(
                &d["spec"]["template"]["spec"]["containers"][0],
                "LH_NODE_ID",
            )
        })
        .collect();
    assert_eq!(simulated.len(), 4, "simulated node-agents: {simulated:?}");

    // Each requirement is checked.
    let mut broken = agents[0].clone();
    let spec = &mut broken["spec"]["template"]["spec"];
    spec.as_mapping_mut().unwrap().remove("runtimeClassName");
    spec["containers"][0]["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] =
        Value::from("metadata.name");
    spec["volumes"][0]["hostPath"]["path"] = Value::from("/var/lib/elsewhere");
    let problems = gpu_node_agent_problems(&broken);
    for wanted in ["runtimeClassName", "spec.nodeName", "state dir"] {
        assert!(
            problems.iter().any(|p| p.contains(wanted)),
            "{wanted}: {problems:?}"
        );
    }
}

#[test]
fn nats_and_postgres_survive_losing_a_host() {
    let docs = k8s_documents();
    let find = |kind: &str, name: &str| -> Value {
        docs.iter()
            .map(|(_, d)| d)
            .find(|d| {
                str_at(d, &["kind"]) == Some(kind) && str_at(d, &["metadata", "name"]) == Some(name)
            })
            .cloned()
            .unwrap_or_else(|| panic!("no {kind}/{name}"))
    };
    let disruption_budget_covers = |labels: &Labels, replicas: u64| {
        docs.iter().map(|(_, d)| d).any(|d| {
            str_at(d, &["kind"]) == Some("PodDisruptionBudget")
                && selects(&d["spec"]["selector"], labels)
                && (d["spec"]["maxUnavailable"].as_u64() == Some(1)
                    || d["spec"]["minAvailable"].as_u64() == Some(replicas - 1))
        })
    };

    // NATS: members on different hosts, each on its own volume, at most
    // one down by choice.
    let nats = find("StatefulSet", "nats");
    let labels = labels_at(&nats["spec"]["template"]["metadata"]["labels"]);
    let anti = &nats["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"];
    assert!(
        anti.as_sequence().into_iter().flatten().any(|term| {
            str_at(term, &["topologyKey"]) == Some("kubernetes.io/hostname")
                && selects(&term["labelSelector"], &labels)
        }),
        "NATS members may share a host"
    );
    let claims = nats["spec"]["volumeClaimTemplates"]
        .as_sequence()
        .expect("volumeClaimTemplates");
    let data_mount = nats["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|m| str_at(m, &["mountPath"]) == Some("/data"))
        .and_then(|m| str_at(m, &["name"]))
        .expect("a /data mount (jetstream store_dir)");
    assert!(
        claims
            .iter()
            .any(|c| str_at(c, &["metadata", "name"]) == Some(data_mount)),
        "the JetStream store is not on a persistent volume"
    );
    assert!(
        disruption_budget_covers(&labels, 3),
        "no PodDisruptionBudget keeps two NATS members up"
    );

    // PostgreSQL: three instances on different hosts, synchronous commit to
    // one replica; the operator keeps the disruption budgets.
    let cluster = find("Cluster", "postgres");
    let spec = &cluster["spec"];
    assert_eq!(spec["instances"].as_u64(), Some(3), "instances");
    assert_eq!(
        str_at(spec, &["affinity", "podAntiAffinityType"]),
        Some("required")
    );
    assert_eq!(
        str_at(spec, &["affinity", "topologyKey"]),
        Some("kubernetes.io/hostname")
    );
    assert_ne!(
        spec["enablePDB"].as_bool(),
        Some(false),
        "CNPG's PDBs are off"
    );
    assert!(
        str_at(spec, &["storage", "size"]).is_some(),
        "no storage size"
    );
    assert!(
        spec["postgresql"]["synchronous"]["number"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "commits are not synchronous to a replica"
    );

    // The replicated services keep one replica up through a drain.
    for name in ["gateway", "scheduler"] {
        let deployment = find("Deployment", name);
        let replicas = deployment["spec"]["replicas"].as_u64().unwrap_or(1);
        assert!(replicas >= 2, "{name}: {replicas} replica(s)");
        let labels = labels_at(&deployment["spec"]["template"]["metadata"]["labels"]);
        assert!(
            disruption_budget_covers(&labels, replicas),
            "{name}: no PodDisruptionBudget"
        );
        assert_eq!(
            deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"].as_u64(),
            Some(0),
            "{name}: a rollout takes a replica down before its successor is ready"
        );
    }
}
