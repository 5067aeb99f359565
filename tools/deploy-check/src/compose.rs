//! Compose's Prometheus against compose's services: each scrape target is
//! a service serving `/metrics` on that port, and every service and
//! exporter has a target. Kept apart from the Kubernetes monitors, which
//! resolve targets through selectors rather than host names. And what
//! compose makes of a value where our variables are unset, as with Docker.

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
            let image = compose_image(service).unwrap_or_default();
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
        let runs_an_exporter = compose_image(service).is_some_and(|image| {
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

/// A compose value as compose reads it where no variable is set: each
/// `${NAME:-default}` and `${NAME-default}` becomes its default, `$$` a
/// `$`. A reference without a default (`${NAME}`, `${NAME:?message}`) is
/// left as it is written, so a check that wants a value sees it has none.
pub fn compose_default(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("$$") {
            out.push('$');
            rest = after;
            continue;
        }
        let Some(end) = rest.strip_prefix("${").and_then(|r| r.find('}')) else {
            out.push('$');
            rest = &rest[1..];
            continue;
        };
        let body = &rest[2..2 + end];
        let default = body
            .split_once(":-")
            .or_else(|| body.split_once('-'))
            .filter(|(name, _)| {
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
            .map(|(_, default)| default);
        match default {
            Some(default) => out.push_str(default),
            None => out.push_str(&rest[..end + 3]),
        }
        rest = &rest[end + 3..];
    }
    out.push_str(rest);
    out
}

/// The image a compose service runs where no variable is set: the image
/// Docker users get (`${LH_NATS_IMAGE:-nats:2.15-alpine}` is nats:2.15-alpine).
pub fn compose_image(service: &Value) -> Option<String> {
    str_at(service, &["image"]).map(compose_default)
}

#[cfg(test)]
mod tests {
    use super::compose_default;

    #[test]
    fn defaults_replace_the_variables_they_follow() {
        assert_eq!(compose_default("nats:2.15-alpine"), "nats:2.15-alpine");
        assert_eq!(
            compose_default("${LH_NATS_IMAGE:-nats:2.15-alpine}"),
            "nats:2.15-alpine"
        );
        assert_eq!(compose_default("${X-postgres:15}"), "postgres:15");
        assert_eq!(
            compose_default("127.0.0.1:${LH_COMPOSE_PORT_PREFIX:-}8080:8080"),
            "127.0.0.1:8080:8080"
        );
        assert_eq!(compose_default("a $$b"), "a $b");
        assert_eq!(
            compose_default("${LH_ADMIN_TOKEN:?set it}"),
            "${LH_ADMIN_TOKEN:?set it}"
        );
        assert_eq!(compose_default("${NAME}"), "${NAME}");
    }
}
