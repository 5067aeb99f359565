//! The flags of `lh lease ...`, and the values a lease request is made of
//! (what it asks for, its tier) that `lh quote` shares. Tiers, lease states
//! and recovery zones are the gateway's own types, spelled as it spells them.

use clap::{ArgGroup, Args, Subcommand};
use lh_domain::lease::LeaseState;
use lh_events::{Tier, WorkloadNetwork, ZoneFirst};
use lh_rpc::http::leases::{DatasetMountBody, WorkspaceMountBody};
use rust_decimal::Decimal;
use std::net::IpAddr;
use uuid::Uuid;

/// `lh lease ...`
#[derive(Debug, Clone, Subcommand)]
pub enum LeaseCommand {
    /// Request a new lease.
    Create(Box<LeaseCreate>),
    /// Show one lease, optionally waiting for it to reach a state.
    Get(LeaseGet),
    /// List your leases, newest first.
    #[command(visible_alias = "list")]
    Ls(LeaseList),
    /// Stop (end) a lease.
    Stop(LeaseStop),
    /// Queue a suspended lease again.
    Resume(LeaseStop),
    /// What a lease used of its GPUs: one row per step, one table per GPU.
    Usage(LeaseUsage),
    /// Print what the lease's workload wrote (stdout and stderr), raw.
    Logs(LeaseLogs),
    /// Run a command in a running lease's workload.
    ///
    /// `lh lease exec <id> -- nvidia-smi`: the command runs where the
    /// workload runs (in its container, or as its user), with its stdout
    /// and stderr here. `lh` exits with the command's exit code; with 255
    /// when the session ended without one (the gateway closed it, the
    /// connection was lost, the command could not run), with 130 after
    /// Ctrl-C (without -t), 143 after SIGTERM. A refusal (no such lease,
    /// not running, a limit) exits as any other command's error: 2 for a
    /// 4xx, 3 for a 5xx.
    Exec(LeaseExec),
    /// Open a login shell in a running lease's workload, on this terminal.
    ///
    /// Bash where the image has it, else sh: the same as
    /// `lh lease exec -it <id> -- sh -c '<bash -l, else sh -l>'`, and exits
    /// as it does. Needs a terminal: to feed a shell from a pipe, use
    /// `lh lease exec -i <id> -- sh`.
    Shell(LeaseShell),
    /// Reach a running lease's web page (a template's HTTP port) here.
    ///
    /// `lh lease open <id>`: for a lease made with `--template` (e.g.
    /// `jupyter`), reads the page's token from the workload (an exec of
    /// `cat` on the file the template names), listens on 127.0.0.1 (a free
    /// port unless --port), forwards it to the template's HTTP port, and
    /// prints the URL to open, `http://127.0.0.1:<port>/?token=...`, until
    /// Ctrl-C (exit code 0). No browser is started.
    Open(LeaseOpen),
    /// Forward a local TCP port to a port in a running lease's workload.
    ///
    /// `lh lease port-forward <id> 8888:80` listens here until Ctrl-C (exit
    /// code 0); each connection it accepts is relayed to 127.0.0.1:80 in
    /// the workload's own network (its container's), over a WebSocket of
    /// its own, so connections do not hold each other up. An error of one
    /// connection (nothing listens there, the session was closed) is
    /// printed and ends only that one.
    PortForward(LeasePortForward),
}

/// What a lease or a quote asks for: whole GPUs, a share of one or a MIG
/// instance.
#[derive(Debug, Clone, Args)]
pub struct GpuAskArgs {
    /// Number of whole GPUs (or ask for a share of one with --milli and
    /// --vram-gb, or for a MIG instance with --mig).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..),
        required_unless_present_any = ["milli", "mig"],
        conflicts_with_all = ["milli", "mig"]
    )]
    pub gpus: Option<u32>,
    /// One MIG instance of this profile of the model, e.g. `3g.20gb`.
    #[arg(long, value_name = "PROFILE", conflicts_with = "milli")]
    pub mig: Option<String>,
    /// A share of one GPU's compute, in milli-GPU (1 to 1000).
    #[arg(
        long,
        value_name = "MILLI",
        value_parser = clap::value_parser!(u32).range(1..=1000),
        requires = "vram_gb"
    )]
    pub milli: Option<u32>,
    /// VRAM of the share, in GB (a hard limit).
    #[arg(
        long,
        value_name = "GB",
        value_parser = clap::value_parser!(u32).range(1..),
        requires = "milli"
    )]
    pub vram_gb: Option<u32>,
}

/// `lh lease create`
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("container").args(["image", "template"]).multiple(true)))]
pub struct LeaseCreate {
    #[command(flatten)]
    pub ask: GpuAskArgs,
    /// Order among your own waiting leases, -1000 to 1000 (higher first).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub priority: i32,
    /// GPU model, e.g. `H100-80G`.
    #[arg(long, value_name = "MODEL")]
    pub gpu_model: String,
    /// Service tier.
    #[arg(long, value_enum, default_value_t = Tier::Basic)]
    pub tier: Tier,
    /// Sent as the `Idempotency-Key` header: retrying with the same key
    /// returns the lease created the first time.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Spot only: the most you pay, CNY per GPU-hour (e.g. `4.5`).
    #[arg(long, value_name = "CNY")]
    pub max_price: Option<Decimal>,
    /// A quote of yours (`lh quote`) for these GPUs, model and tier: the
    /// lease is billed on the price book it names.
    #[arg(long, value_name = "QUOTE_ID")]
    pub quote: Option<Uuid>,
    /// A zone the lease may run in (repeatable; none: any).
    #[arg(long = "zone", value_name = "ZONE")]
    pub zones: Vec<String>,
    /// A region the lease may run in (repeatable; none: any).
    #[arg(long = "region", value_name = "REGION")]
    pub regions: Vec<String>,
    /// Spot only: after a preemption, request the lease again up to this
    /// many times (0 to 10).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=10))]
    pub max_retries: Option<u32>,
    /// Where a recovered lease looks first: the zone it left, or any.
    #[arg(long, value_enum, default_value_t = ZoneFirst::Same, requires = "max_retries")]
    pub zone_first: ZoneFirst,
    /// Container image the workload runs (nodes with a container runtime).
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// A template of the gateway's (`lh template ls`), e.g. `jupyter`: its
    /// image and command are the workload's (give neither; --env and
    /// --network still apply). `lh lease open` reaches its web page.
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
    /// The container's network: none, or `tenant` (a network on the node
    /// shared only with your own containers there; no route out).
    #[arg(long, value_enum, default_value_t = WorkloadNetwork::None, requires = "container")]
    pub network: WorkloadNetwork,
    /// An environment variable of the workload, NAME=VALUE (repeatable).
    /// The value is kept out of the event log, sealed with the tenant's key,
    /// and given only to the node the lease runs on.
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// A dataset of yours (`lh data ls`) the container sees read-only:
    /// NAME[:VERSION]:/PATH, e.g. `mnist:/data` (the newest version,
    /// fixed when the lease is asked for). Repeatable.
    #[arg(long = "dataset", value_name = "NAME[:VERSION]:/PATH", value_parser = parse_dataset, requires = "container")]
    pub datasets: Vec<DatasetMountBody>,
    /// A workspace of yours the container reads and writes, NAME:/PATH,
    /// e.g. `ws:/workspace`: made empty on first use, restored on every
    /// node the lease runs on, and synced back while it runs and before it
    /// ends or moves. Repeatable.
    #[arg(long = "workspace", value_name = "NAME:/PATH", value_parser = parse_workspace, requires = "container")]
    pub workspaces: Vec<WorkspaceMountBody>,
    /// Let the container reach your bucket itself: it gets your storage
    /// identity (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION), the
    /// bucket's name in LH_BUCKET and the store at AWS_ENDPOINT_URL
    /// (http://127.0.0.1:8333 inside it), which the AWS CLI, boto3 and
    /// `curl --aws-sigv4` read. Nothing else is reachable through it.
    #[arg(long, requires = "container")]
    pub object_store: bool,
    /// The workload's command, after `--`: `lh lease create ... -- python train.py`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `NAME[:VERSION]:/PATH`: the path is what follows the first `:/`.
fn parse_dataset(raw: &str) -> Result<DatasetMountBody, String> {
    let bad = || format!("{raw:?} is not NAME[:VERSION]:/PATH");
    let (head, path) = raw.split_once(":/").ok_or_else(bad)?;
    let (name, version) = match head.split_once(':') {
        Some((name, version)) => (name, Some(version.to_string())),
        None => (head, None),
    };
    if name.is_empty() || version.as_deref() == Some("") {
        return Err(bad());
    }
    Ok(DatasetMountBody {
        name: name.to_string(),
        version,
        path: format!("/{path}"),
    })
}

/// `NAME:/PATH`.
fn parse_workspace(raw: &str) -> Result<WorkspaceMountBody, String> {
    match raw.split_once(":/") {
        Some((name, path)) if !name.is_empty() && !name.contains(':') => Ok(WorkspaceMountBody {
            name: name.to_string(),
            path: format!("/{path}"),
        }),
        _ => Err(format!("{raw:?} is not NAME:/PATH")),
    }
}

fn parse_env(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{raw:?} is not NAME=VALUE")),
    }
}

/// `lh lease get`
#[derive(Debug, Clone, Args)]
pub struct LeaseGet {
    /// Lease id.
    pub id: String,
    /// Poll every 200 ms until the lease reaches this state (or ends, or is rejected).
    #[arg(long, value_enum, value_name = "STATE")]
    pub wait: Option<LeaseState>,
    /// Give up waiting after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60, requires = "wait")]
    pub timeout: u64,
}

/// `lh lease ls`
#[derive(Debug, Clone, Args)]
pub struct LeaseList {
    /// Page size asked of the gateway.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: Option<u32>,
    /// Start from this cursor (the `next_cursor` of an earlier page).
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
    /// Follow `next_cursor` until the last page.
    #[arg(long)]
    pub all: bool,
}

/// `lh lease usage`
#[derive(Debug, Clone, Args)]
pub struct LeaseUsage {
    /// Lease id.
    pub id: String,
    /// Start of the window (RFC 3339); by default an hour before --to.
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// End of the window (RFC 3339); by default now.
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,
    /// Seconds per row: a multiple of 60, 60 to 86400 (60 by default).
    #[arg(long, value_name = "SECS")]
    pub step: Option<u32>,
}

/// `lh lease logs`
#[derive(Debug, Clone, Args)]
pub struct LeaseLogs {
    /// Lease id.
    pub id: String,
    /// Keep printing what the workload writes (polling every second) until
    /// it ends and all of it is printed; Ctrl-C stops.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Start this many bytes before the end instead of at the start of
    /// what the node keeps.
    #[arg(long, value_name = "BYTES")]
    pub tail: Option<u64>,
    /// A lease across nodes: read only this member's log (without it, each
    /// member's in turn, or with --follow the first's).
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
}

/// `lh lease exec`
#[derive(Debug, Clone, Args)]
pub struct LeaseExec {
    /// Lease id.
    pub id: String,
    /// Pass this standard input to the command; its end (the end of a
    /// pipe or file, Ctrl-D at a terminal without -t) closes the command's.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Give the command a terminal, with this one in raw mode: every key,
    /// Ctrl-C included, goes to the command, and resizes follow. Needs -i
    /// and a terminal on stdin; without them a warning, and no terminal.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// An operator's reason for entering a tenant's lease, which the trail
    /// keeps (the gateway refuses an operator without one, and every
    /// operator where operator sessions are off).
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// A lease across nodes: enter this member (default the first).
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// The command and its arguments, after `--`, run as given (no shell:
    /// `-- sh -c 'a | b'` for one).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `lh lease shell`
#[derive(Debug, Clone, Args)]
pub struct LeaseShell {
    /// Lease id.
    pub id: String,
    /// An operator's reason for entering a tenant's lease, which the trail
    /// keeps.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// A lease across nodes: enter this member (default the first).
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
}

/// `lh lease port-forward`
#[derive(Debug, Clone, Args)]
pub struct LeasePortForward {
    /// Lease id.
    pub id: String,
    /// Listen on port LOCAL here (0, or nothing before the
    /// colon: any free port, printed) and forward to port REMOTE in the
    /// workload (LOCAL by default).
    #[arg(value_name = "LOCAL[:REMOTE]", value_parser = parse_port_spec)]
    pub ports: PortSpec,
    /// The address to listen on; 0.0.0.0 lets other machines in.
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    pub address: IpAddr,
    /// An operator's reason for entering a tenant's lease, which the trail
    /// keeps with each forwarded connection.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
}

/// `lh lease open`
#[derive(Debug, Clone, Args)]
pub struct LeaseOpen {
    /// Lease id.
    pub id: String,
    /// The port to listen on, on 127.0.0.1; 0: any free one (printed).
    #[arg(long, value_name = "LOCAL", default_value_t = 0)]
    pub port: u16,
    /// Print the URL only. `lh` never starts a browser itself, so this is
    /// what it does anyway; the flag is there for scripts that say so.
    #[arg(long)]
    pub no_browser: bool,
}

/// `LOCAL[:REMOTE]` of `lease port-forward`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    /// The port to listen on here; 0 for any free one.
    pub local: u16,
    /// The port in the workload, never 0.
    pub remote: u16,
}

/// Reads `8888` (the same port on both sides), `8888:80`, `0:80` or `:80`
/// (any free local port).
pub fn parse_port_spec(raw: &str) -> Result<PortSpec, String> {
    let port = |text: &str| {
        text.parse::<u16>()
            .map_err(|_| format!("{text:?} is not a port (0 to 65535)"))
    };
    let (local, remote) = match raw.split_once(':') {
        Some(("", remote)) => (0, port(remote)?),
        Some((local, remote)) => (port(local)?, port(remote)?),
        None => {
            let local = port(raw)?;
            (local, local)
        }
    };
    if remote == 0 {
        return Err(format!(
            "{raw:?}: the port in the workload must be 1 to 65535 (0 means any free \
             port, which only the local side can have: 0:REMOTE)"
        ));
    }
    Ok(PortSpec { local, remote })
}

/// `lh lease stop`
#[derive(Debug, Clone, Args)]
pub struct LeaseStop {
    /// Lease id.
    pub id: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::cli::Command;
    use crate::args::test_parse::parse;
    use clap::error::ErrorKind;

    #[test]
    fn lease_create_defaults_to_basic() {
        let cli = parse(&["lease", "create", "--gpus", "2", "--gpu-model", "H100"]).unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(c.ask.gpus, Some(2));
        assert_eq!(c.gpu_model, "H100");
        assert_eq!(c.priority, 0);
        assert_eq!(c.tier, Tier::Basic);
        assert_eq!(c.idempotency_key, None);
    }

    #[test]
    fn lease_create_spot_with_idempotency_key() {
        let cli = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A100",
            "--tier",
            "spot",
            "--idempotency-key",
            "k-1",
        ])
        .unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(c.tier, Tier::Spot);
        assert_eq!(c.idempotency_key.as_deref(), Some("k-1"));
    }

    #[test]
    fn lease_create_rejects_bad_values() {
        for args in [
            &["lease", "create", "--gpus", "0", "--gpu-model", "H100"][..],
            &["lease", "create", "--gpus", "two", "--gpu-model", "H100"],
            &[
                "lease",
                "create",
                "--gpus",
                "1",
                "--gpu-model",
                "H100",
                "--tier",
                "gold",
            ],
        ] {
            let e = parse(args).unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::ValueValidation | ErrorKind::InvalidValue
                ),
                "{args:?}: {:?}",
                e.kind()
            );
        }
        let e = parse(&["lease", "create", "--gpu-model", "H100"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        // A share needs both its compute and its VRAM, and excludes --gpus.
        let e = parse(&["lease", "create", "--milli", "300", "--gpu-model", "H100"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        let e = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--milli",
            "300",
            "--vram-gb",
            "10",
            "--gpu-model",
            "H100",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict);
        let e = parse(&[
            "lease",
            "create",
            "--milli",
            "1001",
            "--vram-gb",
            "1",
            "--gpu-model",
            "H100",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
    }

    #[test]
    fn lease_create_a_share_of_one_gpu_with_a_priority() {
        let cli = parse(&[
            "lease",
            "create",
            "--milli",
            "300",
            "--vram-gb",
            "10",
            "--gpu-model",
            "A100-40GB",
            "--priority",
            "-5",
        ])
        .unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(
            (c.ask.gpus, c.ask.milli, c.ask.vram_gb, c.priority),
            (None, Some(300), Some(10), -5)
        );
    }

    #[test]
    fn lease_create_a_mig_instance() {
        let cli = parse(&[
            "lease",
            "create",
            "--mig",
            "3g.20gb",
            "--gpu-model",
            "A100-40GB",
        ])
        .unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!((c.ask.gpus, c.ask.mig.as_deref()), (None, Some("3g.20gb")));
        for other in [
            &["--gpus", "1"][..],
            &["--milli", "300", "--vram-gb", "10"][..],
        ] {
            let mut args = vec![
                "lease",
                "create",
                "--mig",
                "1g.5gb",
                "--gpu-model",
                "A100-40GB",
            ];
            args.extend_from_slice(other);
            assert_eq!(
                parse(&args).unwrap_err().kind(),
                ErrorKind::ArgumentConflict
            );
        }
    }

    #[test]
    fn lease_create_with_a_workload() {
        let cli = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A100-40GB",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--",
            "python",
            "train.py",
            "--epochs",
            "3",
        ])
        .unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(c.command, ["python", "train.py", "--epochs", "3"]);
        assert_eq!(
            c.env,
            [("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
        let e = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A",
            "--env",
            "=1",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
    }

    #[test]
    fn lease_create_with_datasets_and_a_workspace() {
        let cli = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A100-40GB",
            "--image",
            "localhost/train",
            "--dataset",
            "mnist:/data",
            "--dataset",
            &format!("imagenet:{}:/mnt/in", "ab".repeat(32)),
            "--workspace",
            "ws:/workspace",
        ])
        .unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(
            c.datasets,
            [
                DatasetMountBody {
                    name: "mnist".into(),
                    version: None,
                    path: "/data".into()
                },
                DatasetMountBody {
                    name: "imagenet".into(),
                    version: Some("ab".repeat(32)),
                    path: "/mnt/in".into()
                }
            ]
        );
        assert_eq!(
            c.workspaces,
            [WorkspaceMountBody {
                name: "ws".into(),
                path: "/workspace".into()
            }]
        );
        for bad in ["mnist", "mnist:data", ":/data", "mnist::/data"] {
            let e = parse(&[
                "lease",
                "create",
                "--gpus",
                "1",
                "--gpu-model",
                "A",
                "--image",
                "x",
                "--dataset",
                bad,
            ])
            .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{bad}");
        }
        // A mount is a container's: with an image or a template.
        let e = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A",
            "--workspace",
            "ws:/w",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn lease_create_from_a_template() {
        let cli = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A100-40GB",
            "--template",
            "jupyter",
            "--network",
            "tenant",
        ])
        .unwrap();
        let Command::Lease(LeaseCommand::Create(c)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(c.template.as_deref(), Some("jupyter"));
        assert_eq!(c.network, WorkloadNetwork::Tenant);
        // The gateway says what contradicts the template, naming the field.
        parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A",
            "--template",
            "jupyter",
            "--image",
            "x",
        ])
        .unwrap();
        // A network is a container's: with an image or a template.
        let e = parse(&[
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A",
            "--network",
            "tenant",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn lease_open_takes_a_local_port() {
        let cli = parse(&["lease", "open", "L1"]).unwrap();
        let Command::Lease(LeaseCommand::Open(o)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!((o.id.as_str(), o.port, o.no_browser), ("L1", 0, false));
        let cli = parse(&["lease", "open", "L1", "--port", "8888", "--no-browser"]).unwrap();
        let Command::Lease(LeaseCommand::Open(o)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!((o.port, o.no_browser), (8888, true));
        let e = parse(&["lease", "open", "L1", "--port", "70000"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
        let e = parse(&["lease", "open"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn lease_get_with_wait_and_timeout() {
        let cli = parse(&["lease", "get", "abc", "--wait", "running", "--timeout", "5"]).unwrap();
        let Command::Lease(LeaseCommand::Get(g)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(g.id, "abc");
        assert_eq!(g.wait, Some(LeaseState::Running));
        assert_eq!(g.timeout, 5);

        let cli = parse(&["lease", "get", "abc"]).unwrap();
        let Command::Lease(LeaseCommand::Get(g)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(g.wait, None);
        assert_eq!(g.timeout, 60);
    }

    #[test]
    fn lease_get_rejects_unknown_state_and_lone_timeout() {
        let e = parse(&["lease", "get", "abc", "--wait", "sleeping"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        let e = parse(&["lease", "get", "abc", "--timeout", "3"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        let e = parse(&["lease", "get"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn lease_ls_and_alias() {
        let cli = parse(&["lease", "ls", "--limit", "10", "--all"]).unwrap();
        let Command::Lease(LeaseCommand::Ls(l)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(l.limit, Some(10));
        assert!(l.all);
        assert_eq!(l.cursor, None);

        let cli = parse(&["lease", "list"]).unwrap();
        let Command::Lease(LeaseCommand::Ls(l)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(l.limit, None);
        assert!(!l.all);

        let e = parse(&["lease", "ls", "--limit", "0"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
    }

    #[test]
    fn lease_exec_takes_its_command_after_the_double_dash() {
        let cli = parse(&["lease", "exec", "L1", "--", "sh", "-c", "echo $HOME -x"]).unwrap();
        let Command::Lease(LeaseCommand::Exec(e)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(e.id, "L1");
        assert_eq!(e.command, ["sh", "-c", "echo $HOME -x"]);
        assert!(!e.stdin && !e.tty, "stdin and a terminal only when asked");

        let cli = parse(&["lease", "exec", "-it", "L1", "--", "bash"]).unwrap();
        let Command::Lease(LeaseCommand::Exec(e)) = cli.command else {
            panic!("wrong command")
        };
        assert!(e.stdin && e.tty);
        let cli = parse(&["lease", "exec", "L1", "--stdin", "--", "cat"]).unwrap();
        let Command::Lease(LeaseCommand::Exec(e)) = cli.command else {
            panic!("wrong command")
        };
        assert!(e.stdin && !e.tty);
        // Flags after `--` are the command's.
        let cli = parse(&["lease", "exec", "L1", "--", "ls", "-t", "-i"]).unwrap();
        let Command::Lease(LeaseCommand::Exec(e)) = cli.command else {
            panic!("wrong command")
        };
        assert!(!e.stdin && !e.tty);
        assert_eq!(e.command, ["ls", "-t", "-i"]);
    }

    #[test]
    fn lease_exec_needs_a_command() {
        let e = parse(&["lease", "exec", "L1"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        let e = parse(&["lease", "exec", "L1", "--"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        // Without `--` a word is not taken as the command.
        assert!(parse(&["lease", "exec", "L1", "ls"]).is_err());
    }

    #[test]
    fn lease_shell_takes_only_an_id() {
        let cli = parse(&["lease", "shell", "L1"]).unwrap();
        let Command::Lease(LeaseCommand::Shell(s)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(s.id, "L1");
        assert!(parse(&["lease", "shell", "L1", "--", "zsh"]).is_err());
    }

    #[test]
    fn lease_port_forward_ports_and_address() {
        let cli = parse(&["lease", "port-forward", "L1", "8888:80"]).unwrap();
        let Command::Lease(LeaseCommand::PortForward(p)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(p.id, "L1");
        assert_eq!(
            p.ports,
            PortSpec {
                local: 8888,
                remote: 80
            }
        );
        assert_eq!(p.address, IpAddr::from([127, 0, 0, 1]));

        let cli = parse(&["lease", "port-forward", "L1", "0:5432", "--address", "::1"]).unwrap();
        let Command::Lease(LeaseCommand::PortForward(p)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!((p.ports.local, p.ports.remote), (0, 5432));
        assert_eq!(p.address, "::1".parse::<IpAddr>().unwrap());

        for bad in [
            &["lease", "port-forward", "L1", "80:0"][..],
            &["lease", "port-forward", "L1", "http"],
            &[
                "lease",
                "port-forward",
                "L1",
                "80",
                "--address",
                "localhost",
            ],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{bad:?}");
        }
        let e = parse(&["lease", "port-forward", "L1"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn port_specs() {
        let spec = |local, remote| Ok(PortSpec { local, remote });
        assert_eq!(parse_port_spec("8888"), spec(8888, 8888));
        assert_eq!(parse_port_spec("8888:80"), spec(8888, 80));
        assert_eq!(parse_port_spec("0:80"), spec(0, 80));
        assert_eq!(parse_port_spec(":80"), spec(0, 80));
        assert_eq!(parse_port_spec("65535:1"), spec(65535, 1));
        for bad in [
            "0", "80:0", ":0", "70000", "80:70000", "a", "80:a", "", ":", "80:", "-1", "80:81:82",
            " 80", "8 0",
        ] {
            let e = parse_port_spec(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad:?}");
        }
        assert!(parse_port_spec("0").unwrap_err().contains("1 to 65535"));
        assert!(parse_port_spec("70000").unwrap_err().contains("\"70000\""));
    }

    #[test]
    fn lease_stop() {
        let cli = parse(&["lease", "stop", "L1"]).unwrap();
        let Command::Lease(LeaseCommand::Stop(s)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(s.id, "L1");
    }
}
