#[tokio::main]
async fn main() -> std::process::ExitCode {
    lh_service::projection_main::<lh_gateway::Config>().await
}
