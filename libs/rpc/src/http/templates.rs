//! Templates (`/v1/templates`): named workloads the gateway knows, which a
//! lease asks for by name (`"template": "jupyter"` in `POST /v1/leases`)
//! instead of spelling out an image and a command. Each says which of its
//! ports speak HTTP and where the workload leaves the token its URL needs,
//! so that a client (`lh lease open`) can reach it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The only protocol a template's port may name: a client opens it in a
/// browser, as `http://127.0.0.1:<local port>/?token=<token>`.
pub const PROTOCOL_HTTP: &str = "http";

/// The query parameter a port's token goes in.
pub const TOKEN_QUERY_PARAMETER: &str = "token";

/// `GET /v1/templates`: every template, in the order the gateway's file
/// lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TemplateList {
    pub templates: Vec<TemplateView>,
}

/// A template as clients see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TemplateView {
    /// What a lease names it by: lowercase letters, digits and `-`.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The container image a lease made from it runs.
    pub image: String,
    /// Its command; empty: the image's own.
    #[serde(default)]
    pub command: Vec<String>,
    /// The ports its workload listens on, on 127.0.0.1 inside its
    /// container, reached through `GET /v1/leases/{id}/port-forward`.
    #[serde(default)]
    pub ports: Vec<TemplatePort>,
}

/// One port of a template's workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TemplatePort {
    /// Its name within the template (`notebook`).
    pub name: String,
    pub port: u16,
    /// `http`. A string rather than a closed set, so that a client older
    /// than a protocol still reads the list (and skips that port).
    pub protocol: String,
    /// For an HTTP port whose URL needs a token: the file inside the
    /// container that holds it, written by the workload as it starts and
    /// readable by whoever may exec into the lease (its tenant), e.g.
    /// `/scratch/jupyter-token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
}

impl TemplatePort {
    pub fn is_http(&self) -> bool {
        self.protocol == PROTOCOL_HTTP
    }
}

impl TemplateView {
    /// The first port that speaks HTTP: the one a browser opens.
    pub fn http_port(&self) -> Option<&TemplatePort> {
        self.ports.iter().find(|p| p.is_http())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_without_a_token_leaves_the_field_out_and_a_newer_protocol_still_reads() {
        let port = TemplatePort {
            name: "web".into(),
            port: 80,
            protocol: PROTOCOL_HTTP.into(),
            token_file: None,
        };
        assert_eq!(
            serde_json::to_value(&port).unwrap(),
            serde_json::json!({"name": "web", "port": 80, "protocol": "http"})
        );
        let view: TemplateView = serde_json::from_value(serde_json::json!({
            "name": "x", "image": "localhost/x", "something_new": 1,
            "ports": [
                {"name": "raw", "port": 22, "protocol": "ssh"},
                {"name": "web", "port": 80, "protocol": "http", "token_file": "/scratch/t"}
            ]
        }))
        .unwrap();
        assert_eq!(view.http_port().map(|p| p.port), Some(80));
        assert_eq!(view.description, "");
        assert!(view.command.is_empty());
    }
}
