//! What a tenant's new lease request is checked against before it is
//! appended (an exhausted prepaid balance, its limit of waiting leases),
//! kept in memory so that a request costs no database round trip.
//!
//! Exhaustion is exact: it changes only through events on the tenant's
//! balance subject, and the projection's runner forgets the tenant's
//! answer when it has committed one, before its progress says so (as
//! [`crate::tenant_keys`] forgets keys); a read that raced such an event
//! is used once and not kept (fills name the generation they read under).
//!
//! The pending count follows this rule: a request is refused only after a
//! fresh read of the read model, and then exactly when the tenant's leases
//! there in `requested` or `queued`, plus the requests this gateway
//! appended for it that the read model did not hold at that read (one
//! statement reads both the count and the sequence the tables are at), reach
//! the limit. That is the count the old check saw when every accepted request
//! had been applied before the next was answered, so a client that waits for
//! each answer meets the limit where it did. Between reads, the estimate
//! (the last read's count plus the requests appended since) only ever
//! overcounts what this gateway knows of (leases placed or stopped since
//! are not taken off), so it decides only when a fresh read is due, never a
//! refusal. What it does not see: requests another gateway replica
//! appended and its own read model has not applied yet; concurrent requests
//! spread over replicas can pass the limit by those, as two concurrent
//! requests to one gateway could before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use lh_events::subject;
use sqlx::PgPool;
use uuid::Uuid;

use crate::cache::{Generational, GenerationalCache};

/// Most tenants held at once; when full, the memory starts over (a refill
/// is one query per tenant that writes).
pub const MAX_TENANTS_HELD: usize = 100_000;
/// Sequences of a tenant's appended requests kept between reads; past it,
/// those the read model has applied are folded into the count (an
/// overcount, see the module's rule).
pub const MAX_APPENDED_HELD: usize = 4_096;

#[derive(Debug, Default)]
struct Admission {
    /// The balance's exhaustion, unknown until read and after a balance
    /// event.
    exhausted: Option<bool>,
    /// Leases waiting at the last read (plus folded appends).
    pending_read: u32,
    /// Sequences of the requests appended since the last read.
    appended: Vec<u64>,
}

impl Admission {
    fn estimate(&self) -> u64 {
        u64::from(self.pending_read) + self.appended.len() as u64
    }
}

/// What this gateway holds of every tenant it answered; its generation
/// moves on each time a tenant's exhaustion is forgotten.
#[derive(Default)]
struct AdmissionMemory {
    by_tenant: HashMap<Uuid, Admission>,
    /// The newest request appended for a tenant forgotten when the memory
    /// was full: every tenant's list waits for it, as it might be theirs.
    forgotten_appended: u64,
}

impl AdmissionMemory {
    /// Starts the memory over when it holds [`MAX_TENANTS_HELD`] tenants and
    /// `tenant_id` is not one of them.
    fn make_room(&mut self, tenant_id: Uuid) {
        if self.by_tenant.len() >= MAX_TENANTS_HELD && !self.by_tenant.contains_key(&tenant_id) {
            let newest = self
                .by_tenant
                .values()
                .flat_map(|a| a.appended.iter())
                .max();
            self.forgotten_appended = self.forgotten_appended.max(newest.copied().unwrap_or(0));
            self.by_tenant.clear();
        }
    }
}

/// The memory shared by the lease handlers and the projection's runner.
#[derive(Default)]
pub struct LeaseAdmission {
    memory: GenerationalCache<AdmissionMemory>,
    /// The newest request this gateway appended for any tenant: what an
    /// operator's list waits for.
    newest_appended_by_any: AtomicU64,
}

impl std::fmt::Debug for LeaseAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseAdmission").finish_non_exhaustive()
    }
}

/// What the read model says of a tenant, in one statement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantRead {
    pub exhausted: bool,
    pub pending: u32,
    /// The last sequence the tables reflect.
    pub applied: u64,
}

/// The answer for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    pub exhausted: bool,
    /// Leases counted as waiting (see the module's rule).
    pub pending_leases: u32,
}

impl LeaseAdmission {
    /// What `tenant_id` may do now with a limit of `max_pending` waiting
    /// leases, reading the read model only when memory cannot tell.
    /// `memory_current` says whether the projection's runner is committing
    /// (not stalled): memory is forgotten only as it commits, so while it
    /// cannot, memory could miss an exhaustion the log already holds, and
    /// the read model is asked (and answers 503 while it is down).
    pub async fn check(
        &self,
        pool: &PgPool,
        tenant_id: Uuid,
        max_pending: u32,
        memory_current: bool,
    ) -> sqlx::Result<Admitted> {
        let generation = {
            let memory = self.lock();
            if let Some(a) = memory.by_tenant.get(&tenant_id).filter(|_| memory_current) {
                if let Some(exhausted) = a.exhausted {
                    if a.estimate() < u64::from(max_pending) {
                        return Ok(Admitted {
                            exhausted,
                            pending_leases: a.estimate() as u32,
                        });
                    }
                }
            }
            memory.generation()
        };
        let read = read_tenant(pool, tenant_id).await?;
        Ok(self.fill(tenant_id, generation, read))
    }

    /// Keeps what a read found, begun under `generation`; the answer it
    /// gives.
    pub fn fill(&self, tenant_id: Uuid, generation: u64, read: TenantRead) -> Admitted {
        let mut memory = self.lock();
        memory.make_room(tenant_id);
        let current = memory.is_current(generation);
        let a = memory.by_tenant.entry(tenant_id).or_default();
        a.appended.retain(|&seq| seq > read.applied);
        a.pending_read = read.pending;
        // A read begun before an exhaustion or restoration was committed
        // answers this request (it could have come a moment earlier) but is
        // not kept.
        if current {
            a.exhausted = Some(read.exhausted);
        }
        Admitted {
            exhausted: read.exhausted,
            pending_leases: a.estimate().min(u64::from(u32::MAX)) as u32,
        }
    }

    /// Counts a request appended for `tenant_id` at `sequence`; `applied`
    /// is where the read model stands now.
    pub fn appended(&self, tenant_id: Uuid, sequence: u64, applied: u64) {
        self.newest_appended_by_any
            .fetch_max(sequence, Ordering::Relaxed);
        let mut memory = self.lock();
        memory.make_room(tenant_id);
        // Forgotten since its check, it is held again with its exhaustion
        // unknown: the next request reads afresh, and the tenant's list
        // still waits for this one.
        let a = memory.by_tenant.entry(tenant_id).or_default();
        a.appended.push(sequence);
        if a.appended.len() > MAX_APPENDED_HELD {
            let before = a.appended.len();
            a.appended.retain(|&seq| seq > applied);
            let folded = (before - a.appended.len()) as u32;
            a.pending_read = a.pending_read.saturating_add(folded);
        }
    }

    /// The newest request this gateway appended for `tenant_id` that the
    /// read model had not applied at its last read: what a list of the
    /// tenant's leases must wait for to show its own writes.
    pub fn newest_appended(&self, tenant_id: Uuid) -> Option<u64> {
        let memory = self.lock();
        let own = memory
            .by_tenant
            .get(&tenant_id)
            .and_then(|a| a.appended.iter().copied().max());
        own.max(Some(memory.forgotten_appended).filter(|&s| s > 0))
    }

    /// The newest request this gateway appended for any tenant: what a list
    /// of every tenant's leases must wait for to show each answered write.
    pub fn newest_appended_by_any(&self) -> Option<u64> {
        Some(self.newest_appended_by_any.load(Ordering::Relaxed)).filter(|&s| s > 0)
    }

    /// Forgets every tenant's answer when a committed lease event can put a
    /// lease back among the waiting ones without a request (a resume, a
    /// move off a lost node): the estimate's rule holds only while waiting
    /// leases come from requests this gateway counts. The subject does not
    /// name the tenant, and these events are rare next to requests. The
    /// requests appended are kept: lists wait for them.
    pub fn forget_if_lease_waits_again(&self, stored_subject: &str) {
        let family = subject::LEASES_ALL.trim_end_matches('>');
        let Some(rest) = stored_subject.strip_prefix(family) else {
            return;
        };
        let verb = rest.split('.').nth(1);
        if matches!(verb, Some("resume_requested" | "migrated")) {
            let mut memory = self.lock();
            memory.move_on();
            memory
                .by_tenant
                .values_mut()
                .for_each(|a| a.exhausted = None);
        }
    }

    /// Forgets a tenant's exhaustion when a message on its balance subject
    /// has been committed.
    pub fn forget_if_balance_event(&self, stored_subject: &str) {
        let family = subject::BALANCES_ALL.trim_end_matches('>');
        let Some(rest) = stored_subject.strip_prefix(family) else {
            return;
        };
        let mut memory = self.lock();
        memory.move_on();
        let tenant = rest.split('.').next().and_then(|t| t.parse::<Uuid>().ok());
        match tenant {
            Some(tenant) => {
                if let Some(a) = memory.by_tenant.get_mut(&tenant) {
                    a.exhausted = None;
                }
            }
            // One that names no tenant we can read: forget them all.
            None => memory
                .by_tenant
                .values_mut()
                .for_each(|a| a.exhausted = None),
        }
    }

    fn lock(&self) -> std::sync::RwLockWriteGuard<'_, Generational<AdmissionMemory>> {
        self.memory.write()
    }
}

/// The tenant's exhaustion and waiting leases with the sequence the tables
/// are at, in one snapshot.
async fn read_tenant(pool: &PgPool, tenant_id: Uuid) -> sqlx::Result<TenantRead> {
    let (exhausted, pending, applied): (Option<bool>, i64, Option<i64>) = sqlx::query_as(
        "SELECT (SELECT balance_exhausted FROM tenants WHERE id = $1),
                (SELECT count(*) FROM leases WHERE tenant_id = $1 AND state IN ('requested', 'queued')),
                (SELECT sequence FROM projection_offsets WHERE name = 'gateway')",
    )
    .bind(tenant_id)
    .fetch_one(pool)
    .await?;
    Ok(TenantRead {
        exhausted: exhausted == Some(true),
        pending: pending.clamp(0, i64::from(u32::MAX)) as u32,
        applied: applied.unwrap_or(0).max(0) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TENANT: Uuid = Uuid::from_u128(7);

    fn read(exhausted: bool, pending: u32, applied: u64) -> TenantRead {
        TenantRead {
            exhausted,
            pending,
            applied,
        }
    }

    #[test]
    fn a_resume_or_a_move_back_to_the_queue_makes_every_tenant_read_afresh() {
        let memory = LeaseAdmission::default();
        let g = memory.lock().generation();
        memory.fill(TENANT, g, read(false, 0, 10));
        memory.appended(TENANT, 11, 10);
        assert_eq!(memory.newest_appended(TENANT), Some(11));
        let lease = subject::lease(Uuid::from_u128(9));
        for verb in ["requested.gateway", "placed.scheduler", "started.node"] {
            memory.forget_if_lease_waits_again(&format!("{lease}.{verb}"));
            assert!(memory.lock().by_tenant.contains_key(&TENANT), "{verb}");
        }
        memory.forget_if_lease_waits_again(&format!("{lease}.resume_requested.gateway"));
        assert_eq!(memory.lock().by_tenant[&TENANT].exhausted, None);
        // Forgotten for admission, still waited for by the tenant's list.
        assert_eq!(memory.newest_appended(TENANT), Some(11));
        let now = memory.lock().generation();
        memory.fill(TENANT, now, read(false, 0, 12));
        assert_eq!(memory.lock().by_tenant[&TENANT].exhausted, Some(false));
        memory.forget_if_lease_waits_again(&format!("{lease}.migrated.scheduler"));
        assert_eq!(memory.lock().by_tenant[&TENANT].exhausted, None);
        // A read begun before the forgetting is not kept.
        memory.fill(TENANT, g, read(false, 0, 12));
        assert_eq!(memory.lock().by_tenant[&TENANT].exhausted, None);
    }

    #[test]
    fn every_append_is_waited_for_by_a_list_of_every_tenant_and_by_its_own() {
        let memory = LeaseAdmission::default();
        assert_eq!(memory.newest_appended_by_any(), None);
        // Appended for a tenant this gateway does not hold (forgotten since
        // its check): held again, to be read afresh.
        memory.appended(TENANT, 21, 20);
        assert_eq!(memory.newest_appended(TENANT), Some(21));
        assert_eq!(memory.lock().by_tenant[&TENANT].exhausted, None);
        let other = Uuid::from_u128(8);
        memory.appended(other, 23, 20);
        memory.appended(TENANT, 22, 20);
        assert_eq!(memory.newest_appended(TENANT), Some(22));
        assert_eq!(memory.newest_appended_by_any(), Some(23));
    }

    #[test]
    fn a_full_memory_forgets_tenants_but_their_lists_still_wait_for_their_appends() {
        let memory = LeaseAdmission::default();
        for n in 0..MAX_TENANTS_HELD as u128 {
            memory.appended(Uuid::from_u128(n + 100), n as u64 + 1, 0);
        }
        let newest = MAX_TENANTS_HELD as u64;
        assert_eq!(memory.newest_appended(Uuid::from_u128(100)), Some(1));
        // One more tenant: the memory starts over.
        memory.appended(TENANT, newest + 1, 0);
        assert_eq!(memory.lock().by_tenant.len(), 1);
        assert_eq!(memory.newest_appended(TENANT), Some(newest + 1));
        assert_eq!(memory.newest_appended(Uuid::from_u128(100)), Some(newest));
    }

    #[test]
    fn appends_the_read_model_has_not_applied_count_once() {
        let memory = LeaseAdmission::default();
        let g = memory.lock().generation();
        memory.fill(TENANT, g, read(false, 1, 10));
        memory.appended(TENANT, 11, 10);
        memory.appended(TENANT, 12, 10);
        // The read model has applied 11 (it is in the count), not 12.
        let admitted = memory.fill(TENANT, g, read(false, 2, 11));
        assert_eq!(admitted.pending_leases, 3);
    }

    #[test]
    fn a_read_that_raced_a_balance_event_is_not_kept() {
        let memory = LeaseAdmission::default();
        let before = memory.lock().generation();
        memory.forget_if_balance_event(&format!("{}.pricing", subject::balance(TENANT)));
        let admitted = memory.fill(TENANT, before, read(false, 0, 5));
        assert!(!admitted.exhausted);
        assert_eq!(memory.lock().by_tenant[&TENANT].exhausted, None);
        let now = memory.lock().generation();
        memory.fill(TENANT, now, read(true, 0, 6));
        assert_eq!(memory.lock().by_tenant[&TENANT].exhausted, Some(true));
        memory.forget_if_balance_event(&subject::lease(TENANT));
        assert_eq!(memory.lock().by_tenant[&TENANT].exhausted, Some(true));
        memory.forget_if_balance_event(&subject::balance(TENANT));
        assert_eq!(memory.lock().by_tenant[&TENANT].exhausted, None);
    }

    #[test]
    fn folding_applied_appends_overcounts_and_never_undercounts() {
        let memory = LeaseAdmission::default();
        let g = memory.lock().generation();
        memory.fill(TENANT, g, read(false, 0, 0));
        for seq in 1..=(MAX_APPENDED_HELD as u64 + 1) {
            memory.appended(TENANT, seq, 100);
        }
        let held = memory.lock();
        let a = &held.by_tenant[&TENANT];
        assert_eq!(a.estimate(), MAX_APPENDED_HELD as u64 + 1);
        assert!(a.appended.len() < MAX_APPENDED_HELD);
    }
}
