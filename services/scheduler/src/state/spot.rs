//! The spot market as the scheduler acts on it: the price of each
//! (zone, model) from `spot.price_set`, which zones a lease may be placed
//! in by its constraints and its bid, who is outbid, and which preempted
//! leases are requested again.
//!
//! The scheduler, not the broker, notices outbid leases: it already owns
//! every preemption notice and guards each one on the lease's subject, so
//! a lease is never noticed twice by two writers, and the same fold that
//! places a lease under its bid tells when the bid no longer covers it.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use lh_events::{
    derived_id, Actor, EndReason, Envelope, EventData, Expect, LeaseRequested, PreemptionReason,
    RecoveryOf, SpotPriceSet, Tier,
};
use lh_service::decider::Batch;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{FleetView, Lease, State, Status, SERVICE};

/// Most (zone, model) prices kept: a market per zone and model the fleet
/// has, far below this.
pub const MAX_SPOT_MARKETS: usize = 10_000;
/// Most preempted leases waiting to be requested again; past it a
/// preempted lease is not recovered (and the log says so).
pub const MAX_PENDING_RECOVERIES: usize = 10_000;

/// What the spot market did, folded from the log, so every replica and
/// every restart reports the same figures.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpotStats {
    /// Spot leases requested.
    pub requested: u64,
    /// Spot leases placed at least once.
    pub accepted: u64,
    /// Accepted spot leases that ran to their own end (completed or
    /// stopped) or to a notice's deadline.
    pub succeeded: u64,
    /// Accepted spot leases that ended otherwise (failed, or evicted
    /// without a notice).
    pub failed: u64,
    /// Preemption notices by reason.
    pub preemptions: BTreeMap<String, u64>,
}

impl SpotStats {
    pub(super) fn noticed(&mut self, reason: PreemptionReason) {
        *self
            .preemptions
            .entry(reason.as_str().to_string())
            .or_default() += 1;
    }

    /// Accepted spot leases that succeeded, 0 to 1 (1 while none ended).
    pub fn success_ratio(&self) -> f64 {
        let ended = self.succeeded + self.failed;
        if ended == 0 {
            1.0
        } else {
            self.succeeded as f64 / ended as f64
        }
    }

    /// Spot leases placed per spot lease requested, 0 to 1 (1 while none was).
    pub fn acceptance_ratio(&self) -> f64 {
        if self.requested == 0 {
            1.0
        } else {
            self.accepted as f64 / self.requested as f64
        }
    }
}

/// The spot part of a scheduler snapshot.
#[derive(Debug, Deserialize)]
pub(super) struct SpotSnapshot {
    prices: Vec<(String, String, Decimal)>,
    recoveries: BTreeMap<Uuid, LeaseRequested>,
    stats: SpotStats,
}

impl SpotSnapshot {
    /// `None` when `value` is not one (a snapshot from before spot prices).
    pub(super) fn parse(value: serde_json::Value) -> Option<Self> {
        serde_json::from_value(value).ok()
    }
}

/// Why a lease may not be placed in any zone now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum NoZone {
    /// No node of its model is in a zone its constraints allow.
    Constrained(String),
    /// The spot price is above its bid (or unknown) in every zone allowed.
    Outbid(String),
}

impl State {
    pub(super) fn spot_price_set(&mut self, p: &SpotPriceSet) {
        // A price no broker can publish would preempt every bid, or cover
        // any: it is ignored.
        if !lh_domain::spot::is_market_price(p.price_cny_per_gb_hour) {
            tracing::error!(zone = p.zone, gpu_model = p.gpu_model, price = %p.price_cny_per_gb_hour,
                "a spot price outside what a broker may publish; ignored");
            return;
        }
        let key = (p.zone.clone(), p.gpu_model.clone());
        if self.spot_prices.len() < MAX_SPOT_MARKETS || self.spot_prices.contains_key(&key) {
            self.spot_prices.insert(key, p.price_cny_per_gb_hour);
        }
    }

    /// The spot price of `model` in `zone`, CNY per GB-hour.
    pub fn spot_price(&self, zone: &str, model: &str) -> Option<Decimal> {
        self.spot_prices
            .get(&(zone.to_string(), model.to_string()))
            .copied()
    }

    /// Counts how an accepted spot lease ended, and queues its recovery
    /// when it was preempted and its policy allows another try.
    pub(super) fn spot_ended(&mut self, lease: &Lease, reason: EndReason) {
        if lease.tier != Tier::Spot || !lease.placed_before {
            return;
        }
        let succeeded = match reason {
            EndReason::Completed | EndReason::Stopped | EndReason::Cancelled => true,
            EndReason::Preempted => lease.preemption_deadline.is_some(),
            EndReason::Failed => false,
        };
        if succeeded {
            self.spot_stats.succeeded += 1;
        } else {
            self.spot_stats.failed += 1;
        }
        if reason != EndReason::Preempted {
            return;
        }
        let Some(request) = recovery_request(lease) else {
            return;
        };
        if self.recoveries.len() >= MAX_PENDING_RECOVERIES {
            tracing::warn!(lease = %lease.id, limit = MAX_PENDING_RECOVERIES,
                "too many recoveries pending; this preempted lease is not recovered");
            return;
        }
        self.recoveries.insert(lease.id, request);
    }

    pub(super) fn spot_snapshot(&self) -> serde_json::Value {
        let prices: Vec<(&String, &String, &Decimal)> = self
            .spot_prices
            .iter()
            .map(|((zone, model), price)| (zone, model, price))
            .collect();
        serde_json::json!({
            "prices": prices,
            "recoveries": self.recoveries,
            "stats": self.spot_stats,
        })
    }

    /// Takes back what [`State::spot_snapshot`] stored.
    pub(super) fn restore_spot(&mut self, spot: SpotSnapshot) {
        self.spot_prices = spot
            .prices
            .into_iter()
            .map(|(zone, model, price)| ((zone, model), price))
            .collect();
        self.recoveries = spot.recoveries;
        self.spot_stats = spot.stats;
    }

    /// The zones `lease` may be placed in now: `Ok(None)` for any zone (it
    /// has no constraint and no bid), else the zones of nodes with its
    /// model that its constraints allow and, for a bid, whose spot price
    /// the bid covers.
    pub(super) fn zones_for(
        &self,
        fleet: &impl FleetView,
        lease: &Lease,
    ) -> Result<Option<Vec<String>>, NoZone> {
        if !lease.is_constrained() {
            return Ok(None);
        }
        let model = &lease.gpu_model;
        let offered: BTreeSet<&str> = fleet
            .nodes()
            .filter(|n| n.gpus.iter().any(|g| g.model == *model))
            .map(|n| n.zone.as_str())
            .collect();
        let allowed: Vec<&str> = offered
            .into_iter()
            .filter(|z| lease.may_run_in(z))
            .collect();
        if allowed.is_empty() {
            return Err(NoZone::Constrained(format!(
                "no node offers {model} in the zones and regions the lease may run in"
            )));
        }
        let Some(bid) = lease.bid() else {
            return Ok(Some(allowed.into_iter().map(str::to_string).collect()));
        };
        let per_gpu = lease.vram_gb_per_gpu();
        let priced: Vec<(&str, Decimal)> = allowed
            .iter()
            .filter_map(|z| self.spot_price(z, model).map(|p| (*z, p)))
            .collect();
        let covered: Vec<String> = priced
            .iter()
            .filter(|(_, p)| lh_domain::spot::bid_covers(bid, *p, per_gpu))
            .map(|(z, _)| z.to_string())
            .collect();
        if !covered.is_empty() {
            return Ok(Some(covered));
        }
        let cheapest = priced.iter().min_by_key(|(z, p)| (*p, *z));
        Err(NoZone::Outbid(match cheapest {
            Some((zone, p)) => format!(
                "outbid: the spot price of {model} is above the bid of {bid} CNY per GPU-hour in every zone it may run in (lowest: {} in {zone})",
                lh_domain::spot::price_per_gpu_hour(*p, per_gpu).normalize()
            ),
            None => format!("no spot price for {model} yet in the zones it may run in"),
        }))
    }

    /// Running spot leases whose bid no longer covers their zone's price,
    /// not yet noticed, in request order.
    pub(super) fn outbid(&self) -> Vec<&Lease> {
        let mut outbid: Vec<&Lease> = self
            .leases
            .values()
            .filter(|l| {
                l.status == Status::Holding && l.preemption_deadline.is_none() && !l.stop_requested
            })
            .filter(|l| {
                let (Some(bid), Some(zone)) = (l.bid(), &l.zone) else {
                    return false;
                };
                self.spot_price(zone, &l.gpu_model)
                    .is_some_and(|p| !lh_domain::spot::bid_covers(bid, p, l.vram_gb_per_gpu()))
            })
            .collect();
        outbid.sort_by_key(|l| l.requested_sequence);
        outbid
    }

    /// The requests that recover preempted leases, each guarded on its new
    /// lease's empty subject and with an id derived from the preempted
    /// lease, so it is made once however often it is decided.
    pub(super) fn recovery_requests(&self, now: DateTime<Utc>) -> Vec<Batch> {
        self.recoveries
            .values()
            .map(|request| {
                let data = EventData::LeaseRequested(request.clone());
                let mut env = Envelope::new(Actor::Service(SERVICE.into()), now, data).with_id(
                    derived_id(&["lease.requested", &request.lease_id.to_string()]),
                );
                env.tenant_id = Some(request.tenant_id);
                vec![(env, Expect::LastSubjectSequence(0))]
            })
            .collect()
    }
}

/// The request that recovers preempted `lease`, when its policy allows
/// another try.
fn recovery_request(lease: &Lease) -> Option<LeaseRequested> {
    let original = lease.recovery_request.as_deref()?;
    let policy = original.recovery.as_ref()?;
    let attempt = original.recovery_of.as_ref().map_or(0, |r| r.attempt);
    if !lh_domain::spot::recovers(attempt, policy.max_retries) {
        return None;
    }
    let first_lease_id = original
        .recovery_of
        .as_ref()
        .map_or(lease.id, |r| r.first_lease_id);
    Some(LeaseRequested {
        lease_id: recovered_id(lease.id),
        idempotency_key: None,
        recovery_of: Some(RecoveryOf {
            lease_id: lease.id,
            first_lease_id,
            attempt: attempt + 1,
            zone: lease.zone.clone().unwrap_or_default(),
        }),
        ..original.clone()
    })
}

/// The id of the lease that recovers `preempted`.
pub fn recovered_id(preempted: Uuid) -> Uuid {
    derived_id(&["lease.recovery", &preempted.to_string()])
}
