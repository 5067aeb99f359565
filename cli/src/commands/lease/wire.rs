//! What `lease exec`, `lease shell` and `lease port-forward` share: the
//! WebSocket of a session into a lease (docs/adr/030), opened at the
//! gateway's URL with its key, and its frames: one message each, a channel
//! byte, then that channel's bytes.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lh_rpc::http::sessions::{CHANNEL_CLOSE, MAX_SESSION_MESSAGE_BYTES};
use reqwest::Url;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::header::{
    HeaderValue, AUTHORIZATION, SEC_WEBSOCKET_PROTOCOL, USER_AGENT,
};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::client::{Gateway, REQUEST_TIMEOUT};
use crate::error::{CliError, Problem};

/// An open session's WebSocket.
pub(crate) type Session = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Most bytes of a stream one message carries: the gateway's most, less
/// the channel byte.
pub(crate) const MAX_FRAME_DATA_BYTES: usize = MAX_SESSION_MESSAGE_BYTES - 1;

/// The WebSocket URL of an HTTP one: `ws://` for `http://`, `wss://` for
/// `https://`, the rest as it is.
pub(crate) fn ws_url(http: &Url) -> Url {
    let mut url = http.clone();
    let scheme = if http.scheme() == "https" {
        "wss"
    } else {
        "ws"
    };
    // Both are special schemes, between which the url crate allows a change.
    let _ = url.set_scheme(scheme);
    url
}

/// Opens the WebSocket at `base` + `segments` + `query` with the
/// gateway's key and `subprotocol`. A refused upgrade is the gateway's
/// problem document, shown as any other command's error.
pub(crate) async fn open(
    gw: &Gateway,
    segments: &[&str],
    query: &[(&str, &str)],
    subprotocol: &'static str,
) -> Result<Session, CliError> {
    let url = ws_url(&gw.url(segments, query));
    // The query may carry a whole command line: errors name the path only.
    let shown = {
        let mut shown = url.clone();
        shown.set_query(None);
        shown.to_string()
    };
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| CliError::Usage(format!("cannot make a WebSocket request to {shown}: {e}")))?;
    let headers = request.headers_mut();
    headers.insert(
        SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(subprotocol),
    );
    headers.insert(
        USER_AGENT,
        HeaderValue::from_static(concat!("lh/", env!("CARGO_PKG_VERSION"))),
    );
    if let Some(authorization) = gw.authorization() {
        headers.insert(AUTHORIZATION, authorization.clone());
    }
    let tls = tls_config().map_err(|reason| CliError::Unreachable {
        url: shown.clone(),
        reason,
    })?;
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_SESSION_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_SESSION_MESSAGE_BYTES));
    // Nagle off: a key press goes out at once, not with the next one.
    let connect = tokio_tungstenite::connect_async_tls_with_config(
        request,
        Some(config),
        true,
        Some(Connector::Rustls(tls)),
    );
    match tokio::time::timeout(REQUEST_TIMEOUT, connect).await {
        Err(_) => Err(CliError::Unreachable {
            url: shown,
            reason: "timed out".into(),
        }),
        Ok(Ok((session, _))) => Ok(session),
        Ok(Err(e)) => Err(refusal(shown, e)),
    }
}

/// Why an upgrade did not happen, as the error `lh` shows.
fn refusal(url: String, e: WsError) -> CliError {
    match e {
        WsError::Http(answer) => {
            let body = answer.body().as_deref().unwrap_or_default();
            CliError::Api(Problem::from_response(
                answer.status().as_u16(),
                &String::from_utf8_lossy(body),
            ))
        }
        WsError::Io(e) => CliError::Unreachable {
            url,
            reason: e.to_string(),
        },
        WsError::Tls(e) => CliError::Unreachable {
            url,
            reason: e.to_string(),
        },
        WsError::Url(e) => CliError::Unreachable {
            url,
            reason: e.to_string(),
        },
        other => CliError::BadResponse {
            url,
            reason: format!("the WebSocket did not open ({other})"),
        },
    }
}

/// TLS as reqwest has it: rustls on ring with webpki's roots, built once.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            // The provider named, not the process default: a second one
            // enabled by some other crate's features must not change it.
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("cannot set up TLS: {e}"))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            // A WebSocket upgrade is HTTP/1.1; say so to a front that
            // would otherwise pick HTTP/2.
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        })
        .clone()
}

/// A message of `data` on `channel`.
pub(crate) fn frame(channel: u8, data: &[u8]) -> Message {
    let mut bytes = Vec::with_capacity(1 + data.len());
    bytes.push(channel);
    bytes.extend_from_slice(data);
    Message::Binary(bytes.into())
}

/// `[255, channel]`: nothing more will be sent on `channel`.
pub(crate) fn end_of(channel: u8) -> Message {
    frame(CHANNEL_CLOSE, &[channel])
}

/// A message's channel and bytes; `None` for an empty message, which has
/// no channel.
pub(crate) fn split_frame(message: &[u8]) -> Option<(u8, &[u8])> {
    message
        .split_first()
        .map(|(channel, data)| (*channel, data))
}

/// The close frame `lh` ends a session with.
pub(crate) fn close(reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: reason.into(),
    }))
}

/// How long the close frame `lh` ends a session with may take to go out,
/// behind what the writer still holds.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Lets a session's writer send what it holds, the close frame last, for
/// at most [`CLOSE_GRACE`]; nothing when it is done already.
pub(crate) async fn finish(
    writer: &mut (impl Future<Output = Result<(), WsError>> + Unpin),
    writer_done: bool,
) {
    if !writer_done {
        let _ = tokio::time::timeout(CLOSE_GRACE, writer).await;
    }
}

/// A close frame as a person reads it: `1011 (node stopped answering)`.
pub(crate) fn describe_close(frame: Option<&CloseFrame>) -> String {
    match frame {
        None => "without a status".to_string(),
        Some(frame) if frame.reason.is_empty() => u16::from(frame.code).to_string(),
        Some(frame) => format!("{} ({})", u16::from(frame.code), frame.reason.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_rpc::http::sessions::{CHANNEL_DATA, CHANNEL_STDIN, CHANNEL_STDOUT};

    fn bytes(message: Message) -> Vec<u8> {
        match message {
            Message::Binary(b) => b.to_vec(),
            other => panic!("not binary: {other:?}"),
        }
    }

    #[test]
    fn a_frame_is_its_channel_then_its_bytes() {
        assert_eq!(bytes(frame(CHANNEL_STDIN, b"ls\n")), b"\x00ls\n");
        assert_eq!(bytes(frame(CHANNEL_STDOUT, b"")), [CHANNEL_STDOUT]);
        assert_eq!(bytes(end_of(CHANNEL_STDIN)), [255, 0]);
        assert_eq!(bytes(end_of(CHANNEL_DATA)), [CHANNEL_CLOSE, CHANNEL_DATA]);
        let data: Vec<u8> = (0..=255).collect();
        let sent = bytes(frame(2, &data));
        assert_eq!(split_frame(&sent), Some((2, &data[..])));
        assert_eq!(split_frame(&[255, 0]), Some((255, &[0][..])));
        assert_eq!(split_frame(&[3]), Some((3, &[][..])));
        assert_eq!(split_frame(&[]), None);
    }

    #[test]
    fn a_full_chunk_is_the_largest_message_the_gateway_takes() {
        let chunk = vec![7u8; MAX_FRAME_DATA_BYTES];
        assert_eq!(
            bytes(frame(CHANNEL_DATA, &chunk)).len(),
            MAX_SESSION_MESSAGE_BYTES
        );
    }

    #[test]
    fn sessions_go_to_the_websocket_of_the_gateway_s_scheme() {
        let gw = Gateway::new("https://gw.example/api/", None).unwrap();
        let url = gw.url(
            &["v1", "leases", "L1", "exec"],
            &[
                ("command", "sh"),
                ("command", "-c"),
                ("command", "echo a&b=c"),
            ],
        );
        assert_eq!(
            ws_url(&url).as_str(),
            "wss://gw.example/api/v1/leases/L1/exec?command=sh&command=-c&command=echo+a%26b%3Dc"
        );
        let gw = Gateway::new("http://127.0.0.1:8080", None).unwrap();
        assert_eq!(
            ws_url(&gw.url(&["v1", "leases", "L1", "port-forward"], &[("port", "80")])).as_str(),
            "ws://127.0.0.1:8080/v1/leases/L1/port-forward?port=80"
        );
    }

    #[test]
    fn a_close_reads_as_its_code_and_reason() {
        let frame = CloseFrame {
            code: CloseCode::from(1011),
            reason: "node stopped answering".into(),
        };
        assert_eq!(
            describe_close(Some(&frame)),
            "1011 (node stopped answering)"
        );
        let frame = CloseFrame {
            code: CloseCode::from(1001),
            reason: "".into(),
        };
        assert_eq!(describe_close(Some(&frame)), "1001");
        assert_eq!(describe_close(None), "without a status");
    }

    #[test]
    fn tls_is_set_up_on_ring_with_the_webpki_roots() {
        let config = tls_config().unwrap();
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
        assert!(config.crypto_provider().cipher_suites.len() > 1);
    }
}
