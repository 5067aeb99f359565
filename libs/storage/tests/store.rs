//! lh-storage against a real S3 service: SeaweedFS, as `make up` runs it.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use lh_storage::{
    chunk_key, download, garbage_collect, scan_dir, upload_dir, Admin, Credentials, EntryKind,
    Error, Manifest, NoProgress, Phase, ProgressEvent, Scan, StoreConfig, TenantStore, CHUNK_BYTES,
};
use lh_testkit::S3Store;
use rand::RngCore;

/// Puts at once while filling a bucket.
const PUTS_IN_FLIGHT: usize = 16;
/// Long enough for dropped clients' connections to close.
const CONNECTIONS_CLOSE_WAIT: Duration = Duration::from_millis(200);

fn config(store: &S3Store) -> StoreConfig {
    StoreConfig::new(store.endpoint())
}

fn admin(store: &S3Store) -> Admin {
    let (key, secret) = store.admin_keys();
    Admin::new(&config(store), Credentials::new(key, secret)).unwrap()
}

async fn scan(root: &Path) -> Scan {
    let root = root.to_owned();
    tokio::task::spawn_blocking(move || scan_dir(&root, &NoProgress))
        .await
        .unwrap()
        .unwrap()
}

/// What SeaweedFS lets any identity do on its own: make itself another
/// access key, under the same policy. `None` where the service refuses.
async fn mint_own_key(endpoint: &str, key: &Credentials, user: &str) -> Option<Credentials> {
    use lh_storage::sigv4;
    let host = endpoint.trim_start_matches("http://");
    let body = format!("Action=CreateAccessKey&UserName={user}&Version=2010-05-08");
    let amz_date = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
    let payload = sigv4::payload_sha256(body.as_bytes());
    let content_type = "application/x-www-form-urlencoded";
    let headers = [
        ("content-type", content_type),
        ("host", host),
        ("x-amz-content-sha256", payload.as_str()),
        ("x-amz-date", amz_date.as_str()),
    ];
    let authorization = sigv4::authorization(
        &key.access_key_id,
        &key.secret_access_key,
        &sigv4::Scope {
            amz_date: &amz_date,
            region: "us-east-1",
            service: "iam",
        },
        &sigv4::Request {
            method: "POST",
            path: "/",
            query: &[],
            headers: &headers,
            payload_sha256: &payload,
        },
    );
    let mut request = reqwest::Client::new().post(format!("{endpoint}/"));
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let answer = request
        .header("authorization", authorization)
        .body(body)
        .send()
        .await
        .unwrap();
    if !answer.status().is_success() {
        return None;
    }
    let text = answer.text().await.unwrap();
    let field = |name: &str| {
        let start = text.find(&format!("<{name}>")).unwrap() + name.len() + 2;
        let end = start + text[start..].find('<').unwrap();
        text[start..end].to_owned()
    };
    Some(Credentials::new(
        field("AccessKeyId"),
        field("SecretAccessKey"),
    ))
}

/// Stops the store once the clients' connections are closed: their tasks
/// close them only when the runtime runs, and the store waits for open
/// connections before it exits.
async fn stop(store: S3Store) {
    tokio::time::sleep(CONNECTIONS_CLOSE_WAIT).await;
    drop(store);
}

fn assert_denied<T: std::fmt::Debug>(what: &str, result: lh_storage::Result<T>) {
    let error = result.expect_err(what);
    assert!(error.is_denied(), "{what}: {error}");
    assert_eq!(error.status(), Some(403), "{what}: {error}");
}

#[tokio::test]
async fn a_tenants_key_reaches_its_own_bucket_only_and_dies_when_revoked() {
    let store = S3Store::start().await.unwrap();
    tenants_are_isolated(&store).await;
    stop(store).await;
}

async fn tenants_are_isolated(store: &S3Store) {
    let admin = admin(store);
    let config = config(store);
    for bucket in ["lh-t-a", "lh-t-b"] {
        admin.ensure_bucket(bucket).await.unwrap();
        // Again: already the admin's.
        admin.ensure_bucket(bucket).await.unwrap();
    }
    let a_key = admin
        .ensure_tenant_identity("lh-t-a", "lh-t-a")
        .await
        .unwrap();
    // Again: the user is there already; another key, both valid.
    let a_second_key = admin
        .ensure_tenant_identity("lh-t-a", "lh-t-a")
        .await
        .unwrap();
    assert_ne!(a_key.access_key_id, a_second_key.access_key_id);
    assert!(!format!("{a_key:?}").contains(&a_key.secret_access_key));
    let b_key = admin
        .ensure_tenant_identity("lh-t-b", "lh-t-b")
        .await
        .unwrap();

    let a = TenantStore::new(&config, "lh-t-a", &a_key).unwrap();
    let a_again = TenantStore::new(&config, "lh-t-a", &a_second_key).unwrap();
    a.put("x/hello", Bytes::from_static(b"hi")).await.unwrap();
    assert_eq!(
        a_again.get("x/hello").await.unwrap(),
        Some(Bytes::from_static(b"hi"))
    );
    let listed = a.list("x").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].key.as_str(), listed[0].bytes), ("x/hello", 2));
    assert_eq!(a.get("x/none").await.unwrap(), None);

    let b = TenantStore::new(&config, "lh-t-b", &b_key).unwrap();
    b.put("secret", Bytes::from_static(b"b's")).await.unwrap();

    // A's key on B's bucket: every verb refused.
    let a_on_b = TenantStore::new(&config, "lh-t-b", &a_key).unwrap();
    assert_denied("get", a_on_b.get("secret").await);
    assert_denied("head", a_on_b.head("secret").await);
    assert_denied("put", a_on_b.put("planted", Bytes::from_static(b"x")).await);
    assert_denied("list", a_on_b.list("").await);
    assert_denied("delete", a_on_b.delete("secret").await);
    assert_eq!(
        b.get("secret").await.unwrap(),
        Some(Bytes::from_static(b"b's"))
    );
    assert_eq!(b.get("planted").await.unwrap(), None);

    // Nor may it act as an admin: no buckets, no identities.
    let a_as_admin = Admin::new(&config, a_key.clone()).unwrap();
    let error = a_as_admin.ensure_bucket("lh-t-c").await.unwrap_err();
    assert!(error.is_denied(), "{error}");
    let error = a_as_admin
        .ensure_tenant_identity("lh-t-a", "lh-t-b")
        .await
        .unwrap_err();
    assert!(error.is_denied(), "{error}");
    assert_denied("A on B after trying", a_on_b.get("secret").await);

    // SeaweedFS lets A make itself a key (never one of B's); it is confined
    // as A is, and revoked with A.
    assert!(mint_own_key(&store.endpoint(), &a_key, "lh-t-b")
        .await
        .is_none());
    let minted = mint_own_key(&store.endpoint(), &a_key, "lh-t-a").await;
    if let Some(minted) = &minted {
        let on_a = TenantStore::new(&config, "lh-t-a", minted).unwrap();
        assert!(on_a.get("x/hello").await.unwrap().is_some());
        let on_b = TenantStore::new(&config, "lh-t-b", minted).unwrap();
        assert_denied("minted key on B", on_b.get("secret").await);
    }

    admin.revoke_identity("lh-t-a").await.unwrap();
    if let Some(minted) = &minted {
        let on_a = TenantStore::new(&config, "lh-t-a", minted).unwrap();
        assert_denied("revoked minted key", on_a.get("x/hello").await);
    }
    assert_denied("revoked key", a.get("x/hello").await);
    assert_denied("revoked second key", a_again.get("x/hello").await);
    // Again, and for a user never made: nothing to do.
    admin.revoke_identity("lh-t-a").await.unwrap();
    admin.revoke_identity("lh-t-never").await.unwrap();
    // B is untouched.
    assert_eq!(
        b.get("secret").await.unwrap(),
        Some(Bytes::from_static(b"b's"))
    );
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rand::thread_rng().fill_bytes(&mut data);
    data
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// The tree the round trip sends: a file of three chunks, a file equal to
/// its first chunk, small, empty and executable files, nested and empty
/// directories, symlinks in and out.
fn make_tree(root: &Path) -> Vec<u8> {
    let big = random_bytes(20 * 1024 * 1024);
    std::fs::write(root.join("big.bin"), &big).unwrap();
    std::fs::write(root.join("small.txt"), b"hello").unwrap();
    std::fs::write(root.join("empty"), b"").unwrap();
    std::fs::write(root.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(root.join("nested/deeper")).unwrap();
    std::fs::write(
        root.join("nested/deeper/first-chunk.bin"),
        &big[..CHUNK_BYTES as usize],
    )
    .unwrap();
    std::fs::create_dir(root.join("empty-dir")).unwrap();
    symlink("small.txt", root.join("link")).unwrap();
    symlink("/etc/passwd", root.join("nested/outward")).unwrap();
    big
}

#[tokio::test]
async fn a_directory_round_trips_deduplicated_resumable_and_verified() {
    let store = S3Store::start().await.unwrap();
    round_trip(&store).await;
    stop(store).await;
}

async fn round_trip(store: &S3Store) {
    let admin = admin(store);
    let config = config(store);
    admin.ensure_bucket("lh-t-data").await.unwrap();
    let key = admin
        .ensure_tenant_identity("lh-t-data", "lh-t-data")
        .await
        .unwrap();
    let tenant = TenantStore::new(&config, "lh-t-data", &key).unwrap();

    let src = tempfile::tempdir().unwrap();
    make_tree(src.path());
    let scanned = scan(src.path()).await;
    assert_eq!(scanned.skipped_total, 0, "{:?}", scanned.skipped);
    let manifest = scanned.manifest;
    manifest.validate(&Default::default()).unwrap();
    let paths: Vec<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "big.bin",
            "empty",
            "empty-dir",
            "link",
            "nested",
            "nested/deeper",
            "nested/deeper/first-chunk.bin",
            "nested/outward",
            "run.sh",
            "small.txt"
        ]
    );
    let total = manifest.total_bytes();
    assert_eq!(total, 20 * 1024 * 1024 + CHUNK_BYTES + 5 + 18);
    // big.bin's three, small.txt's and run.sh's; first-chunk.bin's is big.bin's first.
    assert_eq!(manifest.chunk_set().len(), 5);

    let events = Arc::new(Mutex::new(Vec::<ProgressEvent>::new()));
    let record = {
        let events = events.clone();
        move |event: ProgressEvent| events.lock().unwrap().push(event)
    };
    let sent = upload_dir(&tenant, src.path(), &manifest, &record)
        .await
        .unwrap();
    assert_eq!((sent.chunks_sent, sent.chunks_skipped), (5, 0));
    assert_eq!(sent.bytes_sent, 20 * 1024 * 1024 + 5 + 18);
    let last = *events.lock().unwrap().last().unwrap();
    assert_eq!(last.phase, Phase::Upload);
    assert_eq!(Some(last.bytes_done), last.bytes_total);
    let digest = tenant
        .put_manifest("manifests/ws.json", &manifest)
        .await
        .unwrap();
    assert_eq!(digest, manifest.digest());

    // Everything is there already: nothing is sent again. (On a task of
    // its own, as a service runs it: the future is `Send`.)
    let again = tokio::spawn({
        let (tenant, manifest, src) = (tenant.clone(), manifest.clone(), src.path().to_owned());
        async move { upload_dir(&tenant, &src, &manifest, &NoProgress).await }
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        (again.chunks_sent, again.chunks_skipped, again.bytes_sent),
        (0, 5, 0)
    );

    let stored: Manifest = tenant
        .get_manifest("manifests/ws.json")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, manifest);
    let dest = tempfile::tempdir().unwrap();
    events.lock().unwrap().clear();
    // On a task of its own, as a service runs it: the future is `Send`.
    let got = tokio::spawn({
        let (tenant, stored, dest) = (tenant.clone(), stored.clone(), dest.path().to_owned());
        let record = record.clone();
        async move { download(&tenant, &stored, &dest, &record).await }
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!((got.files, got.dirs, got.symlinks), (5, 3, 2));
    assert_eq!((got.chunks, got.bytes), (6, total));
    let last = *events.lock().unwrap().last().unwrap();
    assert_eq!(
        (last.phase, last.bytes_done, last.files_done),
        (Phase::Download, total, 5)
    );
    for entry in &manifest.files {
        let (from, to) = (src.path().join(&entry.path), dest.path().join(&entry.path));
        match &entry.kind {
            EntryKind::File { executable, .. } => {
                assert!(
                    std::fs::read(&from).unwrap() == std::fs::read(&to).unwrap(),
                    "{}",
                    entry.path
                );
                assert_eq!(
                    mode(&to),
                    if *executable { 0o755 } else { 0o644 },
                    "{}",
                    entry.path
                );
            }
            EntryKind::Dir => assert_eq!(mode(&to), 0o755, "{}", entry.path),
            EntryKind::Symlink { target } => {
                assert_eq!(std::fs::read_link(&to).unwrap(), Path::new(target));
            }
        }
    }
    assert_eq!(mode(&dest.path().join("run.sh")), 0o755);
    // A download writes a fresh tree only.
    let error = download(&tenant, &stored, dest.path(), &NoProgress)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("not empty"), "{error}");

    // What the bucket holds: the chunks and the manifest.
    let objects = tenant.list("").await.unwrap();
    assert_eq!(objects.len(), 6);
    let listed: u64 = objects.iter().map(|o| o.bytes).sum();
    let manifest_bytes = manifest.canonical_json().len() as u64;
    assert_eq!(listed, 20 * 1024 * 1024 + 5 + 18 + manifest_bytes);
    assert_eq!(admin.bucket_bytes("lh-t-data").await.unwrap(), listed);

    // A chunk overwritten with other bytes of the same length: the
    // download stops, naming it.
    let EntryKind::File { chunks, .. } = &manifest.files.last().unwrap().kind else {
        panic!("small.txt is a file");
    };
    let small_chunk = chunks[0].clone();
    tenant
        .put(&chunk_key(&small_chunk), Bytes::from_static(b"jello"))
        .await
        .unwrap();
    let dest = tempfile::tempdir().unwrap();
    let error = download(&tenant, &stored, dest.path(), &NoProgress)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::ChunkMismatch { chunk, .. } if *chunk == small_chunk),
        "{error}"
    );
    assert!(error.to_string().contains(&small_chunk), "{error}");

    // A file changed since its scan is not sent.
    let changing = tempfile::tempdir().unwrap();
    std::fs::create_dir(changing.path().join("sub")).unwrap();
    std::fs::write(changing.path().join("sub/f.txt"), b"before").unwrap();
    let before = scan(changing.path()).await.manifest;
    std::fs::write(changing.path().join("sub/f.txt"), b"after!").unwrap();
    let error = upload_dir(&tenant, changing.path(), &before, &NoProgress)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Changed { path, .. } if path == "sub/f.txt"),
        "{error}"
    );
    // A directory swapped for a symlink since the scan, to a directory
    // outside holding the very bytes scanned: still refused, nothing is
    // read through it.
    std::fs::write(changing.path().join("sub/f.txt"), b"before").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("f.txt"), b"before").unwrap();
    std::fs::rename(
        changing.path().join("sub"),
        changing.path().join("sub.real"),
    )
    .unwrap();
    symlink(outside.path(), changing.path().join("sub")).unwrap();
    let error = upload_dir(&tenant, changing.path(), &before, &NoProgress)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Changed { path, .. } if path == "sub/f.txt"),
        "{error}"
    );

    let deleted = admin.empty_and_delete_bucket("lh-t-data").await.unwrap();
    assert_eq!(deleted, 6);
    let error = admin.bucket_bytes("lh-t-data").await.unwrap_err();
    assert!(error.is_not_found(), "{error}");
    assert!(error.to_string().contains("NoSuchBucket"), "{error}");
    assert_eq!(admin.empty_and_delete_bucket("lh-t-data").await.unwrap(), 0);
}

#[tokio::test]
async fn emptying_a_bucket_pages_through_its_listing_and_odd_keys() {
    let store = S3Store::start().await.unwrap();
    empty_a_full_bucket(&store).await;
    stop(store).await;
}

async fn empty_a_full_bucket(store: &S3Store) {
    let admin = admin(store);
    admin.ensure_bucket("lh-t-many").await.unwrap();
    let key = admin
        .ensure_tenant_identity("lh-t-many", "lh-t-many")
        .await
        .unwrap();
    let tenant = TenantStore::new(&config(store), "lh-t-many", &key).unwrap();
    let count = 1203;
    futures::stream::iter(0..count)
        .map(|i| {
            let tenant = tenant.clone();
            async move {
                tenant
                    .put(&format!("k/{i:05}"), Bytes::from(vec![1u8; i % 7]))
                    .await
            }
        })
        .buffer_unordered(PUTS_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
    for odd in ["odd/a b+c", "odd/&<>\"'", "odd/ünï"] {
        tenant.put(odd, Bytes::from_static(b"12")).await.unwrap();
    }
    let expected: u64 = (0..count).map(|i| (i % 7) as u64).sum::<u64>() + 6;
    assert_eq!(admin.bucket_bytes("lh-t-many").await.unwrap(), expected);
    let deleted = admin.empty_and_delete_bucket("lh-t-many").await.unwrap();
    assert_eq!(deleted, count as u64 + 3);
    assert!(admin
        .bucket_bytes("lh-t-many")
        .await
        .unwrap_err()
        .is_not_found());
}

#[tokio::test]
async fn garbage_collection_deletes_only_old_chunks_no_manifest_names() {
    let store = S3Store::start().await.unwrap();
    collect_garbage(&store).await;
    stop(store).await;
}

async fn collect_garbage(store: &S3Store) {
    let admin = admin(store);
    admin.ensure_bucket("lh-t-gc").await.unwrap();
    let key = admin
        .ensure_tenant_identity("lh-t-gc", "lh-t-gc")
        .await
        .unwrap();
    let tenant = TenantStore::new(&config(store), "lh-t-gc", &key).unwrap();
    let kept = tempfile::tempdir().unwrap();
    std::fs::write(kept.path().join("shared"), b"in both trees").unwrap();
    std::fs::write(kept.path().join("kept"), b"only in the kept tree").unwrap();
    let kept_manifest = scan(kept.path()).await.manifest;
    upload_dir(&tenant, kept.path(), &kept_manifest, &NoProgress)
        .await
        .unwrap();
    tenant
        .put_manifest("manifests/kept", &kept_manifest)
        .await
        .unwrap();
    // A tree whose upload never got as far as its manifest.
    let dropped = tempfile::tempdir().unwrap();
    std::fs::write(dropped.path().join("shared"), b"in both trees").unwrap();
    std::fs::write(dropped.path().join("orphan"), b"named by no manifest").unwrap();
    let dropped_manifest = scan(dropped.path()).await.manifest;
    upload_dir(&tenant, dropped.path(), &dropped_manifest, &NoProgress)
        .await
        .unwrap();
    assert_eq!(
        tenant.list(lh_storage::CHUNK_PREFIX).await.unwrap().len(),
        3
    );

    // Young chunks are spared.
    let spared = garbage_collect(&tenant, &["manifests"], Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(
        (
            spared.manifests,
            spared.chunks_live,
            spared.chunks_young,
            spared.chunks_deleted
        ),
        (1, 2, 1, 0)
    );
    // A prefix that would take chunks for manifests is refused.
    assert!(garbage_collect(&tenant, &["chunks"], Duration::ZERO)
        .await
        .is_err());
    // Something under the prefix that is no manifest stops it all.
    tenant
        .put("manifests/junk", Bytes::from_static(b"not json"))
        .await
        .unwrap();
    assert!(garbage_collect(&tenant, &["manifests"], Duration::ZERO)
        .await
        .is_err());
    tenant.delete("manifests/junk").await.unwrap();
    assert_eq!(
        tenant.list(lh_storage::CHUNK_PREFIX).await.unwrap().len(),
        3
    );

    let collected = garbage_collect(&tenant, &["manifests"], Duration::ZERO)
        .await
        .unwrap();
    assert_eq!((collected.chunks_live, collected.chunks_deleted), (2, 1));
    assert_eq!(
        collected.bytes_deleted,
        b"named by no manifest".len() as u64
    );
    let dest = tempfile::tempdir().unwrap();
    download(&tenant, &kept_manifest, dest.path(), &NoProgress)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(dest.path().join("kept")).unwrap(),
        b"only in the kept tree"
    );
}

/// Not a test of correctness: how a download compares with plain GETs of
/// the same chunks, as many in flight (`cargo test --release -- --ignored
/// --nocapture download_keeps_up`).
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn download_keeps_up_with_raw_gets() {
    let store = S3Store::start().await.unwrap();
    compare_with_raw_gets(&store).await;
    stop(store).await;
}

async fn compare_with_raw_gets(store: &S3Store) {
    let admin = admin(store);
    admin.ensure_bucket("lh-t-bench").await.unwrap();
    let key = admin
        .ensure_tenant_identity("lh-t-bench", "lh-t-bench")
        .await
        .unwrap();
    let tenant = TenantStore::new(&config(store), "lh-t-bench", &key).unwrap();
    let src = tempfile::tempdir().unwrap();
    let mebibytes: usize = std::env::var("LH_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    std::fs::write(
        src.path().join("data"),
        random_bytes(mebibytes * 1024 * 1024),
    )
    .unwrap();
    let manifest = scan(src.path()).await.manifest;
    upload_dir(&tenant, src.path(), &manifest, &NoProgress)
        .await
        .unwrap();
    let chunks: Vec<String> = manifest
        .chunk_set()
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mut best_raw = Duration::MAX;
    let mut best_download = Duration::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        futures::stream::iter(chunks.iter())
            .map(|c| {
                let tenant = tenant.clone();
                async move { tenant.get(&chunk_key(c)).await.unwrap().unwrap().len() }
            })
            .buffer_unordered(lh_storage::DOWNLOAD_CHUNKS_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
        best_raw = best_raw.min(t.elapsed());
        let dest = tempfile::tempdir().unwrap();
        let t = Instant::now();
        download(&tenant, &manifest, dest.path(), &NoProgress)
            .await
            .unwrap();
        best_download = best_download.min(t.elapsed());
    }
    let mib = mebibytes as f64;
    eprintln!(
        "{mebibytes} MiB: raw GETs {:.0} MiB/s, download {:.0} MiB/s, ratio {:.2}",
        mib / best_raw.as_secs_f64(),
        mib / best_download.as_secs_f64(),
        best_raw.as_secs_f64() / best_download.as_secs_f64()
    );
}
