#[tokio::main]
async fn main() -> std::process::ExitCode {
    lh_service::projection_main::<lh_pricing::Config>().await
}
