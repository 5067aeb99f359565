//! The chaos harness's two halves, shared by its short run in the test
//! suite and its long run against `make up`: lease traffic from a client
//! that retries as a careful tenant would, and the checks made afterwards
//! from the log alone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use lh_bus::Stored;
use lh_events::{AssignedGpu, EventData};
use lh_service::CancellationToken;
use serde_json::{json, Value};
use uuid::Uuid;

/// What the harness counted. Everything but `kills` and `accepted` must be
/// zero.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub kills: usize,
    pub accepted: usize,
    /// Leases that got a 202 but have no `lease.requested` in the log.
    pub lost: usize,
    /// Leases requested more than once in the log, or idempotency keys that
    /// named more than one lease.
    pub duplicated: usize,
    /// Placements that took more of a GPU than it has (VRAM, compute, MIG
    /// slices), at any sequence.
    pub overcommitted: usize,
    /// Ended leases whose charges are not one per run that lasted a moment
    /// (or charges for a lease that never ran), and invoice tables that
    /// differ from a rebuild.
    pub charge_mismatch: usize,
    /// Services stopped or not ready at the end, an audit verification
    /// that failed, and accepted leases that never ended although stopped.
    pub dead: usize,
}

impl Report {
    /// Takes the counts [`check_log`] made.
    pub fn add_checks(&mut self, checked: &Report) {
        self.accepted = checked.accepted;
        self.lost += checked.lost;
        self.duplicated += checked.duplicated;
        self.overcommitted += checked.overcommitted;
        self.charge_mismatch += checked.charge_mismatch;
    }

    pub fn is_clean(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.overcommitted == 0
            && self.charge_mismatch == 0
            && self.dead == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "chaos: kills={} accepted={} lost={} duplicated={} overcommitted={} charge_mismatch={} dead={}",
            self.kills,
            self.accepted,
            self.lost,
            self.duplicated,
            self.overcommitted,
            self.charge_mismatch,
            self.dead
        )
    }
}

/// The `n`th request of a client: whole GPUs, a share, a MIG instance or a
/// spot lease, in turn.
pub fn lease_body(n: usize) -> Value {
    match n % 4 {
        0 => json!({"gpus": 1, "gpu_model": "A100-40GB"}),
        1 => json!({"gpu_fraction": {"milli": 300, "vram_gb": 10}, "gpu_model": "A100-40GB"}),
        2 => json!({"mig_profile": "1g.10gb", "gpu_model": "H100-80GB"}),
        _ => json!({"gpus": 1, "gpu_model": "A100-40GB", "tier": "spot"}),
    }
}

/// Longest a client keeps retrying one call before it gives the call up.
const CALL_PATIENCE: Duration = Duration::from_secs(60);

/// Sends `body` until the gateway gives an answer that is not an outage
/// (a transport error, 429 or 5xx), with the same `Idempotency-Key` every
/// time. `None` when it never did within [`CALL_PATIENCE`].
pub async fn post_until_answered(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    idempotency_key: Option<&str>,
    body: Option<&Value>,
) -> Option<(u16, Value)> {
    let deadline = tokio::time::Instant::now() + CALL_PATIENCE;
    while tokio::time::Instant::now() < deadline {
        let mut request = http
            .post(url)
            .bearer_auth(key)
            .timeout(Duration::from_secs(10));
        if let Some(k) = idempotency_key {
            request = request.header("Idempotency-Key", k);
        }
        if let Some(b) = body {
            request = request.json(b);
        }
        if let Ok(response) = request.send().await {
            let status = response.status().as_u16();
            if status != 429 && status < 500 {
                let body = response.json().await.unwrap_or(Value::Null);
                return Some((status, body));
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// One tenant's traffic until `stop`: request a lease (keyed, retried),
/// let it run a little, stop it (retried). Returns the leases the gateway
/// accepted (202), each with the key it was asked under.
pub async fn client(
    http: reqwest::Client,
    gateway_url: String,
    key: String,
    name: String,
    stop: CancellationToken,
) -> Vec<(Uuid, String)> {
    let mut accepted = Vec::new();
    let mut n = 0;
    while !stop.is_cancelled() {
        let idempotency_key = format!("{name}-{n}");
        let body = lease_body(n);
        n += 1;
        let url = format!("{gateway_url}/v1/leases");
        let Some((status, lease)) =
            post_until_answered(&http, &url, &key, Some(&idempotency_key), Some(&body)).await
        else {
            continue;
        };
        if status != 202 {
            continue;
        }
        let Some(id) = lease["id"].as_str().and_then(|s| s.parse::<Uuid>().ok()) else {
            continue;
        };
        accepted.push((id, idempotency_key));
        tokio::time::sleep(Duration::from_millis(150 + 50 * (n as u64 % 5))).await;
        let stop_url = format!("{gateway_url}/v1/leases/{id}/stop");
        post_until_answered(&http, &stop_url, &key, None, None).await;
    }
    accepted
}

/// Waits, for at most `patience`, until every accepted lease has ended and
/// every run is charged, stopping the open ones again as `admin` (a stop
/// may have fallen into an outage). Returns the log then, and the leases
/// that never ended.
pub async fn settle(
    bus: &lh_bus::Bus,
    http: &reqwest::Client,
    gateway: &str,
    admin: &str,
    accepted: &[(Uuid, String)],
    patience: Duration,
) -> (Vec<Stored>, Vec<Uuid>) {
    let deadline = tokio::time::Instant::now() + patience;
    let mut log = crate::read_log(bus).await;
    while tokio::time::Instant::now() < deadline {
        let open = unfinished(&log, accepted);
        if open.is_empty() && unbilled(&log) == 0 {
            break;
        }
        for id in open {
            let url = format!("{gateway}/v1/leases/{id}/stop");
            let _ = http.post(url).bearer_auth(admin).send().await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        log = crate::read_log(bus).await;
    }
    let stuck = unfinished(&log, accepted);
    if !stuck.is_empty() {
        eprintln!("chaos: leases that never ended: {stuck:?}");
        // What the log holds of each, for whoever reads the failure.
        for id in &stuck {
            let story: Vec<String> = log
                .iter()
                .filter(|s| s.envelope.data.lease_id() == Some(*id))
                .map(|s| format!("{} {}", s.sequence, s.envelope.data.event_type()))
                .collect();
            eprintln!("chaos: {id}: {}", story.join(", "));
        }
    }
    (log, stuck)
}

/// Checks the log against what the clients were told: `lost`,
/// `duplicated`, `overcommitted` and `charge_mismatch` (charges per run).
pub fn check_log(log: &[Stored], accepted: &[(Uuid, String)]) -> Report {
    let mut report = Report {
        accepted: accepted.len(),
        ..Report::default()
    };
    let mut requested: HashMap<Uuid, usize> = HashMap::new();
    let mut by_key: HashMap<String, HashSet<Uuid>> = HashMap::new();
    let mut runs = Runs::default();
    let mut charges: HashMap<Uuid, usize> = HashMap::new();
    let mut ended: HashSet<Uuid> = HashSet::new();
    let mut capacity = Capacity::default();
    for stored in log {
        match &stored.envelope.data {
            EventData::LeaseRequested(e) => {
                *requested.entry(e.lease_id).or_default() += 1;
                if let Some(k) = &e.idempotency_key {
                    by_key
                        .entry(format!("{}/{k}", e.tenant_id))
                        .or_default()
                        .insert(e.lease_id);
                }
            }
            EventData::ChargeAccrued(e) => *charges.entry(e.lease_id).or_default() += 1,
            EventData::LeaseEnded(e) => {
                ended.insert(e.lease_id);
            }
            _ => {}
        }
        runs.apply(&stored.envelope.data);
        report.overcommitted += capacity.apply(&stored.envelope.data);
    }
    report.lost = accepted
        .iter()
        .filter(|(id, _)| !requested.contains_key(id))
        .count();
    report.duplicated = requested.values().filter(|&&n| n > 1).count()
        + by_key.values().filter(|ids| ids.len() > 1).count();
    let mismatched: Vec<&Uuid> = ended
        .iter()
        .filter(|id| charges.get(id).copied().unwrap_or(0) != runs.billable(id))
        .collect();
    // Which, so that a failure under load says where.
    for id in &mismatched {
        println!(
            "charges of lease {id}: {} on the log, {} owed",
            charges.get(*id).copied().unwrap_or(0),
            runs.billable(id)
        );
    }
    report.charge_mismatch = mismatched.len();
    report
}

/// The runs of each lease that last a moment or more, replayed from the
/// log: what pricing must charge. Pricing writes one line per lease and
/// UTC hour of billable time (ADR 014), however many runs fall in that
/// hour, so a lease owes a line for each hour its runs touch. A run starts at the
/// node's `lease.started` and ends at the lease's end, its suspension, or
/// its move away (billed until the old node was last heard, which may be
/// before the start was reported: then the run bills nothing).
#[derive(Default)]
struct Runs {
    open: HashMap<Uuid, chrono::DateTime<chrono::Utc>>,
    /// The UTC hours (seconds since the epoch / 3,600) with billable time.
    billable: HashMap<Uuid, HashSet<i64>>,
}

impl Runs {
    fn apply(&mut self, data: &EventData) {
        let (lease, end) = match data {
            EventData::LeaseStarted(e) => {
                self.open.entry(e.lease_id).or_insert(e.started_at);
                return;
            }
            EventData::LeaseMigrated(e) => (e.lease_id, e.billing_ends_at),
            EventData::LeaseSuspended(e) => (e.lease_id, e.suspended_at),
            EventData::LeaseEnded(e) => (e.lease_id, e.ended_at),
            _ => return,
        };
        if let Some(start) = self.open.remove(&lease) {
            if end > start {
                // The end is not billed, so a run ending on the hour
                // owes nothing to the hour it ends on.
                let first = start.timestamp().div_euclid(3_600);
                let last = (end - chrono::Duration::nanoseconds(1))
                    .timestamp()
                    .div_euclid(3_600);
                self.billable.entry(lease).or_default().extend(first..=last);
            }
        }
    }

    fn billable(&self, lease: &Uuid) -> usize {
        self.billable.get(lease).map_or(0, HashSet::len)
    }
}

/// What every GPU holds, replayed from the log; counts the placements that
/// take more than a GPU has.
#[derive(Default)]
struct Capacity {
    /// (node, GPU index) -> (model, VRAM GB, in MIG mode)
    gpus: HashMap<(String, u32), (String, u32, bool)>,
    /// lease -> what it holds
    holdings: HashMap<Uuid, Vec<(String, AssignedGpu)>>,
}

impl Capacity {
    fn apply(&mut self, data: &EventData) -> usize {
        match data {
            EventData::NodeRegistered(n) => {
                for g in &n.gpus {
                    self.gpus.insert(
                        (n.node_id.clone(), g.index),
                        (g.model.clone(), g.vram_gb, g.mig),
                    );
                }
                0
            }
            EventData::LeasePlaced(p) => self.hold(p.lease_id, &p.node_id, &p.gpus),
            EventData::LeaseMigrated(m) => {
                self.holdings.remove(&m.lease_id);
                match &m.to {
                    Some(to) => self.hold(m.lease_id, &to.node_id, &to.gpus),
                    None => 0,
                }
            }
            EventData::LeaseEnded(e) => {
                self.holdings.remove(&e.lease_id);
                0
            }
            EventData::LeaseSuspended(e) => {
                self.holdings.remove(&e.lease_id);
                0
            }
            _ => 0,
        }
    }

    fn hold(&mut self, lease: Uuid, node: &str, gpus: &[AssignedGpu]) -> usize {
        // Placed again without an end or a move in between: it holds two
        // places at once.
        let twice = usize::from(self.holdings.contains_key(&lease));
        self.holdings.insert(
            lease,
            gpus.iter().map(|g| (node.to_string(), g.clone())).collect(),
        );
        twice + gpus.iter().filter(|g| !self.fits(node, g.index)).count()
    }

    /// Whether everything held on one GPU fits it: a GPU the node
    /// registered, in the mode its holders need (MIG instances on a GPU in
    /// MIG mode, whole GPUs and shares on one that is not), within its
    /// VRAM, compute and MIG slices.
    fn fits(&self, node: &str, index: u32) -> bool {
        let Some((model, vram_gb, mig_mode)) = self.gpus.get(&(node.to_string(), index)) else {
            return false;
        };
        let on_gpu: Vec<&AssignedGpu> = self
            .holdings
            .values()
            .flatten()
            .filter(|(n, g)| n == node && g.index == index)
            .map(|(_, g)| g)
            .collect();
        let (mut milli, mut vram, mut whole) = (0u32, 0u32, 0usize);
        let (mut memory, mut compute) = (0u16, 0u16);
        let mut slices_overlap = false;
        for g in &on_gpu {
            if g.mig_instance.is_some() != *mig_mode {
                return false;
            }
            match (&g.mig_instance, g.milli) {
                (Some(m), _) => {
                    let profile = lh_domain::catalog::mig_geometry(model)
                        .ok()
                        .and_then(|geometry| geometry.profile(&m.profile));
                    let Some(p) = profile else {
                        return false;
                    };
                    let (mm, cm) = (p.memory_mask(m.start), p.compute_mask(m.start));
                    slices_overlap |= memory & mm != 0 || compute & cm != 0;
                    memory |= mm;
                    compute |= cm;
                }
                (None, Some(share)) => {
                    milli += share;
                    vram += g.vram_gb.unwrap_or(0);
                }
                (None, None) => whole += 1,
            }
        }
        let shared = on_gpu.len() > whole;
        !slices_overlap
            && milli <= 1000
            && vram <= *vram_gb
            && (whole == 0 || (whole == 1 && !shared))
    }
}

/// Leases of `accepted` that have not ended (nor been rejected) in `log`.
pub fn unfinished(log: &[Stored], accepted: &[(Uuid, String)]) -> Vec<Uuid> {
    let done: HashSet<Uuid> = log
        .iter()
        .filter_map(|s| match &s.envelope.data {
            EventData::LeaseEnded(e) => Some(e.lease_id),
            EventData::LeaseRejected(e) => Some(e.lease_id),
            _ => None,
        })
        .collect();
    accepted
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| !done.contains(id))
        .collect()
}

/// Each ended lease whose charges are not one per run: its events on the
/// log, oldest first, for a report.
pub fn charge_mismatches(log: &[Stored]) -> Vec<(Uuid, Vec<String>)> {
    let mut runs = Runs::default();
    let mut charges: HashMap<Uuid, usize> = HashMap::new();
    let mut ended: HashSet<Uuid> = HashSet::new();
    for s in log {
        match &s.envelope.data {
            EventData::ChargeAccrued(e) => *charges.entry(e.lease_id).or_default() += 1,
            EventData::LeaseEnded(e) => {
                ended.insert(e.lease_id);
            }
            _ => {}
        }
        runs.apply(&s.envelope.data);
    }
    let odd: HashSet<Uuid> = ended
        .into_iter()
        .filter(|id| runs.billable(id) != charges.get(id).copied().unwrap_or(0))
        .collect();
    let mut out: Vec<(Uuid, Vec<String>)> = odd.iter().map(|id| (*id, Vec::new())).collect();
    for s in log {
        let id = match &s.envelope.data {
            EventData::ChargeAccrued(c) => Some(c.lease_id),
            other => other.lease_id(),
        };
        if let Some((_, events)) = id.and_then(|id| out.iter_mut().find(|(l, _)| *l == id)) {
            let detail = match &s.envelope.data {
                EventData::LeaseStarted(e) => {
                    format!("{}@{}", e.node_id, e.started_at.format("%T%.3f"))
                }
                EventData::LeaseEnded(e) => {
                    format!("{:?}@{}", e.reason, e.ended_at.format("%T%.3f"))
                }
                EventData::LeaseMigrated(e) => format!(
                    "{}->{:?} ends {}",
                    e.from_node_id,
                    e.to.as_ref().map(|t| &t.node_id),
                    e.billing_ends_at.format("%T%.3f")
                ),
                EventData::ChargeAccrued(c) => format!(
                    "{}..{} {}s",
                    c.from.format("%T%.3f"),
                    c.to.format("%T%.3f"),
                    c.billed_seconds
                ),
                _ => String::new(),
            };
            events.push(format!(
                "{} {} {detail}",
                s.sequence,
                s.envelope.data.event_type()
            ));
        }
    }
    out
}

/// Ended leases whose charges are not all in `log` yet (one per run).
pub fn unbilled(log: &[Stored]) -> usize {
    check_log(log, &[]).charge_mismatch
}

/// Counts per event type, for the run's summary.
pub fn event_counts(log: &[Stored]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for s in log {
        *counts
            .entry(s.envelope.data.event_type().to_string())
            .or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::{fixtures, Actor, Envelope};

    fn stored(sequence: u64, data: EventData) -> Stored {
        let envelope = Envelope::new(Actor::Admin, chrono::Utc::now(), data);
        Stored {
            sequence,
            subject: envelope.subject(),
            payload: envelope.to_json().into(),
            envelope,
            pending: 0,
            stored_at: chrono::Utc::now(),
            trace_parent: None,
        }
    }

    #[test]
    fn a_gpu_given_twice_is_overcommitted_and_one_freed_first_is_not() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let placed = |id| fixtures::placed(id, "n", "z", fixtures::MODEL, 40, &[0]);
        let node = fixtures::node("n", "z", 1, fixtures::MODEL, 40);
        let twice = [
            stored(1, EventData::NodeRegistered(node.clone())),
            stored(2, EventData::LeasePlaced(placed(a))),
            stored(3, EventData::LeasePlaced(placed(b))),
        ];
        assert_eq!(check_log(&twice, &[]).overcommitted, 1);
        let freed = [
            stored(1, EventData::NodeRegistered(node)),
            stored(2, EventData::LeasePlaced(placed(a))),
            stored(
                3,
                EventData::LeaseEnded(fixtures::ended(
                    a,
                    "n",
                    chrono::Utc::now(),
                    lh_events::EndReason::Stopped,
                )),
            ),
            stored(4, EventData::LeasePlaced(placed(b))),
        ];
        assert_eq!(check_log(&freed, &[]).overcommitted, 0);
        // Placed twice with no end between; and on a GPU never registered.
        let again = [
            stored(
                1,
                EventData::NodeRegistered(fixtures::node("n", "z", 2, fixtures::MODEL, 40)),
            ),
            stored(2, EventData::LeasePlaced(placed(a))),
            stored(3, EventData::LeasePlaced(placed(a))),
            stored(
                4,
                EventData::LeasePlaced(fixtures::placed(b, "n", "z", fixtures::MODEL, 40, &[7])),
            ),
        ];
        assert_eq!(check_log(&again, &[]).overcommitted, 2);
    }

    #[test]
    fn an_accepted_lease_missing_from_the_log_is_lost() {
        let report = check_log(&[], &[(Uuid::from_u128(9), "k".into())]);
        assert_eq!((report.accepted, report.lost), (1, 1));
        assert!(!report.is_clean());
    }
}
