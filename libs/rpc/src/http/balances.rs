//! A tenant's prepaid balance (`/v1/tenants/{id}/balance`): a top-up asked
//! for and as stored. The balance itself is pricing's answer,
//! [`crate::balance::Balance`].

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// A top-up.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTopUp {
    /// CNY, a string, above zero and at most 10 000 000, at most 2 places.
    #[schema(value_type = String)]
    pub amount: Decimal,
}

/// A top-up as stored.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TopUp {
    pub top_up_id: Uuid,
    pub tenant_id: Uuid,
    #[schema(value_type = String)]
    pub amount: Decimal,
    pub currency: String,
}
