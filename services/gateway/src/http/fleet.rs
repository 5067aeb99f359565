//! `GET /v1/nodes`, `GET /v1/nodes/{id}` and `GET /v1/gpus`: the fleet as
//! the scheduler folds it (`lh_rpc::fleet`), whole for operators, and as a
//! catalogue of what may be rented, with prices, for everyone.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::Json;
use chrono::Utc;
use lh_events::{GpuHealth, PriceBookPublished, Tier};
use lh_rpc::fleet::{FleetRequest, FleetView, NodeState, NodeView, MAX_NODE_ID_LEN};
use lh_rpc::http::nodes::{GpuCatalogue, GpuOffer, TierOffer};
use lh_rpc::spot::{SpotMarketView, SpotPricesRequest};
use rust_decimal::Decimal;

use super::{ApiContext, ApiError, Caller, RPC_TIMEOUT};

/// The tiers a catalogue prices, in the order it lists them.
const CATALOGUE_TIERS: [Tier; 3] = [Tier::Basic, Tier::Performance, Tier::Spot];

async fn fleet_of(ctx: &ApiContext, node_id: Option<String>) -> Result<FleetView, ApiError> {
    lh_rpc::fleet::call(&ctx.bus, &FleetRequest { node_id }, RPC_TIMEOUT)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "the scheduler does not answer for the fleet");
            ApiError::unavailable("the fleet is not known now: the scheduler does not answer")
        })
}

#[utoipa::path(
    get, path = "/v1/nodes",
    responses(
        (status = 200, body = FleetView), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn list(
    State(ctx): State<ApiContext>,
    caller: Caller,
) -> Result<Json<FleetView>, ApiError> {
    caller.require_admin()?;
    Ok(Json(fleet_of(&ctx, None).await?))
}

#[utoipa::path(
    get, path = "/v1/nodes/{id}", params(("id" = String, Path)),
    responses(
        (status = 200, body = NodeView), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 404, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn get(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(node_id): Path<String>,
) -> Result<Json<NodeView>, ApiError> {
    caller.require_admin()?;
    if node_id.is_empty() || node_id.len() > MAX_NODE_ID_LEN {
        return Err(ApiError::unprocessable(
            format!("a node id is 1 to {MAX_NODE_ID_LEN} bytes"),
            "id",
        ));
    }
    let fleet = fleet_of(&ctx, Some(node_id.clone())).await?;
    fleet
        .nodes
        .into_iter()
        .find(|n| n.id == node_id)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no node {node_id}")).field("id"))
}

#[utoipa::path(
    get, path = "/v1/gpus",
    responses(
        (status = 200, body = GpuCatalogue), (status = 401, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn catalogue(
    State(ctx): State<ApiContext>,
    _caller: Caller,
) -> Result<Json<GpuCatalogue>, ApiError> {
    let now_only = SpotPricesRequest {
        history: Some(0),
        ..Default::default()
    };
    let (fleet, books, spot) = tokio::join!(
        fleet_of(&ctx, None),
        lh_rpc::price_book::list(&ctx.bus, RPC_TIMEOUT),
        lh_rpc::spot::call(&ctx.bus, &now_only, RPC_TIMEOUT),
    );
    let fleet = fleet?;
    // Without pricing or the spot market the GPUs are still shown, their
    // prices left out.
    let book = books
        .map_err(
            |e| tracing::warn!(error = %e, "pricing does not answer: GPUs listed without prices"),
        )
        .ok()
        .and_then(|books| book_in_force(books.books, Utc::now()));
    let spot = spot
        .map_err(|e| tracing::warn!(error = %e, "the spot market does not answer: GPUs listed without spot prices"))
        .map(|s| s.markets)
        .unwrap_or_default();
    Ok(Json(offers(&fleet, book.as_ref(), &spot)))
}

/// The newest version in force at `now`.
fn book_in_force(
    books: Vec<PriceBookPublished>,
    now: chrono::DateTime<Utc>,
) -> Option<PriceBookPublished> {
    books
        .into_iter()
        .filter(|b| b.effective_from <= now)
        .max_by_key(|b| (b.effective_from, b.version))
}

/// What `fleet` offers by model and zone, priced by `book` and the `spot`
/// market: GPUs on nodes that take leases, free when healthy and held by
/// no lease.
pub fn offers(
    fleet: &FleetView,
    book: Option<&PriceBookPublished>,
    spot: &[SpotMarketView],
) -> GpuCatalogue {
    let mut by: BTreeMap<(String, String), GpuOffer> = BTreeMap::new();
    for node in fleet.nodes.iter().filter(|n| n.state == NodeState::Ready) {
        for gpu in &node.gpus {
            let offer = by
                .entry((gpu.model.clone(), node.zone.clone()))
                .or_insert_with(|| GpuOffer {
                    gpu_model: gpu.model.clone(),
                    vram_gb: gpu.vram_gb,
                    zone: node.zone.clone(),
                    gpus_total: 0,
                    gpus_free: 0,
                    free_milli: 0,
                    mig_gpus: 0,
                    prices: Vec::new(),
                    spot_cny_per_gpu_hour: None,
                });
            offer.gpus_total += 1;
            if gpu.mig {
                offer.mig_gpus += 1;
            }
            if gpu.health != GpuHealth::Healthy {
                continue;
            }
            if gpu.used_milli == 0 && gpu.held_by.is_none() && gpu.shares.is_empty() {
                offer.gpus_free += 1;
            }
            if !gpu.mig {
                offer.free_milli += u64::from(1000u32.saturating_sub(gpu.used_milli));
            }
        }
    }
    for offer in by.values_mut() {
        let per_gpu = Decimal::from(offer.vram_gb);
        if let Some(book) = book {
            offer.prices = CATALOGUE_TIERS
                .iter()
                .filter_map(|&tier| {
                    let unit = lh_domain::rating::unit_price(book, tier)?;
                    Some(TierOffer {
                        tier,
                        cny_per_gpu_hour: (unit * per_gpu).round_dp(4).normalize(),
                    })
                })
                .collect();
        }
        offer.spot_cny_per_gpu_hour = spot
            .iter()
            .find(|m| m.zone == offer.zone && m.gpu_model == offer.gpu_model)
            .map(|m| {
                (m.current.price_cny_per_gb_hour * per_gpu)
                    .round_dp(4)
                    .normalize()
            });
    }
    GpuCatalogue {
        as_of: fleet.as_of,
        offers: by.into_values().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_rpc::fleet::{GpuView, ShareView};
    use lh_rpc::spot::SpotPricePoint;
    use uuid::Uuid;

    fn gpu(index: u32, model: &str) -> GpuView {
        GpuView {
            index,
            uuid: format!("GPU-{index}"),
            model: model.into(),
            vram_gb: 40,
            health: GpuHealth::Healthy,
            health_since: None,
            mig: false,
            held_by: None,
            shares: Vec::new(),
            used_milli: 0,
            used_vram_gb: 0,
            utilization_pct: None,
            memory_used_mib: None,
            temperature_c: None,
        }
    }

    fn node(id: &str, zone: &str, state: NodeState, gpus: Vec<GpuView>) -> NodeView {
        NodeView {
            id: id.into(),
            zone: zone.into(),
            state,
            drain_mode: None,
            lost_since: None,
            last_heartbeat_at: None,
            isolation: Default::default(),
            gpu_sharing: Default::default(),
            fabric: None,
            gpus,
        }
    }

    #[test]
    fn free_gpus_and_shares_are_counted_on_nodes_that_take_leases_and_priced_per_gpu() {
        let mut held = gpu(1, "A100-40GB");
        held.held_by = Some(Uuid::from_u128(1));
        held.used_milli = 1000;
        let mut shared = gpu(2, "A100-40GB");
        shared.shares = vec![ShareView {
            lease_id: Uuid::from_u128(2),
            milli: 250,
            vram_gb: 10,
            mig_profile: None,
        }];
        shared.used_milli = 250;
        let mut sick = gpu(3, "A100-40GB");
        sick.health = GpuHealth::Unhealthy;
        let mut mig = gpu(4, "A100-40GB");
        mig.mig = true;
        let fleet = FleetView {
            as_of: None,
            nodes: vec![
                node(
                    "a",
                    "z1",
                    NodeState::Ready,
                    vec![gpu(0, "A100-40GB"), held, shared, sick, mig],
                ),
                node("b", "z1", NodeState::Draining, vec![gpu(0, "A100-40GB")]),
                node("c", "z2", NodeState::Lost, vec![gpu(0, "H100-80GB")]),
            ],
        };
        let book = lh_domain::rating::default_price_book(Utc::now());
        let spot = vec![SpotMarketView {
            zone: "z1".into(),
            region: "r".into(),
            gpu_model: "A100-40GB".into(),
            current: SpotPricePoint {
                price_cny_per_gb_hour: Decimal::new(5, 2),
                utilisation: Decimal::ZERO,
                at: Utc::now(),
            },
            gpus_total: 5,
            gpus_used: 2,
            history: Vec::new(),
        }];
        let catalogue = offers(&fleet, Some(&book), &spot);
        assert_eq!(
            catalogue.offers.len(),
            1,
            "draining and lost nodes offer nothing"
        );
        let offer = &catalogue.offers[0];
        assert_eq!(
            (offer.gpus_total, offer.gpus_free, offer.mig_gpus),
            (5, 2, 1)
        );
        // The free GPU and three quarters of the shared one.
        assert_eq!(offer.free_milli, 1750);
        let basic = offer.prices.iter().find(|p| p.tier == Tier::Basic).unwrap();
        let unit = lh_domain::rating::unit_price(&book, Tier::Basic).unwrap();
        assert_eq!(
            basic.cny_per_gpu_hour,
            (unit * Decimal::from(40)).round_dp(4).normalize()
        );
        assert_eq!(offer.spot_cny_per_gpu_hour, Some(Decimal::from(2)));
        // Without pricing, the GPUs are there without prices.
        let unpriced = offers(&fleet, None, &[]);
        assert!(unpriced.offers[0].prices.is_empty());
        assert_eq!(unpriced.offers[0].spot_cny_per_gpu_hour, None);
    }

    #[test]
    fn the_book_in_force_is_the_newest_that_has_begun() {
        let now = Utc::now();
        let mut old = lh_domain::rating::default_price_book(now - chrono::Duration::days(2));
        old.version = 1;
        let mut current = old.clone();
        current.version = 2;
        current.effective_from = now - chrono::Duration::days(1);
        let mut future = old.clone();
        future.version = 3;
        future.effective_from = now + chrono::Duration::days(1);
        let chosen = book_in_force(vec![old, future, current], now).unwrap();
        assert_eq!(chosen.version, 2);
    }
}
