//! `lh lease ...`: request, read, stop and resume a lease, read its GPU
//! usage. Commands that are one request are here; those that page, poll
//! or follow have a room each: [`list`], [`wait`], [`logs`]; sessions into
//! a running lease too: [`session`] (exec, shell) and [`port_forward`],
//! over the WebSockets of [`wire`], and [`open`], which uses both to reach
//! a template's web page.

mod list;
mod logs;
pub(crate) mod open;
pub(crate) mod port_forward;
pub(crate) mod session;
mod wait;
mod wire;

use std::time::Duration;

use lh_rpc::http::leases::{CreateLease, RecoveryBody, WorkloadBody};

use crate::args::{LeaseCommand, LeaseCreate};
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, Out};
use crate::render;

use super::body::GpuFields;

pub use logs::LOGS_POLL_INTERVAL;
pub use open::{open, OPEN_WAIT};
pub use port_forward::forward;
pub use session::{EXIT_INTERRUPTED, EXIT_SESSION_ERROR, EXIT_TERMINATED, SHELL_COMMAND};
pub use wait::WAIT_POLL_INTERVAL;

/// Runs one `lh lease` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: LeaseCommand,
    json: bool,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        LeaseCommand::Create(c) => {
            let headers: Vec<(&str, &str)> = c
                .idempotency_key
                .as_deref()
                .map(|k| ("Idempotency-Key", k))
                .into_iter()
                .collect();
            let lease = gw
                .post(&["v1", "leases"], &create_lease(&c), &headers)
                .await?;
            emit(out, json, &lease, render::lease_view)?;
            Ok(EXIT_OK)
        }
        LeaseCommand::Get(g) => match g.wait {
            None => {
                let lease = gw.get(&["v1", "leases", &g.id], &[]).await?;
                emit(out, json, &lease, render::lease_view)?;
                Ok(EXIT_OK)
            }
            Some(target) => {
                let timeout = Duration::from_secs(g.timeout);
                let (lease, code) = wait::wait_for(gw, &g.id, target, timeout, err).await?;
                emit(out, json, &lease, render::lease_view)?;
                Ok(code)
            }
        },
        LeaseCommand::Ls(l) => list::list_leases(gw, &l, json, out).await,
        LeaseCommand::Stop(s) => {
            let lease = gw.post_empty(&["v1", "leases", &s.id, "stop"]).await?;
            emit(out, json, &lease, render::lease_view)?;
            Ok(EXIT_OK)
        }
        LeaseCommand::Usage(u) => {
            let step = u.step.map(|s| s.to_string());
            let query: Vec<(&str, &str)> = [
                ("from", u.from.as_deref()),
                ("to", u.to.as_deref()),
                ("step", step.as_deref()),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect();
            let usage = gw.get(&["v1", "leases", &u.id, "usage"], &query).await?;
            emit(out, json, &usage, render::lease_usage)?;
            Ok(EXIT_OK)
        }
        LeaseCommand::Logs(l) => logs::lease_logs(gw, &l, out, err).await,
        LeaseCommand::Exec(e) => session::exec(gw, &e, out, err).await,
        LeaseCommand::Shell(s) => session::shell(gw, &s, out, err).await,
        LeaseCommand::PortForward(p) => port_forward::port_forward(gw, &p, out, err).await,
        LeaseCommand::Open(o) => open::open_command(gw, &o, out, err).await,
        LeaseCommand::Resume(s) => {
            let lease = gw.post_empty(&["v1", "leases", &s.id, "resume"]).await?;
            emit(out, json, &lease, render::lease_view)?;
            Ok(EXIT_OK)
        }
    }
}

/// The request `lease create` sends: what it asks for, and only the
/// options given.
fn create_lease(c: &LeaseCreate) -> CreateLease {
    let GpuFields {
        gpus,
        gpu_fraction,
        mig_profile,
    } = GpuFields::from(&c.ask);
    // With a template and nothing else, no workload is sent: the gateway
    // makes it from the template.
    let runs_something = !c.command.is_empty()
        || c.image.is_some()
        || !c.env.is_empty()
        || !c.network.is_none()
        || !c.datasets.is_empty()
        || !c.workspaces.is_empty()
        || c.object_store;
    CreateLease {
        gpus,
        gpu_fraction,
        mig_profile,
        workload: runs_something.then(|| WorkloadBody {
            command: c.command.clone(),
            image: c.image.clone(),
            env: c.env.iter().cloned().collect(),
            network: c.network,
            datasets: c.datasets.clone(),
            workspaces: c.workspaces.clone(),
            object_store: c.object_store,
        }),
        template: c.template.clone(),
        gpu_model: c.gpu_model.clone(),
        tier: c.tier,
        priority: c.priority,
        max_price_cny_per_gpu_hour: c.max_price,
        zones: c.zones.clone(),
        regions: c.regions.clone(),
        recovery: c.max_retries.map(|max_retries| RecoveryBody {
            max_retries,
            zone_first: c.zone_first,
        }),
        quote_id: c.quote,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser as _;
    use serde_json::json;

    fn body(args: &[&str]) -> serde_json::Value {
        let mut argv = vec![
            "lh",
            "lease",
            "create",
            "--gpus",
            "1",
            "--gpu-model",
            "A100-40GB",
        ];
        argv.extend_from_slice(args);
        let Command::Lease(LeaseCommand::Create(c)) = Cli::try_parse_from(argv).unwrap().command
        else {
            panic!("not lease create")
        };
        serde_json::to_value(create_lease(&c)).unwrap()
    }

    #[test]
    fn a_template_alone_sends_its_name_and_no_workload() {
        assert_eq!(
            body(&["--template", "jupyter"]),
            json!({"gpus": 1, "gpu_model": "A100-40GB", "tier": "basic", "priority": 0,
                "template": "jupyter"})
        );
        let with_network = body(&["--template", "jupyter", "--network", "tenant"]);
        assert_eq!(
            with_network["workload"],
            json!({"command": [], "env": {}, "network": "tenant"})
        );
        assert_eq!(with_network["template"], "jupyter");
        assert!(body(&[]).get("template").is_none());
    }
}
