//! The deployments carry what `dev/` defines: the simulated fleet of
//! `dev/fleet.toml`, and NATS configs that fsync every write.

use lh_deploy_check::manifests::{k8s_manifests, read, str_at, yaml_documents};
use lh_deploy_check::workspace::workspace_root;

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
    assert_eq!(fleet_nodes.len(), 6);

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
