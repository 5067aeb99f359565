//! A lease's web pages in the browser (a notebook, a dashboard): each
//! port of each lease at an origin of its own, `<lease>-<port>.` before
//! the configured domain (`http://<lease>-8888.localhost:8090/`), so that
//! no tenant's page shares an origin, and so cookies and storage, with the
//! console, the API or another lease. The gateway carries each request to
//! the port inside the lease over port-forward sessions to its node, kept
//! open across requests, as `lh lease open` does from a terminal.
//!
//! A browser gets in with a ticket: the console asks for one with the
//! tenant's key (`POST /v1/leases/{id}/web`), a single use within a
//! minute, which the origin trades for a cookie of its own (HttpOnly,
//! SameSite=Lax, Secure over https) naming that lease's port only. The
//! cookie never reaches the tenant's program. Seen from inside, requests
//! come as they do through `lh lease open`: to `127.0.0.1:<port>`.

pub mod stream_client;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use chrono::{DateTime, Utc};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use lh_events::{Actor, SessionKind, SessionTransport};
use lh_rpc::session::OpenKind;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::http::ApiContext;
use crate::poison_free::PoisonFreeRwLock;
use crate::seal::{
    KEYS_SCHEMA, LEASE_WEB_SESSIONS_TABLE as SESSIONS, LEASE_WEB_TICKETS_TABLE as TICKETS,
};
use crate::sessions::open::{self, Opening};

/// Where a ticket is traded for the origin's cookie.
pub const ENTER_PATH: &str = "/.leasehold/enter";
/// The origin's own cookie.
pub const COOKIE: &str = "lh_lease_web";
/// How long a ticket may wait before it is used.
pub const TICKET_SECS: i64 = 60;
/// How long a browser stays in before it needs a new ticket.
pub const SESSION_SECS: i64 = 12 * 3600;
/// Idle connections to one lease's port kept for the next requests.
pub const MOST_IDLE_PER_PORT: usize = 8;
/// How long an idle connection to a lease's port is kept.
pub const IDLE_SECS: u64 = 60;
/// Browser connections one replica serves at once.
pub const MAX_CONNECTIONS: usize = 1024;
/// Cookies remembered between the database's answers.
const MOST_SESSIONS_CACHED: usize = 10_000;
/// Longest path a ticket leads to, in bytes.
pub const MAX_NEXT_PATH_BYTES: usize = 2048;
/// How long a request may wait for its lease's port to answer its head.
const RESPONSE_HEAD_TIMEOUT: Duration = Duration::from_secs(60);

/// Where leases' web pages are served, from the gateway's configuration.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LeaseWebArgs {
    /// Where the gateway serves leases' web pages, e.g. 127.0.0.1:8090;
    /// none unless set (with LH_LEASE_WEB_BASE).
    #[arg(long, env = "LH_LEASE_WEB_ADDR", requires = "lease_web_base")]
    pub lease_web_addr: Option<String>,
    /// How browsers reach that address: scheme, domain and port. Each
    /// lease's port is at the host `<lease>-<port>.` before the domain:
    /// `http://localhost:8090` (browsers take any `*.localhost` for
    /// loopback), or `https://leases.example.com` behind a wildcard name
    /// and certificate.
    #[arg(long, env = "LH_LEASE_WEB_BASE", requires = "lease_web_addr")]
    pub lease_web_base: Option<String>,
}

/// The lease web origins, checked.
pub struct LeaseWeb {
    scheme: String,
    /// The domain and port after `<lease>-<port>.`.
    domain: String,
    pool: PoisonFreeRwLock<HashMap<(Uuid, u16), Vec<Idle>>>,
    sessions: PoisonFreeRwLock<HashMap<[u8; 32], WebSession>>,
    connections: Arc<tokio::sync::Semaphore>,
}

struct Idle {
    sender: SendRequest<Incoming>,
    since: Instant,
}

/// Who a cookie lets in, and where.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
struct WebSession {
    tenant_id: Uuid,
    lease_id: Uuid,
    port: i32,
    expires_at: DateTime<Utc>,
}

impl LeaseWebArgs {
    pub fn config(&self) -> anyhow::Result<Option<LeaseWeb>> {
        let Some(base) = &self.lease_web_base else {
            return Ok(None);
        };
        let url: reqwest::Url = base
            .parse()
            .map_err(|e| anyhow::anyhow!("LH_LEASE_WEB_BASE {base:?} is not a URL: {e}"))?;
        anyhow::ensure!(
            ["http", "https"].contains(&url.scheme()) && url.path() == "/" && url.query().is_none(),
            "LH_LEASE_WEB_BASE is a scheme, a domain and a port, e.g. http://localhost:8090"
        );
        let host = url
            .host_str()
            .ok_or_else(|| anyhow::anyhow!("LH_LEASE_WEB_BASE names no domain"))?;
        anyhow::ensure!(
            host.parse::<std::net::IpAddr>().is_err() && !host.starts_with('['),
            "LH_LEASE_WEB_BASE needs a domain, not an address: each lease gets a name under it"
        );
        let domain = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        };
        Ok(Some(LeaseWeb {
            scheme: url.scheme().to_string(),
            domain,
            pool: PoisonFreeRwLock::default(),
            sessions: PoisonFreeRwLock::default(),
            connections: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
        }))
    }
}

fn secret() -> (String, [u8; 32]) {
    use rand::RngCore as _;
    let mut bytes = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut bytes);
    let secret = hex::encode(bytes);
    let sha: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
    (secret, sha)
}

/// Whether `path` may follow a ticket: a path of the origin's own.
pub fn next_path_ok(path: &str) -> bool {
    path.starts_with('/')
        && !path.starts_with("//")
        && !path.starts_with("/\\")
        && path.len() <= MAX_NEXT_PATH_BYTES
        && !path.chars().any(|c| c.is_control() || c == ' ')
}

impl LeaseWeb {
    /// The origin of `lease`'s `port`.
    pub fn origin(&self, lease: Uuid, port: u16) -> String {
        format!("{}://{lease}-{port}.{}", self.scheme, self.domain)
    }

    /// The lease and port a request's `Host` names.
    fn named(&self, host: &str) -> Option<(Uuid, u16)> {
        let label = host.strip_suffix(&self.domain)?.strip_suffix('.')?;
        let (lease, port) = label.rsplit_once('-')?;
        Some((lease.parse().ok()?, port.parse().ok().filter(|p| *p > 0)?))
    }

    /// A ticket into `lease`'s `port` for `tenant`, leading to `next`: the
    /// URL to open.
    pub async fn ticket(
        &self,
        pool: &sqlx::PgPool,
        tenant: Uuid,
        lease: Uuid,
        port: u16,
        next: &str,
    ) -> Result<(String, DateTime<Utc>), sqlx::Error> {
        let (secret, sha) = secret();
        let expires_at = Utc::now() + chrono::Duration::seconds(TICKET_SECS);
        sqlx::query(&format!(
            "DELETE FROM {KEYS_SCHEMA}.{TICKETS} WHERE expires_at < now()"
        ))
        .execute(pool)
        .await?;
        sqlx::query(&format!(
            "INSERT INTO {KEYS_SCHEMA}.{TICKETS}
                 (sha256, tenant_id, lease_id, port, next_path, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6)"
        ))
        .bind(&sha[..])
        .bind(tenant)
        .bind(lease)
        .bind(port as i32)
        .bind(next)
        .bind(expires_at)
        .execute(pool)
        .await?;
        Ok((
            format!("{}{ENTER_PATH}?ticket={secret}", self.origin(lease, port)),
            expires_at,
        ))
    }

    async fn session_of(&self, pool: &sqlx::PgPool, cookie: &str) -> Option<WebSession> {
        let sha: [u8; 32] = Sha256::digest(cookie.as_bytes()).into();
        let now = Utc::now();
        if let Some(found) = self.sessions.read().get(&sha).copied() {
            return (found.expires_at > now).then_some(found);
        }
        let found: Option<WebSession> = sqlx::query_as(&format!(
            "SELECT tenant_id, lease_id, port, expires_at FROM {KEYS_SCHEMA}.{SESSIONS}
             WHERE sha256 = $1 AND expires_at > now()"
        ))
        .bind(&sha[..])
        .fetch_optional(pool)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read a lease web cookie");
            None
        });
        if let Some(found) = found {
            let mut cached = self.sessions.write();
            if cached.len() >= MOST_SESSIONS_CACHED {
                cached.clear();
            }
            cached.insert(sha, found);
        }
        found
    }

    /// Trades a ticket for a cookie: the answer that sets it and leads on.
    async fn enter(&self, ctx: &ApiContext, lease: Uuid, port: u16, query: &str) -> Response<Body> {
        let ticket = form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == "ticket")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        let sha: [u8; 32] = Sha256::digest(ticket.as_bytes()).into();
        // Used once: taken from the table as it is read.
        let taken: Option<(Uuid, Uuid, i32, String)> = sqlx::query_as(&format!(
            "DELETE FROM {KEYS_SCHEMA}.{TICKETS} WHERE sha256 = $1 AND expires_at > now()
             RETURNING tenant_id, lease_id, port, next_path"
        ))
        .bind(&sha[..])
        .fetch_optional(&ctx.pool)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read a lease web ticket");
            None
        });
        let Some((tenant, ticket_lease, ticket_port, next)) = taken else {
            return page(
                StatusCode::UNAUTHORIZED,
                "This link was used already or has expired: open the lease's web page from the console again.",
            );
        };
        if ticket_lease != lease || ticket_port != port as i32 {
            return page(
                StatusCode::UNAUTHORIZED,
                "This ticket is for another lease or port.",
            );
        }
        let (cookie, sha) = secret();
        let expires_at = Utc::now() + chrono::Duration::seconds(SESSION_SECS);
        let stored = sqlx::query(&format!(
            "INSERT INTO {KEYS_SCHEMA}.{SESSIONS} (sha256, tenant_id, lease_id, port, expires_at)
             VALUES ($1, $2, $3, $4, $5)"
        ))
        .bind(&sha[..])
        .bind(tenant)
        .bind(lease)
        .bind(port as i32)
        .bind(expires_at)
        .execute(&ctx.pool)
        .await;
        if let Err(e) = stored {
            tracing::warn!(error = %e, "cannot keep a lease web cookie");
            return page(StatusCode::SERVICE_UNAVAILABLE, "Try again shortly.");
        }
        let secure = if self.scheme == "https" {
            "; Secure"
        } else {
            ""
        };
        let mut response = Response::builder()
            .status(StatusCode::SEE_OTHER)
            .header(header::LOCATION, next)
            .header(header::CACHE_CONTROL, "no-store")
            .header(header::REFERRER_POLICY, "no-referrer")
            .body(Body::empty())
            .expect("a redirect");
        response.headers_mut().insert(
            header::SET_COOKIE,
            HeaderValue::from_str(&format!(
                "{COOKIE}={cookie}; Path=/; HttpOnly; SameSite=Lax; Max-Age={SESSION_SECS}{secure}"
            ))
            .expect("hex is a header value"),
        );
        response
    }

    fn take_idle(&self, key: (Uuid, u16)) -> Option<SendRequest<Incoming>> {
        let mut pool = self.pool.write();
        let idle = pool.get_mut(&key)?;
        idle.retain(|i| !i.sender.is_closed() && i.since.elapsed().as_secs() < IDLE_SECS);
        let at = idle.iter().position(|i| i.sender.is_ready())?;
        Some(idle.swap_remove(at).sender)
    }

    fn keep_idle(&self, key: (Uuid, u16), sender: SendRequest<Incoming>) {
        let mut pool = self.pool.write();
        let idle = pool.entry(key).or_default();
        idle.retain(|i| !i.sender.is_closed());
        if idle.len() < MOST_IDLE_PER_PORT {
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }
}

/// A short page of the gateway's own, for what it refuses.
fn page(status: StatusCode, text: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from(format!("Leasehold: {text}\n")))
        .expect("a page")
}

fn cookie_of(request: &Request<Incoming>) -> Option<String> {
    request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// The request as the lease's port sees it: to `127.0.0.1:<port>`, as
/// through `lh lease open`, without the origin's cookie; its own origin
/// named as that address where the browser named the lease's origin.
fn inward(request: &mut Request<Incoming>, origin: &str, port: u16) {
    let local = format!("http://127.0.0.1:{port}");
    let headers = request.headers_mut();
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
        .filter(|c| !c.is_empty() && !c.starts_with(&format!("{COOKIE}=")))
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
/// address named as the lease's origin.
fn outward(response: &mut Response<Body>, origin: &str, port: u16) {
    let location = response
        .headers()
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
        .and_then(|rest| HeaderValue::from_str(&format!("{origin}{rest}")).ok());
    if let Some(location) = location {
        response.headers_mut().insert(header::LOCATION, location);
    }
}

/// A connection to `lease`'s `port` over a new port-forward session.
async fn connect(
    ctx: &ApiContext,
    tenant: Uuid,
    lease: Uuid,
    port: u16,
) -> Result<SendRequest<Incoming>, Response<Body>> {
    let caller = crate::http::Caller::Tenant {
        id: tenant,
        max_gpus: 0,
    };
    let lease = crate::http::leases::visible(ctx, &caller, lease)
        .await
        .map_err(|_| page(StatusCode::NOT_FOUND, "No such lease."))?;
    let opened = open::open(
        &ctx.bus,
        &ctx.sessions,
        Opening {
            actor: Actor::Tenant(tenant),
            lease,
            kind: OpenKind::PortForward { port },
            session_kind: SessionKind::PortForward,
            transport: SessionTransport::Http,
            reason: None,
            ssh_key_fingerprint: None,
        },
    )
    .await
    .map_err(|e| page(e.status, &e.detail))?;
    let (client, stream) = stream_client::pair();
    let bus = ctx.bus.clone();
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
    ctx: ApiContext,
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
        return web.enter(&ctx, lease, port, &query).await;
    }
    let session = match cookie_of(&request) {
        Some(cookie) => web.session_of(&ctx.pool, &cookie).await,
        None => None,
    };
    let Some(session) = session.filter(|s| s.lease_id == lease && s.port == port as i32) else {
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
        None => match connect(&ctx, session.tenant_id, lease, port).await {
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
        // The connection is the upgraded stream's now: both ends joined.
        let lease_side = hyper::upgrade::on(&mut answer);
        if let Some(browser_side) = browser_side {
            tokio::spawn(async move {
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
    ctx: ApiContext,
    shutdown: CancellationToken,
) {
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
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
            // As many connections as this replica serves: this one waits
            // for none, and its browser tries again.
            continue;
        };
        let (web, ctx) = (web.clone(), ctx.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let (web, ctx) = (web.clone(), ctx.clone());
                async move { Ok::<_, std::convert::Infallible>(handle(web, ctx, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn web() -> LeaseWeb {
        LeaseWebArgs {
            lease_web_addr: Some("127.0.0.1:0".into()),
            lease_web_base: Some("http://localhost:8090".into()),
        }
        .config()
        .unwrap()
        .unwrap()
    }

    #[test]
    fn each_lease_port_has_a_name_of_its_own_and_nothing_else_is_one() {
        let web = web();
        let lease = Uuid::from_u128(7);
        let origin = web.origin(lease, 8888);
        assert_eq!(origin, format!("http://{lease}-8888.localhost:8090"));
        assert_eq!(
            web.named(&format!("{lease}-8888.localhost:8090")),
            Some((lease, 8888))
        );
        for host in [
            format!("{lease}-8888.localhost:8091"),
            format!("{lease}-0.localhost:8090"),
            format!("{lease}-99999.localhost:8090"),
            format!("x{lease}-8888.localhost:8090"),
            "localhost:8090".into(),
            format!("{lease}-8888.evil.localhost:8090"),
        ] {
            assert_eq!(web.named(&host), None, "{host}");
        }
        assert!(LeaseWebArgs {
            lease_web_addr: Some("127.0.0.1:0".into()),
            lease_web_base: Some("http://127.0.0.1:8090".into()),
        }
        .config()
        .is_err());
    }

    #[test]
    fn a_ticket_leads_only_to_a_path_of_the_origin() {
        assert!(next_path_ok("/"));
        assert!(next_path_ok("/tree?token=abc"));
        for bad in [
            "",
            "//evil.example/",
            "/\\evil",
            "https://evil.example/",
            "/a b",
            "/a\nb",
        ] {
            assert!(!next_path_ok(bad), "{bad:?}");
        }
        assert!(!next_path_ok(&format!(
            "/{}",
            "a".repeat(MAX_NEXT_PATH_BYTES)
        )));
    }
}
