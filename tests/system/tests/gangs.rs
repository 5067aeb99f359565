//! A lease of more GPUs than one node holds runs on several nodes as one
//! lease: every member's node starts its part, one process per GPU with
//! the rendezvous in its environment; the lease runs once all have
//! started, each member keeps the log of its part and is entered on its
//! own (exec, the console, OpenSSH), the lease completes once every part
//! has, a member's failure fails the whole lease, a stop ends every part
//! and frees every GPU, and idle reclaim waits for every member to idle.
//! In containers, the ranks meet over the gang's own link. Real
//! nats-server, PostgreSQL, node agents on the process runtime and on
//! podman, Chromium and OpenSSH.

use std::time::Duration;

use lh_events::EventData;
use lh_node_agent::RuntimeKind;
use lh_rpc::http::sessions::EXEC_SUBPROTOCOL;
use lh_test_stack::{of_type, read_log, Stack};

use crate::browser::Browser;
use crate::data::two_node_fleet;
use crate::sessions::{collect, exec_path, open, ssh_command, ssh_key};
use crate::workloads::{base_image, PODMAN_ARGS};
use reqwest::Method;
use serde_json::{json, Value};

/// Two nodes of four A100s in one zone, and one in another region.
const GANG_FLEET: &str = r#"
[[node]]
id = "node-a"
zone = "cn-north.1a"
hostname = "gpu-a.sim"
gpu_model = "A100-40GB"
gpu_count = 4
vram_gb = 40

[[node]]
id = "node-b"
zone = "cn-north.1a"
hostname = "gpu-b.sim"
gpu_model = "A100-40GB"
gpu_count = 4
vram_gb = 40

[[node]]
id = "node-w"
zone = "cn-west.1a"
hostname = "gpu-w.sim"
gpu_model = "A100-40GB"
gpu_count = 4
vram_gb = 40
"#;

async fn gang(stack: &Stack, key: &str, gpus: u32, command: &str) -> String {
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            key,
            Some(json!({
                "gpus": gpus,
                "gpu_model": "A100-40GB",
                "workload": {"command": ["sh", "-c", command]},
            })),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    b["id"].as_str().unwrap().to_string()
}

/// The log of `lease`'s part on `node`.
async fn log_of(stack: &Stack, key: &str, lease: &str, node: &str) -> Value {
    let (s, b) = stack
        .call(
            Method::GET,
            &format!("/v1/leases/{lease}/logs?node={node}"),
            key,
            None,
        )
        .await;
    assert_eq!(s, 200, "{b}");
    b
}

/// Stops `lease` and waits until it has ended, stopped.
async fn stop_until_ended(stack: &Stack, key: &str, lease: &str) {
    let (s, b) = stack
        .call(Method::POST, &format!("/v1/leases/{lease}/stop"), key, None)
        .await;
    assert_eq!(s, 202, "{b}");
    let ended = stack
        .wait_lease(key, lease, |l| l["state"] == "ended")
        .await;
    assert_eq!(ended["end_reason"], "stopped", "{ended}");
}

fn lines(log: &Value) -> Vec<String> {
    let mut lines: Vec<String> = log["data"]
        .as_str()
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_gpus_run_on_two_nodes_as_one_lease_and_end_as_one() {
    let stack =
        Stack::start_configured(GANG_FLEET, |s| s.node_runtime = RuntimeKind::Process).await;
    let key = stack.create_trusted_tenant("gangs", 8).await;

    // Every rank once, each told the rendezvous; its node's first
    // member hosts it. The later member's ranks finish last: the gang
    // completes when they have, none of them cut short.
    let echo = gang(
        &stack,
        &key,
        8,
        "echo $RANK/$WORLD_SIZE $LOCAL_RANK $NODE_RANK/$NNODES $MASTER_ADDR:$MASTER_PORT; sleep $((1 + 3 * NODE_RANK)); echo done-$RANK",
    )
    .await;
    let running = stack
        .wait_lease(&key, &echo, |l| l["state"] == "running")
        .await;
    let members = running["members"].as_array().expect("a gang's members");
    let nodes: Vec<&str> = members
        .iter()
        .map(|m| m["node_id"].as_str().unwrap())
        .collect();
    let mut sorted = nodes.clone();
    sorted.sort();
    assert_eq!(sorted, ["node-a", "node-b"], "one zone, never node-w");
    assert!(members.iter().all(|m| m["started"] == true), "{running}");
    assert_eq!(running["node_id"], nodes[0]);
    let ended = stack
        .wait_lease(&key, &echo, |l| l["state"] == "ended")
        .await;
    assert_eq!(ended["end_reason"], "completed", "{ended}");
    let master = format!("gpu-{}.sim", nodes[0].trim_start_matches("node-"));
    let port = 29_500 + (uuid::Uuid::parse_str(&echo).unwrap().as_u128() % 1_000) as u16;
    let mut all = Vec::new();
    for (rank, node) in nodes.iter().enumerate() {
        let log = log_of(&stack, &key, &echo, node).await;
        assert_eq!(log["node_id"], *node);
        assert_eq!(log["members"], json!(nodes), "{log}");
        let mut expected: Vec<String> = (0..4)
            .flat_map(|local| {
                let r = rank * 4 + local;
                [
                    format!("{r}/8 {local} {rank}/2 {master}:{port}"),
                    format!("done-{r}"),
                ]
            })
            .collect();
        expected.sort();
        assert_eq!(lines(&log), expected, "node {node}");
        all.extend(lines(&log));
    }
    assert_eq!(all.len(), 16);
    // A node that is no member has no part to read.
    let (s, p) = stack
        .call(
            Method::GET,
            &format!("/v1/leases/{echo}/logs?node=node-w"),
            &key,
            None,
        )
        .await;
    assert_eq!((s, p["field"].as_str()), (422, Some("node")), "{p}");

    // One rank failing fails the gang, whichever member it is on.
    let failing = gang(&stack, &key, 8, "[ \"$RANK\" -ne 6 ] || exit 9; sleep 600").await;
    let failed = stack
        .wait_lease(&key, &failing, |l| l["state"] == "ended")
        .await;
    assert_eq!(failed["end_reason"], "failed", "{failed}");

    // A stop ends every part, and every GPU is free again: a second gang
    // of all eight goes.
    let stopped = gang(&stack, &key, 8, "sleep 600").await;
    stack
        .wait_lease(&key, &stopped, |l| l["state"] == "running")
        .await;
    // Each member is entered on its own: its part's environment.
    let (_, running) = stack
        .call(Method::GET, &format!("/v1/leases/{stopped}"), &key, None)
        .await;
    let second = running["members"][1]["node_id"]
        .as_str()
        .unwrap()
        .to_string();
    let rank_of = |node: &str| {
        exec_path(
            &stopped,
            &["sh", "-c", "echo $NODE_RANK $LOCAL_WORLD_SIZE $WORLD_SIZE"],
            &format!("&node={node}"),
        )
    };
    let mut ws = open(&stack, &key, &rank_of(&second), EXEC_SUBPROTOCOL)
        .await
        .unwrap();
    let ran = collect(&mut ws, Duration::from_secs(20)).await;
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "1 4 8\n", "{ran:?}");
    let Err((status, problem)) = open(&stack, &key, &rank_of("node-w"), EXEC_SUBPROTOCOL).await
    else {
        panic!("node-w holds no part")
    };
    assert_eq!(
        (status, problem["field"].as_str()),
        (422, Some("node")),
        "{problem}"
    );

    stop_until_ended(&stack, &key, &stopped).await;
    let again = gang(&stack, &key, 8, "true").await;
    let done = stack
        .wait_lease(&key, &again, |l| l["state"] == "ended")
        .await;
    assert_eq!(done["end_reason"], "completed", "{done}");

    // Twelve fit in no region: it waits, saying what its best region has.
    let key12 = stack.create_trusted_tenant("bigger", 12).await;
    let twelve = gang(&stack, &key12, 12, "true").await;
    let queued = stack
        .wait_lease(&key12, &twelve, |l| l["state"] == "queued")
        .await;
    let reason = queued["queued_reason"].as_str().unwrap();
    assert!(
        reason.contains("the nodes of one region 8 at most"),
        "{reason}"
    );
}

/// Two nodes of one GPU each: node-a's GPU idle from the start, node-b's
/// busy until `b_idle_after_secs` after its agent starts.
fn idle_gang_fleet() -> String {
    ["node-a", "node-b"]
        .map(|id| {
            format!(
                "[[node]]\nid = \"{id}\"\nzone = \"cn-north.1a\"\nhostname = \"{id}.sim\"\n\
                 gpu_model = \"A100-40GB\"\ngpu_count = 1\nvram_gb = 40\nfaults = \"faults-{id}.toml\"\n\n"
            )
        })
        .concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gang_is_reclaimed_as_idle_only_once_every_member_is() {
    const A_IDLE_AFTER_SECS: u64 = 20;
    let fleet = idle_gang_fleet();
    let mut stack = Stack::bare(&fleet).await;
    stack.node_runtime = RuntimeKind::Process;
    let idle = |after: u64| {
        format!("[[fault]]\nafter_secs = {after}\ngpu = 0\nkind = \"utilization\"\nto_pct = 0\n")
    };
    // node-b, the first member as placed here, idles first: its report
    // must then carry node-a's later time.
    stack.write_beside_fleet("faults-node-b.toml", &idle(0));
    stack.write_beside_fleet("faults-node-a.toml", &idle(A_IDLE_AFTER_SECS));
    for name in ["scheduler", "pricing", "audit", "gateway"] {
        stack.start_service(name).await;
    }
    let agents_started = std::time::Instant::now();
    for node in ["node-a", "node-b"] {
        stack.start_service(&format!("node-agent:{node}")).await;
    }
    stack.wait_ready().await;
    let tenant = stack
        .create_tenant_from(json!({
            "name": "idlegang", "email": "ops@idlegang.example", "quota": {"max_gpus": 2},
            "trusted": true, "idle_policy": {"window_seconds": 2, "action": "stop"},
        }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_string();
    let lease = gang(&stack, &key, 2, "sleep 600").await;
    stack
        .wait_lease(&key, &lease, |l| l["state"] == "running")
        .await;

    // node-b idles at once; node-a works on: the gang is not idle.
    let busy_until = agents_started + Duration::from_secs(A_IDLE_AFTER_SECS - 2);
    let mut checks = 0;
    while std::time::Instant::now() < busy_until {
        checks += 1;
        let (s, l) = stack
            .call(Method::GET, &format!("/v1/leases/{lease}"), &key, None)
            .await;
        assert_eq!(s, 200, "{l}");
        assert_eq!(l["state"], "running", "reclaimed while node-a worked: {l}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        checks >= 4,
        "the gang ran too late to check: {checks} checks"
    );
    // Then node-a idles too, and the gang is stopped whole.
    let ended = stack
        .wait_lease_within(
            &key,
            &lease,
            |l| l["state"] == "ended",
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(ended["end_reason"], "stopped", "{ended}");
    let log = read_log(&stack.bus().await).await;
    // Each report: who made it, and since when its GPUs idled.
    let reports: Vec<(&str, chrono::DateTime<chrono::Utc>)> = of_type(&log, "lease.idle_detected")
        .iter()
        .filter_map(|e| match &e.envelope.data {
            EventData::LeaseIdleDetected(i) => Some((i.node_id.as_str(), i.idle_since)),
            _ => None,
        })
        .collect();
    let mut reporters: Vec<&str> = reports.iter().map(|(node, _)| *node).collect();
    reporters.sort();
    reporters.dedup();
    assert_eq!(
        reporters,
        ["node-a", "node-b"],
        "each member saw its own GPUs idle"
    );
    // The gang idled from when its last member did: the first member
    // reports the latest of every member's time, node-a's here.
    let since_of = |node: &str| -> Vec<chrono::DateTime<chrono::Utc>> {
        reports
            .iter()
            .filter(|(by, _)| *by == node)
            .map(|(_, since)| *since)
            .collect()
    };
    let first = ended["node_id"].as_str().unwrap().to_string();
    let latest = ["node-a", "node-b"]
        .iter()
        .map(|node| *since_of(node).last().unwrap())
        .max()
        .unwrap();
    assert_eq!(since_of(&first), [latest], "the gang's idle time");
}

/// Every `lease.placed` of `lease` on `log`: each member's node and GPUs,
/// in node-rank order.
fn placements(log: &[lh_bus::Stored], lease: &str) -> Vec<Vec<(String, Vec<u32>)>> {
    of_type(log, "lease.placed")
        .iter()
        .filter_map(|e| match &e.envelope.data {
            EventData::LeasePlaced(p) if p.lease_id.to_string() == lease => Some(
                p.members
                    .iter()
                    .map(|m| (m.node_id.clone(), m.gpus.iter().map(|g| g.index).collect()))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

/// A gang of 10 on node-b's 8 GPUs and 2 of node-a's 6; node-a's GPUs 0
/// and 1 fall off the bus (XID 79, killing what runs on them) 20 s after
/// its agent starts. Meanwhile node-c comes, whose 2 GPUs a gang placed
/// afresh would fill. The gang is not failed: it leaves its GPUs and
/// restarts in place, on the same nodes with the same ranks, node-a's part
/// on two of its GPUs still healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gang_whose_gpu_fails_restarts_in_place_on_its_nodes() {
    let node = |id: &str, gpus: u32, faults: &str| {
        format!(
            "[[node]]\nid = \"{id}\"\nzone = \"cn-north.1a\"\nhostname = \"{id}.sim\"\n\
             gpu_model = \"A100-40GB\"\ngpu_count = {gpus}\nvram_gb = 40\n{faults}\n"
        )
    };
    let fleet = node("node-a", 6, "faults = \"faults-a.toml\"\n")
        + &node("node-b", 8, "")
        + &node("node-c", 2, "");
    let mut stack = Stack::bare(&fleet).await;
    stack.node_runtime = RuntimeKind::Process;
    let xid = |gpu: u32| {
        format!(
            "[[fault]]\nafter_secs = 20\ngpu = {gpu}\nkind = \"xid\"\ncode = 79\nkills_workloads = true\n"
        )
    };
    stack.write_beside_fleet("faults-a.toml", &(xid(0) + &xid(1)));
    for name in ["scheduler", "pricing", "audit", "gateway"] {
        stack.start_service(name).await;
    }
    for node in ["node-a", "node-b"] {
        stack.start_service(&format!("node-agent:{node}")).await;
    }
    stack.wait_ready().await;
    let key = stack.create_trusted_tenant("inplace", 10).await;
    // Every rank of every run appends its rank and devices to one file.
    let dir = lh_testkit::shared_tempdir();
    let out = dir.path().join("runs.txt");
    std::fs::write(&out, "").unwrap();
    std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 10, "gpu_model": "A100-40GB", "workload": {
                "command": ["sh", "-c", "echo \"$RANK $CUDA_VISIBLE_DEVICES\" >> \"$OUT\"; sleep 600"],
                "env": {"OUT": out.to_str().unwrap()},
            }})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let lease = b["id"].as_str().unwrap().to_string();
    let running = stack
        .wait_lease(&key, &lease, |l| l["state"] == "running")
        .await;
    let log = read_log(&stack.bus().await).await;
    let first = placements(&log, &lease);
    assert_eq!(first.len(), 1, "{running}");
    let held_on_a: Vec<u32> = first[0]
        .iter()
        .find(|(n, _)| n == "node-a")
        .map(|(_, g)| g.clone())
        .expect("a member on node-a");
    assert!(
        held_on_a.iter().any(|g| *g < 2),
        "node-a's part must hold a GPU that fails: {held_on_a:?}"
    );
    stack.start_service("node-agent:node-c").await;

    // The fault moves it off its GPUs, and it is placed again on its nodes.
    let again = stack
        .wait_log(60, |log| {
            let p = placements(log, &lease);
            (p.len() == 2).then_some(p)
        })
        .await;
    let log = read_log(&stack.bus().await).await;
    let moved: Vec<&lh_events::LeaseMigrated> = of_type(&log, "lease.migrated")
        .iter()
        .filter_map(|e| match &e.envelope.data {
            EventData::LeaseMigrated(m) if m.lease_id.to_string() == lease => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert!(moved[0].reason.contains("node-a"), "{}", moved[0].reason);
    assert!(moved[0].to.is_none());
    let ranks = |p: &[(String, Vec<u32>)]| -> Vec<(String, usize)> {
        p.iter().map(|(n, g)| (n.clone(), g.len())).collect()
    };
    assert_eq!(
        ranks(&again[1]),
        ranks(&first[0]),
        "the same nodes and ranks"
    );
    let now_on_a = &again[1].iter().find(|(n, _)| n == "node-a").unwrap().1;
    assert!(
        now_on_a.iter().all(|g| *g >= 2),
        "node-a's healthy GPUs: {now_on_a:?}"
    );
    assert!(
        of_type(&log, "lease.ended").is_empty(),
        "not failed: {:?}",
        of_type(&log, "lease.ended")
    );

    // It runs again, every rank once more; node-a's ranks on other devices.
    let restarted = stack
        .wait_lease(&key, &lease, |l| {
            l["state"] == "running" && l["migrations"] == 1
        })
        .await;
    assert_eq!(restarted["node_id"], running["node_id"], "{restarted}");
    let mut runs = String::new();
    for _ in 0..60 {
        runs = std::fs::read_to_string(&out).unwrap_or_default();
        if runs.lines().count() >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let on_a_from = if again[1][0].0 == "node-a" { 0 } else { 8 };
    for rank in 0..10 {
        let runs_of: Vec<&str> = runs
            .lines()
            .filter(|l| l.split(' ').next() == Some(&rank.to_string()))
            .map(|l| l.split_once(' ').map_or("", |(_, d)| d))
            .collect();
        assert_eq!(runs_of.len(), 2, "rank {rank} runs twice: {runs}");
        let on_a = (on_a_from..on_a_from + 2).contains(&rank);
        assert_eq!(
            runs_of[0] != runs_of[1],
            on_a,
            "rank {rank}'s devices: {runs}"
        );
    }
    stop_until_ended(&stack, &key, &lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_and_an_ordinary_ssh_client_enter_the_member_chosen() {
    let dir = tempfile::tempdir().unwrap();
    let host_key = dir.path().join("host_key");
    let port = crate::console_lease::free_port();
    let stack = {
        let host_key = host_key.clone();
        Stack::start_configured(GANG_FLEET, move |s| {
            s.node_runtime = RuntimeKind::Process;
            s.gateway_config = Some(std::sync::Arc::new(move |c: &mut lh_gateway::Config| {
                c.ssh.ssh_addr = format!("127.0.0.1:{port}");
                c.ssh.ssh_host_key_file = host_key.clone();
            }));
        })
        .await
    };
    let key = stack.create_trusted_tenant("consolegang", 8).await;
    let lease = gang(&stack, &key, 8, "sleep 600").await;
    let running = stack
        .wait_lease(&key, &lease, |l| l["state"] == "running")
        .await;
    let second = running["members"][1]["node_id"]
        .as_str()
        .unwrap()
        .to_string();

    // OpenSSH: `<lease>+<member>` enters that member; a node that holds
    // no part signs nobody in.
    let (private, public) = ssh_key(dir.path(), "tenant");
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/ssh-keys",
            &key,
            Some(json!({"name": "laptop", "public_key": public})),
        )
        .await;
    assert_eq!(s, 201, "{b}");
    let host_public = std::process::Command::new("ssh-keygen")
        .arg("-yf")
        .arg(&host_key)
        .output()
        .unwrap();
    assert!(host_public.status.success());
    let known_hosts = dir.path().join("known_hosts");
    std::fs::write(
        &known_hosts,
        format!(
            "[127.0.0.1]:{port} {}",
            String::from_utf8(host_public.stdout).unwrap()
        ),
    )
    .unwrap();
    let ssh = |user: String| {
        let mut command = ssh_command("ssh", &private, &known_hosts, "-p", port);
        command
            .arg(format!("{user}@127.0.0.1"))
            .arg("echo member-$NODE_RANK");
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    let out = ssh(format!("{lease}+{second}")).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "member-1\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ssh(lease.clone()).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "member-0\n");
    let out = ssh(format!("{lease}+node-w")).await.unwrap();
    assert_eq!(out.status.code(), Some(255), "{out:?}");

    let console = format!("{}/console/", stack.gateway_url);
    let browser = Browser::start().await;
    browser.sign_in(&console, &key).await;
    browser.wait("#gpu-table").await;
    browser.go(&format!("{console}#/lease/{lease}")).await;
    browser.wait_text_of("#lease-state", "running").await;
    let members = browser.text(&browser.wait("#lease-members").await).await;
    assert!(members.contains(&format!("1: {second}")), "{members}");
    browser.choose("shell-node", &format!("1: {second}")).await;
    browser.click("#open-shell").await;
    browser.wait(".xterm-rows").await;
    let input = browser.wait(".xterm-helper-textarea").await;
    browser
        .call(
            Method::POST,
            &format!("/element/{input}/value"),
            json!({"text": "echo member-$NODE_RANK-of-$NNODES\u{E007}"}),
        )
        .await;
    browser.wait_text("member-1-of-2").await;
    browser.screenshot("console-gang-shell").await;
    let (s, b) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{lease}/stop"),
            &key,
            None,
        )
        .await;
    assert_eq!(s, 202, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_containers_the_ranks_meet_at_the_rendezvous_over_the_gang_s_link() {
    base_image();
    let (_, _, fleet) = two_node_fleet();
    let stack = Stack::start_configured(&fleet, |s| {
        s.node_runtime = RuntimeKind::Podman;
        s.node_container_args = PODMAN_ARGS.map(String::from).into();
    })
    .await;
    let key = stack.create_trusted_tenant("ganglink", 2).await;
    // Containers with no network of their own: rank 0 listens at the
    // rendezvous, rank 1 connects to it; the lease completes only if it
    // got through.
    let (s, lease) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 2, "gpu_model": "A100-40GB", "workload": {
                "image": "localhost/leasehold/base",
                "command": ["sh", "-c", "echo rank-$RANK at $MASTER_ADDR:$MASTER_PORT of $LEASEHOLD_GANG_MEMBERS; \
                    if [ $RANK = 0 ]; then nc -l -p $MASTER_PORT; else i=0; \
                    until echo hello-from-$RANK | nc -w 2 $MASTER_ADDR $MASTER_PORT; do \
                    i=$((i + 1)); [ $i -lt 60 ] || exit 7; sleep 1; done; fi; echo done-$RANK"],
            }})),
        )
        .await;
    assert_eq!(s, 202, "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();
    // Two containers to start on a loaded machine.
    let ended = stack
        .wait_lease_within(
            &key,
            &id,
            |l| l["state"] == "ended",
            Duration::from_secs(120),
        )
        .await;
    let members: Vec<String> = ended["members"]
        .as_array()
        .expect("a gang's members")
        .iter()
        .map(|m| m["node_id"].as_str().unwrap().to_string())
        .collect();
    let first = log_of(&stack, &key, &id, &members[0]).await;
    let second = log_of(&stack, &key, &id, &members[1]).await;
    assert_eq!(ended["end_reason"], "completed", "{ended} {first} {second}");
    let port = 29_500 + (uuid::Uuid::parse_str(&id).unwrap().as_u128() % 1_000) as u16;
    let text = |log: &Value| log["data"].as_str().unwrap().to_string();
    assert!(
        text(&first).contains(&format!(
            "rank-0 at 10.127.0.1:{port} of 10.127.0.1,10.127.0.2"
        )),
        "{first}"
    );
    assert!(text(&first).contains("hello-from-1"), "{first}");
    assert!(text(&second).contains("done-1"), "{second}");
    // Its segment went with its last member.
    let link = lh_node_agent::workload::gang_link::GangLink {
        lease_id: id.parse().unwrap(),
        node_rank: 0,
        members: Vec::new(),
    };
    let segment = std::path::Path::new("/run/netns").join(link.namespace());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while segment.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} is left",
            segment.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
