//! Checking a stack's bills: waiting for a tenant's charges and asserting
//! that they bill exactly the runs of a lease, to the second and the cent.

use std::time::Duration;

use serde_json::Value;

use super::Stack;
use crate::log::billed;

impl Stack {
    /// The tenant's charges of `period` (`/v1/charges`, one line per
    /// charge) once there are `lines` of them.
    pub async fn wait_invoice(&self, key: &str, period: &str, lines: usize) -> Value {
        self.invoice_when(key, period, |l| l == lines)
            .await
            .unwrap_or_else(|| panic!("the invoice for {period} never had {lines} lines"))
    }

    /// The tenant's invoice for `period` once its number of lines passes
    /// `enough` (10 s at most).
    async fn invoice_when(
        &self,
        key: &str,
        period: &str,
        enough: impl Fn(usize) -> bool,
    ) -> Option<Value> {
        for _ in 0..200 {
            let (s, body) = self
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/charges?period={period}"),
                    key,
                    None,
                )
                .await;
            assert_eq!(s, 200, "{body}");
            if body["lines"].as_array().map(Vec::len).is_some_and(&enough) {
                return Some(body);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// The tenant's invoice bills exactly the runs, `(started, billed
    /// until)`, of its one lease, each for `vram_gb` at the default 0.5 CNY
    /// per GB-hour: as many seconds as the runs have (each rounded up),
    /// nothing between them, and in all the rounded cost of those seconds
    /// to the cent, from the first run's start to the last one's end (its
    /// lines are one per UTC hour, so a line may span a gap between runs
    /// without billing it).
    pub async fn assert_runs_billed(
        &self,
        key: &str,
        vram_gb: u32,
        runs: &[(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)],
    ) {
        use chrono::SubsecRound;
        use rust_decimal::{Decimal, RoundingStrategy};
        for pair in runs.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "runs do not overlap");
        }
        let period = runs[0].0.format("%Y-%m").to_string();
        let seconds: i64 = runs
            .iter()
            .map(|(from, to)| billed(vram_gb, *from, *to).0)
            .sum();
        let amount = (Decimal::from(vram_gb) * Decimal::new(5, 1) * Decimal::from(seconds)
            / Decimal::from(3600))
        .round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero);
        let at = |v: &Value| {
            v.as_str()
                .unwrap()
                .parse::<chrono::DateTime<chrono::Utc>>()
                .unwrap()
        };
        let billed_seconds = |invoice: &Value| -> i64 {
            invoice["lines"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["billed_seconds"].as_i64().unwrap())
                .sum()
        };
        let mut invoice = self.wait_invoice_lines(key, &period).await;
        for _ in 0..200 {
            if billed_seconds(&invoice) >= seconds {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            invoice = self.wait_invoice_lines(key, &period).await;
        }
        assert_eq!(billed_seconds(&invoice), seconds, "{invoice}");
        let mut lines = invoice["lines"].as_array().unwrap().clone();
        lines.sort_by_key(|l| l["from"].as_str().unwrap().to_string());
        // The invoice keeps microseconds (PostgreSQL timestamptz).
        assert_eq!(
            at(&lines[0]["from"]),
            runs[0].0.trunc_subsecs(6),
            "{invoice}"
        );
        let last = runs[runs.len() - 1].1;
        assert_eq!(
            at(&lines[lines.len() - 1]["to"]),
            last.trunc_subsecs(6),
            "{invoice}"
        );
        let total: Decimal = lines
            .iter()
            .map(|l| l["amount"].as_str().unwrap().parse::<Decimal>().unwrap())
            .sum();
        assert_eq!(total, amount, "{invoice}");
    }

    /// The tenant's invoice for `period` once it has a line.
    async fn wait_invoice_lines(&self, key: &str, period: &str) -> Value {
        self.invoice_when(key, period, |l| l > 0)
            .await
            .unwrap_or_else(|| panic!("the invoice for {period} never had a line"))
    }
}
