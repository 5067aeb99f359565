//! docker-compose.yml runs without a registry too (scripts/compose.sh,
//! under podman): every third-party image can be swapped for a local
//! stand-in that scripts/images.sh makes, every published port can move
//! out of `make up`'s way, and the Dockerfile's two sources of binaries
//! carry the same ones. Docker users get the file's defaults, which the
//! other checks read (`compose_image`).

use std::collections::BTreeSet;

use lh_deploy_check::binaries::workspace_binaries;
use lh_deploy_check::manifests::{read, str_at, yaml_documents};
use lh_deploy_check::workspace::workspace_root;
use serde_yaml_ng::Value;

/// `${NAME:-default}` as (NAME, default); None for anything else.
fn variable_with_default(value: &str) -> Option<(&str, &str)> {
    value
        .strip_prefix("${")?
        .strip_suffix('}')?
        .split_once(":-")
}

/// The `NAME=value` of each `export NAME=value` line of a script.
fn exports(script: &str) -> Vec<(String, String)> {
    script
        .lines()
        .filter_map(|line| line.trim().strip_prefix("export "))
        .filter_map(|assignment| assignment.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

fn services() -> serde_yaml_ng::Mapping {
    let root = workspace_root();
    yaml_documents(&root.join("docker-compose.yml"))
        .remove(0)
        .get("services")
        .and_then(Value::as_mapping)
        .expect("services")
        .clone()
}

#[test]
fn every_third_party_image_has_a_local_stand_in_or_is_not_started() {
    let root = workspace_root();
    let compose_sh = read(&root.join("scripts/compose.sh"));
    let images_sh = read(&root.join("scripts/images.sh"));
    let exported = exports(&compose_sh);
    let skipped: BTreeSet<&str> = compose_sh
        .lines()
        .find_map(|line| line.trim().strip_prefix("SKIP=${LH_COMPOSE_SKIP-"))
        .and_then(|rest| rest.strip_suffix('}'))
        .expect("scripts/compose.sh sets SKIP from LH_COMPOSE_SKIP")
        .split_whitespace()
        .collect();

    let mut variables = BTreeSet::new();
    for (name, service) in &services() {
        let name = name.as_str().unwrap();
        if service.get("build").is_some() {
            continue; // the Dockerfile's: scripts/images.sh services
        }
        let image = str_at(service, &["image"]).unwrap_or_default();
        if image.starts_with("leasehold/") {
            continue; // one the Dockerfile builds, run as it is (enroll-fleet)
        }
        let (variable, default) = variable_with_default(image).unwrap_or_else(|| {
            panic!("compose {name} runs {image}, which no variable can replace (${{LH_..._IMAGE:-{image}}})")
        });
        assert!(
            variable.starts_with("LH_") && variable.ends_with("_IMAGE"),
            "compose {name}: {variable} is not named LH_*_IMAGE"
        );
        assert!(
            default.contains(':') && !default.ends_with(":latest"),
            "compose {name}: the default {default} is not a pinned image"
        );
        variables.insert(variable.to_string());
        if skipped.contains(name) {
            continue;
        }
        let (_, local) = exported
            .iter()
            .find(|(exported, _)| exported == variable)
            .unwrap_or_else(|| {
                panic!("scripts/compose.sh starts {name} but sets no {variable}: it would pull {default}")
            });
        assert!(
            images_sh.contains(&format!("local image={local}\n")),
            "scripts/compose.sh runs {local} for {name}, which scripts/images.sh does not make"
        );
    }
    for skip in &skipped {
        assert!(
            services().contains_key(*skip),
            "LH_COMPOSE_SKIP names {skip}, no compose service"
        );
    }
    for (variable, _) in exported.iter().filter(|(v, _)| v.ends_with("_IMAGE")) {
        assert!(
            variables.contains(variable),
            "scripts/compose.sh sets {variable}, which docker-compose.yml does not read"
        );
    }

    // A literal image, or a variable without a default, is named.
    assert_eq!(variable_with_default("nats:2.15-alpine"), None);
    assert_eq!(variable_with_default("${LH_NATS_IMAGE}"), None);
}

#[test]
fn every_published_port_moves_with_the_port_prefix() {
    for (name, service) in &services() {
        for port in service["ports"].as_sequence().into_iter().flatten() {
            let port = port.as_str().unwrap_or_default();
            let (host, container) = port
                .strip_prefix("127.0.0.1:${LH_COMPOSE_PORT_PREFIX:-}")
                .and_then(|rest| rest.split_once(':'))
                .unwrap_or_else(|| {
                    panic!(
                        "compose {} publishes {port}, not 127.0.0.1:${{LH_COMPOSE_PORT_PREFIX:-}}PORT:PORT",
                        name.as_str().unwrap()
                    )
                });
            assert!(container.parse::<u16>().is_ok(), "{port}");
            // scripts/compose.sh's prefix, 1, must still make a port.
            assert!(
                format!("1{host}").parse::<u16>().is_ok(),
                "compose {}: 1{host} is no port",
                name.as_str().unwrap()
            );
        }
    }
}

#[test]
fn compose_node_agents_simulate_workloads() {
    let agents: Vec<(String, Value)> = services()
        .into_iter()
        .filter(|(_, s)| str_at(s, &["build", "args", "BIN"]) == Some("lh-node-agent"))
        .map(|(name, s)| (name.as_str().unwrap().to_string(), s))
        .collect();
    assert_eq!(agents.len(), 6);
    for (name, agent) in agents {
        assert_eq!(
            str_at(&agent, &["environment", "LH_RUNTIME"]),
            Some("sim"),
            "compose {name} runs no container engine, so its workloads are simulated"
        );
    }
}

#[test]
fn the_dockerfile_takes_the_same_binaries_from_either_source() {
    let root = workspace_root();
    let dockerfile = read(&root.join("Dockerfile"));
    let images_sh = read(&root.join("scripts/images.sh"));
    let words =
        |line: &str| -> BTreeSet<String> { line.split_whitespace().map(str::to_string).collect() };

    let built = dockerfile
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("&& for bin in ")
                .and_then(|rest| rest.strip_suffix("; do \\"))
        })
        .map(words)
        .expect("the builder stage's `for bin in ...` list");
    let copied = dockerfile
        .lines()
        .find_map(|line| line.strip_prefix("COPY --from=host-binaries "))
        .and_then(|rest| rest.strip_suffix(" /out/"))
        .map(words)
        .expect("the prebuilt stage's COPY --from=host-binaries");
    let staged = images_sh
        .lines()
        .find_map(|line| line.strip_prefix("SERVICE_BINARIES=("))
        .and_then(|rest| rest.strip_suffix(')'))
        .map(words)
        .expect("scripts/images.sh SERVICE_BINARIES");
    assert_eq!(built, copied, "builder vs prebuilt stage");
    assert_eq!(built, staged, "builder stage vs scripts/images.sh");
    let binaries = workspace_binaries();
    for binary in &built {
        assert!(binaries.contains(binary), "{binary} is no workspace binary");
    }
    assert!(
        dockerfile.contains("ARG BINARIES=builder\n")
            && dockerfile.contains("FROM ${BINARIES} AS binaries\n")
            && dockerfile.contains("COPY --from=binaries /out/ /usr/local/bin/\n"),
        "the runtime stage takes its binaries from the stage BINARIES names, the builder by default"
    );
}
