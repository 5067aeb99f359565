//! Reading the log in order: a feed replays from a sequence and follows
//! live for as long as it lives, through lost connections and leader
//! elections. A stored message the reader cannot use is handed over as
//! skipped, never as an error: it cannot be removed from the log, so failing
//! on it would fail every restart too.

mod item;
mod merged;
mod message;
mod source;

use std::time::Duration;

use lh_events::subject;

pub use item::{FeedItem, Sample, Skipped, Stored};
use message::FeedMessage;
use source::FeedSource;

use crate::error::{BusError, Result};
use crate::Bus;

/// Longest wait for the next message while reading a subject's history.
pub const SUBJECT_HISTORY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Messages a feed reads (and decodes) ahead of its reader: enough that a
/// projection's next transaction is read while it writes the last one, and
/// at about 2 KiB a decoded event, a few MiB at most per feed.
const FEED_BUFFER_MESSAGES: usize = 1024;

impl Bus {
    /// Replays the business log from `from_sequence` (1 for everything) for
    /// the subjects matching `filters`, then follows live, for as long as
    /// the [`Feed`] lives. Ordered consumer: gaps are detected and the
    /// consumer recreated by the client; when the consumer itself is lost
    /// (the server restarted, the connection dropped), the feed opens a new
    /// one after the last message it delivered, retrying until the server
    /// answers.
    pub async fn feed(&self, filters: &[&str], from_sequence: u64) -> Result<Feed> {
        self.open_feed(self.log_stream, filters, from_sequence, true)
            .await
    }

    /// [`Bus::feed`] for a second reading of what the service's own feeds
    /// already read (audit verification, a rebuild, a tool): the skipped
    /// messages are handed over as such but neither counted nor logged
    /// again, so that the skip counter tells how many there are, not how
    /// often someone looked.
    pub async fn reread(&self, filters: &[&str], from_sequence: u64) -> Result<Feed> {
        self.open_feed(self.log_stream, filters, from_sequence, false)
            .await
    }

    /// A feed of `filters` on `stream` (the business log or the telemetry
    /// stream); `report_skips` counts and logs what it steps over.
    pub(crate) async fn open_feed<T: FeedMessage>(
        &self,
        stream: &'static str,
        filters: &[&str],
        from_sequence: u64,
        report_skips: bool,
    ) -> Result<Feed<T>> {
        // The server refuses one consumer of overlapping filters; a merged
        // read would take them and count a message twice.
        for (i, a) in filters.iter().enumerate() {
            if let Some(b) = filters[i + 1..]
                .iter()
                .find(|b| subject::filters_overlap(a, b))
            {
                return Err(BusError::JetStream(format!(
                    "a feed's filters may not overlap: {a} and {b}"
                )));
            }
        }
        let mut connects = self.connects.clone();
        connects.mark_unchanged();
        let whole = match stream {
            subject::TELEMETRY_STREAM => subject::TELEMETRY_ALL,
            _ => subject::EVENTS_ALL,
        };
        let source = FeedSource {
            js: self.js.clone(),
            stream,
            filters: filters.iter().map(|f| f.to_string()).collect(),
            wide: (!filters.contains(&whole)).then(|| whole.to_string()),
            service: self.service.clone(),
            report_skips,
            connects,
            merge_backlogs: true,
        };
        let (items, receiver) = tokio::sync::mpsc::channel(FEED_BUFFER_MESSAGES);
        let pump = source.start(from_sequence.max(1), items).await?;
        Ok(Feed { receiver, pump })
    }

    /// The events the log holds on one aggregate (`subject` is the
    /// aggregate's) from `from_sequence` on, oldest first, at most
    /// `max_messages` of them (an error past that); messages that do not
    /// decode are left out.
    pub async fn subject_history(
        &self,
        subject: &str,
        from_sequence: u64,
        max_messages: usize,
    ) -> Result<Vec<Stored>> {
        let last = self.subject_last_sequence(subject).await?;
        if last < from_sequence.max(1) {
            return Ok(Vec::new());
        }
        let under = subject::guarded(subject);
        let mut feed = self.reread(&[&under], from_sequence).await?;
        let mut events = Vec::new();
        loop {
            let item = feed
                .next_item_within(SUBJECT_HISTORY_READ_TIMEOUT)
                .await
                .ok_or_else(|| BusError::JetStream(format!("reading {subject} timed out")))??;
            let sequence = item.sequence();
            if let FeedItem::Event(event) = item {
                if events.len() == max_messages {
                    return Err(BusError::JetStream(format!(
                        "{subject} holds more than {max_messages} messages from {from_sequence}"
                    )));
                }
                events.push(event);
            }
            if sequence >= last {
                return Ok(events);
            }
        }
    }
}

/// Messages of one filter in stream order. A task reads them ahead (a
/// few at most) and survives losing its consumer, so that waiting on a
/// feed can be given up at any time without losing a message.
pub struct Feed<T = FeedItem> {
    receiver: tokio::sync::mpsc::Receiver<Result<T>>,
    pump: tokio::task::JoinHandle<()>,
}

impl<T> Drop for Feed<T> {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

impl<T> Feed<T> {
    /// The next stored message, decoded or skipped (a skip is counted and
    /// logged once, when read). Waits through a lost connection or a
    /// restarted server; an error only for a message without JetStream
    /// metadata, after which the feed ends (`None`).
    pub async fn next_item(&mut self) -> Option<Result<T>> {
        self.receiver.recv().await
    }

    /// Like [`Feed::next_item`], but gives up after `timeout` with `None`.
    pub async fn next_item_within(&mut self, timeout: Duration) -> Option<Result<T>> {
        tokio::time::timeout(timeout, self.next_item())
            .await
            .ok()
            .flatten()
    }

    /// The next message the feed has already read, without waiting: a
    /// reader behind the feed takes what waits for it. Its `pending` was
    /// counted when the feed read it, so it tells less than waits now.
    pub fn next_item_read(&mut self) -> Option<Result<T>> {
        self.receiver.try_recv().ok()
    }
}

impl Feed {
    /// The next event this code can use, stepping over the others (see
    /// [`Feed::next_item`]): for readers that act on events and keep no
    /// record of where they stand. A skipped message is never the answer,
    /// so after one that was last (`pending` 0) this waits for the next
    /// event.
    pub async fn next(&mut self) -> Option<Result<Stored>> {
        loop {
            match self.next_item().await? {
                Ok(FeedItem::Event(event)) => return Some(Ok(event)),
                Ok(FeedItem::Skipped(_)) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// Like [`Feed::next`], but gives up after `timeout` with `None`.
    pub async fn next_within(&mut self, timeout: Duration) -> Option<Result<Stored>> {
        tokio::time::timeout(timeout, self.next())
            .await
            .ok()
            .flatten()
    }
}
