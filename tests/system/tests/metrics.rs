//! What operators scrape and alert on stays well-formed:
//!
//! - every service's `/metrics`, scraped from a running platform after a
//!   lease ran, passes `promtool check metrics` (Prometheus' naming and
//!   help conventions), and shows the metrics the alert rules read;
//! - every metric the code records has its `# HELP` text declared;
//! - `deploy/prometheus/` passes `promtool check config`, `check rules` and
//!   the rule unit tests (`promtool test rules`);
//! - every Grafana dashboard in `deploy/grafana/dashboards/` parses, has its
//!   own uid and title, reads the provisioned Prometheus data source, asks
//!   only for metrics the code records, and each query passes promtool's
//!   PromQL parser (as a recording rule, Grafana's variables substituted);
//!   the exporters' metrics they read are listed ([`POSTGRES_EXPORTER_METRICS`],
//!   [`CNPG_EXPORTER_METRICS`]), and postgres_exporter, run against a real
//!   PostgreSQL, shows every `pg_*` one of its list.
//!
//! promtool and postgres_exporter come from `make deps` (Debian's
//! `prometheus` and `prometheus-postgres-exporter` packages). A missing one
//! fails the test, it never skips it.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use lh_node_agent::gpu::usage::DCGM_FAMILIES;
use lh_test_stack::{Stack, FLEET};
use lh_testkit::workspace_root;
use serde_json::{json, Value};

/// dcgm-exporter's own label names (`modelName`): dashboards built for it
/// read them, so the node-agent keeps them. The only finding let through.
const DCGM_LABEL_FINDING: &str = "label names should be written in 'snake_case' not 'camelCase'";

/// Metrics the alert rules and dashboards read; each must be on `/metrics`
/// once a lease has run.
const EXPECTED: &[&str] = &[
    "lh_scheduler_queue_wait_seconds_bucket",
    "lh_scheduler_placements_total",
    "lh_scheduler_fragmented_gpu_milli",
    "lh_scheduler_waiting_leases",
    "lh_spot_leases_ended_total",
    "lh_spot_price_cny_per_gigabyte_hour",
    "lh_events_stream_fill_ratio",
    "lh_nats_connected",
    "lh_nats_connection_events_total",
    "lh_stream_messages",
    "lh_stream_consumers",
    "lh_stream_replicas_lagging",
    "lh_stream_read_timestamp_seconds",
    "lh_tenant_lease_seconds_total",
    "lh_tenant_interrupted_lease_seconds_total",
    "lh_node_gpu_health",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
];

/// postgres_exporter's metrics (compose's job `postgres`) that dashboards
/// and alerts may read: the code does not record them, so they are listed
/// here, and `postgres_exporter_shows_every_pg_metric_the_dashboards_read`
/// scrapes a real exporter for each. Its stable, default-collector names only.
const POSTGRES_EXPORTER_METRICS: &[&str] = &[
    "pg_up",
    "pg_stat_database_numbackends",
    "pg_stat_database_xact_commit",
    "pg_stat_database_deadlocks",
    "pg_database_size_bytes",
];

/// CloudNativePG's exporter's metrics (k8s' job `postgres`, from its
/// default monitoring queries) that dashboards and alerts may read: listed,
/// not scraped here (it runs inside the operator's instances only).
const CNPG_EXPORTER_METRICS: &[&str] = &[
    "cnpg_collector_up",
    "cnpg_backends_total",
    "cnpg_pg_stat_database_xact_commit",
    "cnpg_pg_stat_database_deadlocks",
    "cnpg_pg_database_size_bytes",
];

/// A tool from `PATH`, by any of its names; panics with the fix when it is
/// missing.
fn tool(names: &[&str], package: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
            .find(|candidate| candidate.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("{} is not installed (not on PATH): run `make deps` (scripts/deps.sh installs Debian's {package} package)", names[0])
    })
}

fn promtool() -> PathBuf {
    tool(&["promtool"], "prometheus")
}

struct Run {
    success: bool,
    output: String,
}

fn run(command: &mut Command, stdin: Option<&str>) -> Run {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("running {command:?}: {err}"));
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let output = child.wait_with_output().unwrap();
    Run {
        success: output.status.success(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

/// promtool's findings on a scrape, less the DCGM label names.
fn lint(promtool: &Path, text: &str) -> Vec<String> {
    let run = run(
        Command::new(promtool).args(["check", "metrics"]),
        Some(text),
    );
    let findings: Vec<String> = run
        .output
        .lines()
        .filter(|line| !line.trim().is_empty())
        .filter(|line| !(line.starts_with("DCGM_FI_") && line.ends_with(DCGM_LABEL_FINDING)))
        .map(str::to_string)
        .collect();
    assert!(
        run.success || !run.output.trim().is_empty(),
        "promtool check metrics failed without a word"
    );
    findings
}

#[test]
fn promtool_flags_a_metric_against_the_conventions() {
    // What the scrape test below lets through is this one finding: anything
    // else promtool says fails it.
    let promtool = promtool();
    let bad = "# TYPE lh_leases_placed counter\nlh_leases_placed 3\n";
    let findings = lint(&promtool, bad);
    assert!(
        findings.iter().any(|f| f.contains("_total")),
        "promtool did not flag a counter without _total: {findings:?}"
    );
    assert!(
        findings.iter().any(|f| f.contains("no help text")),
        "promtool did not flag a metric without help: {findings:?}"
    );
    let dcgm = "# HELP DCGM_FI_DEV_GPU_TEMP t\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{modelName=\"x\"} 50\n";
    assert_eq!(lint(&promtool, dcgm), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_service_s_metrics_pass_promtool_after_a_lease_ran() {
    let promtool = promtool();
    let stack = Stack::start(FLEET).await;
    let (_, key) = stack.create_tenant("acme", 16).await;
    stack
        .running(
            &key,
            json!({"gpus": 1, "gpu_model": "A100-40GB", "tier": "basic"}),
        )
        .await;

    let scrape = |name: String| {
        let url = format!("http://{}/metrics", stack.metrics_addr(&name));
        let http = stack.http.clone();
        async move {
            let text = http.get(url).send().await.unwrap().text().await.unwrap();
            (name, text)
        }
    };
    // The node-agents render their GPU series on their next sample round,
    // and the audit service reads the log's fill at its start.
    let mut missing = EXPECTED.to_vec();
    for _ in 0..100 {
        let mut all = String::new();
        for name in stack.service_names() {
            all.push_str(&scrape(name).await.1);
        }
        missing.retain(|metric| !all.contains(&format!("\n{metric}")));
        if missing.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(missing.is_empty(), "not on any /metrics: {missing:?}");

    for name in stack.service_names() {
        let (name, text) = scrape(name).await;
        assert!(text.contains("# HELP "), "{name}: {text}");
        let findings = lint(&promtool, &text);
        assert!(
            findings.is_empty(),
            "{name}'s /metrics breaks Prometheus' conventions:\n{}\n--- scraped:\n{text}",
            findings.join("\n")
        );
    }
}

/// Names the code records with the `metrics` macros, from the source, with
/// the macro that records each (`counter`, `gauge`, `histogram`).
fn recorded_metric_names() -> Vec<(String, &'static str, PathBuf)> {
    let mut names = Vec::new();
    let mut dirs = vec![
        workspace_root().join("services"),
        workspace_root().join("libs"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "tests") {
                    dirs.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for kind in ["counter", "gauge", "histogram"] {
                let needle = format!("metrics::{kind}!(");
                for (at, _) in text.match_indices(&needle) {
                    let rest = text[at + needle.len()..].trim_start();
                    if let Some(quoted) = rest.strip_prefix('"') {
                        let name = quoted.split('"').next().unwrap().to_string();
                        names.push((name, kind, path.clone()));
                    }
                }
            }
        }
    }
    names
}

#[test]
fn every_recorded_metric_has_help_text() {
    let described: Vec<&str> = [
        lh_service::METRICS,
        lh_bus::METRICS,
        lh_projection::METRICS,
        lh_gateway::METRICS,
        lh_scheduler::METRICS,
        lh_node_agent::METRICS,
        lh_pricing::METRICS,
        lh_spot_broker::METRICS,
        lh_audit::METRICS,
    ]
    .iter()
    .flat_map(|list| list.iter().map(|(name, _)| *name))
    .chain(["lh_http_connections_refused_total"])
    .collect();
    let recorded = recorded_metric_names();
    assert!(
        recorded
            .iter()
            .any(|(n, _, _)| n == "lh_scheduler_placements_total"),
        "the source scan found nothing: {recorded:?}"
    );
    let undescribed: Vec<String> = recorded
        .iter()
        .filter(|(name, _, _)| name != "lh_test_total" && !described.contains(&name.as_str()))
        .map(|(name, _, path)| format!("{name} ({})", path.display()))
        .collect();
    assert!(
        undescribed.is_empty(),
        "metrics without help text (add them to the crate's METRICS): {undescribed:?}"
    );
}

#[test]
fn prometheus_config_rules_and_rule_tests_pass_promtool() {
    let promtool = promtool();
    let dir = workspace_root().join("deploy/prometheus");
    let check = |args: &[&str]| {
        let run = run(Command::new(&promtool).args(args).current_dir(&dir), None);
        assert!(
            run.success,
            "promtool {} failed:\n{}",
            args.join(" "),
            run.output
        );
        run.output
    };
    check(&["check", "config", "prometheus.yml"]);
    check(&["check", "rules", "rules/leasehold.rules.yml"]);
    let mut tests: Vec<String> = std::fs::read_dir(dir.join("tests"))
        .expect("deploy/prometheus/tests exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml"))
        .map(|p| format!("tests/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    tests.sort();
    assert!(
        !tests.is_empty(),
        "no rule tests in deploy/prometheus/tests"
    );
    let mut args = vec!["test", "rules"];
    args.extend(tests.iter().map(String::as_str));
    let output = check(&args);
    assert!(output.contains("SUCCESS"), "{output}");

    // Every alert of the rules file is tested firing.
    let rules = std::fs::read_to_string(dir.join("rules/leasehold.rules.yml")).unwrap();
    let tested: String = tests
        .iter()
        .map(|t| std::fs::read_to_string(dir.join(t)).unwrap())
        .collect();
    for alert in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(str::trim)
    {
        assert!(
            tested.contains(&format!("alertname: {alert}")),
            "alert {alert} has no rule test"
        );
    }

    // A rule test that expects the wrong thing fails, so the pass above
    // means something.
    let scratch = tempfile::tempdir().unwrap();
    let broken = scratch.path().join("broken.yml");
    std::fs::write(
        &broken,
        format!(
            "rule_files: [{}]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n      - series: 'lh_events_stream_fill_ratio'\n        values: '0.1x20'\n    alert_rule_test:\n      - eval_time: 15m\n        alertname: EventLogFilling\n        exp_alerts:\n          - exp_labels: {{severity: warning}}\n",
            dir.join("rules/leasehold.rules.yml").display()
        ),
    )
    .unwrap();
    let run = run(
        Command::new(&promtool).args(["test", "rules"]).arg(&broken),
        None,
    );
    assert!(
        !run.success,
        "a rule test expecting a false alert passed:\n{}",
        run.output
    );
}

/// The data source every dashboard panel reads, by the uid Grafana is
/// provisioned with (deploy/grafana/provisioning/datasources/prometheus.yml).
const DATASOURCE_UID: &str = "prometheus";

/// The dashboards the platform ships, by file name under
/// `deploy/grafana/dashboards/`.
const DASHBOARDS: &[&str] = &[
    "fleet.json",
    "tenants.json",
    "scheduler.json",
    "billing.json",
    "platform.json",
];

/// Metric names a dashboard may read: those the code records (a histogram
/// with the suffixes of its series), and the node-agent's DCGM-named
/// families, which it renders itself.
fn readable_metric_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (name, kind, _) in recorded_metric_names() {
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
        names.insert(name);
    }
    names.extend(DCGM_FAMILIES.iter().map(|(name, _, _)| name.to_string()));
    names.extend(
        POSTGRES_EXPORTER_METRICS
            .iter()
            .chain(CNPG_EXPORTER_METRICS)
            .map(|name| name.to_string()),
    );
    names
}

/// Prefixes of the metric names a query is checked for: Leasehold's, the
/// DCGM-named, and the PostgreSQL exporters' (Prometheus' own series such
/// as `up` are let through).
const CHECKED_PREFIXES: &[&str] = &["lh_", "DCGM_", "pg_", "cnpg_"];

/// The metric names a query reads that must be known: identifiers with one
/// of [`CHECKED_PREFIXES`].
fn metric_names_in(query: &str) -> Vec<&str> {
    query
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| CHECKED_PREFIXES.iter().any(|p| word.starts_with(p)))
        .collect()
}

/// A query with Grafana's variables replaced by values PromQL accepts:
/// the built-in intervals (`$__rate_interval`, `$__range`...) by `5m`,
/// the dashboard's own (`$node`, `${tenant}`) by the regex `.*`.
fn with_grafana_variables_substituted(query: &str) -> String {
    let mut out = String::new();
    let mut rest = query;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = match after
            .strip_prefix('{')
            .and_then(|b| Some((b, b.find('}')?)))
        {
            Some((braced, end)) => (&braced[..end], &braced[end + 1..]),
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        // `${name:format}` names the variable before the colon.
        let name = name.split(':').next().unwrap_or_default();
        out.push_str(match name {
            "" => "$",
            builtin if builtin.starts_with("__") => "5m",
            _ => ".*",
        });
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// A dashboard's panels, those inside collapsed rows included.
fn panels_of(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(panel);
        out.extend(panel["panels"].as_array().into_iter().flatten());
    }
    out
}

/// What is wrong with a set of dashboards (file name, JSON), short of
/// PromQL syntax, and every expression they query with where it is.
fn dashboard_findings(
    dashboards: &[(String, Value)],
    readable: &BTreeSet<String>,
) -> (Vec<String>, Vec<(String, String)>) {
    let mut findings = Vec::new();
    let mut exprs = Vec::new();
    let mut uids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    for (file, dashboard) in dashboards {
        let uid = dashboard["uid"].as_str().unwrap_or_default();
        let title = dashboard["title"].as_str().unwrap_or_default();
        if uid.is_empty() || !uids.insert(uid.to_string()) {
            findings.push(format!(
                "{file}: uid {uid:?} is empty or another dashboard's"
            ));
        }
        if title.is_empty() || !titles.insert(title.to_string()) {
            findings.push(format!(
                "{file}: title {title:?} is empty or another dashboard's"
            ));
        }
        if dashboard["schemaVersion"].as_u64().is_none() {
            findings.push(format!("{file}: no schemaVersion"));
        }
        let known = |query: &str, at: &str, findings: &mut Vec<String>| {
            for name in metric_names_in(query) {
                if !readable.contains(name) {
                    findings.push(format!("{at}: {name} is no metric the code records"));
                }
            }
        };
        for variable in dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let at = format!("{file}: variable {}", variable["name"]);
            if variable["type"] != "query" {
                continue;
            }
            if variable["datasource"]["uid"] != DATASOURCE_UID {
                findings.push(format!("{at} reads no datasource {DATASOURCE_UID:?}"));
            }
            let query = variable["query"]["query"]
                .as_str()
                .or(variable["query"].as_str())
                .unwrap_or_default();
            known(query, &at, &mut findings);
        }
        let mut ids = BTreeSet::new();
        for panel in panels_of(dashboard) {
            let at = format!("{file}: panel {}", panel["title"]);
            if !ids.insert(panel["id"].as_u64()) {
                findings.push(format!("{at}: id {} is missing or repeated", panel["id"]));
            }
            if panel["type"] == "row" {
                continue;
            }
            if panel["datasource"]["uid"] != DATASOURCE_UID {
                findings.push(format!("{at} reads no datasource {DATASOURCE_UID:?}"));
            }
            let targets = panel["targets"].as_array().cloned().unwrap_or_default();
            if targets.is_empty() {
                findings.push(format!("{at} queries nothing"));
            }
            for target in &targets {
                if !target["datasource"].is_null() && target["datasource"]["uid"] != DATASOURCE_UID
                {
                    findings.push(format!("{at}: a query reads another datasource"));
                }
                let expr = target["expr"].as_str().unwrap_or_default();
                if expr.trim().is_empty() {
                    findings.push(format!("{at}: a query without expr"));
                }
                known(expr, &at, &mut findings);
                exprs.push((at.clone(), expr.to_string()));
            }
        }
    }
    (findings, exprs)
}

/// `promtool check rules` over the expressions, each as a recording rule
/// (promtool has no command that checks a bare expression).
fn check_promql(promtool: &Path, exprs: &[(String, String)]) -> Run {
    let rules: Vec<Value> = exprs
        .iter()
        .enumerate()
        .map(|(n, (_, expr))| {
            json!({
                "record": format!("dashboard:check:{n}"),
                "expr": with_grafana_variables_substituted(expr),
            })
        })
        .collect();
    let file = json!({"groups": [{"name": "dashboards", "rules": rules}]});
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("dashboards.rules.yml");
    std::fs::write(&path, serde_yaml_ng::to_string(&file).unwrap()).unwrap();
    let mut run = run(
        Command::new(promtool).args(["check", "rules"]).arg(&path),
        None,
    );
    if !run.success {
        // Which panel each numbered rule came from.
        for (n, (at, expr)) in exprs.iter().enumerate() {
            run.output
                .push_str(&format!("\ndashboard:check:{n} = {at}: {expr}"));
        }
    }
    run
}

#[test]
fn every_dashboard_is_well_formed_and_reads_only_recorded_metrics() {
    let promtool = promtool();
    let dir = workspace_root().join("deploy/grafana/dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/grafana/dashboards exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let dashboards: Vec<(String, Value)> = files
        .iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(path).unwrap();
            let json =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
            (name, json)
        })
        .collect();
    for expected in DASHBOARDS {
        assert!(
            dashboards.iter().any(|(name, _)| name == expected),
            "deploy/grafana/dashboards has no {expected}"
        );
    }

    let (findings, exprs) = dashboard_findings(&dashboards, &readable_metric_names());
    assert!(findings.is_empty(), "{}", findings.join("\n"));
    for (name, dashboard) in &dashboards {
        assert!(
            exprs
                .iter()
                .any(|(at, _)| at.starts_with(&format!("{name}:"))),
            "{name} has no queries"
        );
        assert!(
            panels_of(dashboard).len() >= 4,
            "{name} shows almost nothing"
        );
    }
    let run = check_promql(&promtool, &exprs);
    assert!(
        run.success,
        "a dashboard query is not valid PromQL:\n{}",
        run.output
    );
    assert!(
        run.output
            .contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "promtool checked fewer queries than the dashboards hold:\n{}",
        run.output
    );
}

#[test]
fn the_dashboard_checks_catch_a_wrong_metric_a_wrong_datasource_and_broken_promql() {
    let promtool = promtool();
    let readable = readable_metric_names();
    let dashboard = |uid: &str, datasource: &str, expr: &str| {
        json!({
            "uid": uid, "title": format!("t-{uid}"), "schemaVersion": 39,
            "templating": {"list": [{"name": "node", "type": "query",
                "datasource": {"type": "prometheus", "uid": "prometheus"},
                "query": {"query": "label_values(DCGM_FI_DEV_GPU_TEMP, Hostname)"}}]},
            "panels": [{"id": 1, "type": "row", "title": "r", "panels": [
                {"id": 2, "type": "timeseries", "title": "p",
                 "datasource": {"type": "prometheus", "uid": datasource},
                 "targets": [{"refId": "A", "expr": expr}]}]}]
        })
    };
    let findings = |boards: Vec<Value>| {
        let named: Vec<(String, Value)> = boards
            .into_iter()
            .enumerate()
            .map(|(n, b)| (format!("{n}.json"), b))
            .collect();
        dashboard_findings(&named, &readable)
    };

    let good = [
        "histogram_quantile(0.95, sum by (le) (rate(lh_scheduler_queue_wait_seconds_bucket[$__rate_interval])))",
        "max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP{Hostname=~\"${node}\"}) and on() up",
        "sum by (tier) (increase(lh_charged_fen_total[$__range])) / 100",
        "sum(rate(pg_stat_database_xact_commit[$__rate_interval])) or sum(rate(cnpg_pg_stat_database_xact_commit[$__rate_interval]))",
    ];
    let boards = good
        .iter()
        .enumerate()
        .map(|(n, e)| dashboard(&format!("u{n}"), "prometheus", e))
        .collect();
    let (found, exprs) = findings(boards);
    assert_eq!(found, Vec::<String>::new());
    assert_eq!(exprs.len(), good.len(), "{exprs:?}");
    assert!(check_promql(&promtool, &exprs).success);

    for (board, wanted) in [
        (
            dashboard("a", "prometheus", "rate(lh_scheduler_placement_total[5m])"),
            "lh_scheduler_placement_total is no metric",
        ),
        (
            dashboard(
                "a",
                "prometheus",
                "rate(lh_scheduler_placements_total_bucket[5m])",
            ),
            "lh_scheduler_placements_total_bucket is no metric",
        ),
        (
            dashboard("a", "prometheus", "DCGM_FI_DEV_MEM_COPY_UTIL"),
            "DCGM_FI_DEV_MEM_COPY_UTIL is no metric",
        ),
        (
            dashboard("a", "prometheus", "pg_stat_database_blks_hit"),
            "pg_stat_database_blks_hit is no metric",
        ),
        (
            dashboard("a", "prometheus", "cnpg_pg_replication_lag"),
            "cnpg_pg_replication_lag is no metric",
        ),
        (
            dashboard("a", "grafana", "lh_scheduler_waiting_leases"),
            "reads no datasource",
        ),
    ] {
        let (found, _) = findings(vec![board]);
        assert!(
            found.iter().any(|f| f.contains(wanted)),
            "not flagged ({wanted}): {found:?}"
        );
    }
    let twins = vec![
        dashboard("same", "prometheus", "lh_scheduler_waiting_leases"),
        dashboard("same", "prometheus", "lh_scheduler_waiting_leases"),
    ];
    let (found, _) = findings(twins);
    assert!(
        found.iter().any(|f| f.contains("another dashboard's")),
        "{found:?}"
    );

    for broken in [
        "sum(rate(lh_scheduler_placements_total[5m])",
        "rate(lh_scheduler_placements_total)",
        "lh_scheduler_waiting_leases{Hostname=~\"$node}",
    ] {
        let exprs = vec![("broken".to_string(), broken.to_string())];
        let run = check_promql(&promtool, &exprs);
        assert!(!run.success, "promtool passed {broken}:\n{}", run.output);
    }
}

/// The metric families a Prometheus text scrape shows, by their `# TYPE`.
fn families_in(scrape: &str) -> BTreeSet<&str> {
    scrape
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect()
}

#[tokio::test]
async fn postgres_exporter_shows_every_pg_metric_the_dashboards_read() {
    let exporter = tool(
        &["prometheus-postgres-exporter", "postgres_exporter"],
        "prometheus-postgres-exporter",
    );
    let postgres = lh_testkit::Postgres::start().await.unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new(&exporter)
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .env(
            "DATA_SOURCE_NAME",
            format!("{}?sslmode=disable", postgres.admin_url()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let scrape = loop {
        if let Ok(response) = client.get(&url).send().await {
            let text = response.text().await.unwrap_or_default();
            // Up once it has reached the server, not only listening.
            if text.lines().any(|l| l.trim() == "pg_up 1") {
                break text;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "postgres_exporter did not show pg_up 1 within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    child.kill().await.ok();

    let shown = families_in(&scrape);
    let missing: Vec<&&str> = POSTGRES_EXPORTER_METRICS
        .iter()
        .filter(|name| !shown.contains(**name))
        .collect();
    assert!(
        missing.is_empty(),
        "postgres_exporter does not show {missing:?}; it shows:\n{}",
        shown.iter().copied().collect::<Vec<_>>().join("\n")
    );
    // The check can fail: a name the exporter has not is not shown.
    assert!(!shown.contains("pg_stat_database_commits"));
}
