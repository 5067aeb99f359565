//! What a feed hands over: a stored event with where it stands in the log,
//! a message stepped over with why, or a telemetry sample undecoded. Each
//! carries its raw bytes, since the audit chain hashes what was stored.

use bytes::Bytes;
use lh_events::{subject, Envelope, EnvelopeHead, SkipReason, Undecodable};

/// One event read from the log.
#[derive(Debug, Clone)]
pub struct Stored {
    pub sequence: u64,
    pub subject: String,
    pub envelope: Envelope,
    /// The raw bytes as stored: the audit chain hashes these.
    pub payload: Bytes,
    /// Messages left in the stream after this one: of this feed's filters,
    /// or, while the feed reads the stream whole, of every subject. 0
    /// exactly when nothing the feed reads follows it.
    pub pending: u64,
    /// When the server stored it, by the server's clock: what a writer's
    /// own timestamps are held against.
    pub stored_at: chrono::DateTime<chrono::Utc>,
    /// The W3C `traceparent` its writer sent with it, when it was traced:
    /// a reader continues that trace ([`continue_trace`](crate::continue_trace)).
    pub trace_parent: Option<String>,
}

/// A stored message the reader cannot use, stepped over. It still counts
/// as read: it has a sequence, the audit chain covers its bytes, and
/// projections record it so that a rebuild steps over the same messages.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub sequence: u64,
    pub subject: String,
    /// The raw bytes as stored.
    pub payload: Bytes,
    /// Messages left in the stream after this one: of this feed's filters,
    /// or, while the feed reads the stream whole, of every subject. 0
    /// exactly when nothing the feed reads follows it.
    pub pending: u64,
    /// When JetStream stored it (the same on every replay).
    pub stored_at: chrono::DateTime<chrono::Utc>,
    pub why: Undecodable,
}

impl Stored {
    /// This event stepped over as `reason` says (its publisher may not do
    /// what it says, here and now), counted and logged as every skip is.
    pub fn refused(self, service: &str, reason: SkipReason, detail: String) -> Skipped {
        metrics::counter!("lh_events_skipped_total",
            "service" => service.to_string(), "reason" => reason.as_str())
        .increment(1);
        tracing::warn!(service, sequence = self.sequence, subject = self.subject,
            reason = %reason, detail, "refusing a stored event its publisher may not write now");
        self.into_refused(reason, detail)
    }

    /// As [`Stored::refused`], neither counted nor logged: for a reader
    /// judging again what it already refused (a transaction tried again).
    pub fn into_refused(self, reason: SkipReason, detail: String) -> Skipped {
        let envelope = self.envelope;
        Skipped {
            sequence: self.sequence,
            subject: self.subject,
            payload: self.payload,
            pending: self.pending,
            stored_at: self.stored_at,
            why: Undecodable {
                reason,
                detail,
                head: EnvelopeHead {
                    id: Some(envelope.id),
                    event_type: Some(envelope.event_type),
                    version: Some(u64::from(envelope.version)),
                    occurred_at: Some(envelope.occurred_at),
                },
            },
        }
    }
}

impl Skipped {
    pub fn reason(&self) -> SkipReason {
        self.why.reason
    }
}

/// One telemetry message as `LH_TELEMETRY` stored it, undecoded: samples
/// are not business events, and each reader knows its subjects' type.
#[derive(Debug, Clone)]
pub struct Sample {
    pub sequence: u64,
    pub subject: String,
    pub payload: Bytes,
    /// Messages left in the stream after this one: of this feed's filters,
    /// or, while the feed reads the stream whole, of every subject. 0
    /// exactly when nothing the feed reads follows it.
    pub pending: u64,
    /// When the server stored it, by the server's clock (the same on every
    /// replay): what a node's own clock is held against.
    pub stored_at: chrono::DateTime<chrono::Utc>,
}

/// What a feed delivers: every stored message of its filter, in order,
/// decoded or skipped.
// Events are nearly every item: boxing them would cost an allocation each
// to save space only on the rare skip.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum FeedItem {
    Event(Stored),
    Skipped(Skipped),
}

impl FeedItem {
    pub fn sequence(&self) -> u64 {
        match self {
            FeedItem::Event(e) => e.sequence,
            FeedItem::Skipped(s) => s.sequence,
        }
    }

    pub fn subject(&self) -> &str {
        match self {
            FeedItem::Event(e) => &e.subject,
            FeedItem::Skipped(s) => &s.subject,
        }
    }

    /// The aggregate subject the message is stored below, whether it
    /// decoded or not: the aggregate whose guard counts it. `None` outside
    /// `lh.evt.>`, and for a message on an aggregate's own subject, where
    /// no event belongs and which no guard counts.
    pub fn aggregate_subject(&self) -> Option<&str> {
        let stored = self.subject();
        subject::aggregate_of(stored).filter(|aggregate| aggregate.len() < stored.len())
    }

    /// The raw bytes as stored.
    pub fn payload(&self) -> &Bytes {
        match self {
            FeedItem::Event(e) => &e.payload,
            FeedItem::Skipped(s) => &s.payload,
        }
    }

    /// Messages left in the stream after this one (see [`Stored::pending`]).
    pub fn pending(&self) -> u64 {
        match self {
            FeedItem::Event(e) => e.pending,
            FeedItem::Skipped(s) => s.pending,
        }
    }
}
