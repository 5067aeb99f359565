//! Which of the gateway's caches a committed event makes stale. The
//! projection's runner hands over the subjects of each batch it committed,
//! before its progress reports the batch; every cache that may hold what
//! those events changed forgets it here, so a caller that waited for its
//! own write never reads what was there before. One table says which
//! family of subjects reaches which cache.

use std::future::Future;
use std::sync::Arc;

use lh_events::subject;
use sqlx::PgPool;

use crate::lease_admission::LeaseAdmission;
use crate::read_model::lease_views::LeaseViews;
use crate::tenant_keys::TenantKeys;

/// The caches the projection's runner keeps current.
#[derive(Debug, Clone, Default)]
pub struct Caches {
    pub tenant_keys: Arc<TenantKeys>,
    pub lease_admission: Arc<LeaseAdmission>,
    pub lease_views: Arc<LeaseViews>,
}

/// A cache's answer to a committed subject of the family it is filed under.
type Forget = fn(&Caches, &str);

/// Each family of stored subjects, and what a committed one makes each
/// cache forget: a tenant event any key's answer (its tenant, quota,
/// suspension, revocation); a balance event the tenant's exhaustion; a lease
/// event that puts a lease back among the waiting ones every tenant's
/// pending count. Lease views are re-read for the batch as a whole
/// ([`LeaseViews::refresh_committed`]).
const ROUTES: &[(&str, Forget)] = &[
    (subject::TENANTS_ALL, |c, s| {
        c.tenant_keys.forget_if_tenant_event(s)
    }),
    (subject::BALANCES_ALL, |c, s| {
        c.lease_admission.forget_if_balance_event(s)
    }),
    (subject::LEASES_ALL, |c, s| {
        c.lease_admission.forget_if_lease_waits_again(s)
    }),
];

impl Caches {
    /// Forgets what the committed `stored_subjects` (in log order) make
    /// stale, at once; the future re-reads the leases they touched.
    pub fn committed(
        &self,
        pool: &PgPool,
        stored_subjects: Vec<String>,
    ) -> impl Future<Output = ()> + Send + 'static {
        for stored_subject in &stored_subjects {
            for (filter, forget) in ROUTES {
                if stored_subject.starts_with(filter.trim_end_matches('>')) {
                    forget(self, stored_subject);
                }
            }
        }
        let (lease_views, pool) = (self.lease_views.clone(), pool.clone());
        async move { lease_views.refresh_committed(&pool, &stored_subjects).await }
    }
}
