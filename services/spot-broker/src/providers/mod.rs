//! External spot capacity: one [`SpotProvider`] per cloud, each replaying a
//! recorded price history shipped with the broker (`recordings/`), and the
//! pure choice of the cheapest offer that satisfies a request.
//!
//! An adapter reads its cloud's own response shape and turns every
//! instance type it knows into offers per GPU, in CNY per GPU-hour, so
//! offers of different clouds compare directly. A recording covers a span
//! of time; it is replayed cyclically over that span, so prices keep moving
//! as they did when recorded.

mod aliyun;
mod aws;
mod tencent;

use chrono::{DateTime, Utc};
use lh_events::CapacityCandidate;
use rust_decimal::Decimal;

pub use aliyun::Aliyun;
pub use aws::Aws;
pub use tencent::Tencent;

/// Most price samples one recording may hold.
pub const MAX_SAMPLES_PER_RECORDING: usize = 10_000;
/// Most candidates one choice records (the cheapest first).
pub const MAX_CANDIDATES: usize = 32;
/// The providers the broker knows, by the name `--spot-providers` takes.
pub const KNOWN: [&str; 3] = ["aws", "aliyun", "tencent"];

/// One cloud's spot market.
pub trait SpotProvider: Send + Sync {
    /// Its name on the log (`aws`, `aliyun`, `tencent`).
    fn name(&self) -> &'static str;
    /// What it offers at `at`: one offer per (zone, instance type).
    fn offers(&self, at: DateTime<Utc>) -> Vec<Offer>;
}

/// Spot capacity a cloud offers now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub provider: &'static str,
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub gpu_model: String,
    pub gpus_per_instance: u32,
    pub price_cny_per_gpu_hour: Decimal,
}

/// The provider of `name` on its recording shipped with the broker.
pub fn recorded(name: &str) -> Result<Box<dyn SpotProvider>, String> {
    let provider: Box<dyn SpotProvider> = match name {
        "aws" => Box::new(Aws::from_recording(include_str!(
            "../../recordings/aws.json"
        ))?),
        "aliyun" => Box::new(Aliyun::from_recording(include_str!(
            "../../recordings/aliyun.json"
        ))?),
        "tencent" => Box::new(Tencent::from_recording(include_str!(
            "../../recordings/tencent.json"
        ))?),
        other => {
            return Err(format!(
                "no spot provider {other:?}; known: {}",
                KNOWN.join(", ")
            ))
        }
    };
    Ok(provider)
}

/// What a request asks of external capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand<'a> {
    pub gpu_model: &'a str,
    pub gpus: u32,
    pub zones: &'a [String],
    pub regions: &'a [String],
    pub max_price_cny_per_gpu_hour: Option<Decimal>,
}

/// Every offer considered, cheapest first, each passed over saying why,
/// and the index of the one chosen (the cheapest that satisfies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub candidates: Vec<CapacityCandidate>,
    pub chosen: Option<usize>,
}

/// The cheapest offer of `offers` that satisfies `demand`: its model, all
/// its GPUs on one instance, its zone and region constraints, its bid.
/// Ties go to the provider, then zone, name first, so the choice is the
/// same on every broker.
pub fn choose(offers: &[Offer], demand: &Demand) -> Choice {
    let mut of_model: Vec<&Offer> = offers
        .iter()
        .filter(|o| o.gpu_model == demand.gpu_model)
        .collect();
    of_model.sort_by(|a, b| {
        (
            a.price_cny_per_gpu_hour,
            a.provider,
            &a.zone,
            &a.instance_type,
        )
            .cmp(&(
                b.price_cny_per_gpu_hour,
                b.provider,
                &b.zone,
                &b.instance_type,
            ))
    });
    let mut candidates = Vec::new();
    let mut chosen = None;
    for offer in of_model.into_iter().take(MAX_CANDIDATES) {
        let rejected = why_not(offer, demand);
        if rejected.is_none() && chosen.is_none() {
            chosen = Some(candidates.len());
        }
        candidates.push(CapacityCandidate {
            provider: offer.provider.to_string(),
            region: offer.region.clone(),
            zone: offer.zone.clone(),
            instance_type: offer.instance_type.clone(),
            gpus_per_instance: offer.gpus_per_instance,
            price_cny_per_gpu_hour: offer.price_cny_per_gpu_hour,
            rejected,
        });
    }
    Choice { candidates, chosen }
}

fn why_not(offer: &Offer, demand: &Demand) -> Option<String> {
    if offer.gpus_per_instance < demand.gpus {
        return Some(format!(
            "{} GPUs per instance, {} asked",
            offer.gpus_per_instance, demand.gpus
        ));
    }
    if !demand.zones.is_empty() && !demand.zones.contains(&offer.zone) {
        return Some("zone not allowed".into());
    }
    if !demand.regions.is_empty() && !demand.regions.contains(&offer.region) {
        return Some("region not allowed".into());
    }
    match demand.max_price_cny_per_gpu_hour {
        Some(bid) if offer.price_cny_per_gpu_hour > bid => {
            Some(format!("above the bid of {bid} CNY per GPU-hour"))
        }
        _ => None,
    }
}

/// One instance type in one zone, as recorded: `(when, CNY per instance-hour)`
/// in time order.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub gpu_model: &'static str,
    pub gpus_per_instance: u32,
    pub samples: Vec<(DateTime<Utc>, Decimal)>,
}

/// A price as a cloud's answer states it, before the adapter knows its type.
pub(crate) struct Quoted {
    pub zone: String,
    pub instance_type: String,
    pub at: DateTime<Utc>,
    pub price_cny_per_instance_hour: Decimal,
}

/// The recording of `quotes` of the instance types in `known` (`(type,
/// model, GPUs)`; others are skipped), each zone's region named by the
/// cloud's rule (see [`region_by_suffix`]).
pub(crate) fn recording_of(
    provider: &str,
    quotes: impl IntoIterator<Item = Quoted>,
    known: &[(&str, &'static str, u32)],
    letter_suffix: bool,
) -> Result<Recording, String> {
    let samples = quotes
        .into_iter()
        .filter_map(|q| {
            let (_, model, gpus) = known.iter().find(|(t, _, _)| *t == q.instance_type)?;
            Some(Sample {
                region: region_by_suffix(&q.zone, letter_suffix),
                zone: q.zone,
                instance_type: q.instance_type,
                gpu_model: model,
                gpus_per_instance: *gpus,
                at: q.at,
                price_cny_per_instance_hour: q.price_cny_per_instance_hour,
            })
        })
        .collect();
    Recording::new(samples).map_err(|e| format!("{provider}: {e}"))
}

/// One recorded price of one instance type in one zone.
pub(crate) struct Sample {
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub gpu_model: &'static str,
    pub gpus_per_instance: u32,
    pub at: DateTime<Utc>,
    pub price_cny_per_instance_hour: Decimal,
}

/// A recording: its series and the span it covers, replayed cyclically.
#[derive(Debug, Clone, Default)]
pub(crate) struct Recording {
    series: Vec<Series>,
    first: Option<DateTime<Utc>>,
    /// From the first sample to the last, plus one step: the cycle.
    span: chrono::Duration,
}

impl Recording {
    /// Groups samples into series; at most [`MAX_SAMPLES_PER_RECORDING`].
    pub fn new(samples: Vec<Sample>) -> Result<Self, String> {
        if samples.len() > MAX_SAMPLES_PER_RECORDING {
            return Err(format!(
                "a recording holds at most {MAX_SAMPLES_PER_RECORDING} samples"
            ));
        }
        let mut series: Vec<Series> = Vec::new();
        for sample in samples {
            let Sample {
                region,
                zone,
                instance_type,
                gpu_model,
                gpus_per_instance,
                at,
                price_cny_per_instance_hour: price,
            } = sample;
            if price <= Decimal::ZERO || gpus_per_instance == 0 {
                return Err(format!(
                    "{zone} {instance_type}: a price or GPU count of zero"
                ));
            }
            let found = series
                .iter_mut()
                .find(|s| s.zone == zone && s.instance_type == instance_type);
            match found {
                Some(s) => s.samples.push((at, price)),
                None => series.push(Series {
                    region,
                    zone,
                    instance_type,
                    gpu_model,
                    gpus_per_instance,
                    samples: vec![(at, price)],
                }),
            }
        }
        series.iter_mut().for_each(|s| s.samples.sort());
        let times = series
            .iter()
            .flat_map(|s| s.samples.iter().map(|(t, _)| *t));
        let (first, last) = (times.clone().min(), times.max());
        let step = series
            .iter()
            .filter_map(|s| s.samples.windows(2).map(|w| w[1].0 - w[0].0).min())
            .min()
            .unwrap_or_else(|| chrono::Duration::hours(1));
        let span = match (first, last) {
            (Some(f), Some(l)) => l - f + step,
            _ => chrono::Duration::hours(1),
        };
        Ok(Self {
            series,
            first,
            span,
        })
    }

    /// Offers at `at`: each series at the sample in force at the same
    /// point of the recording's cycle.
    pub fn offers(&self, provider: &'static str, at: DateTime<Utc>) -> Vec<Offer> {
        let Some(first) = self.first else {
            return Vec::new();
        };
        let span_ms = self.span.num_milliseconds().max(1);
        let offset = (at - first).num_milliseconds().rem_euclid(span_ms);
        let replayed = first + chrono::Duration::milliseconds(offset);
        self.series
            .iter()
            .filter_map(|s| {
                let (_, price) = s
                    .samples
                    .iter()
                    .rev()
                    .find(|(t, _)| *t <= replayed)
                    .or(s.samples.first())?;
                Some(Offer {
                    provider,
                    region: s.region.clone(),
                    zone: s.zone.clone(),
                    instance_type: s.instance_type.clone(),
                    gpu_model: s.gpu_model.to_string(),
                    gpus_per_instance: s.gpus_per_instance,
                    price_cny_per_gpu_hour: (*price / Decimal::from(s.gpus_per_instance))
                        .round_dp(4)
                        .normalize(),
                })
            })
            .collect()
    }
}

/// A zone's region by the cloud's naming: the zone without its last
/// letter (`ap-northeast-1a`), or without its last `-` part
/// (`cn-hangzhou-i`, `ap-guangzhou-6`).
pub(crate) fn region_by_suffix(zone: &str, letter_suffix: bool) -> String {
    if letter_suffix {
        let trimmed = zone.trim_end_matches(|c: char| c.is_ascii_lowercase());
        if trimmed.len() < zone.len() {
            return trimmed.to_string();
        }
    }
    zone.rsplit_once('-')
        .map_or(zone, |(region, _)| region)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    fn offer(provider: &'static str, zone: &str, region: &str, gpus: u32, price: &str) -> Offer {
        Offer {
            provider,
            region: region.into(),
            zone: zone.into(),
            instance_type: "x".into(),
            gpu_model: "A100-40GB".into(),
            gpus_per_instance: gpus,
            price_cny_per_gpu_hour: d(price),
        }
    }

    fn demand<'a>(zones: &'a [String], regions: &'a [String], bid: Option<&str>) -> Demand<'a> {
        Demand {
            gpu_model: "A100-40GB",
            gpus: 2,
            zones,
            regions,
            max_price_cny_per_gpu_hour: bid.map(d),
        }
    }

    #[test]
    fn the_cheapest_offer_that_satisfies_is_chosen_and_the_others_say_why_not() {
        let offers = [
            offer("aws", "ap-northeast-1a", "ap-northeast-1", 8, "11.6"),
            offer("tencent", "ap-guangzhou-6", "ap-guangzhou", 1, "8.9"),
            offer("aliyun", "cn-hangzhou-i", "cn-hangzhou", 4, "9.6"),
            Offer {
                gpu_model: "H100-80GB".into(),
                ..offer("aws", "z", "r", 8, "1")
            },
        ];
        let choice = choose(&offers, &demand(&[], &[], None));
        assert_eq!(choice.candidates.len(), 3, "another model is no candidate");
        assert_eq!(choice.chosen, Some(1));
        let chosen = &choice.candidates[1];
        assert_eq!(
            (chosen.provider.as_str(), chosen.zone.as_str()),
            ("aliyun", "cn-hangzhou-i")
        );
        assert_eq!(
            choice.candidates[0].rejected.as_deref(),
            Some("1 GPUs per instance, 2 asked")
        );
        // Constraints and the bid narrow it.
        let regions = ["ap-northeast-1".to_string()];
        let choice = choose(&offers, &demand(&[], &regions, None));
        assert_eq!(choice.candidates[choice.chosen.unwrap()].provider, "aws");
        assert_eq!(
            choice.candidates[1].rejected.as_deref(),
            Some("region not allowed")
        );
        let choice = choose(&offers, &demand(&[], &regions, Some("10")));
        assert_eq!(choice.chosen, None);
        assert_eq!(
            choice.candidates[2].rejected.as_deref(),
            Some("above the bid of 10 CNY per GPU-hour")
        );
        let zones = ["cn-hangzhou-i".to_string()];
        let choice = choose(&offers, &demand(&zones, &[], Some("9.6")));
        assert_eq!(
            choice.candidates[choice.chosen.unwrap()].zone,
            "cn-hangzhou-i"
        );
    }

    #[test]
    fn every_recording_shipped_parses_into_offers_of_catalogue_models() {
        for name in KNOWN {
            let provider = recorded(name).unwrap();
            assert_eq!(provider.name(), name);
            let offers = provider.offers(at("2026-12-04T03:00:00Z"));
            assert!(!offers.is_empty(), "{name}");
            for o in &offers {
                assert!(
                    lh_domain::catalog::check(&o.gpu_model, &lh_events::GpuAsk::Whole(1)).is_ok(),
                    "{name}: {o:?}"
                );
                assert!(o.price_cny_per_gpu_hour > Decimal::ZERO, "{o:?}");
                assert!(o.region.len() < o.zone.len(), "{o:?}");
            }
        }
        assert!(recorded("gcp").is_err());
    }

    #[test]
    fn a_recording_is_replayed_cyclically_over_its_span() {
        let provider = recorded("tencent").unwrap();
        let price = |t: &str| {
            provider
                .offers(at(t))
                .into_iter()
                .find(|o| o.zone == "ap-guangzhou-6")
                .unwrap()
                .price_cny_per_gpu_hour
        };
        // Recorded 2026-11-30 at 00, 06, 12 and 18 h: a 24-hour cycle.
        assert_eq!(price("2026-11-30T00:00:00Z"), d("8.9"));
        assert_eq!(price("2026-11-30T07:00:00Z"), d("9.4"));
        assert_eq!(price("2026-12-04T13:00:00Z"), d("10.1"));
        assert_eq!(price("2026-12-04T23:59:59Z"), d("9.2"));
        assert_eq!(
            price("2020-01-01T00:00:00Z"),
            d("8.9"),
            "before the recording too"
        );
    }

    #[test]
    fn regions_follow_each_clouds_naming() {
        assert_eq!(region_by_suffix("ap-northeast-1a", true), "ap-northeast-1");
        assert_eq!(region_by_suffix("cn-hangzhou-i", false), "cn-hangzhou");
        assert_eq!(region_by_suffix("ap-guangzhou-6", false), "ap-guangzhou");
    }
}
