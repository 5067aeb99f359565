//! The console's files under `/console/`, built into the gateway from
//! `console/` at the repository's root: one origin with the API, nothing
//! fetched from anywhere else when it runs. Every answer carries a strict
//! Content Security Policy: scripts, styles and calls from this origin
//! only, no inline script, no framing. The page itself names a fresh
//! nonce for style elements: the terminal of a lease's shell makes its
//! own, and nothing else may.

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
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

/// Every page, script and style in console/, listed by the build.
const FILES: &[File] = include!(concat!(env!("OUT_DIR"), "/console_files.rs"));

/// `GET /console`: the console is at `/console/`, where its relative
/// paths resolve.
pub async fn bare() -> Redirect {
    Redirect::permanent("/console/")
}

/// Where index.html takes its answer's style nonce.
const NONCE_PLACEHOLDER: &str = "__LH_STYLE_NONCE__";
/// Random bytes in a style nonce.
const NONCE_BYTES: usize = 18;

/// `GET /console/`: the page, with a style nonce of its own.
pub async fn index() -> Response {
    use base64::Engine as _;
    use rand::RngCore as _;
    let mut bytes = [0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut bytes);
    let nonce = base64::engine::general_purpose::STANDARD.encode(bytes);
    let page = FILES
        .iter()
        .find(|f| f.path == "index.html")
        .expect("console/index.html");
    let html = String::from_utf8_lossy(page.bytes).replace(NONCE_PLACEHOLDER, &nonce);
    let mut response = with_headers(html.into_response(), page.content_type);
    let policy = CONTENT_SECURITY_POLICY.replace(
        "style-src 'self';",
        &format!("style-src 'self' 'nonce-{nonce}';"),
    );
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_str(&policy).expect("base64 is a header value"),
    );
    response
}

/// `GET /console/{*path}`: a file, or 304 where the browser holds this
/// build's (its ETag): a page's scripts are checked, not fetched, again.
pub async fn file(Path(path): Path<String>, headers: HeaderMap) -> Response {
    if path == "index.html" {
        return index().await;
    }
    let Some((i, file)) = FILES.iter().enumerate().find(|(_, f)| f.path == path) else {
        return with_headers(
            (StatusCode::NOT_FOUND, "no such file in the console").into_response(),
            "text/plain; charset=utf-8",
        );
    };
    let tag = &etags()[i];
    let held = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim() == tag || t.trim() == "*");
    let mut response = if held {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        file.bytes.into_response()
    };
    response.headers_mut().insert(
        header::ETAG,
        HeaderValue::from_str(tag).expect("hex is a header value"),
    );
    with_headers(response, file.content_type)
}

/// Each file's ETag, in [`FILES`]' order: its SHA-256, shortened.
fn etags() -> &'static [String] {
    static TAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    TAGS.get_or_init(|| {
        use sha2::Digest as _;
        FILES
            .iter()
            .map(|f| format!("\"{}\"", &hex::encode(sha2::Sha256::digest(f.bytes))[..32]))
            .collect()
    })
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

    /// Whether `at` lies inside a `/* ... */` comment of `text`.
    fn in_comment(text: &str, at: usize) -> bool {
        let before = &text[..at];
        match (before.rfind("/*"), before.rfind("*/")) {
            (Some(open), Some(close)) => open > close,
            (Some(_), None) => true,
            _ => false,
        }
    }

    #[tokio::test]
    async fn a_file_the_browser_holds_is_not_sent_again() {
        let first = file(Path("app.js".into()), HeaderMap::new()).await;
        assert_eq!(first.status(), StatusCode::OK);
        let tag = first.headers()[header::ETAG].clone();
        let mut asking = HeaderMap::new();
        asking.insert(header::IF_NONE_MATCH, tag.clone());
        let again = file(Path("app.js".into()), asking).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(again.headers()[header::ETAG], tag);
        assert!(again
            .headers()
            .contains_key(header::CONTENT_SECURITY_POLICY));
        let mut stale = HeaderMap::new();
        stale.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"old\""));
        let changed = file(Path("app.js".into()), stale).await;
        assert_eq!(changed.status(), StatusCode::OK);
        let other = file(Path("api.js".into()), HeaderMap::new()).await;
        assert_ne!(other.headers()[header::ETAG], tag);
    }

    #[tokio::test]
    async fn the_page_names_a_fresh_style_nonce_in_its_policy_and_its_markup() {
        let first = index().await;
        let policy = first.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .to_string();
        let nonce = policy
            .split("'nonce-")
            .nth(1)
            .and_then(|rest| rest.split('\'').next())
            .expect("a style nonce")
            .to_string();
        assert!(nonce.len() >= 24, "{policy}");
        assert!(!policy.contains("unsafe-inline"), "{policy}");
        assert!(policy.contains("script-src 'self';"), "{policy}");
        let body = axum::body::to_bytes(first.into_body(), 1 << 20)
            .await
            .unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(body.contains(&format!("nonce=\"{nonce}\"")), "{body}");
        assert!(!body.contains(NONCE_PLACEHOLDER));
        let second = index().await;
        assert!(!second.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains(&nonce));
    }

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
                // XML namespaces (SVG, MathML) are names, not places; a
                // place named in a comment (a licence's credit) is read,
                // never loaded.
                let hits: Vec<&str> = text
                    .match_indices(far)
                    .filter(|(i, _)| !in_comment(&text, *i))
                    .map(|(i, _)| &text[i..(i + 30).min(text.len())])
                    .filter(|hit| !hit.starts_with("http://www.w3.org/"))
                    .collect();
                assert!(hits.is_empty(), "{} names {far}: {hits:?}", f.path);
            }
        }
        assert!(FILES.iter().all(|f| f.content_type.starts_with("text/")));
    }
}
