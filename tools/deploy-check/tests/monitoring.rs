//! Every service is watched the same way in both deployments: compose's
//! Prometheus and the k8s monitors scrape each service once under its job
//! name, the PrometheusRule is the rules file, and Grafana is provisioned.
//! Each check also breaks a copy and expects the problem to be named.

use std::collections::BTreeSet;

use lh_deploy_check::compose::{compose_image, scrape_target_mismatches};
use lh_deploy_check::manifests::{k8s_documents, str_at, yaml_documents};
use lh_deploy_check::monitoring::{
    alert_rules_file, scrape_problems, scrape_targets, ScrapeTarget,
};
use lh_deploy_check::workspace::workspace_root;
use serde_yaml_ng::Value;

#[test]
fn compose_prometheus_scrapes_every_service_and_grafana_loads_the_dashboards() {
    let root = workspace_root();
    let compose = yaml_documents(&root.join("docker-compose.yml")).remove(0);
    let prometheus_yml = yaml_documents(&root.join("deploy/prometheus/prometheus.yml")).remove(0);
    let problems = scrape_target_mismatches(&compose, &prometheus_yml);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // A target on the wrong port, or naming no service, is caught.
    let mut wrong = prometheus_yml.clone();
    wrong["scrape_configs"][0]["static_configs"][0]["targets"][0] = Value::from("gateway:8080");
    wrong["scrape_configs"][1]["static_configs"][0]["targets"][0] = Value::from("sheduler:9101");
    let problems = scrape_target_mismatches(&compose, &wrong);
    assert!(
        problems.iter().any(|p| p.contains("not on 0.0.0.0:8080"))
            && problems
                .iter()
                .any(|p| p.contains("sheduler is no compose service"))
            && problems
                .iter()
                .any(|p| p.contains("no scrape target for compose service scheduler")),
        "{problems:?}"
    );

    // So is an exporter no job scrapes.
    let mut unscraped = prometheus_yml.clone();
    unscraped["scrape_configs"]
        .as_sequence_mut()
        .unwrap()
        .retain(|job| str_at(job, &["job_name"]) != Some("postgres"));
    let problems = scrape_target_mismatches(&compose, &unscraped);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("no scrape target for compose service postgres-exporter")),
        "{problems:?}"
    );

    let services = &compose["services"];
    let volumes = |name: &str| -> Vec<String> {
        services[name]["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|m| m.as_str().map(str::to_string))
            .collect()
    };
    let pinned = |name: &str, repository: &str| {
        let image =
            compose_image(&services[name]).unwrap_or_else(|| panic!("compose has no {name} image"));
        let tag = image
            .strip_prefix(&format!("{repository}:"))
            .unwrap_or_else(|| panic!("compose {name} runs {image}, not {repository}"));
        assert!(
            tag.starts_with(|c: char| c.is_ascii_digit() || c == 'v') && tag.contains('.'),
            "compose {name}'s image tag {tag} is not a pinned version"
        );
    };

    pinned("prometheus", "prom/prometheus");
    pinned(
        "postgres-exporter",
        "quay.io/prometheuscommunity/postgres-exporter",
    );
    let command: Vec<&str> = services["prometheus"]["command"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        command.contains(&"--config.file=/etc/prometheus/prometheus.yml"),
        "{command:?}"
    );
    let mounts = volumes("prometheus");
    for mount in [
        "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro",
        // prometheus.yml loads rules/*.yml beside itself.
        "./deploy/prometheus/rules:/etc/prometheus/rules:ro",
    ] {
        assert!(
            mounts.iter().any(|m| m == mount),
            "prometheus lacks {mount}"
        );
    }

    pinned("grafana", "grafana/grafana");
    let mounts = volumes("grafana");
    assert!(
        mounts
            .iter()
            .any(|m| m == "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro"),
        "grafana is not provisioned from deploy/grafana/provisioning: {mounts:?}"
    );
    let provider =
        yaml_documents(&root.join("deploy/grafana/provisioning/dashboards/leasehold.yml"))
            .remove(0);
    let path = str_at(&provider["providers"][0], &["options", "path"]).expect("provider path");
    assert!(
        mounts
            .iter()
            .any(|m| *m == format!("./deploy/grafana/dashboards:{path}:ro")),
        "the dashboards provider reads {path}, where compose mounts no deploy/grafana/dashboards: {mounts:?}"
    );
    let datasources =
        yaml_documents(&root.join("deploy/grafana/provisioning/datasources/prometheus.yml"))
            .remove(0);
    let source = &datasources["datasources"][0];
    assert_eq!(str_at(source, &["uid"]), Some("prometheus"));
    assert_eq!(str_at(source, &["url"]), Some("http://prometheus:9090"));
    let password = str_at(
        &services["grafana"],
        &["environment", "GF_SECURITY_ADMIN_PASSWORD"],
    );
    assert!(
        password.is_some_and(|p| p.starts_with("${LH_GRAFANA_ADMIN_PASSWORD")),
        "grafana's admin password does not come from LH_GRAFANA_ADMIN_PASSWORD: {password:?}"
    );

    // Nothing is published beyond this machine.
    for (name, service) in services.as_mapping().unwrap() {
        for port in service["ports"].as_sequence().into_iter().flatten() {
            let port = port.as_str().unwrap_or_default();
            assert!(
                port.starts_with("127.0.0.1:"),
                "compose {} publishes {port} beyond 127.0.0.1",
                name.as_str().unwrap()
            );
        }
    }
}

#[test]
fn the_prometheus_rule_carries_exactly_the_alert_rules_file() {
    let rules = alert_rules_file();
    let carried: Vec<Value> = k8s_documents()
        .into_iter()
        .filter(|(_, doc)| str_at(doc, &["kind"]) == Some("PrometheusRule"))
        .map(|(_, doc)| doc["spec"].clone())
        .collect();
    assert_eq!(carried.len(), 1, "one PrometheusRule in k8s/");
    assert!(
        rules["groups"].as_sequence().is_some_and(|g| !g.is_empty()),
        "no rule groups in the rules file"
    );
    assert_eq!(
        carried[0], rules,
        "the PrometheusRule in k8s/40-monitoring.yaml differs from deploy/prometheus/rules/leasehold.rules.yml"
    );
}

#[test]
fn every_service_is_scraped_once_under_its_job_name() {
    let docs = k8s_documents();
    let problems = scrape_problems(&docs);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // Every job the alert rules name is one the monitors make.
    let jobs: BTreeSet<String> = scrape_targets(&docs).into_iter().map(|t| t.job).collect();
    let rules = serde_yaml_ng::to_string(&alert_rules_file()).unwrap();
    let named: BTreeSet<&str> = rules
        .split("job=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    assert!(!named.is_empty(), "the rules name no job");

    // Each PostgreSQL instance's exporter is scraped once, under the job
    // compose's Prometheus gives postgres_exporter.
    let targets = scrape_targets(&docs);
    let postgres: Vec<&ScrapeTarget> = targets
        .iter()
        .filter(|t| t.pod == "Cluster/postgres instance")
        .collect();
    assert!(
        matches!(postgres.as_slice(), [t] if t.port == 9187 && t.job == "postgres"),
        "the CloudNativePG instances are not scraped once on 9187 as job postgres: {postgres:?}"
    );
    for job in named {
        assert!(
            jobs.contains(job),
            "the rules read job {job:?}; k8s scrapes {jobs:?}"
        );
    }

    // A monitor on the wrong port, or one under another job name, is caught.
    let mutate = |kind: &str, name: &str, change: &dyn Fn(&mut Value)| {
        let mut docs = docs.clone();
        let (_, doc) = docs
            .iter_mut()
            .find(|(_, d)| {
                str_at(d, &["kind"]) == Some(kind) && str_at(d, &["metadata", "name"]) == Some(name)
            })
            .unwrap_or_else(|| panic!("no {kind}/{name}"));
        change(doc);
        scrape_problems(&docs)
    };
    let problems = mutate("PodMonitor", "gateway", &|d| {
        d["spec"]["podMetricsEndpoints"][0]["port"] = Value::from("http");
    });
    assert!(
        problems
            .iter()
            .any(|p| p.contains("Deployment/gateway :9100 is scraped by no monitor"))
            && problems
                .iter()
                .any(|p| p.contains("where nothing serves /metrics")),
        "{problems:?}"
    );
    let problems = mutate("PodMonitor", "node-agent", &|d| {
        d["spec"].as_mapping_mut().unwrap().remove("jobLabel");
    });
    assert!(
        problems
            .iter()
            .any(|p| p.contains("as job \"leasehold/node-agent\"")),
        "{problems:?}"
    );
}
