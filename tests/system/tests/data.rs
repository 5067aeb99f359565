//! Tenants' data on a real object store (SeaweedFS, started here): a
//! dataset put with `lh data`, mounted read-only into a lease's container;
//! a workspace written by the workload, restored on the node the lease is
//! drained to; the API's refusals; a tenant's erasure emptying its bucket.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lh_gateway::storage::StorageArgs;
use lh_node_agent::RuntimeKind;
use lh_test_stack::{of_type, Stack, ADMIN_TOKEN};
use lh_testkit::S3Store;
use reqwest::Method;
use serde_json::{json, Value};

use crate::workloads::{base_image, PODMAN_ARGS};

/// Two one-GPU nodes with ids of the test's own (agents of tests running
/// at once reap containers by node id).
fn two_node_fleet() -> (String, String, String) {
    let id = || format!("node-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let (a, b) = (id(), id());
    let node = |id: &str| {
        format!(
            "[[node]]\nid = \"{id}\"\nzone = \"cn-north-1a\"\nhostname = \"{id}.sim\"\n\
             gpu_model = \"A100-40GB\"\ngpu_count = 1\nvram_gb = 40\n"
        )
    };
    let fleet = format!("{}{}", node(&a), node(&b));
    (a, b, fleet)
}

/// A stack whose gateway keeps tenants' data on `store`, its nodes
/// running containers.
async fn stack_on(store: &S3Store, fleet: &str, dir: &Path, containers: bool) -> Stack {
    use std::os::unix::fs::PermissionsExt;
    let (key_id, secret) = store.admin_keys();
    let secret_file = dir.join("s3-admin-secret");
    std::fs::write(&secret_file, secret).unwrap();
    std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let storage = StorageArgs {
        storage_endpoint: Some(store.endpoint()),
        storage_admin_access_key_id: Some(key_id.to_string()),
        storage_admin_secret_key_file: Some(secret_file),
        ..Default::default()
    };
    Stack::start_configured(fleet, move |s| {
        if containers {
            s.node_runtime = RuntimeKind::Podman;
            s.node_container_args = PODMAN_ARGS.map(String::from).into();
        }
        s.gateway_config = Some(Arc::new(move |c| c.storage = storage.clone()));
    })
    .await
}

/// Runs `lh` as the tenant whose key is in `key_file`.
async fn lh(stack: &Stack, key_file: &Path, args: &[&str]) -> lh_cli::Captured {
    let mut argv = vec![
        "lh".to_string(),
        "--gateway-url".to_string(),
        stack.gateway_url.clone(),
        "--api-key-file".to_string(),
        key_file.to_str().unwrap().to_string(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    lh_cli::capture(argv).await
}

/// A tenant: its API key, written to a file for `lh` too.
async fn tenant(stack: &Stack, dir: &Path, name: &str) -> (String, String, std::path::PathBuf) {
    let (id, key) = stack.create_tenant(name, 2).await;
    let key_file = dir.join(format!("{name}.key"));
    std::fs::write(&key_file, &key).unwrap();
    (id, key, key_file)
}

/// A small dataset: a text file, a nested directory, an empty file.
fn mnist_dir(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("mnist");
    std::fs::create_dir_all(root.join("train/labels")).unwrap();
    std::fs::write(root.join("train.txt"), "seven pictures of sevens\n").unwrap();
    std::fs::write(root.join("train/labels/0"), vec![7u8; 100_000]).unwrap();
    std::fs::write(root.join("empty"), "").unwrap();
    root
}

/// The lease's log as its node holds it now.
async fn log_text(stack: &Stack, key: &str, id: &str) -> String {
    let (s, page) = stack
        .call(Method::GET, &format!("/v1/leases/{id}/logs"), key, None)
        .await;
    if s != 200 {
        return String::new();
    }
    page["data"].as_str().unwrap_or_default().to_string()
}

async fn wait_log_text(stack: &Stack, key: &str, id: &str, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let text = log_text(stack, key, id).await;
        if text.contains(needle) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{needle:?} never in the log of {id}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The workload of the tests: shows its dataset, tries to write it, and
/// counts its runs in a checkpoint in its workspace.
const TRAIN: &str = "cat /data/train.txt; \
    if touch /data/x 2>/dev/null; then echo data-writable; else echo data-read-only; fi; \
    n=$(cat /workspace/ckpt 2>/dev/null || echo 0); echo \"resumed from $n\"; \
    echo $((n + 1)) > /workspace/ckpt; echo checkpointed; \
    test -f /run/leasehold/notice.json && echo noticed; sleep 600";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_mounts_its_dataset_and_finds_its_workspace_on_the_node_it_is_drained_to() {
    base_image();
    let store = S3Store::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (node_a, node_b, fleet) = two_node_fleet();
    let stack = stack_on(&store, &fleet, dir.path(), true).await;
    let (_, key, key_file) = tenant(&stack, dir.path(), "trainer").await;

    // The dataset goes up through the CLI: hashed here, chunks to the
    // tenant's bucket, the version recorded by the gateway.
    let mnist = mnist_dir(dir.path());
    let put = lh(
        &stack,
        &key_file,
        &["data", "put", mnist.to_str().unwrap(), "--name", "mnist"],
    )
    .await;
    assert_eq!(put.code, 0, "{}{}", put.stdout, put.stderr);
    assert!(put.stdout.contains("mnist"), "{}", put.stdout);
    // Again: nothing new to send, the same version.
    let again = lh(
        &stack,
        &key_file,
        &[
            "--json",
            "data",
            "put",
            mnist.to_str().unwrap(),
            "--name",
            "mnist",
        ],
    )
    .await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(
        again.stderr.contains("sent 0 B in 0 chunks"),
        "{}",
        again.stderr
    );
    let listed = lh(&stack, &key_file, &["--json", "data", "ls"]).await;
    let listed: Value = serde_json::from_str(&listed.stdout).unwrap();
    let versions = &listed["datasets"][0]["versions"];
    assert_eq!(versions.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(versions[0]["files"], 3, "{listed}");

    // It comes back whole with `lh data get`.
    let back = dir.path().join("back");
    let got = lh(
        &stack,
        &key_file,
        &["data", "get", "mnist", back.to_str().unwrap()],
    )
    .await;
    assert_eq!(got.code, 0, "{}", got.stderr);
    assert_eq!(
        std::fs::read(back.join("train/labels/0")).unwrap(),
        vec![7u8; 100_000]
    );

    let (s, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": {
                "image": "localhost/leasehold/base",
                "command": ["sh", "-c", TRAIN],
                "datasets": [{"name": "mnist", "path": "/data"}],
                "workspaces": [{"name": "ws", "path": "/workspace"}],
            }})),
        )
        .await;
    assert_eq!(s, 202, "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();
    // The version is fixed when the lease is asked for.
    assert_eq!(
        lease["workload"]["datasets"][0]["version"], versions[0]["version"],
        "{lease}"
    );
    let first = stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    let text = wait_log_text(&stack, &key, &id, "checkpointed").await;
    assert!(text.contains("seven pictures of sevens"), "{text}");
    assert!(text.contains("data-read-only"), "{text}");
    assert!(text.contains("resumed from 0"), "{text}");

    // A second lease may not write the same workspace meanwhile.
    let (s, refused) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": {
                "image": "localhost/leasehold/base", "command": ["true"],
                "workspaces": [{"name": "ws", "path": "/w"}],
            }})),
        )
        .await;
    assert_eq!(s, 409, "{refused}");
    assert_eq!(refused["field"], "workload.workspaces[0].name", "{refused}");

    // Drained with `move`: its node syncs the workspace a last time, the
    // other node restores it before the workload starts there.
    let from = first["node_id"].as_str().unwrap().to_string();
    let to = if from == node_a { &node_b } else { &node_a };
    let (s, body) = stack
        .call(
            Method::POST,
            &format!("/v1/nodes/{from}/drain"),
            ADMIN_TOKEN,
            Some(json!({"mode": "move"})),
        )
        .await;
    assert!((200..300).contains(&s), "{body}");
    let moved = stack
        .wait_lease(&key, &id, |l| {
            (l["state"] == "running" && l["node_id"] == json!(to)) || l["state"] == "ended"
        })
        .await;
    if moved["state"] != "running" {
        panic!("{moved}\nlog: {}", log_text(&stack, &key, &id).await);
    }
    let text = wait_log_text(&stack, &key, &id, "resumed from 1").await;
    assert!(text.contains("data-read-only"), "{text}");

    // Stopped: the last sync is on the trail, by the node it ran on.
    let (s, body) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(s, 202, "{body}");
    stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    let synced = stack
        .wait_log(30, |log| {
            of_type(log, "lease.workspace_synced")
                .into_iter()
                .find_map(|e| match &e.envelope.data {
                    lh_events::EventData::LeaseWorkspaceSynced(s)
                        if s.lease_id.to_string() == id =>
                    {
                        Some(s.clone())
                    }
                    _ => None,
                })
        })
        .await;
    assert_eq!(&synced.node_id, to);
    assert_eq!(synced.workspace, "ws");
    assert_eq!(synced.reason, lh_events::WorkspaceSyncReason::End);
    assert_eq!(synced.files, 1, "the checkpoint: {synced:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn datasets_are_refused_by_field_and_an_erasure_empties_the_tenants_bucket() {
    let store = S3Store::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_, _, fleet) = two_node_fleet();
    let stack = stack_on(&store, &fleet, dir.path(), false).await;
    let (tenant_id, key, key_file) = tenant(&stack, dir.path(), "leaver").await;

    let post = |body: Value| {
        let key = key.clone();
        let stack = &stack;
        async move {
            stack
                .call(Method::POST, "/v1/datasets", &key, Some(body))
                .await
        }
    };
    let chunk = "ab".repeat(32);
    for (body, status, field) in [
        (
            json!({"name": "Bad Name", "manifest": {"files": []}}),
            422,
            "name",
        ),
        (
            json!({"name": "x", "manifest": {"files": "none"}}),
            422,
            "manifest",
        ),
        (
            json!({"name": "x", "manifest": {"files": [{"path": "../up", "kind": "dir"}]}}),
            422,
            "manifest",
        ),
        // Chunks the bucket does not hold.
        (
            json!({"name": "x", "manifest": {"files": [{"path": "a", "kind": {"file":
                {"bytes": 3, "executable": false, "chunks": [chunk]}}}]}}),
            422,
            "manifest",
        ),
        (
            json!({"name": "x", "manifest": {}, "public": true}),
            400,
            "",
        ),
    ] {
        let (s, p) = post(body.clone()).await;
        assert_eq!(s, status, "{body}: {p}");
        if !field.is_empty() {
            assert_eq!(p["field"], field, "{body}: {p}");
        }
    }
    for (workload, status, field) in [
        (
            json!({"image": "localhost/leasehold/base", "command": ["true"],
                   "datasets": [{"name": "nope", "path": "/data"}]}),
            422,
            "workload.datasets[0].name",
        ),
        (
            json!({"command": ["true"], "workspaces": [{"name": "ws", "path": "/w"}]}),
            422,
            "workload.workspaces",
        ),
        (
            json!({"image": "localhost/leasehold/base", "command": ["true"],
                   "workspaces": [{"name": "ws", "path": "/etc"}]}),
            422,
            "workload.workspaces[0].path",
        ),
    ] {
        let (s, p) = stack
            .call(
                Method::POST,
                "/v1/leases",
                &key,
                Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": workload})),
            )
            .await;
        assert_eq!(s, status, "{workload}: {p}");
        assert_eq!(p["field"], field, "{workload}: {p}");
    }

    // A version, and the tenant's own credentials on its own bucket.
    let mnist = mnist_dir(dir.path());
    let put = lh(
        &stack,
        &key_file,
        &["data", "put", mnist.to_str().unwrap(), "--name", "mnist"],
    )
    .await;
    assert_eq!(put.code, 0, "{}", put.stderr);
    let (s, creds) = stack
        .call(Method::GET, "/v1/storage/credentials", &key, None)
        .await;
    assert_eq!(s, 200, "{creds}");
    let (s, p) = stack
        .call(Method::GET, "/v1/storage/credentials", ADMIN_TOKEN, None)
        .await;
    assert_eq!(s, 403, "an operator holds no tenant's identity: {p}");
    let bucket = creds["bucket"].as_str().unwrap().to_string();
    let config = lh_storage::StoreConfig::new(creds["endpoint"].as_str().unwrap());
    let own = lh_storage::TenantStore::new(
        &config,
        &bucket,
        &lh_storage::Credentials::new(
            creds["access_key_id"].as_str().unwrap(),
            creds["secret_access_key"].as_str().unwrap(),
        ),
    )
    .unwrap();
    assert!(!own.list("chunks/").await.unwrap().is_empty());

    // Removed: gone from the list, its manifest gone from the bucket.
    let rm = lh(&stack, &key_file, &["data", "rm", "mnist"]).await;
    assert_eq!(rm.code, 0, "{}", rm.stderr);
    let (s, _) = stack
        .call(Method::GET, "/v1/datasets/mnist", &key, None)
        .await;
    assert_eq!(s, 404);
    assert!(own.list("datasets/").await.unwrap().is_empty());

    // Erased: the bucket and the identity are gone, and the trail says so.
    let (s, p) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant_id}/suspend"),
            ADMIN_TOKEN,
            Some(json!({"reason": "leaving"})),
        )
        .await;
    assert!((200..300).contains(&s), "{p}");
    let (s, p) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant_id}/erase"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(s, 200, "{p}");
    let erased = stack
        .wait_log(30, |log| {
            of_type(log, "storage.erased")
                .into_iter()
                .find_map(|e| match &e.envelope.data {
                    lh_events::EventData::StorageErased(s)
                        if s.tenant_id.to_string() == tenant_id =>
                    {
                        Some(s.clone())
                    }
                    _ => None,
                })
        })
        .await;
    assert!(erased.objects_deleted > 0, "{erased:?}");
    let (admin_id, admin_secret) = store.admin_keys();
    let admin = lh_storage::Admin::new(
        &config,
        lh_storage::Credentials::new(admin_id, admin_secret),
    )
    .unwrap();
    assert!(
        admin.bucket_bytes(&bucket).await.is_err(),
        "the bucket is gone"
    );
    assert!(own.list("").await.is_err(), "the tenant's key is revoked");
}
