//! One lease reads as one trace across the bus: the gateway's request, the
//! scheduler's placement, the node-agent's start, pricing and the audit
//! copy all continue the trace context the events carry in their
//! `traceparent` header, and each service's span is a child of the span
//! that wrote the event it handles.
//!
//! Every service runs in this process under one OpenTelemetry layer whose
//! spans go to an in-memory exporter.

use std::collections::HashMap;

use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use reqwest::Method;
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

use lh_test_stack::{Stack, TWO_A100};

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_is_one_trace_from_the_gateway_through_every_service() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("leasehold-test")));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let stack = Stack::start(TWO_A100).await;
    let (_, key) = stack.create_tenant("traced", 1).await;
    let (status, body) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB"})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    let (status, body) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(status, 202, "{body}");
    stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    // The audit copy and pricing follow the log on their own.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let spans = loop {
        provider.force_flush().unwrap();
        let spans = exporter.get_finished_spans().unwrap();
        let copied = |projection: &str, event: &str| {
            spans.iter().any(|s| {
                s.name == "lh.project"
                    && attribute(s, "projection").as_deref() == Some(projection)
                    && attribute(s, "event").as_deref() == Some(event)
            })
        };
        if copied("audit", "lease.started") && copied("invoices", "charge.accrued")
            || std::time::Instant::now() > deadline
        {
            break spans;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let by_id: HashMap<SpanId, &SpanData> = spans
        .iter()
        .map(|s| (s.span_context.span_id(), s))
        .collect();
    let request = spans
        .iter()
        .find(|s| {
            s.name == "request"
                && attribute(s, "uri").is_some_and(|u| u.ends_with("/v1/leases"))
                && attribute(s, "method").as_deref() == Some("POST")
        })
        .unwrap_or_else(|| {
            let names: Vec<_> = spans.iter().map(|s| s.name.to_string()).collect();
            panic!("no span of the gateway's POST /v1/leases among {names:?}")
        });
    let trace: TraceId = request.span_context.trace_id();
    let decided = |events: &str| -> &SpanData {
        spans
            .iter()
            .find(|s| {
                s.name == "lh.decide"
                    && attribute(s, "events").is_some_and(|e| e.split(',').any(|x| x == events))
                    && s.span_context.trace_id() == trace
            })
            .unwrap_or_else(|| panic!("no {events} decision in the lease's trace"))
    };
    let placed = decided("lease.placed");
    let started = decided("lease.started");
    // Each service's span hangs under the one that wrote what it handled:
    // the placement under the gateway's request, its relay to the node's
    // view under the placement, the start under the relay.
    assert_eq!(placed.parent_span_id, request.span_context.span_id());
    let relayed = by_id
        .get(&started.parent_span_id)
        .expect("the start's parent span was exported");
    assert_eq!(
        attribute(relayed, "events").as_deref(),
        Some("node_view.relayed")
    );
    assert_eq!(relayed.parent_span_id, placed.span_context.span_id());
    let read = |projection: &str, event: &str| -> &SpanData {
        spans
            .iter()
            .find(|s| {
                s.name == "lh.project"
                    && attribute(s, "projection").as_deref() == Some(projection)
                    && attribute(s, "event").as_deref() == Some(event)
                    && s.span_context.trace_id() == trace
            })
            .unwrap_or_else(|| panic!("{projection} read {event} outside the lease's trace"))
    };
    for projection in ["gateway", "audit"] {
        let copy = read(projection, "lease.started");
        assert_eq!(
            copy.parent_span_id,
            started.span_context.span_id(),
            "{projection}"
        );
    }
    // Pricing charges the run once it ended, in the same trace, and its
    // invoices read model reads the charge there too.
    let charged = decided("charge.accrued");
    assert!(by_id.contains_key(&charged.parent_span_id));
    let invoiced = read("invoices", "charge.accrued");
    assert_eq!(invoiced.parent_span_id, charged.span_context.span_id());
}
