//! `scripts/nvml-check.sh` off a GPU: the simulated node passes the
//! inventory, sample and event checks and skips MIG and MPS; a failing step
//! turns into a FAIL line and exit 1; without NVML the script exits 2.

use std::path::{Path, PathBuf};

use lh_testkit::workspace_root;
use std::process::{Command, Output};

/// The directory of the nvml-check example, built by the cargo running this
/// test (a no-op when `cargo test` built examples already).
fn example_dir() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "build",
            "--quiet",
            "-p",
            "lh-node-agent",
            "--example",
            "nvml-check",
            "--message-format=json",
        ])
        .output()
        .expect("cargo build runs");
    assert!(
        out.status.success(),
        "building nvml-check failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["target"]["name"] == "nvml-check")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .expect("cargo names the nvml-check executable")
}

fn script(bin_dir: &Path, args: &[&str]) -> Output {
    Command::new(workspace_root().join("scripts/nvml-check.sh"))
        .arg("1")
        .arg("--bin-dir")
        .arg(bin_dir)
        .args(args)
        .env("TMPDIR", std::env::temp_dir())
        .output()
        .expect("the script runs")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_simulated_node_passes_the_backend_checks_and_skips_mig_and_mps() {
    let out = script(&example_dir(), &["--backend", "sim", "--node-id", "node-b"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let first_word = |check: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(check))
            .and_then(|l| l.split_whitespace().next())
            .map(str::to_owned)
    };
    for check in ["inventory", "samples", "events"] {
        assert_eq!(
            first_word(check).as_deref(),
            Some("PASS"),
            "{check}: {stdout}"
        );
    }
    for check in ["mig", "mps"] {
        assert_eq!(
            first_word(check).as_deref(),
            Some("SKIP"),
            "{check}: {stdout}"
        );
    }
    // node-b of dev/fleet.toml has four GPUs.
    assert!(stdout.contains("PASS inventory  4 GPU(s)"), "{stdout}");
    assert!(
        stdout.contains("SUMMARY: 3 passed, 0 failed, 2 skipped"),
        "{stdout}"
    );
}

#[test]
fn a_step_that_fails_is_a_fail_line_and_exit_1() {
    // An nvml-check that lists no GPU and stops before its event loop ends.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("nvml-check");
    std::fs::write(
        &fake,
        "#!/bin/sh\n\
         case \"$*\" in *--help*) echo '--mig-check'; exit 0;; esac\n\
         echo '{\"backend\":\"sim\",\"node_id\":\"x\"}'\n\
         echo '{\"inventory\": []}'\n\
         echo 'sampling broke' >&2\n\
         exit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = script(dir.path(), &["--backend", "sim"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("FAIL inventory"), "{stdout}");
    assert!(stdout.contains("FAIL events"), "{stdout}");
    assert!(stdout.contains("sampling broke"), "{stdout}");
    assert!(
        stdout.contains("SUMMARY: 0 passed, 3 failed, 2 skipped"),
        "{stdout}"
    );
}

#[test]
fn without_nvml_the_script_says_so_and_exits_2() {
    let bin_dir = example_dir();
    let direct = Command::new(bin_dir.join("nvml-check"))
        .args(["--seconds", "0"])
        .output()
        .expect("nvml-check runs");
    if direct.status.code() != Some(2) {
        // NVML answered: this machine has a GPU, and the check is the script's real run.
        return;
    }
    let out = script(&bin_dir, &[]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stderr.contains("no NVIDIA GPU here"), "{stderr}");
    assert!(!stdout.contains("SUMMARY"), "{stdout}");
}
