//! Staging a dataset on a node, against a raw GET of the same bytes from
//! the same store in the same run, and a cached start.
//!
//! It starts its own SeaweedFS (as the tests do), uploads `--mib` MiB of
//! random bytes twice: as one object, and as a dataset (8 MiB chunks and a
//! manifest, as `lh data put` does). Each round then times:
//! - a raw GET of the one object, its body read to the end into memory;
//! - staging the dataset with the node agent's own cache into an empty
//!   directory (every chunk fetched, checked against its SHA-256 and
//!   written at its offset; the version renamed into place);
//! - a second lease's staging of the same version: the cached start.
//!
//! `cargo run --release -p lh-load-tests --bin data-bench -- --mib 512 --rounds 5`

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use lh_node_agent::storage::cache::DatasetCache;
use lh_storage::{Admin, Credentials, NoProgress, StoreConfig, TenantStore};
use lh_testkit::S3Store;
use uuid::Uuid;

#[derive(Parser, Debug)]
struct Args {
    /// Size of the dataset, MiB.
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// Rounds; the best of each is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

fn random_bytes(len: usize) -> Vec<u8> {
    // xorshift: incompressible enough, and no chunk repeats.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let s3 = S3Store::start().await?;
    let config = StoreConfig::new(s3.endpoint());
    let (id, secret) = s3.admin_keys();
    let admin = Admin::new(&config, Credentials::new(id, secret))?;
    let bucket = format!("lh-t-{}", Uuid::new_v4().simple());
    admin.ensure_bucket(&bucket).await?;
    let credentials = admin.ensure_tenant_identity(&bucket, &bucket).await?;
    let store = TenantStore::new(&config, &bucket, &credentials)?;

    let dir = tempfile::tempdir()?;
    let src = dir.path().join("src");
    std::fs::create_dir(&src)?;
    let bytes = random_bytes(args.mib << 20);
    std::fs::write(src.join("data"), &bytes)?;
    store
        .put("raw/data", bytes.into())
        .await
        .context("the raw object")?;
    let scan = lh_storage::scan_dir(&src, &NoProgress)?;
    lh_storage::upload_dir(&store, &src, &scan.manifest, &NoProgress).await?;
    let version = scan.manifest.digest();
    store
        .put_manifest(&format!("datasets/bench/{version}.json"), &scan.manifest)
        .await?;

    let (mut raw, mut staged, mut cached) = (Duration::MAX, Duration::MAX, Duration::MAX);
    for round in 0..args.rounds {
        let started = Instant::now();
        let got = store.get("raw/data").await?.context("raw/data")?;
        anyhow::ensure!(got.len() == args.mib << 20, "raw GET short");
        raw = raw.min(started.elapsed());
        drop(got);

        // A fresh cache a round: every round stages from the store.
        let cache = Arc::new(DatasetCache::open(
            &dir.path().join(format!("cache-{round}")),
            u64::MAX,
        )?);
        let tenant = Uuid::new_v4();
        let started = Instant::now();
        let (_, first) = cache
            .stage(&store, tenant, "bench", &version)
            .await
            .map_err(anyhow::Error::msg)?;
        staged = staged.min(started.elapsed());
        let started = Instant::now();
        let (_, second) = cache
            .stage(&store, tenant, "bench", &version)
            .await
            .map_err(anyhow::Error::msg)?;
        cached = cached.min(started.elapsed());
        drop((first, second));
        std::fs::remove_dir_all(dir.path().join(format!("cache-{round}")))?;
    }
    let rate = |d: Duration| args.mib as f64 / d.as_secs_f64();
    println!(
        "{} MiB, best of {}: raw GET {:.0} MiB/s, staging {:.0} MiB/s, ratio {:.2}; \
         cached start {:.2} ms",
        args.mib,
        args.rounds,
        rate(raw),
        rate(staged),
        raw.as_secs_f64() / staged.as_secs_f64(),
        cached.as_secs_f64() * 1000.0
    );
    Ok(())
}
