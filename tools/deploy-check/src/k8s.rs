//! The Kubernetes object model the checks share: label selectors as the
//! API server evaluates them, the pods the manifests run (including the
//! ones the CloudNativePG operator runs for a `Cluster`), and what a
//! container's environment says about its ports.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_yaml_ng::Value;

use crate::manifests::str_at;

/// The namespace everything of Leasehold's runs in.
pub(crate) const NAMESPACE: &str = "leasehold";

pub type Labels = BTreeMap<String, String>;

pub fn labels_at(value: &Value) -> Labels {
    value
        .as_mapping()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
        .collect()
}

/// Whether a label selector (`matchLabels`, `matchExpressions`) selects
/// `labels`; an empty selector selects everything.
pub fn selects(selector: &Value, labels: &Labels) -> bool {
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

/// The API group of a document's `apiVersion` (empty for the core group).
pub(crate) fn api_group(doc: &Value) -> &str {
    let api_version = str_at(doc, &["apiVersion"]).unwrap_or_default();
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// A pod that some workload of the manifests runs (its template), or one
/// that the CloudNativePG operator runs for a `Cluster`.
#[derive(Clone, Debug)]
pub(crate) struct PodTemplate {
    pub(crate) what: String,
    pub(crate) labels: Labels,
    pub(crate) spec: Value,
}

pub(crate) fn pod_templates(docs: &[(PathBuf, Value)]) -> Vec<PodTemplate> {
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

pub(crate) fn containers(pod: &PodTemplate) -> Vec<Value> {
    pod.spec["containers"]
        .as_sequence()
        .cloned()
        .unwrap_or_default()
}

/// The literal value of a container's environment variable.
pub fn env_value(container: &Value, name: &str) -> Option<String> {
    container["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|e| str_at(e, &["name"]) == Some(name))
        .and_then(|e| str_at(e, &["value"]))
        .map(str::to_string)
}

pub(crate) fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("{addr:?} has no port"))
}

/// The pod and port that a URL naming one of the manifests' Services leads
/// to (`http://seaweedfs.leasehold.svc:8333`): the Service named by the
/// host's first label, its port of the URL's number, and the container
/// port that targets, which is what a NetworkPolicy sees. `None` when the
/// host is no Service of the manifests.
pub(crate) fn service_backend(
    docs: &[(PathBuf, Value)],
    pods: &[PodTemplate],
    url: &str,
) -> Option<(PodTemplate, u16)> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().ok()?),
        None => (authority, if scheme == "https" { 443 } else { 80 }),
    };
    let mut labels = host.split('.');
    let name = labels.next()?;
    if labels
        .next()
        .is_some_and(|namespace| namespace != NAMESPACE)
    {
        return None;
    }
    let service = docs.iter().map(|(_, d)| d).find(|d| {
        str_at(d, &["kind"]) == Some("Service") && str_at(d, &["metadata", "name"]) == Some(name)
    })?;
    let selector = labels_at(&service["spec"]["selector"]);
    let pod = pods
        .iter()
        .find(|p| selector.iter().all(|(k, v)| p.labels.get(k) == Some(v)))?;
    let entry = service["spec"]["ports"]
        .as_sequence()?
        .iter()
        .find(|p| p["port"].as_u64() == Some(port as u64))?;
    let target = match &entry["targetPort"] {
        Value::Number(number) => number.as_u64()? as u16,
        Value::String(named) => containers(pod)
            .iter()
            .flat_map(|c| c["ports"].as_sequence().cloned().unwrap_or_default())
            .find(|p| str_at(p, &["name"]) == Some(named.as_str()))
            .and_then(|p| p["containerPort"].as_u64())? as u16,
        _ => port,
    };
    Some((pod.clone(), target))
}

/// Where a Leasehold container serves `/metrics`: `LH_METRICS_ADDR` where it
/// has one (the gateway), else its health listener `LH_HTTP_ADDR`.
pub(crate) fn metrics_port(container: &Value) -> Option<u16> {
    env_value(container, "LH_METRICS_ADDR")
        .or_else(|| env_value(container, "LH_HTTP_ADDR"))
        .map(|addr| port_of(&addr))
}

pub(crate) fn is_leasehold_container(container: &Value) -> bool {
    str_at(container, &["image"]).is_some_and(|image| image.starts_with("leasehold/"))
}

/// Whether a container runs the `lh` CLI (a Job that calls the API once),
/// which serves nothing and has no metrics.
pub(crate) fn is_cli_container(container: &Value) -> bool {
    str_at(container, &["image"]).is_some_and(|image| image.starts_with("leasehold/lh:"))
}
