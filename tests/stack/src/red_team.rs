//! The red-team harness, beside the chaos harness: against a running
//! platform, every principal (each node, each service, a tenant, the
//! auditor, a stranger) tries what its credentials let it send, aimed at
//! what it does not hold: foreign ids, extreme and reversed times, types
//! it does not own, subjects it does not speak for, junk, oversized
//! payloads and floods. Then the invariants are checked from the log, the
//! audit copy, the views and the services:
//!
//! * `obeyed`: an attempt some reader took as valid (an event the audit
//!   copy holds without a skip reason, or that the authority rule admits
//!   on a re-read of the log; an HTTP call answered 2xx; a heartbeat for
//!   another node not refused), or a victim lease whose view changed;
//! * `overcommitted`: a GPU given to two leases at once, from the log;
//! * `misbilled`: charges that are not one per run, that run past the
//!   time they were stored, or that bill more than the lease ran;
//! * `dead`: a service stopped or not ready, or the process's memory grown
//!   past [`MAX_RSS_GROWTH_BYTES`].
//!
//! What each principal's NATS credentials allow is what the server
//! enforces (`lh_bus::auth`, tested against a real server in
//! `libs/bus/tests/nats_permissions.rs`); the harness sends what a
//! credential lets through to the readers and more, so that the readers
//! are proven to refuse it on their own.

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::{Bus, Expect};
use lh_events::{
    fixtures, subject, subject::Publisher, telemetry::Heartbeat, Actor, EndReason, Envelope,
    EventData, IdleAction, LeaseGpuFault, LeaseIdleDetected, LeaseStopRequested, LeaseSuspended,
    NodeLost, TenantSuspended,
};
use reqwest::Method;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::{chaos, read_log, Stack, AUDITOR_TOKEN};

/// How much the harness process (the whole stack runs in it) may grow
/// while attacked.
pub const MAX_RSS_GROWTH_BYTES: u64 = 512 * 1024 * 1024;
/// A payload over the log's message cap (1 MiB).
const OVERSIZED_BYTES: usize = 2 * 1024 * 1024;
/// How long the checks wait for the readers to catch up.
const PATIENCE: Duration = Duration::from_secs(60);

/// What the harness counted. Everything but `principals` and `attempts`
/// must be zero.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub principals: usize,
    pub attempts: usize,
    pub obeyed: usize,
    pub overcommitted: usize,
    pub misbilled: usize,
    pub dead: usize,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.obeyed == 0 && self.overcommitted == 0 && self.misbilled == 0 && self.dead == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "red-team: principals={} attempts={} obeyed={} overcommitted={} misbilled={} dead={}",
            self.principals,
            self.attempts,
            self.obeyed,
            self.overcommitted,
            self.misbilled,
            self.dead
        )
    }
}

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

/// A victim lease as its tenant sees it: what no attacker may move.
#[derive(Debug, Clone, PartialEq)]
struct Held {
    id: String,
    node_id: String,
    fields: Value,
}

async fn held(stack: &Stack, key: &str, id: &str) -> Held {
    let (status, view) = stack
        .call(Method::GET, &format!("/v1/leases/{id}"), key, None)
        .await;
    assert_eq!(status, 200, "{view}");
    Held {
        id: id.to_string(),
        node_id: view["node_id"].as_str().unwrap_or_default().to_string(),
        fields: json!({
            "state": view["state"],
            "node_id": view["node_id"],
            "gpu_indices": view["gpu_indices"],
            "started_at": view["started_at"],
            "ended_at": view["ended_at"],
            "stop_requested": view["stop_requested"],
            "suspended_at": view["suspended_at"],
            "migrations": view["migrations"],
            "failure": view["failure"],
        }),
    }
}

/// Everything the principals tried, as far as the checks need it.
#[derive(Default)]
struct Tried {
    attempts: usize,
    /// Stored events and what each was.
    stored: Vec<(u64, String)>,
    /// Obeyed calls and heartbeats, described.
    obeyed: Vec<String>,
    heartbeats_for_others: u64,
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
async fn as_node(
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
async fn as_service(tried: &mut Tried, bus: &Bus, service: &str, victims: &[Held]) {
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
async fn over_http(
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

/// The refusals of heartbeats that named another node, as the stack's
/// metrics recorder has them.
async fn heartbeats_refused(stack: &Stack) -> u64 {
    let Ok(metrics) = stack
        .http
        .get(format!("http://{}/metrics", stack.metrics_addr("gateway")))
        .send()
        .await
    else {
        return 0;
    };
    let text = metrics.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("lh_heartbeats_refused_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// Which of `sequences` the audit copy holds without a skip reason, once
/// it holds them all.
async fn taken_by_the_audit_copy(stack: &Stack, sequences: &[u64]) -> BTreeSet<u64> {
    let pool = sqlx::PgPool::connect(&stack.database_url_for("audit"))
        .await
        .expect("the audit database");
    let wanted: Vec<i64> = sequences.iter().map(|s| *s as i64).collect();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let rows: Vec<(i64, Option<String>)> = sqlx::query_as(
            "SELECT sequence, skip_reason FROM audit.events WHERE sequence = ANY($1)",
        )
        .bind(&wanted)
        .fetch_all(&pool)
        .await
        .expect("the audit copy reads");
        if rows.len() == wanted.len() || tokio::time::Instant::now() > deadline {
            let mut taken: BTreeSet<u64> = rows
                .iter()
                .filter(|(_, skip)| skip.is_none())
                .map(|(s, _)| *s as u64)
                .collect();
            // Never copied counts as taken: the copy must say why not.
            let copied: HashSet<u64> = rows.iter().map(|(s, _)| *s as u64).collect();
            taken.extend(sequences.iter().filter(|s| !copied.contains(s)));
            return taken;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the repertoires `rounds` times against `stack`, whose fleet has
/// `nodes` (each with a free GPU for a victim lease), then checks.
/// Returns the counts and a line for each thing found.
pub async fn run(stack: &Stack, nodes: &[&str], rounds: usize) -> (Report, Vec<String>) {
    let rss_before = rss_bytes();
    let (victim_tenant, victim_key) = stack
        .create_tenant("red-team-victim", nodes.len() as u32)
        .await;
    let victim_tenant: Uuid = victim_tenant.parse().expect("a tenant id");
    let (_, tenant_key) = stack.create_tenant("red-team-tenant", 1).await;
    let body = json!({"gpus": 1, "gpu_model": fixtures::MODEL});
    let mut victims = Vec::new();
    for _ in nodes {
        let running = stack.running(&victim_key, body.clone()).await;
        let id = running["id"].as_str().expect("an id").to_string();
        victims.push(held(stack, &victim_key, &id).await);
    }
    let bus = stack.bus().await;
    let refused_before = heartbeats_refused(stack).await;
    let mut tried = Tried::default();
    for _ in 0..rounds {
        for node in nodes {
            let others: Vec<&str> = nodes.iter().copied().filter(|n| n != node).collect();
            as_node(&mut tried, &bus, node, &others, &victims, victim_tenant).await;
        }
        for service in Publisher::SERVICES {
            let name = service.service_name().expect("a service");
            as_service(&mut tried, &bus, name, &victims).await;
        }
        over_http(&mut tried, stack, &tenant_key, &victims, victim_tenant, 20).await;
    }
    let principals = nodes.len() + Publisher::SERVICES.len() + 3;

    let mut found = std::mem::take(&mut tried.obeyed);
    // Every stored attempt: refused by the audit copy, and by the rule on
    // a re-read of the log.
    let sequences: Vec<u64> = tried.stored.iter().map(|(s, _)| *s).collect();
    let copied_as_taken = taken_by_the_audit_copy(stack, &sequences).await;
    let log = read_log(&bus).await;
    let admitted: HashSet<u64> = log.iter().map(|s| s.sequence).collect();
    for (sequence, what) in &tried.stored {
        if copied_as_taken.contains(sequence) || admitted.contains(sequence) {
            found.push(format!("obeyed at sequence {sequence}: {what}"));
        }
    }
    // Heartbeats for another node: each refused.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let refused = heartbeats_refused(stack)
            .await
            .saturating_sub(refused_before);
        if refused >= tried.heartbeats_for_others {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            found.push(format!(
                "{} of {} heartbeats for another node were not refused",
                tried.heartbeats_for_others - refused,
                tried.heartbeats_for_others
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The victims are as they were.
    for victim in &victims {
        let now = held(stack, &victim_key, &victim.id).await;
        if now != *victim {
            found.push(format!(
                "lease {} moved: {} -> {}",
                victim.id, victim.fields, now.fields
            ));
        }
    }
    let obeyed = found.len();
    let overcommitted = chaos::check_log(&log, &[]).overcommitted;

    // Their tenant stops them: each is billed its real run, once.
    for victim in &victims {
        let (status, answer) = stack
            .call(
                Method::POST,
                &format!("/v1/leases/{}/stop", victim.id),
                &victim_key,
                None,
            )
            .await;
        if status != 202 {
            // Already ended by someone: the view check above counted it.
            found.push(format!(
                "lease {} could not be stopped: {status} {answer}",
                victim.id
            ));
        }
    }
    let mut ran = Vec::new();
    for victim in &victims {
        let ended = stack
            .wait_lease(&victim_key, &victim.id, |l| l["state"] == "ended")
            .await;
        let at = |field: &str| {
            ended[field]
                .as_str()
                .and_then(|t| t.parse::<DateTime<Utc>>().ok())
        };
        ran.push((
            victim.id.parse::<Uuid>().expect("an id"),
            at("started_at"),
            at("ended_at"),
        ));
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let log = loop {
        let log = read_log(&bus).await;
        if chaos::unbilled(&log) == 0 || tokio::time::Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut misbilled = chaos::charge_mismatches(&log).len();
    for stored in &log {
        if let EventData::ChargeAccrued(charge) = &stored.envelope.data {
            // The clock rule: nothing billed past the moment it was stored.
            if charge.to > stored.stored_at + chrono::Duration::seconds(5)
                || charge.to < charge.from
            {
                found.push(format!(
                    "charge {} runs {}..{} (stored {})",
                    charge.charge_id, charge.from, charge.to, stored.stored_at
                ));
                misbilled += 1;
            }
        }
    }
    for (lease, started, ended) in &ran {
        let billed: u64 = log
            .iter()
            .filter_map(|s| match &s.envelope.data {
                EventData::ChargeAccrued(c) if c.lease_id == *lease => Some(c.billed_seconds),
                _ => None,
            })
            .sum();
        let real = match (started, ended) {
            (Some(s), Some(e)) => (*e - *s).num_seconds().max(0) as u64 + 1,
            _ => 0,
        };
        if billed > real {
            found.push(format!("lease {lease} billed {billed} s of a {real} s run"));
            misbilled += 1;
        }
    }

    let mut dead = stack.exited_services().len();
    for name in stack.service_names() {
        let ready = stack
            .http
            .get(format!("http://{}/readyz", stack.metrics_addr(&name)))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if !ready {
            found.push(format!("{name} is not ready"));
            dead += 1;
        }
    }
    let grown = rss_bytes().saturating_sub(rss_before);
    if grown > MAX_RSS_GROWTH_BYTES {
        found.push(format!("memory grew by {grown} bytes"));
        dead += 1;
    }
    (
        Report {
            principals,
            attempts: tried.attempts,
            obeyed,
            overcommitted,
            misbilled,
            dead,
        },
        found,
    )
}
