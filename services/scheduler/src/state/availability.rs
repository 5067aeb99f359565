//! How much of the time each tenant's started leases should have run they
//! were interrupted by the platform, folded from the log.
//!
//! A lease owes its tenant service from its first start until it ends or is
//! suspended (suspension is the tenant's idleness or balance, not a fault).
//! It is interrupted from the moment the platform moves it off its node
//! (lost, drained with `move`, an unhealthy GPU: `lease.migrated`, from the
//! last instant it was billed) until it runs again or ends. Availability is
//! one minus interrupted over owed lease-seconds.
//!
//! Closed intervals are dated by the log, so every replica and every
//! restart folds the same totals; only the open intervals of live leases
//! are counted up to the caller's clock. Exported as counters, the totals
//! must never step back, also across a restart: an interval counted open
//! up to some instant and then closed earlier (an end dated by its node
//! before the instant it was counted to) would. So a node's event never
//! dates what it changes before it was stored less the nodes' clock skew,
//! nor after it was stored (the decide loop holds its times so:
//! `lh_events::node_time`), and the caller counts open intervals no
//! further than that skew, and a little more, before its clock
//! ([`AvailabilityStats::counted_through`]). The platform's own
//! events date from the log already; an interruption dated back (from the
//! last billed instant) moves owed time to interrupted and takes none
//! away.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Tenants given their own series; past it, further tenants are summed
/// under [`OTHER_TENANTS`] so a flood of tenants cannot grow the scrape
/// without bound.
pub const MAX_AVAILABILITY_TENANTS: usize = 10_000;

/// The tenant key under which tenants past [`MAX_AVAILABILITY_TENANTS`] are
/// summed.
pub const OTHER_TENANTS: Uuid = Uuid::nil();

/// A lease's open interval, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Open {
    /// Running since.
    Serving(DateTime<Utc>),
    /// Interrupted by the platform since.
    Interrupted(DateTime<Utc>),
}

/// A tenant's closed lease-milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTime {
    /// Lease-milliseconds its started leases should have run.
    pub owed_ms: u64,
    /// Of those, lease-milliseconds the platform had them interrupted.
    pub interrupted_ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AvailabilityStats {
    /// Closed intervals, by tenant.
    pub tenants: BTreeMap<Uuid, LeaseTime>,
    /// Open intervals of live leases: (tenant, interval).
    pub open: HashMap<Uuid, (Uuid, Open)>,
}

/// How far behind the caller's clock, beyond the nodes' clock skew, open
/// intervals are counted: room for events stored before an export and not
/// folded yet. A fold further behind than this at an export can still
/// make a later restart count up to that much less.
pub const COUNTED_BEHIND_SKEW_MS: i64 = 30_000;

fn millis_between(from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    u64::try_from((to - from).num_milliseconds()).unwrap_or(0)
}

impl AvailabilityStats {
    /// The instant open intervals are counted to at `now` (see the module).
    pub fn counted_through(now: DateTime<Utc>, skew: chrono::Duration) -> DateTime<Utc> {
        now - skew.abs() - chrono::Duration::milliseconds(COUNTED_BEHIND_SKEW_MS)
    }

    /// The key a tenant's time is kept under: its own while there is room.
    fn key(&self, tenant: Uuid) -> Uuid {
        if self.tenants.contains_key(&tenant) || self.tenants.len() < MAX_AVAILABILITY_TENANTS {
            tenant
        } else {
            OTHER_TENANTS
        }
    }

    /// Closes a lease's open interval at `at`, adding it to its tenant.
    fn close(&mut self, lease: Uuid, at: DateTime<Utc>) {
        let Some((tenant, open)) = self.open.remove(&lease) else {
            return;
        };
        let key = self.key(tenant);
        let time = self.tenants.entry(key).or_default();
        match open {
            Open::Serving(since) => time.owed_ms += millis_between(since, at),
            Open::Interrupted(since) => {
                let ms = millis_between(since, at);
                time.owed_ms += ms;
                time.interrupted_ms += ms;
            }
        }
    }

    /// The lease runs (its first start, or again after an interruption).
    pub fn started(&mut self, lease: Uuid, tenant: Uuid, at: DateTime<Utc>) {
        // A start dated before the interval it ends (a node's clock, a late
        // event) must not count that stretch twice.
        let at = match self.open.get(&lease) {
            Some((_, Open::Serving(since) | Open::Interrupted(since))) => at.max(*since),
            None => at,
        };
        self.close(lease, at);
        self.open.insert(lease, (tenant, Open::Serving(at)));
    }

    /// The platform moved the lease off its node; it was last served at
    /// `last_served`. A lease that never started owed nothing yet.
    pub fn interrupted(&mut self, lease: Uuid, last_served: DateTime<Utc>) {
        let Some(&(tenant, open)) = self.open.get(&lease) else {
            return;
        };
        if let Open::Serving(since) = open {
            // A node's last billed instant before its lease's start (clocks
            // disagree) counts the interruption from the start.
            let at = last_served.max(since);
            self.close(lease, at);
            self.open.insert(lease, (tenant, Open::Interrupted(at)));
        }
    }

    /// The lease ended or was suspended: it owes nothing from `at` on.
    pub fn stopped_owing(&mut self, lease: Uuid, at: DateTime<Utc>) {
        self.close(lease, at);
    }

    /// Every tenant's lease time up to `now`: the closed intervals and the
    /// open ones counted to `now`.
    pub fn up_to(&self, now: DateTime<Utc>) -> BTreeMap<Uuid, LeaseTime> {
        let mut totals = self.tenants.clone();
        for (tenant, open) in self.open.values() {
            let key = self.key(*tenant);
            let time = totals.entry(key).or_default();
            match *open {
                Open::Serving(since) => time.owed_ms += millis_between(since, now),
                Open::Interrupted(since) => {
                    let ms = millis_between(since, now);
                    time.owed_ms += ms;
                    time.interrupted_ms += ms;
                }
            }
        }
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        format!("2026-12-03T{s}Z").parse().unwrap()
    }

    #[test]
    fn an_interruption_counts_from_the_last_billed_instant_until_it_runs_again() {
        let (lease, tenant) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let mut stats = AvailabilityStats::default();
        stats.started(lease, tenant, t("10:00:00"));
        stats.interrupted(lease, t("10:59:50"));
        stats.started(lease, tenant, t("11:00:20"));
        stats.stopped_owing(lease, t("12:00:00"));
        let time = stats.up_to(t("13:00:00"))[&tenant];
        assert_eq!(time.owed_ms, 2 * 3600 * 1000);
        assert_eq!(time.interrupted_ms, 30 * 1000);
        assert!(stats.open.is_empty());
    }

    #[test]
    fn open_intervals_count_to_now_and_never_run_backwards() {
        let (lease, tenant) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let mut stats = AvailabilityStats::default();
        stats.started(lease, tenant, t("10:00:00"));
        let before = stats.up_to(t("10:10:00"))[&tenant];
        assert_eq!(before.owed_ms, 600_000);
        // A start dated before the open interval counts nothing twice.
        stats.started(lease, tenant, t("09:59:00"));
        assert_eq!(stats.up_to(t("10:10:00"))[&tenant], before);
        // Moved at 10:10 from its last billed instant at 10:09: the owed
        // time is unchanged, a minute of it now interrupted.
        stats.interrupted(lease, t("10:09:00"));
        let after = stats.up_to(t("10:10:00"))[&tenant];
        assert_eq!(after.owed_ms, 600_000);
        assert_eq!(after.interrupted_ms, 60_000);
        // A suspended or never started lease owes nothing.
        stats.stopped_owing(lease, t("10:10:00"));
        stats.interrupted(Uuid::from_u128(9), t("10:10:00"));
        assert_eq!(stats.up_to(t("11:00:00"))[&tenant], after);
    }

    #[test]
    fn an_end_counted_past_is_dated_no_earlier_than_its_storing_less_the_skew() {
        let (lease, tenant) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let skew = chrono::Duration::seconds(30);
        // A node's time as the decide loop folds it, stored at `stored`.
        let held = |claimed, stored| lh_events::node_time::held_to(claimed, stored, skew);
        let mut stats = AvailabilityStats::default();
        stats.started(lease, tenant, held(t("10:00:00"), t("10:00:01")));
        // Exported at 11:00: counted through 10:59:00.
        let through = AvailabilityStats::counted_through(t("11:00:00"), skew);
        assert_eq!(through, t("10:59:00"));
        let exported = stats.up_to(through)[&tenant];
        // The end, stored at 11:00:02, says its node stopped at 10:40: it
        // ends at 10:59:32, so a restart folding it never counts less than
        // was exported.
        stats.stopped_owing(lease, held(t("10:40:00"), t("11:00:02")));
        let after = stats.up_to(AvailabilityStats::counted_through(t("11:00:05"), skew))[&tenant];
        assert_eq!(after.owed_ms, (59 * 60 + 32) * 1000);
        assert!(after.owed_ms >= exported.owed_ms);
        // A node clock ahead dates no time after the storing.
        let ahead = Uuid::from_u128(3);
        stats.started(ahead, tenant, held(t("11:09:50"), t("11:10:00")));
        stats.stopped_owing(ahead, held(t("23:00:00"), t("11:20:00")));
        let ahead_ms = stats.up_to(t("23:59:00"))[&tenant].owed_ms - after.owed_ms;
        assert_eq!(ahead_ms, (10 * 60 + 10) * 1000);
    }

    #[test]
    fn tenants_past_the_limit_are_summed_together() {
        let mut stats = AvailabilityStats::default();
        for n in 0..MAX_AVAILABILITY_TENANTS as u128 + 5 {
            let lease = Uuid::from_u128(n + 1_000_000);
            stats.started(lease, Uuid::from_u128(n + 1), t("10:00:00"));
            stats.stopped_owing(lease, t("10:00:01"));
        }
        assert_eq!(stats.tenants.len(), MAX_AVAILABILITY_TENANTS + 1);
        assert_eq!(stats.tenants[&OTHER_TENANTS].owed_ms, 5_000);
    }
}
