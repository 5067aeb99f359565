//! Tencent Cloud CVM spot prices, from a recorded price history answer
//! (`SPOTPAID`, CNY per instance-hour).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Deserialize;

use super::{region_by_suffix, Offer, Recording, SpotProvider};

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
        let samples = answer
            .response
            .price_history_set
            .into_iter()
            .filter_map(|p| {
                let (_, model, gpus) = INSTANCE_TYPES
                    .iter()
                    .find(|(t, _, _)| *t == p.instance_type)?;
                Some((
                    region_by_suffix(&p.zone, false),
                    p.zone,
                    p.instance_type,
                    *model,
                    *gpus,
                    p.timestamp,
                    p.unit_price,
                ))
            })
            .collect();
        Ok(Self {
            recording: Recording::new(samples).map_err(|e| format!("tencent: {e}"))?,
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
