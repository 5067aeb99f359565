//! The quote RPC: prices a request for a duration on the book in force
//! now and publishes it as `quote.issued`, valid for a configured time. A
//! lease asked for with the quote (`lease.requested.quote_id`) is billed on
//! the quote's book version: the charges fold reads the version from the
//! quote when it folds the lease's request.

use chrono::{DateTime, Utc};
use lh_bus::{Bus, BusError, Expect};
use lh_domain::rating::{self, Interval, PricePoint};
use lh_events::{Actor, ChargeModel, Envelope, EventData, PriceBookPublished, QuoteIssued, Tier};
use lh_rpc::quote::{GetRequest, QuoteReply, QuoteRequest, MAX_QUOTE_DURATION_SECS};
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::charges::{book_in_force, tier_pricing};
use crate::shelf::SharedPricingShelf;
use crate::SERVICE;

/// Places of a quote's unit price.
const UNIT_PRICE_SCALE: u32 = 6;

/// Why a request is refused: the field at fault and what is wrong.
pub type Refusal = (String, String);

fn refused(field: &str, detail: impl Into<String>) -> Refusal {
    (field.into(), detail.into())
}

/// The quote `request` gets on `book` at `now`, or why not. Spot is priced
/// at the cheapest market price in force now for the model (the book's spot
/// price where no market has one yet), and says it moves.
pub fn price(
    request: &QuoteRequest,
    book: &PriceBookPublished,
    spot_prices: &std::collections::HashMap<(String, String), Decimal>,
    now: DateTime<Utc>,
    valid_secs: u64,
    quote_id: Uuid,
) -> Result<QuoteIssued, Refusal> {
    let ask = lh_domain::lease::checked_ask(
        request.gpus,
        request.fraction,
        request.mig_profile.clone(),
        &request.gpu_model,
    )
    .map_err(|e| refused(&e.field, e.detail))?;
    if !(1..=MAX_QUOTE_DURATION_SECS).contains(&request.duration_seconds) {
        return Err(refused(
            "duration_seconds",
            format!("a quote is for 1 to {MAX_QUOTE_DURATION_SECS} seconds"),
        ));
    }
    let vram_gb = lh_domain::catalog::footprint(&request.gpu_model, &ask).vram_gb;
    // A `reserved` lease its reservation does not cover is billed as basic.
    let priced_as = match request.tier {
        Tier::Reserved => Tier::Basic,
        other => other,
    };
    let (model, headline) = tier_pricing(book, priced_as).map_err(|why| refused("tier", why))?;
    let market_now = spot_prices
        .iter()
        .filter(|((_, model), _)| *model == request.gpu_model)
        .map(|(_, price)| *price)
        .min()
        .unwrap_or(headline);
    let market = [PricePoint {
        at: DateTime::<Utc>::MIN_UTC,
        price_cny_per_gb_hour: market_now,
    }];
    let duration =
        chrono::Duration::seconds(i64::try_from(request.duration_seconds).expect("bounded above"));
    let run = [Interval {
        start: now,
        end: now + duration,
    }];
    let cost = rating::cumulative_cost(&model, &market, vram_gb, &run, now + duration);
    let unit_price = (cost.exact_cny() * Decimal::from(3600)
        / (Decimal::from(vram_gb.max(1)) * Decimal::from(request.duration_seconds)))
    .round_dp(UNIT_PRICE_SCALE)
    .normalize();
    let (fraction, mig_profile) = match &ask {
        lh_events::GpuAsk::Whole(_) => (None, None),
        lh_events::GpuAsk::Fraction(f) => (Some(*f), None),
        lh_events::GpuAsk::Mig(p) => (None, Some(p.clone())),
    };
    Ok(QuoteIssued {
        quote_id,
        tenant_id: request.tenant_id,
        gpu_model: request.gpu_model.clone(),
        tier: request.tier,
        gpus: ask.gpus(),
        fraction,
        mig_profile,
        vram_gb,
        duration_seconds: request.duration_seconds,
        price_book_version: book.version,
        amount: cost.rounded_cny(),
        unit_price_cny_per_gb_hour: unit_price,
        currency: book.currency.clone(),
        expires_at: now
            + chrono::Duration::seconds(i64::try_from(valid_secs).unwrap_or(i64::MAX / 1000)),
        price_moves: matches!(model, ChargeModel::Market),
    })
}

/// Prices `request` on the book in force and publishes the quote.
pub async fn issue(
    bus: &Bus,
    shelf: &SharedPricingShelf,
    request: QuoteRequest,
    now: DateTime<Utc>,
    valid_secs: u64,
) -> Result<QuoteReply, String> {
    let priced = {
        let shelf = shelf.read().expect("shelf lock");
        let Some(book) = book_in_force(&shelf.books, now) else {
            return Err("no price book yet; retry shortly".into());
        };
        price(
            &request,
            book,
            &shelf.spot_prices,
            now,
            valid_secs,
            Uuid::now_v7(),
        )
    };
    let quote = match priced {
        Ok(quote) => quote,
        Err((field, detail)) => return Ok(QuoteReply::Refused { field, detail }),
    };
    tracing::info!(quote_id = %quote.quote_id, tenant_id = %quote.tenant_id,
        version = quote.price_book_version, amount = %quote.amount, "issuing a quote");
    let envelope = Envelope::new(
        Actor::Service(SERVICE.into()),
        now,
        EventData::QuoteIssued(quote.clone()),
    )
    .with_id(quote.quote_id);
    match bus.publish(&envelope, Expect::LastSubjectSequence(0)).await {
        Ok(_) => Ok(QuoteReply::Issued { quote }),
        Err(BusError::Conflict(e)) => Err(format!("quote id taken: {e}")),
        Err(e) => {
            tracing::warn!(error = %e, "cannot issue a quote");
            Err("the event log is out of reach; retry shortly".into())
        }
    }
}

/// A quote the fold holds.
pub fn get(shelf: &SharedPricingShelf, request: GetRequest) -> Option<QuoteIssued> {
    shelf
        .read()
        .expect("shelf lock")
        .quotes
        .get(&request.quote_id)
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(tier: Tier, seconds: u64) -> QuoteRequest {
        QuoteRequest {
            tenant_id: Uuid::from_u128(1),
            gpus: Some(2),
            fraction: None,
            mig_profile: None,
            gpu_model: lh_events::fixtures::MODEL.into(),
            tier,
            duration_seconds: seconds,
        }
    }

    #[test]
    fn a_quote_prices_the_duration_on_the_book_and_spot_says_it_moves() {
        let now = Utc::now();
        let book = rating::default_price_book(now);
        let none = Default::default();
        // 80 GB at 0.5 CNY/GB-h for 90 minutes.
        let q = price(
            &request(Tier::Basic, 5400),
            &book,
            &none,
            now,
            900,
            Uuid::nil(),
        )
        .unwrap();
        assert_eq!(q.amount.to_string(), "60.00");
        assert_eq!(q.vram_gb, 80);
        assert_eq!(q.price_book_version, book.version);
        assert_eq!(q.expires_at, now + chrono::Duration::seconds(900));
        assert!(!q.price_moves);

        let mut market = std::collections::HashMap::new();
        market.insert(
            ("z1".to_string(), lh_events::fixtures::MODEL.to_string()),
            Decimal::new(3, 1),
        );
        market.insert(
            ("z2".to_string(), lh_events::fixtures::MODEL.to_string()),
            Decimal::new(25, 2),
        );
        market.insert(("z3".to_string(), "other".to_string()), Decimal::new(1, 2));
        let spot = price(
            &request(Tier::Spot, 3600),
            &book,
            &market,
            now,
            900,
            Uuid::nil(),
        )
        .unwrap();
        // The cheapest zone's price for the model: 80 GB x 0.25.
        assert_eq!(spot.amount.to_string(), "20.00");
        assert!(spot.price_moves);
    }

    #[test]
    fn a_quote_is_refused_naming_the_field() {
        let now = Utc::now();
        let book = rating::default_price_book(now);
        let none = Default::default();
        let field = |r: &QuoteRequest| match price(r, &book, &none, now, 900, Uuid::nil()) {
            Err((field, _)) => field,
            other => panic!("not refused: {other:?}"),
        };
        assert_eq!(field(&request(Tier::Basic, 0)), "duration_seconds");
        assert_eq!(
            field(&request(Tier::Basic, MAX_QUOTE_DURATION_SECS + 1)),
            "duration_seconds"
        );
        let mut unknown = request(Tier::Basic, 60);
        unknown.gpu_model = "Z9000".into();
        assert_eq!(field(&unknown), "gpu_model");
        let mut neither = request(Tier::Basic, 60);
        neither.gpus = None;
        assert_eq!(field(&neither), "gpus");
    }
}
