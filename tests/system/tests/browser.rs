//! A real browser for the console's suites: headless Chromium from
//! Debian's packages, driven over W3C WebDriver by a chromedriver of the
//! test's own (`make deps` installs both).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

/// The key under which WebDriver names an element.
pub(crate) const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver of the test's own, and one browser session on it.
pub(crate) struct Browser {
    driver: Child,
    url: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
    /// Where the browser saves what it downloads.
    pub(crate) downloads: tempfile::TempDir,
}

impl Browser {
    pub(crate) async fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (make deps installs chromium-driver)");
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while http.get(format!("{url}/status")).send().await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not answer");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let downloads = tempfile::tempdir().unwrap();
        let answer: Value = http
            .post(format!("{url}/session"))
            .json(&json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": "/usr/bin/chromium",
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                        "--disable-dev-shm-usage", "--lang=en-US", "--window-size=1280,900",
                        format!("--user-data-dir={}", profile.path().display())],
                    "prefs": {
                        "download.default_directory": downloads.path().display().to_string(),
                        "download.prompt_for_download": false,
                    },
                },
            }}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {answer}"))
            .to_string();
        Browser {
            driver,
            url,
            session,
            http,
            _profile: profile,
            downloads,
        }
    }

    pub(crate) async fn call(&self, method: Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.url, self.session);
        let mut request = self.http.request(method.clone(), url);
        if method != Method::GET {
            request = request.json(&body);
        }
        let answer: Value = request.send().await.unwrap().json().await.unwrap();
        answer["value"].clone()
    }

    pub(crate) async fn go(&self, url: &str) {
        self.call(Method::POST, "/url", json!({ "url": url })).await;
    }

    pub(crate) async fn find(&self, css: &str) -> Option<String> {
        let found = self
            .call(
                Method::POST,
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        found[ELEMENT].as_str().map(str::to_string)
    }

    /// The element `css` names, once there, within 30 s.
    pub(crate) async fn wait(&self, css: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(element) = self.find(css).await {
                return element;
            }
            assert!(
                Instant::now() < deadline,
                "no {css} in: {}",
                self.page_text().await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn text(&self, element: &str) -> String {
        self.call(
            Method::GET,
            &format!("/element/{element}/text"),
            Value::Null,
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    pub(crate) async fn page_text(&self) -> String {
        match self.find("body").await {
            Some(body) => self.text(&body).await,
            None => String::new(),
        }
    }

    /// Waits until the page's text holds `needle`, within 30 s.
    pub(crate) async fn wait_text(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = self.page_text().await;
            if text.contains(needle) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{needle:?} never on the page: {text}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn type_into(&self, css: &str, text: &str) {
        let element = self.wait(css).await;
        self.call(
            Method::POST,
            &format!("/element/{element}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    pub(crate) async fn click(&self, css: &str) {
        let element = self.wait(css).await;
        self.call(
            Method::POST,
            &format!("/element/{element}/click"),
            json!({}),
        )
        .await;
    }

    /// Saves the page as `<LH_SCREENSHOTS_DIR>/<name>.png` where that is
    /// set (`make screenshots`); nothing otherwise.
    pub(crate) async fn screenshot(&self, name: &str) {
        let Some(dir) = std::env::var_os("LH_SCREENSHOTS_DIR") else {
            return;
        };
        use base64::Engine as _;
        let png = self.call(Method::GET, "/screenshot", Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("a screenshot"))
            .expect("base64");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), png).unwrap();
    }

    /// Picks the option shown as `text` of the select `#id`, as a user
    /// clicks it (an option's value need not be an attribute).
    pub(crate) async fn choose(&self, id: &str, text: &str) {
        let xpath = format!("//select[@id='{id}']/option[normalize-space(.)='{text}']");
        let deadline = Instant::now() + Duration::from_secs(30);
        let option = loop {
            let found = self
                .call(
                    Method::POST,
                    "/element",
                    json!({"using": "xpath", "value": xpath}),
                )
                .await;
            if let Some(option) = found[ELEMENT].as_str() {
                break option.to_string();
            }
            assert!(Instant::now() < deadline, "no option {text} in #{id}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        self.call(Method::POST, &format!("/element/{option}/click"), json!({}))
            .await;
    }

    /// Sets the value of the form field `css`.
    pub(crate) async fn set_field(&self, css: &str, value: &str) {
        let element = self.wait(css).await;
        self.call(
            Method::POST,
            &format!("/element/{element}/clear"),
            json!({}),
        )
        .await;
        self.call(
            Method::POST,
            &format!("/element/{element}/value"),
            json!({ "text": value }),
        )
        .await;
    }

    /// Waits until the text of `css` is `want`, within 30 s.
    pub(crate) async fn wait_text_of(&self, css: &str, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(element) = self.find(css).await {
                if self.text(&element).await == want {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{css} never {want:?}: {}",
                self.page_text().await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Presses `keys` on whatever has the focus, as a user at the keyboard
    /// does: WebDriver's key codes (`\u{E004}` Tab, `\u{E007}` Enter,
    /// `\u{E008}` Shift) and plain characters.
    pub(crate) async fn press(&self, keys: &str) {
        let mut actions = Vec::new();
        for key in keys.chars() {
            actions.push(json!({"type": "keyDown", "value": key.to_string()}));
            actions.push(json!({"type": "keyUp", "value": key.to_string()}));
        }
        self.call(
            Method::POST,
            "/actions",
            json!({"actions": [{"type": "key", "id": "keyboard", "actions": actions}]}),
        )
        .await;
        self.call(Method::DELETE, "/actions", Value::Null).await;
    }

    /// The id attribute of the element that has the focus.
    pub(crate) async fn focused_id(&self) -> String {
        let element = self.call(Method::GET, "/element/active", Value::Null).await;
        let Some(element) = element[ELEMENT].as_str() else {
            return String::new();
        };
        self.call(
            Method::GET,
            &format!("/element/{element}/attribute/id"),
            Value::Null,
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    /// The browser's windows and tabs, by handle.
    pub(crate) async fn windows(&self) -> Vec<String> {
        self.call(Method::GET, "/window/handles", Value::Null)
            .await
            .as_array()
            .map(|w| {
                w.iter()
                    .filter_map(|h| h.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Drives the window or tab `handle` from now on.
    pub(crate) async fn switch_to(&self, handle: &str) {
        self.call(Method::POST, "/window", json!({ "handle": handle }))
            .await;
    }

    /// Runs `script` in the page (its arguments `args`) and gives back what
    /// it returns.
    pub(crate) async fn run_script(&self, script: &str, args: Value) -> Value {
        self.call(
            Method::POST,
            "/execute/sync",
            json!({"script": script, "args": args}),
        )
        .await
    }

    /// The attribute `name` of `element`, `None` where it has none.
    pub(crate) async fn attribute(&self, element: &str, name: &str) -> Option<String> {
        self.call(
            Method::GET,
            &format!("/element/{element}/attribute/{name}"),
            Value::Null,
        )
        .await
        .as_str()
        .map(str::to_string)
    }

    /// Replaces what the field `css` holds with `value` as a person does:
    /// all of it selected, then typed over. Unlike [`Browser::set_field`]
    /// the page hears every change (WebDriver's clear fires no input
    /// event), so a page that renders meanwhile cannot put the old text back.
    pub(crate) async fn replace_text(&self, css: &str, value: &str) {
        const CONTROL: char = '\u{E009}';
        const RELEASE: char = '\u{E000}';
        const BACKSPACE: char = '\u{E003}';
        self.type_into(css, &format!("{CONTROL}a{RELEASE}{BACKSPACE}{value}"))
            .await;
    }

    /// Waits until nothing matches `css`, within 30 s.
    pub(crate) async fn wait_gone(&self, css: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.find(css).await.is_some() {
            assert!(
                Instant::now() < deadline,
                "{css} never went: {}",
                self.page_text().await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn sign_in(&self, console: &str, key: &str) {
        self.go(console).await;
        self.type_into("#key", key).await;
        self.click("#signin").await;
    }
}

impl Drop for Browser {
    /// Ends the session before the driver: quitting is what makes Chromium
    /// remove its own directories in the temporary directory, which a
    /// killed driver leaves behind.
    fn drop(&mut self) {
        use std::io::{Read as _, Write as _};
        if let Some(addr) = self.url.strip_prefix("http://") {
            if let Ok(mut stream) = std::net::TcpStream::connect(addr) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = write!(
                    stream,
                    "DELETE /session/{} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    self.session
                );
                let _ = stream.read_to_end(&mut Vec::new());
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
