//! Workspaces on a real S3 service (SeaweedFS): synced as a node syncs
//! them, snapshotted, restored from a snapshot, deleted, and collected.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{Days, Utc};
use lh_storage::workspace::{self, Holder};
use lh_storage::{
    chunk_key, scan_dir, upload_dir, upload_dir_reusing, Admin, Credentials, NoProgress, Reuse,
    StoreConfig, TenantStore,
};
use lh_testkit::S3Store;
use sha2::{Digest, Sha256};

/// Long enough for dropped clients' connections to close.
const CONNECTIONS_CLOSE_WAIT: Duration = Duration::from_millis(200);

async fn stop(store: S3Store) {
    tokio::time::sleep(CONNECTIONS_CLOSE_WAIT).await;
    drop(store);
}

async fn tenant_store(store: &S3Store, bucket: &str) -> TenantStore {
    let config = StoreConfig::new(store.endpoint());
    let (key, secret) = store.admin_keys();
    let admin = Admin::new(&config, Credentials::new(key, secret)).unwrap();
    admin.ensure_bucket(bucket).await.unwrap();
    let own = admin.ensure_tenant_identity(bucket, bucket).await.unwrap();
    TenantStore::new(&config, bucket, &own).unwrap()
}

fn holder() -> Holder {
    Holder {
        lease_id: uuid::Uuid::new_v4(),
        placement: 1,
        node_id: "node-a".into(),
    }
}

/// A workspace directory holding one file `a` with `content`.
fn tree(content: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), content).unwrap();
    dir
}

fn chunk_of(content: &[u8]) -> String {
    chunk_key(&hex::encode(Sha256::digest(content)))
}

async fn exists(store: &TenantStore, key: &str) -> bool {
    store.info(key).await.unwrap().is_some()
}

async fn keys_under(store: &TenantStore, prefix: &str) -> Vec<String> {
    let mut keys: Vec<String> = store
        .list(prefix)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_workspace_is_snapshotted_restored_deleted_and_collected() {
    let s3 = S3Store::start().await.unwrap();
    let store = tenant_store(&s3, "lh-t-ws").await;
    let today = Utc::now().date_naive();
    let yesterday = today - Days::new(1);
    let expired = today - Days::new(10);
    let me = holder();
    let mut live = HashSet::new();
    let mut sync = |content: &'static [u8]| {
        let store = store.clone();
        let me = me.clone();
        let previous = std::mem::take(&mut live);
        async move {
            let dir = tree(content);
            workspace::sync(&store, "ws", dir.path(), me, false, &previous)
                .await
                .unwrap()
        }
    };

    // Yesterday's snapshot holds v0; one taken ten days ago holds v1; the
    // head and today's snapshot v2.
    let v0 = sync(b"version zero").await;
    let taken = workspace::take_snapshot(&store, "ws", yesterday)
        .await
        .unwrap()
        .unwrap();
    assert!(taken.written);
    assert_eq!(taken.snapshot.manifest, v0.manifest);
    let again = workspace::take_snapshot(&store, "ws", yesterday)
        .await
        .unwrap()
        .unwrap();
    assert!(!again.written, "the head is unchanged: nothing to write");
    let v1 = sync(b"version one, kept ten days ago").await;
    workspace::take_snapshot(&store, "ws", expired)
        .await
        .unwrap()
        .unwrap();
    let v2 = sync(b"version two").await;
    let taken = workspace::take_snapshot(&store, "ws", today)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.snapshot.manifest, v2.manifest);
    assert!(workspace::take_snapshot(&store, "none", today)
        .await
        .unwrap()
        .is_none());
    // Chunks no manifest names: an upload cut short.
    let orphan = tree(b"sent, never named");
    let scan = scan_dir(orphan.path(), &NoProgress).unwrap();
    upload_dir(&store, orphan.path(), &scan.manifest, &NoProgress)
        .await
        .unwrap();
    // A deletion cut short left a manifest with no head.
    let gone = workspace::manifest_key("gone", &v0.manifest);
    store.put_manifest(&gone, &scan.manifest).await.unwrap();

    let objects = workspace::objects_by_name(&store).await.unwrap();
    let listed = workspace::snapshots(&store, "ws", &objects["ws"])
        .await
        .unwrap();
    let dates: Vec<_> = listed.iter().map(|s| s.date).collect();
    assert_eq!(dates, [today, yesterday, expired], "newest first");
    assert_eq!(listed[0].bytes, b"version two".len() as u64);

    let collected =
        workspace::collect(&store, today - Days::new(7), Duration::ZERO, &["datasets/"])
            .await
            .unwrap();
    assert_eq!(collected.workspaces, 1, "{collected:?}");
    assert_eq!(collected.snapshots_deleted, 1, "{collected:?}");
    assert_eq!(
        collected.manifests_deleted, 2,
        "v0's and v1's: {collected:?}"
    );
    assert_eq!(collected.leftovers_deleted, 1, "{collected:?}");
    assert_eq!(
        collected.chunks.chunks_deleted, 2,
        "v1's, named by the expired snapshot alone, and the orphan: {collected:?}"
    );
    assert_eq!(
        keys_under(&store, &workspace::manifests_prefix("ws")).await,
        [workspace::manifest_key("ws", &v2.manifest)]
    );
    assert!(!exists(&store, &workspace::snapshot_key("ws", expired)).await);
    assert!(
        exists(&store, &chunk_of(b"version zero")).await,
        "yesterday's"
    );
    assert!(
        exists(&store, &chunk_of(b"version two")).await,
        "the head's"
    );
    assert!(!exists(&store, &chunk_of(b"version one, kept ten days ago")).await);
    assert!(!exists(&store, &chunk_of(b"sent, never named")).await);
    assert!(!exists(&store, &gone).await);
    assert!(!exists(&store, &workspace::manifest_key("ws", &v1.manifest)).await);

    // Yesterday's snapshot made the head again, released: what a lease
    // mounting it next restores.
    let (head, snapshot) = workspace::restore_snapshot(&store, "ws", yesterday)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(head.manifest, v0.manifest);
    assert_eq!(snapshot.manifest, v0.manifest);
    assert!(head.released);
    assert_eq!(head.holder, me);
    assert_eq!(head.restored.as_ref().map(|r| r.snapshot), Some(yesterday));
    let read = workspace::read_head(&store, "ws").await.unwrap().unwrap();
    assert_eq!(read, head);
    let manifest = workspace::head_manifest(&store, "ws", &read).await.unwrap();
    let back = tempfile::tempdir().unwrap();
    let dest = back.path().join("ws");
    std::fs::create_dir(&dest).unwrap();
    lh_storage::download(&store, &manifest, &dest, &NoProgress)
        .await
        .unwrap();
    assert_eq!(std::fs::read(dest.join("a")).unwrap(), b"version zero");
    assert!(workspace::restore_snapshot(&store, "ws", expired)
        .await
        .unwrap()
        .is_none());
    // The head's old manifest goes; its chunks stay for today's snapshot.
    workspace::collect(&store, today - Days::new(7), Duration::ZERO, &["datasets/"])
        .await
        .unwrap();
    assert!(!exists(&store, &workspace::manifest_key("ws", &v2.manifest)).await);
    assert!(exists(&store, &chunk_of(b"version two")).await);

    // Deleted: every object of it at once, its chunks at the collection.
    let deleted = workspace::delete(&store, "ws").await.unwrap();
    assert!(deleted >= 3, "a manifest and two snapshots: {deleted}");
    assert!(keys_under(&store, "workspaces/").await.is_empty());
    assert!(workspace::read_head(&store, "ws").await.unwrap().is_none());
    let collected = workspace::collect(&store, today, Duration::ZERO, &["datasets/"])
        .await
        .unwrap();
    assert_eq!(collected.chunks.chunks_deleted, 2, "{collected:?}");
    assert!(keys_under(&store, "chunks/").await.is_empty());
    stop(s3).await;
}

#[tokio::test]
async fn a_sync_sends_again_an_old_chunk_no_live_manifest_names() {
    let s3 = S3Store::start().await.unwrap();
    let store = tenant_store(&s3, "lh-t-reuse").await;
    let dir = tree(b"stored once, named by nothing");
    let scan = scan_dir(dir.path(), &NoProgress).unwrap();
    let manifest = scan.manifest;
    let first = upload_dir(&store, dir.path(), &manifest, &NoProgress)
        .await
        .unwrap();
    assert_eq!(first.chunks_sent, 1);
    // Any: taken as it is.
    let any = upload_dir(&store, dir.path(), &manifest, &NoProgress)
        .await
        .unwrap();
    assert_eq!((any.chunks_sent, any.chunks_skipped), (0, 1));
    // Live: taken as it is, however old.
    let live = workspace::chunks_of(&manifest);
    let named = upload_dir_reusing(
        &store,
        dir.path(),
        &manifest,
        &NoProgress,
        Reuse::LiveOrFresh {
            live: &live,
            fresh: Duration::ZERO,
        },
    )
    .await
    .unwrap();
    assert_eq!(named.chunks_sent, 0);
    // Not live and older than the window: sent again, young once more.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let before = store
        .info(&chunk_of(b"stored once, named by nothing"))
        .await
        .unwrap()
        .unwrap();
    let unnamed = upload_dir_reusing(
        &store,
        dir.path(),
        &manifest,
        &NoProgress,
        Reuse::LiveOrFresh {
            live: &HashSet::new(),
            fresh: Duration::ZERO,
        },
    )
    .await
    .unwrap();
    assert_eq!(unnamed.chunks_sent, 1);
    let after = store
        .info(&chunk_of(b"stored once, named by nothing"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        after.last_modified > before.last_modified,
        "{before:?} {after:?}"
    );
    // Within the window: taken as it is.
    let fresh = upload_dir_reusing(
        &store,
        dir.path(),
        &manifest,
        &NoProgress,
        Reuse::LiveOrFresh {
            live: &HashSet::new(),
            fresh: Duration::from_secs(600),
        },
    )
    .await
    .unwrap();
    assert_eq!(fresh.chunks_sent, 0);
    stop(s3).await;
}
