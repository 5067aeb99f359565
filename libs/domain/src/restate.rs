//! What a restatement of an aggregate holds, from the events its subject
//! holds now (docs/adr/011-a-year-of-history.md). Pure: the owner reads the
//! subject and appends the result guarded by the subject's last sequence.

use std::collections::BTreeMap;

use lh_events::{
    EventData, LeaseRestated, NodeRestated, PriceBookRestated, StatedEvent, TenantRestated,
    MAX_RESTATED_EVENTS,
};

/// Why a subject cannot be restated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unstatable {
    #[error("the subject holds no events")]
    Empty,
    /// Its first statement has expired already: what is left would state
    /// only part of it.
    #[error("the subject's oldest event (sequence {0}) does not state it from the start")]
    Incomplete(u64),
    #[error("{0} events are not restated")]
    NotRestated(&'static str),
}

/// The restatement of the aggregate whose subject holds `history` (oldest
/// first, as stored). An earlier restatement stands for the events before
/// it, so restatements are never nested.
pub fn restatement(history: &[StatedEvent]) -> Result<EventData, Unstatable> {
    let events = flatten(history)?;
    let first = &events[0].envelope.data;
    match first {
        EventData::LeaseRequested(r) => Ok(EventData::LeaseRestated(LeaseRestated {
            lease_id: r.lease_id,
            tenant_id: r.tenant_id,
            history: bounded_keeping_placement(events),
        })),
        EventData::TenantCreated(t) => Ok(EventData::TenantRestated(TenantRestated {
            tenant_id: t.tenant_id,
            history: bounded(compact_tenant(events)),
        })),
        EventData::NodeRegistered(lh_events::NodeRegistered { node_id, .. })
        | EventData::NodeEnrolled(lh_events::NodeEnrolled { node_id, .. }) => {
            Ok(EventData::NodeRestated(NodeRestated {
                node_id: node_id.clone(),
                history: compact_node(events),
            }))
        }
        EventData::PriceBookPublished(_) => Ok(EventData::PriceBookRestated(PriceBookRestated {
            history: bounded(
                events
                    .into_iter()
                    .filter(|e| matches!(e.envelope.data, EventData::PriceBookPublished(_)))
                    .collect(),
            ),
        })),
        other => Err(Unstatable::NotRestated(other.event_type())),
    }
}

/// The events since the newest restatement, with what it carried first;
/// fails unless that begins with a full statement of the aggregate.
fn flatten(history: &[StatedEvent]) -> Result<Vec<StatedEvent>, Unstatable> {
    let newest = history
        .iter()
        .rposition(|e| e.envelope.data.restated_history().is_some());
    let events: Vec<StatedEvent> = match newest {
        Some(at) => {
            let carried = history[at].envelope.data.restated_history().unwrap_or(&[]);
            carried.iter().chain(&history[at + 1..]).cloned().collect()
        }
        None => history.to_vec(),
    };
    let first = events.first().ok_or(Unstatable::Empty)?;
    if !first.envelope.data.is_full_statement() || first.envelope.data.restated_history().is_some()
    {
        return Err(Unstatable::Incomplete(first.sequence));
    }
    Ok(events)
}

/// Keeps the first event (the one that states the aggregate) and the newest
/// others, within [`MAX_RESTATED_EVENTS`].
fn bounded(mut events: Vec<StatedEvent>) -> Vec<StatedEvent> {
    if events.len() > MAX_RESTATED_EVENTS {
        let cut = events.len() - (MAX_RESTATED_EVENTS - 1);
        events.drain(1..cut);
    }
    // By bytes too: a restatement the server cannot take is no
    // restatement, and the aggregate's history would expire with nothing
    // standing for it. A node writes some fields of its reports, so a
    // count alone does not bound them.
    let sizes: Vec<usize> = events
        .iter()
        .map(|e| serde_json::to_vec(e).map_or(0, |bytes| bytes.len()))
        .collect();
    let mut total: usize = sizes.iter().sum();
    let mut keep_from = 1;
    while total > MAX_RESTATED_BYTES && keep_from + 1 < events.len() {
        total -= sizes[keep_from];
        keep_from += 1;
    }
    events.drain(1..keep_from);
    events
}

/// [`bounded`], keeping the lease's newest placement (`lease.placed`, or a
/// move) even where more events followed it than a restatement holds: a
/// reader new to the lease learns from it which node may report on it.
fn bounded_keeping_placement(events: Vec<StatedEvent>) -> Vec<StatedEvent> {
    let placement = events
        .iter()
        .rposition(|e| {
            matches!(
                e.envelope.data,
                EventData::LeasePlaced(_) | EventData::LeaseMigrated(_)
            )
        })
        .map(|at| events[at].clone());
    let mut kept = bounded(events);
    if let Some(placement) = placement {
        if !kept.iter().any(|e| e.sequence == placement.sequence) {
            // Older than every event kept after the first.
            kept.insert(1.min(kept.len()), placement);
        }
    }
    kept
}

/// Most bytes of stated events one restatement carries: well under the
/// server's 1 MiB message limit, with room for its envelope.
pub const MAX_RESTATED_BYTES: usize = 768 * 1024;

/// A tenant's creation, its keys' issues and revocations, its erasure, the
/// newest suspension (none once resumed) and the newest quota, in the order they
/// were stored. Revoked keys stay, so that a reader new to the tenant lists
/// the same keys; only when that would pass [`MAX_RESTATED_EVENTS`] are the
/// oldest revoked keys left out (issue and revocation both), never a key
/// that still works.
fn compact_tenant(events: Vec<StatedEvent>) -> Vec<StatedEvent> {
    let mut suspension = None;
    let mut quota = None;
    let mut kept = Vec::new();
    for event in events {
        match &event.envelope.data {
            EventData::TenantSuspended(_) => suspension = Some(event),
            EventData::TenantResumed(_) => suspension = None,
            EventData::TenantQuotaChanged(_) => quota = Some(event),
            _ => kept.push(event),
        }
    }
    kept.extend(suspension);
    kept.extend(quota);
    kept.sort_by_key(|e| e.sequence);
    if kept.len() > MAX_RESTATED_EVENTS {
        let issued: std::collections::HashSet<u32> = kept
            .iter()
            .filter_map(|e| match &e.envelope.data {
                EventData::TenantApiKeyIssued(i) => Some(i.key_id),
                _ => None,
            })
            .collect();
        // Oldest first: the order of the revocations.
        let revoked: Vec<u32> = kept
            .iter()
            .filter_map(|e| match &e.envelope.data {
                EventData::TenantApiKeyRevoked(r) if issued.contains(&r.key_id) => Some(r.key_id),
                _ => None,
            })
            .collect();
        let excess = (kept.len() - MAX_RESTATED_EVENTS).div_ceil(2);
        let dropped: std::collections::HashSet<u32> = revoked.into_iter().take(excess).collect();
        kept.retain(|e| match &e.envelope.data {
            EventData::TenantApiKeyIssued(i) => !dropped.contains(&i.key_id),
            EventData::TenantApiKeyRevoked(r) => !dropped.contains(&r.key_id),
            _ => true,
        });
    }
    kept
}

/// A node's newest registration, then the newest event of each fact that
/// still holds, in the order they were stored. Allocations are left out:
/// the leases' own events say what each GPU holds.
fn compact_node(events: Vec<StatedEvent>) -> Vec<StatedEvent> {
    let mut enrollment = None;
    let mut registration = None;
    let mut cordon = None;
    let mut loss = None;
    let mut health = BTreeMap::new();
    let mut self_test = BTreeMap::new();
    for event in events {
        match &event.envelope.data {
            EventData::NodeEnrolled(_) => enrollment = Some(event),
            EventData::NodeRegistered(_) => registration = Some(event),
            EventData::NodeCordoned(_) => cordon = Some(event),
            EventData::NodeUncordoned(_) => cordon = None,
            EventData::NodeLost(_) => loss = Some(event),
            EventData::NodeRejoined(_) => loss = None,
            EventData::NodeGpuHealthChanged(h) => {
                health.insert(h.gpu_index, event);
            }
            EventData::NodeGpuSelfTested(t) => {
                self_test.insert(t.gpu_index, event);
            }
            _ => {}
        }
    }
    let mut rest: Vec<StatedEvent> = cordon
        .into_iter()
        .chain(loss)
        .chain(health.into_values())
        .chain(self_test.into_values())
        .collect();
    rest.sort_by_key(|e| e.sequence);
    // The enrollment, then the registration, first: a reader new to the
    // node judges the registration by the enrollment and knows it before
    // it reads of its GPUs.
    enrollment
        .into_iter()
        .chain(registration)
        .chain(rest)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use lh_events::{fixtures, Actor, Envelope, NodeCordoned, NodeGpuSelfTested};
    use uuid::Uuid;

    fn stated(sequence: u64, data: EventData) -> StatedEvent {
        let at = Utc
            .timestamp_opt(1_700_000_000 + sequence as i64, 0)
            .unwrap();
        StatedEvent {
            sequence,
            stored_at: at,
            envelope: Box::new(Envelope::new(Actor::Admin, at, data)),
        }
    }

    fn lease_history() -> Vec<StatedEvent> {
        let (lease, tenant) = (Uuid::from_u128(1), Uuid::from_u128(2));
        vec![
            stated(
                3,
                EventData::LeaseRequested(fixtures::whole_request(
                    lease,
                    tenant,
                    1,
                    fixtures::MODEL,
                )),
            ),
            stated(
                9,
                EventData::LeaseStopRequested(lh_events::LeaseStopRequested { lease_id: lease }),
            ),
        ]
    }

    #[test]
    fn a_lease_is_restated_from_its_request() {
        let r = restatement(&lease_history()).unwrap();
        let EventData::LeaseRestated(r) = r else {
            panic!("{r:?}")
        };
        assert_eq!(r.lease_id, Uuid::from_u128(1));
        assert_eq!(
            r.history.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            [3, 9]
        );
    }

    #[test]
    fn a_restatement_keeps_within_its_bytes_the_first_and_the_newest() {
        let lease = Uuid::from_u128(1);
        let mut history = lease_history();
        // Starts whose node listed a thousand MIG devices: 60 KiB or so each.
        for i in 0..40 {
            let mut started = fixtures::started(lease, "n1", chrono::Utc::now());
            started.mig_devices = (0..1000)
                .map(|g| lh_events::StartedMigDevice {
                    gpu_index: g,
                    uuid: format!("MIG-{i}-{g}-0000-0000-0000-000000000000"),
                })
                .collect();
            history.push(stated(100 + i, EventData::LeaseStarted(started)));
        }
        let EventData::LeaseRestated(r) = restatement(&history).unwrap() else {
            panic!()
        };
        let bytes: usize = r
            .history
            .iter()
            .map(|e| serde_json::to_vec(e).unwrap().len())
            .sum();
        assert!(bytes <= MAX_RESTATED_BYTES, "{bytes}");
        assert_eq!(r.history.first().unwrap().sequence, 3, "its request stays");
        assert_eq!(r.history.last().unwrap().sequence, 139, "its newest stays");
        assert!(r.history.len() < history.len());
    }

    #[test]
    fn a_long_lease_history_keeps_its_newest_placement() {
        let lease = Uuid::from_u128(1);
        let mut history = lease_history();
        history.push(stated(
            10,
            EventData::LeasePlaced(fixtures::placed(
                lease,
                "n1",
                "z",
                fixtures::MODEL,
                fixtures::MODEL_VRAM_GB,
                &[0],
            )),
        ));
        for i in 0..(MAX_RESTATED_EVENTS as u64 + 10) {
            history.push(stated(
                20 + i,
                EventData::LeaseStopRequested(lh_events::LeaseStopRequested { lease_id: lease }),
            ));
        }
        let EventData::LeaseRestated(r) = restatement(&history).unwrap() else {
            panic!()
        };
        let sequences: Vec<u64> = r.history.iter().map(|e| e.sequence).take(3).collect();
        assert_eq!(sequences[..2], [3, 10], "the request, then the placement");
        assert!(r.history.windows(2).all(|w| w[0].sequence < w[1].sequence));
    }

    #[test]
    fn a_restatement_stands_for_what_it_carried_and_is_not_nested() {
        let first = restatement(&lease_history()).unwrap();
        let mut later = vec![stated(20, first)];
        later.push(stated(
            25,
            EventData::LeaseResumeRequested(lh_events::LeaseResumeRequested {
                lease_id: Uuid::from_u128(1),
            }),
        ));
        let EventData::LeaseRestated(r) = restatement(&later).unwrap() else {
            panic!()
        };
        let seqs: Vec<u64> = r.history.iter().map(|e| e.sequence).collect();
        assert_eq!(seqs, [3, 9, 25]);
        assert!(r
            .history
            .iter()
            .all(|e| e.envelope.data.restated_history().is_none()));
    }

    /// Key `key_id` of `tenant_id` issued, with a hash of its own.
    fn key_issued(tenant_id: Uuid, key_id: u32) -> EventData {
        EventData::TenantApiKeyIssued(lh_events::TenantApiKeyIssued {
            tenant_id,
            key_id,
            prefix: "lh_abcdefgh".into(),
            sha256: format!("{key_id:064}"),
            expires_at: None,
        })
    }

    #[test]
    fn an_erased_tenant_stays_erased_past_its_history() {
        use lh_events::{TenantErased, TenantSuspended};
        let tenant_id = Uuid::from_u128(3);
        let history = vec![
            stated(1, EventData::TenantCreated(fixtures::tenant(tenant_id, 4))),
            stated(
                2,
                EventData::TenantSuspended(TenantSuspended {
                    tenant_id,
                    reason_sealed: "c2VhbGVk".into(),
                    stop_leases: true,
                }),
            ),
            stated(3, EventData::TenantErased(TenantErased { tenant_id })),
        ];
        let EventData::TenantRestated(r) = restatement(&history).unwrap() else {
            panic!()
        };
        let kept: Vec<(u64, &str)> = r
            .history
            .iter()
            .map(|e| (e.sequence, e.envelope.data.event_type()))
            .collect();
        assert_eq!(
            kept,
            [
                (1, "tenant.created"),
                (2, "tenant.suspended"),
                (3, "tenant.erased")
            ]
        );
        // The sealed reason goes along as it was: the restatement is
        // opened (or not) with the same key as the original.
        assert_eq!(r.history[1].envelope.data, history[1].envelope.data);
    }

    #[test]
    fn a_tenant_keeps_its_keys_newest_suspension_and_quota() {
        use lh_events::{
            Quota, TenantApiKeyRevoked, TenantQuotaChanged, TenantResumed, TenantSuspended,
        };
        let tenant_id = Uuid::from_u128(2);
        let issued = |key_id| key_issued(tenant_id, key_id);
        let revoked =
            |key_id| EventData::TenantApiKeyRevoked(TenantApiKeyRevoked { tenant_id, key_id });
        let suspended = EventData::TenantSuspended(TenantSuspended {
            tenant_id,
            reason_sealed: "dW5wYWlk".into(),
            stop_leases: false,
        });
        let quota = |max_gpus| {
            EventData::TenantQuotaChanged(TenantQuotaChanged {
                tenant_id,
                quota: Quota {
                    max_gpus,
                    max_vram_gb: None,
                    max_storage_gb: None,
                },
                weight: 1,
            })
        };
        let history = vec![
            stated(1, EventData::TenantCreated(fixtures::tenant(tenant_id, 4))),
            stated(2, issued(2)),
            stated(3, issued(3)),
            stated(4, revoked(2)),
            stated(5, revoked(1)),
            stated(6, suspended.clone()),
            stated(7, quota(8)),
            stated(8, EventData::TenantResumed(TenantResumed { tenant_id })),
            stated(9, suspended),
            stated(10, quota(16)),
        ];
        let EventData::TenantRestated(r) = restatement(&history).unwrap() else {
            panic!()
        };
        let seqs: Vec<u64> = r.history.iter().map(|e| e.sequence).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5, 9, 10]);
        let resumed = [
            history.clone(),
            vec![stated(
                11,
                EventData::TenantResumed(TenantResumed { tenant_id }),
            )],
        ]
        .concat();
        let EventData::TenantRestated(r) = restatement(&resumed).unwrap() else {
            panic!()
        };
        let seqs: Vec<u64> = r.history.iter().map(|e| e.sequence).collect();
        assert_eq!(
            seqs,
            [1, 2, 3, 4, 5, 10],
            "a resumed tenant carries no suspension"
        );
    }

    #[test]
    fn a_tenant_over_the_bound_leaves_out_its_oldest_revoked_keys_never_a_live_one() {
        use lh_events::TenantApiKeyRevoked;
        let tenant_id = Uuid::from_u128(2);
        let issued = |key_id| key_issued(tenant_id, key_id);
        let mut history = vec![stated(
            1,
            EventData::TenantCreated(fixtures::tenant(tenant_id, 4)),
        )];
        let mut seq = 1;
        // Key 2 stays live; keys 3.. are issued and revoked in turn.
        seq += 1;
        history.push(stated(seq, issued(2)));
        for key_id in 3..(3 + MAX_RESTATED_EVENTS as u32) {
            seq += 1;
            history.push(stated(seq, issued(key_id)));
            seq += 1;
            history.push(stated(
                seq,
                EventData::TenantApiKeyRevoked(TenantApiKeyRevoked { tenant_id, key_id }),
            ));
        }
        let EventData::TenantRestated(r) = restatement(&history).unwrap() else {
            panic!()
        };
        assert!(
            r.history.len() <= MAX_RESTATED_EVENTS,
            "{}",
            r.history.len()
        );
        let keys: Vec<u32> = r
            .history
            .iter()
            .filter_map(|e| match &e.envelope.data {
                EventData::TenantApiKeyIssued(i) => Some(i.key_id),
                _ => None,
            })
            .collect();
        assert_eq!(keys[0], 2, "the live key is kept");
        assert!(!keys.contains(&3), "the oldest revoked key is left out");
        assert!(
            keys.contains(&(2 + MAX_RESTATED_EVENTS as u32)),
            "the newest stays"
        );
        assert!(matches!(
            r.history[0].envelope.data,
            EventData::TenantCreated(_)
        ));
    }

    #[test]
    fn a_history_whose_start_expired_is_not_restated() {
        let tail = &lease_history()[1..];
        assert_eq!(restatement(tail), Err(Unstatable::Incomplete(9)));
        assert_eq!(restatement(&[]), Err(Unstatable::Empty));
    }

    #[test]
    fn a_node_keeps_its_newest_registration_first_and_the_facts_that_hold() {
        let node = |n| EventData::NodeRegistered(fixtures::node("a", "z", n, fixtures::MODEL, 40));
        let tested = |seq, passed| {
            stated(
                seq,
                EventData::NodeGpuSelfTested(NodeGpuSelfTested {
                    node_id: "a".into(),
                    gpu_index: 0,
                    passed,
                    duration_seconds: 1.0,
                    detail: String::new(),
                    at: Utc.timestamp_opt(0, 0).unwrap(),
                }),
            )
        };
        let history = vec![
            stated(1, node(2)),
            stated(
                2,
                EventData::NodeGpusAllocated(lh_events::NodeGpusAllocated::one(
                    "a",
                    Uuid::nil(),
                    vec![0],
                )),
            ),
            tested(3, false),
            stated(
                4,
                EventData::NodeCordoned(NodeCordoned {
                    node_id: "a".into(),
                    drain: None,
                    reason: "r".into(),
                }),
            ),
            stated(5, node(4)),
            tested(6, true),
            stated(
                7,
                EventData::NodeUncordoned(lh_events::NodeUncordoned {
                    node_id: "a".into(),
                }),
            ),
        ];
        let EventData::NodeRestated(r) = restatement(&history).unwrap() else {
            panic!()
        };
        let seqs: Vec<u64> = r.history.iter().map(|e| e.sequence).collect();
        assert_eq!(
            seqs,
            [5, 6],
            "registration, then the GPU's newest self-test"
        );
    }

    #[test]
    fn a_long_history_keeps_its_first_statement_and_the_newest_events() {
        let mut history = lease_history();
        let lease_id = Uuid::from_u128(1);
        for seq in 10..(10 + MAX_RESTATED_EVENTS as u64 + 5) {
            history.push(stated(
                seq,
                EventData::LeaseResumeRequested(lh_events::LeaseResumeRequested { lease_id }),
            ));
        }
        let last = history.last().unwrap().sequence;
        let EventData::LeaseRestated(r) = restatement(&history).unwrap() else {
            panic!()
        };
        assert_eq!(r.history.len(), MAX_RESTATED_EVENTS);
        assert_eq!(r.history[0].sequence, 3);
        assert_eq!(r.history.last().unwrap().sequence, last);
    }
}
