//! A node's part of a lease that spans several nodes (a gang): the
//! rendezvous a distributed job reads from its environment, and one process
//! per GPU, as `torch.distributed`'s `env://` and MPI-style launchers expect.
//!
//! Every member runs the lease's command once per GPU it holds, each with
//! `RANK` (its place among all the gang's GPUs), `LOCAL_RANK` (its GPU on
//! this node), and what every process shares: `WORLD_SIZE` (the gang's
//! GPUs), `MASTER_ADDR` and `MASTER_PORT` (the first member, which hosts
//! the rendezvous), `NNODES`, `NODE_RANK`, `LOCAL_WORLD_SIZE` and
//! `LEASEHOLD_GANG_MEMBERS` (every member's address, in node-rank order).
//! The part exits with the first non-zero status of its processes, or 0.

use std::collections::BTreeMap;

use lh_events::LeasePlaced;
use uuid::Uuid;

/// The port a gang's rendezvous listens on, on its first member: one of
/// 1,000 from 29,500 (PyTorch's default), by the lease's id, so that two
/// gangs whose first member is the same node rarely meet.
pub const MASTER_PORT_FIRST: u16 = 29_500;
pub const MASTER_PORTS: u16 = 1_000;

/// Runs the command given after it once per local GPU (`LEASEHOLD_GPUS`),
/// each with its `LOCAL_RANK` and `RANK` (`LEASEHOLD_RANK_BASE` + local
/// rank). The first process to fail ends the part: the others get a TERM
/// and the part exits with its status (a distributed job with a rank gone
/// would only hang); otherwise the part exits 0 once all have. A TERM or
/// INT to the launcher is passed on to every process (a stop, a
/// preemption: as PID 1 of a container it would otherwise ignore both).
/// POSIX `sh` has no `wait` for whichever child ends first, so it looks
/// every second for one that has ended: a zombie in `/proc` (its state
/// follows the last `)` of its stat line, as a process may name itself
/// with spaces and parentheses), or one already reaped (gone from
/// `/proc`), whose status `wait` still gives. Once ending, it tells those
/// left once more a round later: a child forked but not yet running its
/// command when the first TERM came ran the launcher's own trap instead,
/// and would otherwise run on; one more TERM, not a stream of them, so
/// that a process saving its state on the first is not cut short. In a
/// container whose ranks reach the others over the gang's link
/// (`LEASEHOLD_GANG_LINK`, [`super::gang_link`]), it first waits for that
/// interface to be up, at most 60 s, and fails the part if it never is.
pub const LAUNCHER: &str = r#"n=${LEASEHOLD_GPUS:-1}; i=0; pids=""; ending=""; told=""
trap 'ending=1; kill -TERM $pids 2>/dev/null' TERM INT
if [ -n "$LEASEHOLD_GANG_LINK" ]; then
  w=0; up=""; { read -r up < "/sys/class/net/$LEASEHOLD_GANG_LINK/operstate"; } 2>/dev/null
  while [ "$up" != up ]; do
    if [ -n "$ending" ]; then exit 143; fi
    w=$((w + 1))
    if [ "$w" -gt 60 ]; then echo "leasehold: the gang's link $LEASEHOLD_GANG_LINK did not come up in 60 s" >&2; exit 1; fi
    sleep 1
    up=""; { read -r up < "/sys/class/net/$LEASEHOLD_GANG_LINK/operstate"; } 2>/dev/null
  done
fi
while [ "$i" -lt "$n" ]; do
  LOCAL_RANK=$i RANK=$((LEASEHOLD_RANK_BASE + i)) "$@" &
  pids="$pids $!"; i=$((i + 1))
done
status=0; left=$pids
while [ -n "$left" ]; do
  still=""
  for p in $left; do
    s=""; { read -r s < "/proc/$p/stat"; } 2>/dev/null
    st=${s##*) }; st=${st%% *}
    if [ -z "$s" ] || [ "$st" = Z ]; then
      wait "$p"; s=$?
      if [ "$s" -ne 0 ] && [ "$status" -eq 0 ]; then status=$s; ending=1; kill -TERM $pids 2>/dev/null; fi
    else
      still="$still $p"
    fi
  done
  left=$still
  if [ -n "$ending" ] && [ -z "$told" ] && [ -n "$left" ]; then
    if [ "$ending" = again ]; then kill -TERM $left 2>/dev/null; told=1; else ending=again; fi
  fi
  if [ -n "$left" ]; then sleep 1; fi
done
exit "$status""#;

/// This node's part of a gang.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GangPart {
    /// Its place among the members, 0 for the first.
    pub node_rank: u32,
    /// Every member's address and GPU count, in node-rank order.
    pub members: Vec<(String, u32)>,
    /// Every member's node id, in node-rank order.
    #[serde(default)]
    pub node_ids: Vec<String>,
    pub master_port: u16,
}

impl GangPart {
    /// The part of `placed` on `node_id`; `None` for a lease on one node
    /// or a gang this node is not a member of.
    pub fn of(placed: &LeasePlaced, node_id: &str) -> Option<GangPart> {
        let node_rank = placed.members.iter().position(|m| m.node_id == node_id)?;
        Some(GangPart {
            node_rank: node_rank as u32,
            members: placed
                .members
                .iter()
                .map(|m| (m.address.clone(), m.gpus.len() as u32))
                .collect(),
            node_ids: placed.members.iter().map(|m| m.node_id.clone()).collect(),
            master_port: master_port(placed.lease_id),
        })
    }

    /// Whether this is the first member: its end is the gang's.
    pub fn is_first(&self) -> bool {
        self.node_rank == 0
    }

    /// This member's node.
    pub fn own_node(&self) -> &str {
        self.node_ids
            .get(self.node_rank as usize)
            .map_or("", String::as_str)
    }

    /// The first member's node: its reports speak for the gang.
    pub fn first_node(&self) -> &str {
        self.node_ids.first().map_or("", String::as_str)
    }

    /// Every other member's node.
    pub fn others(&self) -> impl Iterator<Item = &str> {
        let own = self.node_rank as usize;
        self.node_ids
            .iter()
            .enumerate()
            .filter(move |(rank, _)| *rank != own)
            .map(|(_, n)| n.as_str())
    }

    /// What every process of this part shares, the launcher's own two
    /// included.
    pub fn env(&self) -> BTreeMap<String, String> {
        let rank = self.node_rank as usize;
        let gpus_before: u32 = self.members[..rank].iter().map(|(_, g)| g).sum();
        let world: u32 = self.members.iter().map(|(_, g)| g).sum();
        let local = self.members.get(rank).map_or(0, |(_, g)| *g);
        let addresses: Vec<&str> = self.members.iter().map(|(a, _)| a.as_str()).collect();
        let master = addresses.first().copied().unwrap_or_default();
        [
            ("MASTER_ADDR", master.to_string()),
            ("MASTER_PORT", self.master_port.to_string()),
            ("WORLD_SIZE", world.to_string()),
            ("NNODES", self.members.len().to_string()),
            ("NODE_RANK", self.node_rank.to_string()),
            ("LOCAL_WORLD_SIZE", local.to_string()),
            ("LEASEHOLD_GANG_MEMBERS", addresses.join(",")),
            ("LEASEHOLD_GPUS", local.to_string()),
            ("LEASEHOLD_RANK_BASE", gpus_before.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// `command` run once per GPU by [`LAUNCHER`].
    pub fn launch(&self, command: &[String]) -> Vec<String> {
        ["/bin/sh", "-c", LAUNCHER, "leasehold-gang"]
            .into_iter()
            .map(str::to_string)
            .chain(command.iter().cloned())
            .collect()
    }
}

/// The rendezvous port of lease `lease_id`.
pub fn master_port(lease_id: Uuid) -> u16 {
    MASTER_PORT_FIRST + (lease_id.as_u128() % u128::from(MASTER_PORTS)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::{fixtures, LeaseMember};

    fn gang() -> LeasePlaced {
        let mut placed = fixtures::placed(
            Uuid::from_u128(7),
            "node-a",
            "z",
            "A100-40GB",
            40,
            &[0, 1, 2, 3, 4, 5, 6, 7],
        );
        let b = fixtures::placed(
            Uuid::from_u128(7),
            "node-e",
            "z",
            "A100-40GB",
            40,
            &[0, 1, 2, 3],
        );
        placed.members = vec![
            LeaseMember {
                node_id: "node-a".into(),
                zone: "z".into(),
                address: "gpu-a".into(),
                gpus: placed.gpus.clone(),
            },
            LeaseMember {
                node_id: "node-e".into(),
                zone: "z".into(),
                address: "gpu-e".into(),
                gpus: b.gpus,
            },
        ];
        placed
    }

    #[test]
    fn each_member_is_told_its_place_and_the_rendezvous() {
        let placed = gang();
        assert_eq!(GangPart::of(&placed, "node-b"), None);
        let a = GangPart::of(&placed, "node-a").unwrap();
        let e = GangPart::of(&placed, "node-e").unwrap();
        assert!(a.is_first() && !e.is_first());
        let env = e.env();
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("MASTER_ADDR"), Some("gpu-a"));
        assert_eq!(get("MASTER_PORT"), Some("29507"));
        assert_eq!(get("WORLD_SIZE"), Some("12"));
        assert_eq!(get("NNODES"), Some("2"));
        assert_eq!(get("NODE_RANK"), Some("1"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("4"));
        assert_eq!(get("LEASEHOLD_GANG_MEMBERS"), Some("gpu-a,gpu-e"));
        assert_eq!(get("LEASEHOLD_RANK_BASE"), Some("8"));
        assert_eq!(a.env().get("LEASEHOLD_RANK_BASE").unwrap(), "0");
        // A lease on one node is no gang.
        let mut one = placed.clone();
        one.members.clear();
        assert_eq!(GangPart::of(&one, "node-a"), None);
    }

    #[test]
    fn the_launcher_runs_one_process_per_gpu_and_exits_with_the_first_failure() {
        let part = GangPart::of(&gang(), "node-e").unwrap();
        let run = |command: &[&str]| {
            let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
            let argv = part.launch(&command);
            let out = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .env_clear()
                .envs(part.env())
                .output()
                .expect("sh runs");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        let (code, out) = run(&["sh", "-c", "echo $RANK/$WORLD_SIZE $LOCAL_RANK"]);
        assert_eq!(code, Some(0));
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort();
        assert_eq!(lines, ["10/12 2", "11/12 3", "8/12 0", "9/12 1"]);
        let (code, _) = run(&["sh", "-c", "[ $LOCAL_RANK -ne 2 ] || exit 7"]);
        assert_eq!(code, Some(7));
        // The others are not waited for: a job with a rank gone hangs. (A
        // `sh -c` the TERM ends leaves its `sleep` behind, holding any
        // pipe: the launcher's own exit is timed, its output not read.)
        let started = std::time::Instant::now();
        let command: Vec<String> = ["sh", "-c", "[ $LOCAL_RANK -ne 2 ] || exit 7; exec sleep 30"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let argv = part.launch(&command);
        let status = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .envs(part.env())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("sh runs");
        assert_eq!(status.code(), Some(7));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the part outlived its failed process by {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_process_that_missed_the_first_term_is_told_again() {
        // Each but rank 2 lives through one TERM (as a child still between
        // fork and its command does) and would run 30 s more.
        let part = GangPart::of(&gang(), "node-e").unwrap();
        let command = "[ $LOCAL_RANK -ne 2 ] || { sleep 1; exit 7; }; \
             trap 'trap - TERM' TERM; i=0; \
             while [ $i -lt 60 ]; do sleep 0.5; i=$((i + 1)); done";
        let argv = part.launch(&["sh".into(), "-c".into(), command.into()]);
        let started = std::time::Instant::now();
        let status = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(part.env())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("sh runs");
        assert_eq!(status.code(), Some(7));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "the part outlived its failed process by {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn without_its_link_up_no_rank_starts_and_a_stop_ends_the_wait() {
        let part = GangPart::of(&gang(), "node-e").unwrap();
        let argv = part.launch(&[
            "sh".to_string(),
            "-c".to_string(),
            "echo started".to_string(),
        ]);
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(part.env())
            .env("LEASEHOLD_GANG_LINK", "lhgang-none")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh runs");
        std::thread::sleep(std::time::Duration::from_millis(1500));
        assert_eq!(child.try_wait().unwrap(), None, "it waits for the link");
        let stopped = std::time::Instant::now();
        // SAFETY: kill(2) of this test's own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(143));
        assert!(
            stopped.elapsed() < std::time::Duration::from_secs(5),
            "a stop waited for the link: {:?}",
            stopped.elapsed()
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "no rank ran");
    }

    #[test]
    fn a_term_to_the_launcher_reaches_every_process_it_started() {
        let part = GangPart::of(&gang(), "node-e").unwrap();
        let argv = part.launch(&["sleep".to_string(), "30".to_string()]);
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(part.env())
            .spawn()
            .expect("sh runs");
        // Its four sleeps are started once `ps` shows them under it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // Its children, from /proc: the fourth field of a process's stat
        // is its parent.
        let parent = child.id().to_string();
        let children = || {
            std::fs::read_dir("/proc")
                .expect("/proc")
                .flatten()
                .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
                .filter(|stat| {
                    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
                    after_name.split_whitespace().nth(1) == Some(parent.as_str())
                })
                .count()
        };
        while children() < 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "the sleeps never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let started = std::time::Instant::now();
        // SAFETY: a plain signal to a child this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().expect("it ends");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the launcher outlived its TERM by {:?}",
            started.elapsed()
        );
        assert_eq!(
            status.code(),
            Some(143),
            "the sleeps' own status: {status:?}"
        );
    }

    #[test]
    fn a_later_members_workload_has_names_of_its_own_that_still_name_the_lease() {
        use crate::workload::{lease_of_mark, mark, part_mark};
        let lease = Uuid::from_u128(7);
        let part = part_mark(lease, Some("node-e"));
        assert_ne!(part, mark(lease));
        assert_eq!(part_mark(lease, None), mark(lease));
        assert_eq!(lease_of_mark(&part), Some(lease));
        assert_eq!(lease_of_mark(&mark(lease)), Some(lease));
        assert_eq!(lease_of_mark("lh-not-a-lease.node-e"), None);
    }
}
