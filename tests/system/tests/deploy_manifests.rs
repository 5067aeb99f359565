//! The deployment files stay deployable:
//!
//! - `docker-compose.yml` validates against the official Compose
//!   Specification schema (vendored in `deploy/schemas/compose-spec.json`),
//!   checked by `check-jsonschema`;
//! - every manifest in `k8s/` validates, strictly (no unknown fields),
//!   against the Kubernetes API schemas, checked by `kubernetes-validate`;
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

fn k8s_manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(workspace_root().join("k8s"))
        .expect("k8s/ exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in k8s/");
    files
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

#[test]
fn kubernetes_manifests_match_the_kubernetes_api_schemas() {
    let validator = tool("kubernetes-validate");
    let manifests = k8s_manifests();
    for version in KUBERNETES_VERSIONS {
        let run = run(Command::new(&validator)
            .args(["--strict", "--kubernetes-version", version])
            .args(&manifests));
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

    // A misspelt field fails strict validation, so the pass above means something.
    let dir = tempfile::tempdir().unwrap();
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

    let mut k8s_roles_sql = None;
    let mut database_urls = BTreeMap::new();
    for file in k8s_manifests() {
        for doc in yaml_documents(&file) {
            let kind = str_at(&doc, &["kind"]);
            let name = str_at(&doc, &["metadata", "name"]).unwrap_or_default();
            if kind == Some("ConfigMap") && name == "leasehold-postgres-roles" {
                k8s_roles_sql = str_at(&doc, &["data", "roles.sql"]).map(str::to_string);
            }
            if kind != Some("Deployment") {
                continue;
            }
            let containers = doc["spec"]["template"]["spec"]["containers"]
                .as_sequence()
                .cloned()
                .unwrap_or_default();
            for container in containers {
                for env in container["env"].as_sequence().cloned().unwrap_or_default() {
                    if str_at(&env, &["name"]) == Some("DATABASE_URL") {
                        database_urls.insert(
                            name.to_string(),
                            (
                                str_at(&env, &["valueFrom", "secretKeyRef", "name"])
                                    .map(str::to_string),
                                str_at(&env, &["valueFrom", "secretKeyRef", "key"])
                                    .map(str::to_string),
                            ),
                        );
                    }
                }
            }
        }
    }
    assert_eq!(
        k8s_roles_sql.as_deref(),
        Some(roles_sql.as_str()),
        "k8s ConfigMap leasehold-postgres-roles differs from deploy/postgres/roles.sql"
    );
    for svc in ["gateway", "pricing", "audit"] {
        assert_eq!(
            database_urls.get(svc),
            Some(&(
                Some("leasehold-postgres-roles".to_string()),
                Some(format!("{svc}-database-url"))
            )),
            "k8s {svc} must connect with its own role's URL"
        );
    }
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
            let listen = str_at(service, &["environment", "LH_METRICS_ADDR"])
                .or_else(|| str_at(service, &["environment", "LH_HTTP_ADDR"]));
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
        if runs_a_service && !scraped.contains(name) {
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
