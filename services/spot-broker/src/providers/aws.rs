//! AWS EC2 spot prices, from a recorded `DescribeSpotPriceHistory` answer
//! (USD per instance-hour, converted to CNY at the rate the recording
//! names).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Deserialize;

use super::{recording_of, Offer, Quoted, Recording, SpotProvider};

/// GPU instance types this adapter knows: `(type, model, GPUs)`.
const INSTANCE_TYPES: &[(&str, &str, u32)] = &[
    ("p4d.24xlarge", "A100-40GB", 8),
    ("p5.48xlarge", "H100-80GB", 8),
    ("g5.xlarge", "A10G-24GB", 1),
    ("g5.12xlarge", "A10G-24GB", 4),
    ("g6.xlarge", "L4-24GB", 1),
];

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Answer {
    usd_cny: Decimal,
    spot_price_history: Vec<Price>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Price {
    availability_zone: String,
    instance_type: String,
    spot_price: Decimal,
    timestamp: DateTime<Utc>,
}

pub struct Aws {
    recording: Recording,
}

impl Aws {
    pub fn from_recording(json: &str) -> Result<Self, String> {
        let answer: Answer = serde_json::from_str(json).map_err(|e| format!("aws: {e}"))?;
        if answer.usd_cny <= Decimal::ZERO {
            return Err("aws: UsdCny must be above zero".into());
        }
        let quotes = answer.spot_price_history.into_iter().map(|p| Quoted {
            zone: p.availability_zone,
            instance_type: p.instance_type,
            at: p.timestamp,
            price_cny_per_instance_hour: p.spot_price * answer.usd_cny,
        });
        Ok(Self {
            recording: recording_of("aws", quotes, INSTANCE_TYPES, true)?,
        })
    }
}

impl SpotProvider for Aws {
    fn name(&self) -> &'static str {
        "aws"
    }

    fn offers(&self, at: DateTime<Utc>) -> Vec<Offer> {
        self.recording.offers(self.name(), at)
    }
}
