//! The console's files under `/console/`, built into the gateway from
//! `console/` at the repository's root: one origin with the API, nothing
//! fetched from anywhere else when it runs. Every answer carries a strict
//! Content Security Policy: scripts, styles and calls from this origin
//! only, no inline script, no framing.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

/// What a console page may load and call: its own origin, nothing inline.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
    base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

struct File {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! console_file {
    ($path:literal, $content_type:literal) => {
        File {
            path: $path,
            content_type: $content_type,
            bytes: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../console/",
                $path
            )),
        }
    };
}

/// Every file the console is made of.
const FILES: &[File] = &[
    console_file!("index.html", "text/html; charset=utf-8"),
    console_file!("style.css", "text/css; charset=utf-8"),
    console_file!("app.js", "text/javascript; charset=utf-8"),
    console_file!("api.js", "text/javascript; charset=utf-8"),
    console_file!("i18n.js", "text/javascript; charset=utf-8"),
    console_file!("vendor/preact.mjs", "text/javascript; charset=utf-8"),
    console_file!("vendor/hooks.mjs", "text/javascript; charset=utf-8"),
    console_file!("vendor/htm.mjs", "text/javascript; charset=utf-8"),
];

/// `GET /console`: the console is at `/console/`, where its relative
/// paths resolve.
pub async fn bare() -> Redirect {
    Redirect::permanent("/console/")
}

/// `GET /console/`
pub async fn index() -> Response {
    serve("index.html")
}

/// `GET /console/{*path}`
pub async fn file(Path(path): Path<String>) -> Response {
    serve(&path)
}

fn serve(path: &str) -> Response {
    let Some(file) = FILES.iter().find(|f| f.path == path) else {
        return with_headers(
            (StatusCode::NOT_FOUND, "no such file in the console").into_response(),
            "text/plain; charset=utf-8",
        );
    };
    with_headers(file.bytes.into_response(), file.content_type)
}

fn with_headers(mut response: Response, content_type: &'static str) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        // Built into this gateway: a new one may have new files.
        (header::CACHE_CONTROL, "no-cache"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn console_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../console")
    }

    /// Every script, style and page in console/ is served, and none names
    /// anything outside the console's own origin.
    #[test]
    fn every_console_file_is_served_and_none_loads_from_elsewhere() {
        let mut found = Vec::new();
        let mut dirs = vec![console_dir()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
                if ["html", "js", "mjs", "css"].contains(&ext) {
                    let relative = path.strip_prefix(console_dir()).unwrap();
                    found.push(relative.to_str().unwrap().to_string());
                }
            }
        }
        found.sort();
        let mut served: Vec<String> = FILES.iter().map(|f| f.path.to_string()).collect();
        served.sort();
        assert_eq!(found, served, "console/ and the files the gateway serves");
        for f in FILES {
            let text = String::from_utf8_lossy(f.bytes);
            for far in ["http://", "https://", "//cdn", "@import url("] {
                // XML namespaces (SVG, MathML) are names, not places.
                let hits: Vec<&str> = text
                    .match_indices(far)
                    .map(|(i, _)| &text[i..(i + 30).min(text.len())])
                    .filter(|hit| !hit.starts_with("http://www.w3.org/"))
                    .collect();
                assert!(hits.is_empty(), "{} names {far}: {hits:?}", f.path);
            }
        }
        assert!(FILES.iter().all(|f| f.content_type.starts_with("text/")));
    }
}
