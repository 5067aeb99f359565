//! Templates: named workloads a lease asks for by name (`"template":
//! "jupyter"`), so that a tenant need not know the image and the command
//! that start a notebook with a token of its own. They are data: a TOML
//! file the operator gives (`LH_TEMPLATES_FILE`), else the set compiled in
//! (`templates.toml` beside this file). Both are checked as the gateway
//! starts, so that a template no lease could run (a bad image reference,
//! a port that is not one) stops the gateway with the entry and the field
//! at fault rather than failing each lease that names it.
//!
//! ```toml
//! [[template]]
//! name = "jupyter"                      # [a-z0-9-], unique
//! description = "Jupyter Notebook"      # optional
//! image = "localhost/leasehold/jupyter" # an OCI image reference
//! command = ["sh", "-c", "..."]         # optional: the image's own
//!
//! [[template.ports]]
//! name = "notebook"                     # [a-z0-9-], unique in the template
//! port = 8888                           # where it listens, on 127.0.0.1 inside
//! protocol = "http"                     # the only one
//! token_file = "/scratch/jupyter-token" # optional: where the URL's token is
//! ```

use std::collections::HashSet;
use std::path::Path;

use lh_domain::lease::{MAX_WORKLOAD_BYTES, MAX_WORKLOAD_ITEMS};
use lh_rpc::http::templates::{TemplatePort, TemplateView, PROTOCOL_HTTP};
use serde::Deserialize;

/// The set compiled in.
const BUILT_IN: &str = include_str!("templates.toml");

/// Longest template or port name, characters.
pub const MAX_NAME_CHARS: usize = 64;
/// Longest description, characters.
pub const MAX_DESCRIPTION_CHARS: usize = 500;
/// Most templates in one file, and most ports in one template.
pub const MAX_TEMPLATES: usize = 256;
pub const MAX_PORTS: usize = 16;
/// Longest token file path, bytes (Linux's `PATH_MAX`).
pub const MAX_TOKEN_FILE_BYTES: usize = 4096;

/// The templates this gateway offers, in the order their file lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Templates {
    templates: Vec<TemplateView>,
}

impl Templates {
    /// The set compiled in.
    pub fn built_in() -> Self {
        Self::parse(BUILT_IN).expect("the built-in templates are valid")
    }

    /// The templates of `file`, or the built-in set without one. An error
    /// names the file, and the entry and field at fault.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        let Some(path) = file else {
            return Ok(Self::built_in());
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!("cannot read the templates file {}: {e}", path.display())
        })?;
        Self::parse(&text)
            .map_err(|why| anyhow::anyhow!("templates file {}: {why}", path.display()))
    }

    /// Reads and checks a templates file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: RawFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.template.is_empty() {
            return Err("no template: list at least one [[template]]".into());
        }
        if file.template.len() > MAX_TEMPLATES {
            return Err(format!("more than {MAX_TEMPLATES} templates"));
        }
        let mut names = HashSet::new();
        let mut templates = Vec::with_capacity(file.template.len());
        for (i, raw) in file.template.into_iter().enumerate() {
            let entry = match &raw.name {
                Some(name) => format!("template {} ({name:?})", i + 1),
                None => format!("template {}", i + 1),
            };
            let template = check(raw).map_err(|(field, why)| format!("{entry}: {field}: {why}"))?;
            if !names.insert(template.name.clone()) {
                return Err(format!("{entry}: name: another template has that name"));
            }
            templates.push(template);
        }
        Ok(Templates { templates })
    }

    pub fn get(&self, name: &str) -> Option<&TemplateView> {
        self.templates.iter().find(|t| t.name == name)
    }

    pub fn all(&self) -> &[TemplateView] {
        &self.templates
    }

    /// Their names, in order, for a message.
    pub fn names(&self) -> Vec<&str> {
        self.templates.iter().map(|t| t.name.as_str()).collect()
    }
}

// Every field optional and read as it is, so that a missing or bad one is
// named with its entry, not only with a line number.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    template: Vec<RawTemplate>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTemplate {
    name: Option<String>,
    description: Option<String>,
    image: Option<String>,
    command: Option<Vec<String>>,
    #[serde(default)]
    ports: Vec<RawPort>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPort {
    name: Option<String>,
    port: Option<i64>,
    protocol: Option<String>,
    token_file: Option<String>,
}

/// What is wrong: the field and why.
type Fault = (String, String);

fn fault(field: impl Into<String>, why: impl Into<String>) -> Fault {
    (field.into(), why.into())
}

fn check(raw: RawTemplate) -> Result<TemplateView, Fault> {
    let name = raw.name.ok_or_else(|| fault("name", "missing"))?;
    check_name(&name).map_err(|why| fault("name", why))?;
    let description = raw.description.unwrap_or_default();
    if description.chars().count() > MAX_DESCRIPTION_CHARS
        || description.chars().any(char::is_control)
    {
        return Err(fault(
            "description",
            format!("at most {MAX_DESCRIPTION_CHARS} characters, none a control character"),
        ));
    }
    let image = raw.image.ok_or_else(|| fault("image", "missing"))?;
    lh_domain::workload::check_image_reference(&image).map_err(|e| {
        fault(
            "image",
            format!(
                "{image:?} is not an OCI image reference ([host[:port]/]path[:tag][@digest]): {e}"
            ),
        )
    })?;
    let command = raw.command.unwrap_or_default();
    if command.len() > MAX_WORKLOAD_ITEMS || command.first().is_some_and(String::is_empty) {
        return Err(fault(
            "command",
            format!("0 to {MAX_WORKLOAD_ITEMS} arguments, the first not empty"),
        ));
    }
    // The lease's own limit, less nothing: a template must leave room for
    // the request's environment, which the lease check counts too.
    let bytes = image.len() + command.iter().map(String::len).sum::<usize>();
    if bytes > MAX_WORKLOAD_BYTES {
        return Err(fault(
            "command",
            format!("image and command hold {bytes} bytes; a workload holds at most {MAX_WORKLOAD_BYTES}"),
        ));
    }
    if raw.ports.len() > MAX_PORTS {
        return Err(fault("ports", format!("at most {MAX_PORTS}")));
    }
    let mut port_names = HashSet::new();
    let mut numbers = HashSet::new();
    let mut ports = Vec::with_capacity(raw.ports.len());
    for (i, raw) in raw.ports.into_iter().enumerate() {
        let at = |field: &str| format!("ports[{i}].{field}");
        let name = raw.name.ok_or_else(|| fault(at("name"), "missing"))?;
        check_name(&name).map_err(|why| fault(at("name"), why))?;
        if !port_names.insert(name.clone()) {
            return Err(fault(at("name"), format!("another port is named {name:?}")));
        }
        let port = raw.port.ok_or_else(|| fault(at("port"), "missing"))?;
        let port = u16::try_from(port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| fault(at("port"), format!("{port} is not a port (1 to 65535)")))?;
        if !numbers.insert(port) {
            return Err(fault(at("port"), format!("another port is {port}")));
        }
        let protocol = raw
            .protocol
            .ok_or_else(|| fault(at("protocol"), "missing"))?;
        if protocol != PROTOCOL_HTTP {
            return Err(fault(
                at("protocol"),
                format!("{protocol:?} is not one of: {PROTOCOL_HTTP}"),
            ));
        }
        if let Some(path) = &raw.token_file {
            check_token_file(path).map_err(|why| fault(at("token_file"), why))?;
        }
        ports.push(TemplatePort {
            name,
            port,
            protocol,
            token_file: raw.token_file,
        });
    }
    Ok(TemplateView {
        name,
        description,
        image,
        command,
        ports,
    })
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-');
    match ok {
        true => Ok(()),
        false => Err(format!(
            "{name:?}: 1 to {MAX_NAME_CHARS} lowercase letters, digits and '-', not first"
        )),
    }
}

/// A path the client hands to `cat` in the container: absolute, so that
/// it does not depend on the image's working directory, and one line.
fn check_token_file(path: &str) -> Result<(), String> {
    if !path.starts_with('/')
        || path.len() > MAX_TOKEN_FILE_BYTES
        || path.chars().any(char::is_control)
    {
        return Err(format!(
            "{path:?}: an absolute path inside the container, at most {MAX_TOKEN_FILE_BYTES} bytes, no control character"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[[template]]
name = "web"
description = "a page"
image = "localhost/leasehold/base"
command = ["httpd", "-f"]
ports = [{ name = "http", port = 8888, protocol = "http", token_file = "/scratch/t" }]

[[template]]
name = "batch"
image = "localhost/leasehold/python"
"#;

    #[test]
    fn the_built_in_set_has_jupyter_with_its_token_in_scratch() {
        let templates = Templates::built_in();
        let jupyter = templates.get("jupyter").expect("jupyter is built in");
        assert_eq!(jupyter.image, "localhost/leasehold/jupyter");
        let port = jupyter.http_port().expect("an http port");
        assert_eq!(port.port, 8888);
        assert_eq!(port.token_file.as_deref(), Some("/scratch/jupyter-token"));
        let script = jupyter.command.last().unwrap();
        for needed in [
            "umask 077",
            "--ip=127.0.0.1",
            "--port=8888",
            "JUPYTER_TOKEN_FILE=/scratch/jupyter-token",
        ] {
            assert!(script.contains(needed), "{needed} not in {script}");
        }
        assert_eq!(Templates::load(None).unwrap(), templates);
    }

    #[test]
    fn a_file_lists_its_templates_in_order_with_their_ports() {
        let templates = Templates::parse(GOOD).unwrap();
        assert_eq!(templates.names(), ["web", "batch"]);
        let web = templates.get("web").unwrap();
        assert_eq!(web.command, ["httpd", "-f"]);
        assert_eq!(
            web.ports,
            [TemplatePort {
                name: "http".into(),
                port: 8888,
                protocol: "http".into(),
                token_file: Some("/scratch/t".into()),
            }]
        );
        let batch = templates.get("batch").unwrap();
        assert!(batch.command.is_empty() && batch.ports.is_empty());
        assert_eq!(batch.description, "");
        assert!(
            templates.get("jupyter").is_none(),
            "a file replaces the built-in set"
        );
    }

    #[test]
    fn a_bad_entry_is_named_with_its_field() {
        let refused = |text: &str| Templates::parse(text).unwrap_err();
        let one = |body: &str| format!("[[template]]\n{body}\n");
        for (text, wanted) in [
            (one(r#"name = "x""#), r#"template 1 ("x"): image: missing"#),
            (one(r#"image = "a/b""#), "template 1: name: missing"),
            (
                one("name = \"Big\"\nimage = \"a/b\""),
                r#"template 1 ("Big"): name: "Big": 1 to 64 lowercase"#,
            ),
            (
                one("name = \"x\"\nimage = \"UPPER/case\""),
                r#"template 1 ("x"): image: "UPPER/case" is not an OCI image reference"#,
            ),
            (
                one("name = \"x\"\nimage = \"a/b\"\ncommand = [\"\"]"),
                r#"template 1 ("x"): command: 0 to 256 arguments"#,
            ),
            (
                format!("{}{}", one("name = \"x\"\nimage = \"a/b\""), one("name = \"x\"\nimage = \"a/c\"")),
                r#"template 2 ("x"): name: another template has that name"#,
            ),
            (
                one("name = \"x\"\nimage = \"a/b\"\nports = [{ name = \"n\", port = 8888, protocol = \"tcp\" }]"),
                r#"template 1 ("x"): ports[0].protocol: "tcp" is not one of: http"#,
            ),
            (
                one("name = \"x\"\nimage = \"a/b\"\nports = [{ name = \"n\", port = 70000, protocol = \"http\" }]"),
                r#"template 1 ("x"): ports[0].port: 70000 is not a port"#,
            ),
            (
                one("name = \"x\"\nimage = \"a/b\"\nports = [{ name = \"n\", protocol = \"http\" }]"),
                r#"template 1 ("x"): ports[0].port: missing"#,
            ),
            (
                one("name = \"x\"\nimage = \"a/b\"\nports = [{ name = \"n\", port = 1, protocol = \"http\" }, { name = \"n\", port = 2, protocol = \"http\" }]"),
                r#"template 1 ("x"): ports[1].name: another port is named "n""#,
            ),
            (
                one("name = \"x\"\nimage = \"a/b\"\nports = [{ name = \"n\", port = 1, protocol = \"http\", token_file = \"scratch/t\" }]"),
                r#"template 1 ("x"): ports[0].token_file: "scratch/t": an absolute path"#,
            ),
            ("".to_string(), "no template"),
        ] {
            let why = refused(&text);
            assert!(why.starts_with(wanted), "{text}\n gave: {why}\n wanted: {wanted}");
        }
        // A field the format does not have, and a value of the wrong type,
        // are the TOML reader's: with the field's name and its line.
        let why = refused(&one("name = \"x\"\nimage = \"a/b\"\ncolour = \"red\""));
        assert!(why.contains("colour") && why.contains("line 4"), "{why}");
        let why = refused(&one("name = \"x\"\nimage = \"a/b\"\ncommand = \"sh\""));
        assert!(why.contains("command") || why.contains("line 4"), "{why}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let why = Templates::load(Some(Path::new("/nonexistent/templates.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            why.starts_with("cannot read the templates file /nonexistent/templates.toml"),
            "{why}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "[[template]]\nname = \"x\"\n").unwrap();
        let why = Templates::load(Some(&path)).unwrap_err().to_string();
        assert_eq!(
            why,
            format!(
                "templates file {}: template 1 (\"x\"): image: missing",
                path.display()
            )
        );
    }
}
