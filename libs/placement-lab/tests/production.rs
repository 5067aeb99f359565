//! The production policy and the lab's ablation policy with no switch make
//! the same decision, placement by placement. That is what keeps the lab's
//! figures (docs/placement.md, "What we tried") about the policy that runs.

use lh_placement::policy::Leasehold;
use lh_placement::{Cluster, Engine, Rng};
use lh_placement_lab::ablation::{Ablation, LeaseholdConfig};
use lh_placement_lab::trace::{self, Order, Task};

const MODELS: &[&str] = &["P100", "T4", "V100M16", "V100M32", "A10"];

/// A trace shaped like openb: mostly 8-, 4- and 2-GPU nodes of five models;
/// tasks mostly slices of one GPU, some whole GPUs (1 to 8), some CPU only.
fn generated_trace(seed: u64, node_count: usize, task_count: usize) -> (String, String) {
    let mut rng = Rng::new(seed);
    let mut nodes = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
    for i in 0..node_count {
        let gpus = [8, 8, 4, 2, 1, 0][rng.below(6) as usize];
        let model = MODELS[rng.below(MODELS.len() as u64) as usize];
        let cpu_milli = [32_000, 64_000, 96_000, 128_000][rng.below(4) as usize];
        let memory_mib = [131_072, 262_144, 393_216, 786_432][rng.below(4) as usize];
        nodes.push_str(&format!(
            "n{i:04},{cpu_milli},{memory_mib},{gpus},{model}\n"
        ));
    }
    let mut tasks = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
    for i in 0..task_count {
        let cpu_milli = [1_000, 2_000, 4_000, 6_000, 8_000, 12_000, 16_000][rng.below(7) as usize];
        let memory_mib = [2_048, 4_096, 8_192, 12_288, 16_384, 32_768][rng.below(6) as usize];
        let (num_gpu, gpu_milli) = match rng.below(10) {
            0 => (0, 0),
            1..=6 => (
                1,
                [100, 200, 250, 300, 460, 500, 700][rng.below(7) as usize],
            ),
            7 | 8 => (1, 1000),
            _ => ([2, 4, 8][rng.below(3) as usize], 1000),
        };
        let spec = match rng.below(8) {
            0 => MODELS[rng.below(MODELS.len() as u64) as usize].to_string(),
            1 => "V100M16|V100M32".to_string(),
            _ => String::new(),
        };
        tasks.push_str(&format!(
            "t{i:05},{cpu_milli},{memory_mib},{num_gpu},{gpu_milli},{spec}\n"
        ));
    }
    (nodes, tasks)
}

fn assert_same_decisions(nodes_csv: &str, tasks_csv: &str, seed: u64) -> usize {
    let nodes = trace::parse_nodes(nodes_csv).unwrap();
    let tasks: Vec<Task> = trace::parse_tasks(tasks_csv).unwrap();
    let mix = trace::leasehold_mix(&tasks);
    let cluster = Cluster::new(&nodes);
    let seq = trace::arrival_sequence(
        &tasks,
        cluster.gpu_milli_total(),
        1.3,
        seed,
        Order::AppendThenShuffle,
    );
    let ablation = Ablation::with_config(mix.clone(), LeaseholdConfig::default());
    let mut lab = Engine::new(cluster.clone(), Box::new(ablation), seed).with_ranked_ties();
    let mut production =
        Engine::new(cluster, Box::new(Leasehold::new(mix)), seed).with_ranked_ties();
    let mut placed = 0;
    for (step, &t) in seq.iter().enumerate() {
        let request = tasks[t].request();
        let want = lab.schedule(&request).map(|(d, _)| (d.node, d.gpus));
        let got = production.schedule(&request).map(|(d, _)| (d.node, d.gpus));
        assert_eq!(
            got, want,
            "seed {seed}, step {step}, task {}",
            tasks[t].name
        );
        placed += usize::from(got.is_ok());
    }
    placed
}

#[test]
fn production_decides_like_the_lab_default_on_generated_traces() {
    for seed in 42..46 {
        let (nodes, tasks) = generated_trace(seed, 120, 1_500);
        let placed = assert_same_decisions(&nodes, &tasks, seed);
        assert!(placed > 300, "seed {seed}: only {placed} placed");
    }
}

/// The same on the real openb default trace, where this machine has it
/// ([`trace::openb_dir`]); without it the test has nothing to check.
#[test]
fn production_decides_like_the_lab_default_on_the_openb_trace() {
    let Some(dir) = trace::openb_dir() else {
        eprintln!("skipped: no openb trace (set LH_OPENB_DIR)");
        return;
    };
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).expect("openb trace file");
    let nodes = read("openb_node_list_gpu_node.csv");
    let tasks = read("openb_pod_list_default.csv");
    assert_same_decisions(&nodes, &tasks, 42);
}
