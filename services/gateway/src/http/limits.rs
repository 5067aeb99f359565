//! What one tenant may do in a while: a budget of writes per second (a token
//! bucket per tenant, kept by each gateway replica) and a bound on its
//! leases waiting for a placement (checked by the lease rules). Writes are
//! what a tenant can fill the log with; reads are not limited here.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

/// Most tenants whose buckets a replica keeps; past it full buckets (those
/// of tenants quiet for a while) are forgotten first.
const MAX_TRACKED_TENANTS: usize = 100_000;

/// The knobs, from flags or the environment.
#[derive(clap::Args, Debug, Clone, Copy, PartialEq)]
pub struct TenantLimits {
    /// Writes (POST and other non-GET calls) a tenant may make per second,
    /// sustained, on each gateway replica.
    #[arg(long, env = "LH_TENANT_WRITES_PER_S", default_value_t = 50.0)]
    pub writes_per_s: f64,
    /// Writes a tenant may make in one burst above that rate.
    #[arg(long, env = "LH_TENANT_WRITE_BURST", default_value_t = 200)]
    pub write_burst: u32,
    /// Leases a tenant may have waiting for a placement (requested or
    /// queued) at once.
    #[arg(long, env = "LH_TENANT_MAX_PENDING_LEASES", default_value_t = 1_000)]
    pub max_pending_leases: u32,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self {
            writes_per_s: 50.0,
            write_burst: 200,
            max_pending_leases: 1_000,
        }
    }
}

/// A token bucket: `burst` tokens at most, refilled at `per_s`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets per key (a tenant, a credential, a client address) on this
/// replica: `burst` spends at most, refilled at `per_s`.
#[derive(Debug)]
pub struct Budgets<K> {
    per_s: f64,
    burst: f64,
    max_tracked: usize,
    buckets: Mutex<HashMap<K, Bucket>>,
}

/// Every tenant's write budget on this replica.
pub type WriteBudgets = Budgets<Uuid>;

impl Budgets<Uuid> {
    pub fn new(limits: &TenantLimits) -> Self {
        Self::with_rate(limits.writes_per_s, limits.write_burst, MAX_TRACKED_TENANTS)
    }
}

impl<K: std::hash::Hash + Eq + Clone> Budgets<K> {
    /// Buckets of `burst` refilled at `per_s`, for at most `max_tracked`
    /// keys at once (past it full buckets, those of keys quiet for a while,
    /// are forgotten first).
    pub fn with_rate(per_s: f64, burst: u32, max_tracked: usize) -> Self {
        Self {
            // A rate of 0 (or less) would never refill: one spend an hour
            // is the least there is.
            per_s: per_s.max(1.0 / 3600.0),
            burst: f64::from(burst.max(1)),
            max_tracked,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `key` has a token at `now`, spending none; how long until it
    /// has one if not.
    pub fn check(&self, key: &K, now: Instant) -> Result<(), Duration> {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(bucket) = buckets.get(key) else {
            return Ok(());
        };
        let tokens = refill(bucket, now, self.per_s, self.burst);
        if tokens >= 1.0 {
            Ok(())
        } else {
            Err(Duration::try_from_secs_f64((1.0 - tokens) / self.per_s).unwrap_or(Duration::MAX))
        }
    }

    /// Spends one token of `key` at `now`, or says how long until one is
    /// available.
    pub fn spend(&self, key: K, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= self.max_tracked && !buckets.contains_key(&key) {
            let (per_s, burst) = (self.per_s, self.burst);
            buckets.retain(|_, b| refill(b, now, per_s, burst) < burst);
            if buckets.len() >= self.max_tracked {
                // Every tracked key is busy: a new one waits its turn
                // rather than growing the map without bound.
                return Err(Duration::from_secs(1));
            }
        }
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let tokens = refill(bucket, now, self.per_s, self.burst);
        if tokens >= 1.0 {
            *bucket = Bucket {
                tokens: tokens - 1.0,
                at: now,
            };
            Ok(())
        } else {
            Err(Duration::try_from_secs_f64((1.0 - tokens) / self.per_s).unwrap_or(Duration::MAX))
        }
    }
}

/// The tokens `bucket` holds at `now`.
fn refill(bucket: &Bucket, now: Instant, per_s: f64, burst: f64) -> f64 {
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    (bucket.tokens + elapsed * per_s).min(burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets(per_s: f64, burst: u32) -> WriteBudgets {
        WriteBudgets::new(&TenantLimits {
            writes_per_s: per_s,
            write_burst: burst,
            max_pending_leases: 1,
        })
    }

    #[test]
    fn a_burst_is_spent_then_the_rate_refills_it() {
        let b = budgets(10.0, 3);
        let (t, now) = (Uuid::from_u128(1), Instant::now());
        for _ in 0..3 {
            b.spend(t, now).unwrap();
        }
        let wait = b.spend(t, now).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100));
        // Another tenant has its own budget.
        b.spend(Uuid::from_u128(2), now).unwrap();
        let later = now + Duration::from_millis(100);
        b.spend(t, later).unwrap();
        assert!(b.spend(t, later).is_err());
        // A long quiet spell refills no more than the burst.
        let much_later = now + Duration::from_secs(3600);
        for _ in 0..3 {
            b.spend(t, much_later).unwrap();
        }
        assert!(b.spend(t, much_later).is_err());
    }
}
