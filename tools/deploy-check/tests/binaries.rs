//! Every image either deployment runs is a binary the workspace builds,
//! with the probes the services serve, and every service binary is
//! deployed by both: a renamed binary cannot leave a deployment behind.

use std::collections::{BTreeMap, BTreeSet};

use lh_deploy_check::binaries::{workspace_binaries, SERVICE_BINARIES};
use lh_deploy_check::compose::compose_image;
use lh_deploy_check::manifests::{k8s_manifests, str_at, yaml_documents};
use lh_deploy_check::workspace::workspace_root;

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
        if let Some(image) = compose_image(service) {
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
                .any(|s| compose_image(s).is_some_and(|i| i.starts_with(image))),
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
