//! The node's dataset cache against a real object store (SeaweedFS): a
//! version is staged once and shared by its tenant's leases, a later
//! lease's start copies nothing (it works with the store gone), two
//! stagings at once make one copy, and the least recently used version
//! nobody holds leaves first when the cache is full.

use std::path::Path;
use std::sync::Arc;

use lh_node_agent::storage::cache::DatasetCache;
use lh_storage::{Admin, Credentials, NoProgress, StoreConfig, TenantStore};
use lh_testkit::S3Store;
use uuid::Uuid;

/// A tenant's bucket and its own identity on `store`.
async fn tenant_store(store: &S3Store) -> TenantStore {
    let config = StoreConfig::new(store.endpoint());
    let (id, secret) = store.admin_keys();
    let admin = Admin::new(&config, Credentials::new(id, secret)).unwrap();
    let bucket = format!("lh-t-{}", Uuid::new_v4().simple());
    admin.ensure_bucket(&bucket).await.unwrap();
    let credentials = admin
        .ensure_tenant_identity(&bucket, &bucket)
        .await
        .unwrap();
    TenantStore::new(&config, &bucket, &credentials).unwrap()
}

/// Uploads `files` as dataset `name`'s version, as `lh data put` does:
/// its version.
async fn put_dataset(
    store: &TenantStore,
    dir: &Path,
    name: &str,
    files: &[(&str, usize)],
) -> String {
    let root = dir.join(name);
    std::fs::create_dir_all(&root).unwrap();
    for (file, bytes) in files {
        let data: Vec<u8> = (0..*bytes).map(|i| (i % 251) as u8).collect();
        std::fs::write(root.join(file), data).unwrap();
    }
    let scan = lh_storage::scan_dir(&root, &NoProgress).unwrap();
    lh_storage::upload_dir(store, &root, &scan.manifest, &NoProgress)
        .await
        .unwrap();
    let version = scan.manifest.digest();
    store
        .put_manifest(&format!("datasets/{name}/{version}.json"), &scan.manifest)
        .await
        .unwrap();
    version
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_is_staged_once_for_its_tenants_leases_and_found_again_after_a_restart() {
    let s3 = S3Store::start().await.unwrap();
    let store = tenant_store(&s3).await;
    let dir = tempfile::tempdir().unwrap();
    let tenant = Uuid::new_v4();
    let mnist = put_dataset(&store, dir.path(), "mnist", &[("a", 3_000_000), ("b", 10)]).await;
    let cache = Arc::new(DatasetCache::open(&dir.path().join("cache"), 5_500_000).unwrap());
    // Two leases staging at once: one copy, one directory.
    let (first, second) = tokio::join!(
        cache.stage(&store, tenant, "mnist", &mnist),
        cache.stage(&store, tenant, "mnist", &mnist)
    );
    let (first_dir, first_hold) = first.unwrap();
    let (second_dir, second_hold) = second.unwrap();
    assert_eq!(first_dir, second_dir);
    assert_eq!(std::fs::read(first_dir.join("b")).unwrap().len(), 10);
    assert_eq!(cache.bytes(), 3_000_010);
    let entries = std::fs::read_dir(dir.path().join("cache").join(tenant.to_string()))
        .unwrap()
        .count();
    assert_eq!(entries, 2, "one version and its manifest, no second copy");

    // A third lease of it, with the store gone: nothing is copied.
    drop(s3);
    let (third_dir, third_hold) = cache.stage(&store, tenant, "mnist", &mnist).await.unwrap();
    assert_eq!(third_dir, first_dir);
    // Another tenant's lease does not share it: it would need the store.
    assert!(cache
        .stage(&store, Uuid::new_v4(), "mnist", &mnist)
        .await
        .is_err());
    drop((first_hold, second_hold, third_hold));

    // A restarted agent finds what was staged.
    let cache = Arc::new(DatasetCache::open(&dir.path().join("cache"), 5_500_000).unwrap());
    assert!(cache.holds(tenant, &mnist));
    assert_eq!(cache.bytes(), 3_000_010);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cache_lets_the_least_recently_used_version_nobody_holds_go() {
    let s3 = S3Store::start().await.unwrap();
    let store = tenant_store(&s3).await;
    let dir = tempfile::tempdir().unwrap();
    let tenant = Uuid::new_v4();
    let a = put_dataset(&store, dir.path(), "a", &[("a", 2_000_000)]).await;
    let b = put_dataset(&store, dir.path(), "b", &[("b", 2_000_000)]).await;
    let c = put_dataset(&store, dir.path(), "c", &[("c", 2_000_000)]).await;
    let cache = Arc::new(DatasetCache::open(&dir.path().join("cache"), 4_500_000).unwrap());

    let (_, hold_a) = cache.stage(&store, tenant, "a", &a).await.unwrap();
    let (_, hold_b) = cache.stage(&store, tenant, "b", &b).await.unwrap();
    // Both held: the third does not fit, and nothing held leaves.
    let full = cache.stage(&store, tenant, "c", &c).await.unwrap_err();
    assert!(full.contains("full of datasets in use"), "{full}");
    assert!(cache.holds(tenant, &a) && cache.holds(tenant, &b));
    // `b` let go after `a`, then `a` let go: `b` is the more recent.
    drop(hold_a);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    drop(hold_b);
    let (_, _hold_c) = cache.stage(&store, tenant, "c", &c).await.unwrap();
    assert!(!cache.holds(tenant, &a), "the least recently used left");
    assert!(cache.holds(tenant, &b) && cache.holds(tenant, &c));
    assert!(cache.bytes() <= 4_500_000);
    // Larger than the whole cache: refused, naming the setting.
    let huge = put_dataset(&store, dir.path(), "huge", &[("h", 5_000_000)]).await;
    let refused = cache
        .stage(&store, tenant, "huge", &huge)
        .await
        .unwrap_err();
    assert!(refused.contains("LH_DATA_CACHE_BYTES"), "{refused}");
}
