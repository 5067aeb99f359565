//! A lease's page in a real browser, on real podman: its tenant opens a
//! shell in the page and types a command, which runs in its container; the
//! page shows its timeline and its GPUs' use; another tenant gets neither
//! the page nor the shell; and the console is used from the keyboard alone.

use std::time::{Duration, Instant};

use lh_node_agent::RuntimeKind;
use lh_test_stack::Stack;
use reqwest::Method;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::browser::Browser;
use crate::sessions::tenant;
use crate::workloads::{base_image, own_node_fleet, PODMAN_ARGS};

const TAB: &str = "\u{E004}";
const ENTER: &str = "\u{E007}";

/// The status of a WebSocket upgrade to `path` that carries `protocols`
/// only (no Authorization header), as a browser's WebSocket does.
async fn upgrade_status(stack: &Stack, path: &str, protocols: &str) -> u16 {
    let url = format!(
        "{}{path}",
        stack.gateway_url.replacen("http://", "ws://", 1)
    );
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", protocols.parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Ok((_, response)) => {
            // The key is never echoed back: only the exec subprotocol.
            assert_eq!(
                response.headers()["sec-websocket-protocol"],
                "v5.channel.k8s.io"
            );
            response.status().as_u16()
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        Err(e) => panic!("{path}: {e}"),
    }
}

fn bearer(key: &str) -> String {
    use base64::Engine as _;
    format!(
        "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_opens_a_shell_in_its_lease_page_and_types_a_command_and_nobody_else_can() {
    base_image();
    let (_, fleet) = own_node_fleet(2, None);
    let stack = Stack::start_configured(&fleet, |s| {
        s.node_runtime = RuntimeKind::Podman;
        s.node_container_args = PODMAN_ARGS.map(String::from).into();
    })
    .await;
    let key = tenant(&stack, "shell").await;
    let stranger = tenant(&stack, "stranger").await;
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB",
                "workload": {"image": "localhost/leasehold/base", "command": ["sh", "-c",
                    "i=0; while true; do echo tick-$i; i=$((i+1)); sleep 1; done"]}})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let lease = b["id"].as_str().unwrap().to_string();
    stack
        .wait_lease(&key, &lease, |l| l["state"] == "running")
        .await;
    let console = format!("{}/console/", stack.gateway_url);

    // The key in the subprotocol opens the shell's socket; a wrong one, or
    // another tenant's, does not.
    let exec =
        format!("/v1/leases/{lease}/exec?command=sh&command=-c&command=true&stdin=true&tty=true");
    assert_eq!(upgrade_status(&stack, &exec, &bearer(&key)).await, 101);
    assert_eq!(
        upgrade_status(&stack, &exec, &bearer("lh_not_a_key")).await,
        401
    );
    assert_eq!(upgrade_status(&stack, &exec, &bearer(&stranger)).await, 404);
    assert_eq!(
        upgrade_status(
            &stack,
            &exec,
            "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.%%%"
        )
        .await,
        401
    );
    // Only an upgrade may carry a key that way.
    let plain = reqwest::Client::new()
        .get(format!("{}/v1/leases/{lease}", stack.gateway_url))
        .header("Sec-WebSocket-Protocol", bearer(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 401);

    let browser = Browser::start().await;
    browser.sign_in(&console, &key).await;
    browser.wait("#gpu-table").await;
    browser.go(&format!("{console}#/lease/{lease}")).await;
    browser.wait_text_of("#lease-state", "running").await;
    // What the workload writes shows as it writes it, with no event.
    let first = browser.text(&browser.wait("#lease-logs").await).await;
    let later = first
        .lines()
        .filter_map(|l| l.strip_prefix("tick-")?.parse::<u32>().ok())
        .max()
        .unwrap_or(0)
        + 4;
    browser.wait_text(&format!("tick-{later}")).await;
    let timeline = browser.text(&browser.wait("#timeline").await).await;
    assert!(
        timeline.contains("Asked for") && timeline.contains("Running"),
        "{timeline}"
    );

    // A shell, and a command typed into it, run inside the container.
    browser.click("#open-shell").await;
    browser.wait(".xterm-rows").await;
    let input = browser.wait(".xterm-helper-textarea").await;
    browser
        .call(
            Method::POST,
            &format!("/element/{input}/value"),
            json!({"text": format!("echo shell-$((6*7)) $(cat /etc/hostname | wc -c) $LEASEHOLD_LEASE_ID{ENTER}")}),
        )
        .await;
    let text = browser.wait_text("shell-42").await;
    assert!(text.contains(&lease), "{text}");
    browser.screenshot("console-shell").await;
    browser
        .call(
            Method::POST,
            &format!("/element/{input}/value"),
            json!({"text": format!("exit 3{ENTER}")}),
        )
        .await;
    browser.wait_text("ended with code 3").await;
    // The session is on the trail as the tenant's shell.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, events) = stack
            .call(
                Method::GET,
                "/v1/audit/events?type=session.opened&limit=100",
                lh_test_stack::AUDITOR_TOKEN,
                None,
            )
            .await;
        let shells = events["events"]
            .as_array()
            .map(|e| {
                e.iter()
                    .filter(|e| e.to_string().contains(&lease) && e.to_string().contains("shell"))
                    .count()
            })
            .unwrap_or(0);
        if shells >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no shell on the trail: {events}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The GPUs' use: charts where the API has readings, a word where not.
    let (_, usage) = stack
        .call(
            Method::GET,
            &format!("/v1/leases/{lease}/usage"),
            &key,
            None,
        )
        .await;
    let readings = usage["series"].as_array().is_some_and(|s| {
        s.iter()
            .any(|s| s["points"].as_array().is_some_and(|p| !p.is_empty()))
    });
    if readings {
        browser.wait("svg polyline").await;
    } else {
        browser.wait("#no-usage").await;
    }
    browser.screenshot("console-lease-page").await;

    // Another tenant gets neither the page nor a shell.
    browser.click("#signout").await;
    browser.sign_in(&console, &stranger).await;
    browser.wait("#gpu-table").await;
    browser.go(&format!("{console}#/lease/{lease}")).await;
    browser.wait_text(&format!("no lease {lease}")).await;
    assert!(browser.find("#open-shell").await.is_none());
    assert!(browser.find("#lease-state").await.is_none());
    let (s, _) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{lease}/stop"),
            &stranger,
            None,
        )
        .await;
    assert_eq!(s, 404);
    let (s, l) = stack
        .call(Method::GET, &format!("/v1/leases/{lease}"), &key, None)
        .await;
    assert_eq!((s, l["state"].as_str()), (200, Some("running")));
}

/// A free loopback port, for the lease web listener (its base URL names
/// the port before the listener is bound).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A GET of `path` at `host` (the lease web listener on 127.0.0.1:`port`).
pub(crate) async fn web_get(
    port: u16,
    host: &str,
    path: &str,
    cookie: Option<&str>,
) -> reqwest::Response {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut request = client
        .get(format!("http://127.0.0.1:{port}{path}"))
        .header("Host", host);
    if let Some(cookie) = cookie {
        request = request.header("Cookie", cookie);
    }
    request.send().await.unwrap()
}

/// Asks `key`'s ticket into `lease`'s `port` (201) and trades it at the
/// lease web listener on 127.0.0.1:`web_port`: the answer that sets the
/// cookie.
pub(crate) async fn enter_web(
    stack: &Stack,
    key: &str,
    lease: &str,
    port: u16,
    web_port: u16,
) -> reqwest::Response {
    let (s, ticket) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{lease}/web"),
            key,
            Some(json!({ "port": port })),
        )
        .await;
    assert_eq!(s, 201, "{ticket}");
    let url = ticket["url"].as_str().unwrap();
    web_get(
        web_port,
        &format!("{lease}-{port}.localhost:{web_port}"),
        &url[url.find("/.leasehold").unwrap()..],
        None,
    )
    .await
}

/// The cookie an answer sets, as a request sends it back.
pub(crate) fn cookie_set_by(answer: &reqwest::Response) -> String {
    answer.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

/// A lease's web page from its page in the console: opened in a new tab at
/// an origin of its own, reached through the gateway; nobody else's
/// ticket, cookie or name gets there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_opens_its_leases_web_page_at_an_origin_of_its_own_and_nobody_else_does() {
    base_image();
    let (_, fleet) = own_node_fleet(2, None);
    let web_port = free_port();
    let stack = Stack::start_configured(&fleet, |s| {
        s.node_runtime = RuntimeKind::Podman;
        s.node_container_args = PODMAN_ARGS.map(String::from).into();
        s.gateway_config = Some(std::sync::Arc::new(move |c: &mut lh_gateway::Config| {
            c.lease_web = lh_gateway::lease_web::LeaseWebArgs {
                lease_web_addr: Some(format!("127.0.0.1:{web_port}")),
                lease_web_base: Some(format!("http://localhost:{web_port}")),
            };
        }));
    })
    .await;
    let key = tenant(&stack, "webby").await;
    let stranger = tenant(&stack, "nosy").await;
    // A page, and a script that shows what the request looked like inside.
    let serve = "mkdir -p /tmp/w/cgi-bin && echo \"<h1>hello-web $LEASEHOLD_LEASE_ID</h1>\" >/tmp/w/index.html \
        && printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\necho host=$HTTP_HOST cookie=$HTTP_COOKIE\\n' >/tmp/w/cgi-bin/seen \
        && chmod +x /tmp/w/cgi-bin/seen \
        && printf 'while IFS= read -r l; do [ \"${#l}\" -le 1 ] && break; done\\nprintf \"HTTP/1.1 101 Switching Protocols\\\\r\\\\nUpgrade: echo\\\\r\\\\nConnection: Upgrade\\\\r\\\\n\\\\r\\\\n\"\\nexec cat\\n' >/tmp/up.sh \
        && { nc -ll -p 8081 -e sh /tmp/up.sh & } && exec httpd -f -p 127.0.0.1:8080 -h /tmp/w";
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB",
                "workload": {"image": "localhost/leasehold/base", "command": ["sh", "-c", serve]}})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let lease = b["id"].as_str().unwrap().to_string();
    stack
        .wait_lease(&key, &lease, |l| l["state"] == "running")
        .await;
    let host = format!("{lease}-8080.localhost:{web_port}");

    // Only its tenant gets a ticket.
    let (s, p) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{lease}/web"),
            &stranger,
            Some(json!({"port": 8080})),
        )
        .await;
    assert_eq!(s, 404, "{p}");
    let (s, p) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{lease}/web"),
            lh_test_stack::ADMIN_TOKEN,
            Some(json!({"port": 8080})),
        )
        .await;
    assert_eq!(s, 403, "{p}");
    let (s, p) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{lease}/web"),
            &key,
            Some(json!({"port": 8080, "path": "//evil.example/"})),
        )
        .await;
    assert_eq!((s, p["field"].as_str()), (422, Some("path")), "{p}");

    // A ticket is used once, at its own lease's port only, and its cookie
    // is the origin's alone and never reaches the lease.
    let (s, ticket) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{lease}/web"),
            &key,
            Some(json!({"port": 8080, "path": "/cgi-bin/seen"})),
        )
        .await;
    assert_eq!(s, 201, "{ticket}");
    let url = ticket["url"].as_str().unwrap();
    assert!(url.starts_with(&format!("http://{host}/")), "{url}");
    let enter = &url[url.find("/.leasehold").unwrap()..];
    let wrong_port = web_get(
        web_port,
        &format!("{lease}-8081.localhost:{web_port}"),
        enter,
        None,
    )
    .await;
    assert_eq!(wrong_port.status(), 401);
    // That try used it up.
    let used = web_get(web_port, &host, enter, None).await;
    assert_eq!(used.status(), 401);
    let (_, ticket) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{lease}/web"),
            &key,
            Some(json!({"port": 8080, "path": "/cgi-bin/seen"})),
        )
        .await;
    let url = ticket["url"].as_str().unwrap();
    let enter = &url[url.find("/.leasehold").unwrap()..];
    let entered = web_get(web_port, &host, enter, None).await;
    assert_eq!(entered.status(), 303);
    assert_eq!(entered.headers()["location"], "/cgi-bin/seen");
    let set = entered.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Lax"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_string();
    let seen = web_get(
        web_port,
        &host,
        "/cgi-bin/seen",
        Some(&format!("{cookie}; theirs=1")),
    )
    .await;
    assert_eq!(seen.status(), 200);
    let seen = seen.text().await.unwrap();
    assert!(seen.contains("host=127.0.0.1:8080"), "{seen}");
    assert!(!seen.contains("lh_lease_web"), "{seen}");
    assert!(seen.contains("theirs=1"), "{seen}");
    // Another page may not send it with the cookie (another lease's is the
    // same site), but a link followed may.
    let sent_from = |from: &str, site: &str, mode: &str| {
        reqwest::Client::new()
            .post(format!("http://127.0.0.1:{web_port}/cgi-bin/seen"))
            .header("Host", host.clone())
            .header("Cookie", cookie.clone())
            .header("Origin", from.to_string())
            .header("Sec-Fetch-Site", site.to_string())
            .header("Sec-Fetch-Mode", mode.to_string())
            .send()
    };
    let neighbour = format!("http://{}-8080.localhost:{web_port}", uuid::Uuid::new_v4());
    assert_eq!(
        sent_from(&neighbour, "same-site", "cors")
            .await
            .unwrap()
            .status(),
        403
    );
    assert_ne!(
        sent_from(&format!("http://{host}"), "same-origin", "cors")
            .await
            .unwrap()
            .status(),
        403
    );
    // Without it, or at another lease's name, nothing.
    assert_eq!(web_get(web_port, &host, "/", None).await.status(), 401);
    let other = format!("{}-8080.localhost:{web_port}", uuid::Uuid::new_v4());
    assert_eq!(
        web_get(web_port, &other, "/", Some(&cookie)).await.status(),
        401
    );
    assert_eq!(
        web_get(
            web_port,
            &format!("localhost:{web_port}"),
            "/",
            Some(&cookie)
        )
        .await
        .status(),
        404
    );

    // A connection upgraded (a notebook's kernel WebSocket) is carried
    // both ways, with the same cookie.
    let upgrade_host = format!("{lease}-8081.localhost:{web_port}");
    let upgrade_cookie = cookie_set_by(&enter_web(&stack, &key, &lease, 8081, web_port).await);
    {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", web_port))
            .await
            .unwrap();
        raw.write_all(format!("GET /kernel HTTP/1.1\r\nHost: {upgrade_host}\r\nCookie: {upgrade_cookie}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n").as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let mut buffer = [0u8; 1024];
        let deadline = Instant::now() + Duration::from_secs(20);
        while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
            assert!(
                Instant::now() < deadline,
                "no answer: {}",
                String::from_utf8_lossy(&got)
            );
            let n = tokio::time::timeout(Duration::from_secs(20), raw.read(&mut buffer))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buffer[..n]);
        }
        assert!(
            String::from_utf8_lossy(&got).starts_with("HTTP/1.1 101"),
            "{}",
            String::from_utf8_lossy(&got)
        );
        raw.write_all(b"ping-through\n").await.unwrap();
        let mut echoed = Vec::new();
        while !String::from_utf8_lossy(&echoed).contains("ping-through") {
            let n = tokio::time::timeout(Duration::from_secs(20), raw.read(&mut buffer))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&echoed));
            echoed.extend_from_slice(&buffer[..n]);
        }
    }

    // From the console: a new tab at the lease's origin, showing its page.
    let console = format!("{}/console/", stack.gateway_url);
    let browser = Browser::start().await;
    browser.sign_in(&console, &key).await;
    browser.wait("#gpu-table").await;
    browser.go(&format!("{console}#/lease/{lease}")).await;
    browser.set_field("#web-port", "8080").await;
    let before = browser.windows().await;
    browser.click("#open-web").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let tab = loop {
        if let Some(tab) = browser
            .windows()
            .await
            .into_iter()
            .find(|w| !before.contains(w))
        {
            break tab;
        }
        assert!(Instant::now() < deadline, "no tab opened");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let console_tab = before[0].clone();
    browser.switch_to(&tab).await;
    browser.wait_text(&format!("hello-web {lease}")).await;
    let at: Value = browser.call(Method::GET, "/url", Value::Null).await;
    assert_eq!(at.as_str().unwrap(), format!("http://{host}/"));
    browser.screenshot("console-lease-web").await;
    // The console's key is not the page's to read: another origin.
    let key_there: Value = browser
        .run_script("return sessionStorage.getItem('leasehold.key');", json!([]))
        .await;
    assert_eq!(key_there, Value::Null);
    browser.switch_to(&console_tab).await;

    // A cookie stops working once the key that asked for it is revoked;
    // another key's goes on.
    let (_, me) = stack.call(Method::GET, "/v1/whoami", &key, None).await;
    let tenant_id = me["tenant_id"].as_str().unwrap().to_string();
    let (s, second) = stack
        .call(
            Method::POST,
            &format!("/v1/tenants/{tenant_id}/keys"),
            &key,
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 201, "{second}");
    let second_key = second["api_key"].as_str().unwrap().to_string();
    let second_cookie =
        cookie_set_by(&enter_web(&stack, &second_key, &lease, 8080, web_port).await);
    assert_eq!(
        web_get(web_port, &host, "/", Some(&second_cookie))
            .await
            .status(),
        200
    );
    let (s, _) = stack
        .call(
            Method::DELETE,
            &format!("/v1/tenants/{tenant_id}/keys/{}", second["key_id"]),
            &key,
            None,
        )
        .await;
    assert_eq!(s, 200);
    let deadline = Instant::now() + Duration::from_secs(30);
    while web_get(web_port, &host, "/", Some(&second_cookie))
        .await
        .status()
        != 401
    {
        assert!(
            Instant::now() < deadline,
            "a revoked key's cookie still lets in"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        web_get(web_port, &host, "/", Some(&cookie)).await.status(),
        200
    );
}

/// Every page is reached and used with the keyboard alone: the key typed
/// and sent with Enter, the menu walked with Tab, a link followed with
/// Enter, the language chosen with the arrow keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_is_used_from_the_keyboard_alone() {
    let stack = Stack::start(lh_test_stack::FLEET).await;
    let (_, key) = stack.create_tenant("keyboard", 8).await;
    let console = format!("{}/console/", stack.gateway_url);
    let browser = Browser::start().await;
    browser.go(&console).await;
    browser.wait("#key").await;
    // The key field has the focus from the start.
    assert_eq!(browser.focused_id().await, "key");
    browser.press(&format!("{key}{ENTER}")).await;
    browser.wait("#gpu-table").await;
    // Tab from the top reaches each menu entry in order, with a visible
    // focus, and Enter follows it.
    browser
        .run_script(
            "document.activeElement.blur(); window.scrollTo(0, 0);",
            json!([]),
        )
        .await;
    let mut seen = Vec::new();
    for _ in 0..12 {
        browser.press(TAB).await;
        let id = browser.focused_id().await;
        if id == "nav-leases" {
            break;
        }
        seen.push(id);
    }
    assert_eq!(
        browser.focused_id().await,
        "nav-leases",
        "tabbed past {seen:?}"
    );
    let outline: Value = browser
        .run_script(
            "return getComputedStyle(document.activeElement).outlineStyle;",
            json!([]),
        )
        .await;
    assert_ne!(outline, json!("none"), "the focus must show");
    browser.press(ENTER).await;
    browser.wait_text("No leases yet.").await;
    // The new-lease form: fields in order, and Enter rents.
    browser.go(&format!("{console}#/new")).await;
    browser.wait("#rent").await;
    browser
        .run_script("document.getElementById('gpus').focus();", json!([]))
        .await;
    // End, Backspace: the count's 1 gone, 2 typed, Enter sends the form.
    browser.press("\u{E010}\u{E003}\u{E003}").await;
    browser.press(&format!("2{ENTER}")).await;
    browser.wait_text_of("#lease-state", "running").await;
    let title = browser.text(&browser.wait("#lease-title").await).await;
    let (_, leases) = stack.call(Method::GET, "/v1/leases", &key, None).await;
    let items = leases["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{leases}");
    assert_eq!(items[0]["gpus"], 2);
    assert!(title.contains(items[0]["id"].as_str().unwrap()));
    // The language, from its select, with the arrow keys.
    browser
        .run_script("document.getElementById('language').focus();", json!([]))
        .await;
    browser.press("\u{E015}").await; // ArrowDown
    browser.wait_text("租约").await;
}
