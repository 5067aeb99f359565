#[tokio::main]
async fn main() -> std::process::ExitCode {
    lh_service::service_main::<lh_node_agent::Config>().await
}
