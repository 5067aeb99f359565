//! `lh node drain | uncordon`: take a GPU node out of placement and give it
//! back, one request each to `/v1/nodes/{id}`.

use lh_rpc::http::nodes::DrainNode;

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
        NodeCommand::Uncordon(n) => {
            let node = gw.post_empty(&["v1", "nodes", &n.id, "uncordon"]).await?;
            emit(out, json, &node, render::node_cordon)?;
            Ok(EXIT_OK)
        }
    }
}
