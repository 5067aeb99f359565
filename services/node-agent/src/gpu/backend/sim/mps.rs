//! CUDA MPS as the simulated fleet has it: a stand-in for
//! `nvidia-cuda-mps-control` and `nvidia-smi`, and a CUDA client that
//! allocates device memory through its GPU's MPS daemon, so that the whole
//! path of a share (scheduler, agent, daemon limits, workload) runs here
//! without a GPU.
//!
//! They keep their state in files, as the real daemon keeps it in its
//! process: the daemon in its pipe directory (`daemon`, the defaults, the
//! one server and its limits, a file per connected client), the compute
//! mode beside the tools. They behave as ADR 016 measured the real ones:
//! a command is refused while no daemon runs; a server takes the defaults
//! when it starts and its own limits after that; a client binds the
//! server's limit when it connects and keeps it; a client that asks for
//! more than its limit gets the allocation error PyTorch prints; and a
//! process without the pipe directory gets no context at all (the GPU is
//! in exclusive-process mode and the server holds it).
//!
//! POSIX shell scripts, so that a test or an operator's `make up` needs
//! nothing built beyond the agent.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::gpu::backend::{MPS_CONTROL_BINARY, NVIDIA_SMI_BINARY};

/// The simulated client: `lh-sim-cuda-alloc <MiB> [hold seconds]`.
pub const SIM_CUDA_ALLOC_BINARY: &str = "lh-sim-cuda-alloc";
/// What the simulated client exits with when it gets no GPU context.
pub const NO_CONTEXT_EXIT_CODE: i32 = 2;
/// What it exits with when its allocation is refused.
pub const OUT_OF_MEMORY_EXIT_CODE: i32 = 1;

/// Where the simulated tools were written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimMpsTools {
    /// Give this to the agent as its MPS control binary
    /// (`--mps-control`); `nvidia-smi` is beside it.
    pub control: PathBuf,
    /// The simulated CUDA client.
    pub alloc: PathBuf,
    /// Where `nvidia-smi -i <uuid> -c <mode>` keeps each GPU's mode.
    pub compute_modes: PathBuf,
}

/// Writes the tools into `dir` (created if need be).
pub fn install(dir: &Path) -> io::Result<SimMpsTools> {
    let bin = dir.join("bin");
    let modes = dir.join("compute-mode");
    std::fs::create_dir_all(&bin)?;
    std::fs::create_dir_all(&modes)?;
    let modes_text = shell_quote(&modes)?;
    let tools = SimMpsTools {
        control: bin.join(MPS_CONTROL_BINARY),
        alloc: bin.join(SIM_CUDA_ALLOC_BINARY),
        compute_modes: modes,
    };
    write_script(&tools.control, CONTROL)?;
    write_script(
        &bin.join(NVIDIA_SMI_BINARY),
        &SMI.replace("@MODES@", &modes_text),
    )?;
    write_script(
        &tools.alloc,
        &ALLOC
            .replace("@NO_CONTEXT@", &NO_CONTEXT_EXIT_CODE.to_string())
            .replace("@OOM@", &OUT_OF_MEMORY_EXIT_CODE.to_string()),
    )?;
    Ok(tools)
}

/// `path` in single quotes; one holding a quote is refused rather than
/// escaped (the tools' directory is the operator's or a test's).
fn shell_quote(path: &Path) -> io::Result<String> {
    let text = path
        .to_str()
        .filter(|t| !t.contains('\''))
        .ok_or_else(|| io::Error::other(format!("{} cannot be quoted", path.display())))?;
    Ok(format!("'{text}'"))
}

fn write_script(path: &Path, text: &str) -> io::Result<()> {
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

const CONTROL: &str = r#"#!/bin/sh
# Simulated nvidia-cuda-mps-control: the daemon is a file in its pipe directory.
p="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
if [ "$1" = "-d" ]; then
  mkdir -p "$p" && : > "$p/daemon" && printf '%s\n' "$CUDA_VISIBLE_DEVICES" > "$p/gpu"
  exit $?
fi
read -r cmd a b c || true
[ -e "$p/daemon" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
case "$cmd" in
  quit) rm -rf "$p/daemon" "$p/servers" "$p/server_mem" "$p/server_pct" "$p/default_mem" "$p/default_pct" "$p/clients" ;;
  get_default_active_thread_percentage) cat "$p/default_pct" 2>/dev/null || echo 100.0 ;;
  set_default_device_pinned_mem_limit) printf '%s\n' "$b" > "$p/default_mem" ;;
  set_default_active_thread_percentage) printf '%s\n' "$a" > "$p/default_pct" ;;
  start_server)
    [ -e "$p/servers" ] || echo 4242 > "$p/servers"
    [ -e "$p/default_mem" ] && cp "$p/default_mem" "$p/server_mem"
    [ -e "$p/default_pct" ] && cp "$p/default_pct" "$p/server_pct"
    : ;;
  get_server_list) cat "$p/servers" 2>/dev/null || true ;;
  set_device_pinned_mem_limit)
    grep -qx "$a" "$p/servers" 2>/dev/null || { echo "No server $a" >&2; exit 1; }
    printf '%s\n' "$c" > "$p/server_mem" ;;
  set_active_thread_percentage)
    grep -qx "$a" "$p/servers" 2>/dev/null || { echo "No server $a" >&2; exit 1; }
    printf '%s\n' "$b" > "$p/server_pct" ;;
  get_client_list)
    for f in "$p"/clients/*; do
      [ -e "$f" ] || continue
      pid="${f##*/}"
      if kill -0 "$pid" 2>/dev/null; then echo "$pid"; else rm -f "$f"; fi
    done ;;
  *) echo "Unknown command $cmd" >&2; exit 1 ;;
esac
"#;

const SMI: &str = r#"#!/bin/sh
# Simulated nvidia-smi: `-L`, and `-i <uuid> -c <mode>` kept in a file per GPU.
case "$1" in
  -L) echo "GPU 0: Simulated GPU (UUID: GPU-sim)"; exit 0 ;;
  -i) [ "$3" = "-c" ] && [ -n "$4" ] || exit 2
      case "$2" in */*|'') exit 2 ;; esac
      printf '%s\n' "$4" > @MODES@/"$2"; exit 0 ;;
esac
exit 0
"#;

const ALLOC: &str = r#"#!/bin/sh
# Simulated CUDA client: allocates <MiB> of device memory through the GPU's
# MPS daemon, holds it [hold seconds], frees it.
want="$1"; hold="${2:-0}"
case "$want" in ''|*[!0-9]*) echo "usage: lh-sim-cuda-alloc <MiB> [hold seconds]" >&2; exit 64 ;; esac
p="$CUDA_MPS_PIPE_DIRECTORY"
if [ -z "$p" ] || [ ! -e "$p/daemon" ] || [ ! -e "$p/servers" ]; then
  echo "RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable" >&2
  exit @NO_CONTEXT@
fi
# The limit binds when the client connects, as the server holds it then.
mem=$(cat "$p/server_mem" 2>/dev/null)
case "$mem" in
  *G) limit=$(( ${mem%G} * 1024 )) ;;
  *M) limit=${mem%M} ;;
  *) limit= ;;
esac
if [ -n "$limit" ] && [ "$want" -gt "$limit" ]; then
  echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate $want MiB; this process may pin at most $limit MiB" >&2
  exit @OOM@
fi
mkdir -p "$p/clients" && echo "$want" > "$p/clients/$$"
# A signal interrupts `wait`, where it would wait for a foreground sleep.
sleep "$hold" & held=$!
trap 'kill $held 2>/dev/null; rm -f "$p/clients/$$"; exit 143' TERM INT
wait $held
rm -f "$p/clients/$$"
echo "allocated $want MiB (limit ${limit:-none} MiB)"
"#;
