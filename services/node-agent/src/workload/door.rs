//! The doors into the workloads that run here: for each lease, how a
//! session enters its workload, for which placement, and a signal that
//! ends its sessions when the workload ends or the lease moves.

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use lh_rpc::session::Refusal;
use lh_service::CancellationToken;
use uuid::Uuid;

use super::Engine;

/// How a session enters a lease's workload.
#[derive(Debug, Clone)]
pub enum DoorTarget {
    /// The engine's `exec` into the lease's container.
    Container { engine: Engine, name: String },
    /// A process as the lease's own user, in its home and cgroup, with
    /// the workload's environment.
    Process {
        uid: u32,
        home: PathBuf,
        env: BTreeMap<String, String>,
        /// The lease cgroup's `cgroup.procs`, entered before the command runs.
        cgroup_procs: Option<CString>,
    },
}

#[derive(Debug)]
struct Door {
    placement: u64,
    target: Arc<DoorTarget>,
    ended: CancellationToken,
    sessions: Arc<AtomicU32>,
}

/// The doors of this node's running workloads. Cheap to clone; shared by
/// the supervisor (which opens and closes them) and the session server.
#[derive(Debug, Clone, Default)]
pub struct Doors {
    doors: Arc<Mutex<HashMap<Uuid, Door>>>,
}

/// A session's way in: released (its count given back) when dropped.
#[derive(Debug)]
pub struct Entry {
    pub target: Arc<DoorTarget>,
    /// Cancelled when the workload ends or the lease moves.
    pub ended: CancellationToken,
    sessions: Arc<AtomicU32>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.sessions.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Doors {
    /// The workload of `lease_id` for `placement` runs and can be entered.
    /// A door of an earlier placement closes, ending its sessions.
    pub fn open(&self, lease_id: Uuid, placement: u64, target: DoorTarget) {
        let door = Door {
            placement,
            target: Arc::new(target),
            ended: CancellationToken::new(),
            sessions: Arc::new(AtomicU32::new(0)),
        };
        let old = self
            .doors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(lease_id, door);
        if let Some(old) = old {
            old.ended.cancel();
        }
    }

    /// The workload of `lease_id` for `placement` ended: its sessions end.
    pub fn close(&self, lease_id: Uuid, placement: u64) {
        let mut doors = self.doors.lock().unwrap_or_else(|p| p.into_inner());
        if doors
            .get(&lease_id)
            .is_some_and(|d| d.placement == placement)
        {
            if let Some(door) = doors.remove(&lease_id) {
                door.ended.cancel();
            }
        }
    }

    /// A way into the workload of `lease_id` at `placement`, when it runs
    /// here and has fewer than `max_sessions` sessions.
    pub fn enter(
        &self,
        lease_id: Uuid,
        placement: u64,
        max_sessions: u32,
    ) -> Result<Entry, (Refusal, String)> {
        let doors = self.doors.lock().unwrap_or_else(|p| p.into_inner());
        let door = match doors.get(&lease_id) {
            Some(door) if door.placement == placement => door,
            Some(door) => {
                return Err((
                    Refusal::NotRunningHere,
                    format!(
                        "lease {lease_id} runs here for placement {}, not {placement}: it moved",
                        door.placement
                    ),
                ))
            }
            None => {
                return Err((
                    Refusal::NotRunningHere,
                    format!("no workload of lease {lease_id} runs on this node"),
                ))
            }
        };
        let taken = door.sessions.fetch_add(1, Ordering::AcqRel);
        if taken >= max_sessions {
            door.sessions.fetch_sub(1, Ordering::AcqRel);
            return Err((
                Refusal::TooManySessions,
                format!("lease {lease_id} has {taken} sessions open, the most this node allows"),
            ));
        }
        Ok(Entry {
            target: door.target.clone(),
            ended: door.ended.clone(),
            sessions: door.sessions.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process() -> DoorTarget {
        DoorTarget::Process {
            uid: 1,
            home: "/tmp".into(),
            env: BTreeMap::new(),
            cgroup_procs: None,
        }
    }

    #[test]
    fn a_door_counts_its_sessions_and_closes_them_when_its_workload_moves() {
        let doors = Doors::default();
        let lease = Uuid::from_u128(1);
        assert_eq!(
            doors.enter(lease, 1, 2).unwrap_err().0,
            Refusal::NotRunningHere
        );
        doors.open(lease, 1, process());
        let first = doors.enter(lease, 1, 2).unwrap();
        let second = doors.enter(lease, 1, 2).unwrap();
        assert_eq!(
            doors.enter(lease, 1, 2).unwrap_err().0,
            Refusal::TooManySessions
        );
        drop(second);
        let _third = doors.enter(lease, 1, 2).unwrap();
        assert_eq!(
            doors.enter(lease, 2, 2).unwrap_err().0,
            Refusal::NotRunningHere
        );
        // The lease moved within the node: the old placement's sessions end.
        doors.open(lease, 2, process());
        assert!(first.ended.is_cancelled());
        // The old workload's end does not close the new one's door.
        doors.close(lease, 1);
        let new = doors.enter(lease, 2, 2).unwrap();
        doors.close(lease, 2);
        assert!(new.ended.is_cancelled());
    }
}
