//! Refused requests on the audit trail, summed so that a flood cannot
//! fill it: every 401, 403 and 429 the gateway answers is counted by its
//! source (the principal the request named, else the client's address) and
//! route, and once an interval ends one `access.refused` summary per source
//! is published. A window holds at most [`MAX_REFUSAL_SOURCES_PER_INTERVAL`]
//! sources and each source [`MAX_REFUSAL_ROUTES_PER_SOURCE`] routes; what is
//! past either is summed under `others`, so each interval costs a bounded
//! number of events however many callers are refused.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use chrono::{DateTime, TimeZone, Utc};
use lh_bus::Bus;
use lh_events::{AccessRefused, Actor, Envelope, EventData, Expect};

/// Length of a summary's interval when the configuration names none.
pub const DEFAULT_REFUSAL_INTERVAL_SECS: u64 = 60;
/// Most sources summed one by one in an interval; the rest share `others`.
pub const MAX_REFUSAL_SOURCES_PER_INTERVAL: usize = 256;
/// Most routes counted one by one per source; the rest share `others`.
pub const MAX_REFUSAL_ROUTES_PER_SOURCE: usize = 32;
/// The bucket past a limit.
pub const OTHERS: &str = "others";
/// How often ended intervals are looked for and published.
const PUBLISH_CHECK: Duration = Duration::from_secs(1);

/// Statuses that record a refusal.
fn is_refusal(status: u16) -> bool {
    matches!(status, 401 | 403 | 429)
}

/// Where the authentication step leaves the principal a request named,
/// for the counter to read once the answer is known.
#[derive(Clone, Default)]
pub struct NamedPrincipal(Arc<OnceLock<String>>);

impl NamedPrincipal {
    pub fn set(&self, principal: String) {
        let _ = self.0.set(principal);
    }
}

#[derive(Default)]
struct Tally {
    refused: u64,
    by_status: BTreeMap<String, u64>,
    by_route: BTreeMap<String, u64>,
}

struct Window {
    from: DateTime<Utc>,
    sources: BTreeMap<String, Tally>,
}

/// The refusals of the current interval and of those ended but not yet
/// published. Pure: it takes the time, and its owner publishes.
pub struct RefusalCounter {
    interval_secs: i64,
    state: Mutex<(Option<Window>, Vec<Window>)>,
}

impl RefusalCounter {
    pub fn new(interval_secs: u64) -> Self {
        Self {
            interval_secs: interval_secs.clamp(1, 24 * 3600) as i64,
            state: Mutex::new((None, Vec::new())),
        }
    }

    /// Start of the interval `now` falls in: intervals are aligned on the
    /// epoch, so every replica sums over the same ones.
    fn interval_of(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let start = now.timestamp().div_euclid(self.interval_secs) * self.interval_secs;
        Utc.timestamp_opt(start, 0).single().unwrap_or(now)
    }

    /// Counts one refused request.
    pub fn record(&self, source: &str, status: u16, route: &str, now: DateTime<Utc>) {
        let from = self.interval_of(now);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (current, ended) = &mut *state;
        if current.as_ref().is_some_and(|w| w.from != from) {
            ended.extend(current.take());
        }
        let window = current.get_or_insert_with(|| Window {
            from,
            sources: BTreeMap::new(),
        });
        let source = if window.sources.contains_key(source)
            || window.sources.len() < MAX_REFUSAL_SOURCES_PER_INTERVAL
        {
            source
        } else {
            OTHERS
        };
        let tally = window.sources.entry(source.to_string()).or_default();
        tally.refused += 1;
        *tally.by_status.entry(status.to_string()).or_default() += 1;
        let route = if tally.by_route.contains_key(route)
            || tally.by_route.len() < MAX_REFUSAL_ROUTES_PER_SOURCE
        {
            route
        } else {
            OTHERS
        };
        *tally.by_route.entry(route.to_string()).or_default() += 1;
    }

    /// The summaries of every interval that ended by `now`, once each.
    pub fn take_ended(&self, now: DateTime<Utc>) -> Vec<AccessRefused> {
        let interval = chrono::Duration::seconds(self.interval_secs);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (current, ended) = &mut *state;
        if current.as_ref().is_some_and(|w| w.from + interval <= now) {
            ended.extend(current.take());
        }
        ended
            .drain(..)
            .flat_map(|window| {
                let to = window.from + interval;
                window
                    .sources
                    .into_iter()
                    .map(move |(source, tally)| AccessRefused {
                        source,
                        from: window.from,
                        to,
                        refused: tally.refused,
                        by_status: tally.by_status,
                        by_route: tally.by_route,
                    })
            })
            .collect()
    }
}

/// Counts the refusals among the answers (the front door's own 429s
/// included: it is layered inside this).
pub async fn count(
    State(counter): State<Arc<RefusalCounter>>,
    mut request: Request,
    next: Next,
) -> Response {
    let named = NamedPrincipal::default();
    request.extensions_mut().insert(named.clone());
    let ip = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip())
        .unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let route = format!(
        "{} {}",
        request.method(),
        request
            .extensions()
            .get::<MatchedPath>()
            .map_or("unrouted", MatchedPath::as_str)
    );
    let response = next.run(request).await;
    let status = response.status().as_u16();
    if is_refusal(status) {
        let source = named.0.get().cloned().unwrap_or_else(|| {
            // The log is read by every node for a year and cannot be
            // erased: it keeps the network, the gateway's own log the
            // address.
            tracing::debug!(%ip, status, route, "request refused");
            format!("ip:{}", network_of(ip))
        });
        counter.record(&source, status, &route, Utc::now());
        metrics::counter!("lh_gateway_refusals_total", "status" => status.to_string()).increment(1);
    }
    response
}

/// The network a refused address is recorded by: its /24 (IPv4) or /48
/// (IPv6), enough to tell a flood's source and block it, not enough to
/// name a person.
pub fn network_of(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            format!("{a}.{b}.{c}.0/24")
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let network = std::net::Ipv6Addr::new(s[0], s[1], s[2], 0, 0, 0, 0, 0);
            format!("{network}/48")
        }
    }
}

/// Publishes each ended interval's summaries as `access.refused`, until
/// the future is dropped. A summary the log refuses is logged and dropped:
/// the refusals it counted are in the metrics still.
pub async fn publish_summaries(
    bus: Bus,
    counter: Arc<RefusalCounter>,
    service: &'static str,
) -> std::convert::Infallible {
    let mut every = tokio::time::interval(PUBLISH_CHECK);
    loop {
        every.tick().await;
        for summary in counter.take_ended(Utc::now()) {
            let (source, refused) = (summary.source.clone(), summary.refused);
            let envelope = Envelope::new(
                Actor::Service(service.into()),
                Utc::now(),
                EventData::AccessRefused(summary),
            );
            if let Err(e) = bus.publish(&envelope, Expect::Any).await {
                tracing::warn!(error = %e, source, refused, "an access.refused summary was not stored");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, 0).unwrap()
    }

    #[test]
    fn a_refused_address_is_kept_as_its_network() {
        assert_eq!(
            network_of("203.0.113.77".parse().unwrap()),
            "203.0.113.0/24"
        );
        assert_eq!(
            network_of("2001:db8:1234:5678::9".parse().unwrap()),
            "2001:db8:1234::/48"
        );
    }

    #[test]
    fn a_flood_is_one_summary_per_source_and_interval() {
        let counter = RefusalCounter::new(60);
        for i in 0..200 {
            counter.record("ip:10.0.0.1", 401, "GET /v1/leases", at(120 + i % 60));
        }
        counter.record("tenant:t", 403, "POST /v1/tenants", at(130));
        assert!(
            counter.take_ended(at(179)).is_empty(),
            "the interval runs on"
        );
        let summaries = counter.take_ended(at(180));
        assert_eq!(summaries.len(), 2);
        let flood = summaries
            .iter()
            .find(|s| s.source == "ip:10.0.0.1")
            .unwrap();
        assert_eq!(
            (flood.refused, flood.from, flood.to),
            (200, at(120), at(180))
        );
        assert_eq!(flood.by_status["401"], 200);
        assert_eq!(flood.by_route["GET /v1/leases"], 200);
        assert!(counter.take_ended(at(500)).is_empty(), "each summary once");
    }

    #[test]
    fn sources_and_routes_past_their_limits_share_others() {
        let counter = RefusalCounter::new(60);
        for i in 0..MAX_REFUSAL_SOURCES_PER_INTERVAL + 10 {
            counter.record(
                &format!("ip:10.0.{}.{}", i / 256, i % 256),
                401,
                "GET /",
                at(0),
            );
        }
        for i in 0..MAX_REFUSAL_ROUTES_PER_SOURCE + 5 {
            counter.record("ip:10.0.0.0", 429, &format!("GET /r{i}"), at(1));
        }
        // A new interval ends the first one.
        counter.record("ip:10.0.0.9", 401, "GET /", at(61));
        let first = counter.take_ended(at(61));
        assert_eq!(first.len(), MAX_REFUSAL_SOURCES_PER_INTERVAL + 1);
        let others = first.iter().find(|s| s.source == OTHERS).unwrap();
        assert_eq!(others.refused, 10);
        let busy = first.iter().find(|s| s.source == "ip:10.0.0.0").unwrap();
        assert_eq!(busy.by_route.len(), MAX_REFUSAL_ROUTES_PER_SOURCE + 1);
        assert_eq!(
            busy.by_route[OTHERS], 6,
            "\"GET /\" and 31 more fill its routes"
        );
        assert_eq!(
            busy.by_status["429"],
            (MAX_REFUSAL_ROUTES_PER_SOURCE + 5) as u64
        );
        assert_eq!(counter.take_ended(at(120)).len(), 1);
    }
}
