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
                let balance = s
                    .shelf
                    .read()
                    .expect("shelf lock")
                    .balances
                    .get(&request.tenant_id)
                    .cloned()
                    .unwrap_or_else(|| balances::postpaid(request.tenant_id));
                async move { Ok::<_, String>(balance) }
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

/// Serves every RPC of the table until one fails, which ends them all.
pub(crate) async fn serve_all(sources: &RpcSources<'_>) -> anyhow::Result<()> {
    let serving = table(sources)
        .into_iter()
        .map(|(what, serving)| async move { serving.await.context(what) });
    futures::future::try_join_all(serving).await?;
    Ok(())
}
