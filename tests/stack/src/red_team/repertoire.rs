//! What each principal tries: a node's forged reports and registrations,
//! a service's events it does not own, HTTP calls with foreign ids, junk,
//! oversized payloads and floods. Each attempt is recorded in [`Tried`]
//! for the checks of [`super::run`].

use chrono::{DateTime, Utc};
use lh_bus::{Bus, Expect};
use lh_events::{
    fixtures, subject, telemetry::Heartbeat, Actor, EndReason, Envelope, EventData, IdleAction,
    LeaseGpuFault, LeaseIdleDetected, LeaseMemberCompleted, LeaseStopRequested, LeaseSuspended,
    NodeLost, TenantSuspended,
};
use reqwest::Method;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{Held, OVERSIZED_BYTES};
use crate::{Stack, AUDITOR_TOKEN};

/// The reports a compromised node `attacker` sends about `lease`, placed
/// on `victim_node`, each on the attacker's own subject: with itself
/// named in the payload, with the lease's node named, with none, a
/// century ahead and long before the lease began.
pub fn forged_reports(lease: Uuid, attacker: &str, victim_node: &str) -> Vec<Envelope> {
    let now = Utc::now();
    let as_attacker = |data| Envelope::new(Actor::Node(attacker.into()), now, data);
    let mut events = Vec::new();
    for named in [attacker, victim_node] {
        events.push(as_attacker(EventData::LeaseEnded(fixtures::ended(
            lease,
            named,
            now - chrono::Duration::days(400),
            EndReason::Completed,
        ))));
        events.push(as_attacker(EventData::LeaseSuspended(LeaseSuspended {
            lease_id: lease,
            node_id: named.into(),
            gpu_indices: vec![0],
            suspended_at: now,
            reason: "forged".into(),
        })));
        events.push(as_attacker(EventData::LeaseStarted(fixtures::started(
            lease, named, now,
        ))));
        events.push(as_attacker(EventData::LeaseIdleDetected(
            LeaseIdleDetected {
                lease_id: lease,
                node_id: named.into(),
                idle_since: now,
                window_seconds: 60,
                action: IdleAction::Suspend,
                at: now,
            },
        )));
        events.push(as_attacker(EventData::LeaseGpuFault(LeaseGpuFault {
            lease_id: lease,
            node_id: named.into(),
            gpu_index: 0,
            xid: 43,
            at: now,
        })));
        events.push(as_attacker(EventData::LeaseMemberCompleted(
            LeaseMemberCompleted {
                lease_id: lease,
                node_id: named.into(),
            },
        )));
    }
    let mut century = fixtures::ended(
        lease,
        attacker,
        now + chrono::Duration::days(36_500),
        EndReason::Cancelled,
    );
    century.node_id = None;
    events.push(as_attacker(EventData::LeaseEnded(century)));
    events.push(as_attacker(EventData::LeaseStopRequested(
        LeaseStopRequested { lease_id: lease },
    )));
    events
}

/// Everything the principals tried, as far as the checks need it.
#[derive(Default)]
pub(super) struct Tried {
    pub(super) attempts: usize,
    /// Stored events and what each was.
    pub(super) stored: Vec<(u64, String)>,
    /// Obeyed calls and heartbeats, described.
    pub(super) obeyed: Vec<String>,
    pub(super) heartbeats_for_others: u64,
}

impl Tried {
    async fn event(&mut self, bus: &Bus, what: &str, envelope: &Envelope) {
        self.attempts += 1;
        // A refusal by the server (no stream for a subject, a payload
        // over the cap) is a refusal: nothing reached a reader.
        if let Ok(appended) = bus.publish(envelope, Expect::Any).await {
            self.stored.push((appended.sequence, what.to_string()));
        }
    }

    async fn raw(&mut self, bus: &Bus, what: &str, subject: String, payload: Vec<u8>) {
        self.attempts += 1;
        let sent = bus.jetstream().publish(subject, payload.into()).await;
        if let Ok(ack) = sent {
            if let Ok(ack) = ack.await {
                self.stored.push((ack.sequence, what.to_string()));
            }
        }
    }

    async fn call(
        &mut self,
        stack: &Stack,
        who: &str,
        method: Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) {
        self.attempts += 1;
        let (status, answer) = stack.call(method.clone(), path, key, body).await;
        if (200..300).contains(&status) {
            self.obeyed.push(format!(
                "{who}: {method} {path} answered {status}: {answer}"
            ));
        }
    }
}

/// A compromised node's repertoire against the leases `victims` it does
/// not hold.
pub(super) async fn as_node(
    tried: &mut Tried,
    bus: &Bus,
    node: &str,
    others: &[&str],
    victims: &[Held],
    victim_tenant: Uuid,
) {
    let now = Utc::now();
    let me = || Actor::Node(node.into());
    for victim in victims.iter().filter(|v| v.node_id != node) {
        let lease: Uuid = victim.id.parse().expect("a lease id");
        for envelope in forged_reports(lease, node, &victim.node_id) {
            let what = format!(
                "{node}: {} on {}'s lease",
                envelope.event_type, victim.node_id
            );
            tried.event(bus, &what, &envelope).await;
        }
        // Reversed and extreme times, naming itself.
        for at in [
            DateTime::<Utc>::UNIX_EPOCH,
            now + chrono::Duration::days(365 * 200),
        ] {
            let started = Envelope::new(
                me(),
                now,
                EventData::LeaseStarted(fixtures::started(lease, node, at)),
            );
            tried
                .event(bus, &format!("{node}: lease.started at {at}"), &started)
                .await;
        }
        // What only the scheduler, the gateway or pricing may write.
        let placed = fixtures::placed(
            lease,
            node,
            "cn-north-1a",
            fixtures::MODEL,
            fixtures::MODEL_VRAM_GB,
            &[0],
        );
        for data in [
            EventData::LeasePlaced(placed.clone()),
            EventData::LeaseRequested(fixtures::whole_request(
                Uuid::now_v7(),
                victim_tenant,
                1,
                fixtures::MODEL,
            )),
            EventData::TenantSuspended(TenantSuspended {
                tenant_id: victim_tenant,
                reason_sealed: String::new(),
                stop_leases: true,
            }),
        ] {
            let envelope = Envelope::new(me(), now, data);
            tried
                .event(
                    bus,
                    &format!("{node}: {} it does not own", envelope.event_type),
                    &envelope,
                )
                .await;
        }
        // A service's event on the node's own subject.
        let as_scheduler = Envelope::new(
            Actor::Service("scheduler".into()),
            now,
            EventData::LeasePlaced(placed),
        );
        let on_own_subject = subject::event(&subject::lease(lease), "lease.placed", &me());
        tried
            .raw(
                bus,
                &format!("{node}: the scheduler's lease.placed on its own subject"),
                on_own_subject,
                as_scheduler.to_json(),
            )
            .await;
        // Junk, an unknown type and an oversized payload.
        let ended_subject = subject::event(&subject::lease(lease), "lease.ended", &me());
        tried
            .raw(
                bus,
                &format!("{node}: junk"),
                ended_subject.clone(),
                b"{\"type\": \"lease.ended\", \"data\": [".to_vec(),
            )
            .await;
        let mut unknown =
            serde_json::from_slice::<Value>(&forged_reports(lease, node, node)[0].to_json())
                .expect("json");
        unknown["type"] = json!("lease.obliterated");
        unknown["data"]["type"] = json!("lease.obliterated");
        tried
            .raw(
                bus,
                &format!("{node}: an unknown type"),
                ended_subject.clone(),
                unknown.to_string().into_bytes(),
            )
            .await;
        let mut oversized = forged_reports(lease, node, node)[0].to_json();
        oversized.extend(std::iter::repeat_n(b' ', OVERSIZED_BYTES));
        tried
            .raw(
                bus,
                &format!("{node}: {OVERSIZED_BYTES} bytes"),
                ended_subject,
                oversized,
            )
            .await;
    }
    // Its registration beyond its enrollment, and one as another node.
    let bigger = fixtures::node(node, "elsewhere-1z", 64, "H100-80GB", 80);
    let envelope = Envelope::new(me(), now, EventData::NodeRegistered(bigger));
    tried
        .event(
            bus,
            &format!("{node}: node.registered beyond its enrollment"),
            &envelope,
        )
        .await;
    for other in others {
        let as_other = fixtures::node(
            other,
            "cn-north-1a",
            1,
            fixtures::MODEL,
            fixtures::MODEL_VRAM_GB,
        );
        let envelope = Envelope::new(me(), now, EventData::NodeRegistered(as_other));
        tried
            .event(
                bus,
                &format!("{node}: node.registered as {other}"),
                &envelope,
            )
            .await;
        let lost = Envelope::new(
            me(),
            now,
            EventData::NodeLost(NodeLost {
                node_id: other.to_string(),
                last_heard_at: now,
                silence_ms: 1,
            }),
        );
        tried
            .event(bus, &format!("{node}: node.lost of {other}"), &lost)
            .await;
        // Heartbeats for the other node, on its own subject.
        for _ in 0..5 {
            tried.attempts += 1;
            tried.heartbeats_for_others += 1;
            let beat = Heartbeat {
                node_id: other.to_string(),
                at: Utc::now(),
                running_leases: 0,
                gpus: Vec::new(),
            };
            let payload = serde_json::to_vec(&beat).expect("json");
            if bus
                .publish_telemetry(subject::heartbeat(node), payload)
                .await
                .is_err()
            {
                tried.heartbeats_for_others -= 1;
            }
        }
    }
}

/// A compromised service's repertoire: what only nodes write, about the
/// victims, and junk on its own subject.
pub(super) async fn as_service(tried: &mut Tried, bus: &Bus, service: &str, victims: &[Held]) {
    let now = Utc::now();
    let me = || Actor::Service(service.into());
    for victim in victims {
        let lease: Uuid = victim.id.parse().expect("a lease id");
        let node = victim.node_id.as_str();
        for data in [
            EventData::LeaseStarted(fixtures::started(lease, node, now)),
            EventData::LeaseSuspended(LeaseSuspended {
                lease_id: lease,
                node_id: node.into(),
                gpu_indices: vec![0],
                suspended_at: now,
                reason: "forged".into(),
            }),
            EventData::NodeRegistered(fixtures::node(
                "ghost-node",
                "cn-north-1a",
                8,
                fixtures::MODEL,
                fixtures::MODEL_VRAM_GB,
            )),
        ] {
            let envelope = Envelope::new(me(), now, data);
            tried
                .event(
                    bus,
                    &format!("{service}: {} it does not own", envelope.event_type),
                    &envelope,
                )
                .await;
        }
        let subject = subject::event(&subject::lease(lease), "lease.ended", &me());
        tried
            .raw(
                bus,
                &format!("{service}: junk"),
                subject,
                b"\x00\xff not an event".to_vec(),
            )
            .await;
    }
}

/// A tenant's repertoire against another tenant's leases and the
/// operators' routes; the auditor's and a stranger's against writes.
pub(super) async fn over_http(
    tried: &mut Tried,
    stack: &Stack,
    tenant_key: &str,
    victims: &[Held],
    victim_tenant: Uuid,
    flood: usize,
) {
    let stranger = "lh_not-a-key-at-all";
    for victim in victims {
        let id = &victim.id;
        for (method, path) in [
            (Method::GET, format!("/v1/leases/{id}")),
            (Method::POST, format!("/v1/leases/{id}/stop")),
            (Method::POST, format!("/v1/leases/{id}/resume")),
            (Method::GET, format!("/v1/leases/{id}/logs")),
            (Method::GET, format!("/v1/leases/{id}/usage")),
        ] {
            for (who, key) in [
                ("tenant", tenant_key),
                ("auditor", AUDITOR_TOKEN),
                ("stranger", stranger),
            ] {
                // The auditor reads leases (audit); it may not act on them.
                if who == "auditor" && method == Method::GET && !path.ends_with("/logs") {
                    continue;
                }
                tried
                    .call(stack, who, method.clone(), &path, key, None)
                    .await;
            }
        }
    }
    let lease_body = json!({"gpus": 1, "gpu_model": fixtures::MODEL});
    for (method, path, body) in [
        (
            Method::POST,
            "/v1/nodes/node-a/enroll".to_string(),
            Some(json!({"zone": "cn-north-1a", "gpus": {"A100-40GB": 64}})),
        ),
        (Method::POST, "/v1/nodes/node-a/drain".to_string(), None),
        (
            Method::POST,
            "/v1/tenants".to_string(),
            Some(json!({"name": "mallory", "max_gpus": 64})),
        ),
        (
            Method::POST,
            format!("/v1/tenants/{victim_tenant}/suspend"),
            Some(json!({"reason": "x"})),
        ),
        (
            Method::POST,
            format!("/v1/tenants/{victim_tenant}/erase"),
            None,
        ),
        (
            Method::POST,
            format!("/v1/tenants/{victim_tenant}/keys"),
            Some(json!({})),
        ),
        (Method::GET, format!("/v1/tenants/{victim_tenant}"), None),
        (
            Method::PUT,
            format!("/v1/tenants/{victim_tenant}/quota"),
            Some(json!({"max_gpus": 0})),
        ),
    ] {
        for (who, key) in [
            ("tenant", tenant_key),
            ("auditor", AUDITOR_TOKEN),
            ("stranger", stranger),
        ] {
            if who == "auditor" && method == Method::GET {
                continue;
            }
            tried
                .call(stack, who, method.clone(), &path, key, body.clone())
                .await;
        }
    }
    for (who, key) in [("auditor", AUDITOR_TOKEN), ("stranger", stranger)] {
        tried
            .call(
                stack,
                who,
                Method::POST,
                "/v1/leases",
                key,
                Some(lease_body.clone()),
            )
            .await;
    }
    // Oversized: refused before it is read.
    let huge = json!({"gpus": 1, "gpu_model": fixtures::MODEL, "workload": {"command": ["x".repeat(OVERSIZED_BYTES)]}});
    tried
        .call(
            stack,
            "tenant",
            Method::POST,
            "/v1/leases",
            tenant_key,
            Some(huge),
        )
        .await;
    // A flood of foreign reads.
    let victim = &victims[0].id;
    for _ in 0..flood {
        tried
            .call(
                stack,
                "tenant",
                Method::GET,
                &format!("/v1/leases/{victim}"),
                tenant_key,
                None,
            )
            .await;
    }
}
