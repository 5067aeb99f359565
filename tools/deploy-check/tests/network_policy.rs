//! The NetworkPolicies allow every flow the manifests need and nothing
//! more, and each kind of mistake in them is caught by the simulator.

use lh_deploy_check::manifests::{k8s_documents, str_at};
use lh_deploy_check::network_policy::{needed_flows, network_policy_problems};
use serde_yaml_ng::Value;

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
        (
            "DaemonSet/node-agent-cn-north-1a",
            "Deployment/gateway",
            7443,
        ),
        ("Deployment/node-agent-a", "Deployment/gateway", 7443),
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
    // the gateway's session lanes closed to node agents, or opened to all
    let lane_rule = |p: &Value| {
        p["spec"]["ingress"]
            .as_sequence()
            .unwrap()
            .iter()
            .position(|rule| rule["ports"][0]["port"].as_u64() == Some(7443))
            .expect("a rule for the lanes")
    };
    let problems = with_policy("gateway", &|p| {
        let index = lane_rule(p);
        p["spec"]["ingress"]
            .as_sequence_mut()
            .unwrap()
            .remove(index);
    });
    assert!(
        problems.iter().any(|p| p.contains(
            "Deployment/node-agent-a → Deployment/gateway :7443/TCP (a session's lane) is refused (Ingress)"
        )),
        "{problems:?}"
    );
    let problems = with_policy("gateway", &|p| {
        let index = lane_rule(p);
        p["spec"]["ingress"][index]
            .as_mapping_mut()
            .unwrap()
            .remove("from");
    });
    assert!(
        problems
            .iter()
            .any(|p| p.contains("gateway ingress[") && p.contains("has no `from`: open to all")),
        "{problems:?}"
    );
    // node agents may not leave for a lane
    let problems = with_policy("node-agent", &|p| {
        p["spec"]["egress"].as_sequence_mut().unwrap().truncate(1);
    });
    assert!(
        problems.iter().any(|p| p.contains(
            "DaemonSet/node-agent-cn-north-1a → Deployment/gateway :7443/TCP (a session's lane) is refused (Egress)"
        )),
        "{problems:?}"
    );
    // a node whose bus is TLS takes no lane: the rule for one is then unused
    let mut tls_docs = docs.clone();
    for (_, doc) in tls_docs.iter_mut() {
        if str_at(
            doc,
            &[
                "spec",
                "template",
                "metadata",
                "labels",
                "app.kubernetes.io/name",
            ],
        ) == Some("node-agent")
        {
            doc["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_sequence_mut()
                .unwrap()
                .push(
                    serde_yaml_ng::from_str("{name: LH_NATS_CA_FILE, value: /etc/nats-ca/ca.crt}")
                        .unwrap(),
                );
        }
    }
    assert!(
        !needed_flows(&tls_docs).iter().any(|f| f.port == 7443),
        "a node on a TLS bus was given a lane"
    );
    assert!(
        network_policy_problems(&tls_docs)
            .iter()
            .any(|p| p.contains("port Number(7443) is used by no needed flow")),
        "the lanes' rules outlived the lanes"
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

#[test]
fn only_the_gateway_and_node_agents_reach_the_object_store_and_only_its_s3_port() {
    let docs = k8s_documents();
    let flows = needed_flows(&docs);
    for from in [
        "Deployment/gateway",
        "DaemonSet/node-agent-cn-north-1a",
        "Deployment/node-agent-a",
    ] {
        assert!(
            flows.iter().any(|f| f.from.name() == from
                && f.to.name() == "StatefulSet/seaweedfs"
                && f.port == 8333),
            "the derived flows lack {from} → StatefulSet/seaweedfs :8333"
        );
    }
    let to_store: Vec<String> = flows
        .iter()
        .filter(|f| f.to.name() == "StatefulSet/seaweedfs")
        .map(|f| format!("{} :{}", f.from.name(), f.port))
        .collect();
    assert!(
        to_store.iter().all(|f| f.ends_with(" :8333")
            && (f.starts_with("Deployment/gateway ") || f.contains("node-agent"))),
        "{to_store:?}"
    );
    assert!(network_policy_problems(&docs).is_empty());

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
    // the filer's port, which serves any object without credentials
    let problems = with_policy("seaweedfs", &|p| {
        p["spec"]["ingress"][0]["ports"]
            .as_sequence_mut()
            .unwrap()
            .push(serde_yaml_ng::from_str("{protocol: TCP, port: 8888}").unwrap());
    });
    assert!(
        problems
            .iter()
            .any(|p| p.contains("seaweedfs ingress[0] port Number(8888) is used by no needed flow")),
        "{problems:?}"
    );
    // the S3 port opened to every pod
    let problems = with_policy("seaweedfs", &|p| {
        p["spec"]["ingress"][0]
            .as_mapping_mut()
            .unwrap()
            .remove("from");
    });
    assert!(
        problems
            .iter()
            .any(|p| p.contains("seaweedfs ingress[0] has no `from`: open to all")),
        "{problems:?}"
    );
    // a pod that needs no store let in
    let problems = with_policy("seaweedfs", &|p| {
        p["spec"]["ingress"][0]["from"]
            .as_sequence_mut()
            .unwrap()
            .push(
                serde_yaml_ng::from_str(
                    "{podSelector: {matchLabels: {app.kubernetes.io/name: scheduler}}}",
                )
                .unwrap(),
            );
    });
    assert!(
        problems
            .iter()
            .any(|p| p.contains("seaweedfs ingress[0].from[2] is used by no needed flow")),
        "{problems:?}"
    );
    // node agents shut out of their leases' data
    let problems = with_policy("seaweedfs", &|p| {
        p["spec"]["ingress"][0]["from"]
            .as_sequence_mut()
            .unwrap()
            .truncate(1);
    });
    assert!(
        problems.iter().any(|p| p.contains(
            "Deployment/node-agent-a → StatefulSet/seaweedfs :8333/TCP (leases' data, where the gateway says the store is) is refused (Ingress)"
        )),
        "{problems:?}"
    );
    // the gateway may not leave for the store
    let problems = with_policy("gateway", &|p| {
        p["spec"]["egress"].as_sequence_mut().unwrap().truncate(2);
    });
    assert!(
        problems.iter().any(|p| p.contains(
            "Deployment/gateway → StatefulSet/seaweedfs :8333/TCP (LH_STORAGE_ENDPOINT) is refused (Egress)"
        )),
        "{problems:?}"
    );
}
