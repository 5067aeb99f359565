//! Tenants' data on a real object store (SeaweedFS, started here): a
//! dataset put with `lh data`, mounted read-only into a lease's container;
//! a workspace written by the workload, restored on the node the lease is
//! drained to; the API's refusals; a tenant's erasure emptying its bucket;
//! workspaces listed, snapshotted each interval, restored, refused while a
//! lease holds them, and what nothing names any more collected.

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
pub(crate) fn two_node_fleet() -> (String, String, String) {
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
    stack_tuned(store, fleet, dir, containers, |_| {}).await
}

/// [`stack_on`], with the gateway's storage settings changed by `tune`.
async fn stack_tuned(
    store: &S3Store,
    fleet: &str,
    dir: &Path,
    containers: bool,
    tune: impl FnOnce(&mut StorageArgs),
) -> Stack {
    stack_with(store, fleet, dir, tune, |s| {
        if containers {
            s.node_runtime = RuntimeKind::Podman;
            s.node_container_args = PODMAN_ARGS.map(String::from).into();
        }
    })
    .await
}

/// [`stack_tuned`], with the stack's own knobs set by `configure`.
async fn stack_with(
    store: &S3Store,
    fleet: &str,
    dir: &Path,
    tune: impl FnOnce(&mut StorageArgs),
    configure: impl FnOnce(&mut Stack),
) -> Stack {
    use std::os::unix::fs::PermissionsExt;
    let (key_id, secret) = store.admin_keys();
    let secret_file = dir.join("s3-admin-secret");
    std::fs::write(&secret_file, secret).unwrap();
    std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut storage = StorageArgs {
        storage_endpoint: Some(store.endpoint()),
        storage_admin_access_key_id: Some(key_id.to_string()),
        storage_admin_secret_key_file: Some(secret_file),
        ..Default::default()
    };
    tune(&mut storage);
    Stack::start_configured(fleet, move |s| {
        configure(s);
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

/// The workload of the spot test: counts its runs in its workspace, and
/// when told of its preemption (the file, and SIGUSR1 to it, the first
/// process of its container) writes a checkpoint saying so. It waits in
/// short sleeps: a shell runs a trap only once its foreground command
/// ends, and the signal may come after the file.
const SPOT_TRAIN: &str = "trap 'echo got-usr1' USR1; \
    n=$(cat /workspace/ckpt 2>/dev/null || echo 0); echo \"resumed from $n\"; \
    test -f /workspace/at-notice && echo \"found $(cat /workspace/at-notice)\"; \
    echo $((n + 1)) > /workspace/ckpt; echo checkpointed; \
    i=0; while ! test -f /run/leasehold/notice.json; do \
        sleep 0.2; i=$((i + 1)); test $i -lt 3000 || exit 1; done; \
    echo noticed; cat /run/leasehold/notice.json > /workspace/at-notice; \
    i=0; while [ $i -lt 600 ]; do sleep 1; i=$((i + 1)); done";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_preempted_spot_lease_is_told_and_its_recovery_on_another_node_resumes_from_its_checkpoint(
) {
    base_image();
    let store = S3Store::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_, _, fleet) = two_node_fleet();
    let stack = stack_with(
        &store,
        &fleet,
        dir.path(),
        |_| {},
        |s| {
            s.node_runtime = RuntimeKind::Podman;
            s.node_container_args = PODMAN_ARGS.map(String::from).into();
            s.preemption_notice_secs = 6;
            s.preemption_min_runtime_secs = 0;
        },
    )
    .await;
    let (_, key, _) = tenant(&stack, dir.path(), "spotter").await;
    let (_, other_key, _) = tenant(&stack, dir.path(), "ondemand").await;

    let (s, spot) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "tier": "spot",
            "recovery": {"max_retries": 1, "zone_first": "any"},
            "workload": {
                "image": "localhost/leasehold/base",
                "command": ["sh", "-c", SPOT_TRAIN],
                "workspaces": [{"name": "ckpt", "path": "/workspace"}],
            }})),
        )
        .await;
    assert_eq!(s, 202, "{spot}");
    let spot = spot["id"].as_str().unwrap().to_string();
    let running = stack
        .wait_lease(&key, &spot, |l| l["state"] == "running")
        .await;
    wait_log_text(&stack, &key, &spot, "resumed from 0").await;
    wait_log_text(&stack, &key, &spot, "checkpointed").await;

    // On-demand work takes the other node, then the spot lease's GPU.
    let on_demand = json!({"gpus": 1, "gpu_model": "A100-40GB", "tier": "basic"});
    let first = stack.lease(&other_key, on_demand.clone()).await;
    stack
        .wait_lease(&other_key, &first, |l| l["state"] == "running")
        .await;
    let second = stack.lease(&other_key, on_demand).await;

    // Told before its end: the file, and the signal it listens for.
    stack
        .wait_lease(&key, &spot, |l| !l["preemption_deadline"].is_null())
        .await;
    let text = wait_log_text(&stack, &key, &spot, "noticed").await;
    let text = if text.contains("got-usr1") {
        text
    } else {
        wait_log_text(&stack, &key, &spot, "got-usr1").await
    };
    assert!(text.contains("noticed"), "{text}");
    let ended = stack
        .wait_lease(&key, &spot, |l| l["state"] == "ended")
        .await;
    assert_eq!(ended["end_reason"], "preempted", "{ended}");
    stack
        .wait_lease(&other_key, &second, |l| l["state"] == "running")
        .await;

    // Its recovery waits for a GPU; the first on-demand lease leaves, and
    // the recovery runs on that node with the checkpoint written at notice.
    let recovery = stack
        .wait_log(30, |log| {
            log.iter().find_map(|e| match &e.envelope.data {
                lh_events::EventData::LeaseRequested(r)
                    if r.recovery_of
                        .as_ref()
                        .is_some_and(|o| o.lease_id.to_string() == spot) =>
                {
                    Some(r.lease_id.to_string())
                }
                _ => None,
            })
        })
        .await;
    let (s, body) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{first}/stop"),
            &other_key,
            None,
        )
        .await;
    assert_eq!(s, 202, "{body}");
    let recovered = stack
        .wait_lease(&key, &recovery, |l| {
            l["state"] == "running" || l["state"] == "ended"
        })
        .await;
    assert_eq!(recovered["state"], "running", "{recovered}");
    assert_ne!(recovered["node_id"], running["node_id"], "{recovered}");
    let text = wait_log_text(&stack, &key, &recovery, "resumed from 1").await;
    assert!(text.contains("found {"), "{text}");
    assert!(text.contains("\"event\":\"preemption\""), "{text}");
    assert!(text.contains("\"reason\":\"capacity\""), "{text}");
    let (s, body) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{recovery}/stop"),
            &key,
            None,
        )
        .await;
    assert_eq!(s, 202, "{body}");
}

/// The tenant's own bucket, with the identity the gateway gives it (what a
/// node is given for the tenant's lease).
async fn own_store(stack: &Stack, key: &str) -> lh_storage::TenantStore {
    let (s, creds) = stack
        .call(Method::GET, "/v1/storage/credentials", key, None)
        .await;
    assert_eq!(s, 200, "{creds}");
    lh_storage::TenantStore::new(
        &lh_storage::StoreConfig::new(creds["endpoint"].as_str().unwrap()),
        creds["bucket"].as_str().unwrap(),
        &lh_storage::Credentials::new(
            creds["access_key_id"].as_str().unwrap(),
            creds["secret_access_key"].as_str().unwrap(),
        ),
    )
    .unwrap()
}

/// Syncs workspace `name` holding one file `ckpt` of `content` as a node
/// syncs a lease's last time (released), through the same code.
async fn sync_as_node(
    store: &lh_storage::TenantStore,
    name: &str,
    content: &str,
    lease_id: uuid::Uuid,
) -> lh_storage::workspace::Synced {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ckpt"), content).unwrap();
    let holder = lh_storage::workspace::Holder {
        lease_id,
        placement: 1,
        node_id: "node-gone".into(),
    };
    lh_storage::workspace::sync(store, name, dir.path(), holder, true, &Default::default())
        .await
        .unwrap()
}

/// The snapshot of tenant `tenant_id`'s workspace `name` copying
/// `manifest`, once the log has it.
async fn snapshotted(
    stack: &Stack,
    tenant_id: &str,
    name: &str,
    manifest: &str,
) -> lh_events::WorkspaceSnapshotted {
    stack
        .wait_log(60, |log| {
            of_type(log, "workspace.snapshotted")
                .into_iter()
                .find_map(|e| match &e.envelope.data {
                    lh_events::EventData::WorkspaceSnapshotted(s)
                        if s.tenant_id.to_string() == tenant_id
                            && s.workspace == name
                            && s.manifest == manifest =>
                    {
                        Some(s.clone())
                    }
                    _ => None,
                })
        })
        .await
}

async fn exists(store: &lh_storage::TenantStore, key: &str) -> bool {
    store.info(key).await.unwrap().is_some()
}

/// Waits up to a minute for `done` to hold of the bucket.
async fn wait_bucket<F, Fut>(what: &str, done: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workspaces_are_snapshotted_each_interval_kept_for_their_days_and_collected() {
    use lh_storage::workspace;
    let store = S3Store::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_, _, fleet) = two_node_fleet();
    // A pass a second; what nothing names goes once two seconds old.
    let stack = stack_tuned(&store, &fleet, dir.path(), false, |c| {
        c.workspace_snapshot_interval_secs = 1;
        c.workspace_snapshot_keep_days = 7;
        c.workspace_collect_grace_secs = 2;
    })
    .await;
    let (tenant_id, key, key_file) = tenant(&stack, dir.path(), "keeper").await;
    let own = own_store(&stack, &key).await;
    let today = chrono::Utc::now().date_naive();
    let yesterday = today - chrono::Days::new(1);
    let expired = today - chrono::Days::new(8);
    let writer = uuid::Uuid::new_v4();

    // Written as a node writes it; listed; snapshotted by the next pass.
    let v0 = sync_as_node(&own, "ckpt", "step 0", writer).await;
    let taken = snapshotted(&stack, &tenant_id, "ckpt", &v0.manifest).await;
    assert_eq!(taken.snapshot, today.to_string());
    assert_eq!((taken.bytes, taken.files), (6, 1), "{taken:?}");
    assert!(exists(&own, &workspace::snapshot_key("ckpt", today)).await);
    let ls = lh(&stack, &key_file, &["--json", "workspace", "ls"]).await;
    assert_eq!(ls.code, 0, "{}", ls.stderr);
    let listed: Value = serde_json::from_str(&ls.stdout).unwrap();
    let ws = &listed["workspaces"][0];
    assert_eq!(ws["name"], "ckpt", "{listed}");
    assert_eq!(ws["manifest"], v0.manifest.as_str(), "{listed}");
    assert_eq!(
        (ws["bytes"].as_u64(), ws["files"].as_u64()),
        (Some(6), Some(1))
    );
    assert_eq!(ws["lease_id"], writer.to_string());
    assert_eq!(ws["released"], true);
    assert_eq!(ws["snapshots"][0]["date"], today.to_string(), "{listed}");
    let table = lh(&stack, &key_file, &["workspace", "ls"]).await;
    assert!(table.stdout.contains("ckpt"), "{}", table.stdout);

    // The passes of the days before left snapshots: one within the
    // retention, one past it.
    let copy = own
        .get(&workspace::snapshot_key("ckpt", today))
        .await
        .unwrap()
        .unwrap();
    for day in [yesterday, expired] {
        own.put(&workspace::snapshot_key("ckpt", day), copy.clone())
            .await
            .unwrap();
    }
    // Two more syncs: the first's chunk is named by no snapshot once
    // today's holds the second.
    let passing = sync_as_node(&own, "ckpt", "step 0.5, kept by nothing", writer).await;
    let v1 = sync_as_node(&own, "ckpt", "step 1", writer).await;
    snapshotted(&stack, &tenant_id, "ckpt", &v1.manifest).await;
    let passing_chunk = lh_storage::chunk_key(passing.chunks.iter().next().unwrap());
    let kept_chunk = lh_storage::chunk_key(v0.chunks.iter().next().unwrap());
    let head_chunk = lh_storage::chunk_key(v1.chunks.iter().next().unwrap());
    wait_bucket(
        "the expired snapshot, old manifests and a chunk nobody names collected",
        || {
            let own = own.clone();
            let passing_chunk = passing_chunk.clone();
            async move {
                let manifests = own
                    .list(&workspace::manifests_prefix("ckpt"))
                    .await
                    .unwrap();
                !exists(&own, &workspace::snapshot_key("ckpt", expired)).await
                    && manifests.len() == 1
                    && !exists(&own, &passing_chunk).await
            }
        },
    )
    .await;
    assert!(exists(&own, &workspace::manifest_key("ckpt", &v1.manifest)).await);
    assert!(
        exists(&own, &kept_chunk).await,
        "yesterday's snapshot names it"
    );
    assert!(exists(&own, &head_chunk).await, "the head names it");
    assert!(exists(&own, &workspace::snapshot_key("ckpt", yesterday)).await);

    // Set back to yesterday's: the head names its manifest again.
    let back = lh(
        &stack,
        &key_file,
        &[
            "--json",
            "workspace",
            "restore",
            "ckpt",
            "--snapshot",
            &yesterday.to_string(),
        ],
    )
    .await;
    assert_eq!(back.code, 0, "{}{}", back.stdout, back.stderr);
    let restored: Value = serde_json::from_str(&back.stdout).unwrap();
    assert_eq!(restored["manifest"], v0.manifest.as_str(), "{restored}");
    assert_eq!(restored["restored_from"], yesterday.to_string());
    let head = workspace::read_head(&own, "ckpt").await.unwrap().unwrap();
    assert_eq!(head.manifest, v0.manifest);
    assert!(head.released);
    stack
        .wait_log(30, |log| {
            of_type(log, "workspace.restored").into_iter().find(|e| {
                matches!(&e.envelope.data, lh_events::EventData::WorkspaceRestored(r)
                    if r.tenant_id.to_string() == tenant_id && r.manifest == v0.manifest)
            })?;
            Some(())
        })
        .await;
    // Asked for now, today's snapshot holds it too.
    let now = lh(
        &stack,
        &key_file,
        &["--json", "workspace", "snapshot", "ckpt"],
    )
    .await;
    assert_eq!(now.code, 0, "{}", now.stderr);
    let now: Value = serde_json::from_str(&now.stdout).unwrap();
    assert_eq!(now["date"], today.to_string(), "{now}");
    assert_eq!(now["manifest"], v0.manifest.as_str(), "{now}");

    // Removed: nothing of it is left, its chunks at the next pass.
    let rm = lh(&stack, &key_file, &["workspace", "rm", "ckpt"]).await;
    assert_eq!(rm.code, 0, "{}", rm.stderr);
    assert!(own.list("workspaces/").await.unwrap().is_empty());
    let ls = lh(&stack, &key_file, &["--json", "workspace", "ls"]).await;
    let listed: Value = serde_json::from_str(&ls.stdout).unwrap();
    assert_eq!(listed["workspaces"], json!([]), "{listed}");
    wait_bucket("every chunk collected", || {
        let own = own.clone();
        async move { own.list("chunks/").await.unwrap().is_empty() }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workspace_a_lease_holds_is_neither_restored_nor_removed_and_refusals_name_their_field() {
    use lh_storage::workspace;
    let store = S3Store::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_, _, fleet) = two_node_fleet();
    // Simulated nodes: the lease runs with no container, and leaves the
    // workspace as written here. No pass before the test's own.
    let stack = stack_tuned(&store, &fleet, dir.path(), false, |c| {
        c.workspace_snapshot_interval_secs = 7 * 86_400;
    })
    .await;
    let (tenant_id, key, key_file) = tenant(&stack, dir.path(), "holder").await;
    let own = own_store(&stack, &key).await;
    let today = chrono::Utc::now().date_naive();
    let v0 = sync_as_node(&own, "ckpt", "step 0", uuid::Uuid::new_v4()).await;

    // Taken now by the tenant; again with nothing changed: the same, 200.
    let (s, taken) = stack
        .call(Method::POST, "/v1/workspaces/ckpt/snapshots", &key, None)
        .await;
    assert_eq!(s, 201, "{taken}");
    assert_eq!(taken["date"], today.to_string());
    assert_eq!(taken["manifest"], v0.manifest.as_str());
    let (s, again) = stack
        .call(Method::POST, "/v1/workspaces/ckpt/snapshots", &key, None)
        .await;
    assert_eq!(s, 200, "{again}");
    snapshotted(&stack, &tenant_id, "ckpt", &v0.manifest).await;

    // Refusals, each naming its field.
    let today_s = today.to_string();
    for (method, path, body, status, field) in [
        (
            Method::POST,
            "/v1/workspaces/nope/snapshots",
            None,
            404,
            "name",
        ),
        (
            Method::POST,
            "/v1/workspaces/Bad%20Name/snapshots",
            None,
            422,
            "name",
        ),
        (
            Method::POST,
            "/v1/workspaces/ckpt/restore",
            Some(json!({"snapshot": "yesterday"})),
            422,
            "snapshot",
        ),
        (
            Method::POST,
            "/v1/workspaces/ckpt/restore",
            Some(json!({"snapshot": "2001-01-01"})),
            404,
            "snapshot",
        ),
        (
            Method::POST,
            "/v1/workspaces/nope/restore",
            Some(json!({"snapshot": today_s})),
            404,
            "name",
        ),
        (Method::DELETE, "/v1/workspaces/nope", None, 404, "name"),
    ] {
        let (s, p) = stack.call(method.clone(), path, &key, body.clone()).await;
        assert_eq!(s, status, "{method} {path} {body:?}: {p}");
        assert_eq!(p["field"], field, "{method} {path}: {p}");
    }
    let (s, p) = stack
        .call(
            Method::POST,
            "/v1/workspaces/ckpt/restore",
            &key,
            Some(json!({"snapshot": today_s, "force": true})),
        )
        .await;
    assert_eq!(s, 400, "{p}");
    // Operators read a tenant's list, and change nothing in it.
    let (s, p) = stack
        .call(
            Method::GET,
            &format!("/v1/workspaces?tenant_id={tenant_id}"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(p["workspaces"][0]["name"], "ckpt", "{p}");
    let (s, p) = stack
        .call(
            Method::POST,
            "/v1/workspaces/ckpt/snapshots",
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(s, 403, "{p}");

    // A lease that mounts it holds it until it has ended.
    let (s, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": {
                "image": "localhost/leasehold/base", "command": ["sleep", "600"],
                "workspaces": [{"name": "ckpt", "path": "/workspace"}],
            }})),
        )
        .await;
    assert_eq!(s, 202, "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();
    stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    let (s, p) = stack
        .call(
            Method::POST,
            "/v1/workspaces/ckpt/restore",
            &key,
            Some(json!({"snapshot": today_s})),
        )
        .await;
    assert_eq!(s, 409, "{p}");
    assert_eq!(p["field"], "name", "{p}");
    assert!(p["detail"].as_str().unwrap().contains(&id), "{p}");
    let rm = lh(&stack, &key_file, &["workspace", "rm", "ckpt"]).await;
    assert_ne!(rm.code, 0, "{}", rm.stdout);
    assert!(
        rm.stderr.contains("409") || rm.stderr.contains("held"),
        "{}",
        rm.stderr
    );
    let ls = lh(&stack, &key_file, &["--json", "workspace", "ls"]).await;
    let listed: Value = serde_json::from_str(&ls.stdout).unwrap();
    assert_eq!(listed["workspaces"][0]["held_by"], id.as_str(), "{listed}");
    // A snapshot is taken while it is held: the last sync is copied.
    let (s, p) = stack
        .call(Method::POST, "/v1/workspaces/ckpt/snapshots", &key, None)
        .await;
    assert_eq!(s, 200, "{p}");
    assert!(exists(&own, &workspace::head_key("ckpt")).await);

    // Ended: the workspace is the tenant's to restore and remove again.
    let (s, body) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(s, 202, "{body}");
    stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    let (s, p) = stack
        .call(
            Method::POST,
            "/v1/workspaces/ckpt/restore",
            &key,
            Some(json!({"snapshot": today_s})),
        )
        .await;
    assert_eq!(s, 200, "{p}");
    let (s, p) = stack
        .call(Method::DELETE, "/v1/workspaces/ckpt", &key, None)
        .await;
    assert_eq!(s, 204, "{p}");
    stack
        .wait_log(30, |log| {
            of_type(log, "workspace.removed").into_iter().find(|e| {
                matches!(&e.envelope.data, lh_events::EventData::WorkspaceRemoved(r)
                    if r.tenant_id.to_string() == tenant_id && r.workspace == "ckpt")
            })?;
            Some(())
        })
        .await;
    assert!(own.list("workspaces/").await.unwrap().is_empty());
}

/// The storage events of `tenant` of type `event_type` in the log, decoded.
fn storage_events<T: Clone>(
    log: &[lh_bus::Stored],
    event_type: &str,
    of: impl Fn(&lh_events::EventData) -> Option<T>,
) -> Vec<T> {
    of_type(log, event_type)
        .into_iter()
        .filter_map(|e| of(&e.envelope.data))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storage_is_measured_charged_on_the_invoice_and_bounded_by_its_quota() {
    use lh_events::EventData;
    let store = S3Store::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_, _, fleet) = two_node_fleet();
    let (key_id, secret) = store.admin_keys();
    let secret_file = dir.path().join("s3-admin-secret");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&secret_file, secret).unwrap();
        std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    // Measured every second, so that the test sees spans charged.
    let storage = StorageArgs {
        storage_endpoint: Some(store.endpoint()),
        storage_admin_access_key_id: Some(key_id.to_string()),
        storage_admin_secret_key_file: Some(secret_file),
        storage_measure_interval_secs: 1,
        ..Default::default()
    };
    let stack = Stack::start_configured(&fleet, move |s| {
        s.gateway_config = Some(Arc::new(move |c| c.storage = storage.clone()));
    })
    .await;
    let (tenant_id, key, key_file) = tenant(&stack, dir.path(), "keeper").await;
    let tenant: uuid::Uuid = tenant_id.parse().unwrap();

    // Nothing is measured before the tenant's bucket is made.
    let (s, usage) = stack.call(Method::GET, "/v1/storage", &key, None).await;
    assert_eq!(s, 200, "{usage}");
    assert_eq!(
        usage,
        json!({"bytes": 0, "measured_at": null, "max_storage_gb": null, "writes_stopped": false})
    );

    let mnist = mnist_dir(dir.path());
    let put = lh(
        &stack,
        &key_file,
        &["data", "put", mnist.to_str().unwrap(), "--name", "mnist"],
    )
    .await;
    assert_eq!(put.code, 0, "{}", put.stderr);

    // The gateway measures the bucket: its files' bytes and the manifest.
    let files_bytes = 100_000 + "seven pictures of sevens\n".len() as u64;
    let measured = stack
        .wait_log(30, |log| {
            storage_events(log, "storage.measured", |d| match d {
                EventData::StorageMeasured(m) if m.tenant_id == tenant && m.bytes > files_bytes => {
                    Some(m.clone())
                }
                _ => None,
            })
            .into_iter()
            .next()
        })
        .await;
    assert_eq!(measured.bucket, format!("lh-t-{}", tenant.simple()));

    // Pricing charges the bytes of one measurement until the next, at the
    // default book's 0.12 CNY per GB-month, on the tenant's storage id.
    let charge = stack
        .wait_log(30, |log| {
            storage_events(log, "charge.storage_accrued", |d| match d {
                EventData::StorageChargeAccrued(c) if c.tenant_id == tenant && c.bytes > 0 => {
                    Some(c.clone())
                }
                _ => None,
            })
            .into_iter()
            .next()
        })
        .await;
    assert_eq!(charge.storage_id, lh_events::storage_id(tenant));
    assert_eq!(charge.price_cny_per_gb_month.to_string(), "0.12");
    assert!(charge.to > charge.from, "{charge:?}");
    let period = charge.period.clone();

    // The tenant's invoice of the month carries them as a line of its own,
    // counted in its total.
    let mut invoice = Value::Null;
    for _ in 0..200 {
        let (s, body) = stack
            .call(Method::GET, &format!("/v1/invoices/{period}"), &key, None)
            .await;
        assert_eq!(s, 200, "{body}");
        invoice = body;
        let storage_lines = invoice["lines"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["tier"] == "storage")
            .count();
        if storage_lines == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let line = invoice["lines"]
        .as_array()
        .and_then(|lines| lines.iter().find(|l| l["tier"] == "storage"))
        .unwrap_or_else(|| panic!("no storage line on {invoice}"))
        .clone();
    assert_eq!(line["lease_id"], lh_events::storage_id(tenant).to_string());
    assert!(line["charges"].as_u64().unwrap() >= 1, "{line}");
    let lines_sum: rust_decimal::Decimal = invoice["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            l["amount"]
                .as_str()
                .unwrap()
                .parse::<rust_decimal::Decimal>()
                .unwrap()
        })
        .sum();
    assert_eq!(
        invoice["total"]
            .as_str()
            .unwrap()
            .parse::<rust_decimal::Decimal>()
            .unwrap(),
        lines_sum,
        "{invoice}"
    );

    // The tenant sees what it holds, through the API and `lh data usage`.
    let usage = loop {
        let (s, usage) = stack.call(Method::GET, "/v1/storage", &key, None).await;
        assert_eq!(s, 200, "{usage}");
        if usage["bytes"].as_u64().unwrap_or(0) > files_bytes {
            break usage;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(usage["measured_at"].is_string(), "{usage}");
    let shown = lh(&stack, &key_file, &["data", "usage"]).await;
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert!(shown.stdout.contains("quota"), "{}", shown.stdout);
    let (s, p) = stack
        .call(Method::GET, "/v1/storage", ADMIN_TOKEN, None)
        .await;
    assert_eq!((s, p["field"].as_str()), (422, Some("tenant_id")), "{p}");
    assert!(stack
        .metrics_text()
        .await
        .contains("lh_gateway_storage_measurements_total{result=\"recorded\"}"));

    // A quota of 0 GB: no version that adds bytes is taken.
    let set_quota = |quota: Value| {
        let stack = &stack;
        let tenant_id = tenant_id.clone();
        async move {
            stack
                .call(
                    Method::PUT,
                    &format!("/v1/tenants/{tenant_id}/quota"),
                    ADMIN_TOKEN,
                    Some(json!({ "quota": quota })),
                )
                .await
        }
    };
    let (s, p) = set_quota(json!({"max_gpus": 2, "max_storage_gb": 2_000_000_000u64})).await;
    assert_eq!(
        (s, p["field"].as_str()),
        (422, Some("quota.max_storage_gb")),
        "{p}"
    );
    let (s, changed) = set_quota(json!({"max_gpus": 2, "max_storage_gb": 0})).await;
    assert_eq!(s, 200, "{changed}");
    assert_eq!(changed["max_storage_gb"], 0, "{changed}");
    let (s, usage) = stack.call(Method::GET, "/v1/storage", &key, None).await;
    assert_eq!((s, &usage["max_storage_gb"]), (200, &json!(0)), "{usage}");
    let (s, view) = stack
        .call(Method::GET, "/v1/datasets/mnist", &key, None)
        .await;
    assert_eq!(s, 200, "{view}");
    let version = view["versions"][0]["version"].as_str().unwrap().to_string();
    let (s, manifest) = stack
        .call(
            Method::GET,
            &format!("/v1/datasets/mnist/versions/{version}/manifest"),
            &key,
            None,
        )
        .await;
    assert_eq!(s, 200, "{manifest}");
    // Its chunks are in the bucket: only the quota refuses it.
    let copy = json!({"name": "mnist-copy", "manifest": manifest});
    let (s, p) = stack
        .call(Method::POST, "/v1/datasets", &key, Some(copy.clone()))
        .await;
    assert_eq!(s, 422, "{p}");
    assert_eq!(p["field"], "manifest", "{p}");
    assert_eq!(
        p["type"], "https://leasehold.dev/problems/quota-exceeded",
        "{p}"
    );
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("storage quota of 0 GB")
            && detail.contains(&format!("adds {files_bytes} bytes")),
        "{detail}"
    );
    // A version the dataset holds adds nothing: taken again as it was.
    let (s, p) = stack
        .call(
            Method::POST,
            "/v1/datasets",
            &key,
            Some(json!({"name": "mnist", "manifest": manifest})),
        )
        .await;
    assert_eq!(s, 200, "{p}");
    // `lh data put` sends nothing to a full bucket.
    let more = dir.path().join("more");
    std::fs::create_dir_all(&more).unwrap();
    std::fs::write(more.join("x"), "more bytes").unwrap();
    let refused = lh(
        &stack,
        &key_file,
        &["data", "put", more.to_str().unwrap(), "--name", "more"],
    )
    .await;
    assert_ne!(refused.code, 0, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("nothing sent"),
        "{}",
        refused.stderr
    );

    // Measured over its quota, the tenant's own identity writes nothing
    // more, whoever holds it (a node's sync, a container); it still reads,
    // lists and deletes.
    let writes_stopped = |stopped: bool| {
        let (stack, key) = (&stack, key.clone());
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let (s, usage) = stack.call(Method::GET, "/v1/storage", &key, None).await;
                assert_eq!(s, 200, "{usage}");
                if usage["writes_stopped"] == json!(stopped) {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "writes_stopped never {stopped}: {usage}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    writes_stopped(true).await;
    let own = own_store(&stack, &key).await;
    let written = own
        .put("results/over.txt", bytes::Bytes::from_static(b"x"))
        .await;
    assert!(written.is_err(), "a write over the quota: {written:?}");
    let listed = own.list("").await.unwrap();
    assert!(!listed.is_empty());
    assert!(own.get(&listed[0].key).await.unwrap().is_some());
    let shown = lh(&stack, &key_file, &["data", "usage"]).await;
    assert!(shown.stdout.contains("stopped"), "{}", shown.stdout);

    // Without a quota, the copy is taken, and writes come back with the
    // next measurement.
    let (s, _) = set_quota(json!({"max_gpus": 2})).await;
    assert_eq!(s, 200);
    let (s, p) = stack
        .call(Method::POST, "/v1/datasets", &key, Some(copy))
        .await;
    assert_eq!(s, 201, "{p}");
    writes_stopped(false).await;
    own.put("results/under.txt", bytes::Bytes::from_static(b"x"))
        .await
        .unwrap();
}

/// The workload of the lost-node test: counts its runs in its workspace.
const COUNT_RUNS: &str = "n=$(cat /workspace/ckpt 2>/dev/null || echo 0); \
    echo \"resumed from $n\"; echo $((n + 1)) > /workspace/ckpt; echo checkpointed; sleep 600";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_from_a_lost_node_starts_elsewhere_from_its_workspaces_last_sync() {
    base_image();
    let store = S3Store::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (node_a, node_b, fleet) = two_node_fleet();
    let mut stack = stack_with(
        &store,
        &fleet,
        dir.path(),
        |_| {},
        |s| {
            s.node_runtime = RuntimeKind::Podman;
            s.node_container_args = PODMAN_ARGS.map(String::from).into();
            s.node_storage.workspace_sync_interval_secs = 1;
            s.node_storage.workspace_release_wait_secs = 3;
        },
    )
    .await;
    let (_, key, _) = tenant(&stack, dir.path(), "survivor").await;
    let (s, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": {
                "image": "localhost/leasehold/base",
                "command": ["sh", "-c", COUNT_RUNS],
                "workspaces": [{"name": "ws", "path": "/workspace"}],
            }})),
        )
        .await;
    assert_eq!(s, 202, "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();
    let first = stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    wait_log_text(&stack, &key, &id, "checkpointed").await;
    // A periodic sync carries the checkpoint before the node is lost.
    stack
        .wait_log(30, |log| {
            of_type(log, "lease.workspace_synced")
                .into_iter()
                .find_map(|e| match &e.envelope.data {
                    lh_events::EventData::LeaseWorkspaceSynced(s)
                        if s.lease_id.to_string() == id
                            && s.reason == lh_events::WorkspaceSyncReason::Interval
                            && s.files == 1 =>
                    {
                        Some(())
                    }
                    _ => None,
                })
        })
        .await;

    // Its node goes, without a word: no last sync, no release. Its host
    // goes with it (the container, here on the same host, is removed).
    let from = first["node_id"].as_str().unwrap().to_string();
    let to = if from == node_a {
        node_b.clone()
    } else {
        node_a.clone()
    };
    stack.kill_service(&format!("node-agent:{from}")).await;
    let _ = std::process::Command::new("podman")
        .args(PODMAN_ARGS)
        .args(["rm", "--force", "--time", "0", &format!("lh-{id}")])
        .output();
    let moved = stack
        .wait_lease_within(
            &key,
            &id,
            |l| (l["state"] == "running" && l["node_id"] == json!(to)) || l["state"] == "ended",
            Duration::from_secs(90),
        )
        .await;
    assert_eq!(moved["state"], "running", "{moved}");
    let text = wait_log_text(&stack, &key, &id, "resumed from 1").await;
    assert!(text.contains("checkpointed"), "{text}");
}

/// What a container with `object_store` runs: writes a result to its
/// tenant's bucket and reads it back with the identity it was given, then
/// tries the bucket of another tenant (`$OTHER`) every way it can.
const REACH_STORE: &str = r#"set -u
s3() { curl -sS --aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "$@"; }
echo "step 3 loss 0.25" > /scratch/result.txt
s3 -o /dev/null -w 'own-put %{http_code}\n' -T /scratch/result.txt "$AWS_ENDPOINT_URL/$LH_BUCKET/results/run-1.txt"
echo "own-get $(s3 "$AWS_ENDPOINT_URL/$LH_BUCKET/results/run-1.txt")"
s3 -o /dev/null -w 'other-list %{http_code}\n' "$AWS_ENDPOINT_URL/$OTHER?list-type=2"
s3 -o /dev/null -w 'other-get %{http_code}\n' "$AWS_ENDPOINT_URL/$OTHER/datasets/mnist"
s3 -o /dev/null -w 'other-put %{http_code}\n' -T /scratch/result.txt "$AWS_ENDPOINT_URL/$OTHER/planted.txt"
s3 -o /dev/null -w 'other-delete %{http_code}\n' -X DELETE "$AWS_ENDPOINT_URL/$OTHER/datasets/mnist"
curl -sS -o /dev/null -w 'unsigned %{http_code}\n' "$AWS_ENDPOINT_URL/$LH_BUCKET/results/run-1.txt"
echo reached; sleep 600"#;

/// What a container without it runs: it has no identity and no store.
const NO_STORE: &str = r#"echo "identity [${AWS_ACCESS_KEY_ID:-}] endpoint [${AWS_ENDPOINT_URL:-}]"
if curl -sS -m 5 -o /dev/null http://127.0.0.1:8333/ 2>/dev/null; then echo store-reached; else echo store-unreachable; fi
echo looked; sleep 600"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_container_reaches_its_tenants_bucket_through_its_relay_and_no_other_tenants() {
    base_image();
    let store = S3Store::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_, _, fleet) = two_node_fleet();
    let stack = stack_on(&store, &fleet, dir.path(), true).await;
    let (_, key, _) = tenant(&stack, dir.path(), "writer").await;
    let (other_id, _, other_key_file) = tenant(&stack, dir.path(), "neighbour").await;
    // The neighbour's bucket holds a dataset.
    let mnist = mnist_dir(dir.path());
    let put = lh(
        &stack,
        &other_key_file,
        &["data", "put", mnist.to_str().unwrap(), "--name", "mnist"],
    )
    .await;
    assert_eq!(put.code, 0, "{}{}", put.stdout, put.stderr);
    let other_bucket = format!(
        "lh-t-{}",
        uuid::Uuid::parse_str(&other_id).unwrap().simple()
    );

    // On its tenant's network, which has no way out: the relay is in the
    // container's own namespace whatever its network.
    let (s, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": {
                "image": "localhost/leasehold/base",
                "command": ["sh", "-c", REACH_STORE],
                "env": {"OTHER": other_bucket},
                "network": "tenant",
                "object_store": true,
            }})),
        )
        .await;
    assert_eq!(s, 202, "{lease}");
    assert_eq!(lease["workload"]["object_store"], true, "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();
    let text = wait_log_text(&stack, &key, &id, "reached").await;
    for line in [
        "own-put 200",
        "own-get step 3 loss 0.25",
        "other-list 403",
        "other-get 403",
        "other-put 403",
        "other-delete 403",
        "unsigned 403",
    ] {
        assert!(text.contains(line), "{line:?} not in: {text}");
    }
    // The result is in the tenant's bucket, the neighbour's is as it was.
    let own = own_store(&stack, &key).await;
    let result = own
        .get("results/run-1.txt")
        .await
        .unwrap()
        .expect("the result");
    assert_eq!(&result[..], b"step 3 loss 0.25\n");
    let other_key = std::fs::read_to_string(&other_key_file).unwrap();
    let theirs = own_store(&stack, &other_key).await;
    assert!(!exists(&theirs, "planted.txt").await);

    // A container that did not ask has neither the identity nor the relay.
    let (s, bare) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": {
                "image": "localhost/leasehold/base",
                "command": ["sh", "-c", NO_STORE],
            }})),
        )
        .await;
    assert_eq!(s, 202, "{bare}");
    let bare_id = bare["id"].as_str().unwrap().to_string();
    let text = wait_log_text(&stack, &key, &bare_id, "looked").await;
    assert!(text.contains("identity [] endpoint []"), "{text}");
    assert!(text.contains("store-unreachable"), "{text}");

    // Stopped, the relay goes with the container.
    let (s, body) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(s, 202, "{body}");
    stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;

    // A process lease cannot ask: it shares the host's network.
    let (s, refused) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": {
                "command": ["true"], "object_store": true,
            }})),
        )
        .await;
    assert_eq!(s, 422, "{refused}");
    assert_eq!(refused["field"], "workload.object_store", "{refused}");
}

/// Two leases asked for one after the other with one workspace, while the
/// read model does not show the first yet (its projection held back by a
/// lock on the leases table, as a slow projection would be): the second is
/// refused by the field all the same. The first's request again (its
/// Idempotency-Key) is the same lease, not a refusal; once it has ended,
/// the workspace is free for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workspace_goes_to_one_lease_even_before_the_read_model_shows_it() {
    use sqlx::Connection;
    let store = S3Store::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_, _, fleet) = two_node_fleet();
    let stack = stack_on(&store, &fleet, dir.path(), false).await;
    let (tenant_id, key, _) = tenant(&stack, dir.path(), "racer").await;
    let stack_pool = sqlx::PgPool::connect(&stack.database_url).await.unwrap();
    let body = json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": {
        "image": "localhost/leasehold/base", "command": ["true"],
        "workspaces": [{"name": "ws", "path": "/workspace"}],
    }});
    let ask = |idempotency_key: &'static str| {
        let (stack, key, body) = (&stack, key.clone(), body.clone());
        async move {
            let response = reqwest::Client::new()
                .post(format!("{}/v1/leases", stack.gateway_url))
                .bearer_auth(&key)
                .header("Idempotency-Key", idempotency_key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let mut db = sqlx::PgConnection::connect(&stack.database_url)
        .await
        .unwrap();
    let schema = stack.gateway_config().schema;
    sqlx::query("BEGIN").execute(&mut db).await.unwrap();
    // Reads go on; the projection's writes wait.
    sqlx::query(&format!("LOCK TABLE {schema}.leases IN EXCLUSIVE MODE"))
        .execute(&mut db)
        .await
        .unwrap();
    let (s, first) = ask("first").await;
    assert_eq!(s, 202, "{first}");
    let (s, second) = ask("second").await;
    assert_eq!(s, 409, "{second}");
    assert_eq!(second["field"], "workload.workspaces[0].name", "{second}");
    assert!(
        second["detail"]
            .as_str()
            .unwrap()
            .contains(first["id"].as_str().unwrap()),
        "{second}"
    );
    sqlx::query("COMMIT").execute(&mut db).await.unwrap();

    let id = first["id"].as_str().unwrap().to_string();
    let (s, again) = ask("first").await;
    assert_eq!(s, 202, "{again}");
    assert_eq!(again["id"], json!(id));
    // Ended, it lets the workspace go.
    stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    let (s, _) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(s, 202);
    stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    let (s, next) = ask("third").await;
    assert_eq!(s, 202, "{next}");

    // Claims name the tenant's workspaces: an erasure takes them.
    let third = next["id"].as_str().unwrap().to_string();
    stack
        .wait_lease(&key, &third, |l| l["state"] == "running")
        .await;
    let (s, _) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{third}/stop"),
            &key,
            None,
        )
        .await;
    assert_eq!(s, 202);
    stack
        .wait_lease(&key, &third, |l| l["state"] == "ended")
        .await;
    let claims = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM gateway_keys.workspace_claims WHERE tenant_id = $1",
        )
        .bind(tenant_id.parse::<uuid::Uuid>().unwrap())
        .fetch_one(&stack_pool)
        .await
        .unwrap()
    };
    assert_eq!(claims().await, 1);
    for (path, body) in [
        ("suspend", Some(json!({"reason": "leaving"}))),
        ("erase", None),
    ] {
        let (s, p) = stack
            .call(
                Method::POST,
                &format!("/v1/tenants/{tenant_id}/{path}"),
                ADMIN_TOKEN,
                body,
            )
            .await;
        assert!((200..300).contains(&s), "{path}: {p}");
    }
    assert_eq!(claims().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_first_member_of_a_gang_keeps_its_workspace() {
    base_image();
    let store = S3Store::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_, _, fleet) = two_node_fleet();
    let stack = stack_with(
        &store,
        &fleet,
        dir.path(),
        |_| {},
        |s| {
            s.node_runtime = RuntimeKind::Podman;
            s.node_container_args = PODMAN_ARGS.map(String::from).into();
            s.node_storage.workspace_sync_interval_secs = 1;
        },
    )
    .await;
    let key = stack.create_trusted_tenant("gangdata", 2).await;
    // Two one-GPU nodes: a lease of two is a gang across both. Each rank
    // writes its own file into the workspace.
    let (s, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 2, "gpu_model": "A100-40GB", "workload": {
                "image": "localhost/leasehold/base",
                "command": ["sh", "-c", "echo $RANK > /workspace/rank-$RANK; echo wrote; sleep 600"],
                "workspaces": [{"name": "ws", "path": "/workspace"}],
            }})),
        )
        .await;
    assert_eq!(s, 202, "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();
    // Two containers to start on a loaded machine: more than a lease's
    // usual wait.
    let running = stack
        .wait_lease_within(
            &key,
            &id,
            |l| l["state"] == "running",
            Duration::from_secs(90),
        )
        .await;
    let first = running["members"][0]["node_id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_log_text(&stack, &key, &id, "wrote").await;
    // A sync is recorded when the workspace changed: the first member's
    // comes; a few intervals later, still no other member's.
    let syncs = |log: &[lh_bus::Stored]| -> Vec<lh_events::LeaseWorkspaceSynced> {
        of_type(log, "lease.workspace_synced")
            .into_iter()
            .filter_map(|e| match &e.envelope.data {
                lh_events::EventData::LeaseWorkspaceSynced(s) if s.lease_id.to_string() == id => {
                    Some(s.clone())
                }
                _ => None,
            })
            .collect()
    };
    stack
        .wait_log(60, |log| {
            syncs(log).iter().any(|s| s.files == 1).then_some(())
        })
        .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let synced = syncs(&lh_test_stack::read_log(&stack.bus().await).await);
    assert!(synced.iter().all(|s| s.node_id == first), "{synced:?}");
    // What the first rank wrote, and never the other's file.
    assert!(synced.iter().all(|s| s.files <= 1), "{synced:?}");
    assert_eq!(synced.last().map(|s| s.files), Some(1), "{synced:?}");
    let (s, b) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(s, 202, "{b}");
    stack
        .wait_lease_within(
            &key,
            &id,
            |l| l["state"] == "ended",
            Duration::from_secs(90),
        )
        .await;
}
