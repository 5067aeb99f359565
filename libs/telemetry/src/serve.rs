//! The one HTTP server every service runs: plain or TLS (rustls), with a
//! bound on open connections, on the time a client may take to send its
//! headers and to finish a TLS handshake, so that idle or slow clients
//! (slowloris) cannot hold the server's sockets.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

/// How the server treats its clients.
#[derive(Clone)]
pub struct ServeOptions {
    /// TLS for every connection; plain HTTP when `None`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Longest a client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// Longest a TLS handshake may take.
    pub tls_handshake_timeout: Duration,
    /// Most connections open at once; past it new ones are closed at once.
    pub max_connections: usize,
    /// Longest open requests may take to finish at shutdown.
    pub shutdown_grace: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            tls: None,
            header_read_timeout: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
            max_connections: 10_000,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// A rustls server configuration from PEM files: the certificate chain
/// (leaf first) and its private key.
pub fn tls_config(cert_file: &Path, key_file: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| anyhow::anyhow!("TLS certificate {}: {e}", cert_file.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("TLS certificate {}: {e}", cert_file.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "TLS certificate {} holds no certificate",
        cert_file.display()
    );
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| anyhow::anyhow!("TLS key {}: {e}", key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| anyhow::anyhow!("TLS certificate and key do not match: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `router` on `addr` until `shutdown` resolves, then lets open
/// requests finish for up to the grace. Each request carries the client's
/// address as `ConnectInfo<SocketAddr>`.
pub async fn serve_with(
    addr: &str,
    router: Router,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(accept_loop(listener, router, options, shutdown));
    Ok((local, task))
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: Router,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let acceptor = options.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(Semaphore::new(options.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before
                    // it was accepted: wait a little rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics::counter!("lh_http_connections_refused_total").increment(1);
            drop(stream);
            continue;
        };
        let (builder, router, watcher) = (builder.clone(), router.clone(), graceful.watcher());
        let (acceptor, handshake_timeout) = (acceptor.clone(), options.tls_handshake_timeout);
        tokio::spawn(async move {
            let _slot = slot;
            match acceptor {
                None => serve_connection(stream, peer, builder, router, watcher).await,
                Some(acceptor) => {
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => serve_connection(tls, peer, builder, router, watcher).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(options.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("open requests outlived the shutdown grace");
    }
}

async fn serve_connection<IO>(
    io: IO,
    peer: SocketAddr,
    builder: auto::Builder<TokioExecutor>,
    router: Router,
    watcher: hyper_util::server::graceful::Watcher,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = tower::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        router.clone().oneshot(request)
    });
    let connection =
        builder.serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(service));
    if let Err(e) = watcher.watch(connection.into_owned()).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn router() -> Router {
        Router::new().route(
            "/who",
            axum::routing::get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                peer.ip().to_string()
            }),
        )
    }

    #[tokio::test]
    async fn given_a_client_that_sends_no_headers_when_the_timeout_passes_then_it_is_cut_off() {
        let options = ServeOptions {
            header_read_timeout: Duration::from_millis(300),
            ..ServeOptions::default()
        };
        let (addr, _task) = serve_with("127.0.0.1:0", router(), options, std::future::pending())
            .await
            .unwrap();
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /who HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut out)).await;
        assert!(
            read.is_ok(),
            "the server kept a client that never finished its headers"
        );

        let body = reqwest::get(format!("http://{addr}/who"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(body, "127.0.0.1", "requests carry the client's address");
    }

    #[tokio::test]
    async fn given_the_connection_bound_when_one_more_connects_then_it_is_closed_at_once() {
        let options = ServeOptions {
            max_connections: 1,
            ..ServeOptions::default()
        };
        let (addr, _task) = serve_with("127.0.0.1:0", router(), options, std::future::pending())
            .await
            .unwrap();
        let _first = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), second.read(&mut buf))
            .await
            .expect("closed, not left hanging")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn given_a_certificate_when_served_then_only_tls_clients_that_trust_it_get_answers() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let options = ServeOptions {
            tls: Some(tls_config(&cert_file, &key_file).unwrap()),
            ..ServeOptions::default()
        };
        let (addr, _task) = serve_with("127.0.0.1:0", router(), options, std::future::pending())
            .await
            .unwrap();
        let url = format!("https://localhost:{}/who", addr.port());
        let trusting = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(cert.pem().as_bytes()).unwrap())
            .resolve("localhost", addr)
            .build()
            .unwrap();
        let body = trusting
            .get(&url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(body, "127.0.0.1");
        let stranger = reqwest::Client::builder()
            .resolve("localhost", addr)
            .build()
            .unwrap();
        assert!(
            stranger.get(&url).send().await.is_err(),
            "an untrusted certificate"
        );
        assert!(
            reqwest::get(format!("http://{addr}/who")).await.is_err()
                || !reqwest::get(format!("http://{addr}/who"))
                    .await
                    .unwrap()
                    .status()
                    .is_success(),
            "plain HTTP on a TLS port"
        );

        std::fs::write(&key_file, "not a key").unwrap();
        let err = tls_config(&cert_file, &key_file).unwrap_err().to_string();
        assert!(err.contains("TLS key"), "{err}");
    }
}
