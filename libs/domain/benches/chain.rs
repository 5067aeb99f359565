//! Audit verification throughput against raw SHA-256 over the same bytes,
//! in one run: 10,000 messages of the shape the log holds (a lease event of
//! about 600 bytes on its per-publisher subject), a signed checkpoint every
//! 1,000. One element = one message.
//!
//! * `sha256_raw`: SHA-256 of each message's subject and payload, nothing
//!   else: the floor any verifier pays.
//! * `chain_links`: the links of `lh_domain::chain` (the same bytes and a
//!   few framing ones, each link over the previous).
//! * `stream_check`: what `lh audit verify` runs per message read:
//!   links, the look for checkpoints, and each checkpoint's signature
//!   and head checked with the pinned key.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ed25519_dalek::{Signer as _, SigningKey};
use lh_domain::chain::{checkpoint_statement, Chain};
use lh_domain::chain_check::{StreamCheck, CHECKPOINT_EVENT_TYPE};
use sha2::{Digest, Sha256};

const MESSAGES: u64 = 10_000;
const CHECKPOINT_EVERY: u64 = 1_000;

fn log(signer: &SigningKey) -> Vec<(u64, String, Vec<u8>)> {
    let mut chain = Chain::default();
    let mut out = Vec::new();
    for sequence in 1..=MESSAGES {
        let (subject, payload) = if sequence % CHECKPOINT_EVERY == 0 {
            let signature = signer.sign(
                checkpoint_statement(chain.last_sequence, chain.events, &chain.head).as_bytes(),
            );
            let payload = serde_json::json!({
                "id": format!("00000000-0000-0000-0000-{sequence:012}"),
                "type": CHECKPOINT_EVENT_TYPE,
                "version": 1,
                "data": {
                    "sequence": chain.last_sequence,
                    "events": chain.events,
                    "head": chain.head_hex(),
                    "public_key": hex::encode(signer.verifying_key().to_bytes()),
                    "signature": hex::encode(signature.to_bytes()),
                }
            });
            (
                "lh.evt.audit.chain.checkpoint.audit".to_string(),
                serde_json::to_vec(&payload).unwrap(),
            )
        } else {
            let lease = format!("01a24238-b37a-754e-bafd-{sequence:012}");
            let payload = serde_json::json!({
                "id": format!("01a24238-b37a-754e-0000-{sequence:012}"),
                "type": "lease.placed",
                "version": 1,
                "occurred_at": "2026-12-04T18:02:21.959241Z",
                "actor": {"kind": "service", "id": "lh-scheduler"},
                "correlation_id": lease,
                "tenant_id": "01a24238-8fc2-7763-b1f7-5d4bec0fb669",
                "data": {
                    "lease_id": lease,
                    "node_id": "node-a",
                    "zone": "cn-north-1a",
                    "region": "cn-north-1",
                    "gpu_model": "A100-40GB",
                    "vram_gb_per_gpu": 40,
                    "gpus": [
                        {"index": 0, "uuid": "GPU-8f3199e9-9073-2a12-2b3d-8a93b81c3da8", "milli": 1000},
                        {"index": 1, "uuid": "GPU-1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f809", "milli": 1000}
                    ],
                    "placed_at": "2026-12-04T18:02:21.959241Z",
                    "policy": "default",
                    "score": "0.8125"
                }
            });
            (
                format!("lh.evt.lease.{lease}.placed.scheduler"),
                serde_json::to_vec(&payload).unwrap(),
            )
        };
        chain.append(sequence, &subject, &payload);
        out.push((sequence, subject, payload));
    }
    out
}

fn verification(c: &mut Criterion) {
    let signer = SigningKey::from_bytes(&[7; 32]);
    let pinned = signer.verifying_key().to_bytes();
    let messages = log(&signer);
    let mut group = c.benchmark_group("audit_verification");
    group.throughput(Throughput::Elements(MESSAGES));
    group.bench_function("sha256_raw", |b| {
        b.iter(|| {
            for (_, subject, payload) in &messages {
                let mut h = Sha256::new();
                h.update(subject.as_bytes());
                h.update(payload);
                black_box(h.finalize());
            }
        })
    });
    group.bench_function("chain_links", |b| {
        b.iter(|| {
            let mut chain = Chain::default();
            for (sequence, subject, payload) in &messages {
                chain.append(*sequence, subject, payload);
            }
            black_box(chain.head)
        })
    });
    group.bench_function("stream_check", |b| {
        b.iter(|| {
            let mut check = StreamCheck::from_genesis(pinned);
            for (sequence, subject, payload) in &messages {
                check.message(*sequence, subject, payload);
            }
            let report = check.report();
            assert!(report.ok, "{report:?}");
            black_box(report)
        })
    });
    group.finish();
}

criterion_group!(benches, verification);
criterion_main!(benches);
