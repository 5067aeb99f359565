//! `lh node enroll | drain | uncordon | ls | get`: vouch for a GPU node,
//! take it out of placement and give it back, list the fleet, look at one
//! node, one request each to `/v1/nodes[/{id}]`.

use lh_rpc::http::nodes::{DrainNode, EnrollNode};

use crate::args::NodeCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, Out};
use crate::render;

/// Runs one `lh node` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: NodeCommand,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        NodeCommand::Enroll(e) => {
            let body = EnrollNode {
                zone: e.zone,
                max_gpus: e.max_gpus,
                gpu_models: e.gpu_models,
                max_isolation: e.max_isolation,
                gpu_sharing: e.gpu_sharing,
            };
            let node = gw
                .post(&["v1", "nodes", &e.id, "enroll"], &body, &[])
                .await?;
            emit(out, json, &node, render::node_enrollment)?;
            Ok(EXIT_OK)
        }
        NodeCommand::Drain(d) => {
            let body = DrainNode {
                mode: d.mode,
                reason: d.reason,
            };
            let node = gw
                .post(&["v1", "nodes", &d.id, "drain"], &body, &[])
                .await?;
            emit(out, json, &node, render::node_cordon)?;
            Ok(EXIT_OK)
        }
        NodeCommand::Ls => {
            let fleet = gw.get(&["v1", "nodes"], &[]).await?;
            emit(out, json, &fleet, render::node_list)?;
            Ok(EXIT_OK)
        }
        NodeCommand::Get(n) => {
            let node = gw.get(&["v1", "nodes", &n.id], &[]).await?;
            emit(out, json, &node, render::node_view)?;
            Ok(EXIT_OK)
        }
        NodeCommand::Uncordon(n) => {
            let node = gw.post_empty(&["v1", "nodes", &n.id, "uncordon"]).await?;
            emit(out, json, &node, render::node_cordon)?;
            Ok(EXIT_OK)
        }
    }
}
