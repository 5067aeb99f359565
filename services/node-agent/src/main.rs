use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = lh_node_agent::Config::parse();
    lh_service::init_process("lh-node-agent");
    lh_node_agent::start(config, lh_service::shutdown_on_signal())
        .await?
        .wait()
        .await
}
