//! A decider's snapshots: its folded state stored now and then, so that a
//! restart reads only the tail of the log after it instead of the whole
//! log; one that does not fit (another format, another shape) is replayed
//! past.

use std::collections::HashMap;

use lh_bus::Bus;
use lh_domain::authority::Authority;
use serde_json::value::RawValue;

use super::{Decider, SkippedTails};

/// Version of a snapshot's own shape: a snapshot of another is not read.
/// 2: with the authority rule's holds, without which a snapshot's reader
/// would refuse every node's report on a lease placed before it.
pub const SNAPSHOT_FORMAT: u32 = 2;

/// `state` as a snapshot's JSON text; `None` when it does not serialise.
pub fn snapshot_of<T: serde::Serialize + ?Sized>(state: &T) -> Option<Box<RawValue>> {
    serde_json::value::to_raw_value(state).ok()
}

/// A snapshot's state read back as `T`; `None` when it does not fit.
pub fn restored<T: serde::de::DeserializeOwned>(state: &RawValue) -> Option<T> {
    serde_json::from_str(state.get()).ok()
}

/// A decider's state at a sequence of the log, as stored: `S` is the
/// state's JSON text, owned when written and borrowed from the stored bytes
/// when read (a large state is not held twice while it is taken back).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct Snapshot<S> {
    pub(super) format: u32,
    /// The newest sequence the fold had read.
    pub(super) sequence: u64,
    /// The subjects it followed: a snapshot of other filters is not read.
    pub(super) filters: Vec<String>,
    pub(super) skipped_tails: HashMap<String, u64>,
    /// The holds the authority rule judged the next event against.
    pub(super) authority: Authority,
    pub(super) state: S,
}

/// Loads the decider's newest usable snapshot: the sequence to read on
/// from (1 without one) and the skipped tails it had.
pub(super) async fn restore<D: Decider>(
    bus: &Bus,
    decider: &mut D,
) -> (u64, SkippedTails, Authority) {
    let none = (1, SkippedTails::default(), Authority::default());
    if decider.snapshot().is_none() {
        return none;
    }
    let key = decider.snapshot_key();
    let bytes = match bus.get_snapshot(&key).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return none,
        Err(e) => {
            tracing::warn!(decider = decider.name(), error = %e, "cannot read the snapshot; replaying the log");
            return none;
        }
    };
    let snapshot: Snapshot<&RawValue> = match serde_json::from_slice(&bytes) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(decider = decider.name(), error = %e, "the snapshot does not decode; replaying the log");
            return none;
        }
    };
    let filters: Vec<String> = decider.filters().iter().map(|f| f.to_string()).collect();
    if snapshot.format != SNAPSHOT_FORMAT || snapshot.filters != filters {
        tracing::info!(
            decider = decider.name(),
            "the snapshot is of another shape; replaying the log"
        );
        return none;
    }
    // Events after it that the log no longer holds would be missing from
    // the fold.
    match bus.first_sequence().await {
        Ok(first) if first <= snapshot.sequence + 1 => {}
        Ok(first) => {
            tracing::info!(
                decider = decider.name(),
                snapshot = snapshot.sequence,
                first,
                "the log no longer holds what follows the snapshot; replaying the log"
            );
            return none;
        }
        Err(e) => {
            tracing::warn!(decider = decider.name(), error = %e, "cannot read the log's first sequence; replaying the log");
            return none;
        }
    }
    let sequence = snapshot.sequence;
    if !decider.restore(snapshot.state) {
        tracing::warn!(
            decider = decider.name(),
            "the snapshot's state does not fit; replaying the log"
        );
        return none;
    }
    tracing::info!(
        decider = decider.name(),
        sequence,
        "started from a snapshot"
    );
    metrics::counter!("lh_snapshots_restored_total", "decider" => decider.name()).increment(1);
    (
        sequence + 1,
        SkippedTails {
            sequences: snapshot.skipped_tails,
        },
        snapshot.authority,
    )
}

/// Stores a snapshot in the background: the loop goes on deciding.
pub(super) fn store_snapshot<D: Decider>(
    bus: &Bus,
    decider: &D,
    snapshot: Snapshot<Box<RawValue>>,
) -> tokio::task::JoinHandle<()> {
    let (bus, key, name) = (bus.clone(), decider.snapshot_key(), decider.name());
    tokio::spawn(async move {
        let sequence = snapshot.sequence;
        let bytes = match serde_json::to_vec(&snapshot) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::error!(decider = name, error = %e, "a snapshot does not serialise");
                return;
            }
        };
        // The state's text is in `bytes` now: not held twice while storing.
        drop(snapshot);
        match bus.put_snapshot(&key, &bytes).await {
            Ok(()) => {
                tracing::info!(
                    decider = name,
                    sequence,
                    bytes = bytes.len(),
                    "snapshot stored"
                );
                metrics::counter!("lh_snapshots_stored_total", "decider" => name).increment(1);
            }
            // The next one is due soon enough; without any, a start replays.
            Err(e) => tracing::warn!(decider = name, error = %e, "cannot store a snapshot"),
        }
    })
}
