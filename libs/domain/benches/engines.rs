//! Decision throughput of the pure engines: best-fit placement on a small
//! and a large fleet, rating of one lease, and the audit chain's link.

use chrono::{Duration, TimeZone, Utc};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lh_domain::placement::{best_fit, Gpu, Node, Request};
use lh_domain::{chain, rating};
use std::hint::black_box;

fn fleet(nodes: u32) -> Vec<Node> {
    (0..nodes)
        .map(|n| Node {
            id: format!("node-{n:05}"),
            zone: format!("z{}", n % 3),
            lost: None,
            cordoned: None,
            gpus: (0..8)
                .map(|i| Gpu {
                    index: i,
                    uuid: format!("GPU-{n}-{i}"),
                    model: "A100-40GB".into(),
                    vram_gb: 40,
                    // A mixed fleet: some GPUs busy on every node.
                    held_by: ((n + i) % 3 == 0).then(uuid::Uuid::nil),
                    shares: Vec::new(),
                    mig: false,
                    health: lh_events::GpuHealth::Healthy,
                    health_since: None,
                })
                .collect(),
        })
        .collect()
}

fn placement(c: &mut Criterion) {
    let mut group = c.benchmark_group("best_fit");
    for nodes in [3u32, 1_000, 10_000] {
        let f = fleet(nodes);
        let req = Request {
            gpus: 2,
            gpu_model: "A100-40GB".into(),
        };
        group.throughput(Throughput::Elements(1));
        group.bench_with_input(BenchmarkId::from_parameter(nodes), &f, |b, f| {
            b.iter(|| best_fit(black_box(f.iter()), black_box(&req)))
        });
    }
    group.finish();
}

fn pricing(c: &mut Criterion) {
    let t0 = Utc.with_ymd_and_hms(2026, 11, 30, 23, 0, 0).unwrap();
    let book = rating::default_price_book(t0);
    let seg = rating::Segment {
        index: 0,
        lease_id: uuid::Uuid::nil(),
        tenant_id: uuid::Uuid::nil(),
        tier: lh_events::Tier::Basic,
        gpus: 8,
        vram_gb_per_gpu: 80,
        started_at: t0,
        ended_at: t0 + Duration::hours(3),
    };
    c.bench_function("rating/charges_across_a_month_boundary", |b| {
        b.iter(|| rating::charges(black_box(&book), black_box(&seg)))
    });
}

fn audit_chain(c: &mut Criterion) {
    let payload = vec![b'x'; 600];
    let mut group = c.benchmark_group("chain");
    group.throughput(Throughput::Elements(1));
    group.bench_function("link_600_byte_event", |b| {
        b.iter(|| {
            chain::link(
                black_box(&chain::GENESIS),
                42,
                "lh.evt.lease.x",
                black_box(&payload),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, placement, pricing, audit_chain);
criterion_main!(benches);
