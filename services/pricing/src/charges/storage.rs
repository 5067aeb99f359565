//! Tenants' object storage on the charges fold: the measurements each
//! tenant's bucket got, how far its storage is charged, and the charges
//! due from them ([`lh_domain::storage_rating`]). No I/O.
//!
//! A measurement's bytes are held until the next measurement, or until the
//! erasure deleted them; each span is charged once the measurement that
//! closes it is read. A second measurement of one interval (two gateway
//! replicas past the log's duplicate window) only cuts a span in two: the
//! charges are of time held, so none is counted twice.

use chrono::{DateTime, Utc};
use lh_bus::{Expect, MAX_BATCH_MESSAGES};
use lh_domain::storage_rating::{self, Carried, Held, StorageRatingError};
use lh_events::{
    storage_id, Actor, Envelope, EventData, StorageChargeAccrued, StorageErased, StorageMeasured,
};
use lh_service::decider::Batch;
use uuid::Uuid;

use super::fold::ChargingState;
use super::storage_facts::StorageFacts;
use crate::SERVICE;

/// Most storage charges one tenant gets in one decision pass: a month's
/// at hourly measurements.
pub const MAX_STORAGE_CHARGES_PER_PASS: usize = 31 * 24;

/// The storage charges of one tenant due now, ready to publish.
#[derive(Debug, Clone)]
pub struct StorageBill {
    pub tenant_id: Uuid,
    pub charges: Vec<StorageChargeAccrued>,
    pub cause: Envelope,
    /// Sequence of the tenant's last storage charge: the first message
    /// expects it on `lh.evt.charge.<storage id>`.
    pub after_sequence: u64,
}

/// What to do with a tenant whose storage may have charges due.
#[derive(Debug)]
pub enum StoragePlan {
    Publish(Box<StorageBill>),
    Nothing,
    WaitForBook,
    Unbillable(StorageRatingError),
}

impl ChargingState {
    fn storage_of(&mut self, tenant_id: Uuid) -> &mut StorageFacts {
        self.storage_touched.insert(tenant_id);
        self.storage.entry(tenant_id).or_default()
    }

    pub(super) fn storage_measured(&mut self, m: &StorageMeasured, envelope: &Envelope) {
        let facts = self.storage_of(m.tenant_id);
        if facts.erased {
            return;
        }
        if facts.add_point(m.measured_at, m.bytes) {
            facts.cause = Some(envelope.clone());
        }
        facts.prune();
    }

    /// The bytes last measured are held until the erasure deletes them.
    pub(super) fn storage_erased(&mut self, e: &StorageErased, envelope: &Envelope) {
        let facts = self.storage_of(e.tenant_id);
        if facts.erased {
            return;
        }
        facts.erased = true;
        let after_last = facts
            .points
            .last()
            .is_none_or(|(at, _)| *at < envelope.occurred_at);
        if after_last && facts.add_point(envelope.occurred_at, 0) {
            facts.cause = Some(envelope.clone());
        }
        facts.prune();
    }

    pub(super) fn storage_charge_read(&mut self, sequence: u64, c: &StorageChargeAccrued) {
        let facts = self.storage_of(c.tenant_id);
        if facts.charged_to.is_none_or(|to| c.to >= to) {
            facts.charged_to = Some(c.to);
            facts.carried = Some(Carried {
                period: c.period.clone(),
                priced_byte_seconds: c.priced_byte_seconds,
            });
        }
        facts.last_charge_sequence = facts.last_charge_sequence.max(sequence);
        facts.prune();
    }

    /// Tenants whose storage to look at now: those the log said something
    /// new about (nothing comes due but with a new measurement).
    pub fn storage_to_look_at(&mut self) -> Vec<Uuid> {
        std::mem::take(&mut self.storage_touched)
            .into_iter()
            .collect()
    }

    /// Looks at the tenant's storage again at the next pass.
    pub fn touch_storage(&mut self, tenant_id: Uuid) {
        if self.storage.contains_key(&tenant_id) {
            self.storage_touched.insert(tenant_id);
        }
    }

    /// The storage charges of `tenant_id` due: every span between its
    /// measurements that is not charged yet, at the books in force.
    pub fn plan_storage(&self, tenant_id: Uuid) -> StoragePlan {
        let Some(facts) = self.storage.get(&tenant_id) else {
            return StoragePlan::Nothing;
        };
        let Some(cause) = facts.cause.clone() else {
            return StoragePlan::Nothing;
        };
        let id = storage_id(tenant_id);
        let mut carried = facts.carried.clone();
        let mut charges = Vec::new();
        for span in facts.points.windows(2) {
            let ((start, bytes), (to, _)) = (span[0], span[1]);
            let from = facts.charged_to.map_or(start, |c| c.max(start));
            // An empty bucket costs nothing: no charge of 0.00 each hour.
            if from >= to || bytes == 0 {
                continue;
            }
            let held = Held { from, to, bytes };
            let pieces = match storage_rating::price_held(&self.books, held, carried.as_ref()) {
                Ok(pieces) => pieces,
                Err(StorageRatingError::NoBook) => return StoragePlan::WaitForBook,
                Err(e) => return StoragePlan::Unbillable(e),
            };
            for p in pieces {
                let Some(book) = self
                    .books
                    .iter()
                    .find(|b| b.version == p.price_book_version)
                else {
                    return StoragePlan::WaitForBook;
                };
                carried = Some(Carried {
                    period: p.period.clone(),
                    priced_byte_seconds: p.priced_byte_seconds,
                });
                charges.push(StorageChargeAccrued {
                    charge_id: storage_rating::storage_charge_id(id, p.from),
                    tenant_id,
                    storage_id: id,
                    period: p.period,
                    from: p.from,
                    to: p.to,
                    bytes: p.bytes,
                    billed_seconds: p.billed_seconds,
                    price_cny_per_gb_month: p.price_cny_per_gb_month,
                    amount: p.amount,
                    currency: book.currency.clone(),
                    price_book_version: p.price_book_version,
                    priced_byte_seconds: p.priced_byte_seconds,
                });
            }
            // The rest in the next passes, as a lease's.
            if charges.len() >= MAX_STORAGE_CHARGES_PER_PASS {
                break;
            }
        }
        if charges.is_empty() {
            return StoragePlan::Nothing;
        }
        StoragePlan::Publish(Box::new(StorageBill {
            tenant_id,
            charges,
            cause,
            after_sequence: facts.last_charge_sequence,
        }))
    }
}

/// A tenant's storage charges as decisions: atomic batches of at most
/// [`MAX_BATCH_MESSAGES`], the first message of each expecting the storage
/// charge subject to end where the fold saw its last charge (the loop
/// chains the later batches' expectations).
pub fn storage_batches(bill: &StorageBill, now: DateTime<Utc>) -> Vec<Batch> {
    let envelopes: Vec<Envelope> = bill
        .charges
        .iter()
        .map(|c| {
            Envelope::new(
                Actor::Service(SERVICE.into()),
                now,
                EventData::StorageChargeAccrued(c.clone()),
            )
            .caused_by(&bill.cause)
            .with_id(c.charge_id)
        })
        .collect();
    envelopes
        .chunks(MAX_BATCH_MESSAGES)
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let expect = if i == 0 {
                        Expect::LastSubjectSequence(bill.after_sequence)
                    } else {
                        Expect::Any
                    };
                    (e.clone(), expect)
                })
                .collect()
        })
        .collect()
}
