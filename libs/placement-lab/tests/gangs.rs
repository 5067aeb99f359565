//! Gangs in the lab: the multi-node variant of a task list, gangs in the
//! published protocol's replay, and what they wait in the timed replay.

use lh_placement::{Cluster, Engine, GpuSpec, NodeSpec, SharingMode};
use lh_placement_lab::timed::run_timed;
use lh_placement_lab::trace::{self, is_gang, multinode, Task};

fn nodes(count: usize, gpus: usize) -> Vec<NodeSpec> {
    (0..count)
        .map(|i| {
            NodeSpec::uniform(
                format!("n{i}"),
                "default",
                96_000,
                1 << 20,
                gpus,
                GpuSpec {
                    model: "G2".into(),
                    vram_gb: 0,
                    mode: SharingMode::VGpu,
                },
            )
        })
        .collect()
}

fn task(name: &str, gpus: u32, milli: u32, duration_s: u64) -> Task {
    Task {
        name: name.into(),
        cpu_milli: 4_000 * u64::from(gpus.max(1)),
        memory_mib: 8_192 * u64::from(gpus.max(1)),
        num_gpu: gpus,
        gpu_milli: milli,
        gpu_spec: String::new(),
        duration_s,
    }
}

#[test]
fn the_multinode_variant_widens_four_and_eight_gpu_tasks_and_keeps_the_rest() {
    let tasks = vec![
        task("a", 8, 1000, 60),
        task("b", 4, 1000, 60),
        task("c", 2, 1000, 60),
        task("d", 1, 500, 60),
        task("e", 0, 0, 60),
    ];
    let wide = multinode(&tasks);
    let shape = |t: &Task| (t.name.clone(), t.num_gpu, t.cpu_milli, t.memory_mib);
    assert_eq!(
        wide.iter().map(shape).collect::<Vec<_>>(),
        [
            ("a-x2".into(), 16, 64_000, 131_072),
            ("b-x3".into(), 12, 48_000, 98_304),
            ("c".into(), 2, 8_000, 16_384),
            ("d".into(), 1, 4_000, 8_192),
            ("e".into(), 0, 4_000, 8_192),
        ]
    );
    let cluster = Cluster::new(&nodes(2, 8));
    let gangs: Vec<bool> = wide.iter().map(|t| is_gang(&cluster, t)).collect();
    assert_eq!(gangs, [true, true, false, false, false]);
}

#[test]
fn the_replay_counts_gangs_placed_whole_and_never_in_part() {
    // Three nodes of 8: a 16 goes, a second 16 finds 8 free and fails with
    // nothing taken, a 12 fails likewise, then eight 1-GPU tasks fill up.
    let mut tasks = vec![
        task("g1", 16, 1000, 0),
        task("g2", 16, 1000, 0),
        task("g3", 12, 1000, 0),
    ];
    tasks.extend((0..8).map(|i| task(&format!("s{i}"), 1, 1000, 0)));
    let policy = lh_placement_lab::policy_by_name("leasehold", &trace::leasehold_mix(&tasks))
        .expect("the default policy");
    let mut engine = Engine::new(Cluster::new(&nodes(3, 8)), policy, 42).with_ranked_ties();
    let seq: Vec<usize> = (0..tasks.len()).collect();
    let r = trace::replay(&mut engine, &tasks, &seq);
    assert_eq!((r.gangs_placed, r.gangs_failed), (1, 2));
    assert_eq!((r.placed, r.failed), (8, 0));
    assert_eq!(r.allocated[0], 16_000);
    assert_eq!(r.allocated[1], 16_000, "a failed gang takes nothing");
    assert_eq!(r.allocated[2], 16_000);
    assert_eq!(*r.allocated.last().unwrap(), 24_000);
}

#[test]
fn in_the_timed_replay_every_gang_starts_and_waits_longer_than_a_single() {
    // Two nodes of 8: a 16-GPU gang needs the whole cluster, while 1-GPU
    // tasks, fifteen times as many, keep coming and take any GPU that
    // frees.
    let mut tasks = vec![task("gang", 16, 1000, 600)];
    tasks.extend((0..15).map(|i| task(&format!("one{i}"), 1, 1000, 600)));
    let a = run_timed(&nodes(2, 8), &tasks, "leasehold", 42, 1.0).unwrap();
    let b = run_timed(&nodes(2, 8), &tasks, "leasehold", 42, 1.0).unwrap();
    assert_eq!(a, b, "a seed fixes the replay");
    assert!(a.gangs.tasks > 0 && a.singles.tasks > 0, "{a:?}");
    assert_eq!(a.gangs.started, a.gangs.tasks, "{a:?}");
    assert_eq!(a.singles.started, a.singles.tasks, "{a:?}");
    assert!(a.gangs.mean_s > a.singles.mean_s, "{a:?}");
    assert!(a.allocation_pct > 0.0 && a.allocation_pct <= 100.0, "{a:?}");

    // At a tenth of the load nothing waits long: the cluster is mostly
    // empty when a gang comes.
    let light = run_timed(&nodes(2, 8), &tasks, "leasehold", 42, 0.1).unwrap();
    assert!(
        light.gangs.mean_s < a.gangs.mean_s,
        "{light:?} against {a:?}"
    );

    let no_times = vec![task("one", 1, 1000, 0)];
    assert!(run_timed(&nodes(2, 8), &no_times, "leasehold", 42, 1.0).is_err());
    assert!(run_timed(&nodes(2, 8), &tasks, "leasehold", 42, 0.0).is_err());
}
