//! A tenant's prepaid balance, as pricing answers it on
//! [`RPC_PRICING_BALANCE`] from its charges fold.

use std::time::Duration;

use lh_bus::Bus;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

pub use lh_events::subject::RPC_PRICING_BALANCE;

/// Largest single top-up, CNY.
pub const MAX_TOP_UP_CNY: Decimal = Decimal::from_parts(10_000_000, 0, 0, false, 0);

/// Request on [`RPC_PRICING_BALANCE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalanceRequest {
    pub tenant_id: Uuid,
}

/// Where a tenant's balance stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BalanceState {
    /// Covers at least the warning time (or nothing is running).
    #[default]
    Ok,
    /// Covers less than the warning time: `balance.low` was published.
    Low,
    /// At zero or below: leases stopped, new ones refused.
    Exhausted,
}

/// A tenant's balance. Amounts are CNY, as strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Balance {
    pub tenant_id: Uuid,
    /// False for a tenant never topped up: postpaid, invoiced, never
    /// stopped; the amounts below are then zero.
    pub prepaid: bool,
    pub state: BalanceState,
    /// `topped_up - charged + credited - unbilled`.
    #[schema(value_type = String)]
    pub balance: Decimal,
    #[schema(value_type = String)]
    pub topped_up: Decimal,
    /// Charges in the log since the first top-up.
    #[schema(value_type = String)]
    pub charged: Decimal,
    /// SLA credits granted since the first top-up.
    #[schema(value_type = String)]
    pub credited: Decimal,
    /// What the tenant's leases cost since their last charge.
    #[schema(value_type = String)]
    pub unbilled: Decimal,
    /// What the tenant's running leases cost per hour now.
    #[schema(value_type = String)]
    pub burn_rate_cny_per_hour: Decimal,
    /// How long the balance lasts at that rate; absent when nothing runs.
    pub covers_seconds: Option<u64>,
}

/// Asks pricing for a tenant's balance.
pub async fn get(
    bus: &Bus,
    request: &BalanceRequest,
    timeout: Duration,
) -> lh_bus::Result<Balance> {
    lh_bus::rpc::call(bus, RPC_PRICING_BALANCE, request, timeout).await
}
