//! A thin HTTP client for the gateway: builds URLs, adds the bearer token,
//! sends the contract's request bodies (`lh_rpc::http`), and turns every
//! answer into JSON, the contract's type of it, or a [`CliError`].

use crate::error::{CliError, Problem};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use reqwest::{Method, Url};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::time::Duration;

/// How long a TCP connection (and its TLS) to the gateway may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request, a WebSocket's upgrade included, may take.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Most pages a paged read (`lease ls --all`, the audit replay and
/// exports) follows before giving up on the gateway.
pub(crate) const MAX_PAGES: usize = 10_000;

/// Set to `1` to send a key over plain HTTP to a host that is not this machine.
pub const ALLOW_PLAIN_HTTP_ENV: &str = "LH_ALLOW_PLAIN_HTTP";

fn plain_http_allowed() -> bool {
    std::env::var(ALLOW_PLAIN_HTTP_ENV).is_ok_and(|v| v.trim() == "1")
}

/// Whether the URL names this machine, where plain HTTP crosses no network.
fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
}

/// Connection to one gateway with one set of credentials.
#[derive(Debug, Clone)]
pub struct Gateway {
    http: reqwest::Client,
    base: Url,
    /// `Bearer <key>`, marked sensitive (Debug does not show it), for the
    /// WebSockets of a session, which do not go through `http`.
    authorization: Option<HeaderValue>,
}

impl Gateway {
    /// Checks the URL and key and prepares a client. An empty key counts as none.
    pub fn new(base_url: &str, api_key: Option<&str>) -> Result<Self, CliError> {
        let base = Url::parse(base_url.trim())
            .map_err(|e| CliError::Usage(format!("invalid gateway URL `{base_url}`: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.host().is_none() {
            return Err(CliError::Usage(format!(
                "invalid gateway URL `{base_url}`: expected http://HOST[:PORT] or https://..."
            )));
        }
        let key = api_key.map(str::trim).filter(|k| !k.is_empty());
        if key.is_some() && base.scheme() == "http" && !is_loopback(&base) && !plain_http_allowed()
        {
            return Err(CliError::Usage(format!(
                "refusing to send the API key in clear to `{base_url}`: use https://, or set \
                 {ALLOW_PLAIN_HTTP_ENV}=1 for a network you trust (a compose network, say)"
            )));
        }
        let mut headers = HeaderMap::new();
        let mut authorization = None;
        if let Some(key) = key {
            let mut value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                CliError::Usage("the API key contains characters not allowed in a header".into())
            })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value.clone());
            authorization = Some(value);
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(concat!("lh/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| CliError::Usage(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Gateway {
            http,
            base,
            authorization,
        })
    }

    /// The gateway's base URL.
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    /// The `Authorization` header of every request, if there is a key.
    pub(crate) fn authorization(&self) -> Option<&HeaderValue> {
        self.authorization.as_ref()
    }

    /// `base` + path segments (each percent-encoded, so an id cannot escape
    /// its place in the path) + query pairs.
    pub fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = self.base.clone();
        url.set_query(None);
        url.set_fragment(None);
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// `GET` and parse the JSON answer.
    pub async fn get(&self, segments: &[&str], query: &[(&str, &str)]) -> Result<Value, CliError> {
        self.send(Method::GET, self.url(segments, query), None, &[])
            .await
    }

    /// `GET` and read the answer as the contract's `T`, keeping its JSON as
    /// it came (what `--json` prints).
    pub async fn get_as<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<(T, Value), CliError> {
        let answer = self.get(segments, query).await?;
        let typed = T::deserialize(&answer).map_err(|e| CliError::BadResponse {
            url: self.url(segments, query).to_string(),
            reason: format!("the answer is not what the API describes ({e})"),
        })?;
        Ok((typed, answer))
    }

    /// `POST` a JSON body with extra headers and parse the JSON answer.
    pub async fn post(
        &self,
        segments: &[&str],
        body: &impl Serialize,
        headers: &[(&str, &str)],
    ) -> Result<Value, CliError> {
        let body = to_json(body)?;
        self.send(Method::POST, self.url(segments, &[]), Some(&body), headers)
            .await
    }

    /// `POST` without a body and parse the JSON answer.
    pub async fn post_empty(&self, segments: &[&str]) -> Result<Value, CliError> {
        self.send(Method::POST, self.url(segments, &[]), None, &[])
            .await
    }

    /// `POST` a JSON body to a route that may take longer than the usual
    /// request timeout, waiting up to `timeout`, and parse the JSON answer.
    pub async fn post_slow(
        &self,
        segments: &[&str],
        body: &impl Serialize,
        timeout: Duration,
    ) -> Result<Value, CliError> {
        let body = to_json(body)?;
        self.send_within(
            Method::POST,
            self.url(segments, &[]),
            Some(&body),
            &[],
            Some(timeout),
        )
        .await
    }

    /// `PUT` a JSON body and parse the JSON answer.
    pub async fn put(&self, segments: &[&str], body: &impl Serialize) -> Result<Value, CliError> {
        let body = to_json(body)?;
        self.send(Method::PUT, self.url(segments, &[]), Some(&body), &[])
            .await
    }

    /// `DELETE` and parse the JSON answer.
    pub async fn delete(&self, segments: &[&str]) -> Result<Value, CliError> {
        self.delete_with(segments, &[]).await
    }

    /// `DELETE` with a query.
    pub async fn delete_with(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<Value, CliError> {
        self.send(Method::DELETE, self.url(segments, query), None, &[])
            .await
    }

    /// `GET` an answer that is not JSON (a CSV file) as text.
    pub async fn get_text(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<String, CliError> {
        let url = self.url(segments, query);
        let (_, text) = self
            .send_raw(Method::GET, url, None, &[], "*/*", None)
            .await?;
        Ok(text)
    }

    async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Value, CliError> {
        self.send_within(method, url, body, headers, None).await
    }

    async fn send_within(
        &self,
        method: Method,
        url: Url,
        body: Option<&Value>,
        headers: &[(&str, &str)],
        timeout: Option<Duration>,
    ) -> Result<Value, CliError> {
        let (status, text) = self
            .send_raw(
                method,
                url.clone(),
                body,
                headers,
                "application/json",
                timeout,
            )
            .await?;
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| CliError::BadResponse {
            url: url.to_string(),
            reason: format!("HTTP {status} with a body that is not JSON ({e})"),
        })
    }

    /// Sends a request and returns the body of a successful answer; an
    /// error answer becomes its problem.
    async fn send_raw(
        &self,
        method: Method,
        url: Url,
        body: Option<&Value>,
        headers: &[(&str, &str)],
        accept: &str,
        timeout: Option<Duration>,
    ) -> Result<(reqwest::StatusCode, String), CliError> {
        let mut req = self
            .http
            .request(method, url.clone())
            .header(reqwest::header::ACCEPT, accept);
        if let Some(timeout) = timeout {
            req = req.timeout(timeout);
        }
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| CliError::Usage(format!("invalid header name `{name}`")))?;
            let value = HeaderValue::from_str(value).map_err(|_| {
                CliError::Usage(format!("invalid value for header `{name}`: `{value}`"))
            })?;
            req = req.header(name, value);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let unreachable = |e: reqwest::Error| CliError::Unreachable {
            url: url.to_string(),
            reason: describe(&e),
        };
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        let text = resp.text().await.map_err(unreachable)?;
        if !status.is_success() {
            return Err(CliError::Api(Problem::from_response(
                status.as_u16(),
                &text,
            )));
        }
        Ok((status, text))
    }
}

/// A request body as the JSON it is sent as.
fn to_json(body: &impl Serialize) -> Result<Value, CliError> {
    serde_json::to_value(body)
        .map_err(|e| CliError::Usage(format!("cannot write the request body as JSON: {e}")))
}

/// A reqwest error's cause chain, e.g. `tcp connect error: Connection refused
/// (os error 111)`, without reqwest's own "error sending request for url".
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".to_string();
    }
    let mut parts = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let text = cause.to_string();
        // hyper's wrappers ("client error (Connect)") add nothing for a person.
        if !text.starts_with("client error (") && !parts.contains(&text) {
            parts.push(text);
        }
        source = cause.source();
    }
    if parts.is_empty() {
        let text = e.to_string();
        match e.url() {
            Some(url) => text.replace(&format!(" ({url})"), ""),
            None => text,
        }
    } else {
        parts.join(": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_goes_over_plain_http_only_to_this_machine() {
        for local in [
            "http://127.0.0.1:8080",
            "http://localhost:8080",
            "http://[::1]:8080",
            "https://gw.example",
        ] {
            assert!(Gateway::new(local, Some("k")).is_ok(), "{local}");
        }
        let err = Gateway::new("http://gw.example:8080", Some("k")).unwrap_err();
        assert!(err.to_string().contains("https://"), "{err}");
        // Without a key nothing secret crosses the network.
        assert!(Gateway::new("http://gw.example:8080", None).is_ok());
    }

    #[test]
    fn the_key_is_kept_for_websockets_and_never_shown() {
        let gw = Gateway::new("http://127.0.0.1:8080", Some(" secret-key ")).unwrap();
        let authorization = gw.authorization().unwrap();
        assert_eq!(authorization.to_str().unwrap(), "Bearer secret-key");
        assert!(authorization.is_sensitive());
        assert!(!format!("{gw:?}").contains("secret-key"), "{gw:?}");
        let gw = Gateway::new("http://127.0.0.1:8080", None).unwrap();
        assert!(gw.authorization().is_none());
    }

    #[test]
    fn urls_are_built_segment_by_segment() {
        let gw = Gateway::new("http://127.0.0.1:8080", None).unwrap();
        assert_eq!(
            gw.url(&["v1", "leases", "abc"], &[]).as_str(),
            "http://127.0.0.1:8080/v1/leases/abc"
        );
        assert_eq!(
            gw.url(&["v1", "leases", "../admin?x=1"], &[]).as_str(),
            "http://127.0.0.1:8080/v1/leases/..%2Fadmin%3Fx=1"
        );
        assert_eq!(
            gw.url(&["v1", "leases"], &[("limit", "5"), ("cursor", "a b&c")])
                .as_str(),
            "http://127.0.0.1:8080/v1/leases?limit=5&cursor=a+b%26c"
        );
    }

    #[test]
    fn base_path_is_kept() {
        let gw = Gateway::new("https://gw.example/api/", None).unwrap();
        assert_eq!(
            gw.url(&["v1", "audit", "verify"], &[]).as_str(),
            "https://gw.example/api/v1/audit/verify"
        );
    }

    #[test]
    fn bad_configuration_is_a_usage_error() {
        for url in [
            "",
            "not a url",
            "ftp://host",
            "unix:/tmp/sock",
            "mailto:a@b",
        ] {
            let e = Gateway::new(url, None).unwrap_err();
            assert!(matches!(e, CliError::Usage(_)), "{url}: {e}");
        }
        let e = Gateway::new("http://127.0.0.1", Some("bad\nkey")).unwrap_err();
        assert!(matches!(e, CliError::Usage(_)));
        assert!(Gateway::new("http://h", Some("")).is_ok());
    }
}
