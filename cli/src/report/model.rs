//! What a day's report is drawn from, and how the log's events become it.
//!
//! [`DayInput`] is plain data (GPUs, lease runs per GPU, hourly usage,
//! waits, interruptions); [`DayInput::from_events`] folds the lease and node
//! events read from the log into it, and [`DayInput::add_usage`] adds the
//! usage API's hourly points. Neither reads anything itself: the fetch
//! layer hands them what it read.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration, NaiveDate, TimeZone as _, Utc};
use lh_events::{EndReason, Envelope, EventData, Tier};
use lh_rpc::http::usage::UsageReport;
use uuid::Uuid;

/// Hours in a report's day (UTC, which has no daylight saving).
pub const HOURS_PER_DAY: u32 = 24;
/// Seconds in one hour of the heat map.
pub const SECS_PER_HOUR: i64 = 3600;
/// Minutes in one hour of the heat map.
pub const MINUTES_PER_HOUR: u32 = 60;

/// One GPU of the inventory.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub node_id: String,
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub zone: String,
    pub memory_mib: u64,
}

/// How a run on its GPUs came to an end within the day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// Still running at the day's end.
    Open,
    /// The lease ended (stopped, completed, failed, cancelled).
    Ended,
    /// A spot lease evicted after its notice (`lease.ended`, `preempted`).
    Preempted,
    /// Moved off its GPUs because they failed (a lost node, an unhealthy
    /// GPU): a failover, which interrupts the lease.
    FailedOver,
    /// Moved off its GPUs by a drain: planned, no interruption.
    Moved,
    /// Suspended by the tenant's idle policy.
    Suspended,
}

/// One stretch of a lease running on the same GPUs, cut to the day.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRun {
    pub lease_id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub tier: Option<Tier>,
    pub node_id: String,
    pub gpu_indices: Vec<u32>,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub ended_by: RunEnd,
}

/// What one lease used of one GPU in one hour of the day, from the usage API.
#[derive(Debug, Clone, PartialEq)]
pub struct HourUsage {
    pub lease_id: Option<Uuid>,
    pub tenant_id: Option<Uuid>,
    pub node_id: String,
    pub gpu_index: u32,
    /// 0 to 23.
    pub hour: u32,
    pub memory_used_mib_avg: f64,
    /// Minutes of the hour that had samples (the average is over them).
    pub minutes: u32,
    pub utilization_pct_avg: Option<f64>,
}

/// A lease requested during the day and when it first ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Wait {
    pub lease_id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub requested_at: DateTime<Utc>,
    /// `None`: it had not started by the day's end (or never will).
    pub first_running_at: Option<DateTime<Utc>>,
    /// Rejected or ended before it ever ran: not waiting for anything.
    pub withdrawn: bool,
}

/// Time a lease that should have been running was not, through the
/// platform's fault, cut to the day.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Interruption {
    pub lease_id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub reason: String,
}

/// Everything a day's report is computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct DayInput {
    pub date: NaiveDate,
    /// Only this tenant's leases and usage (every GPU still shows).
    pub tenant: Option<Uuid>,
    /// Until when the day is known: its end, or for today the time it was
    /// read. Runs and interruptions still open end here.
    pub as_of: DateTime<Utc>,
    pub gpus: Vec<Gpu>,
    pub runs: Vec<LeaseRun>,
    pub usage: Vec<HourUsage>,
    pub waits: Vec<Wait>,
    pub interruptions: Vec<Interruption>,
}

/// The day's first instant, 00:00 UTC.
pub fn day_start(date: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&date.and_hms_opt(0, 0, 0).expect("midnight exists"))
}

/// The next day's first instant.
pub fn day_end(date: NaiveDate) -> DateTime<Utc> {
    day_start(date) + Duration::days(1)
}

/// One stored event, as the audit trail answers it: its sequence orders it.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedEvent {
    pub sequence: u64,
    pub envelope: Envelope,
}

#[derive(Debug, Default)]
struct LeaseFold {
    tenant_id: Option<Uuid>,
    tier: Option<Tier>,
    requested_at: Option<DateTime<Utc>>,
    placement: Option<(String, Vec<u32>)>,
    running: Option<(DateTime<Utc>, String, Vec<u32>)>,
    first_started: Option<DateTime<Utc>>,
    interrupted: Option<(DateTime<Utc>, String)>,
    ended: bool,
    rejected: bool,
}

struct Fold {
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    leases: HashMap<Uuid, LeaseFold>,
    inventory: BTreeMap<(String, u32), Gpu>,
    runs: Vec<LeaseRun>,
    interruptions: Vec<Interruption>,
}

impl Fold {
    /// Keeps the part of [start, end) inside the day, if any.
    fn clip(
        &self,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        let (s, e) = (start.max(self.from), end.min(self.to));
        (s < e).then_some((s, e))
    }

    fn close_run(&mut self, lease_id: Uuid, at: DateTime<Utc>, how: RunEnd) {
        let Some(lease) = self.leases.get_mut(&lease_id) else {
            return;
        };
        let Some((start, node_id, gpus)) = lease.running.take() else {
            return;
        };
        let (tenant_id, tier) = (lease.tenant_id, lease.tier);
        if let Some((start, end)) = self.clip(start, at) {
            self.runs.push(LeaseRun {
                lease_id,
                tenant_id,
                tier,
                node_id,
                gpu_indices: gpus,
                start,
                end,
                ended_by: if how == RunEnd::Open || at >= self.to {
                    RunEnd::Open
                } else {
                    how
                },
            });
        }
    }

    fn close_interruption(&mut self, lease_id: Uuid, at: DateTime<Utc>) {
        let Some(lease) = self.leases.get_mut(&lease_id) else {
            return;
        };
        let Some((since, reason)) = lease.interrupted.take() else {
            return;
        };
        let tenant_id = lease.tenant_id;
        if let Some((from, to)) = self.clip(since, at) {
            self.interruptions.push(Interruption {
                lease_id,
                tenant_id,
                from,
                to,
                reason,
            });
        }
    }

    fn event(&mut self, envelope: &Envelope) {
        if envelope.occurred_at >= self.to {
            return;
        }
        let lease_id = envelope.data.lease_id();
        if let Some(id) = lease_id {
            let lease = self.leases.entry(id).or_default();
            if lease.tenant_id.is_none() {
                lease.tenant_id = envelope.tenant_id;
            }
        }
        match &envelope.data {
            EventData::NodeRegistered(node) => {
                self.inventory.retain(|(n, _), _| n != &node.node_id);
                for gpu in &node.gpus {
                    self.inventory.insert(
                        (node.node_id.clone(), gpu.index),
                        Gpu {
                            node_id: node.node_id.clone(),
                            index: gpu.index,
                            uuid: gpu.uuid.clone(),
                            model: gpu.model.clone(),
                            zone: node.zone.clone(),
                            memory_mib: u64::from(gpu.vram_gb) * 1024,
                        },
                    );
                }
            }
            // A node or lease whose first events expired is known from its
            // restatement; one already known takes nothing from it.
            EventData::NodeRestated(restated)
                if !self.inventory.keys().any(|(n, _)| n == &restated.node_id) =>
            {
                for stated in &restated.history {
                    self.event(&stated.envelope);
                }
            }
            EventData::LeaseRestated(restated) => {
                let known = self
                    .leases
                    .get(&restated.lease_id)
                    .is_some_and(|l| l.requested_at.is_some() || l.placement.is_some());
                if !known {
                    for stated in &restated.history {
                        self.event(&stated.envelope);
                    }
                }
            }
            EventData::LeaseRequested(r) => {
                let lease = self.leases.entry(r.lease_id).or_default();
                lease.tenant_id = Some(r.tenant_id);
                lease.tier = Some(r.tier);
                lease.requested_at.get_or_insert(envelope.occurred_at);
            }
            EventData::LeaseRejected(r) => {
                self.leases.entry(r.lease_id).or_default().rejected = true;
            }
            EventData::LeasePlaced(p) => {
                self.leases.entry(p.lease_id).or_default().placement =
                    Some((p.node_id.clone(), p.gpus.iter().map(|g| g.index).collect()));
            }
            EventData::LeaseStarted(s) => {
                // A start without an end of the run before it (a replayed
                // start) closes that run where the new one begins.
                self.close_run(s.lease_id, s.started_at, RunEnd::Moved);
                self.close_interruption(s.lease_id, s.started_at);
                let lease = self.leases.entry(s.lease_id).or_default();
                let gpus = match &lease.placement {
                    Some((node, gpus)) if node == &s.node_id => gpus.clone(),
                    _ => Vec::new(),
                };
                lease.running = Some((s.started_at, s.node_id.clone(), gpus));
                lease.first_started.get_or_insert(s.started_at);
            }
            EventData::LeaseMigrated(m) => {
                let failure = lh_domain::moves::is_failure(&m.reason);
                let how = if failure {
                    RunEnd::FailedOver
                } else {
                    RunEnd::Moved
                };
                self.close_run(m.lease_id, m.billing_ends_at, how);
                let lease = self.leases.entry(m.lease_id).or_default();
                if failure && lease.first_started.is_some() && lease.interrupted.is_none() {
                    lease.interrupted = Some((m.billing_ends_at, m.reason.clone()));
                }
                lease.placement = m.to.as_ref().map(|to| {
                    (
                        to.node_id.clone(),
                        to.gpus.iter().map(|g| g.index).collect(),
                    )
                });
            }
            EventData::LeaseSuspended(s) => {
                self.close_run(s.lease_id, s.suspended_at, RunEnd::Suspended);
                self.close_interruption(s.lease_id, s.suspended_at);
                self.leases.entry(s.lease_id).or_default().placement = None;
            }
            EventData::LeaseEnded(e) => {
                let how = if e.reason == EndReason::Preempted {
                    RunEnd::Preempted
                } else {
                    RunEnd::Ended
                };
                self.close_run(e.lease_id, e.ended_at, how);
                self.close_interruption(e.lease_id, e.ended_at);
                self.leases.entry(e.lease_id).or_default().ended = true;
            }
            _ => {}
        }
    }
}

impl DayInput {
    /// Folds the log's events (any order; they are put in log order) into
    /// the day's inventory, runs, waits and interruptions. `events` should
    /// hold the registrations up to the day's end and the lease events from
    /// a look-back before the day to its end; events at or after the day's
    /// end are ignored.
    pub fn from_events(
        date: NaiveDate,
        tenant: Option<Uuid>,
        events: Vec<LoggedEvent>,
    ) -> DayInput {
        Self::from_events_as_of(date, tenant, day_end(date), events)
    }

    /// [`DayInput::from_events`] for a day not over yet: what is still open
    /// at `as_of` ends there (cut to the day).
    pub fn from_events_as_of(
        date: NaiveDate,
        tenant: Option<Uuid>,
        as_of: DateTime<Utc>,
        mut events: Vec<LoggedEvent>,
    ) -> DayInput {
        let as_of = as_of.clamp(day_start(date), day_end(date));
        events.sort_by_key(|e| e.sequence);
        let mut fold = Fold {
            from: day_start(date),
            to: day_end(date),
            leases: HashMap::new(),
            inventory: BTreeMap::new(),
            runs: Vec::new(),
            interruptions: Vec::new(),
        };
        for e in &events {
            fold.event(&e.envelope);
        }
        let ids: Vec<Uuid> = fold.leases.keys().copied().collect();
        for id in ids {
            fold.close_run(id, as_of, RunEnd::Open);
            fold.close_interruption(id, as_of);
        }
        let (from, to) = (fold.from, fold.to);
        let mut waits: Vec<Wait> = fold
            .leases
            .iter()
            .filter_map(|(id, l)| {
                let at = l.requested_at?;
                (from <= at && at < to).then(|| Wait {
                    lease_id: *id,
                    tenant_id: l.tenant_id,
                    requested_at: at,
                    first_running_at: l.first_started.filter(|s| *s < to),
                    withdrawn: l.first_started.is_none() && (l.rejected || l.ended),
                })
            })
            .collect();
        waits.sort_by_key(|w| (w.requested_at, w.lease_id));
        let mut runs = fold.runs;
        runs.sort_by(|a, b| {
            (&a.node_id, a.start, a.lease_id).cmp(&(&b.node_id, b.start, b.lease_id))
        });
        let mut interruptions = fold.interruptions;
        interruptions.sort_by_key(|i| (i.from, i.lease_id));
        let mut input = DayInput {
            date,
            tenant,
            as_of,
            gpus: fold.inventory.into_values().collect(),
            runs,
            usage: Vec::new(),
            waits,
            interruptions,
        };
        if let Some(t) = tenant {
            input.runs.retain(|r| r.tenant_id == Some(t));
            input.waits.retain(|w| w.tenant_id == Some(t));
            input.interruptions.retain(|i| i.tenant_id == Some(t));
        }
        input
    }

    /// Adds the usage API's answer (`GET /v1/usage`, `step=3600`): each point
    /// of the day becomes one [`HourUsage`]. Returns how many points were
    /// outside the day or not on an hour (ignored).
    pub fn add_usage(&mut self, answer: &UsageReport) -> usize {
        let from = day_start(self.date);
        let mut ignored = 0;
        for s in &answer.series {
            let (lease_id, tenant_id) = (Some(s.lease_id), s.tenant_id);
            if self.tenant.is_some() && tenant_id != self.tenant {
                continue;
            }
            for p in &s.points {
                let secs = (p.at - from).num_seconds();
                if !(0..i64::from(HOURS_PER_DAY) * SECS_PER_HOUR).contains(&secs)
                    || secs % SECS_PER_HOUR != 0
                {
                    ignored += 1;
                    continue;
                }
                self.usage.push(HourUsage {
                    lease_id,
                    tenant_id,
                    node_id: s.node_id.clone(),
                    gpu_index: s.gpu_index,
                    hour: (secs / SECS_PER_HOUR) as u32,
                    memory_used_mib_avg: p.memory_used_mib_avg,
                    minutes: p.minutes.min(MINUTES_PER_HOUR),
                    utilization_pct_avg: p.utilization_pct_avg,
                });
            }
        }
        ignored
    }
}
