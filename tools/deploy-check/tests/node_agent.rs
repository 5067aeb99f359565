//! The node-agent runs on every GPU node with what NVML, MIG and MPS need,
//! and the simulated fleet stays beside it.

use std::collections::BTreeSet;

use lh_deploy_check::k8s::env_value;
use lh_deploy_check::manifests::{k8s_documents, str_at};
use lh_deploy_check::node_agent::gpu_node_agent_problems;
use serde_yaml_ng::Value;

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
    assert_eq!(simulated.len(), 6, "simulated node-agents: {simulated:?}");

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
