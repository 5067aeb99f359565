//! Alibaba Cloud ECS spot prices, from a recorded `DescribeSpotPriceHistory`
//! answer (CNY per instance-hour).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Deserialize;

use super::{recording_of, Offer, Quoted, Recording, SpotProvider};

/// GPU instance types this adapter knows: `(type, model, GPUs)`.
const INSTANCE_TYPES: &[(&str, &str, u32)] = &[
    ("ecs.gn7-c12g1.3xlarge", "A100-40GB", 1),
    ("ecs.gn7-c13g1.13xlarge", "A100-40GB", 4),
];

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Answer {
    spot_prices: Prices,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Prices {
    spot_price_type: Vec<Price>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Price {
    zone_id: String,
    instance_type: String,
    spot_price: Decimal,
    timestamp: DateTime<Utc>,
}

pub struct Aliyun {
    recording: Recording,
}

impl Aliyun {
    pub fn from_recording(json: &str) -> Result<Self, String> {
        let answer: Answer = serde_json::from_str(json).map_err(|e| format!("aliyun: {e}"))?;
        let quotes = answer
            .spot_prices
            .spot_price_type
            .into_iter()
            .map(|p| Quoted {
                zone: p.zone_id,
                instance_type: p.instance_type,
                at: p.timestamp,
                price_cny_per_instance_hour: p.spot_price,
            });
        Ok(Self {
            recording: recording_of("aliyun", quotes, INSTANCE_TYPES, false)?,
        })
    }
}

impl SpotProvider for Aliyun {
    fn name(&self) -> &'static str {
        "aliyun"
    }

    fn offers(&self, at: DateTime<Utc>) -> Vec<Offer> {
        self.recording.offers(self.name(), at)
    }
}
