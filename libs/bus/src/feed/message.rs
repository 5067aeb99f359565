//! What a feed makes of one stored message: a telemetry sample as it
//! is, an event decoded, or, where it cannot be used, a skip, counted and
//! logged once by the service's own feeds (a second reading stays quiet).

use async_nats::jetstream;
use lh_events::Envelope;

use super::item::{FeedItem, Sample, Skipped, Stored};
use crate::trace::{is_trace_parent, TRACE_PARENT_HEADER};

/// When the server stored a message.
fn stored_at(info: &jetstream::message::Info) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(info.published.unix_timestamp(), info.published.nanosecond())
        .unwrap_or_default()
}

/// What a feed makes of one stored message.
pub(crate) trait FeedMessage: Send + 'static {
    /// The message as the feed hands it over; a skip is counted and logged
    /// for `service` where `report_skips` says so.
    fn from_message(
        service: &str,
        report_skips: bool,
        message: &jetstream::Message,
        info: &jetstream::message::Info,
    ) -> Self;
    /// Says that nothing the feed reads follows it (pending 0).
    fn mark_last(&mut self);
}

impl FeedMessage for Sample {
    fn from_message(
        _: &str,
        _: bool,
        message: &jetstream::Message,
        info: &jetstream::message::Info,
    ) -> Self {
        Sample {
            sequence: info.stream_sequence,
            subject: message.subject.to_string(),
            payload: message.payload.clone(),
            pending: info.pending,
            stored_at: stored_at(info),
        }
    }

    fn mark_last(&mut self) {
        self.pending = 0;
    }
}

impl FeedMessage for FeedItem {
    /// Decodes one event, or counts and logs it as skipped.
    fn from_message(
        service: &str,
        report_skips: bool,
        message: &jetstream::Message,
        info: &jetstream::message::Info,
    ) -> Self {
        decode(service, report_skips, message, info)
    }

    fn mark_last(&mut self) {
        match self {
            FeedItem::Event(e) => e.pending = 0,
            FeedItem::Skipped(s) => s.pending = 0,
        }
    }
}

/// Decodes one message, or counts and logs it as skipped.
fn decode(
    service: &str,
    report_skips: bool,
    message: &jetstream::Message,
    info: &jetstream::message::Info,
) -> FeedItem {
    let (sequence, pending) = (info.stream_sequence, info.pending);
    let subject = message.subject.to_string();
    let payload = message.payload.clone();
    let stored_at = stored_at(info);
    let trace_parent = message
        .headers
        .as_ref()
        .and_then(|h| h.get(TRACE_PARENT_HEADER))
        .map(|v| v.as_str())
        .filter(|v| is_trace_parent(v))
        .map(str::to_string);
    match Envelope::decode_stored(&subject, &payload) {
        Ok(envelope) => FeedItem::Event(Stored {
            sequence,
            subject,
            envelope,
            payload,
            pending,
            stored_at,
            trace_parent,
        }),
        Err(why) => {
            if report_skips {
                metrics::counter!("lh_events_skipped_total",
                    "service" => service.to_string(), "reason" => why.reason.as_str())
                .increment(1);
                tracing::warn!(service = %service, sequence, subject, reason = %why.reason,
                    detail = %why.detail, "skipping a stored message this service cannot use");
            }
            FeedItem::Skipped(Skipped {
                sequence,
                subject,
                payload,
                pending,
                stored_at,
                why,
            })
        }
    }
}
