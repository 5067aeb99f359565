//! The day's numbers from a [`DayInput`]: the heat map's cells, the
//! timeline's bars and marks, idle rate and utilisation per model and zone,
//! peak hours, queue wait and availability. Pure: no I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, NaiveDate, Utc};
use lh_events::Tier;
use serde::Serialize;
use uuid::Uuid;

use super::model::{
    day_end, day_start, DayInput, Interruption, RunEnd, HOURS_PER_DAY, MINUTES_PER_HOUR,
    SECS_PER_HOUR,
};

/// Queue wait the seed aims for: p95 of requested → first running, seconds.
pub const QUEUE_WAIT_TARGET_SECS: f64 = 15.0;
/// Availability the seed promises, percent.
pub const AVAILABILITY_TARGET_PCT: f64 = 99.95;
/// Hours listed as the day's peak.
pub const PEAK_HOURS: usize = 3;

/// One GPU's row: its name and its 24 VRAM cells.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuRow {
    pub node_id: String,
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub zone: String,
    pub memory_mib: u64,
    /// Average VRAM used each hour, summed over the leases on the GPU, as
    /// percent of the GPU's memory (0 where nothing was used).
    pub vram_pct: [f64; HOURS_PER_DAY as usize],
    /// Whether a lease held the GPU at some time in each hour.
    pub leased: [bool; HOURS_PER_DAY as usize],
}

impl GpuRow {
    /// `node/index`, how the report names a GPU.
    pub fn label(&self) -> String {
        format!("{}/{}", self.node_id, self.index)
    }
}

/// Why a bar on the timeline stops where it does, when it is worth a mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    Preempted,
    FailedOver,
}

/// A lease's run on one GPU, in hours from the day's start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bar {
    /// Row in [`DailyReport::gpus`].
    pub row: usize,
    pub lease_id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub tier: Option<Tier>,
    pub start_h: f64,
    pub end_h: f64,
    pub mark: Option<MarkKind>,
}

/// Idle rate and utilisation of one (GPU model, zone).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelZone {
    pub model: String,
    pub zone: String,
    pub gpus: usize,
    pub gpu_hours: u32,
    pub leased_gpu_hours: u32,
    /// Share of GPU-hours no lease held the GPU at all, 0 to 1.
    pub idle_rate: f64,
    /// Average utilisation over the leased GPU-hours that had a figure.
    pub utilisation_pct: Option<f64>,
}

/// One of the busiest hours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PeakHour {
    pub hour: u32,
    pub gpus_leased: usize,
}

/// Requested → first running, for the leases requested during the day.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueWait {
    /// Leases that started.
    pub started: usize,
    /// Requested during the day, not started by its end (and not withdrawn).
    pub still_waiting: usize,
    pub mean_secs: Option<f64>,
    /// Nearest rank: the ⌈0.95·n⌉-th shortest wait.
    pub p95_secs: Option<f64>,
    pub target_secs: f64,
}

impl QueueWait {
    pub fn meets_target(&self) -> Option<bool> {
        self.p95_secs.map(|p| p <= self.target_secs)
    }
}

/// The day's availability.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Availability {
    /// Seconds leases ran (each lease once, whatever its GPUs).
    pub running_secs: i64,
    /// Seconds leases were interrupted by the platform.
    pub downtime_secs: i64,
    /// `running + downtime`: what should have been running.
    pub expected_secs: i64,
    /// `100 × (1 − downtime / expected)`; `None` when nothing should have run.
    pub pct: Option<f64>,
    pub target_pct: f64,
    pub interruptions: usize,
}

impl Availability {
    pub fn meets_target(&self) -> Option<bool> {
        self.pct.map(|p| p >= self.target_pct)
    }
}

/// The day's report, in numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DailyReport {
    pub date: NaiveDate,
    pub tenant: Option<Uuid>,
    pub gpus: Vec<GpuRow>,
    pub bars: Vec<Bar>,
    pub by_model_zone: Vec<ModelZone>,
    pub peak_hours: Vec<PeakHour>,
    pub queue_wait: QueueWait,
    pub availability: Availability,
    /// The interruptions, in the order they began.
    pub interruptions: Vec<Interruption>,
    /// Leases that ran during the day.
    pub leases: usize,
    pub preemptions: usize,
    pub failovers: usize,
    pub gpu_hours: u32,
    pub leased_gpu_hours: u32,
    /// Usage points that named a GPU not in the inventory.
    pub usage_off_inventory: usize,
}

/// GPUs, GPU-hours, leased GPU-hours, sum and count of their utilisation.
type GroupSums = (usize, u32, u32, f64, u32);
/// [start, end) of a run.
type Span = (DateTime<Utc>, DateTime<Utc>);

fn hours_from(start: DateTime<Utc>, at: DateTime<Utc>) -> f64 {
    (at - start).num_milliseconds() as f64 / 1000.0 / SECS_PER_HOUR as f64
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

impl DailyReport {
    pub fn compute(input: &DayInput) -> DailyReport {
        let start = day_start(input.date);
        let end = day_end(input.date);
        // Hours begun by the time the day was read: all 24 for a past day.
        let hours_known = (((input.as_of.min(end) - start).num_seconds() + SECS_PER_HOUR - 1)
            / SECS_PER_HOUR)
            .clamp(0, i64::from(HOURS_PER_DAY)) as u32;
        let mut rows: Vec<GpuRow> = input
            .gpus
            .iter()
            .map(|g| GpuRow {
                node_id: g.node_id.clone(),
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                zone: g.zone.clone(),
                memory_mib: g.memory_mib,
                vram_pct: [0.0; HOURS_PER_DAY as usize],
                leased: [false; HOURS_PER_DAY as usize],
            })
            .collect();
        rows.sort_by(|a, b| (&a.node_id, a.index).cmp(&(&b.node_id, b.index)));
        let row_of: BTreeMap<(String, u32), usize> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| ((r.node_id.clone(), r.index), i))
            .collect();

        let mut bars = Vec::new();
        for run in &input.runs {
            let mark = match run.ended_by {
                RunEnd::Preempted => Some(MarkKind::Preempted),
                RunEnd::FailedOver => Some(MarkKind::FailedOver),
                _ => None,
            };
            let (s, e) = (hours_from(start, run.start), hours_from(start, run.end));
            for idx in &run.gpu_indices {
                let Some(&row) = row_of.get(&(run.node_id.clone(), *idx)) else {
                    continue;
                };
                // Hours the run touches: [floor(s), ceil(e)).
                let first = (run.start - start).num_seconds() / SECS_PER_HOUR;
                let last = ((run.end - start).num_seconds() + SECS_PER_HOUR - 1) / SECS_PER_HOUR;
                for h in first.max(0)..last.min(i64::from(HOURS_PER_DAY)) {
                    rows[row].leased[h as usize] = true;
                }
                bars.push(Bar {
                    row,
                    lease_id: run.lease_id,
                    tenant_id: run.tenant_id,
                    tier: run.tier,
                    start_h: s,
                    end_h: e,
                    mark,
                });
            }
        }
        bars.sort_by(|a, b| {
            (a.row, a.start_h, a.lease_id)
                .partial_cmp(&(b.row, b.start_h, b.lease_id))
                .expect("hours are finite")
        });

        // Utilisation is the device's: leases sharing a GPU all see the
        // same figure, so the hour takes the highest, not the sum.
        let mut utilisation: BTreeMap<(usize, u32), f64> = BTreeMap::new();
        let mut usage_off_inventory = 0;
        for u in &input.usage {
            let Some(&row) = row_of.get(&(u.node_id.clone(), u.gpu_index)) else {
                usage_off_inventory += 1;
                continue;
            };
            if u.hour >= HOURS_PER_DAY {
                continue;
            }
            let memory = rows[row].memory_mib.max(1) as f64;
            // A lease that ran part of the hour weighs by the minutes it ran.
            let share_of_hour = f64::from(u.minutes.min(MINUTES_PER_HOUR)) / f64::from(MINUTES_PER_HOUR);
            rows[row].vram_pct[u.hour as usize] +=
                u.memory_used_mib_avg * share_of_hour * 100.0 / memory;
            if let Some(pct) = u.utilization_pct_avg {
                let slot = utilisation.entry((row, u.hour)).or_insert(pct);
                *slot = slot.max(pct);
            }
        }

        let mut groups: BTreeMap<(String, String), GroupSums> = BTreeMap::new();
        for (i, r) in rows.iter().enumerate() {
            let g = groups.entry((r.model.clone(), r.zone.clone())).or_default();
            g.0 += 1;
            for h in 0..hours_known {
                g.1 += 1;
                if r.leased[h as usize] {
                    g.2 += 1;
                    if let Some(pct) = utilisation.get(&(i, h)) {
                        g.3 += pct;
                        g.4 += 1;
                    }
                }
            }
        }
        let by_model_zone = groups
            .into_iter()
            .map(|((model, zone), (gpus, hours, leased, sum, n))| ModelZone {
                model,
                zone,
                gpus,
                gpu_hours: hours,
                leased_gpu_hours: leased,
                idle_rate: if hours == 0 {
                    0.0
                } else {
                    f64::from(hours - leased) / f64::from(hours)
                },
                utilisation_pct: (n > 0).then(|| sum / f64::from(n)),
            })
            .collect();

        let mut peak_hours: Vec<PeakHour> = (0..HOURS_PER_DAY)
            .map(|h| PeakHour {
                hour: h,
                gpus_leased: rows.iter().filter(|r| r.leased[h as usize]).count(),
            })
            .filter(|p| p.gpus_leased > 0)
            .collect();
        peak_hours.sort_by_key(|p| (std::cmp::Reverse(p.gpus_leased), p.hour));
        peak_hours.truncate(PEAK_HOURS);

        let mut waits: Vec<f64> = input
            .waits
            .iter()
            .filter_map(|w| {
                let ran = w.first_running_at?;
                Some(((ran - w.requested_at).num_milliseconds() as f64 / 1000.0).max(0.0))
            })
            .collect();
        waits.sort_by(|a, b| a.partial_cmp(b).expect("waits are finite"));
        let queue_wait = QueueWait {
            started: waits.len(),
            still_waiting: input
                .waits
                .iter()
                .filter(|w| w.first_running_at.is_none() && !w.withdrawn)
                .count(),
            mean_secs: (!waits.is_empty()).then(|| waits.iter().sum::<f64>() / waits.len() as f64),
            p95_secs: percentile(&waits, 0.95),
            target_secs: QUEUE_WAIT_TARGET_SECS,
        };

        // A lease on several GPUs runs once: its seconds are counted per
        // lease, merging its runs' overlaps.
        let mut per_lease: BTreeMap<Uuid, Vec<Span>> = BTreeMap::new();
        for run in &input.runs {
            per_lease
                .entry(run.lease_id)
                .or_default()
                .push((run.start.max(start), run.end.min(end)));
        }
        let mut running_secs = 0;
        for spans in per_lease.values_mut() {
            spans.sort();
            let mut covered: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
            for &(s, e) in spans.iter() {
                match covered {
                    Some((cs, ce)) if s <= ce => covered = Some((cs, ce.max(e))),
                    Some((cs, ce)) => {
                        running_secs += (ce - cs).num_seconds();
                        covered = Some((s, e));
                    }
                    None => covered = Some((s, e)),
                }
            }
            if let Some((cs, ce)) = covered {
                running_secs += (ce - cs).num_seconds();
            }
        }
        let downtime_secs: i64 = input
            .interruptions
            .iter()
            .map(|i| (i.to.min(end) - i.from.max(start)).num_seconds().max(0))
            .sum();
        let expected_secs = running_secs + downtime_secs;
        let availability = Availability {
            running_secs,
            downtime_secs,
            expected_secs,
            pct: (expected_secs > 0)
                .then(|| 100.0 * (1.0 - downtime_secs as f64 / expected_secs as f64)),
            target_pct: AVAILABILITY_TARGET_PCT,
            interruptions: input.interruptions.len(),
        };

        let leases: BTreeSet<Uuid> = input.runs.iter().map(|r| r.lease_id).collect();
        let count = |kind: RunEnd| {
            input
                .runs
                .iter()
                .filter(|r| r.ended_by == kind)
                .map(|r| r.lease_id)
                .collect::<BTreeSet<_>>()
                .len()
        };
        let gpu_hours = rows.len() as u32 * hours_known;
        let leased_gpu_hours = rows
            .iter()
            .map(|r| r.leased.iter().filter(|l| **l).count() as u32)
            .sum();
        DailyReport {
            date: input.date,
            tenant: input.tenant,
            gpus: rows,
            bars,
            by_model_zone,
            peak_hours,
            queue_wait,
            availability,
            interruptions: input.interruptions.clone(),
            leases: leases.len(),
            preemptions: count(RunEnd::Preempted),
            failovers: input
                .runs
                .iter()
                .filter(|r| r.ended_by == RunEnd::FailedOver)
                .count(),
            gpu_hours,
            leased_gpu_hours,
            usage_off_inventory,
        }
    }
}
