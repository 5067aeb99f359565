//! Heartbeats and usage samples on `LH_TELEMETRY`: published without
//! waiting for the store (losing one is harmless), read as a feed, as the
//! newest per subject, or live. Samples are handed over undecoded: each
//! reader knows its subjects' type.

use std::time::Duration;

use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use futures::StreamExt;
use lh_events::subject;

use crate::error::{js_err, Result};
use crate::feed::{Feed, Sample};
use crate::Bus;

impl Bus {
    /// Sequence of the newest sample on `LH_TELEMETRY` (0 when empty).
    pub async fn telemetry_last_sequence(&self) -> Result<u64> {
        let mut stream = self
            .js
            .get_stream(subject::TELEMETRY_STREAM)
            .await
            .map_err(js_err)?;
        Ok(stream.info().await.map_err(js_err)?.state.last_sequence)
    }

    /// [`Bus::last_sequence_matching`] on `LH_TELEMETRY`.
    pub async fn telemetry_last_sequence_matching(&self, filters: &[&str]) -> Result<u64> {
        let mut head = 0;
        for filter in filters {
            head = head.max(
                self.last_sequence_in(subject::TELEMETRY_STREAM, filter)
                    .await?,
            );
        }
        Ok(head)
    }

    /// [`Bus::feed`] on `LH_TELEMETRY`: the samples of `filters` from
    /// `from_sequence` on (1 for all the stream still holds), then live.
    pub async fn telemetry_feed(
        &self,
        filters: &[&str],
        from_sequence: u64,
    ) -> Result<Feed<Sample>> {
        self.open_feed(subject::TELEMETRY_STREAM, filters, from_sequence, false)
            .await
    }

    /// The newest telemetry sample on `subject`, if the stream still has one.
    pub async fn last_telemetry(&self, subject: &str) -> Result<Option<Vec<u8>>> {
        let stream = self
            .js
            .get_stream(subject::TELEMETRY_STREAM)
            .await
            .map_err(js_err)?;
        match stream.get_last_raw_message_by_subject(subject).await {
            Ok(m) => Ok(Some(m.payload.to_vec())),
            Err(e)
                if e.kind()
                    == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
            {
                Ok(None)
            }
            Err(e) => Err(js_err(e)),
        }
    }

    /// The newest telemetry sample of every subject matching `filter` that
    /// the stream still holds (for example every node's last heartbeat), at
    /// most `max_subjects` of them, each with its subject: the subject, not
    /// the payload, says who sent it.
    pub async fn last_telemetry_each(
        &self,
        filter: &str,
        max_subjects: usize,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        let stream = self
            .js
            .get_stream(subject::TELEMETRY_STREAM)
            .await
            .map_err(js_err)?;
        let consumer = stream
            .create_consumer(OrderedConfig {
                filter_subject: filter.to_string(),
                deliver_policy: DeliverPolicy::LastPerSubject,
                ..Default::default()
            })
            .await
            .map_err(js_err)?;
        let mut messages = consumer.messages().await.map_err(js_err)?;
        // A sample stored while the consumer starts comes after the one it
        // supersedes: keep the newest per subject.
        let mut samples: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
        // An empty selection delivers nothing; a short wait tells that apart
        // from a slow server.
        loop {
            let next = tokio::time::timeout(Duration::from_millis(500), messages.next()).await;
            let Ok(Some(message)) = next else { break };
            let message = message.map_err(js_err)?;
            let pending = message.info().map_err(js_err)?.pending;
            let subject = message.subject.to_string();
            if samples.len() >= max_subjects && !samples.contains_key(&subject) {
                break;
            }
            samples.insert(subject, message.payload.to_vec());
            if pending == 0 {
                break;
            }
        }
        Ok(samples.into_iter().collect())
    }

    /// Live telemetry samples on `filter`, as they are published.
    pub async fn subscribe_telemetry(&self, filter: &str) -> Result<async_nats::Subscriber> {
        self.client
            .subscribe(filter.to_string())
            .await
            .map_err(js_err)
    }

    /// Publishes a telemetry sample (heartbeat, usage) on `LH_TELEMETRY`
    /// without waiting for the store: losing one is harmless.
    pub async fn publish_telemetry(&self, subject: String, payload: Vec<u8>) -> Result<()> {
        self.client
            .publish(subject, payload.into())
            .await
            .map_err(js_err)
    }
}
