use clap::Parser;

#[tokio::main]
async fn main() {
    let config = lh_node_agent::Config::parse();
    lh_service::init_process("lh-node-agent");
    let run = async {
        lh_node_agent::start(config, lh_service::shutdown_on_signal())
            .await?
            .wait()
            .await
    };
    if let Err(e) = run.await {
        // One line an operator can act on (NVML missing, a bad fleet file).
        eprintln!("lh-node-agent: {e:#}");
        std::process::exit(1);
    }
}
