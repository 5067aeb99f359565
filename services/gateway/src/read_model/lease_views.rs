//! Lease views as the read model holds them, kept in memory so that reading
//! a lease, or a page of a tenant's newest leases, costs a map lookup
//! rather than a database round trip. A copy of the projection, never a
//! source (see docs/adr/019-lease-views-kept-in-the-gateways-memory.md).
//!
//! Only events of the lease family change a lease's row, and the
//! projection's runner re-reads the rows of the leases a committed batch
//! touched ([`LeaseViews::refresh_committed`]) before its progress reports
//! that batch: a caller that waited for its own write to be read back finds
//! the new row here, never the one before it. While the re-read is in
//! flight those leases are not held at all, so a reader goes to the
//! database. A read that missed and raced a batch (it read the database
//! before a commit and returns after the runner moved on) does not put its
//! older row back: each fill names the generation it read under, and every
//! batch touching leases moves the generation on.
//!
//! For the lists: one index per tenant (and one of every lease, for
//! operators) of the newest lease ids by request sequence, complete from
//! its lowest sequence upward; a page inside it is answered from memory, a
//! page past it from the database.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use lh_events::subject;
use sqlx::PgPool;
use uuid::Uuid;

use super::lease::{Lease, VIEW_COLUMNS};
use crate::cache::GenerationalCache;
use crate::poison_free::PoisonFreeRwLock;

/// Most lease views held at once (each about 2 KiB with its JSON); when
/// full, ended and rejected leases go first, oldest first, then the oldest.
pub const MAX_CACHED_LEASE_VIEWS: usize = 20_000;
/// Newest leases one list index holds (two pages of the largest size).
pub const MAX_LISTED_LEASES_PER_INDEX: usize = 1_000;
/// Most list indexes (tenants, and the operators' one) held at once; when
/// full, every index is dropped (a refill is one query per tenant listing).
pub const MAX_LEASE_INDEXES: usize = 1_000;
/// How long the runner waits for the re-read of a batch's leases before
/// leaving them to be read from the database on demand.
pub const REFRESH_TIMEOUT_SECS: u64 = 2;

/// A lease and its view's JSON, serialised once per change rather than
/// once per read.
#[derive(Debug)]
pub struct CachedLease {
    pub lease: Lease,
    pub json: Bytes,
}

impl CachedLease {
    pub fn new(lease: Lease) -> Arc<Self> {
        let json = serde_json::to_vec(&lease.view)
            .expect("a lease view always serialises")
            .into();
        Arc::new(CachedLease { lease, json })
    }

    fn ended(&self) -> bool {
        self.lease.view.state.is_final()
    }

    fn age_key(&self) -> (i64, Uuid) {
        (self.lease.requested_sequence, self.lease.view.id)
    }
}

/// Newest lease ids of one tenant (or of all), by request sequence.
#[derive(Debug, Default)]
struct Index {
    by_sequence: BTreeMap<i64, Uuid>,
    /// Every lease requested at or after this sequence is in `by_sequence`;
    /// `i64::MIN` when it holds every lease there is.
    complete_from: i64,
}

impl Index {
    fn add(&mut self, sequence: i64, id: Uuid) {
        if sequence < self.complete_from {
            return;
        }
        self.by_sequence.insert(sequence, id);
        while self.by_sequence.len() > MAX_LISTED_LEASES_PER_INDEX {
            self.by_sequence.pop_first();
            if let Some((&lowest, _)) = self.by_sequence.first_key_value() {
                self.complete_from = lowest;
            }
        }
    }
}

/// The views and list indexes; their generation moves on with every batch
/// that touched leases.
#[derive(Default)]
struct Cached {
    views: HashMap<Uuid, Arc<CachedLease>>,
    by_age: BTreeSet<(i64, Uuid)>,
    ended_by_age: BTreeSet<(i64, Uuid)>,
    /// By tenant; `None` is every tenant's (the operators' list).
    indexes: HashMap<Option<Uuid>, Index>,
}

impl Cached {
    fn remove(&mut self, id: &Uuid) {
        if let Some(old) = self.views.remove(id) {
            self.by_age.remove(&old.age_key());
            self.ended_by_age.remove(&old.age_key());
        }
    }

    fn put(&mut self, lease: Arc<CachedLease>) {
        self.remove(&lease.lease.view.id);
        while self.views.len() >= MAX_CACHED_LEASE_VIEWS {
            let Some(oldest) = self
                .ended_by_age
                .first()
                .or_else(|| self.by_age.first())
                .copied()
            else {
                break;
            };
            self.remove(&oldest.1);
        }
        if lease.ended() {
            self.ended_by_age.insert(lease.age_key());
        }
        self.by_age.insert(lease.age_key());
        self.views.insert(lease.lease.view.id, lease);
    }

    fn clear(&mut self) {
        self.views.clear();
        self.by_age.clear();
        self.ended_by_age.clear();
        self.indexes.clear();
    }
}

/// The views shared by the API's handlers and the projection's runner.
#[derive(Default)]
pub struct LeaseViews {
    cached: GenerationalCache<Cached>,
    /// Lists whose index is being read from the database: one read each
    /// at a time, however many first pages miss meanwhile.
    filling: PoisonFreeRwLock<HashSet<Option<Uuid>>>,
}

/// A list index being filled; the next miss may start another once it
/// is dropped.
pub struct IndexFill<'a> {
    views: &'a LeaseViews,
    tenant: Option<Uuid>,
}

impl Drop for IndexFill<'_> {
    fn drop(&mut self) {
        self.views.filling.write().remove(&self.tenant);
    }
}

impl std::fmt::Debug for LeaseViews {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseViews")
            .field("views", &self.len())
            .finish()
    }
}

impl LeaseViews {
    /// The lease with this id, if held.
    pub fn get(&self, id: &Uuid) -> Option<Arc<CachedLease>> {
        self.cached.read().views.get(id).cloned()
    }

    /// The generation a read of the database starts under; pass it to
    /// [`LeaseViews::insert`] or [`LeaseViews::fill_index`].
    pub fn generation(&self) -> u64 {
        self.cached.read().generation()
    }

    /// Keeps views read from the database, unless a batch touching leases
    /// was committed since `generation` (the rows may predate it).
    pub fn insert(&self, generation: u64, leases: impl IntoIterator<Item = Arc<CachedLease>>) {
        let mut cached = self.cached.write();
        if !cached.is_current(generation) {
            return;
        }
        for lease in leases {
            cached.put(lease);
        }
    }

    /// Claims the filling of `tenant`'s list index (every tenant's with
    /// `None`); `None` when a fill of it is already under way, or as many
    /// as there may be indexes are.
    pub fn begin_fill(&self, tenant: Option<Uuid>) -> Option<IndexFill<'_>> {
        let mut filling = self.filling.write();
        if filling.len() >= MAX_LEASE_INDEXES || !filling.insert(tenant) {
            return None;
        }
        Some(IndexFill {
            views: self,
            tenant,
        })
    }

    /// Keeps `newest`, a tenant's (or with `None` every tenant's) newest
    /// leases as the database listed them, newest first, at most
    /// [`MAX_LISTED_LEASES_PER_INDEX`]; fewer means there are no more.
    pub fn fill_index(&self, generation: u64, tenant: Option<Uuid>, newest: Vec<Arc<CachedLease>>) {
        let whole = newest.len() < MAX_LISTED_LEASES_PER_INDEX;
        let mut index = Index {
            by_sequence: newest
                .iter()
                .map(|l| (l.lease.requested_sequence, l.lease.view.id))
                .collect(),
            complete_from: i64::MIN,
        };
        if !whole {
            index.complete_from = newest
                .last()
                .map_or(i64::MIN, |l| l.lease.requested_sequence);
        }
        let mut cached = self.cached.write();
        if !cached.is_current(generation) {
            return;
        }
        if cached.indexes.len() >= MAX_LEASE_INDEXES {
            cached.indexes.clear();
        }
        cached.indexes.insert(tenant, index);
        for lease in newest {
            cached.put(lease);
        }
    }

    /// The leases of `tenant` (every tenant's with `None`) requested before
    /// `before`, newest first, at most `limit + 1` (one more tells whether
    /// there is a next page): `None` when memory cannot answer exactly (no
    /// index, the page reaches past it, or a lease on it is not held).
    pub fn page(
        &self,
        tenant: Option<Uuid>,
        before: i64,
        limit: usize,
    ) -> Option<Vec<Arc<CachedLease>>> {
        let cached = self.cached.read();
        let index = cached.indexes.get(&tenant)?;
        let mut page = Vec::with_capacity(limit + 1);
        for id in index.by_sequence.range(..before).rev().map(|(_, id)| id) {
            if page.len() > limit {
                break;
            }
            page.push(cached.views.get(id)?.clone());
        }
        (page.len() > limit || index.complete_from == i64::MIN).then_some(page)
    }

    /// Re-reads the leases the runner's last committed batch touched
    /// (`subjects`, in log order), before its progress reports the batch.
    /// Tenant events change no lease row and are left alone. When the
    /// re-read fails, those leases stay out of memory, and the indexes,
    /// which might miss a new lease, are dropped.
    pub async fn refresh_committed(&self, pool: &PgPool, subjects: &[String]) {
        let family = subject::LEASES_ALL.trim_end_matches('>');
        let mut ids = HashSet::new();
        for stored in subjects {
            let Some(rest) = stored.strip_prefix(family) else {
                continue;
            };
            match rest
                .split('.')
                .next()
                .and_then(|id| id.parse::<Uuid>().ok())
            {
                Some(id) => {
                    ids.insert(id);
                }
                None => {
                    // A lease subject this reader cannot place: forget all.
                    self.forget_all();
                    return;
                }
            }
        }
        if ids.is_empty() {
            return;
        }
        let ids: Vec<Uuid> = ids.into_iter().collect();
        let generation = {
            let mut cached = self.cached.write();
            let generation = cached.move_on();
            for id in &ids {
                cached.remove(id);
            }
            generation
        };
        let read = tokio::time::timeout(
            Duration::from_secs(REFRESH_TIMEOUT_SECS),
            sqlx::query_as::<_, Lease>(&format!(
                "SELECT {VIEW_COLUMNS} FROM leases WHERE id = ANY($1)"
            ))
            .bind(&ids)
            .fetch_all(pool),
        )
        .await;
        let rows = match read {
            Ok(Ok(rows)) => rows,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, leases = ids.len(), "could not re-read committed leases");
                self.cached.write().indexes.clear();
                return;
            }
            Err(_) => {
                tracing::warn!(leases = ids.len(), "re-reading committed leases timed out");
                self.cached.write().indexes.clear();
                return;
            }
        };
        let fresh: Vec<_> = rows.into_iter().map(CachedLease::new).collect();
        let mut cached = self.cached.write();
        if !cached.is_current(generation) {
            return;
        }
        for lease in fresh {
            let (sequence, id, tenant) = (
                lease.lease.requested_sequence,
                lease.lease.view.id,
                lease.lease.view.tenant_id,
            );
            for key in [Some(tenant), None] {
                if let Some(index) = cached.indexes.get_mut(&key) {
                    index.add(sequence, id);
                }
            }
            cached.put(lease);
        }
    }

    /// Forgets every view and index.
    pub fn forget_all(&self) {
        let mut cached = self.cached.write();
        cached.move_on();
        cached.clear();
    }

    pub fn len(&self) -> usize {
        self.cached.read().views.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A page's JSON from its leases' JSON, byte for byte what serialising a
/// [`lh_rpc::http::leases::LeasePage`] writes.
pub fn page_json(items: &[Arc<CachedLease>], next_cursor: Option<i64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(items.iter().map(|l| l.json.len() + 1).sum::<usize>() + 48);
    out.extend_from_slice(b"{\"items\":[");
    for (i, lease) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&lease.json);
    }
    out.extend_from_slice(b"],\"next_cursor\":");
    match next_cursor {
        Some(c) => out.extend_from_slice(format!("\"{c}\"").as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_rpc::http::leases::{LeasePage, LeaseView};

    fn lease(sequence: i64, tenant: Uuid, state: &str) -> Arc<CachedLease> {
        let view: LeaseView = serde_json::from_value(serde_json::json!({
            "id": Uuid::now_v7(), "tenant_id": tenant, "state": state, "gpus": 1,
            "gpu_model": "A100-40GB", "tier": "basic", "priority": 0,
            "gpu_uuids": [], "gpu_indices": [], "stop_requested": false,
            "migrations": 0, "created_at": "2026-12-05T00:00:00Z",
        }))
        .unwrap();
        CachedLease::new(Lease {
            view,
            requested_sequence: sequence,
            idempotency_key: None,
            last_placement_node_id: None,
            last_placement_sequence: None,
        })
    }

    #[test]
    fn at_the_limit_ended_leases_go_first_then_the_oldest() {
        let views = LeaseViews::default();
        let tenant = Uuid::now_v7();
        let ended = lease(5, tenant, "ended");
        let oldest = lease(1, tenant, "running");
        let mut all = vec![oldest.clone(), ended.clone()];
        all.extend(
            (10..)
                .take(MAX_CACHED_LEASE_VIEWS - 2)
                .map(|s| lease(s, tenant, "queued")),
        );
        views.insert(views.generation(), all);
        assert_eq!(views.len(), MAX_CACHED_LEASE_VIEWS);
        let newer = lease(1_000_000, tenant, "requested");
        views.insert(views.generation(), [newer.clone()]);
        assert_eq!(views.len(), MAX_CACHED_LEASE_VIEWS);
        assert!(
            views.get(&ended.lease.view.id).is_none(),
            "the ended one went"
        );
        assert!(views.get(&oldest.lease.view.id).is_some());
        let newest = lease(1_000_001, tenant, "requested");
        views.insert(views.generation(), [newest.clone()]);
        assert!(
            views.get(&oldest.lease.view.id).is_none(),
            "then the oldest"
        );
        assert!(
            views.get(&newer.lease.view.id).is_some() && views.get(&newest.lease.view.id).is_some()
        );
        assert_eq!(views.len(), MAX_CACHED_LEASE_VIEWS);
    }

    #[test]
    fn a_fill_that_raced_a_batch_is_not_kept() {
        let views = LeaseViews::default();
        let before = views.generation();
        views.cached.write().move_on();
        let stale = lease(1, Uuid::nil(), "running");
        views.insert(before, [stale.clone()]);
        views.fill_index(before, None, vec![stale.clone()]);
        assert!(views.get(&stale.lease.view.id).is_none());
        assert!(views.page(None, i64::MAX, 10).is_none());
    }

    #[test]
    fn one_fill_of_a_list_at_a_time() {
        let views = LeaseViews::default();
        let tenant = Some(Uuid::from_u128(7));
        let fill = views.begin_fill(tenant).expect("the first claims it");
        assert!(views.begin_fill(tenant).is_none());
        let others = views.begin_fill(None).expect("another list is apart");
        drop(fill);
        assert!(views.begin_fill(tenant).is_some());
        drop(others);
        let held: Vec<_> = (0..MAX_LEASE_INDEXES as u128)
            .map(|n| views.begin_fill(Some(Uuid::from_u128(1_000 + n))).unwrap())
            .collect();
        assert!(
            views.begin_fill(tenant).is_none(),
            "no more at once than indexes"
        );
        drop(held);
        assert!(views.begin_fill(tenant).is_some());
    }

    #[test]
    fn a_page_is_answered_only_inside_the_index() {
        let views = LeaseViews::default();
        let tenant = Uuid::now_v7();
        // A full index: the newest leases, but not every lease there is.
        let newest: Vec<_> = (0..MAX_LISTED_LEASES_PER_INDEX as i64)
            .rev()
            .map(|s| lease(100 + s, tenant, "requested"))
            .collect();
        views.fill_index(views.generation(), Some(tenant), newest.clone());
        let page = views.page(Some(tenant), i64::MAX, 3).unwrap();
        assert_eq!(
            page.iter().map(|l| l.lease.view.id).collect::<Vec<_>>(),
            newest[..4]
                .iter()
                .map(|l| l.lease.view.id)
                .collect::<Vec<_>>()
        );
        // The last three of the index cannot tell what comes after them.
        assert!(views.page(Some(tenant), 103, 3).is_none());
        assert_eq!(views.page(Some(tenant), 104, 3).unwrap().len(), 4);
        assert!(
            views.page(None, i64::MAX, 3).is_none(),
            "no operators' index"
        );
        // An index holding every lease answers a short last page.
        let other = Uuid::now_v7();
        let few = vec![lease(9, other, "ended"), lease(8, other, "running")];
        views.fill_index(views.generation(), Some(other), few);
        assert_eq!(views.page(Some(other), i64::MAX, 50).unwrap().len(), 2);
        assert_eq!(views.page(Some(other), 9, 50).unwrap().len(), 1);
        assert!(views.page(Some(other), 8, 50).unwrap().is_empty());
    }

    #[test]
    fn a_page_reads_as_serde_writes_it() {
        let items = vec![
            lease(2, Uuid::nil(), "running"),
            lease(1, Uuid::nil(), "ended"),
        ];
        for cursor in [None, Some(1)] {
            let page = LeasePage {
                items: items.iter().map(|l| l.lease.view.clone()).collect(),
                next_cursor: cursor.map(|c: i64| c.to_string()),
            };
            assert_eq!(
                page_json(&items, cursor),
                serde_json::to_vec(&page).unwrap()
            );
        }
    }
}
