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
use lh_events::{fixtures, subject::Publisher, EventData};
use reqwest::Method;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::{chaos, read_log, Stack};

mod repertoire;

pub use repertoire::forged_reports;
use repertoire::{as_node, as_service, over_http, Tried};

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

/// The refusals of heartbeats that named another node, as the stack's
/// metrics recorder has them.
async fn heartbeats_refused(stack: &Stack) -> u64 {
    stack
        .metrics_text()
        .await
        .lines()
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
