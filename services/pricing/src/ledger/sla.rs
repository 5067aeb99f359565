//! SLA credits: a tenant's availability over a month from the downtime
//! the fold recorded, and the `credit.granted` it calls for, with its whole
//! calculation. Kept apart so the rule reads in one place.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use lh_events::{derived_id, CreditGranted};
use lh_rpc::invoice_document::money;
use rust_decimal::Decimal;
use uuid::Uuid;

use super::fold::Ledger;
use super::fold::{
    month_bounds, next_period, oldest_kept, period_of, split_by_month, MAX_INTERRUPTIONS_LISTED,
    MAX_OPEN_INTERRUPTION_MONTHS,
};

/// The words of the credit rule, carried by every credit.
pub const CREDIT_RULE: &str = "availability = 100 x (1 - downtime / (billed time + downtime)) over the tenant's leases in the month; below 99.95 % the credit is 10 % of the month's charges of the interrupted leases, below 99.0 % 30 %, below 95.0 % 100 %";

/// The availability the platform promises, in percent.
pub fn sla_percent() -> Decimal {
    Decimal::new(9995, 2)
}

/// The share of the affected charges credited at `availability_percent`
/// (none at or above the SLA).
pub fn share_percent(availability_percent: Decimal) -> Option<Decimal> {
    if availability_percent < Decimal::from(95) {
        Some(Decimal::from(100))
    } else if availability_percent < Decimal::from(99) {
        Some(Decimal::from(30))
    } else if availability_percent < sla_percent() {
        Some(Decimal::from(10))
    } else {
        None
    }
}

impl Ledger {
    /// Settles the months whose SLA credit is decided: their per-lease sums
    /// go, so that a year of leases does not stay in memory for credits
    /// that can no longer come. What is decided does not change: a settled
    /// month is granted no credit, and was due none (or has its own).
    pub(super) fn settle_months(&mut self, now: DateTime<Utc>) {
        let mut down_since: HashMap<Uuid, DateTime<Utc>> = HashMap::new();
        for w in self.leases.values() {
            if let (Some(tenant), Some(since)) = (w.tenant_id, w.down_since) {
                down_since
                    .entry(tenant)
                    .and_modify(|s| *s = (*s).min(since))
                    .or_insert(since);
            }
        }
        let settled: Vec<(Uuid, String)> = self
            .months
            .iter()
            .filter(|(_, m)| !m.settled && m.issued.is_some() && m.partial.is_none())
            .filter(|((tenant, period), _)| {
                let Some((_, end)) = month_bounds(period) else {
                    return false;
                };
                let key = (*tenant, period.clone());
                self.due(period, now)
                    && down_since.get(tenant).is_none_or(|since| *since >= end)
                    && (self.credited.contains(&key)
                        || !self.downtime.contains_key(&key)
                        || self.sla_credit(*tenant, period, now).is_none())
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in settled {
            if let Some(month) = self.months.get_mut(&key) {
                month.settled = true;
                month.per_lease = HashMap::new();
            }
        }
    }

    /// The credit the tenant's availability in `period` calls for, if any.
    pub(super) fn sla_credit(
        &self,
        tenant: Uuid,
        period: &str,
        now: DateTime<Utc>,
    ) -> Option<CreditGranted> {
        let (start, end) = month_bounds(period)?;
        let mut seconds = 0u64;
        let mut leases = BTreeSet::new();
        let mut listed = Vec::new();
        if let Some(d) = self.downtime.get(&(tenant, period.to_string())) {
            seconds = d.seconds;
            leases.extend(d.leases.iter().copied());
            listed.extend(d.listed.iter().cloned());
        }
        // Leases still down count until now or the month's end.
        let mut open: Vec<_> = self
            .leases
            .iter()
            .filter(|(_, w)| w.tenant_id == Some(tenant))
            .filter_map(|(id, w)| Some((*id, w.down_since?)))
            .collect();
        open.sort();
        for (lease, since) in open {
            let (from, to) = (since.max(start), now.min(end));
            if let Some((_, i)) = split_by_month(lease, from, to).into_iter().next() {
                seconds = seconds.saturating_add(i.seconds);
                leases.insert(lease);
                if listed.len() < MAX_INTERRUPTIONS_LISTED {
                    listed.push(i);
                }
            }
        }
        if seconds == 0 {
            return None;
        }
        let month = self.months.get(&(tenant, period.to_string()));
        let billed: u64 = month.map_or(0, |m| m.per_lease.values().map(|v| v.0).sum());
        let lease_seconds = billed.saturating_add(seconds);
        let availability = (Decimal::from(100)
            * (Decimal::ONE - Decimal::from(seconds) / Decimal::from(lease_seconds)))
        .trunc_with_scale(4);
        let share = share_percent(availability)?;
        let affected: Decimal = month.map_or(Decimal::ZERO, |m| {
            leases
                .iter()
                .filter_map(|l| m.per_lease.get(l))
                .map(|v| v.1)
                .sum()
        });
        let amount = money(-(affected * share / Decimal::from(100)));
        if amount >= Decimal::ZERO {
            return None;
        }
        Some(CreditGranted {
            credit_id: derived_id(&["credit", &tenant.to_string(), period]),
            tenant_id: tenant,
            period: period.to_string(),
            applies_to_period: next_period(period)?,
            currency: lh_domain::rating::CURRENCY.to_string(),
            downtime_seconds: seconds,
            lease_seconds,
            availability_percent: availability,
            sla_percent: sla_percent(),
            rule: CREDIT_RULE.to_string(),
            share_percent: share,
            affected_charges: money(affected),
            amount,
            interruptions: listed,
        })
    }

    /// Credits for every tenant's month that is due and not credited.
    pub(super) fn credits(&self, now: DateTime<Utc>) -> Vec<CreditGranted> {
        let mut candidates: BTreeSet<(Uuid, String)> = self.downtime.keys().cloned().collect();
        for w in self.leases.values() {
            let (Some(tenant), Some(since)) = (w.tenant_id, w.down_since) else {
                continue;
            };
            let mut period = period_of(since);
            for _ in 0..MAX_OPEN_INTERRUPTION_MONTHS {
                if !self.due(&period, now) {
                    break;
                }
                candidates.insert((tenant, period.clone()));
                match next_period(&period) {
                    Some(next) => period = next,
                    None => break,
                }
            }
        }
        let oldest = oldest_kept(now);
        candidates
            .into_iter()
            .filter(|(tenant, period)| {
                *period >= oldest
                    && self.due(period, now)
                    && !self.credited.contains(&(*tenant, period.clone()))
                    && !self
                        .months
                        .get(&(*tenant, period.clone()))
                        .is_some_and(|m| m.settled)
            })
            .filter_map(|(tenant, period)| self.sla_credit(tenant, &period, now))
            .collect()
    }
}
