//! Whether a running lease sits idle: its GPUs' idle stretch, judged one
//! usage figure at a time. Kept with the lease in the pure state (the GPU
//! side feeds it figures and reports what it finds), so that the state
//! needs nothing of the GPU side.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_events::telemetry::LeaseUsage;

/// Whether a lease's GPUs have done nothing for a whole window.
///
/// A lease is busy in a sample when any of its GPUs shows utilisation above
/// zero; a GPU missing from the sample (lost), or one that cannot tell its
/// utilisation, tells nothing either way.
/// It is reported once per idle stretch: work in between starts a new one.
#[derive(Debug, Clone, Default)]
pub(crate) struct IdleWatch {
    idle_since: Option<DateTime<Utc>>,
    reported: bool,
    /// Whole windows of this stretch already reported by
    /// [`IdleWatch::observe_renewing`].
    renewed: u32,
}

impl IdleWatch {
    /// Judges one usage figure; `Some(idle_since)` the first time the
    /// stretch reaches `window`.
    pub(crate) fn observe(
        &mut self,
        usage: &LeaseUsage,
        window: Duration,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let since = self.ripe(usage, window, now)?;
        self.reported = true;
        Some(since)
    }

    /// Judges one usage figure; the stretch's start while it has lasted
    /// `window` and is not reported yet (as [`IdleWatch::observe`], which
    /// reports it: the caller may still wait for others to be idle too).
    pub(crate) fn ripe(
        &mut self,
        usage: &LeaseUsage,
        window: Duration,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let since = self.track(usage, now)?;
        let held = (now - since).to_std().unwrap_or_default();
        if self.reported || held < window {
            return None;
        }
        Some(since)
    }

    /// Marks the stretch reported.
    pub(crate) fn report(&mut self) {
        self.reported = true;
    }

    /// Judges one usage figure; once the stretch has lasted `window`,
    /// `Some((idle_since, k))` for its k-th report, one each `renew` after
    /// the first: a report that stays fresh only while the stretch lasts.
    pub(crate) fn observe_renewing(
        &mut self,
        usage: &LeaseUsage,
        window: Duration,
        renew: Duration,
        now: DateTime<Utc>,
    ) -> Option<(DateTime<Utc>, u32)> {
        let since = self.track(usage, now)?;
        let held = (now - since).to_std().unwrap_or_default();
        let past = held.checked_sub(window)?;
        let reports = u32::try_from(past.as_secs() / renew.as_secs().max(1))
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        if reports <= self.renewed {
            return None;
        }
        self.renewed = reports;
        Some((since, reports))
    }

    /// Whether this stretch was reported.
    pub(crate) fn reported(&self) -> bool {
        self.reported
    }

    /// The stretch's start after one usage figure; `None` when the figure
    /// tells nothing, and a busy figure ends the stretch.
    fn track(&mut self, usage: &LeaseUsage, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if usage.gpus.is_empty() || usage.gpus.iter().any(|g| g.utilization_pct.is_none()) {
            return None;
        }
        if usage.gpus.iter().any(|g| g.utilization_pct > Some(0)) {
            *self = Self::default();
            return None;
        }
        Some(*self.idle_since.get_or_insert(now))
    }

    /// Where the stretch began; the agent reads only what `observe` says.
    #[cfg(test)]
    fn idle_since(&self) -> Option<DateTime<Utc>> {
        self.idle_since
    }
}

#[cfg(test)]
mod tests {
    use lh_events::telemetry::LeaseGpuUsage;
    use uuid::Uuid;

    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        "2026-12-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + chrono::Duration::seconds(s)
    }

    /// One lease's usage of one whole GPU at `util` percent.
    fn usage(util: u32) -> LeaseUsage {
        LeaseUsage {
            lease_id: Uuid::from_u128(1),
            tenant_id: Some(Uuid::from_u128(101)),
            node_id: "n".into(),
            at: t(0),
            gpus: vec![LeaseGpuUsage {
                index: 0,
                uuid: "GPU-0".into(),
                utilization_pct: Some(util),
                memory_used_mib: 0,
                shared: false,
                temperature_c: Some(50),
                power_w: Some(120.0),
            }],
        }
    }

    #[test]
    fn idle_fires_once_and_only_after_the_window() {
        let window = Duration::from_secs(300);
        let mut w = IdleWatch::default();
        assert_eq!(w.observe(&usage(0), window, t(0)), None);
        assert_eq!(w.observe(&usage(0), window, t(299)), None);
        assert_eq!(w.observe(&usage(0), window, t(300)), Some(t(0)));
        assert_eq!(w.observe(&usage(0), window, t(301)), None);
        assert_eq!(w.observe(&usage(0), window, t(10_000)), None);
        // Work, then a new idle stretch, reported once more.
        assert_eq!(w.observe(&usage(3), window, t(10_001)), None);
        assert_eq!(w.idle_since(), None);
        assert_eq!(w.observe(&usage(0), window, t(10_002)), None);
        assert_eq!(w.observe(&usage(0), window, t(10_302)), Some(t(10_002)));
    }

    #[test]
    fn a_renewing_report_comes_after_the_window_then_each_renewal_while_it_lasts() {
        let window = Duration::from_secs(300);
        let renew = Duration::from_secs(30);
        let mut w = IdleWatch::default();
        let mut at = |util: u32, s: i64| w.observe_renewing(&usage(util), window, renew, t(s));
        assert_eq!(at(0, 0), None);
        assert_eq!(at(0, 299), None);
        assert_eq!(at(0, 300), Some((t(0), 1)));
        assert_eq!(at(0, 329), None);
        assert_eq!(at(0, 331), Some((t(0), 2)));
        assert_eq!(at(0, 360), Some((t(0), 3)));
        // Work ends the stretch: nothing until a new one lasts a window.
        assert_eq!(at(4, 400), None);
        assert_eq!(at(0, 401), None);
        assert_eq!(at(0, 701), Some((t(401), 1)));
        // `ripe` says so without reporting; `report` does.
        let mut w = IdleWatch::default();
        w.ripe(&usage(0), window, t(0));
        assert_eq!(w.ripe(&usage(0), window, t(300)), Some(t(0)));
        assert_eq!(w.ripe(&usage(0), window, t(301)), Some(t(0)));
        w.report();
        assert_eq!(w.ripe(&usage(0), window, t(302)), None);
    }

    #[test]
    fn one_busy_sample_restarts_the_window() {
        let window = Duration::from_secs(10);
        let mut w = IdleWatch::default();
        w.observe(&usage(0), window, t(0));
        w.observe(&usage(1), window, t(9));
        assert_eq!(w.observe(&usage(0), window, t(10)), None);
        assert_eq!(w.observe(&usage(0), window, t(19)), None);
        assert_eq!(w.observe(&usage(0), window, t(20)), Some(t(10)));
    }

    #[test]
    fn a_gpu_that_cannot_tell_its_utilisation_is_never_idle() {
        let mut w = IdleWatch::default();
        let mut u = usage(0);
        u.gpus[0].utilization_pct = None;
        for s in 0..1000 {
            assert_eq!(w.observe(&u, Duration::from_secs(10), t(s)), None);
        }
        assert_eq!(w.idle_since(), None);
    }

    #[test]
    fn no_gpu_in_the_sample_says_nothing() {
        let mut w = IdleWatch::default();
        let mut u = usage(0);
        u.gpus.clear();
        assert_eq!(w.observe(&u, Duration::ZERO, t(0)), None);
        assert_eq!(w.idle_since(), None);
    }
}
