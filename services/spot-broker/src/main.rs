use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = lh_spot_broker::Config::parse();
    lh_service::init_process("lh-spot-broker");
    lh_spot_broker::start(config, lh_service::shutdown_on_signal())
        .await?
        .wait()
        .await
}
