//! Reading what the services wrote to the log, and what a lease's charge
//! must be by the node-agent's own timestamps: the tests judge the platform
//! by its log, not by what the services say about themselves.

use std::time::Duration;

use lh_bus::{Bus, FeedItem, Stored};
use lh_events::subject;

/// Every event in the log that the services obey, in order: messages that
/// do not decode, and events their publishers had no authority to write
/// (`lh_domain::authority`), left out. A read the server fails (an outage,
/// a leader moving) is tried again as the services' own reads are, for up
/// to [`LOG_READ_PATIENCE`]: a harness that reads while it breaks things
/// must outlast them.
pub async fn read_log(bus: &Bus) -> Vec<Stored> {
    let deadline = tokio::time::Instant::now() + LOG_READ_PATIENCE;
    let mut wait = Duration::from_millis(100);
    loop {
        match try_read_log(bus).await {
            Ok(log) => return log,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("reading the log failed ({e}); trying again in {wait:?}");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            Err(e) => panic!("the log could not be read for {LOG_READ_PATIENCE:?}: {e}"),
        }
    }
}

/// Longest [`read_log`] keeps trying.
pub const LOG_READ_PATIENCE: Duration = Duration::from_secs(60);

async fn try_read_log(bus: &Bus) -> Result<Vec<Stored>, lh_bus::BusError> {
    let head = bus.last_sequence().await?;
    let mut out = Vec::new();
    let mut authority = lh_domain::authority::Authority::default();
    if head == 0 {
        return Ok(out);
    }
    let mut feed = bus.reread(&[subject::EVENTS_ALL], 1).await?;
    let mut last = 0;
    while let Some(item) = feed.next_item_within(Duration::from_secs(5)).await {
        let item = item?;
        last = item.sequence();
        if let FeedItem::Event(mut event) = item {
            if let Ok(taken) = authority.admit(&event.envelope) {
                event.envelope = taken.into_owned();
                out.push(event);
            }
        }
        if last >= head {
            break;
        }
    }
    if last < head {
        return Err(lh_bus::BusError::JetStream(format!(
            "the read stopped at sequence {last} of {head}"
        )));
    }
    Ok(out)
}

/// `(node, started_at)` of every `lease.started`, in log order.
pub fn starts(log: &[Stored]) -> Vec<(String, chrono::DateTime<chrono::Utc>)> {
    log.iter()
        .filter_map(|e| match &e.envelope.data {
            lh_events::EventData::LeaseStarted(s) => Some((s.node_id.clone(), s.started_at)),
            _ => None,
        })
        .collect()
}

pub fn of_type<'a>(log: &'a [Stored], event_type: &str) -> Vec<&'a Stored> {
    log.iter()
        .filter(|e| e.envelope.event_type == event_type)
        .collect()
}

/// What the invoice line of lease `id` must say when it held `vram_gb`:
/// `(billed seconds, amount, started_at)` from the node-agent's own
/// timestamps, at the default price of 0.5 CNY per GB-hour, seconds rounded
/// up and the amount to the cent (half away from zero).
pub fn expected_charge(
    log: &[Stored],
    id: &str,
    vram_gb: u32,
) -> (i64, rust_decimal::Decimal, chrono::DateTime<chrono::Utc>) {
    use lh_events::EventData;
    let start = of_type(log, "lease.started")
        .into_iter()
        .find_map(|e| match &e.envelope.data {
            EventData::LeaseStarted(s) if s.lease_id.to_string() == id => Some(s.started_at),
            _ => None,
        })
        .expect("the lease started");
    let end = of_type(log, "lease.ended")
        .into_iter()
        .find_map(|e| match &e.envelope.data {
            EventData::LeaseEnded(s) if s.lease_id.to_string() == id => Some(s.ended_at),
            _ => None,
        })
        .expect("the lease ended");
    let (seconds, amount) = billed(vram_gb, start, end);
    (seconds, amount, start)
}

/// `(billed seconds, amount)` of holding `vram_gb` from `from` to `to` at
/// the default price of 0.5 CNY per GB-hour: seconds rounded up, the amount
/// to the cent (half away from zero).
pub(crate) fn billed(
    vram_gb: u32,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> (i64, rust_decimal::Decimal) {
    use rust_decimal::{Decimal, RoundingStrategy};
    let micros = (to - from).num_microseconds().unwrap();
    let seconds = (micros + 999_999) / 1_000_000;
    let amount = (Decimal::from(vram_gb) * Decimal::new(5, 1) * Decimal::from(seconds)
        / Decimal::from(3600))
    .round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero);
    (seconds, amount)
}
