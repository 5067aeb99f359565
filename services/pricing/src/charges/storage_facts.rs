//! What the log says about one tenant's storage, as far as billing cares:
//! its measurements not yet charged and where its charges stand. The
//! charging state holds one per tenant; `storage.rs` folds events into it
//! and decides the charges.

use chrono::{DateTime, Utc};
use lh_domain::storage_rating::Carried;
use lh_events::Envelope;

/// What the log says about one tenant's storage, as far as billing cares.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct StorageFacts {
    /// Measurements by time, from the last one at or before `charged_to`:
    /// the bytes of each are held until the next.
    pub(super) points: Vec<(DateTime<Utc>, u64)>,
    /// The `to` of the tenant's last storage charge.
    pub(super) charged_to: Option<DateTime<Utc>>,
    /// Where the last charge left the period's cost.
    pub(super) carried: Option<Carried>,
    /// Stream sequence of the tenant's last storage charge (0: none yet).
    pub(super) last_charge_sequence: u64,
    /// The bucket is gone: no measurement after the erasure counts.
    pub(super) erased: bool,
    /// The event the next charges are caused by: the newest measurement
    /// (or the erasure).
    pub(super) cause: Option<Envelope>,
}

impl StorageFacts {
    /// Adds a point unless the charges are past it or one is there already.
    pub(super) fn add_point(&mut self, at: DateTime<Utc>, bytes: u64) -> bool {
        if self.charged_to.is_some_and(|to| at <= to) {
            return false;
        }
        match self.points.binary_search_by_key(&at, |(t, _)| *t) {
            Ok(_) => false,
            Err(i) => {
                self.points.insert(i, (at, bytes));
                true
            }
        }
    }

    /// Drops the points whose span is charged or held nothing.
    pub(super) fn prune(&mut self) {
        let charged_to = self.charged_to.unwrap_or(DateTime::<Utc>::MIN_UTC);
        while self.points.len() >= 2 && (self.points[1].0 <= charged_to || self.points[0].1 == 0) {
            self.points.remove(0);
        }
        if self.erased && self.points.len() <= 1 {
            self.points.clear();
        }
    }
}
