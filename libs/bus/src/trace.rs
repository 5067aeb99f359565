//! W3C trace context across the log: a writer puts its span's
//! `traceparent` on each event, a reader continues that trace. A reader
//! does not trust a writer's header, so its shape is checked first.

use async_nats::header::HeaderMap;

/// The W3C trace context header.
pub const TRACE_PARENT_HEADER: &str = "traceparent";
/// A `traceparent` is `00-<32 hex>-<16 hex>-<2 hex>`: 55 characters.
const TRACE_PARENT_LEN: usize = 55;

/// Whether `value` has the shape of a W3C `traceparent` (a writer is not
/// trusted to send one).
pub(crate) fn is_trace_parent(value: &str) -> bool {
    value.len() == TRACE_PARENT_LEN
        && value
            .bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Makes `span` a child of the span that wrote an event (its
/// `trace_parent`), so one request reads as one trace across the services
/// it reaches. Nothing happens without a trace parent or without an
/// OpenTelemetry layer.
pub fn continue_trace(span: &tracing::Span, trace_parent: Option<&str>) {
    use opentelemetry::propagation::{Extractor, TextMapPropagator};
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct One<'a>(&'a str);
    impl Extractor for One<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            (key == TRACE_PARENT_HEADER).then_some(self.0)
        }
        fn keys(&self) -> Vec<&str> {
            vec![TRACE_PARENT_HEADER]
        }
    }
    let Some(trace_parent) = trace_parent.filter(|t| is_trace_parent(t)) else {
        return;
    };
    let context =
        opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&One(trace_parent));
    // Without the layer there is no trace to continue.
    let _ = span.set_parent(context);
}

/// Puts the current span's W3C trace context in the `traceparent` header,
/// so a trace follows an event from service to service. Without an OTLP
/// exporter the span context is empty and nothing is added.
pub(crate) fn inject_trace_context(headers: &mut HeaderMap) {
    use opentelemetry::propagation::{Injector, TextMapPropagator};
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct HeaderInjector<'a>(&'a mut HeaderMap);
    impl Injector for HeaderInjector<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key, value.as_str());
        }
    }
    let context = tracing::Span::current().context();
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .inject_context(&context, &mut HeaderInjector(headers));
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn a_reader_continues_a_well_formed_trace_parent_and_ignores_any_other() {
        use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let written = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert!(is_trace_parent(written));
        for hostile in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",
            "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n",
            &"a".repeat(4096),
        ] {
            assert!(!is_trace_parent(hostile), "{hostile:?}");
        }
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let trace_of = |parent: Option<&str>| {
                let span = tracing::info_span!("read");
                continue_trace(&span, parent);
                span.context().span().span_context().trace_id().to_string()
            };
            assert_eq!(trace_of(Some(written)), "0af7651916cd43dd8448eb211c80319c");
            assert_ne!(trace_of(Some("00-zzz")), "0af7651916cd43dd8448eb211c80319c");
            assert_ne!(trace_of(None), "0af7651916cd43dd8448eb211c80319c");
        });
    }
}
