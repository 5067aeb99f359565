//! Appending to the business log: one event, or several as one atomic
//! batch (ADR-50), each with its id for deduplication, its type and trace
//! context in headers, and its guard on the aggregate it belongs to. Write
//! failures are sorted here into the conflicts a decider acts on.

use async_nats::header::{self, HeaderMap};
use async_nats::jetstream::context::PublishErrorKind;
use bytes::Bytes;
use lh_events::{subject, Envelope, Expect};

use crate::error::{js_err, BusError, Result};
use crate::trace::inject_trace_context;
use crate::Bus;

/// Header naming the subjects an expected-last-subject-sequence counts
/// (nats-server 2.11 on): an event's aggregate, below which it is stored.
pub const EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: &str =
    "Nats-Expected-Last-Subject-Sequence-Subject";
/// Header carrying the event type, so that tools can filter without parsing.
pub const EVENT_TYPE_HEADER: &str = "Lh-Event-Type";
/// Most messages one atomic batch may hold (the server's own cap is 1,000).
pub const MAX_BATCH_MESSAGES: usize = 64;

/// Result of a successful append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Stream sequence of the (last) stored message.
    pub sequence: u64,
    /// JetStream already held an event with this id; nothing new was stored.
    pub duplicate: bool,
}

impl Bus {
    fn headers(envelope: &Envelope, expect: Expect) -> HeaderMap {
        let mut headers = HeaderMap::new();
        inject_trace_context(&mut headers);
        headers.insert(header::NATS_MESSAGE_ID, envelope.id.to_string().as_str());
        headers.insert(EVENT_TYPE_HEADER, envelope.event_type.as_str());
        if let Expect::LastSubjectSequence(seq) = expect {
            headers.insert(
                header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                seq.to_string().as_str(),
            );
            // The event's own subject names its type and publisher; the
            // guard is on the whole aggregate.
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
                subject::guarded(&envelope.data.aggregate_subject()).as_str(),
            );
        }
        headers
    }

    /// Appends one event below its aggregate's subject.
    pub async fn publish(&self, envelope: &Envelope, expect: Expect) -> Result<Appended> {
        let subject = envelope.subject();
        let ack = self
            .js
            .publish_with_headers(
                subject.clone(),
                Self::headers(envelope, expect),
                Bytes::from(envelope.to_json()),
            )
            .await
            .map_err(js_err)?
            .await
            .map_err(|e| publish_error(&subject, e))?;
        Ok(Appended {
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    /// Appends events to several aggregates as one atomic batch (ADR-50):
    /// the server stores all of them or none, and checks every message's
    /// expectation at commit.
    pub async fn publish_atomic(&self, events: &[(Envelope, Expect)]) -> Result<Appended> {
        assert!(
            !events.is_empty(),
            "an atomic batch holds at least one event"
        );
        assert!(events.len() <= MAX_BATCH_MESSAGES, "atomic batch too large");
        if events.len() == 1 {
            return self.publish(&events[0].0, events[0].1).await;
        }
        self.publish_batch(events).await
    }

    async fn publish_batch(&self, events: &[(Envelope, Expect)]) -> Result<Appended> {
        let batch_id = uuid::Uuid::now_v7().simple().to_string();
        let last = events.len() - 1;
        let subjects: Vec<String> = events.iter().map(|(e, _)| e.subject()).collect();
        for (i, (envelope, expect)) in events.iter().enumerate() {
            let subject = subjects[i].clone();
            let mut headers = Self::headers(envelope, *expect);
            headers.insert(header::NATS_BATCH_ID, batch_id.as_str());
            headers.insert(header::NATS_BATCH_SEQUENCE, (i + 1).to_string().as_str());
            let payload = Bytes::from(envelope.to_json());
            if i < last {
                // Only the commit is acknowledged; earlier messages are
                // fire-and-forget on the same connection, so they arrive first.
                self.client
                    .publish_with_headers(subject.clone(), headers, payload)
                    .await
                    .map_err(js_err)?;
            } else {
                headers.insert(header::NATS_BATCH_COMMIT, header::NATS_BATCH_COMMIT_FINAL);
                let ack = self
                    .js
                    .publish_with_headers(subject.clone(), headers, payload)
                    .await
                    .map_err(js_err)?
                    .await
                    .map_err(|e| publish_error(&subjects.join(", "), e))?;
                return Ok(Appended {
                    sequence: ack.sequence,
                    duplicate: ack.duplicate,
                });
            }
        }
        unreachable!("the loop returns at the last event")
    }
}

fn publish_error(subject: &str, e: async_nats::jetstream::context::PublishError) -> BusError {
    let text = e.to_string();
    if e.kind() == PublishErrorKind::WrongLastSequence || text.contains("wrong last sequence") {
        BusError::Conflict(format!("{subject}: {text}"))
    } else if text.contains("error code 10201") {
        BusError::DuplicateBatch(format!("{subject}: {text}"))
    } else {
        BusError::JetStream(format!("{subject}: {text}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::{Actor, EventData, LeaseStopRequested};
    use tracing_subscriber::layer::SubscriberExt;

    fn envelope() -> Envelope {
        Envelope::new(
            Actor::Admin,
            chrono::Utc::now(),
            EventData::LeaseStopRequested(LeaseStopRequested {
                lease_id: uuid::Uuid::nil(),
            }),
        )
    }

    #[test]
    fn headers_carry_id_type_expectation_and_trace_context() {
        use opentelemetry::trace::TracerProvider as _;
        let env = envelope();
        let plain = Bus::headers(&env, Expect::LastSubjectSequence(7));
        assert_eq!(
            plain.get(header::NATS_MESSAGE_ID).unwrap().as_str(),
            env.id.to_string()
        );
        assert_eq!(
            plain.get(EVENT_TYPE_HEADER).unwrap().as_str(),
            "lease.stop_requested"
        );
        assert_eq!(
            plain
                .get(header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE)
                .unwrap()
                .as_str(),
            "7"
        );
        assert!(
            plain.get("traceparent").is_none(),
            "no span, no trace context"
        );

        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("append");
            let _entered = span.enter();
            let traced = Bus::headers(&env, Expect::Any);
            let tp = traced.get("traceparent").expect("traceparent set").as_str();
            assert!(tp.starts_with("00-") && tp.len() == 55, "{tp}");
        });
    }
}
