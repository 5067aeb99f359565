//! The one event vocabulary of Leasehold.
//!
//! Every fact the platform records is an [`Envelope`] around one of the
//! [`EventData`] variants, stored as JSON on the `LH_EVENTS` stream under the
//! subject of the aggregate it belongs to followed by its verb and its
//! publisher (`lh.evt.lease.<id>.placed.scheduler`, …; see [`subject`]), so
//! that the server's permissions can tell types and publishers apart while
//! an expected-last-subject-sequence on `<aggregate>.>` still guards the
//! whole aggregate. JSON Schemas for every type are generated into `schemas/` by
//! [`schemas`]; a test fails when they drift from these types.
//!
//! Every event type is named once, in the table below: its type string, its
//! version, its payload struct and the aggregate whose subject it is written
//! to. Each type carries its own version; what happens when one of them
//! first needs a version 2 is decided in docs/adr/007-event-versions.md.
//! Readers decode stored messages with [`Envelope::decode`], which ignores
//! unknown fields and says why a message it cannot use is skipped, instead
//! of failing the reader.

#[macro_use]
mod table;

mod audit;
mod billing;
mod decode;
mod envelope;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
mod gpu;
mod lease;
mod node;
pub mod node_time;
mod restated;
mod schema;
mod session;
mod ssh_key;
mod storage;
pub mod subject;
pub mod telemetry;
mod tenant;
pub mod trail;

pub use audit::*;
pub use billing::*;
pub use decode::*;
pub use envelope::*;
pub use gpu::*;
pub use lease::*;
pub use node::*;
pub use restated::*;
pub use schema::schemas;
pub use session::*;
pub use ssh_key::*;
pub use storage::*;
pub use tenant::*;

events! {
    "tenant.created" v=1 => TenantCreated @ tenant(tenant_id), tenant_id = tenant_id;
    "tenant.restated" v=1 => TenantRestated @ tenant(tenant_id), tenant_id = tenant_id;
    "tenant.api_key_issued" v=1 => TenantApiKeyIssued @ tenant(tenant_id), tenant_id = tenant_id;
    "tenant.api_key_revoked" v=1 => TenantApiKeyRevoked @ tenant(tenant_id), tenant_id = tenant_id;
    "tenant.suspended" v=1 => TenantSuspended @ tenant(tenant_id), tenant_id = tenant_id;
    "tenant.resumed" v=1 => TenantResumed @ tenant(tenant_id), tenant_id = tenant_id;
    "tenant.quota_changed" v=1 => TenantQuotaChanged @ tenant(tenant_id), tenant_id = tenant_id;
    "tenant.erased" v=1 => TenantErased @ tenant(tenant_id), tenant_id = tenant_id;
    "lease.requested" v=1 => LeaseRequested @ lease(lease_id), tenant_id = tenant_id;
    "lease.queued" v=1 => LeaseQueued @ lease(lease_id);
    "lease.rejected" v=1 => LeaseRejected @ lease(lease_id);
    "lease.placed" v=1 => LeasePlaced @ lease(lease_id);
    "lease.stop_requested" v=1 => LeaseStopRequested @ lease(lease_id);
    "lease.preemption_noticed" v=1 => LeasePreemptionNoticed @ lease(lease_id);
    "lease.started" v=1 => LeaseStarted @ lease(lease_id);
    "lease.ended" v=1 => LeaseEnded @ lease(lease_id);
    "lease.migrated" v=1 => LeaseMigrated @ lease(lease_id);
    "lease.gpu_fault" v=1 => LeaseGpuFault @ lease(lease_id);
    "lease.idle_detected" v=1 => LeaseIdleDetected @ lease(lease_id);
    "lease.suspended" v=1 => LeaseSuspended @ lease(lease_id);
    "lease.resume_requested" v=1 => LeaseResumeRequested @ lease(lease_id);
    "lease.restated" v=1 => LeaseRestated @ lease(lease_id), tenant_id = tenant_id;
    "lease.workspace_synced" v=1 => LeaseWorkspaceSynced @ lease(lease_id);
    "lease.member_completed" v=1 => LeaseMemberCompleted @ lease(lease_id);
    "node.registered" v=1 => NodeRegistered @ node(node_id);
    "node.enrolled" v=1 => NodeEnrolled @ node(node_id);
    "node.gpus_allocated" v=1 => NodeGpusAllocated @ node(node_id);
    "node.lost" v=1 => NodeLost @ node(node_id);
    "node.rejoined" v=1 => NodeRejoined @ node(node_id);
    "node.gpu_health_changed" v=1 => NodeGpuHealthChanged @ node(node_id);
    "node.gpu_self_tested" v=1 => NodeGpuSelfTested @ node(node_id);
    "node.cordoned" v=1 => NodeCordoned @ node(node_id);
    "node.uncordoned" v=1 => NodeUncordoned @ node(node_id);
    "node.restated" v=1 => NodeRestated @ node(node_id);
    "node_view.relayed" v=1 => NodeViewRelayed @ node_view(node_id);
    "spot.price_set" v=1 => SpotPriceSet @ spot(zone, gpu_model);
    "spot.capacity_chosen" v=1 => SpotCapacityChosen @ spot(zone, gpu_model), tenant_id = tenant_id;
    "price_book.published" v=1 => PriceBookPublished @ price_book();
    "price_book.restated" v=1 => PriceBookRestated @ price_book();
    "charge.accrued" v=1 => ChargeAccrued @ charge(lease_id), tenant_id = tenant_id;
    "invoice.issued" v=1 => InvoiceIssued @ invoice(), tenant_id = tenant_id;
    "invoice.note_issued" v=1 => InvoiceNoteIssued @ invoice(), tenant_id = tenant_id;
    "credit.granted" v=1 => CreditGranted @ credit(tenant_id), tenant_id = tenant_id;
    "audit.checkpoint" v=1 => AuditCheckpoint @ audit();
    "audit.pruned" v=1 => AuditPruned @ audit();
    "audit.divergence_detected" v=1 => AuditDivergenceDetected @ audit();
    "audit.accessed" v=1 => AuditAccessed @ audit();
    "access.refused" v=1 => AccessRefused @ access();
    "security.events_refused" v=1 => SecurityEventsRefused @ security();
    "reservation.committed" v=1 => ReservationCommitted @ reservation(reservation_id), tenant_id = tenant_id;
    "balance.topped_up" v=1 => BalanceToppedUp @ balance(tenant_id), tenant_id = tenant_id;
    "balance.low" v=1 => BalanceLow @ balance(tenant_id), tenant_id = tenant_id;
    "balance.exhausted" v=1 => BalanceExhausted @ balance(tenant_id), tenant_id = tenant_id;
    "balance.restored" v=1 => BalanceRestored @ balance(tenant_id), tenant_id = tenant_id;
    "quote.issued" v=1 => QuoteIssued @ quote(quote_id), tenant_id = tenant_id;
    "session.opened" v=1 => SessionOpened @ session(session_id), tenant_id = tenant_id;
    "session.ended" v=1 => SessionEnded @ session(session_id), tenant_id = tenant_id;
    "ssh_key.added" v=1 => SshKeyAdded @ ssh_key(key_id), tenant_id = tenant_id;
    "ssh_key.removed" v=1 => SshKeyRemoved @ ssh_key(key_id), tenant_id = tenant_id;
    "storage.provisioned" v=1 => StorageProvisioned @ storage(tenant_id), tenant_id = tenant_id;
    "storage.erased" v=1 => StorageErased @ storage(tenant_id), tenant_id = tenant_id;
    "storage.measured" v=1 => StorageMeasured @ storage(tenant_id), tenant_id = tenant_id;
    "charge.storage_accrued" v=1 => StorageChargeAccrued @ charge(storage_id), tenant_id = tenant_id;
    "dataset.version_added" v=1 => DatasetVersionAdded @ dataset(dataset_id), tenant_id = tenant_id;
    "dataset.removed" v=1 => DatasetRemoved @ dataset(dataset_id), tenant_id = tenant_id;
    "workspace.snapshotted" v=1 => WorkspaceSnapshotted @ workspace(workspace_id), tenant_id = tenant_id;
    "workspace.restored" v=1 => WorkspaceRestored @ workspace(workspace_id), tenant_id = tenant_id;
    "workspace.removed" v=1 => WorkspaceRemoved @ workspace(workspace_id), tenant_id = tenant_id;
}

impl EventData {
    /// The node a node's report names as the one that saw it: a node may
    /// report only on itself. `None` for an event no node writes, and for
    /// a report that names none (a stop; an end the scheduler wrote).
    pub fn reporting_node(&self) -> Option<&str> {
        match self {
            EventData::LeaseStarted(e) => Some(&e.node_id),
            EventData::LeaseEnded(e) => e.node_id.as_deref(),
            EventData::LeaseSuspended(e) => Some(&e.node_id),
            EventData::LeaseGpuFault(e) => Some(&e.node_id),
            EventData::LeaseIdleDetected(e) => Some(&e.node_id),
            EventData::LeaseWorkspaceSynced(e) => Some(&e.node_id),
            EventData::LeaseMemberCompleted(e) => Some(&e.node_id),
            EventData::NodeRegistered(e) => Some(&e.node_id),
            EventData::NodeGpuHealthChanged(e) => Some(&e.node_id),
            EventData::NodeGpuSelfTested(e) => Some(&e.node_id),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use uuid::Uuid;

    #[test]
    fn envelope_round_trips_and_type_matches_tag() {
        let data = EventData::LeaseStopRequested(LeaseStopRequested {
            lease_id: Uuid::nil(),
        });
        let env = Envelope::new(Actor::Admin, Utc::now(), data);
        let json: serde_json::Value = serde_json::from_slice(&env.to_json()).unwrap();
        assert_eq!(json["type"], "lease.stop_requested");
        assert_eq!(json["data"]["type"], "lease.stop_requested");
        assert_eq!(json["version"], 1);
        assert_eq!(Envelope::from_json(&env.to_json()).unwrap(), env);
    }

    #[test]
    fn a_request_asks_for_exactly_one_thing() {
        let (lease, tenant) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let whole = fixtures::whole_request(lease, tenant, 4, fixtures::MODEL);
        assert_eq!(whole.ask(), GpuAsk::Whole(4));
        assert_eq!(whole.ask().gpus(), 4);
        let share = fixtures::fraction_request(lease, tenant, fixtures::MODEL, 250, 10);
        assert_eq!(
            share.ask(),
            GpuAsk::Fraction(GpuFraction {
                milli: 250,
                vram_gb: 10
            })
        );
        assert_eq!(share.ask().field(), "gpu_fraction");
        let mig = LeaseRequested {
            mig_profile: Some("3g.20gb".into()),
            ..whole.clone()
        };
        assert_eq!(mig.ask(), GpuAsk::Mig("3g.20gb".into()));
        assert_eq!((mig.ask().gpus(), mig.ask().field()), (1, "mig_profile"));
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        assert_eq!(derived_id(&["a", "b"]), derived_id(&["a", "b"]));
        assert_ne!(derived_id(&["a", "b"]), derived_id(&["ab"]));
    }

    #[test]
    fn unknown_payload_fields_are_ignored() {
        // A newer writer's optional field must not stop an older reader.
        let newer = r#"{"type":"lease.stop_requested","lease_id":"00000000-0000-0000-0000-000000000000","x":1}"#;
        assert_eq!(
            serde_json::from_str::<EventData>(newer).unwrap(),
            EventData::LeaseStopRequested(LeaseStopRequested {
                lease_id: Uuid::nil()
            })
        );
    }

    #[test]
    fn every_type_is_named_once_and_after_its_aggregate() {
        let mut seen = std::collections::BTreeSet::new();
        for (event_type, version, aggregate) in EVENT_TYPES {
            assert!(seen.insert(*event_type), "{event_type} twice");
            assert!(
                event_type.starts_with(&format!("{aggregate}.")),
                "{event_type}"
            );
            assert!(*version >= 1, "{event_type}");
        }
        let files: Vec<String> = schemas().into_iter().map(|(f, _)| f).collect();
        assert_eq!(files.len(), EVENT_TYPES.len() + 1);
    }

    #[test]
    fn the_table_drives_tag_subject_and_lease() {
        let lease = Uuid::from_u128(7);
        let data = EventData::LeaseStarted(LeaseStarted {
            lease_id: lease,
            node_id: "n1".into(),
            started_at: Utc::now(),
            mig_devices: Vec::new(),
        });
        let json = serde_json::to_value(&data).unwrap();
        assert_eq!(json["type"], data.event_type());
        assert_eq!(data.aggregate_subject(), subject::lease(lease));
        assert_eq!(data.lease_id(), Some(lease));
        assert_eq!(data.version(), 1);
    }

    #[test]
    fn subjects_and_ids_follow_the_aggregate() {
        let lease = Uuid::from_u128(9);
        let tenant = Uuid::from_u128(3);
        let charge = EventData::ChargeAccrued(ChargeAccrued {
            charge_id: Uuid::from_u128(1),
            tenant_id: tenant,
            lease_id: lease,
            period: "2026-12".into(),
            tier: Tier::Basic,
            gpus: 1,
            vram_gb: 80,
            from: Utc::now(),
            to: Utc::now(),
            billed_seconds: 1,
            unit_price_cny_per_gb_hour: 1.into(),
            amount: 1.into(),
            currency: "CNY".into(),
            price_book_version: 1,
            age_seconds: None,
            priced_gb_seconds: None,
            reservation_id: None,
        });
        // A charge is written on its own subject, not the lease's: guarded
        // lease writers must not count it.
        assert_eq!(charge.aggregate_subject(), subject::charge(lease));
        assert_eq!(charge.lease_id(), None);
        assert_eq!(charge.tenant_id(), Some(tenant));
        let spot = EventData::SpotPriceSet(SpotPriceSet {
            zone: "cn-north.1".into(),
            gpu_model: "A100 40GB".into(),
            price_cny_per_gb_hour: 1.into(),
            utilisation: 0.into(),
            gpus_total: 1,
            gpus_used: 0,
        });
        assert_eq!(spot.aggregate_subject(), "lh.evt.spot.cn-north_1.A100_40GB");
        assert_eq!(spot.tenant_id(), None);
        let node = EventData::NodeUncordoned(NodeUncordoned {
            node_id: "gpu.7".into(),
        });
        assert_eq!(node.aggregate_subject(), "lh.evt.node.gpu_7");
        assert_eq!(node.lease_id(), None);
    }

    #[test]
    fn a_suspension_carries_its_reason_sealed_and_never_in_clear() {
        let suspended = EventData::TenantSuspended(TenantSuspended {
            tenant_id: Uuid::from_u128(4),
            reason_sealed: "c2VhbGVk".into(),
            stop_leases: false,
        });
        let json = serde_json::to_value(&suspended).unwrap();
        assert_eq!(json["reason_sealed"], "c2VhbGVk");
        assert!(json.get("reason").is_none(), "{json}");
        assert_eq!(
            serde_json::from_value::<EventData>(json).unwrap(),
            suspended
        );
        // A clear reason is no suspension the platform ever wrote.
        let clear = r#"{"type":"tenant.suspended","tenant_id":"00000000-0000-0000-0000-000000000004","reason":"unpaid","stop_leases":true}"#;
        assert!(serde_json::from_str::<EventData>(clear).is_err());
    }
}
