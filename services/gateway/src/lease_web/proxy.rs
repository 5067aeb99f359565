//! Requests from browsers to a lease's port: checked (its name, its
//! cookie, where it comes from), then carried over a port-forward session
//! as `lh lease open` carries them, and the answer back.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use lh_events::{Actor, SessionKind, SessionTransport};
use lh_rpc::session::OpenKind;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::access::{cookies_named, page, WebSession, COOKIE, ENTER_PATH};
use super::{stream_client, LeaseWeb, Reach, SWEEP_EVERY};
use crate::sessions::open::{self, Opening};

/// How long a request may wait for its lease's port to answer its head.
const RESPONSE_HEAD_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a browser has to send a request's head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers of one hop, never passed on (RFC 9110, 7.6.1); an upgrade keeps
/// `Connection` and `Upgrade`, which are what it asks.
const HOP_BY_HOP: [&str; 7] = [
    "keep-alive",
    "te",
    "trailer",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "transfer-encoding",
];

fn strip_hop_by_hop(headers: &mut HeaderMap, upgrading: bool) {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if !upgrading {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

/// Whether a request comes from the lease's own page, or is a top-level
/// navigation (a link followed): a page of another lease (the same site)
/// or of another site may not send anything else with the browser's
/// cookie, nor open a WebSocket.
fn from_its_own_page(method: &Method, headers: &HeaderMap, origin: &str) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let safe =
        matches!(*method, Method::GET | Method::HEAD) && !headers.contains_key(header::UPGRADE);
    let navigating = safe
        && text("sec-fetch-mode") == Some("navigate")
        && text("sec-fetch-dest").is_none_or(|d| d == "document");
    if let Some(site) = text("sec-fetch-site") {
        if !matches!(site, "same-origin" | "none") && !navigating {
            return false;
        }
    }
    match text("origin") {
        Some(from) => from == origin || navigating,
        None => true,
    }
}

/// The request as the lease's port sees it: to `127.0.0.1:<port>`, as
/// through `lh lease open`, without the origin's cookie; its own origin
/// named as that address where the browser named the lease's origin.
fn inward(request: &mut Request<Incoming>, origin: &str, port: u16) {
    let local = format!("http://127.0.0.1:{port}");
    let upgrading = request.headers().contains_key(header::UPGRADE);
    let headers = request.headers_mut();
    strip_hop_by_hop(headers, upgrading);
    headers.insert(
        header::HOST,
        HeaderValue::from_str(&format!("127.0.0.1:{port}")).expect("an address"),
    );
    let cookies: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| {
            !c.is_empty()
                && !c.starts_with(&format!("{COOKIE}="))
                && !c.starts_with(&format!("__Host-{COOKIE}="))
        })
        .map(str::to_string)
        .collect();
    headers.remove(header::COOKIE);
    if !cookies.is_empty() {
        if let Ok(value) = HeaderValue::from_str(&cookies.join("; ")) {
            headers.insert(header::COOKIE, value);
        }
    }
    for name in [header::ORIGIN, header::REFERER] {
        let renamed = headers
            .get(&name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix(origin))
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
            .and_then(|rest| HeaderValue::from_str(&format!("{local}{rest}")).ok());
        if let Some(value) = renamed {
            headers.insert(name, value);
        }
    }
}

/// The answer as the browser sees it: a redirect to the lease's own
/// address named as the lease's origin, and no framing by another page
/// unless the answer says otherwise itself.
fn outward(response: &mut Response<Body>, origin: &str, port: u16) {
    let upgraded = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    strip_hop_by_hop(headers, upgraded);
    let location = headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            [
                format!("http://127.0.0.1:{port}"),
                format!("http://localhost:{port}"),
            ]
            .iter()
            .find_map(|local| v.strip_prefix(local.as_str()).map(str::to_string))
        })
        // The address itself only: `…:8888.evil.example` is another place.
        .filter(|rest| rest.is_empty() || rest.starts_with(['/', '?', '#']))
        .and_then(|rest| HeaderValue::from_str(&format!("{origin}{rest}")).ok());
    if let Some(location) = location {
        headers.insert(header::LOCATION, location);
    }
    if !headers.contains_key(header::X_FRAME_OPTIONS)
        && !headers.contains_key(header::CONTENT_SECURITY_POLICY)
    {
        headers.insert(
            header::X_FRAME_OPTIONS,
            HeaderValue::from_static("SAMEORIGIN"),
        );
    }
}

/// A connection to `lease`'s `port` over a new port-forward session,
/// opened as the cookie's tenant: a write of its own, as over the API.
async fn connect(
    reach: &Reach,
    session: WebSession,
    lease: Uuid,
    port: u16,
) -> Result<SendRequest<Incoming>, Response<Body>> {
    let tenant = session.tenant_id;
    if reach
        .write_budgets
        .spend(tenant, std::time::Instant::now())
        .is_err()
    {
        return Err(page(
            StatusCode::TOO_MANY_REQUESTS,
            "This tenant's writes are over their limit; try again shortly.",
        ));
    }
    let lease = (reach.lease_of)(tenant, lease)
        .await
        .ok_or_else(|| page(StatusCode::NOT_FOUND, "No such lease."))?;
    let opened = open::open(
        &reach.bus,
        &reach.sessions,
        Opening {
            actor: Actor::Tenant(tenant),
            lease,
            kind: OpenKind::PortForward { port },
            session_kind: SessionKind::PortForward,
            transport: SessionTransport::Http,
            reason: None,
            ssh_key_fingerprint: None,
            // A lease's web port is its first member's.
            member: None,
        },
    )
    .await
    .map_err(|e| page(e.status, &e.detail))?;
    let (client, stream) = stream_client::pair();
    let bus = reach.bus.clone();
    tokio::spawn(async move {
        opened.relay(&bus, client).await;
    });
    let (sender, connection) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| page(StatusCode::BAD_GATEWAY, &format!("the lease's port: {e}")))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    Ok(sender)
}

/// One request from a browser.
async fn handle(
    web: Arc<LeaseWeb>,
    reach: Reach,
    peer: std::net::IpAddr,
    mut request: Request<Incoming>,
) -> Response<Body> {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let Some((lease, port)) = web.named(&host) else {
        return page(StatusCode::NOT_FOUND, "No lease is served at this name.");
    };
    let origin = web.origin(lease, port);
    if request.uri().path() == ENTER_PATH {
        let query = request.uri().query().unwrap_or_default().to_string();
        return web.enter(&reach.pool, lease, port, &query).await;
    }
    if !from_its_own_page(request.method(), request.headers(), &origin) {
        return page(
            StatusCode::FORBIDDEN,
            "A request from another page is not carried into a lease.",
        );
    }
    let mut session = None;
    for cookie in cookies_named(&request, &web.cookie_name()) {
        session = web
            .session_of(&reach.pool, &cookie)
            .await
            .filter(|s| s.lease_id == lease && s.port == port as i32);
        if session.is_some() {
            break;
        }
    }
    let Some(session) = session else {
        return page(
            StatusCode::UNAUTHORIZED,
            "Open this lease's web page from the console (its lease page) to come in.",
        );
    };
    let upgrading = request.headers().contains_key(header::UPGRADE);
    let browser_side = upgrading.then(|| hyper::upgrade::on(&mut request));
    inward(&mut request, &origin, port);
    let key = (lease, port);
    let mut sender = match web.take_idle(key) {
        Some(sender) => sender,
        None => match connect(&reach, session, lease, port).await {
            Ok(sender) => sender,
            Err(refused) => return refused,
        },
    };
    let answer = tokio::time::timeout(RESPONSE_HEAD_TIMEOUT, sender.send_request(request)).await;
    let mut answer = match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return page(StatusCode::BAD_GATEWAY, &format!("the lease's port: {e}")),
        Err(_) => {
            return page(
                StatusCode::GATEWAY_TIMEOUT,
                "the lease's port did not answer in time",
            )
        }
    };
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
        // The connection is the upgraded stream's now: both ends joined,
        // counted among the connections this replica serves and its
        // address holds.
        let Ok(permit) = web.connections.clone().try_acquire_owned() else {
            return page(
                StatusCode::SERVICE_UNAVAILABLE,
                "As many connections as this gateway serves are open; try again shortly.",
            );
        };
        let Some(slot) = web
            .by_address
            .take(peer, super::MAX_CONNECTIONS_PER_ADDRESS)
        else {
            return page(
                StatusCode::SERVICE_UNAVAILABLE,
                "As many connections as one address may hold are open; close some and try again.",
            );
        };
        let lease_side = hyper::upgrade::on(&mut answer);
        if let Some(browser_side) = browser_side {
            tokio::spawn(async move {
                let _held = (permit, slot);
                if let (Ok(browser), Ok(lease)) = (browser_side.await, lease_side.await) {
                    let _ = tokio::io::copy_bidirectional(
                        &mut TokioIo::new(browser),
                        &mut TokioIo::new(lease),
                    )
                    .await;
                }
            });
        }
    } else {
        web.keep_idle(key, sender);
    }
    let (parts, body) = answer.into_parts();
    let mut response = Response::from_parts(parts, Body::new(body));
    outward(&mut response, &origin, port);
    response
}

/// Serves leases' web pages on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    web: Arc<LeaseWeb>,
    reach: Reach,
    shutdown: CancellationToken,
) {
    let mut sweeping = tokio::time::interval(SWEEP_EVERY);
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = sweeping.tick() => {
                web.sweep();
                continue;
            }
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "lease web: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = web.connections.clone().try_acquire_owned() else {
            // As many connections as this replica serves: this one is
            // closed at once, and its browser tries again.
            continue;
        };
        let Some(slot) = web
            .by_address
            .take(peer.ip(), super::MAX_CONNECTIONS_PER_ADDRESS)
        else {
            // As many as one address may hold: closed at once too.
            continue;
        };
        let (web, reach) = (web.clone(), reach.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let (web, reach) = (web.clone(), reach.clone());
                async move {
                    Ok::<_, std::convert::Infallible>(handle(web, reach, peer.ip(), request).await)
                }
            });
            // A browser that sends no head within the time is let go, so
            // idle connections cannot hold every place.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
            drop((permit, slot));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: &str = "http://l-8888.localhost:8090";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn another_pages_requests_are_not_carried_but_a_link_followed_is() {
        let own =
            |m: Method, h: &[(&'static str, &str)]| from_its_own_page(&m, &headers(h), ORIGIN);
        // Its own page, and clients that say nothing.
        assert!(own(
            Method::POST,
            &[("origin", ORIGIN), ("sec-fetch-site", "same-origin")]
        ));
        assert!(own(Method::GET, &[]));
        // Another lease's page (the same site), or another site.
        let other = "http://m-8888.localhost:8090";
        assert!(!own(
            Method::POST,
            &[("origin", other), ("sec-fetch-site", "same-site")]
        ));
        assert!(!own(Method::POST, &[("origin", other)]));
        assert!(!own(
            Method::GET,
            &[("sec-fetch-site", "same-site"), ("sec-fetch-mode", "cors")]
        ));
        assert!(!own(
            Method::GET,
            &[
                ("sec-fetch-site", "cross-site"),
                ("sec-fetch-dest", "image")
            ]
        ));
        assert!(!own(
            Method::GET,
            &[
                ("origin", other),
                ("upgrade", "websocket"),
                ("sec-fetch-site", "same-site")
            ]
        ));
        assert!(!own(
            Method::GET,
            &[
                ("sec-fetch-site", "cross-site"),
                ("sec-fetch-mode", "navigate"),
                ("sec-fetch-dest", "iframe")
            ]
        ));
        // A link from anywhere, followed in the window.
        assert!(own(
            Method::GET,
            &[
                ("sec-fetch-site", "cross-site"),
                ("sec-fetch-mode", "navigate"),
                ("sec-fetch-dest", "document")
            ]
        ));
    }

    #[test]
    fn a_redirect_is_renamed_only_when_it_is_the_lease_s_own_address() {
        let answer = |location: &str| {
            let mut response = Response::builder()
                .status(StatusCode::FOUND)
                .header(header::LOCATION, location)
                .header(header::CONNECTION, "close")
                .body(Body::empty())
                .unwrap();
            outward(&mut response, ORIGIN, 8888);
            response
        };
        let renamed = answer("http://127.0.0.1:8888/tree?x=1");
        assert_eq!(
            renamed.headers()[header::LOCATION],
            format!("{ORIGIN}/tree?x=1")
        );
        assert!(!renamed.headers().contains_key(header::CONNECTION));
        assert_eq!(renamed.headers()[header::X_FRAME_OPTIONS], "SAMEORIGIN");
        for elsewhere in [
            "http://127.0.0.1:8888.evil.example/",
            "http://127.0.0.1:8888@evil.example/",
        ] {
            assert_eq!(answer(elsewhere).headers()[header::LOCATION], elsewhere);
        }
    }
}
