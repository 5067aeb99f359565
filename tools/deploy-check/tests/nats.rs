//! NATS is a three-node JetStream cluster in compose and in k8s/, and
//! every service is given every member's URL and three stream replicas.

use std::collections::BTreeSet;

use lh_deploy_check::compose::compose_image;
use lh_deploy_check::manifests::{k8s_manifests, read, str_at, yaml_documents};
use lh_deploy_check::nats::{nats_url_hosts, route_hosts, NATS_CLUSTER_MEMBERS};
use lh_deploy_check::workspace::workspace_root;
use serde_yaml_ng::Value;

#[test]
fn nats_is_a_three_node_cluster_that_every_service_lists_whole() {
    let root = workspace_root();

    // Compose: three members on one config whose routes name all three.
    let compose = yaml_documents(&root.join("docker-compose.yml")).remove(0);
    let services = compose["services"].as_mapping().expect("services");
    let members: BTreeSet<String> = services
        .iter()
        .filter(|(_, s)| compose_image(s).is_some_and(|i| i.starts_with("nats:2.")))
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
