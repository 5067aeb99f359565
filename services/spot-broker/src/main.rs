#[tokio::main]
async fn main() -> std::process::ExitCode {
    lh_service::service_main::<lh_spot_broker::Config>().await
}
