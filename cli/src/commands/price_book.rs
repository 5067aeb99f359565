//! `lh price-book ls | publish`: every price book version, and a new one
//! published from a JSON file, read as the book `POST /v1/price-books`
//! takes before anything is sent.

use lh_rpc::http::price_books::NewPriceBook;

use crate::args::PriceBookCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, Out};
use crate::render;

use super::body::read_json_file;

/// Runs one `lh price-book` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: PriceBookCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        PriceBookCommand::Ls => {
            let books = gw.get(&["v1", "price-books"], &[]).await?;
            emit(out, json, &books, render::price_books)?;
            Ok(EXIT_OK)
        }
        PriceBookCommand::Publish(p) => {
            let body: NewPriceBook = read_json_file(
                &p.file,
                "a price book, a JSON object: {\"version\", \"tiers\": [...]}",
            )?;
            let published = gw.post(&["v1", "price-books"], &body, &[]).await?;
            emit(out, json, &published, render::audit)?;
            Ok(EXIT_OK)
        }
    }
}
