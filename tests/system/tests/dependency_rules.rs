//! The layering of the workspace, checked over `cargo metadata`: a service
//! never links another service, and a library never links a service, not
//! even optionally or for its own tests. A caller reaches a service through
//! its contract in `lh-rpc` or its events in `lh-events`, never through the
//! crate that implements it.
//!
//! The crates that start services for tests (`tests/*`, among them the
//! `lh-test-stack` harness) and the load tests (`load-tests`) may link every
//! service; in turn no library links them, and a service only for its tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use lh_testkit::workspace_root;
use serde_json::Value;

/// The harness that starts the whole platform in one process.
const STACK_CRATE: &str = "lh-test-stack";

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

/// Where a crate sits, by its directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layer {
    /// `libs/`
    Library,
    /// `services/`
    Service,
    /// `tests/` and `load-tests/`: crates that run services to test them.
    Harness,
}

fn layer(dir: &Path) -> Option<Layer> {
    match dir.components().next()?.as_os_str().to_str()? {
        "services" => Some(Layer::Service),
        "libs" => Some(Layer::Library),
        "tests" | "load-tests" => Some(Layer::Harness),
        _ => None,
    }
}

/// A dependency on a workspace crate: its name, its kind (`normal`, `dev`
/// or `build`), whether it is optional, and the layer it sits in.
struct Dependency {
    name: String,
    kind: String,
    optional: bool,
    layer: Layer,
}

/// Every dependency of `package` on a workspace crate that sits in a layer.
fn workspace_dependencies(package: &Package, root: &Path) -> Vec<Dependency> {
    package.manifest["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| {
            let path = Path::new(d["path"].as_str()?);
            let layer = layer(path.strip_prefix(root).ok()?)?;
            Some(Dependency {
                name: d["name"].as_str().unwrap().to_string(),
                kind: d["kind"].as_str().unwrap_or("normal").to_string(),
                optional: d["optional"].as_bool().unwrap_or(false),
                layer,
            })
        })
        .collect()
}

/// Whether a crate in layer `from` may have `dependency`.
fn allowed(from: Layer, dependency: &Dependency) -> bool {
    match (from, dependency.layer) {
        (_, Layer::Library) => true,
        // Test and load-test crates run the services they test.
        (Layer::Harness, _) => true,
        // Tests of a service may start its peers; its code may not.
        (Layer::Service, _) => dependency.kind == "dev",
        // Not even optionally, nor for a library's own tests.
        (Layer::Library, _) => false,
    }
}

fn violations(packages: &[Package], root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for package in packages {
        let Some(from) = layer(&package.dir) else {
            continue;
        };
        for dependency in workspace_dependencies(package, root) {
            if allowed(from, &dependency) {
                continue;
            }
            let what = match dependency.layer {
                Layer::Service => "service",
                _ => "test",
            };
            found.push(format!(
                "{} ({}) has a {}{} dependency on the {what} crate {}",
                package.name,
                package.dir.display(),
                if dependency.optional { "optional " } else { "" },
                dependency.kind,
                dependency.name
            ));
        }
    }
    found
}

#[test]
fn no_service_depends_on_another_and_no_library_on_a_service() {
    let root = workspace_root();
    let packages = workspace_packages();
    let count = |wanted: Layer| {
        packages
            .iter()
            .filter(|p| layer(&p.dir) == Some(wanted))
            .count()
    };
    assert!(
        count(Layer::Service) >= 6,
        "the services were not found under services/"
    );
    assert!(
        count(Layer::Library) >= 10,
        "the libraries were not found under libs/"
    );
    for harness in ["lh-load-tests", STACK_CRATE, "lh-system-tests"] {
        let package = packages
            .iter()
            .find(|p| p.name == harness)
            .unwrap_or_else(|| panic!("{harness} is a member"));
        assert_eq!(
            layer(&package.dir),
            Some(Layer::Harness),
            "{harness} lies outside tests/ and load-tests/"
        );
    }
    let found = violations(&packages, &root);
    assert!(found.is_empty(), "layering broken:\n{}", found.join("\n"));
}

#[test]
fn the_stack_is_a_test_crate_that_only_test_crates_link() {
    let root = workspace_root();
    let packages = workspace_packages();
    let stack = packages
        .iter()
        .find(|p| p.name == STACK_CRATE)
        .expect("the stack is a member");
    assert!(
        workspace_dependencies(stack, &root)
            .iter()
            .any(|d| d.layer == Layer::Service),
        "the stack links the services"
    );
    let linking: Vec<&str> = packages
        .iter()
        .filter(|p| {
            workspace_dependencies(p, &root)
                .iter()
                .any(|d| d.name == STACK_CRATE)
        })
        .map(|p| p.name.as_str())
        .collect();
    assert!(!linking.is_empty(), "something runs the stack");
    for name in linking {
        let package = packages.iter().find(|p| p.name == name).unwrap();
        assert_eq!(
            layer(&package.dir),
            Some(Layer::Harness),
            "{name} links {STACK_CRATE} from outside tests/ and load-tests/"
        );
    }
}

#[test]
fn a_service_linking_a_service_or_a_library_linking_one_is_reported() {
    let root = Path::new("/ws");
    let package = |name: &str, dir: &str, deps: Value| Package {
        name: name.into(),
        dir: dir.into(),
        manifest: serde_json::json!({"dependencies": deps}),
    };
    let pricing =
        serde_json::json!({"name": "lh-pricing", "path": "/ws/services/pricing", "kind": null});
    let optional_pricing = serde_json::json!({
        "name": "lh-pricing", "path": "/ws/services/pricing", "kind": null, "optional": true
    });
    let dev_pricing =
        serde_json::json!({"name": "lh-pricing", "path": "/ws/services/pricing", "kind": "dev"});
    let dev_stack =
        serde_json::json!({"name": STACK_CRATE, "path": "/ws/tests/stack", "kind": "dev"});
    let packages = [
        package(
            "lh-gateway",
            "services/gateway",
            serde_json::json!([pricing]),
        ),
        package(
            "lh-audit",
            "services/audit",
            serde_json::json!([dev_pricing]),
        ),
        package(
            "lh-domain",
            "libs/domain",
            serde_json::json!([optional_pricing]),
        ),
        package(
            "lh-testkit",
            "libs/testkit",
            serde_json::json!([dev_pricing]),
        ),
        package("lh-bus", "libs/bus", serde_json::json!([dev_stack])),
        package("lh-load-tests", "load-tests", serde_json::json!([pricing])),
        package(STACK_CRATE, "tests/stack", serde_json::json!([pricing])),
        package(
            "lh-system-tests",
            "tests/system",
            serde_json::json!([dev_stack]),
        ),
    ];
    let found = violations(&packages, root);
    assert_eq!(found.len(), 4, "{found:?}");
    assert!(found[0].starts_with("lh-gateway "), "{found:?}");
    assert!(found[1].starts_with("lh-domain "), "{found:?}");
    assert!(found[1].contains("optional normal"), "{found:?}");
    assert!(found[2].starts_with("lh-testkit "), "{found:?}");
    assert!(found[3].starts_with("lh-bus "), "{found:?}");
    assert!(found[3].ends_with("test crate lh-test-stack"), "{found:?}");
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
