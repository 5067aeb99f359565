//! Workload templates end to end: the gateway lists its built-in set or
//! its file's, refuses to start on a bad file naming the entry and field,
//! fills a lease's workload from a template (and refuses a request that
//! names one and an image or a command, or an unknown one, naming the
//! field); `lh lease open` reads a template's token from inside the lease
//! and serves its page here, on real podman.

use std::io::Write;
use std::time::Duration;

use lh_node_agent::RuntimeKind;
use lh_test_stack::{Stack, ADMIN_TOKEN, FLEET};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::workloads::PODMAN_ARGS;

/// A page on the base image: busybox `httpd` on 127.0.0.1:8888, and a
/// token made and written the way the built-in `jupyter` template does
/// (0600 in /scratch, renamed into place whole).
const PAGE_TEMPLATES: &str = r#"
[[template]]
name = "page"
description = "a page served by busybox httpd"
image = "localhost/leasehold/base"
command = ["sh", "-c", '''set -eu
umask 077
mkdir -p /scratch/www
echo '<h1>served from a lease</h1>' >/scratch/www/index.html
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >/scratch/.page-token.new
mv /scratch/.page-token.new /scratch/page-token
exec httpd -f -p 127.0.0.1:8888 -h /scratch/www''']

[[template.ports]]
name = "web"
port = 8888
protocol = "http"
token_file = "/scratch/page-token"

[[template]]
name = "quiet"
image = "localhost/leasehold/base"
command = ["sleep", "600"]
"#;

fn image(which: &str) {
    let status = std::process::Command::new(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/images.sh"),
    )
    .arg(which)
    .status()
    .expect("scripts/images.sh runs");
    assert!(status.success(), "scripts/images.sh {which}: {status}");
}

fn own_node_fleet() -> String {
    crate::workloads::own_node_fleet(2, None).1
}

async fn tenant(stack: &Stack, name: &str) -> String {
    stack.create_trusted_tenant(name, 2).await
}

/// `lh` as a tenant would run it: the key in a file, never on the command
/// line.
struct Lh {
    url: String,
    key_file: tempfile::NamedTempFile,
}

impl Lh {
    fn new(stack: &Stack, key: &str) -> Self {
        let mut key_file = tempfile::NamedTempFile::new().unwrap();
        key_file.write_all(key.as_bytes()).unwrap();
        Lh {
            url: stack.gateway_url.clone(),
            key_file,
        }
    }

    async fn run(&self, args: &[&str]) -> lh_cli::Captured {
        let mut argv = vec![
            "lh".to_string(),
            "--gateway-url".into(),
            self.url.clone(),
            "--api-key-file".into(),
            self.key_file.path().to_str().unwrap().into(),
        ];
        argv.extend(args.iter().map(|a| a.to_string()));
        lh_cli::capture(argv).await
    }

    fn gateway(&self) -> lh_cli::Gateway {
        let key = std::fs::read_to_string(self.key_file.path()).unwrap();
        lh_cli::Gateway::new(&self.url, Some(&key)).unwrap()
    }
}

/// What a command writes to its stdout, line by line, as it writes it.
struct Lines(mpsc::UnboundedSender<String>, Vec<u8>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.1.extend_from_slice(buf);
        while let Some(end) = self.1.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.1.drain(..=end).collect();
            let _ = self
                .0
                .send(String::from_utf8_lossy(&line).trim_end().to_string());
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `lh lease open` running in a task of its own, as until Ctrl-C.
struct Opened {
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(i32, String)>,
}

/// Starts [`lh_cli::open`] on `lease` and waits for the URL it prints.
async fn open(lh: &Lh, lease: &str) -> Opened {
    let (lines_tx, mut lines) = mpsc::unbounded_channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let gw = lh.gateway();
    let args = lh_cli::LeaseOpen {
        id: lease.to_string(),
        port: 0,
        no_browser: true,
    };
    let task = tokio::spawn(async move {
        let mut out = Lines(lines_tx, Vec::new());
        let mut err = Vec::new();
        let code = lh_cli::open(
            &gw,
            &args,
            async move {
                let _ = stopped.await;
            },
            &mut out,
            &mut err,
        )
        .await
        .unwrap_or_else(|e| panic!("lh lease open: {e:#}"));
        (code, String::from_utf8_lossy(&err).into_owned())
    });
    let mut said = Vec::new();
    let url = loop {
        match tokio::time::timeout(Duration::from_secs(150), lines.recv()).await {
            Ok(Some(line)) if line.starts_with("http://") => break line,
            Ok(Some(line)) => said.push(line),
            other => panic!("no URL from lh lease open ({other:?}); it said {said:?}"),
        }
    };
    assert!(
        said.iter()
            .any(|l| l.starts_with("Forwarding from 127.0.0.1:")),
        "{said:?}"
    );
    Opened { url, stop, task }
}

async fn running_lease_from(lh: &Lh, template: &str, stack: &Stack, key: &str) -> String {
    let out = lh
        .run(&[
            "--json",
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A100-40GB",
            "--template",
            template,
        ])
        .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lease: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(lease["workload"]["template"], template, "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();
    let lease = stack
        .wait_lease_within(
            key,
            &id,
            |l| l["state"] == "running" || l["state"] == "ended",
            Duration::from_secs(180),
        )
        .await;
    assert_eq!(lease["state"], "running", "{lease}");
    id
}

/// Ends `lease`: its container with it, which a stack that just goes
/// away would leave running.
async fn stop(lh: &Lh, stack: &Stack, key: &str, lease: &str) {
    let out = lh.run(&["lease", "stop", lease]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    stack
        .wait_lease(key, lease, |l| l["state"] == "ended")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gateway_offers_its_built_in_templates_and_fills_a_lease_from_one() {
    let stack = Stack::start(FLEET).await;
    let key = tenant(&stack, "templated").await;
    let lh = Lh::new(&stack, &key);

    // Any signed-in caller reads the list; nobody else.
    let (status, list) = stack.call(Method::GET, "/v1/templates", &key, None).await;
    assert_eq!(status, 200, "{list}");
    let jupyter = list["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "jupyter")
        .unwrap_or_else(|| panic!("no jupyter in {list}"))
        .clone();
    assert_eq!(jupyter["image"], "localhost/leasehold/jupyter");
    assert_eq!(
        jupyter["ports"],
        json!([{"name": "notebook", "port": 8888, "protocol": "http",
            "token_file": "/scratch/jupyter-token"}])
    );
    let (status, _) = stack
        .call(Method::GET, "/v1/templates", ADMIN_TOKEN, None)
        .await;
    assert_eq!(status, 200);
    let (status, _) = stack
        .call(Method::GET, "/v1/templates", "not-a-key", None)
        .await;
    assert_eq!(status, 401);

    // `lh template ls`: a table, and the gateway's JSON.
    let out = lh.run(&["template", "ls"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let row = out
        .stdout
        .lines()
        .find(|l| l.starts_with("jupyter"))
        .unwrap_or_else(|| panic!("no jupyter row in\n{}", out.stdout));
    assert!(
        row.contains("localhost/leasehold/jupyter") && row.contains("8888/http (notebook)"),
        "{row}"
    );
    let out = lh.run(&["--json", "template", "ls"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(serde_json::from_str::<Value>(&out.stdout).unwrap(), list);

    // A lease from a template: its image and command, and its name kept.
    let out = lh
        .run(&[
            "--json",
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A100-40GB",
            "--template",
            "jupyter",
            "--env",
            "COLOUR=blue",
        ])
        .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lease: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(lease["workload"]["template"], "jupyter", "{lease}");
    assert_eq!(lease["workload"]["image"], jupyter["image"], "{lease}");
    assert_eq!(lease["workload"]["command"], jupyter["command"], "{lease}");
    assert_eq!(
        lease["workload"]["env"]["names"],
        json!(["COLOUR"]),
        "{lease}"
    );
    let id = lease["id"].as_str().unwrap();
    let read = stack.wait_lease(&key, id, |l| l["id"] == id).await;
    assert_eq!(read["workload"], lease["workload"]);
    let out = lh.run(&["lease", "get", id]).await;
    assert!(
        out.stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["template", "jupyter"]),
        "{}",
        out.stdout
    );
    // A lease without a template has no page to open.
    let (status, plain) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB"})),
        )
        .await;
    assert_eq!(status, 202, "{plain}");
    let plain = plain["id"].as_str().unwrap();
    stack
        .wait_lease(&key, plain, |l| l["state"] == "running")
        .await;
    let out = lh.run(&["lease", "open", plain]).await;
    assert_eq!(out.code, lh_cli::EXIT_FAILURE, "{}", out.stderr);
    assert!(
        out.stderr.contains("was not made from a template"),
        "{}",
        out.stderr
    );

    // Refusals name their field, through `lh` and the API alike.
    for (args, field) in [
        (
            &[
                "--template",
                "jupyter",
                "--image",
                "localhost/leasehold/base",
            ][..],
            "workload.image",
        ),
        (
            &["--template", "jupyter", "--", "true"][..],
            "workload.command",
        ),
        (&["--template", "no-such-template"][..], "template"),
    ] {
        let mut argv = vec!["lease", "create", "--gpus", "1", "--gpu-model", "A100-40GB"];
        argv.extend_from_slice(args);
        let out = lh.run(&argv).await;
        assert_eq!(
            out.code,
            lh_cli::EXIT_CLIENT_ERROR,
            "{args:?}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(&format!("(field: {field})")),
            "{args:?}: {}",
            out.stderr
        );
    }
    let (status, problem) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "template": "nope"})),
        )
        .await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("template")));
    assert!(
        problem["detail"].as_str().unwrap().contains("jupyter"),
        "the known ones are named: {problem}"
    );
    let (status, problem) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(
                json!({"gpus": 1, "gpu_model": "A100-40GB", "template": "jupyter",
                "workload": {"image": "localhost/leasehold/base"}}),
            ),
        )
        .await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (422, Some("workload.image"))
    );

    // A bad templates file stops a gateway before it starts, naming the
    // entry and the field.
    let dir = tempfile::tempdir().unwrap();
    for (text, wanted) in [
        (
            "[[template]]\nname = \"web\"\nimage = \"localhost/x\"\n\
             ports = [{ name = \"w\", port = 80, protocol = \"gopher\" }]\n",
            "template 1 (\"web\"): ports[0].protocol: \"gopher\" is not one of: http",
        ),
        (
            "[[template]]\nname = \"web\"\n",
            "template 1 (\"web\"): image: missing",
        ),
    ] {
        let path = dir.path().join("templates.toml");
        std::fs::write(&path, text).unwrap();
        let mut config = stack.gateway_config();
        config.templates_file = Some(path.clone());
        let refused = tokio::time::timeout(
            Duration::from_secs(30),
            lh_gateway::start(config, lh_service::CancellationToken::new()),
        )
        .await
        .expect("a bad file is refused at once");
        let why = format!("{:#}", refused.err().expect("the gateway refuses to start"));
        assert!(
            why.contains(&format!("templates file {}: {wanted}", path.display())),
            "{why}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lh_lease_open_serves_a_template_s_page_here_with_the_token_from_inside_the_lease() {
    image("base");
    let dir = tempfile::tempdir().unwrap();
    let templates_file = dir.path().join("templates.toml");
    std::fs::write(&templates_file, PAGE_TEMPLATES).unwrap();
    let stack = Stack::start_configured(&own_node_fleet(), |s| {
        s.node_runtime = RuntimeKind::Podman;
        s.node_container_args = PODMAN_ARGS.map(String::from).into();
        let file = templates_file.clone();
        s.gateway_config = Some(std::sync::Arc::new(move |c: &mut lh_gateway::Config| {
            c.templates_file = Some(file.clone());
        }));
    })
    .await;
    let key = tenant(&stack, "pages").await;
    let lh = Lh::new(&stack, &key);

    // This gateway offers its file's templates, in order, and no others.
    let (status, list) = stack.call(Method::GET, "/v1/templates", &key, None).await;
    assert_eq!(status, 200, "{list}");
    let names: Vec<&str> = list["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["page", "quiet"]);

    let lease = running_lease_from(&lh, "page", &stack, &key).await;
    let opened = open(&lh, &lease).await;
    let token = opened
        .url
        .split_once("/?token=")
        .map(|(_, t)| t.to_string())
        .unwrap_or_else(|| panic!("no token in {}", opened.url));
    // The token is the workload's own, in a file only the lease's user
    // reads.
    let out = lh
        .run(&[
            "lease",
            "exec",
            &lease,
            "--",
            "ls",
            "-l",
            "/scratch/page-token",
        ])
        .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("-rw-------"), "{}", out.stdout);
    let out = lh
        .run(&["lease", "exec", &lease, "--", "cat", "/scratch/page-token"])
        .await;
    assert_eq!((out.code, out.stdout.trim()), (0, token.as_str()));
    assert_eq!(token.len(), 48, "24 random bytes in hex: {token}");

    // The page, through the gateway, from 127.0.0.1 inside the container.
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let page = client.get(&opened.url).send().await.unwrap();
        assert_eq!(page.status(), 200);
        assert_eq!(page.text().await.unwrap(), "<h1>served from a lease</h1>\n");
    }

    // Ctrl-C's stand-in ends it with 0, and the port with it.
    let address = opened.url["http://".len()..]
        .split('/')
        .next()
        .unwrap()
        .to_string();
    opened.stop.send(()).unwrap();
    let (code, said) = tokio::time::timeout(Duration::from_secs(10), opened.task)
        .await
        .expect("lh lease open ends when told")
        .unwrap();
    assert_eq!(code, 0, "{said}");
    assert!(
        tokio::net::TcpStream::connect(&address).await.is_err(),
        "{address} still listens"
    );

    // A template without an HTTP port has no page.
    let quiet = running_lease_from(&lh, "quiet", &stack, &key).await;
    let out = lh.run(&["lease", "open", &quiet]).await;
    assert_eq!(out.code, lh_cli::EXIT_FAILURE, "{}", out.stderr);
    assert!(out.stderr.contains("has no HTTP port"), "{}", out.stderr);
    stop(&lh, &stack, &key, &lease).await;
    stop(&lh, &stack, &key, &quiet).await;
}

/// The real Jupyter template: its image takes a minute to make from the
/// python image and minutes more without it, more than CI spends on every
/// run. Run it by hand:
///
/// ```sh
/// scripts/images.sh jupyter
/// cargo nextest run -p lh-system-tests --run-ignored only -E 'test(/^templates::the_jupyter/)'
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs localhost/leasehold/jupyter (scripts/images.sh jupyter, minutes)"]
async fn the_jupyter_template_s_notebook_answers_through_lh_lease_open_and_only_with_its_token() {
    image("jupyter");
    let stack = Stack::start_configured(&own_node_fleet(), |s| {
        s.node_runtime = RuntimeKind::Podman;
        s.node_container_args = PODMAN_ARGS.map(String::from).into();
    })
    .await;
    let key = tenant(&stack, "notebooks").await;
    let lh = Lh::new(&stack, &key);
    let lease = running_lease_from(&lh, "jupyter", &stack, &key).await;
    let opened = open(&lh, &lease).await;
    let base = opened.url.split_once("/?").unwrap().0.to_string();
    let token = opened.url.split_once("/?token=").unwrap().1.to_string();

    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // With the token: the notebook's tree, after its redirect.
    let followed = reqwest::Client::new();
    let page = followed.get(&opened.url).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.url().path().starts_with("/tree"), "{}", page.url());
    let text = page.text().await.unwrap();
    assert!(text.contains("Jupyter"), "{text}");
    let status = client
        .get(format!("{base}/api/status"))
        .header("Authorization", format!("token {token}"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    // Without it: the login page, and the API refuses.
    let tree = client.get(format!("{base}/tree")).send().await.unwrap();
    assert_eq!(tree.status(), 302);
    let location = tree.headers()["location"].to_str().unwrap().to_string();
    assert!(location.starts_with("/login"), "{location}");
    let status = client
        .get(format!("{base}/api/status"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 403);
    let status = client
        .get(format!("{base}/api/status"))
        .header("Authorization", "token not-the-token")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 403);

    opened.stop.send(()).unwrap();
    let (code, said) = opened.task.await.unwrap();
    assert_eq!(code, 0, "{said}");
    stop(&lh, &stack, &key, &lease).await;
}
