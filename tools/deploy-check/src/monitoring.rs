//! The Prometheus Operator's view of the manifests: which pod and port each
//! ServiceMonitor and PodMonitor scrapes under which job name, resolved the
//! way the operator resolves them, and what is wrong with that for the
//! Leasehold containers; plus the alert rules the PrometheusRule carries.

use std::path::PathBuf;

use serde_yaml_ng::Value;

use crate::k8s::{
    containers, is_cli_container, is_leasehold_container, labels_at, metrics_port, pod_templates,
    selects, PodTemplate, NAMESPACE,
};
use crate::manifests::{str_at, yaml_documents};
use crate::workspace::workspace_root;

/// The named ports of every CloudNativePG instance: PostgreSQL, the
/// instance manager's status, and its metrics exporter (`cnpg_*` series).
const CNPG_INSTANCE_PORTS: &[(&str, u16)] =
    &[("postgresql", 5432), ("status", 8000), ("metrics", 9187)];

/// A scrape target: which pod, which port, under which job name.
#[derive(Debug)]
pub struct ScrapeTarget {
    pub pod: String,
    pub port: u16,
    pub job: String,
    pub monitor: String,
}

/// The targets the ServiceMonitors and PodMonitors of `docs` make of the
/// pods of `docs`, resolving ports by name the way the operator does.
pub fn scrape_targets(docs: &[(PathBuf, Value)]) -> Vec<ScrapeTarget> {
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
pub fn scrape_problems(docs: &[(PathBuf, Value)]) -> Vec<String> {
    let targets = scrape_targets(docs);
    let mut problems = Vec::new();
    for pod in pod_templates(docs) {
        for container in containers(&pod)
            .iter()
            .filter(|c| is_leasehold_container(c) && !is_cli_container(c))
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

pub fn alert_rules_file() -> Value {
    yaml_documents(&workspace_root().join("deploy/prometheus/rules/leasehold.rules.yml")).remove(0)
}
