use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `lh-audit init-keys DIR`: the deployment's init step, not the service.
    if std::env::args_os().nth(1).is_some_and(|a| a == "init-keys") {
        return lh_audit::keys::InitKeys::parse_from(std::env::args_os().skip(1)).run();
    }
    let config = lh_audit::Config::parse();
    lh_service::init_process("lh-audit");
    lh_audit::start(config, lh_service::shutdown_on_signal())
        .await?
        .wait()
        .await
}
