//! The agent's decisions, driven by hand: the log through `apply`, its
//! GPUs and workloads through `signal`, and what `decide` asks for, on the
//! log and of the workload side.

use std::collections::HashMap;
use std::path::Path;

use lh_events::{fixtures, EventData, GpuHealth, LeaseFailure, LeaseStopRequested, MigInstance};
use lh_service::clock::ManualClock;
use tokio::sync::mpsc::{self, error::TryRecvError};

use super::*;
use crate::gpu::backend::sim::fleet::SimNode;
use crate::gpu::backend::sim::SimBackend;
use crate::gpu::backend::{GpuEvent, GpuEventKind};
use crate::gpu::GpuArgs;
use crate::state::Exit;
use crate::workload::supervisor::Finished;

const NODE: &str = "node-a";

fn t(s: i64) -> DateTime<Utc> {
    "2026-12-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + chrono::Duration::seconds(s)
}

fn lease() -> Uuid {
    Uuid::from_u128(7)
}

struct Given {
    agent: NodeAgent,
    commands: mpsc::UnboundedReceiver<Command>,
    status: Arc<NodeStatus>,
    _usage: mpsc::Receiver<Vec<LeaseUsage>>,
}

/// A registered agent of a two-GPU simulated node, lease 7 placed on GPU 0
/// at sequence 10, whose host held nothing of a previous agent.
fn given() -> Given {
    given_adopting(Vec::new())
}

/// [`given`], with `adopted` what the reconciliation of the host found
/// running (lease and placement).
fn given_adopting(adopted: Vec<(Uuid, u64)>) -> Given {
    let mut g = given_unreconciled();
    assert!(g.agent.decide(t(0)).is_empty());
    match g.commands.try_recv() {
        Ok(Command::Reconcile { placed_here, .. }) => {
            assert_eq!(placed_here, HashMap::from([(lease(), 10)]))
        }
        other => panic!("{other:?}"),
    }
    let report = Report::Reconciled { adopted };
    assert!(g.agent.signal(Signal::Workload(report), t(0)));
    g
}

fn given_unreconciled() -> Given {
    let node: SimNode = toml::from_str(&format!(
        "id = \"{NODE}\"\nzone = \"z\"\nhostname = \"h\"\ngpu_model = \"A100-40GB\"\ngpu_count = 2\nvram_gb = 40\n"
    ))
    .unwrap();
    let backend = Arc::new(SimBackend::for_node(&node, Path::new("fleet.toml")).unwrap());
    let inventory = node.inventory();
    let clock = ManualClock::new(t(0));
    let gpu = GpuSide::new(
        &GpuArgs::for_test(),
        backend,
        &inventory,
        Default::default(),
        Arc::new(clock),
    );
    let (command_tx, commands) = mpsc::unbounded_channel();
    let (usage_tx, usage) = mpsc::channel(4);
    let status = Arc::new(NodeStatus::default());
    let mut agent = NodeAgent::new(
        inventory.clone(),
        gpu,
        command_tx,
        usage_tx,
        status.clone(),
        Duration::from_secs(1),
    );
    let on_log = |data| Envelope::new(Actor::Admin, t(0), data);
    agent.apply(1, &on_log(EventData::NodeRegistered(inventory)));
    let placed = fixtures::placed(lease(), NODE, "z", "A100-40GB", 40, &[0]);
    agent.apply(10, &on_log(EventData::LeasePlaced(placed)));
    Given {
        agent,
        commands,
        status,
        _usage: usage,
    }
}

fn types(batches: &[Batch]) -> Vec<&'static str> {
    batches
        .iter()
        .flatten()
        .map(|(e, _)| e.data.event_type())
        .collect()
}

fn only(batches: Vec<Batch>) -> (Envelope, Expect) {
    assert_eq!(batches.len(), 1, "{:?}", types(&batches));
    let mut batch = batches.into_iter().next().unwrap();
    assert_eq!(batch.len(), 1);
    batch.remove(0)
}

fn answer(agent: &mut NodeAgent, outcome: Result<bool, String>) {
    answer_started(agent, outcome, false);
}

fn answer_started(agent: &mut NodeAgent, outcome: Result<bool, String>, not_yet_running: bool) {
    let report = Report::Started {
        lease_id: lease(),
        placement: 10,
        outcome,
        mig_devices: Vec::new(),
        not_yet_running,
    };
    assert!(agent.signal(Signal::Workload(report), t(1)));
}

fn ended(exit: Exit, failure: Option<LeaseFailure>, ran: bool) -> Signal {
    Signal::Workload(Report::Ended(Finished {
        lease_id: lease(),
        placement: 10,
        exit,
        failure,
        ran,
    }))
}

#[test]
fn a_container_still_pulling_starts_the_lease_once_it_runs() {
    let mut g = given();
    g.agent.decide(t(1));
    let _start = g.commands.try_recv().unwrap();
    answer_started(&mut g.agent, Ok(true), true);
    assert!(g.agent.decide(t(2)).is_empty(), "not started while pulling");
    let running = Report::Running {
        lease_id: lease(),
        placement: 10,
    };
    assert!(g.agent.signal(Signal::Workload(running), t(3)));
    let (envelope, _) = only(g.agent.decide(t(3)));
    assert!(matches!(envelope.data, EventData::LeaseStarted(_)));
}

#[test]
fn a_container_that_never_runs_fails_the_lease_unstarted() {
    let mut g = given();
    g.agent.decide(t(1));
    let _start = g.commands.try_recv().unwrap();
    answer_started(&mut g.agent, Ok(true), true);
    let exit = Exit {
        code: Some(137),
        signal: None,
    };
    let timed_out = ended(exit, Some(LeaseFailure::StartTimeout), false);
    assert!(g.agent.signal(timed_out, t(5)));
    let (envelope, _) = only(g.agent.decide(t(5)));
    match envelope.data {
        EventData::LeaseEnded(e) => {
            assert_eq!(e.reason, EndReason::Failed);
            assert_eq!(e.failure, Some(LeaseFailure::StartTimeout));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_stop_during_the_pull_stops_the_container_and_cancels_the_lease() {
    let mut g = given();
    g.agent.decide(t(1));
    let _start = g.commands.try_recv().unwrap();
    answer_started(&mut g.agent, Ok(true), true);
    let stop = EventData::LeaseStopRequested(LeaseStopRequested { lease_id: lease() });
    g.agent
        .apply(11, &Envelope::new(Actor::Tenant(Uuid::nil()), t(2), stop));
    assert!(
        g.agent.decide(t(2)).is_empty(),
        "the end waits for the exit"
    );
    assert!(matches!(
        g.commands.try_recv(),
        Ok(Command::Stop { lease_id, .. }) if lease_id == lease()
    ));
    let exit = Exit {
        code: Some(137),
        signal: None,
    };
    let stopped = ended(exit, Some(LeaseFailure::EngineError), false);
    assert!(g.agent.signal(stopped, t(3)));
    let (envelope, _) = only(g.agent.decide(t(3)));
    match envelope.data {
        EventData::LeaseEnded(e) => {
            assert_eq!(e.reason, EndReason::Cancelled);
            assert_eq!(e.failure, None);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_lease_is_reported_started_once_its_workload_side_answers() {
    let mut g = given();
    assert!(g.agent.decide(t(1)).is_empty(), "nothing before the answer");
    match g.commands.try_recv() {
        Ok(Command::Start {
            lease_id,
            placement,
            gpus,
            ..
        }) => {
            assert_eq!((lease_id, placement), (lease(), 10));
            assert_eq!(gpus[0].index, 0);
        }
        other => panic!("{other:?}"),
    }
    assert!(g.agent.decide(t(1)).is_empty(), "asked once");
    assert!(matches!(g.commands.try_recv(), Err(TryRecvError::Empty)));
    answer(&mut g.agent, Ok(false));
    let (envelope, expect) = only(g.agent.decide(t(2)));
    assert!(matches!(envelope.data, EventData::LeaseStarted(_)));
    assert_eq!(expect, Expect::LastSubjectSequence(10), "a stop must win");
}

#[test]
fn a_workload_that_cannot_start_fails_the_lease_unbilled() {
    let mut g = given();
    g.agent.decide(t(1));
    answer(&mut g.agent, Err("no such image".into()));
    let (envelope, expect) = only(g.agent.decide(t(2)));
    match envelope.data {
        EventData::LeaseEnded(e) => assert_eq!(e.reason, EndReason::Failed),
        other => panic!("{other:?}"),
    }
    assert_eq!(expect, Expect::Any);
}

#[test]
fn deciding_returns_the_start_for_the_loop_to_send() {
    // Given a reconciled agent whose lease 7 is placed and not started,
    let mut g = given();
    // when it decides,
    let decided = g.agent.decisions(t(1)).expect("the host answers");
    // then the start is among what it returns, and nothing has been sent.
    assert!(decided.batches.is_empty(), "{:?}", types(&decided.batches));
    match decided.commands.as_slice() {
        [Command::Start {
            lease_id,
            placement,
            ..
        }] => assert_eq!((*lease_id, *placement), (lease(), 10)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(g.commands.try_recv(), Err(TryRecvError::Empty)));
}

#[test]
fn deciding_a_failed_start_returns_its_end_and_the_release_together() {
    // Given a lease whose workload could not start,
    let mut g = given();
    g.agent.decide(t(1));
    let _start = g.commands.try_recv().unwrap();
    answer(&mut g.agent, Err("no such image".into()));
    // when the agent decides,
    let decided = g.agent.decisions(t(2)).expect("the host answers");
    // then it returns the end to append and the release for the host, and
    // sends nothing itself.
    assert_eq!(types(&decided.batches), ["lease.ended"]);
    assert!(matches!(
        decided.commands.as_slice(),
        [Command::Release { lease_id }] if *lease_id == lease()
    ));
    assert!(matches!(g.commands.try_recv(), Err(TryRecvError::Empty)));
}

#[test]
fn a_host_that_does_not_answer_decides_nothing() {
    // Given an agent whose host stopped answering,
    let mut g = given();
    g.agent.signal(Signal::Gpu(Observation::NodeStopped), t(1));
    // when it decides, then nothing is decided at all.
    assert!(g.agent.decisions(t(2)).is_none());
}

#[test]
fn a_stop_during_the_start_waits_for_the_answer_then_stops_the_workload() {
    let mut g = given();
    g.agent.decide(t(1));
    let _start = g.commands.try_recv().unwrap();
    let stop = EventData::LeaseStopRequested(LeaseStopRequested { lease_id: lease() });
    g.agent
        .apply(11, &Envelope::new(Actor::Tenant(Uuid::nil()), t(1), stop));
    assert!(g.agent.decide(t(2)).is_empty(), "the start is under way");
    answer(&mut g.agent, Ok(true));
    assert!(
        g.agent.decide(t(3)).is_empty(),
        "the end waits for the exit"
    );
    assert!(matches!(
        g.commands.try_recv(),
        Ok(Command::Stop { lease_id, .. }) if lease_id == lease()
    ));
    let exit = Exit {
        code: None,
        signal: Some(15),
    };
    assert!(g.agent.signal(ended(exit, None, true), t(4)));
    let (envelope, _) = only(g.agent.decide(t(4)));
    match envelope.data {
        EventData::LeaseEnded(e) => assert_eq!(e.reason, EndReason::Cancelled),
        other => panic!("{other:?}"),
    }
}

#[test]
fn what_a_gpu_showed_is_offered_until_it_is_stored() {
    let mut g = given();
    let lost = Observation::Events(vec![GpuEvent {
        index: 1,
        kind: GpuEventKind::Lost,
        at: t(1),
    }]);
    assert!(g.agent.signal(Signal::Gpu(lost), t(1)));
    let health = |batches: &[Batch]| {
        batches
            .iter()
            .flatten()
            .filter(|(e, _)| matches!(&e.data, EventData::NodeGpuHealthChanged(h) if h.to == GpuHealth::Unhealthy))
            .cloned()
            .collect::<Vec<_>>()
    };
    let first = health(&g.agent.decide(t(1)));
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].1, Expect::Any, "an observation, not a decision");
    // The log refused it, or the pass ended early: offered again, same id.
    let again = health(&g.agent.decide(t(2)));
    assert_eq!(again[0].0.id, first[0].0.id);
    g.agent.appended(&first);
    assert!(health(&g.agent.decide(t(3))).is_empty());
}

#[test]
fn a_host_that_stops_answering_goes_silent() {
    let mut g = given();
    g.agent.signal(Signal::Gpu(Observation::NodeStopped), t(1));
    assert!(g.status.silent.load(Ordering::Relaxed), "no heartbeats");
    assert!(g.agent.decide(t(2)).is_empty());
    assert!(g.commands.try_recv().is_err(), "nothing started");
    assert!(g.agent.signal(Signal::Gpu(Observation::NodeBack), t(3)));
    assert!(!g.status.silent.load(Ordering::Relaxed));
    g.agent.decide(t(3));
    assert!(matches!(g.commands.try_recv(), Ok(Command::Start { .. })));
}

#[test]
fn a_workload_left_behind_on_other_gpus_of_the_node_is_stopped() {
    let mut g = given();
    g.agent.decide(t(1));
    let _start = g.commands.try_recv().unwrap();
    answer(&mut g.agent, Ok(true));
    // Its GPU failed: it moves to GPU 1 of this node, and a stop comes
    // before the agent decides again.
    let moved = lh_events::LeaseMigrated {
        lease_id: lease(),
        reason: "GPU 0 unhealthy".into(),
        from_node_id: NODE.into(),
        from_gpu_indices: vec![0],
        billing_ends_at: t(2),
        to: Some(lh_events::Relocation {
            node_id: NODE.into(),
            zone: "z".into(),
            vram_gb_per_gpu: 40,
            gpus: fixtures::placed(lease(), NODE, "z", "A100-40GB", 40, &[1]).gpus,
            decision: fixtures::placed(lease(), NODE, "z", "A100-40GB", 40, &[1]).decision,
        }),
    };
    let on_log = |data| Envelope::new(Actor::Admin, t(2), data);
    g.agent.apply(12, &on_log(EventData::LeaseMigrated(moved)));
    let stop = EventData::LeaseStopRequested(LeaseStopRequested { lease_id: lease() });
    g.agent.apply(13, &on_log(stop));
    let decided = g.agent.decide(t(3));
    assert!(matches!(
        g.commands.try_recv(),
        Ok(Command::StopStale { lease_id, placement: 12 }) if lease_id == lease()
    ));
    assert_eq!(types(&decided), ["lease.ended"]);
}

#[test]
fn no_workload_starts_or_stops_before_the_host_is_reconciled() {
    let mut g = given_unreconciled();
    assert!(g.agent.decide(t(1)).is_empty());
    assert!(matches!(
        g.commands.try_recv(),
        Ok(Command::Reconcile { .. })
    ));
    assert!(g.agent.decide(t(1)).is_empty());
    assert!(
        matches!(g.commands.try_recv(), Err(TryRecvError::Empty)),
        "asked once, and nothing started meanwhile"
    );
    let report = Report::Reconciled {
        adopted: Vec::new(),
    };
    assert!(g.agent.signal(Signal::Workload(report), t(1)));
    assert!(g.agent.decide(t(1)).is_empty());
    assert!(matches!(g.commands.try_recv(), Ok(Command::Start { .. })));
}

#[test]
fn an_adopted_workload_is_stopped_before_its_lease_ends() {
    let mut g = given_adopting(vec![(lease(), 10)]);
    let stop = EventData::LeaseStopRequested(LeaseStopRequested { lease_id: lease() });
    g.agent.apply(11, &Envelope::new(Actor::Admin, t(1), stop));
    assert!(
        g.agent.decide(t(1)).is_empty(),
        "the end waits for the exit"
    );
    assert!(matches!(
        g.commands.try_recv(),
        Ok(Command::Stop { lease_id, .. }) if lease_id == lease()
    ));
}

#[test]
fn a_workload_adopted_for_an_earlier_placement_is_not_taken_as_running() {
    let mut g = given_adopting(vec![(lease(), 9)]);
    g.agent.decide(t(1));
    assert!(matches!(g.commands.try_recv(), Ok(Command::Start { .. })));
}

/// [`given`], lease 7's workload started and its start on the log.
fn given_running() -> Given {
    let mut g = given();
    g.agent.decide(t(1));
    let _start = g.commands.try_recv().unwrap();
    answer(&mut g.agent, Ok(true));
    let (started, _) = only(g.agent.decide(t(1)));
    g.agent.apply(11, &started);
    assert!(g.agent.decide(t(1)).is_empty());
    g
}

fn workload_ends(agent: &mut NodeAgent, code: Option<i32>, signal: Option<i32>, at: DateTime<Utc>) {
    workload_ends_for(agent, Exit { code, signal }, None, at);
}

fn workload_ends_for(
    agent: &mut NodeAgent,
    exit: Exit,
    failure: Option<LeaseFailure>,
    at: DateTime<Utc>,
) {
    assert!(agent.signal(ended(exit, failure, true), at));
}

/// Exits 1 after an allocation error on its GPU.
fn workload_runs_out_of_gpu_memory(agent: &mut NodeAgent, at: DateTime<Utc>) {
    let exit = Exit {
        code: Some(1),
        signal: None,
    };
    workload_ends_for(agent, exit, Some(LeaseFailure::GpuMemoryExceeded), at);
}

fn xid_on_gpu_0(agent: &mut NodeAgent, xid: u64, at: DateTime<Utc>) {
    let event = Observation::Events(vec![GpuEvent {
        index: 0,
        kind: GpuEventKind::Xid(xid),
        at,
    }]);
    agent.signal(Signal::Gpu(event), at);
}

fn lease_ended(batches: &[Batch]) -> Option<LeaseEnded> {
    batches.iter().flatten().find_map(|(e, _)| match &e.data {
        EventData::LeaseEnded(x) => Some(x.clone()),
        _ => None,
    })
}

#[test]
fn a_workload_killed_by_a_critical_xid_heard_after_its_exit_is_not_failed() {
    let mut g = given_running();
    // The exit is heard first, the driver's XID a moment later.
    workload_ends(&mut g.agent, None, Some(9), t(2));
    assert_eq!(lease_ended(&g.agent.decide(t(2))), None);
    xid_on_gpu_0(&mut g.agent, 79, t(3));
    let out = g.agent.decide(t(3));
    assert!(types(&out).contains(&"node.gpu_health_changed"));
    assert_eq!(lease_ended(&out), None);
    assert_eq!(
        lease_ended(&g.agent.decide(t(30))),
        None,
        "held for the move"
    );
    assert_eq!(g.status.running_leases.load(Ordering::Relaxed), 1);
    // No move came: it fails after all.
    let out = g.agent.decide(t(32));
    let ended = lease_ended(&out).expect("the lease ends");
    assert_eq!(ended.reason, EndReason::Failed);
    // Waiting for a move is not billed: it ended when its workload did.
    assert_eq!(ended.ended_at, t(2));
}

#[test]
fn a_workload_failing_after_an_application_xid_fails_its_lease() {
    let mut g = given_running();
    xid_on_gpu_0(&mut g.agent, 13, t(2));
    let out = g.agent.decide(t(2));
    assert!(types(&out).contains(&"lease.gpu_fault"));
    workload_ends(&mut g.agent, Some(1), None, t(2));
    let ended = lease_ended(&g.agent.decide(t(2))).expect("no hold");
    assert_eq!(
        (ended.reason, ended.exit_code),
        (EndReason::Failed, Some(1))
    );
}

#[test]
fn a_workload_failing_on_healthy_gpus_fails_once_the_hold_is_over() {
    let mut g = given_running();
    workload_ends(&mut g.agent, Some(3), None, t(2));
    assert_eq!(lease_ended(&g.agent.decide(t(3))), None);
    // GpuArgs::for_test holds 2 s.
    let ended = lease_ended(&g.agent.decide(t(4))).expect("the hold is over");
    assert_eq!(
        (ended.reason, ended.exit_code, ended.ended_at),
        (EndReason::Failed, Some(3), t(2))
    );
}

#[test]
fn a_workload_over_its_gpu_memory_fails_its_lease_with_that_cause() {
    let mut g = given_running();
    workload_runs_out_of_gpu_memory(&mut g.agent, t(2));
    let ended = lease_ended(&g.agent.decide(t(4))).expect("the hold is over");
    assert_eq!(
        (ended.reason, ended.failure),
        (EndReason::Failed, Some(LeaseFailure::GpuMemoryExceeded))
    );
}

#[test]
fn a_stopped_lease_names_no_failure_whatever_its_workload_said() {
    let mut g = given_running();
    let stop = EventData::LeaseStopRequested(LeaseStopRequested { lease_id: lease() });
    g.agent.apply(12, &Envelope::new(Actor::Admin, t(1), stop));
    g.agent.decide(t(1));
    workload_runs_out_of_gpu_memory(&mut g.agent, t(2));
    let ended = lease_ended(&g.agent.decide(t(2))).expect("stopped");
    assert_eq!((ended.reason, ended.failure), (EndReason::Stopped, None));
}

type Devices<'a> = &'a [(&'a str, &'a str, u32)];

/// A read of GPU 0 holding MIG instances `(uuid, profile, start)`.
fn mig_read(devices: Devices) -> Signal {
    mig_read_of(&[devices])
}

/// A read of the node's GPUs (0, 1, ...) holding these MIG instances.
fn mig_read_of(gpus: &[Devices]) -> Signal {
    let gpus = gpus
        .iter()
        .enumerate()
        .map(|(index, devices)| GpuDevice {
            index: index as u32,
            uuid: format!("GPU-{index}"),
            model: "A100-40GB".into(),
            vram_mib: 40 * 1024,
            mig_enabled: true,
            mig_devices: devices
                .iter()
                .map(|(uuid, profile, start)| crate::gpu::backend::MigDevice {
                    uuid: uuid.to_string(),
                    profile: profile.to_string(),
                    gpu_instance_start: Some(*start),
                })
                .collect(),
            nvlink_peers: Vec::new(),
            numa_node: None,
        })
        .collect();
    Signal::Gpu(Observation::MigDevices(gpus))
}

/// [`given`], its GPUs in MIG mode as its registration says.
fn given_mig() -> Given {
    let mut g = given();
    g.agent.inventory.gpus.iter_mut().for_each(|g| g.mig = true);
    let registration = EventData::NodeRegistered(g.agent.inventory.clone());
    g.agent
        .apply(2, &Envelope::new(Actor::Admin, t(0), registration));
    g
}

fn registered(batches: Vec<Batch>) -> (Envelope, NodeRegistered) {
    let (e, _) = only(batches);
    match &e.data {
        EventData::NodeRegistered(r) => {
            let r = r.clone();
            (e, r)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn mig_instances_no_lease_holds_are_registered_once_two_reads_agree() {
    let mut g = given_mig();
    let by_hand = [("MIG-x", "1g.5gb", 0)];
    // Seen once: perhaps a lease's, on its way out.
    assert!(!g.agent.signal(mig_read(&by_hand), t(1)));
    assert!(g.agent.decide(t(1)).is_empty());
    assert!(g.agent.signal(mig_read(&by_hand), t(2)));
    let (first, with) = registered(g.agent.decide(t(2)));
    assert_eq!(
        with.gpus[0].unowned_mig_instances,
        [MigInstance {
            profile: "1g.5gb".into(),
            start: 0
        }]
    );
    g.agent.apply(20, &first);
    assert!(g.agent.decide(t(2)).is_empty());
    // The operator destroys it: registered again without it.
    assert!(!g.agent.signal(mig_read(&[]), t(3)));
    assert!(g.agent.signal(mig_read(&[]), t(4)));
    let (gone, without) = registered(g.agent.decide(t(4)));
    assert!(without.gpus[0].unowned_mig_instances.is_empty());
    g.agent.apply(30, &gone);
    // And made again: the same inventory as the first time, a new event.
    g.agent.signal(mig_read(&by_hand), t(5));
    assert!(g.agent.signal(mig_read(&by_hand), t(6)));
    let (again, same) = registered(g.agent.decide(t(6)));
    assert_eq!(same, with);
    assert_ne!(again.id, first.id);
}

#[test]
fn a_lease_instance_is_not_declared_and_a_restart_keeps_what_the_log_declared() {
    let mut g = given_mig();
    let mut placed = fixtures::placed(Uuid::from_u128(8), NODE, "z", "A100-40GB", 40, &[1]);
    placed.gpus[0].mig_instance = Some(MigInstance {
        profile: "3g.20gb".into(),
        start: 4,
    });
    let on_log = |data| Envelope::new(Actor::Admin, t(0), data);
    // The log declared an operator's instance before this agent started.
    let mut declared = g.agent.inventory.clone();
    declared.gpus[0].unowned_mig_instances = vec![MigInstance {
        profile: "1g.5gb".into(),
        start: 0,
    }];
    g.agent
        .apply(11, &on_log(EventData::NodeRegistered(declared.clone())));
    g.agent.apply(12, &on_log(EventData::LeasePlaced(placed)));
    assert!(g.agent.decide(t(1)).is_empty(), "the log's word stands");
    // The lease's own instance is not unowned; the operator's still is.
    let found = [("MIG-x", "1g.5gb", 0)];
    let lease_8s = [("MIG-l", "3g.20gb", 4)];
    g.agent.signal(mig_read_of(&[&found, &lease_8s]), t(2));
    assert!(!g.agent.signal(mig_read_of(&[&found, &lease_8s]), t(3)));
    assert!(g.agent.decide(t(3)).is_empty());
}
