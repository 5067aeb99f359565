use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = lh_scheduler::Config::parse();
    lh_service::init_process("lh-scheduler");
    lh_scheduler::start(config, lh_service::shutdown_on_signal())
        .await?
        .wait()
        .await
}
