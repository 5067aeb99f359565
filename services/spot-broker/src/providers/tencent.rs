//! Tencent Cloud CVM spot prices, from a recorded price history answer
//! (`SPOTPAID`, CNY per instance-hour).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Deserialize;

use super::{recording_of, Offer, Quoted, Recording, SpotProvider};

/// GPU instance types this adapter knows: `(type, model, GPUs)`.
const INSTANCE_TYPES: &[(&str, &str, u32)] = &[
    ("GT4.4XLARGE96", "A100-40GB", 1),
    ("GT4.41XLARGE948", "A100-40GB", 8),
];

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Answer {
    response: History,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct History {
    price_history_set: Vec<Price>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Price {
    zone: String,
    instance_type: String,
    unit_price: Decimal,
    timestamp: DateTime<Utc>,
}

pub struct Tencent {
    recording: Recording,
}

impl Tencent {
    pub fn from_recording(json: &str) -> Result<Self, String> {
        let answer: Answer = serde_json::from_str(json).map_err(|e| format!("tencent: {e}"))?;
        let quotes = answer
            .response
            .price_history_set
            .into_iter()
            .map(|p| Quoted {
                zone: p.zone,
                instance_type: p.instance_type,
                at: p.timestamp,
                price_cny_per_instance_hour: p.unit_price,
            });
        Ok(Self {
            recording: recording_of("tencent", quotes, INSTANCE_TYPES, false)?,
        })
    }
}

impl SpotProvider for Tencent {
    fn name(&self) -> &'static str {
        "tencent"
    }

    fn offers(&self, at: DateTime<Utc>) -> Vec<Offer> {
        self.recording.offers(self.name(), at)
    }
}
