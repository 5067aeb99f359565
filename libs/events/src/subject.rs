//! Subject names: one subject per aggregate instance.
//!
//! Business events live under `lh.evt.>` on the `LH_EVENTS` stream; heartbeats
//! and usage samples under `lh.tel.>` on `LH_TELEMETRY`. Request/reply between
//! services (never stored) uses `lh.rpc.>`.

use uuid::Uuid;

pub const EVENTS_STREAM: &str = "LH_EVENTS";
pub const EVENTS_ALL: &str = "lh.evt.>";
pub const TELEMETRY_STREAM: &str = "LH_TELEMETRY";
pub const TELEMETRY_ALL: &str = "lh.tel.>";

pub const LEASES_ALL: &str = "lh.evt.lease.>";
pub const NODES_ALL: &str = "lh.evt.node.>";
pub const TENANTS_ALL: &str = "lh.evt.tenant.>";
pub const CHARGES_ALL: &str = "lh.evt.charge.>";
pub const SPOT_ALL: &str = "lh.evt.spot.>";
pub const PRICE_BOOKS_ALL: &str = "lh.evt.price_book.>";
pub const AUDIT_ALL: &str = "lh.evt.audit.>";

/// Request/reply subject on which the audit service answers chain verification.
pub const RPC_AUDIT_VERIFY: &str = "lh.rpc.audit.verify";
/// Request/reply subject on which pricing answers invoice requests.
pub const RPC_PRICING_INVOICE: &str = "lh.rpc.pricing.invoice";

pub fn lease(lease_id: Uuid) -> String {
    format!("lh.evt.lease.{lease_id}")
}

pub fn tenant(tenant_id: Uuid) -> String {
    format!("lh.evt.tenant.{tenant_id}")
}

pub fn node(node_id: &str) -> String {
    format!("lh.evt.node.{}", token(node_id))
}

pub fn charge(lease_id: Uuid) -> String {
    format!("lh.evt.charge.{lease_id}")
}

pub fn spot(zone: &str, gpu_model: &str) -> String {
    format!("lh.evt.spot.{}.{}", token(zone), token(gpu_model))
}

pub fn price_book() -> String {
    "lh.evt.price_book.default".to_string()
}

pub fn audit() -> String {
    "lh.evt.audit.chain".to_string()
}

/// Every node's heartbeats.
pub const HEARTBEATS_ALL: &str = "lh.tel.heartbeat.*";

pub fn heartbeat(node_id: &str) -> String {
    format!("lh.tel.heartbeat.{}", token(node_id))
}

/// Every lease's usage samples.
pub const USAGE_ALL: &str = "lh.tel.usage.*";

pub fn usage(lease_id: Uuid) -> String {
    format!("lh.tel.usage.{lease_id}")
}

/// Makes a name safe as one subject token: NATS reserves `.`, `*`, `>` and
/// whitespace, so those become `_`.
pub fn token(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '.' | '*' | '>' => '_',
            c if c.is_whitespace() => '_',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_wildcard_covers_its_builder() {
        let id = uuid::Uuid::nil();
        for (all, one) in [
            (LEASES_ALL, lease(id)),
            (NODES_ALL, node("n1")),
            (TENANTS_ALL, tenant(id)),
            (CHARGES_ALL, charge(id)),
            (SPOT_ALL, spot("z", "m")),
            (PRICE_BOOKS_ALL, price_book()),
            (AUDIT_ALL, audit()),
        ] {
            let prefix = all.strip_suffix('>').unwrap();
            assert!(one.starts_with(prefix), "{one} is not under {all}");
            assert!(one.starts_with(EVENTS_ALL.strip_suffix('>').unwrap()));
        }
    }

    #[test]
    fn tokens_never_split_subjects() {
        assert_eq!(
            super::spot("cn-north.1", "A100 40GB"),
            "lh.evt.spot.cn-north_1.A100_40GB"
        );
    }
}
