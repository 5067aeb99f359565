//! What operators scrape and alert on stays well-formed:
//!
//! - every service's `/metrics`, scraped from a running platform after a
//!   lease ran, passes `promtool check metrics` (Prometheus' naming and
//!   help conventions), and shows the metrics the alert rules read;
//! - every metric the code records has its `# HELP` text declared;
//! - `deploy/prometheus/` passes `promtool check config`, `check rules` and
//!   the rule unit tests (`promtool test rules`).
//!
//! promtool comes from `make deps` (Debian's `prometheus` package). A
//! missing promtool fails the test, it never skips it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use lh_testkit::stack::{Stack, FLEET};
use lh_testkit::workspace_root;
use serde_json::json;

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
    "lh_events_stream_fill_ratio",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
];

/// promtool from `PATH`; panics with the fix when it is missing.
fn promtool() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("promtool"))
            .find(|candidate| candidate.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("promtool is not installed (not on PATH): run `make deps` (scripts/deps.sh installs Debian's prometheus package)")
    })
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

/// Names the code records with the `metrics` macros, from the source.
fn recorded_metric_names() -> Vec<(String, PathBuf)> {
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
            for macro_name in ["counter!(", "gauge!(", "histogram!("] {
                let needle = format!("metrics::{macro_name}");
                for (at, _) in text.match_indices(&needle) {
                    let rest = text[at + needle.len()..].trim_start();
                    if let Some(quoted) = rest.strip_prefix('"') {
                        let name = quoted.split('"').next().unwrap().to_string();
                        names.push((name, path.clone()));
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
            .any(|(n, _)| n == "lh_scheduler_placements_total"),
        "the source scan found nothing: {recorded:?}"
    );
    let undescribed: Vec<String> = recorded
        .iter()
        .filter(|(name, _)| name != "lh_test_total" && !described.contains(&name.as_str()))
        .map(|(name, path)| format!("{name} ({})", path.display()))
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
