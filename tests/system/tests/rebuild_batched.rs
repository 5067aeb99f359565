//! A rebuild folds runs of events into multi-row statements; on a log of
//! many leases whose lives interleave (queued, rejected, stopped, repeated
//! events, tenant, SSH key, dataset and storage events between them) it
//! must leave the very rows that applying each event alone, in its own
//! transaction, leaves.

use chrono::Utc;
use lh_bus::{Bus, BusConfig, FeedItem};
use lh_events::{fixtures, EndReason, EventData, LeaseQueued, LeaseRejected, LeaseStopRequested};
use lh_events::{
    DatasetVersionAdded, SshKeyAdded, SshKeyRemoved, StorageMeasured, StorageProvisioned,
    TenantResumed,
};
use lh_gateway::projection::{GatewayProjection, MIGRATOR, TABLES};
use lh_projection::Projector;
use lh_testkit::{Nats, Postgres};
use uuid::Uuid;

const LEASES: usize = 600;
const TENANTS: usize = 12;
/// Leases whose lives are under way at once: the log interleaves them.
const LEASES_AT_ONCE: usize = 40;
const NODE: &str = "n1";
const MODEL: &str = "A100-40GB";
const MAX_ACKS_IN_FLIGHT: usize = 256;

/// A small deterministic generator: the same log on every run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// One lease's events in order, by the kind of life it has.
fn life(kind: usize, lease_id: Uuid, tenant_id: Uuid, gpu: u32) -> Vec<EventData> {
    let now = Utc::now();
    let requested =
        EventData::LeaseRequested(fixtures::whole_request(lease_id, tenant_id, 1, MODEL));
    let placed =
        || EventData::LeasePlaced(fixtures::placed(lease_id, NODE, "z1", MODEL, 40, &[gpu]));
    let started = || EventData::LeaseStarted(fixtures::started(lease_id, NODE, now));
    let ended = |reason| EventData::LeaseEnded(fixtures::ended(lease_id, NODE, now, reason));
    let queued = |position| {
        EventData::LeaseQueued(LeaseQueued {
            lease_id,
            reason: format!("waiting behind {position}"),
            position,
        })
    };
    let stop = || EventData::LeaseStopRequested(LeaseStopRequested { lease_id });
    match kind {
        0 => vec![
            requested,
            placed(),
            started(),
            stop(),
            ended(EndReason::Stopped),
        ],
        1 => vec![
            requested,
            queued(3),
            queued(1),
            placed(),
            started(),
            ended(EndReason::Completed),
        ],
        2 => vec![
            requested,
            EventData::LeaseRejected(LeaseRejected {
                lease_id,
                reason: "no such model".into(),
                field: Some("gpu_model".into()),
            }),
        ],
        // Repeats: a second placement or start changes nothing.
        3 => vec![
            requested,
            placed(),
            placed(),
            started(),
            started(),
            ended(EndReason::Failed),
        ],
        // Stopped before it was placed; a late start is ignored.
        4 => vec![requested, stop(), ended(EndReason::Cancelled), started()],
        // Still running at the end of the log.
        _ => vec![requested, placed(), started()],
    }
}

fn mixed_log() -> Vec<EventData> {
    let mut rng = Lcg(17);
    let tenants: Vec<Uuid> = (0..TENANTS).map(|_| Uuid::now_v7()).collect();
    let mut log: Vec<EventData> = tenants
        .iter()
        .map(|&t| {
            // The gateway keeps key digests unique: 64 hex digits each.
            EventData::TenantCreated(lh_events::TenantCreated {
                api_key_sha256: format!("{}{}", t.simple(), t.simple()),
                ..fixtures::tenant(t, 64)
            })
        })
        .collect();
    let mut waiting: Vec<std::vec::IntoIter<EventData>> = Vec::new();
    let mut ssh_keys: Vec<(Uuid, Uuid)> = Vec::new();
    let mut begun = 0;
    while begun < LEASES || !waiting.is_empty() {
        while begun < LEASES && waiting.len() < LEASES_AT_ONCE {
            let tenant = tenants[rng.below(TENANTS)];
            let kind = rng.below(6);
            waiting.push(life(kind, Uuid::now_v7(), tenant, (begun % 8) as u32).into_iter());
            begun += 1;
        }
        let i = rng.below(waiting.len());
        match waiting[i].next() {
            Some(event) => log.push(event),
            None => {
                waiting.swap_remove(i);
            }
        }
        // Now and then an event of another kind, between runs of lease
        // events: a tenant's, or an SSH key added or removed.
        match rng.below(50) {
            0 => log.push(EventData::TenantResumed(TenantResumed {
                tenant_id: tenants[rng.below(TENANTS)],
            })),
            1 => {
                let tenant_id = tenants[rng.below(TENANTS)];
                let key_id = Uuid::now_v7();
                log.push(EventData::SshKeyAdded(SshKeyAdded {
                    key_id,
                    tenant_id,
                    name: format!("key {}", ssh_keys.len()),
                    public_key: format!("ssh-ed25519 {key_id}"),
                    fingerprint: format!("SHA256:{key_id}"),
                }));
                ssh_keys.push((key_id, tenant_id));
            }
            2 if ssh_keys.len() > 1 => {
                let (key_id, tenant_id) = ssh_keys.remove(0);
                log.push(EventData::SshKeyRemoved(SshKeyRemoved {
                    key_id,
                    tenant_id,
                }));
            }
            // A dataset's version; a bucket made and measured.
            3 => {
                let tenant_id = tenants[rng.below(TENANTS)];
                let name = format!("set-{}", rng.below(4));
                log.push(EventData::DatasetVersionAdded(DatasetVersionAdded {
                    dataset_id: lh_events::dataset_id(tenant_id, &name),
                    tenant_id,
                    name,
                    version: format!("{:064x}", log.len()),
                    bytes: log.len() as u64,
                    files: 1,
                }));
            }
            4 => {
                let tenant_id = tenants[rng.below(TENANTS)];
                let bucket = format!("lh-t-{}", tenant_id.simple());
                log.push(EventData::StorageProvisioned(StorageProvisioned {
                    tenant_id,
                    bucket: bucket.clone(),
                    access_key_id: format!("AK{}", tenant_id.simple()),
                }));
                log.push(EventData::StorageMeasured(StorageMeasured {
                    tenant_id,
                    bucket,
                    bytes: log.len() as u64,
                    measured_at: Utc::now(),
                    writes_stopped: log.len().is_multiple_of(2),
                }));
            }
            _ => {}
        }
    }
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_rebuild_equals_applying_each_event_alone() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "rebuild-batched-test"))
        .await
        .unwrap();
    let postgres = Postgres::start().await.unwrap();
    let database_url = postgres.create_database().await.unwrap();

    let log = mixed_log();
    let mut acks = std::collections::VecDeque::new();
    for data in log {
        let envelope = fixtures::by_owner(data);
        acks.push_back(
            bus.jetstream()
                .publish(envelope.subject(), envelope.to_json().into())
                .await
                .unwrap(),
        );
        // The client refuses more acknowledgements outstanding than that.
        if acks.len() == MAX_ACKS_IN_FLIGHT {
            acks.pop_front().expect("one is outstanding").await.unwrap();
        }
    }
    for ack in acks {
        ack.await.unwrap();
    }
    let head = bus.last_sequence().await.unwrap();

    // The reference: every event alone, each in its own transaction.
    let projector = GatewayProjection;
    let one = lh_projection::connect_schema(&database_url, "gateway_one")
        .await
        .unwrap();
    lh_projection::migrate(&one, &MIGRATOR).await.unwrap();
    let mut feed = bus.reread(projector.filters(), 1).await.unwrap();
    let mut applied = 0;
    loop {
        let item = feed
            .next_item_within(std::time::Duration::from_secs(10))
            .await
            .expect("the log reads to its head")
            .unwrap();
        let FeedItem::Event(event) = &item else {
            panic!("{} did not decode", item.sequence());
        };
        let mut tx = one.begin().await.unwrap();
        projector.apply(&mut tx, event).await.unwrap();
        tx.commit().await.unwrap();
        applied += 1;
        if item.sequence() >= head {
            break;
        }
    }
    one.close().await;

    let reached = lh_projection::rebuild(
        &bus,
        &database_url,
        "gateway_batched",
        &MIGRATOR,
        &projector,
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(reached, head);

    let tables =
        lh_projection::compare_tables(&database_url, "gateway_one", "gateway_batched", TABLES)
            .await
            .unwrap();
    for table in &tables {
        assert!(table.live.0 > 0, "{} is empty", table.table);
        assert_eq!(table.live, table.rebuilt, "table {} differs", table.table);
    }

    // The log covers every kind of life: each state is in the table.
    let pool = sqlx::PgPool::connect(&database_url).await.unwrap();
    let states: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT state FROM gateway_batched.leases ORDER BY state")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        states,
        ["ended", "rejected", "running"],
        "{applied} events applied"
    );
    let stopped: i64 =
        sqlx::query_scalar("SELECT count(*) FROM gateway_batched.leases WHERE stop_requested")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(stopped > 0);
}
