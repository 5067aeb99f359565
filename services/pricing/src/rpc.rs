//! The pricing RPCs, as one table of (subject, what it is, handler) served
//! over NATS request/reply in the [`QUEUE_GROUP`]: invoices, documents,
//! the cost report and the what-if read the projection; price books,
//! reservations, balances and quotes read the shelf the charges fold
//! keeps. Every row is served the same way by [`serve_all`], so an RPC is
//! added by adding a row.

use anyhow::Context as _;
use chrono::Utc;
use futures::future::BoxFuture;
use lh_bus::Bus;
use lh_rpc::charges::{ChargeStatementRequest, CHARGES_SUBJECT};
use lh_rpc::invoice_document::{DocumentRequest, ListRequest, DOCUMENT_SUBJECT, LIST_SUBJECT};
use serde::{de::DeserializeOwned, Serialize};
use sqlx::PgPool;

use std::time::{Duration, Instant};

use crate::shelf::SharedPricingShelf;
use crate::{balances, books, projection, quotes, reservations, QUEUE_GROUP};

/// What the RPC handlers answer from.
pub(crate) struct RpcSources<'a> {
    pub bus: &'a Bus,
    pub pool: &'a PgPool,
    pub shelf: &'a SharedPricingShelf,
    /// How long an issued quote holds, in seconds.
    pub quote_valid_secs: u64,
}

/// One RPC being served: what it is (for an error that ends it) and the
/// serving itself.
type Served<'a> = (&'static str, BoxFuture<'a, lh_bus::Result<()>>);

/// Serves `subject` with `handler`, each request given the sources.
fn answer<'a, Req, Resp, Fut>(
    sources: &'a RpcSources<'a>,
    subject: &'static str,
    what: &'static str,
    handler: impl Fn(&'a RpcSources<'a>, Req) -> Fut + Send + Sync + 'a,
) -> Served<'a>
where
    Req: DeserializeOwned + Send + 'a,
    Resp: Serialize + Send + 'a,
    Fut: std::future::Future<Output = Result<Resp, String>> + Send + 'a,
{
    let serving = lh_bus::rpc::serve(sources.bus, subject, QUEUE_GROUP, move |request| {
        handler(sources, request)
    });
    (what, Box::pin(serving))
}

/// Every pricing RPC: its subject, what it is, and how it answers.
fn table<'a>(s: &'a RpcSources<'a>) -> Vec<Served<'a>> {
    vec![
        answer(
            s,
            CHARGES_SUBJECT,
            "charge statement RPC",
            |s, request: ChargeStatementRequest| {
                let pool = s.pool.clone();
                async move { projection::read_charge_statement(&pool, &request).await }
            },
        ),
        answer(
            s,
            LIST_SUBJECT,
            "invoice list RPC",
            |s, request: ListRequest| {
                let pool = s.pool.clone();
                async move { projection::list_documents(&pool, &request).await }
            },
        ),
        answer(
            s,
            DOCUMENT_SUBJECT,
            "invoice document RPC",
            |s, request: DocumentRequest| {
                let pool = s.pool.clone();
                async move { projection::read_document(&pool, &request).await }
            },
        ),
        answer(
            s,
            lh_rpc::cost_report::SUBJECT,
            "cost report RPC",
            |s, request: lh_rpc::cost_report::CostReportRequest| {
                let pool = s.pool.clone();
                async move { projection::cost_report(&pool, &request).await }
            },
        ),
        answer(
            s,
            lh_rpc::what_if::RPC_PRICING_WHAT_IF,
            "what-if RPC",
            |s, request: lh_rpc::what_if::WhatIfRequest| {
                let pool = s.pool.clone();
                async move { projection::what_if(&pool, &request).await }
            },
        ),
        answer(
            s,
            lh_rpc::price_book::RPC_PRICING_PRICE_BOOKS,
            "price book list RPC",
            |s, request| {
                let books = books::list(s.shelf, request);
                async move { Ok::<_, String>(books) }
            },
        ),
        answer(
            s,
            lh_rpc::price_book::RPC_PRICING_PUBLISH_PRICE_BOOK,
            "price book publish RPC",
            |s, request| {
                let (bus, shelf) = (s.bus.clone(), s.shelf.clone());
                async move { books::publish(&bus, &shelf, request, Utc::now()).await }
            },
        ),
        answer(
            s,
            lh_rpc::reservation::RPC_PRICING_RESERVATIONS,
            "reservation list RPC",
            |s, request| {
                let reservations = reservations::list(s.shelf, request);
                async move { Ok::<_, String>(reservations) }
            },
        ),
        answer(
            s,
            lh_rpc::reservation::RPC_PRICING_COMMIT_RESERVATION,
            "reservation commit RPC",
            |s, request| {
                let bus = s.bus.clone();
                async move { reservations::commit(&bus, request, Utc::now()).await }
            },
        ),
        answer(
            s,
            lh_rpc::balance::RPC_PRICING_BALANCE,
            "balance RPC",
            |s, request: lh_rpc::balance::BalanceRequest| {
                let shelf = s.shelf.clone();
                async move {
                    Ok::<_, String>(balance_of(&shelf, request.tenant_id, Instant::now()).await)
                }
            },
        ),
        answer(
            s,
            lh_rpc::quote::RPC_PRICING_QUOTE,
            "quote RPC",
            |s, request| {
                let (bus, shelf) = (s.bus.clone(), s.shelf.clone());
                let valid_secs = s.quote_valid_secs;
                async move { quotes::issue(&bus, &shelf, request, Utc::now(), valid_secs).await }
            },
        ),
        answer(
            s,
            lh_rpc::quote::RPC_PRICING_QUOTE_GET,
            "quote lookup RPC",
            |s, request| {
                let quote = quotes::get(s.shelf, request);
                async move { Ok::<_, String>(quote) }
            },
        ),
    ]
}

/// How long a postpaid tenant stays watched after its balance was last
/// asked for: its running cost is reckoned at each pass meanwhile.
pub const WATCH_POSTPAID_SECS: u64 = 600;
/// Most postpaid tenants watched at once; past it, one more is answered
/// without its running cost until others' watch lapses.
pub const MAX_WATCHED_POSTPAID: usize = 10_000;
/// How long a caller waits for the running cost of a postpaid tenant that
/// no one asked about lately: the decide loop passes about once a second.
const FIRST_RUNNING_COST_WAIT: Duration = Duration::from_secs(3);

/// A tenant's balance: a prepaid one's as the last pass left it; a
/// postpaid one's running cost once it is watched, which the first ask
/// in a while starts and waits a pass for.
async fn balance_of(
    shelf: &SharedPricingShelf,
    tenant_id: uuid::Uuid,
    now: Instant,
) -> lh_rpc::balance::Balance {
    let published = {
        let mut shelf = shelf.write().expect("shelf lock");
        let watch = Duration::from_secs(WATCH_POSTPAID_SECS);
        shelf
            .watched_postpaid
            .retain(|_, asked| now.saturating_duration_since(*asked) < watch);
        let fresh = !shelf.watched_postpaid.contains_key(&tenant_id);
        if !fresh || shelf.watched_postpaid.len() < MAX_WATCHED_POSTPAID {
            shelf.watched_postpaid.insert(tenant_id, now);
        }
        match shelf.balances.get(&tenant_id) {
            Some(balance) => return balance.clone(),
            None if !fresh => return balances::postpaid(tenant_id),
            None => shelf.balances_published.clone(),
        }
    };
    let next_pass = published.notified();
    // Registered before the wait, so that a pass between here and there
    // is not missed: the shelf was read before it.
    tokio::pin!(next_pass);
    next_pass.as_mut().enable();
    let _ = tokio::time::timeout(FIRST_RUNNING_COST_WAIT, next_pass).await;
    shelf
        .read()
        .expect("shelf lock")
        .balances
        .get(&tenant_id)
        .cloned()
        .unwrap_or_else(|| balances::postpaid(tenant_id))
}

/// Serves every RPC of the table until one fails, which ends them all.
pub(crate) async fn serve_all(sources: &RpcSources<'_>) -> anyhow::Result<()> {
    let serving = table(sources)
        .into_iter()
        .map(|(what, serving)| async move { serving.await.context(what) });
    futures::future::try_join_all(serving).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_postpaid_tenant_is_watched_from_its_first_ask_which_waits_for_a_pass() {
        let shelf = SharedPricingShelf::default();
        let tenant = uuid::Uuid::from_u128(1);
        let start = Instant::now();
        // The first ask watches the tenant and waits for the next pass,
        // which here puts the tenant's running cost on the shelf.
        let pass = {
            let shelf = shelf.clone();
            tokio::spawn(async move {
                loop {
                    if shelf.read().unwrap().watched_postpaid.contains_key(&tenant) {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                let published = {
                    let mut shelf = shelf.write().unwrap();
                    let mut running = balances::postpaid(tenant);
                    running.burn_rate_cny_per_hour = rust_decimal::Decimal::from(20);
                    shelf.balances.insert(tenant, running);
                    shelf.balances_published.clone()
                };
                published.notify_waiters();
            })
        };
        let first = balance_of(&shelf, tenant, start).await;
        pass.await.unwrap();
        assert_eq!(
            first.burn_rate_cny_per_hour,
            rust_decimal::Decimal::from(20)
        );
        // Asked again within the watch: answered at once, still watched.
        let later = start + Duration::from_secs(WATCH_POSTPAID_SECS - 1);
        assert_eq!(
            balance_of(&shelf, tenant, later)
                .await
                .burn_rate_cny_per_hour,
            20.into()
        );
        // Not asked for a watch's length: no longer reckoned.
        let other = uuid::Uuid::from_u128(2);
        shelf
            .write()
            .unwrap()
            .balances
            .insert(other, balances::postpaid(other));
        balance_of(
            &shelf,
            other,
            later + Duration::from_secs(WATCH_POSTPAID_SECS),
        )
        .await;
        let watched = shelf.read().unwrap().watched_postpaid.clone();
        assert!(!watched.contains_key(&tenant), "{watched:?}");
        assert!(watched.contains_key(&other));
    }

    #[tokio::test]
    async fn a_tenant_with_nothing_open_is_answered_postpaid_after_one_pass_at_most() {
        let shelf = SharedPricingShelf::default();
        let tenant = uuid::Uuid::from_u128(3);
        let now = Instant::now();
        // No pass comes: the first ask gives up after its wait.
        let first = tokio::time::timeout(
            FIRST_RUNNING_COST_WAIT + Duration::from_secs(2),
            balance_of(&shelf, tenant, now),
        )
        .await
        .expect("the first ask waits a bounded time");
        assert_eq!(first, balances::postpaid(tenant));
        // Watched now: the next ask does not wait.
        let again =
            tokio::time::timeout(Duration::from_millis(100), balance_of(&shelf, tenant, now))
                .await
                .expect("a watched tenant is answered at once");
        assert_eq!(again, balances::postpaid(tenant));
    }
}
