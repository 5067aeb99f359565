//! What the container engine says of a container and an image: whether it
//! runs yet, whether it exists, whether the image is there, whether the
//! engine saw an OOM kill. Each a bounded call of the CLI.

use std::process::Stdio;
use std::time::Duration;

use super::engine::{CliFlavor, Engine};

/// How often a starting container is looked at until it runs.
const START_POLL: Duration = Duration::from_millis(200);

/// How long one look at the engine (inspect, exists, rm) may take.
pub const ENGINE_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the CLI with `args`, its standard output when it succeeds.
async fn engine_output(engine: &Engine, args: &[&str]) -> Option<String> {
    let output = engine
        .command()
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(ENGINE_CALL_TIMEOUT, output).await {
        Ok(Ok(output)) if output.status.success() => {
            Some(String::from_utf8_lossy(&output.stdout).trim().to_string())
        }
        _ => None,
    }
}

/// The container's state as the engine says (`running`, `exited`, …);
/// `None` while it does not exist.
pub(crate) async fn container_status(engine: &Engine, name: &str) -> Option<String> {
    engine_output(
        engine,
        &[
            "container",
            "inspect",
            "--format",
            "{{.State.Status}}",
            name,
        ],
    )
    .await
}

/// The host pid of the container's first process, while it runs.
pub(crate) async fn container_pid(engine: &Engine, name: &str) -> Option<u32> {
    engine_output(
        engine,
        &["container", "inspect", "--format", "{{.State.Pid}}", name],
    )
    .await?
    .parse()
    .ok()
    .filter(|pid| *pid > 1)
}

/// Whether the engine holds `image`.
pub(crate) async fn image_exists(engine: &Engine, image: &str) -> bool {
    let args: &[&str] = match engine.flavor {
        CliFlavor::Podman => &["image", "exists", "--", image],
        CliFlavor::Docker => &["image", "inspect", "--format", "{{.Id}}", "--", image],
    };
    engine_output(engine, args).await.is_some()
}

/// Whether the engine saw the container's last run OOM-killed.
pub(crate) async fn engine_saw_oom(engine: &Engine, name: &str) -> bool {
    engine_output(
        engine,
        &[
            "container",
            "inspect",
            "--format",
            "{{.State.OOMKilled}}",
            name,
        ],
    )
    .await
    .is_some_and(|out| out == "true")
}

/// How long the engine may take to say how a container ended, after its
/// `run` gave up waiting for it.
const EXIT_CODE_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// The container's own exit code, waited for: what `<cli> run` should have
/// returned when it ends with an error of its own (podman 4 sometimes asks
/// for the exit code before its monitor has written it, and gives up with
/// 127). `None` when the container is gone or the engine does not say.
pub(crate) async fn exit_code_of(engine: &Engine, name: &str) -> Option<i32> {
    let waited = engine
        .command()
        .args(["wait", name])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(EXIT_CODE_WAIT, waited).await {
        Ok(Ok(output)) if output.status.success() => {
            String::from_utf8_lossy(&output.stdout).trim().parse().ok()
        }
        _ => None,
    }
}

/// Waits until the container runs (or has run and ended): true; false when
/// `deadline` comes first.
pub(crate) async fn until_running(
    engine: &Engine,
    name: &str,
    deadline: tokio::time::Instant,
) -> bool {
    loop {
        match container_status(engine, name).await.as_deref() {
            None | Some("created") | Some("configured") | Some("initialized") | Some("") => {}
            Some(_) => return true,
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep_until((tokio::time::Instant::now() + START_POLL).min(deadline)).await;
    }
}
