//! A stack's read models against a replay of its log: the gateway's and
//! pricing's tables must come out identical.

use std::time::Duration;

use super::Stack;

impl Stack {
    /// The gateway's tables are what a replay of the log gives.
    pub async fn assert_gateway_rebuilds_identically(&self) {
        let report =
            lh_gateway::rebuild(&self.gateway_config(), "gateway_rebuild", false, |_, _| {})
                .await
                .unwrap();
        for c in report.tables {
            assert_eq!(c.live, c.rebuilt, "table {} differs in a rebuild", c.table);
        }
    }

    /// How many tables of the gateway's and pricing's projections differ
    /// from a replay of the log (once both have reached its head).
    pub async fn rebuild_differences(&self) -> usize {
        let head = self.bus().await.last_sequence().await.unwrap_or(0);
        let pool = sqlx::PgPool::connect(&self.database_url)
            .await
            .expect("the database answers");
        // A projection reads only its own subjects, so it may stop short of
        // the head: it has caught up once its offset holds still.
        let offsets = "SELECT coalesce(sum(sequence), 0)::BIGINT FROM (
            SELECT sequence FROM gateway.projection_offsets WHERE name = 'gateway'
            UNION ALL SELECT sequence FROM pricing.projection_offsets) o";
        let mut last = -1i64;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now: i64 = sqlx::query_scalar(offsets)
                .fetch_one(&pool)
                .await
                .unwrap_or(-2);
            if now == last && head > 0 {
                break;
            }
            last = now;
        }
        pool.close().await;
        let gateway =
            lh_gateway::rebuild(&self.gateway_config(), "gateway_rebuild", false, |_, _| {})
                .await
                .expect("the gateway's projection rebuilds");
        let pricing = lh_pricing::rebuild(
            &lh_pricing::Config::for_test(&self.nats.url(), &self.database_url),
            "pricing_rebuild",
            false,
            |_, _| {},
        )
        .await
        .expect("pricing's projection rebuilds");
        let differing: Vec<_> = gateway
            .tables
            .iter()
            .chain(&pricing.tables)
            .filter(|c| c.live != c.rebuilt)
            .collect();
        // What differs, so that a failure under load says where.
        for c in &differing {
            println!(
                "rebuild differs: {} live {:?} rebuilt {:?}",
                c.table, c.live, c.rebuilt
            );
        }
        differing.len()
    }
}
