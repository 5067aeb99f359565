//! NATS, PostgreSQL and the replicated services survive losing a host:
//! members spread over hosts, persistent volumes, disruption budgets, and
//! rollouts that bring a successor up before taking a replica down.

use lh_deploy_check::k8s::{labels_at, selects, Labels};
use lh_deploy_check::manifests::{k8s_documents, str_at};
use serde_yaml_ng::Value;

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
