use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = lh_audit::Config::parse();
    lh_service::init_process("lh-audit");
    lh_audit::start(config, lh_service::shutdown_on_signal())
        .await?
        .wait()
        .await
}
