//! The deployment files match the schemas of what reads them: compose the
//! Compose Specification, k8s/ the Kubernetes API and the vendored CRDs,
//! strictly. Each check also feeds the validator a misspelt file and
//! expects a refusal, so a pass means the validator looked.

use std::path::Path;
use std::process::Command;

use lh_deploy_check::command::{run, tool};
use lh_deploy_check::manifests::{k8s_documents, str_at};
use lh_deploy_check::schemas::{
    check_custom_resources, crd_json_schemas, is_built_in, KUBERNETES_VERSIONS,
};
use lh_deploy_check::workspace::workspace_root;
use serde_yaml_ng::Value;

#[test]
fn compose_file_matches_the_compose_specification() {
    let root = workspace_root();
    let checker = tool("check-jsonschema");
    let schema = root.join("deploy/schemas/compose-spec.json");
    let validate = |file: &Path| {
        run(Command::new(&checker)
            .args(["--color", "never", "--schemafile"])
            .arg(&schema)
            .arg(file))
    };

    let run = validate(&root.join("docker-compose.yml"));
    assert!(
        run.success,
        "docker-compose.yml does not match the Compose specification:\n{}",
        run.output
    );

    // The same check rejects a compose file with a misspelt key, so the pass
    // above means something.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("compose.yml");
    std::fs::write(
        &broken,
        "services:\n  web:\n    image: nginx\n    depends_onn: [db]\n",
    )
    .unwrap();
    let run = validate(&broken);
    assert!(
        !run.success,
        "a misspelt key passed the Compose schema:\n{}",
        run.output
    );
}

#[test]
fn kubernetes_manifests_match_the_kubernetes_api_schemas() {
    let validator = tool("kubernetes-validate");
    let dir = tempfile::tempdir().unwrap();
    let built_in_dir = dir.path().join("built-in");
    let custom_dir = dir.path().join("custom");
    std::fs::create_dir_all(&built_in_dir).unwrap();
    std::fs::create_dir_all(&custom_dir).unwrap();

    let mut built_in = Vec::new();
    let mut custom = Vec::new();
    for (index, (file, doc)) in k8s_documents().into_iter().enumerate() {
        let origin = format!(
            "{} {}/{}",
            file.strip_prefix(workspace_root()).unwrap().display(),
            str_at(&doc, &["kind"]).unwrap_or_default(),
            str_at(&doc, &["metadata", "name"]).unwrap_or_default()
        );
        if is_built_in(&doc) {
            let path = built_in_dir.join(format!(
                "{index:03}-{}.json",
                origin.replace(['/', ' '], "_")
            ));
            std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
            built_in.push(path);
        } else {
            custom.push((origin, doc));
        }
    }
    assert!(!built_in.is_empty() && !custom.is_empty());

    for version in KUBERNETES_VERSIONS {
        let run = run(Command::new(&validator)
            .args(["--strict", "--kubernetes-version", version])
            .args(&built_in));
        // WARN: a kind without a schema, i.e. not checked at all.
        let unchecked: Vec<&str> = run
            .output
            .lines()
            .filter(|line| line.starts_with("WARN") || line.starts_with("ERROR"))
            .collect();
        assert!(
            run.success && unchecked.is_empty(),
            "k8s/ is not valid for Kubernetes {version}:\n{}",
            run.output
        );
    }

    let schemas = crd_json_schemas(&dir.path().join("schemas"));
    let failures = check_custom_resources(&schemas, &custom, &custom_dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for kind in ["Cluster", "ServiceMonitor", "PodMonitor", "PrometheusRule"] {
        assert!(
            custom
                .iter()
                .any(|(_, doc)| str_at(doc, &["kind"]) == Some(kind)),
            "k8s/ has no {kind}"
        );
    }

    // A misspelt field fails strict validation, so the pass above means something.
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  portz:\n    - port: 80\n",
    )
    .unwrap();
    let run = run(Command::new(&validator).arg("--strict").arg(&broken));
    assert!(
        !run.success,
        "a misspelt field passed strict validation:\n{}",
        run.output
    );

    // And so do a misspelt field in a custom resource, at the top of its
    // spec and deep in it, and a custom kind without a vendored CRD.
    let find = |kind: &str| {
        custom
            .iter()
            .find(|(_, doc)| str_at(doc, &["kind"]) == Some(kind))
            .unwrap_or_else(|| panic!("no {kind}"))
            .1
            .clone()
    };
    let mut misspelt_cluster = find("Cluster");
    let instances = misspelt_cluster["spec"]
        .as_mapping_mut()
        .unwrap()
        .remove("instances")
        .expect("instances");
    misspelt_cluster["spec"]["instancez"] = instances;
    let mut misspelt_role = find("Cluster");
    misspelt_role["spec"]["managed"]["roles"][0]["passwordSecrett"] =
        misspelt_role["spec"]["managed"]["roles"][0]["passwordSecret"].clone();
    let mut misspelt_monitor = find("ServiceMonitor");
    misspelt_monitor["spec"]["endpoints"][0]["intervall"] = Value::from("15s");
    let mut misspelt_rule = find("PrometheusRule");
    misspelt_rule["spec"]["groups"][0]["rules"][0]["expresion"] = Value::from("up == 0");
    let mut unknown_kind = find("ServiceMonitor");
    unknown_kind["kind"] = Value::from("ServiceMonitr");
    for (index, what, doc) in [
        ("a Cluster's spec.instancez", misspelt_cluster),
        ("a Cluster's managed role passwordSecrett", misspelt_role),
        ("a ServiceMonitor endpoint's intervall", misspelt_monitor),
        ("a PrometheusRule rule's expresion", misspelt_rule),
        ("a ServiceMonitr", unknown_kind),
    ]
    .into_iter()
    .enumerate()
    .map(|(index, (what, doc))| (index, what, doc))
    {
        let broken_dir = dir.path().join(format!("broken-{index}"));
        std::fs::create_dir_all(&broken_dir).unwrap();
        let failures = check_custom_resources(&schemas, &[(what.to_string(), doc)], &broken_dir);
        assert!(!failures.is_empty(), "{what} passed validation");
    }
}
