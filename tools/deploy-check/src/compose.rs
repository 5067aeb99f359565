//! Compose's Prometheus against compose's services: each scrape target is
//! a service serving `/metrics` on that port, and every service and
//! exporter has a target. Kept apart from the Kubernetes monitors, which
//! resolve targets through selectors rather than host names.

use std::collections::BTreeSet;

use serde_yaml_ng::Value;

use crate::binaries::SERVICE_BINARIES;
use crate::manifests::str_at;

/// Compose services running a third-party exporter, by the image they run
/// (a version tag follows), with the port it serves `/metrics` on.
pub(crate) const COMPOSE_EXPORTERS: &[(&str, u16)] =
    &[("quay.io/prometheuscommunity/postgres-exporter:", 9187)];

/// Where each scrape target of a Prometheus config fails to meet a compose
/// service serving `/metrics` on that port, and which service binaries no
/// target scrapes. A service serves metrics on `LH_METRICS_ADDR` where it
/// has one (the gateway), else on its health listener `LH_HTTP_ADDR`.
pub fn scrape_target_mismatches(compose: &Value, prometheus: &Value) -> Vec<String> {
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
