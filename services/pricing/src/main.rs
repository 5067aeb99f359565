#[tokio::main]
async fn main() -> anyhow::Result<()> {
    lh_service::projection_main::<lh_pricing::Config>().await
}
