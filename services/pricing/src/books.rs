//! The price book RPC: lists the books the charges fold holds, and
//! publishes a new version, guarded by the last price book sequence that
//! fold has read, so that a version is checked against every book before
//! it and two admins publishing at once cannot both win.

use chrono::{DateTime, Utc};
use lh_bus::{Bus, BusError, Expect};
use lh_events::{derived_id, Actor, Envelope, EventData};
use lh_rpc::price_book::{ListRequest, PriceBooks, PublishReply, PublishRequest};

use crate::shelf::SharedPricingShelf;
use crate::SERVICE;

/// How far before now a book may say it is effective from: the time its
/// request took to get here. Earlier would re-price leases already started.
pub const MAX_EFFECTIVE_FROM_AGE: chrono::Duration = chrono::Duration::minutes(1);
/// Tries of one publish: a second after the fold has read what beat the
/// first.
const PUBLISH_ATTEMPTS: u32 = 2;
/// How long a publish that lost waits for the fold to read the book that
/// beat it.
const SHELF_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(2);

pub fn list(shelf: &SharedPricingShelf, _request: ListRequest) -> PriceBooks {
    PriceBooks {
        books: shelf.read().expect("shelf lock").books.clone(),
    }
}

fn refused(field: &str, detail: impl Into<String>) -> PublishReply {
    PublishReply::Refused {
        field: field.into(),
        detail: detail.into(),
    }
}

/// The id of a book's event: one per version.
pub fn book_id(version: u32) -> uuid::Uuid {
    derived_id(&["price_book", &version.to_string()])
}

/// Publishes `request.book` when it is valid and newer than every book in
/// the log. Errors are for the caller to retry (the log out of reach).
pub async fn publish(
    bus: &Bus,
    shelf: &SharedPricingShelf,
    request: PublishRequest,
    now: DateTime<Utc>,
) -> Result<PublishReply, String> {
    let book = request.book;
    if let Err(e) = lh_domain::rating::validate_book(&book) {
        return Ok(refused(&e.field, e.detail));
    }
    if book.effective_from < now - MAX_EFFECTIVE_FROM_AGE {
        return Ok(refused(
            "effective_from",
            "a price book cannot apply from the past",
        ));
    }
    // A conflict may only mean the fold has not read the book it published
    // a moment ago: it is given time to, and the version checked again.
    let mut attempts_left = PUBLISH_ATTEMPTS;
    loop {
        attempts_left -= 1;
        let (newest, guard) = {
            let shelf = shelf.read().expect("shelf lock");
            (
                shelf.books.iter().map(|b| b.version).max().unwrap_or(0),
                shelf.sequence,
            )
        };
        if book.version <= newest {
            return Ok(refused(
                "version",
                format!("version must be greater than {newest}, the newest published"),
            ));
        }
        let version = book.version;
        tracing::info!(version, requested_by = ?book.requested_by, "publishing a price book");
        let envelope = Envelope::new(
            Actor::Service(SERVICE.into()),
            now,
            EventData::PriceBookPublished(book.clone()),
        )
        .with_id(book_id(version));
        match bus
            .publish(&envelope, Expect::LastSubjectSequence(guard))
            .await
        {
            Ok(appended) => {
                return Ok(PublishReply::Published {
                    version,
                    sequence: appended.sequence,
                })
            }
            // The log holds a book this fold has not read yet.
            Err(BusError::Conflict(_)) if attempts_left > 0 => {
                let waited = std::time::Instant::now();
                while shelf.read().expect("shelf lock").sequence == guard
                    && waited.elapsed() < SHELF_CATCH_UP
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
            Err(BusError::Conflict(_)) => {
                return Ok(refused(
                    "version",
                    "another price book was published meanwhile; list the books and retry",
                ))
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot publish a price book");
                return Err("the event log is out of reach; retry shortly".into());
            }
        }
    }
}
