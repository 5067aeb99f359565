use lh_placement::sim::*;
use lh_placement::*;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let t = "/work/shared/traces/openb";
    let nodes =
        parse_nodes(&std::fs::read_to_string(format!("{t}/openb_node_list_gpu_node.csv")).unwrap())
            .unwrap();
    let tasks =
        parse_tasks(&std::fs::read_to_string(format!("{t}/openb_pod_list_{}.csv", a[1])).unwrap())
            .unwrap();
    for p in &a[2..] {
        let mut fail = std::collections::BTreeMap::<String, (u32, u64)>::new();
        let mut idle = 0u64;
        let mut parth = std::collections::BTreeMap::<u16, (u64, u64)>::new();
        let mut whole_free = 0u64;
        let mut partial = 0u64;
        let mut whole_free_lowcpu = 0u64;
        let mut whole_free_lowmem = 0u64;
        let mut cpuf = 0u64;
        let mut memf = 0u64;
        let mut cpu_on_full = 0u64;
        let mut gpu_idle_by_model = std::collections::BTreeMap::<String, u64>::new();
        let mut frag_nodes = 0;
        let mut emptyn = 0;
        let mut cpu_strand = 0u64;
        for seed in 42..46u64 {
            let cluster = Cluster::new(&nodes);
            let cap = cluster.gpu_milli_total();
            let w = if p.starts_with("leasehold") {
                leasehold_workload(&tasks)
            } else {
                published_workload(&tasks)
            };
            let pol = policy::by_name(p, &w).unwrap();
            let seq = arrival_sequence(&tasks, cap, 1.3, seed, Order::AppendThenShuffle);
            let mut e = Engine::new(cluster, pol, seed).with_ranked_ties();
            for &i in &seq {
                let r = tasks[i].request();
                if e.schedule(&r).is_err() {
                    let k = match r.gpu {
                        GpuDemand::None => "cpu".to_string(),
                        GpuDemand::Whole { count } => format!("{count}gpu"),
                        GpuDemand::Fraction { milli, .. } => format!("share{}", milli / 250 * 250),
                        _ => "mig".into(),
                    };
                    let en = fail.entry(k).or_default();
                    en.0 += 1;
                    en.1 += tasks[i].gpu_milli_total();
                }
            }
            for n in e.cluster().nodes() {
                for g in &n.gpus {
                    if g.milli_free == 1000 {
                        whole_free += 1000;
                        if n.cpu_free < 8000 {
                            whole_free_lowcpu += 1000;
                        } else if n.memory_free < 30000 {
                            whole_free_lowmem += 1000;
                        }
                    } else {
                        partial += g.milli_free as u64;
                        if g.milli_free > 0 {
                            let k = g.milli_free / 100 * 100;
                            let en = parth.entry(k).or_default();
                            en.0 += 1;
                            en.1 += (n.cpu_free < 4000) as u64;
                        }
                    }
                }
                let f = n.gpu_milli_free();
                idle += f;
                cpuf += n.cpu_free;
                memf += n.memory_free;
                if f == 0 {
                    cpu_on_full += n.cpu_free;
                }
                *gpu_idle_by_model
                    .entry(e.cluster().models()[n.gpus[0].model as usize].clone())
                    .or_default() += f;
                if f > 0 {
                    frag_nodes += 1;
                }
                if f as usize == n.gpus.len() * 1000 {
                    emptyn += 1;
                }
                if n.cpu_free < 8000 {
                    cpu_strand += f;
                }
            }
        }
        println!(
            "{p}: cpu_free {} (on gpu-full nodes {}) mem_free {} idle_by_model {:?}",
            cpuf / 4,
            cpu_on_full / 4,
            memf / 4,
            gpu_idle_by_model
                .iter()
                .map(|(k, v)| (k.clone(), v / 4))
                .collect::<Vec<_>>()
        );
        println!(
            "{p}: whole_free {} (cpu<8c {}, mem<30G {}) partial {}",
            whole_free / 4,
            whole_free_lowcpu / 4,
            whole_free_lowmem / 4,
            partial / 4
        );
        println!(
            "{p}: partial hist (bucket, count, count cpu<4c) {:?}",
            parth
                .iter()
                .map(|(k, v)| (*k, v.0 / 4, v.1 / 4))
                .collect::<Vec<_>>()
        );
        println!(
            "{p}: idle/seed {} nodes_with_idle {} empty_nodes {} idle_on_cpu<8c {} fails {:?}",
            idle / 4,
            frag_nodes / 4,
            emptyn / 4,
            cpu_strand / 4,
            fail.iter()
                .map(|(k, v)| (k.clone(), v.0 / 4, v.1 / 4))
                .collect::<Vec<_>>()
        );
    }
}
