//! `lh data ...`: a tenant's datasets. `put` reads and hashes the files
//! here, sends the chunks the tenant's bucket lacks straight to the object
//! store with the tenant's own identity (`GET /v1/storage/credentials`),
//! then asks the gateway for the version (`POST /v1/datasets`), which
//! checks the chunks are there. `get` fetches a version's manifest from the
//! gateway and its chunks from the store, each checked against its hash.

use std::io::{IsTerminal as _, Read as _, Write as _};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lh_rpc::http::datasets::{AddDatasetVersion, DatasetView, StorageCredentials, StorageUsage};
use lh_storage::{
    Credentials, FileEntry, Manifest, Phase, Progress, ProgressEvent, StoreConfig, TenantStore,
    CHUNK_BYTES,
};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::args::data::split_dataset;
use crate::args::DataCommand;
use crate::client::Gateway;
use crate::error::{CliError, EXIT_OK};
use crate::output::{emit, write_out, Out};
use crate::render;

/// How often the progress line is drawn again.
const REDRAW_EVERY: Duration = Duration::from_millis(200);

/// Runs one `lh data` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: DataCommand,
    json: bool,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        DataCommand::Put(put) => {
            if let Some(why) = lh_domain::storage::bad_name(&put.name) {
                return Err(CliError::Usage(format!("--name {why}")).into());
            }
            let store = tenant_store(gw).await?;
            let bar = Bar::new();
            let (root, manifest) = scan(&put.path, &bar).await?;
            if let Some(why) = full_already(gw, &manifest).await {
                bar.done();
                return Err(CliError::Usage(why).into());
            }
            let sent = lh_storage::upload_dir(&store, &root, &manifest, &bar).await?;
            bar.done();
            let body = AddDatasetVersion {
                name: put.name.clone(),
                manifest: serde_json::to_value(&manifest)?,
            };
            let view = gw.post(&["v1", "datasets"], &body, &[]).await?;
            // On standard error, so that `--json` output stays one document.
            write_out(
                &mut *err,
                &format!(
                    "sent {} in {} chunks ({} already stored)\n",
                    render::bytes_text(sent.bytes_sent),
                    sent.chunks_sent,
                    sent.chunks_skipped
                ),
            )?;
            emit(out, json, &view, render::dataset_view)?;
            Ok(EXIT_OK)
        }
        DataCommand::Ls(ls) => {
            let mut query = Vec::new();
            if let Some(tenant) = &ls.tenant_id {
                query.push(("tenant_id", tenant.as_str()));
            }
            match &ls.name {
                Some(name) => {
                    let view = gw.get(&["v1", "datasets", name], &query).await?;
                    emit(out, json, &view, render::dataset_view)?;
                }
                None => {
                    let list = gw.get(&["v1", "datasets"], &query).await?;
                    emit(out, json, &list, render::dataset_list)?;
                }
            }
            Ok(EXIT_OK)
        }
        DataCommand::Usage(usage) => {
            let mut query = Vec::new();
            if let Some(tenant) = &usage.tenant_id {
                query.push(("tenant_id", tenant.as_str()));
            }
            let view = gw.get(&["v1", "storage"], &query).await?;
            emit(out, json, &view, render::storage_usage)?;
            Ok(EXIT_OK)
        }
        DataCommand::Get(get) => {
            let (name, version) = split_dataset(&get.dataset);
            let version = match version {
                Some(v) => v.to_string(),
                None => {
                    let (view, _) = gw
                        .get_as::<DatasetView>(&["v1", "datasets", name], &[])
                        .await?;
                    view.versions
                        .first()
                        .map(|v| v.version.clone())
                        .ok_or_else(|| {
                            CliError::Usage(format!("dataset {name:?} has no version"))
                        })?
                }
            };
            let raw = gw
                .get(
                    &["v1", "datasets", name, "versions", &version, "manifest"],
                    &[],
                )
                .await?;
            let manifest: Manifest = serde_json::from_value(raw)?;
            if manifest.digest() != version {
                return Err(CliError::Usage(format!(
                    "the manifest of {name}:{version} does not hash to its version"
                ))
                .into());
            }
            make_empty_dir(&get.dest)?;
            let store = tenant_store(gw).await?;
            let bar = Bar::new();
            let got = lh_storage::download(&store, &manifest, &get.dest, &bar).await?;
            bar.done();
            let answer = json!({
                "name": name, "version": version, "dest": get.dest,
                "files": got.files, "bytes": got.bytes,
            });
            emit(out, json, &answer, |a| {
                format!(
                    "{}:{} -> {} ({} files, {})\n",
                    a["name"].as_str().unwrap_or_default(),
                    a["version"].as_str().unwrap_or_default(),
                    a["dest"].as_str().unwrap_or_default(),
                    a["files"],
                    render::bytes_text(a["bytes"].as_u64().unwrap_or(0))
                )
            })?;
            Ok(EXIT_OK)
        }
        DataCommand::Rm(rm) => {
            let (name, version) = split_dataset(&rm.dataset);
            let query: Vec<(&str, &str)> = version.map(|v| ("version", v)).into_iter().collect();
            gw.delete_with(&["v1", "datasets", name], &query).await?;
            let what = match version {
                Some(v) => format!("{name}:{v}"),
                None => name.to_string(),
            };
            emit(out, json, &json!({"dataset": what, "removed": true}), |a| {
                format!(
                    "removed dataset {}\n",
                    a["dataset"].as_str().unwrap_or_default()
                )
            })?;
            Ok(EXIT_OK)
        }
    }
}

/// The tenant's bucket, with its own identity from the gateway.
/// Why nothing is sent: the bucket holds as much as the tenant's storage
/// quota allows already, and the version has bytes. Chunks sent would stay
/// in the bucket, and be charged, while the gateway refuses the version.
/// Best effort: the gateway decides, so no answer here sends as before.
async fn full_already(gw: &Gateway, manifest: &Manifest) -> Option<String> {
    let (usage, _) = gw
        .get_as::<StorageUsage>(&["v1", "storage"], &[])
        .await
        .ok()?;
    let max_gb = usage.max_storage_gb?;
    let limit = u64::from(max_gb).saturating_mul(lh_domain::storage_rating::BYTES_PER_GB);
    (manifest.total_bytes() > 0 && usage.bytes >= limit).then(|| {
        format!(
            "the tenant's bucket holds {} bytes, its storage quota of {max_gb} GB: \
             nothing sent (lh data usage; remove datasets with lh data rm)",
            usage.bytes
        )
    })
}

async fn tenant_store(gw: &Gateway) -> anyhow::Result<TenantStore> {
    let (creds, _) = gw
        .get_as::<StorageCredentials>(&["v1", "storage", "credentials"], &[])
        .await?;
    let config = StoreConfig {
        endpoint: creds.endpoint.clone(),
        region: creds.region.clone(),
        allow_http: creds.allow_http,
    };
    Ok(TenantStore::new(
        &config,
        &creds.bucket,
        &Credentials::new(creds.access_key_id, creds.secret_access_key),
    )?)
}

/// The directory to upload from and the manifest of what to upload: a
/// directory's whole tree, or one file (then a tree of that file alone).
async fn scan(path: &Path, bar: &Bar) -> anyhow::Result<(std::path::PathBuf, Manifest)> {
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
    if meta.is_dir() {
        let root = path.to_path_buf();
        let scan = lh_storage::scan_dir(&root, bar)?;
        if scan.skipped_total > 0 {
            eprintln!(
                "left out {} entries that are not files, directories or links (sockets, pipes, devices)",
                scan.skipped_total
            );
        }
        return Ok((root, scan.manifest));
    }
    if !meta.is_file() {
        return Err(CliError::Usage(format!(
            "{} is neither a directory nor a file",
            path.display()
        ))
        .into());
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| CliError::Usage(format!("{}: a name in UTF-8 is needed", path.display())))?
        .to_string();
    let root = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let entry = hash_file(path, &name, meta.len(), bar)?;
    Ok((root, Manifest::new(vec![entry])))
}

/// One file's entry: its chunks' hashes.
fn hash_file(path: &Path, name: &str, bytes: u64, bar: &Bar) -> anyhow::Result<FileEntry> {
    use std::os::unix::fs::PermissionsExt;
    let mut file = std::fs::File::open(path)?;
    let executable = file.metadata()?.permissions().mode() & 0o111 != 0;
    let mut chunks = Vec::new();
    let mut buffer = vec![0u8; CHUNK_BYTES as usize];
    let mut done = 0u64;
    loop {
        let mut filled = 0;
        while filled < buffer.len() {
            let n = file.read(&mut buffer[filled..])?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            break;
        }
        chunks.push(hex::encode(Sha256::digest(&buffer[..filled])));
        done += filled as u64;
        bar.report(ProgressEvent {
            phase: Phase::Scan,
            bytes_done: done,
            bytes_total: Some(bytes),
            files_done: 0,
        });
    }
    anyhow::ensure!(
        done == bytes,
        "{} changed while it was read ({bytes} bytes, then {done})",
        path.display()
    );
    Ok(FileEntry::file(name, bytes, executable, chunks))
}

/// Makes `dir`, or takes it if it exists and is empty.
fn make_empty_dir(dir: &Path) -> Result<(), CliError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => match entries.next() {
            None => Ok(()),
            Some(_) => Err(CliError::Usage(format!(
                "{} is not empty: name a new directory",
                dir.display()
            ))),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(dir)
            .map_err(|e| CliError::Usage(format!("making {}: {e}", dir.display()))),
        Err(e) => Err(CliError::Usage(format!("{}: {e}", dir.display()))),
    }
}

/// A progress line on a terminal's standard error, redrawn at most every
/// [`REDRAW_EVERY`]; nothing where standard error is not a terminal.
struct Bar {
    shown: bool,
    started: Instant,
    drawn: Mutex<Option<Instant>>,
}

impl Bar {
    fn new() -> Bar {
        Bar {
            shown: std::io::stderr().is_terminal(),
            started: Instant::now(),
            drawn: Mutex::new(None),
        }
    }

    fn done(&self) {
        if self.shown {
            eprintln!();
        }
    }
}

impl Progress for Bar {
    fn report(&self, event: ProgressEvent) {
        if !self.shown {
            return;
        }
        let mut drawn = self.drawn.lock().unwrap_or_else(|p| p.into_inner());
        let finished = event.bytes_total == Some(event.bytes_done);
        if drawn.is_some_and(|at| at.elapsed() < REDRAW_EVERY) && !finished {
            return;
        }
        *drawn = Some(Instant::now());
        let what = match event.phase {
            Phase::Scan => "hashing",
            Phase::Upload => "sending",
            Phase::Download => "fetching",
        };
        let seconds = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = render::bytes_text((event.bytes_done as f64 / seconds) as u64);
        let line = match event.bytes_total {
            Some(total) if total > 0 => {
                let width = 30usize;
                let filled =
                    ((event.bytes_done.min(total) as f64 / total as f64) * width as f64) as usize;
                format!(
                    "{what} [{}{}] {} / {} {rate}/s",
                    "#".repeat(filled),
                    " ".repeat(width - filled),
                    render::bytes_text(event.bytes_done),
                    render::bytes_text(total)
                )
            }
            _ => format!(
                "{what} {} in {} files, {rate}/s",
                render::bytes_text(event.bytes_done),
                event.files_done
            ),
        };
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K{line}");
        let _ = stderr.flush();
    }
}
