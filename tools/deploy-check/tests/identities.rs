//! Each service is itself to what it connects to, in both deployments: its
//! own PostgreSQL role from the one roles script, and its own NATS user
//! with a seed from a file, on servers that let no anonymous client in.

use std::collections::{BTreeMap, BTreeSet};

use lh_deploy_check::k8s::env_value;
use lh_deploy_check::manifests::{k8s_documents, k8s_manifests, read, str_at, yaml_documents};
use lh_deploy_check::workspace::workspace_root;
use serde_yaml_ng::Value;

/// Both deployments give the gateway, pricing and audit their own
/// PostgreSQL roles from the one script, and the gateway its master key.
#[test]
fn services_connect_as_their_own_roles_in_both_deployments() {
    let root = workspace_root();
    let roles_sql = read(&root.join("deploy/postgres/roles.sql"));

    let compose = yaml_documents(&root.join("docker-compose.yml")).remove(0);
    let services = &compose["services"];
    let mounts = |name: &str| -> Vec<String> {
        services[name]["volumes"]
            .as_sequence()
            .map(|v| {
                v.iter()
                    .filter_map(|m| m.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(
        mounts("postgres-roles")
            .contains(&"./deploy/postgres/roles.sql:/etc/leasehold/roles.sql:ro".to_string()),
        "compose postgres-roles does not run deploy/postgres/roles.sql"
    );
    for svc in ["gateway", "pricing", "audit"] {
        let url = str_at(&services[svc], &["environment", "DATABASE_URL"])
            .unwrap_or_else(|| panic!("compose {svc} has no DATABASE_URL"));
        assert!(
            url.starts_with(&format!("postgres://lh_{svc}:")),
            "compose {svc} connects as {url}, not as lh_{svc}"
        );
    }
    assert!(
        str_at(&services["gateway"], &["environment", "LH_MASTER_KEY_FILE"]).is_some(),
        "compose gateway has no master key"
    );

    // Kubernetes: CloudNativePG creates each role with its password from a
    // basic-auth Secret of that username; the service reads the password
    // from that Secret into its URL, on the cluster's primary; the Job runs
    // the same roles.sql as compose.
    let docs = k8s_documents();
    let find = |kind: &str, name: &str| -> &Value {
        docs.iter()
            .map(|(_, doc)| doc)
            .find(|d| {
                str_at(d, &["kind"]) == Some(kind) && str_at(d, &["metadata", "name"]) == Some(name)
            })
            .unwrap_or_else(|| panic!("k8s has no {kind}/{name}"))
    };
    assert_eq!(
        str_at(
            find("ConfigMap", "leasehold-postgres-roles"),
            &["data", "roles.sql"]
        ),
        Some(roles_sql.as_str()),
        "k8s ConfigMap leasehold-postgres-roles differs from deploy/postgres/roles.sql"
    );
    let clusters: Vec<&Value> = docs
        .iter()
        .map(|(_, doc)| doc)
        .filter(|d| str_at(d, &["kind"]) == Some("Cluster"))
        .collect();
    assert_eq!(clusters.len(), 1, "one CloudNativePG Cluster");
    let cluster = clusters[0];
    let cluster_name = str_at(cluster, &["metadata", "name"]).unwrap();
    let primary = format!("{cluster_name}-rw.leasehold.svc");
    let database =
        str_at(cluster, &["spec", "bootstrap", "initdb", "database"]).expect("initdb database");
    let roles: BTreeMap<&str, &Value> = cluster["spec"]["managed"]["roles"]
        .as_sequence()
        .expect("managed roles")
        .iter()
        .map(|role| (str_at(role, &["name"]).unwrap(), role))
        .collect();

    for svc in ["gateway", "pricing", "audit"] {
        let role_name = format!("lh_{svc}");
        let role = roles
            .get(role_name.as_str())
            .unwrap_or_else(|| panic!("the Cluster manages no role {role_name}"));
        assert_eq!(role["login"].as_bool(), Some(true), "{role_name}: login");
        for attribute in [
            "superuser",
            "createdb",
            "createrole",
            "replication",
            "bypassrls",
        ] {
            assert_eq!(
                role[attribute].as_bool(),
                Some(false),
                "{role_name}: {attribute}"
            );
        }
        let secret_name = str_at(role, &["passwordSecret", "name"]).expect("passwordSecret");
        let secret = find("Secret", secret_name);
        assert_eq!(
            str_at(secret, &["type"]),
            Some("kubernetes.io/basic-auth"),
            "{secret_name}"
        );
        assert_eq!(
            str_at(secret, &["stringData", "username"]),
            Some(role_name.as_str()),
            "{secret_name} names another role"
        );

        let deployment = find("Deployment", svc);
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let env = container["env"].as_sequence().expect("env");
        let password_from = env
            .iter()
            .find(|e| str_at(e, &["name"]) == Some("DATABASE_PASSWORD"))
            .unwrap_or_else(|| panic!("k8s {svc} has no DATABASE_PASSWORD"));
        assert_eq!(
            (
                str_at(password_from, &["valueFrom", "secretKeyRef", "name"]),
                str_at(password_from, &["valueFrom", "secretKeyRef", "key"])
            ),
            (Some(secret_name), Some("password")),
            "k8s {svc} must read its own role's password"
        );
        let url = env_value(container, "DATABASE_URL")
            .unwrap_or_else(|| panic!("k8s {svc} has no DATABASE_URL value"));
        let expected =
            format!("postgres://{role_name}:$(DATABASE_PASSWORD)@{primary}:5432/{database}?");
        assert!(
            url.starts_with(&expected),
            "k8s {svc} connects with {url}, not {expected}…"
        );
        assert!(
            url.contains("sslmode=verify-full") && url.contains("sslrootcert="),
            "k8s {svc} does not check the server's certificate: {url}"
        );
        // The password must be defined before the URL that refers to it.
        let position = |name: &str| env.iter().position(|e| str_at(e, &["name"]) == Some(name));
        assert!(
            position("DATABASE_PASSWORD") < position("DATABASE_URL"),
            "k8s {svc}: env order"
        );
    }

    let job = find("Job", "postgres-roles");
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env_value(container, "PGHOST").as_deref(),
        Some(primary.as_str()),
        "roles Job host"
    );
    assert_eq!(
        env_value(container, "PGSSLMODE").as_deref(),
        Some("verify-full")
    );
    let superuser = str_at(cluster, &["spec", "superuserSecret", "name"]).expect("superuserSecret");
    assert_eq!(
        str_at(find("Secret", superuser), &["stringData", "username"]),
        Some("postgres"),
        "the superuser Secret"
    );
}

/// Every NATS config a deployment runs includes its users (no anonymous
/// clients), and every service connects as its own user with a seed from a
/// file: compose from the nats-auth volume, k8s from its own Secret.
#[test]
fn every_deployment_runs_nats_with_users_and_each_service_as_itself() {
    let root = workspace_root();
    let mut configs = vec![
        (
            "deploy/nats/nats.conf",
            read(&root.join("deploy/nats/nats.conf")),
        ),
        ("dev/nats.conf", read(&root.join("dev/nats.conf"))),
        (
            "dev/nats-cluster.conf",
            read(&root.join("dev/nats-cluster.conf")),
        ),
    ];
    for file in k8s_manifests() {
        for doc in yaml_documents(&file) {
            if str_at(&doc, &["metadata", "name"]) == Some("nats-config") {
                let conf = str_at(&doc, &["data", "nats.conf"]).expect("nats.conf");
                configs.push(("k8s ConfigMap nats-config", conf.to_string()));
            }
        }
    }
    assert_eq!(configs.len(), 4, "the k8s nats-config is missing");
    for (what, conf) in &configs {
        let lines: Vec<&str> = conf.lines().map(str::trim).collect();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("include") && l.contains("users.conf")),
            "{what} does not include users.conf"
        );
        assert!(
            !lines.iter().any(|l| l.starts_with("no_auth_user")),
            "{what} lets anonymous clients in"
        );
    }

    let compose = yaml_documents(&root.join("docker-compose.yml")).remove(0);
    let services = compose["services"].as_mapping().expect("services");
    let mut users = BTreeSet::new();
    for (name, service) in services {
        let name = name.as_str().unwrap();
        if service.get("build").is_none() || name == "nats-auth" {
            continue;
        }
        let user = str_at(service, &["environment", "LH_NATS_USER"])
            .unwrap_or_else(|| panic!("compose {name} has no LH_NATS_USER"));
        assert_eq!(
            str_at(service, &["environment", "LH_NATS_NKEY_SEED_FILE"]),
            Some(format!("/run/nats-auth/keys/{user}.nk").as_str()),
            "compose {name}"
        );
        assert!(users.insert(user.to_string()), "compose {user} twice");
    }
    let mut k8s_users = BTreeSet::new();
    for file in k8s_manifests() {
        for doc in yaml_documents(&file) {
            if str_at(&doc, &["kind"]) != Some("Deployment") {
                continue;
            }
            let spec = &doc["spec"]["template"]["spec"];
            let env = spec["containers"][0]["env"].as_sequence().expect("env");
            let value = |key: &str| {
                env.iter()
                    .find(|e| str_at(e, &["name"]) == Some(key))
                    .and_then(|e| str_at(e, &["value"]))
                    .map(str::to_string)
            };
            let name = str_at(&doc, &["metadata", "name"]).unwrap_or_default();
            let user = value("LH_NATS_USER").unwrap_or_else(|| panic!("k8s {name}: no user"));
            assert!(value("LH_NATS_NKEY_SEED_FILE").is_some(), "k8s {name}");
            let expected = format!("nats-{user}");
            let secrets: Vec<&str> = spec["volumes"]
                .as_sequence()
                .expect("volumes")
                .iter()
                .filter_map(|v| str_at(v, &["secret", "secretName"]))
                .collect();
            assert!(
                secrets.contains(&expected.as_str()),
                "k8s {name} mounts no {expected}: {secrets:?}"
            );
            assert!(k8s_users.insert(user), "k8s {name}: a user twice");
        }
    }
    assert_eq!(users, k8s_users, "compose and k8s users differ");
}
