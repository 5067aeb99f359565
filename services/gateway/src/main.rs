#[tokio::main]
async fn main() -> anyhow::Result<()> {
    lh_service::projection_main::<lh_gateway::Config>().await
}
