//! Prepaid balances: what pricing decides of a tenant's top-ups.
//!
//! A tenant is prepaid from its first `balance.topped_up` on; one never
//! topped up is postpaid (invoiced, never stopped), so the tenants that
//! existed before balances keep working. The balance is
//! `top-ups - charges + SLA credits - unbilled`, where charges (storage's
//! too) and credits count from the first top-up (what came before is on
//! the postpaid invoices) and `unbilled` is what the tenant's leases cost since their
//! last charge: a charge is written up to an hour and the accrual grace
//! after the time it bills, and a balance read from charges alone would
//! let a tenant run that long on nothing. Credit and debit notes are not
//! counted: they re-document charges already in the log.
//!
//! The charges fold ([`crate::charges::ChargingState`]) folds the balances beside
//! the leases it prices, and each pass of its decide loop turns each
//! prepaid tenant's balance into at most one event on
//! `lh.evt.balance.<tenant_id>`, guarded by the last sequence it read
//! there (a top-up in between makes it decide again):
//!
//! * `balance.low` once the balance covers less than the warning time at
//!   the rate the running leases cost now,
//! * `balance.exhausted` at zero or below, with a `lease.stop_requested`
//!   (caused by it) for each running lease; the gateway then refuses the
//!   tenant's new leases,
//! * `balance.restored` once a top-up brings an exhausted balance above zero.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use lh_bus::{Expect, MAX_BATCH_MESSAGES};
use lh_events::{
    derived_id, Actor, BalanceExhausted, BalanceLow, BalanceRestored, Envelope, EventData,
    LeaseStopRequested,
};
use lh_rpc::balance::{Balance, BalanceState};
use lh_service::decider::Batch;
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::SERVICE;

/// How long, by default, a balance must last at the current burn rate
/// before `balance.low` is published: an hour.
pub const DEFAULT_BALANCE_WARN_SECS: u64 = 3600;
/// Longest warning time a configuration may ask for: 30 days.
pub const MAX_BALANCE_WARN_SECS: u64 = 30 * 24 * 3600;
/// Longest time a balance is said to cover: a century, past which the
/// number means "indefinitely".
const MAX_COVERS_SECONDS: u64 = 100 * 365 * 24 * 3600;

/// What a tenant's leases cost beyond their charges, and per hour now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunningCost {
    pub unbilled: Decimal,
    pub burn_rate_cny_per_hour: Decimal,
    /// The tenant's leases running now, sorted.
    pub running: Vec<Uuid>,
    /// Those of them no one has asked to stop yet.
    pub not_stopping: Vec<Uuid>,
}

/// One prepaid tenant's balance as the log says.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct TenantBalance {
    pub topped_up: Decimal,
    pub charged: Decimal,
    pub credited: Decimal,
    pub state: BalanceState,
    /// Stream sequence of the last event on the tenant's balance subject.
    pub sequence: u64,
}

/// Every prepaid tenant's balance.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Balances {
    tenants: HashMap<Uuid, TenantBalance>,
}

impl Balances {
    /// Folds an event of the log that moves a balance.
    pub fn apply(&mut self, sequence: u64, data: &EventData) {
        match data {
            EventData::BalanceToppedUp(e) => {
                let b = self.tenants.entry(e.tenant_id).or_default();
                b.topped_up += e.amount;
                b.sequence = b.sequence.max(sequence);
                // A new top-up warns afresh when the balance falls again.
                if b.state == BalanceState::Low {
                    b.state = BalanceState::Ok;
                }
            }
            EventData::BalanceLow(e) => self.moved(e.tenant_id, sequence, BalanceState::Low),
            EventData::BalanceExhausted(e) => {
                self.moved(e.tenant_id, sequence, BalanceState::Exhausted)
            }
            EventData::BalanceRestored(e) => self.moved(e.tenant_id, sequence, BalanceState::Ok),
            EventData::ChargeAccrued(c) => {
                if let Some(b) = self.tenants.get_mut(&c.tenant_id) {
                    b.charged += c.amount;
                }
            }
            EventData::StorageChargeAccrued(c) => {
                if let Some(b) = self.tenants.get_mut(&c.tenant_id) {
                    b.charged += c.amount;
                }
            }
            EventData::CreditGranted(c) => {
                if let Some(b) = self.tenants.get_mut(&c.tenant_id) {
                    b.credited += c.amount;
                }
            }
            _ => {}
        }
    }

    fn moved(&mut self, tenant_id: Uuid, sequence: u64, state: BalanceState) {
        if let Some(b) = self.tenants.get_mut(&tenant_id) {
            b.state = state;
            b.sequence = b.sequence.max(sequence);
        }
    }

    /// The prepaid tenants, sorted.
    pub fn tenants(&self) -> Vec<Uuid> {
        let mut ids: Vec<Uuid> = self.tenants.keys().copied().collect();
        ids.sort();
        ids
    }

    pub fn get(&self, tenant_id: Uuid) -> Option<&TenantBalance> {
        self.tenants.get(&tenant_id)
    }
}

/// How long `balance` lasts at `burn_rate_cny_per_hour`, in whole seconds;
/// `None` when nothing burns it. Zero once it is spent.
pub fn covers_seconds(balance: Decimal, burn_rate_cny_per_hour: Decimal) -> Option<u64> {
    if burn_rate_cny_per_hour <= Decimal::ZERO {
        return None;
    }
    if balance <= Decimal::ZERO {
        return Some(0);
    }
    let seconds = (balance * Decimal::from(3600) / burn_rate_cny_per_hour).floor();
    Some(
        u64::try_from(seconds)
            .unwrap_or(MAX_COVERS_SECONDS)
            .min(MAX_COVERS_SECONDS),
    )
}

/// What a balance calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Low { covers_seconds: u64 },
    Exhausted,
    Restored,
}

/// The event a balance in `state` calls for now, if any.
pub fn verdict(
    state: BalanceState,
    balance: Decimal,
    burn_rate_cny_per_hour: Decimal,
    warn_secs: u64,
) -> Option<Verdict> {
    if balance <= Decimal::ZERO {
        return (state != BalanceState::Exhausted).then_some(Verdict::Exhausted);
    }
    if state == BalanceState::Exhausted {
        return Some(Verdict::Restored);
    }
    let covers = covers_seconds(balance, burn_rate_cny_per_hour)?;
    (state == BalanceState::Ok && covers < warn_secs).then_some(Verdict::Low {
        covers_seconds: covers,
    })
}

/// A tenant's balance, as answered to the gateway.
pub fn view(tenant_id: Uuid, b: &TenantBalance, cost: &RunningCost) -> Balance {
    let mut balance = b.topped_up - b.charged + b.credited - cost.unbilled;
    balance.rescale(lh_domain::rating::AMOUNT_SCALE);
    Balance {
        tenant_id,
        prepaid: true,
        state: b.state,
        balance,
        topped_up: b.topped_up,
        charged: b.charged,
        credited: b.credited,
        unbilled: cost.unbilled,
        burn_rate_cny_per_hour: cost.burn_rate_cny_per_hour.round_dp(6).normalize(),
        covers_seconds: covers_seconds(balance, cost.burn_rate_cny_per_hour),
    }
}

/// A tenant never topped up, with nothing open: postpaid.
pub fn postpaid(tenant_id: Uuid) -> Balance {
    postpaid_running(tenant_id, &RunningCost::default())
}

/// A tenant never topped up, with leases open: postpaid, invoiced monthly,
/// with what its leases cost beyond their charges and per hour now.
pub fn postpaid_running(tenant_id: Uuid, cost: &RunningCost) -> Balance {
    Balance {
        tenant_id,
        prepaid: false,
        state: BalanceState::Ok,
        balance: Decimal::ZERO,
        topped_up: Decimal::ZERO,
        charged: Decimal::ZERO,
        credited: Decimal::ZERO,
        unbilled: cost.unbilled,
        burn_rate_cny_per_hour: cost.burn_rate_cny_per_hour.round_dp(6).normalize(),
        covers_seconds: None,
    }
}

fn service_event(now: DateTime<Utc>, data: EventData, id_parts: &[&str]) -> Envelope {
    Envelope::new(Actor::Service(SERVICE.into()), now, data).with_id(derived_id(id_parts))
}

/// The writes a prepaid tenant's balance calls for at `now`: at most one
/// balance event, guarded by the tenant's balance subject, and the stop
/// requests of an exhausted balance (each derived from the lease and that
/// subject's sequence, so a pass repeated before the log answers adds
/// nothing).
pub fn decisions(
    tenant_id: Uuid,
    b: &TenantBalance,
    cost: &RunningCost,
    warn_secs: u64,
    now: DateTime<Utc>,
) -> Vec<Batch> {
    let seen = view(tenant_id, b, cost);
    let (tenant, sequence) = (tenant_id.to_string(), b.sequence.to_string());
    let stop = |lease_id: Uuid, cause: &Envelope| {
        let id = lease_id.to_string();
        (
            service_event(
                now,
                EventData::LeaseStopRequested(LeaseStopRequested { lease_id }),
                &["balance.stop", &id, &tenant, &sequence],
            )
            .caused_by(cause),
            Expect::Any,
        )
    };
    let guard = Expect::LastSubjectSequence(b.sequence);
    match verdict(
        b.state,
        seen.balance,
        cost.burn_rate_cny_per_hour,
        warn_secs,
    ) {
        Some(Verdict::Exhausted) => {
            // The rest, if any, are stopped on the next passes.
            let stopped: Vec<Uuid> = cost
                .not_stopping
                .iter()
                .copied()
                .take(MAX_BATCH_MESSAGES - 1)
                .collect();
            tracing::warn!(%tenant_id, balance = %seen.balance, leases = stopped.len(),
                "prepaid balance exhausted; stopping the tenant's leases");
            let exhausted = service_event(
                now,
                EventData::BalanceExhausted(BalanceExhausted {
                    tenant_id,
                    balance: seen.balance,
                    stopped_leases: stopped.clone(),
                }),
                &["balance.exhausted", &tenant, &sequence],
            );
            let mut batch = vec![(exhausted.clone(), guard)];
            batch.extend(stopped.into_iter().map(|l| stop(l, &exhausted)));
            vec![batch]
        }
        // Leases that started after the balance ran out (placed before the
        // gateway heard of it) are stopped too.
        None if b.state == BalanceState::Exhausted && !cost.not_stopping.is_empty() => {
            let cause = service_event(
                now,
                EventData::BalanceExhausted(BalanceExhausted {
                    tenant_id,
                    balance: seen.balance,
                    stopped_leases: Vec::new(),
                }),
                &["balance.exhausted", &tenant, &sequence],
            );
            cost.not_stopping
                .chunks(MAX_BATCH_MESSAGES)
                .map(|chunk| chunk.iter().map(|l| stop(*l, &cause)).collect())
                .collect()
        }
        Some(Verdict::Restored) => vec![vec![(
            service_event(
                now,
                EventData::BalanceRestored(BalanceRestored {
                    tenant_id,
                    balance: seen.balance,
                }),
                &["balance.restored", &tenant, &sequence],
            ),
            guard,
        )]],
        Some(Verdict::Low { covers_seconds }) => vec![vec![(
            service_event(
                now,
                EventData::BalanceLow(BalanceLow {
                    tenant_id,
                    balance: seen.balance,
                    burn_rate_cny_per_hour: seen.burn_rate_cny_per_hour,
                    covers_seconds,
                    warn_seconds: warn_secs,
                }),
                &["balance.low", &tenant, &sequence],
            ),
            guard,
        )]],
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(amount: &str) -> Decimal {
        amount.parse().expect("a decimal")
    }

    #[test]
    fn a_balance_lasts_its_amount_over_the_hourly_rate() {
        assert_eq!(covers_seconds(dec("10"), dec("20")), Some(1800));
        assert_eq!(covers_seconds(dec("10.005"), dec("36")), Some(1000));
        assert_eq!(covers_seconds(dec("0"), dec("1")), Some(0));
        assert_eq!(covers_seconds(dec("-3"), dec("1")), Some(0));
        assert_eq!(covers_seconds(dec("5"), dec("0")), None);
        assert_eq!(
            covers_seconds(dec("1000000000000"), dec("0.000001")),
            Some(MAX_COVERS_SECONDS)
        );
    }

    #[test]
    fn the_warning_comes_once_before_exhaustion_and_a_top_up_restores() {
        use BalanceState::*;
        let warn = 3600;
        assert_eq!(verdict(Ok, dec("100"), dec("10"), warn), None);
        assert_eq!(
            verdict(Ok, dec("5"), dec("10"), warn),
            Some(Verdict::Low {
                covers_seconds: 1800
            })
        );
        assert_eq!(verdict(Low, dec("5"), dec("10"), warn), None);
        assert_eq!(
            verdict(Low, dec("0"), dec("10"), warn),
            Some(Verdict::Exhausted)
        );
        assert_eq!(
            verdict(Ok, dec("-1"), dec("0"), warn),
            Some(Verdict::Exhausted)
        );
        assert_eq!(verdict(Exhausted, dec("-1"), dec("10"), warn), None);
        assert_eq!(
            verdict(Exhausted, dec("0.01"), dec("10"), warn),
            Some(Verdict::Restored)
        );
        // Nothing running: a small balance lasts.
        assert_eq!(verdict(Ok, dec("0.01"), dec("0"), warn), None);
    }

    #[test]
    fn exhaustion_stops_every_running_lease_in_one_batch_guarded_by_the_balance() {
        let tenant = Uuid::from_u128(1);
        let leases = [Uuid::from_u128(2), Uuid::from_u128(3)];
        let b = TenantBalance {
            topped_up: dec("10"),
            charged: dec("9"),
            sequence: 42,
            ..TenantBalance::default()
        };
        let cost = RunningCost {
            unbilled: dec("1.5"),
            burn_rate_cny_per_hour: dec("4"),
            running: leases.to_vec(),
            not_stopping: leases.to_vec(),
        };
        let now = Utc::now();
        let batches = decisions(tenant, &b, &cost, 3600, now);
        assert_eq!(batches.len(), 1);
        let batch = &batches[0];
        assert_eq!(batch.len(), 3);
        let (first, expect) = &batch[0];
        assert!(matches!(expect, Expect::LastSubjectSequence(42)));
        let EventData::BalanceExhausted(e) = &first.data else {
            panic!("not balance.exhausted: {:?}", first.data);
        };
        assert_eq!(e.balance, dec("-0.50"));
        assert_eq!(e.stopped_leases, leases);
        for (stop, _) in &batch[1..] {
            assert!(matches!(stop.data, EventData::LeaseStopRequested(_)));
            assert_eq!(stop.causation_id, Some(first.id));
        }
        // The same pass again decides the same ids: nothing doubles.
        let again = decisions(tenant, &b, &cost, 3600, now);
        let ids = |b: &Vec<Batch>| b[0].iter().map(|(e, _)| e.id).collect::<Vec<_>>();
        assert_eq!(ids(&batches), ids(&again));
    }
}
