//! Where the S3 service is and who speaks to it.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub const DEFAULT_REGION: &str = "us-east-1";

/// An S3 service: SeaweedFS in the tests and `make up`, any S3 in
/// production.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreConfig {
    /// `https://s3.example.com`, or `http://127.0.0.1:8333`.
    pub endpoint: String,
    #[serde(default = "default_region")]
    pub region: String,
    /// Plain HTTP to a host that is not a loopback address. Off unless
    /// asked for: every request carries a signature made with a secret,
    /// and the tenants' data and the keys the admin hands out travel in
    /// the clear, readable and alterable by anyone on the path.
    #[serde(default)]
    pub allow_http: bool,
}

fn default_region() -> String {
    DEFAULT_REGION.to_owned()
}

impl StoreConfig {
    /// An endpoint in the default region, HTTP allowed to loopback only.
    pub fn new(endpoint: impl Into<String>) -> StoreConfig {
        StoreConfig {
            endpoint: endpoint.into(),
            region: default_region(),
            allow_http: false,
        }
    }

    /// The endpoint, checked: `http` or `https`, a host, no path, query or
    /// user name, and HTTP only where allowed.
    pub(crate) fn url(&self) -> Result<reqwest::Url> {
        let url = reqwest::Url::parse(&self.endpoint)
            .map_err(|e| Error::Config(format!("endpoint {:?}: {e}", self.endpoint)))?;
        let refuse = |why: &str| Err(Error::Config(format!("endpoint {}: {why}", url)));
        if !url.username().is_empty() || url.password().is_some() {
            return refuse("credentials belong in Credentials, not in the URL");
        }
        if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return refuse("a path, query or fragment is not supported");
        }
        if self.region.is_empty() {
            return refuse("the region is empty");
        }
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http || is_loopback(&url) => {}
            "http" => {
                return refuse(
                    "plain HTTP to a host that is not a loopback address needs allow_http",
                )
            }
            other => return refuse(&format!("scheme {other} is neither http nor https")),
        }
        if url.host().is_none() {
            return refuse("no host");
        }
        Ok(url)
    }

    /// Whether requests go out as plain HTTP (checked by [`Self::url`]).
    pub(crate) fn is_http(&self) -> bool {
        self.endpoint.starts_with("http:")
    }
}

/// Only an address is trusted to stay on this machine: a name such as
/// `localhost` is whatever the resolver says.
fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An S3 access key and its secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl Credentials {
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        Credentials {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret never reaches a log.
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_goes_to_loopback_only_unless_allowed() {
        for ok in [
            "http://127.0.0.1:8333",
            "http://127.1.2.3",
            "http://[::1]:9000",
            "https://s3.example.com",
            "https://10.0.0.5:443/",
        ] {
            assert!(StoreConfig::new(ok).url().is_ok(), "{ok}");
        }
        for refused in [
            "http://localhost:8333",
            "http://10.0.0.5:8333",
            "http://s3.example.com",
            "ftp://127.0.0.1",
            "https://key:secret@s3.example.com",
            "https://s3.example.com/prefix",
            "not a url",
        ] {
            assert!(StoreConfig::new(refused).url().is_err(), "{refused}");
        }
        let mut config = StoreConfig::new("http://seaweedfs:8333");
        config.allow_http = true;
        assert!(config.url().is_ok());
    }

    #[test]
    fn the_region_defaults_and_the_secret_is_never_printed() {
        let config: StoreConfig =
            serde_json::from_str(r#"{"endpoint":"https://s3.example.com"}"#).unwrap();
        assert_eq!(config.region, "us-east-1");
        assert!(!config.allow_http);
        let credentials = Credentials::new("AKIDEXAMPLE", "very-secret-value");
        let printed = format!("{credentials:?}");
        assert!(printed.contains("AKIDEXAMPLE"));
        assert!(!printed.contains("very-secret-value"));
    }
}
