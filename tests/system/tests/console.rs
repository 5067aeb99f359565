//! The console in a real browser: headless Chromium from Debian's packages,
//! driven over WebDriver (chromedriver), against a real stack. A tenant
//! signs in with its key, sees the GPUs it may rent, switches to Chinese,
//! and sees its lease run without reloading; an operator sees the fleet,
//! which the tenant's console does not offer; the files come with a strict
//! Content Security Policy.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lh_test_stack::{Stack, ADMIN_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};

/// The key under which WebDriver names an element.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver of the test's own, and one browser session on it.
struct Browser {
    driver: Child,
    url: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
    /// Where the browser saves what it downloads.
    downloads: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Browser {
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

    async fn call(&self, method: Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.url, self.session);
        let mut request = self.http.request(method.clone(), url);
        if method != Method::GET {
            request = request.json(&body);
        }
        let answer: Value = request.send().await.unwrap().json().await.unwrap();
        answer["value"].clone()
    }

    async fn go(&self, url: &str) {
        self.call(Method::POST, "/url", json!({ "url": url })).await;
    }

    async fn find(&self, css: &str) -> Option<String> {
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
    async fn wait(&self, css: &str) -> String {
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

    async fn text(&self, element: &str) -> String {
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

    async fn page_text(&self) -> String {
        match self.find("body").await {
            Some(body) => self.text(&body).await,
            None => String::new(),
        }
    }

    /// Waits until the page's text holds `needle`, within 30 s.
    async fn wait_text(&self, needle: &str) -> String {
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

    async fn type_into(&self, css: &str, text: &str) {
        let element = self.wait(css).await;
        self.call(
            Method::POST,
            &format!("/element/{element}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    async fn click(&self, css: &str) {
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
    async fn screenshot(&self, name: &str) {
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
    async fn choose(&self, id: &str, text: &str) {
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
    async fn set_field(&self, css: &str, value: &str) {
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
    async fn wait_text_of(&self, css: &str, want: &str) {
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

    async fn sign_in(&self, console: &str, key: &str) {
        self.go(console).await;
        self.type_into("#key", key).await;
        self.click("#signin").await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_signs_in_sees_what_it_may_rent_and_its_lease_run_and_an_operator_the_fleet() {
    let stack = Stack::start(FLEET).await;
    let (_, key) = stack.create_tenant("browser", 8).await;
    let console = format!("{}/console/", stack.gateway_url);

    // The page and its scripts, under a policy that loads nothing else.
    let page = reqwest::get(&console).await.unwrap();
    assert_eq!(page.status(), 200);
    let policy = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'"),
        "{policy}"
    );
    assert!(!policy.contains("unsafe-inline"), "{policy}");
    assert_eq!(
        reqwest::get(format!("{}/console/nope.js", stack.gateway_url))
            .await
            .unwrap()
            .status(),
        404
    );

    let browser = Browser::start().await;
    // A bad key is refused where it was typed.
    browser.sign_in(&console, "lh_not_a_key").await;
    browser.wait("#signin-error").await;
    browser.screenshot("console-sign-in").await;
    browser.sign_in(&console, &key).await;
    let table = browser.wait("#gpu-table").await;
    let text = browser.text(&table).await;
    assert!(
        text.contains("A100-40GB") && text.contains("H100-80GB") && text.contains("cn-north-1a"),
        "{text}"
    );
    browser.screenshot("console-gpus").await;
    // A tenant's console offers no fleet.
    assert!(browser.find("#nav-fleet").await.is_none());

    // In Chinese, at a word.
    browser.choose("language", "中文").await;
    browser.wait_text("算力租赁").await;
    browser.wait_text("可用区").await;
    browser.screenshot("console-gpus-zh").await;
    browser.choose("language", "English").await;
    browser.wait_text("Zone").await;

    // Its lease shows up and runs without a reload: the page follows the
    // event stream.
    browser.click("#nav-leases").await;
    browser.wait_text("No leases yet.").await;
    let (s, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A10G-24GB"})),
        )
        .await;
    assert_eq!(s, 202, "{lease}");
    let id = lease["id"].as_str().unwrap();
    let row = browser
        .wait(&format!("tr[data-lease='{id}'] td.state"))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while browser.text(&row).await != "running" {
        assert!(Instant::now() < deadline, "the lease never shows running");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    browser.screenshot("console-leases").await;

    // A lease from the form, priced before it is asked for, then stopped
    // from its page.
    browser.click("#nav-new").await;
    browser.choose("model", "H100-80GB").await;
    browser.set_field("#gpus", "2").await;
    browser.set_field("#hours", "3").await;
    browser.wait_text("for 3 h").await;
    let quote = browser.text(&browser.wait("#quote").await).await;
    assert!(quote.contains("CNY"), "{quote}");
    browser.screenshot("console-new-lease").await;
    browser.click("#rent").await;
    browser.wait_text_of("#lease-state", "running").await;
    browser.wait_text("H100-80GB × 2").await;
    let rented = browser.text(&browser.wait("#lease-title code").await).await;
    browser.screenshot("console-lease").await;
    browser.click("#stop").await;
    browser.wait_text_of("#lease-state", "ended").await;

    // The month's invoice, downloaded as CSV.
    browser.click("#nav-invoices").await;
    browser.click("#invoice-table button.csv").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let csv = loop {
        let done: Vec<_> = std::fs::read_dir(browser.downloads.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "csv"))
            .collect();
        if let Some(path) = done.first() {
            break std::fs::read_to_string(path).unwrap();
        }
        assert!(Instant::now() < deadline, "no CSV downloaded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(csv.starts_with("document,number,status"), "{csv}");
    assert!(csv.contains(&rented), "{rented} not in {csv}");
    browser.screenshot("console-invoices").await;

    // An operator sees the fleet: every node, the A10G lease's node held.
    browser.click("#signout").await;
    browser.sign_in(&console, ADMIN_TOKEN).await;
    browser.click("#nav-fleet").await;
    browser.wait("[data-node='node-a']").await;
    browser.wait("[data-node='node-b'] .cell.held").await;
    let text = browser.wait_text("node-c").await;
    assert!(text.contains("ready"), "{text}");
    browser.screenshot("console-fleet").await;
}
