//! The layering of the workspace, checked over `cargo metadata`: a service
//! never links another service, and a library never links a service. A
//! caller reaches a service through its contract in `lh-rpc` or its events in
//! `lh-events`, never through the crate that implements it.

use std::path::{Path, PathBuf};
use std::process::Command;

use lh_testkit::workspace_root;
use serde_json::Value;

/// The one allowed exception: `lh-testkit`'s optional feature that starts
/// the whole platform for the system tests; nothing but tests turns it on.
const EXCEPTION_CRATE: &str = "lh-testkit";
const EXCEPTION_FEATURE: &str = "stack";

struct Package {
    name: String,
    dir: PathBuf,
    manifest: Value,
}

fn workspace_packages() -> Vec<Package> {
    let root = workspace_root();
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("metadata is JSON");
    metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| Package {
            name: p["name"].as_str().unwrap().to_string(),
            dir: Path::new(p["manifest_path"].as_str().unwrap())
                .parent()
                .unwrap()
                .strip_prefix(&root)
                .expect("a workspace member lies under the root")
                .to_path_buf(),
            manifest: p.clone(),
        })
        .collect()
}

/// `services` or `libs` for a crate directory under one of them.
fn layer(dir: &Path) -> Option<&'static str> {
    match dir.components().next()?.as_os_str().to_str()? {
        "services" => Some("services"),
        "libs" => Some("libs"),
        _ => None,
    }
}

/// Every dependency of `package` on a workspace crate under `services/`, as
/// `(dependency, kind)`; kind is `normal`, `dev` or `build`.
fn service_dependencies(package: &Package, root: &Path) -> Vec<(String, String, bool)> {
    package.manifest["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| {
            let path = Path::new(d["path"].as_str()?);
            let dir = path.strip_prefix(root).ok()?;
            (layer(dir) == Some("services")).then(|| {
                (
                    d["name"].as_str().unwrap().to_string(),
                    d["kind"].as_str().unwrap_or("normal").to_string(),
                    d["optional"].as_bool().unwrap_or(false),
                )
            })
        })
        .collect()
}

fn allowed_by_exception(package: &Package, dependency: &str, optional: bool) -> bool {
    if package.name != EXCEPTION_CRATE || !optional {
        return false;
    }
    let wanted = format!("dep:{dependency}");
    package.manifest["features"][EXCEPTION_FEATURE]
        .as_array()
        .is_some_and(|deps| deps.iter().any(|d| d.as_str() == Some(wanted.as_str())))
}

fn violations(packages: &[Package], root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for package in packages {
        let Some(layer) = layer(&package.dir) else {
            continue;
        };
        for (dependency, kind, optional) in service_dependencies(package, root) {
            let forbidden = match layer {
                // Tests of a service may start its peers; its code may not.
                "services" => kind != "dev",
                _ => !allowed_by_exception(package, &dependency, optional),
            };
            if forbidden {
                found.push(format!(
                    "{} ({}) has a {kind} dependency on the service crate {dependency}",
                    package.name,
                    package.dir.display()
                ));
            }
        }
    }
    found
}

#[test]
fn no_service_depends_on_another_and_no_library_on_a_service() {
    let root = workspace_root();
    let packages = workspace_packages();
    assert!(
        packages
            .iter()
            .filter(|p| layer(&p.dir) == Some("services"))
            .count()
            >= 6,
        "the services were not found under services/"
    );
    let found = violations(&packages, &root);
    assert!(found.is_empty(), "layering broken:\n{}", found.join("\n"));
}

#[test]
fn the_testkit_exception_covers_only_its_stack_feature() {
    let root = workspace_root();
    let packages = workspace_packages();
    let testkit = packages
        .iter()
        .find(|p| p.name == EXCEPTION_CRATE)
        .expect("lh-testkit is a member");
    let services = service_dependencies(testkit, &root);
    assert!(!services.is_empty(), "the stack feature links the services");
    for (dependency, _, optional) in services {
        assert!(
            allowed_by_exception(testkit, &dependency, optional),
            "{dependency} is linked outside the `{EXCEPTION_FEATURE}` feature"
        );
    }
}

#[test]
fn a_service_linking_a_service_or_a_library_linking_one_is_reported() {
    let root = Path::new("/ws");
    let package = |name: &str, dir: &str, deps: Value, features: Value| Package {
        name: name.into(),
        dir: dir.into(),
        manifest: serde_json::json!({"dependencies": deps, "features": features}),
    };
    let pricing =
        serde_json::json!({"name": "lh-pricing", "path": "/ws/services/pricing", "kind": null});
    let optional_pricing = serde_json::json!({
        "name": "lh-pricing", "path": "/ws/services/pricing", "kind": null, "optional": true
    });
    let dev_pricing =
        serde_json::json!({"name": "lh-pricing", "path": "/ws/services/pricing", "kind": "dev"});
    let packages = [
        package(
            "lh-gateway",
            "services/gateway",
            serde_json::json!([pricing]),
            Value::Null,
        ),
        package(
            "lh-audit",
            "services/audit",
            serde_json::json!([dev_pricing]),
            Value::Null,
        ),
        package(
            "lh-domain",
            "libs/domain",
            serde_json::json!([optional_pricing]),
            Value::Null,
        ),
        package(
            EXCEPTION_CRATE,
            "libs/testkit",
            serde_json::json!([optional_pricing]),
            serde_json::json!({EXCEPTION_FEATURE: ["dep:lh-pricing"]}),
        ),
    ];
    let found = violations(&packages, root);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("lh-gateway "), "{found:?}");
    assert!(found[1].starts_with("lh-domain "), "{found:?}");
}

/// Crates whose code takes data and time as arguments and does no I/O.
const PURE_CRATES: &[&str] = &["lh-events", "lh-placement", "lh-placement-lab", "lh-domain"];
/// What only the plumbing and the services may link: the bus, the database,
/// the runtime, the web server.
const IO_CRATES: &[&str] = &[
    "lh-bus",
    "lh-projection",
    "lh-service",
    "async-nats",
    "sqlx",
    "tokio",
    "axum",
];

#[test]
fn pure_crates_never_reach_the_bus_the_database_or_the_runtime() {
    let packages = workspace_packages();
    let mut found = Vec::new();
    for name in PURE_CRATES {
        let package = packages
            .iter()
            .find(|p| p.name == *name)
            .unwrap_or_else(|| panic!("{name} is a member"));
        for d in package.manifest["dependencies"].as_array().unwrap() {
            let dependency = d["name"].as_str().unwrap();
            let normal = d["kind"].is_null();
            if normal && IO_CRATES.contains(&dependency) {
                found.push(format!("{name} depends on {dependency}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a pure crate does I/O:\n{}",
        found.join("\n")
    );
}
