//! The lease aggregate's rules on the write side: what a tenant may request,
//! and when a lease may be stopped or resumed. Pure: the caller brings the
//! tenant, the request and the lease's state, and appends what comes back.

use std::borrow::Cow;
use std::fmt;

use lh_events::{
    derived_id, GpuAsk, GpuFraction, LeaseRequested, LeaseResumeRequested, LeaseStopRequested,
    SpotRecovery, Tier, WorkloadSpec,
};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{catalog, workload};

/// Bounds of a lease's priority.
pub const MAX_PRIORITY: i32 = 1000;
/// Most arguments and environment entries a workload may carry.
pub const MAX_WORKLOAD_ITEMS: usize = 256;
/// Longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 200;
/// Most bytes a workload's command, image and environment may hold
/// together: every request is kept in the log for a year.
pub const MAX_WORKLOAD_BYTES: usize = 16 * 1024;
/// Most zones, and most regions, one lease may name.
pub const MAX_PLACES_PER_LEASE: usize = 16;
/// Longest zone or region name, in bytes.
pub const MAX_PLACE_NAME_LEN: usize = 64;

/// The tenant asking, with its quota of whole GPUs and how many of its
/// leases wait for a placement now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant {
    pub id: Uuid,
    pub max_gpus: u32,
    /// Its leases requested or queued, not yet placed.
    pub pending_leases: u32,
    /// Most leases it may have waiting at once.
    pub max_pending_leases: u32,
}

/// A lease request as the tenant wrote it: at most one of `gpus`,
/// `fraction` and `mig_profile` should be set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseBody {
    pub gpus: Option<u32>,
    pub fraction: Option<GpuFraction>,
    pub mig_profile: Option<String>,
    pub gpu_model: String,
    pub tier: Tier,
    pub priority: i32,
    pub workload: Option<WorkloadSpec>,
    /// Spot only: the most the tenant pays, CNY per GPU-hour.
    pub max_price_cny_per_gpu_hour: Option<Decimal>,
    pub zones: Vec<String>,
    pub regions: Vec<String>,
    /// Spot only: how the lease is recovered after a preemption.
    pub recovery: Option<SpotRecovery>,
}

/// How wrong a refused request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidKind {
    /// The request cannot be read (HTTP 400).
    Malformed,
    /// The request is readable but breaks a rule (HTTP 422).
    Unacceptable,
    /// The tenant is at a limit that time lifts (HTTP 429).
    OverLimit,
}

/// Why a request is refused: the request field at fault and a sentence for
/// the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct Invalid {
    pub kind: InvalidKind,
    pub field: Cow<'static, str>,
    pub detail: String,
}

impl Invalid {
    fn unacceptable(field: impl Into<Cow<'static, str>>, detail: impl Into<String>) -> Self {
        Self {
            kind: InvalidKind::Unacceptable,
            field: field.into(),
            detail: detail.into(),
        }
    }
}

impl From<catalog::CatalogError> for Invalid {
    fn from(e: catalog::CatalogError) -> Self {
        Self::unacceptable(e.field, e.detail)
    }
}

/// Decides a lease request. `idempotency_key` is the raw header, if one was
/// sent; without one the lease takes `unkeyed_id`.
pub fn request(
    tenant: Tenant,
    body: LeaseBody,
    idempotency_key: Option<&[u8]>,
    unkeyed_id: Uuid,
) -> Result<LeaseRequested, Invalid> {
    let ask = ask(body.gpus, body.fraction, body.mig_profile)?;
    catalog::check(&body.gpu_model, &ask)?;
    if let Some(w) = &body.workload {
        check_workload(w)?;
        if ask.gpus() > catalog::GPUS_PER_WHOLE_NODE && w.command.is_empty() {
            return Err(Invalid::unacceptable(
                "workload.command",
                "a lease of more GPUs than a node holds runs its command once per GPU on each \
                 node: give workload.command (the image's own cannot be run so)",
            ));
        }
    }
    // Not `abs()`: i32::MIN has no absolute value and would wrap past the check.
    if !(-MAX_PRIORITY..=MAX_PRIORITY).contains(&body.priority) {
        return Err(Invalid::unacceptable(
            "priority",
            format!("priority must be -{MAX_PRIORITY} to {MAX_PRIORITY}"),
        ));
    }
    let spot = check_spot_terms(body.tier, body.max_price_cny_per_gpu_hour, &body.recovery)?;
    check_places("zones", &body.zones)?;
    check_places("regions", &body.regions)?;
    let gpus = ask.gpus();
    if gpus > tenant.max_gpus {
        return Err(Invalid::unacceptable(
            "gpus",
            format!(
                "{gpus} GPUs requested but the tenant's quota is {}",
                tenant.max_gpus
            ),
        ));
    }
    let idempotency_key = idempotency_key.map(parse_idempotency_key).transpose()?;
    // One tenant must not be able to fill the queue (and the log) alone. A
    // retry of a request already made is refused too while the tenant is
    // at its limit; it gets its lease once it is below.
    if tenant.pending_leases >= tenant.max_pending_leases {
        return Err(Invalid {
            kind: InvalidKind::OverLimit,
            field: "tenant".into(),
            detail: format!(
                "the tenant has {} leases waiting for a placement, its limit; retry once some are placed or stopped",
                tenant.pending_leases
            ),
        });
    }
    // The same key from the same tenant always names the same lease, and the
    // lease's subject must be empty for a new request: so a key can never
    // create two leases, however far apart the two calls are.
    let lease_id = match &idempotency_key {
        Some(key) => derived_id(&["lease", &tenant.id.to_string(), key]),
        None => unkeyed_id,
    };
    let (fraction, mig_profile) = match ask {
        GpuAsk::Whole(_) => (None, None),
        GpuAsk::Fraction(f) => (Some(f), None),
        GpuAsk::Mig(p) => (None, Some(p)),
    };
    Ok(LeaseRequested {
        lease_id,
        tenant_id: tenant.id,
        gpus,
        gpu_model: body.gpu_model,
        tier: body.tier,
        priority: body.priority,
        idempotency_key,
        fraction,
        mig_profile,
        workload: body.workload,
        max_price_cny_per_gpu_hour: spot.0,
        zones: body.zones,
        regions: body.regions,
        recovery: spot.1,
        recovery_of: None,
        quote_id: None,
    })
}

/// A bid and a recovery policy belong to spot requests only, each within
/// its bounds.
fn check_spot_terms(
    tier: Tier,
    bid: Option<Decimal>,
    recovery: &Option<SpotRecovery>,
) -> Result<(Option<Decimal>, Option<SpotRecovery>), Invalid> {
    let spot = tier == Tier::Spot;
    let bid = match bid {
        Some(_) if !spot => {
            return Err(Invalid::unacceptable(
                "max_price_cny_per_gpu_hour",
                "a maximum price is for tier spot only",
            ))
        }
        Some(bid) => Some(
            crate::spot::check_bid(bid)
                .map_err(|why| Invalid::unacceptable("max_price_cny_per_gpu_hour", why))?,
        ),
        None => None,
    };
    let recovery = match recovery {
        Some(_) if !spot => {
            return Err(Invalid::unacceptable(
                "recovery",
                "recovery is for tier spot only",
            ))
        }
        Some(r) if r.max_retries > crate::spot::MAX_RECOVERY_RETRIES => {
            return Err(Invalid::unacceptable(
                "recovery.max_retries",
                format!("at most {} retries", crate::spot::MAX_RECOVERY_RETRIES),
            ))
        }
        other => other.clone(),
    };
    Ok((bid, recovery))
}

/// Zone and region names: at most [`MAX_PLACES_PER_LEASE`], each 1 to
/// [`MAX_PLACE_NAME_LEN`] letters, digits, `.`, `_` or `-`, none twice.
fn check_places(field: &'static str, names: &[String]) -> Result<(), Invalid> {
    if names.len() > MAX_PLACES_PER_LEASE {
        return Err(Invalid::unacceptable(
            field,
            format!("at most {MAX_PLACES_PER_LEASE} {field}"),
        ));
    }
    let well_formed = |n: &String| {
        (1..=MAX_PLACE_NAME_LEN).contains(&n.len())
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    };
    if let Some(bad) = names.iter().find(|n| !well_formed(n)) {
        return Err(Invalid::unacceptable(
            field,
            format!(
                "{bad:?} is not a name: 1 to {MAX_PLACE_NAME_LEN} letters, digits, '.', '_' or '-'"
            ),
        ));
    }
    let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
    if distinct.len() != names.len() {
        return Err(Invalid::unacceptable(
            field,
            format!("{field} repeat a name"),
        ));
    }
    Ok(())
}

/// The one ask among the request's three ways of writing one.
/// What a request for `gpu_model` asks for, checked against the catalog:
/// exactly one of whole GPUs, a share or a MIG profile (a quote's spec).
pub fn checked_ask(
    gpus: Option<u32>,
    fraction: Option<GpuFraction>,
    mig_profile: Option<String>,
    gpu_model: &str,
) -> Result<GpuAsk, Invalid> {
    let ask = ask(gpus, fraction, mig_profile)?;
    catalog::check(gpu_model, &ask)?;
    Ok(ask)
}

fn ask(
    gpus: Option<u32>,
    fraction: Option<GpuFraction>,
    mig_profile: Option<String>,
) -> Result<GpuAsk, Invalid> {
    const ONE_OF: &str = "give one of gpus, gpu_fraction and mig_profile";
    match (gpus, fraction, mig_profile) {
        (Some(_), Some(_), _) | (None, Some(_), Some(_)) => {
            Err(Invalid::unacceptable("gpu_fraction", ONE_OF))
        }
        (Some(_), None, Some(_)) => Err(Invalid::unacceptable("mig_profile", ONE_OF)),
        (None, None, None) => Err(Invalid::unacceptable(
            "gpus",
            "gpus (whole GPUs), gpu_fraction (a share of one GPU) or mig_profile (a MIG instance) is required",
        )),
        (Some(n), None, None) => Ok(GpuAsk::Whole(n)),
        (None, Some(f), None) => Ok(GpuAsk::Fraction(f)),
        (None, None, Some(p)) => Ok(GpuAsk::Mig(p)),
    }
}

/// A key is 1 to [`MAX_IDEMPOTENCY_KEY_LEN`] visible ASCII characters (tabs
/// allowed), what an HTTP header value reads as text.
fn parse_idempotency_key(raw: &[u8]) -> Result<String, Invalid> {
    let visible = raw.iter().all(|&b| b == b'\t' || (32..127).contains(&b));
    if !visible || raw.is_empty() || raw.len() > MAX_IDEMPOTENCY_KEY_LEN {
        return Err(Invalid {
            kind: InvalidKind::Malformed,
            field: "Idempotency-Key".into(),
            detail: format!(
                "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible characters"
            ),
        });
    }
    Ok(String::from_utf8_lossy(raw).into_owned())
}

fn check_workload(w: &WorkloadSpec) -> Result<(), Invalid> {
    if w.command.is_empty() && w.image.is_none() {
        return Err(Invalid::unacceptable(
            "workload.command",
            "a workload needs a command, or an image to run",
        ));
    }
    if w.command.len() > MAX_WORKLOAD_ITEMS || w.command.first().is_some_and(|c| c.is_empty()) {
        return Err(Invalid::unacceptable(
            "workload.command",
            format!(
                "workload.command must be 1 to {MAX_WORKLOAD_ITEMS} arguments, the first not empty"
            ),
        ));
    }
    if w.network != lh_events::WorkloadNetwork::None && w.image.is_none() {
        return Err(Invalid::unacceptable(
            "workload.network",
            "workload.network is for a container: name workload.image too",
        ));
    }
    if let Some(image) = w.image.as_deref() {
        workload::check_image_reference(image).map_err(|e| {
            Invalid::unacceptable(
                "workload.image",
                format!("workload.image must be an OCI image reference ([host[:port]/]path[:tag][@digest]): {e}"),
            )
        })?;
    }
    let valid_name = |k: &str| {
        let mut chars = k.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let bytes = w.command.iter().map(String::len).sum::<usize>()
        + w.image.as_deref().map_or(0, str::len)
        + w.env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    if bytes > MAX_WORKLOAD_BYTES {
        return Err(Invalid::unacceptable(
            "workload",
            format!("workload holds {bytes} bytes; at most {MAX_WORKLOAD_BYTES} (command, image and env together)"),
        ));
    }
    if w.env.len() > MAX_WORKLOAD_ITEMS || !w.env.keys().all(|k| valid_name(k)) {
        return Err(Invalid::unacceptable(
            "workload.env",
            format!(
                "workload.env takes at most {MAX_WORKLOAD_ITEMS} variables named [A-Za-z_][A-Za-z0-9_]*"
            ),
        ));
    }
    for (name, value) in &w.env {
        let why = workload::denied_env_name(name).or_else(|| workload::bad_env_value(value));
        if let Some(why) = why {
            return Err(Invalid::unacceptable(
                format!("workload.env.{name}"),
                format!("workload.env.{name} is refused: {why}"),
            ));
        }
    }
    check_mounts(w)
}

/// Datasets, workspaces and the store itself: named well, at good paths
/// that do not overlap, and only in a container (a process lease shares
/// the host's tree and network).
fn check_mounts(w: &WorkloadSpec) -> Result<(), Invalid> {
    use crate::storage::{
        bad_mount_path, bad_name, is_version, overlapping, MAX_DATASET_MOUNTS, MAX_WORKSPACE_MOUNTS,
    };
    for (field, count, limit) in [
        ("workload.datasets", w.datasets.len(), MAX_DATASET_MOUNTS),
        (
            "workload.workspaces",
            w.workspaces.len(),
            MAX_WORKSPACE_MOUNTS,
        ),
    ] {
        if count > limit {
            return Err(Invalid::unacceptable(
                field,
                format!("{field} takes at most {limit}"),
            ));
        }
        if count > 0 && w.image.is_none() {
            return Err(Invalid::unacceptable(
                field,
                format!("{field} are mounted into a container: name workload.image too"),
            ));
        }
    }
    if w.object_store && w.image.is_none() {
        return Err(Invalid::unacceptable(
            "workload.object_store",
            "workload.object_store is given to a container: name workload.image too",
        ));
    }
    let named = w
        .datasets
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("workload.datasets[{i}]"), &d.name, &d.path))
        .chain(
            w.workspaces
                .iter()
                .enumerate()
                .map(|(i, m)| (format!("workload.workspaces[{i}]"), &m.name, &m.path)),
        );
    for (field, name, path) in named {
        if let Some(why) = bad_name(name) {
            return Err(Invalid::unacceptable(
                format!("{field}.name"),
                format!("{field}.name {why}"),
            ));
        }
        if let Some(why) = bad_mount_path(path) {
            return Err(Invalid::unacceptable(
                format!("{field}.path"),
                format!("{field}.path {path:?} {why}"),
            ));
        }
    }
    for (i, d) in w.datasets.iter().enumerate() {
        if !d.version.is_empty() && !is_version(&d.version) {
            return Err(Invalid::unacceptable(
                format!("workload.datasets[{i}].version"),
                "a dataset version is the 64 lowercase hex digits `lh data ls` shows",
            ));
        }
    }
    let mut names: Vec<&str> = w.workspaces.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|pair| pair[0] == pair[1]) {
        return Err(Invalid::unacceptable(
            "workload.workspaces",
            "a workspace may be mounted once per lease",
        ));
    }
    let paths: Vec<&str> = w
        .datasets
        .iter()
        .map(|d| d.path.as_str())
        .chain(w.workspaces.iter().map(|m| m.path.as_str()))
        .collect();
    if let Some((a, b)) = overlapping(&paths) {
        return Err(Invalid::unacceptable(
            "workload",
            format!("mounts at {a} and {b} overlap: give each its own directory"),
        ));
    }
    Ok(())
}

/// Where a lease is in its life, as the read model shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    Requested,
    Queued,
    Placed,
    Running,
    Suspended,
    Ended,
    Rejected,
}

impl LeaseState {
    pub const ALL: [LeaseState; 7] = [
        LeaseState::Requested,
        LeaseState::Queued,
        LeaseState::Placed,
        LeaseState::Running,
        LeaseState::Suspended,
        LeaseState::Ended,
        LeaseState::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Requested => "requested",
            LeaseState::Queued => "queued",
            LeaseState::Placed => "placed",
            LeaseState::Running => "running",
            LeaseState::Suspended => "suspended",
            LeaseState::Ended => "ended",
            LeaseState::Rejected => "rejected",
        }
    }

    /// Ended or rejected: nothing more happens to the lease.
    pub fn is_final(self) -> bool {
        matches!(self, LeaseState::Ended | LeaseState::Rejected)
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state name this code does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown lease state {0:?}")]
pub struct UnknownLeaseState(pub String);

impl TryFrom<String> for LeaseState {
    type Error = UnknownLeaseState;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        LeaseState::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or(UnknownLeaseState(name))
    }
}

/// A step of a lease's life that moves its state, one lease event each
/// (a move off a lost node is one of two: onto other GPUs, or back to the
/// queue when none are free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStep {
    /// `lease.queued`: no capacity for it yet.
    Queue,
    /// `lease.rejected`.
    Reject,
    /// `lease.placed`.
    Place,
    /// `lease.started`.
    Start,
    /// `lease.migrated` onto other GPUs.
    Migrate,
    /// `lease.migrated` with nowhere to go: back to the queue.
    Requeue,
    /// `lease.suspended` for being idle.
    Suspend,
    /// `lease.resume_requested`.
    RequestResume,
    /// `lease.ended`.
    End,
}

impl LeaseState {
    /// The state `step` leaves a lease in that is in `self`, or `None` when
    /// the step does not apply there (its event then changes nothing). The
    /// log is the truth: a rejection or an end is recorded in any state.
    pub const fn after(self, step: LeaseStep) -> Option<LeaseState> {
        use LeaseState::{Ended, Placed, Queued, Rejected, Requested, Running, Suspended};
        match (step, self) {
            (LeaseStep::Queue, Requested | Queued) => Some(Queued),
            (LeaseStep::Place, Requested | Queued) => Some(Placed),
            (LeaseStep::Start, Placed) => Some(Running),
            (LeaseStep::Migrate, Placed | Running) => Some(Placed),
            (LeaseStep::Requeue, Placed | Running) => Some(Queued),
            (LeaseStep::Suspend, Placed | Running) => Some(Suspended),
            (LeaseStep::RequestResume, Suspended) => Some(Requested),
            (LeaseStep::Reject, _) => Some(Rejected),
            (LeaseStep::End, _) => Some(Ended),
            _ => None,
        }
    }

    /// The states `step` applies in, in the order of [`LeaseState::ALL`].
    pub fn before(step: LeaseStep) -> Vec<LeaseState> {
        LeaseState::ALL
            .into_iter()
            .filter(|state| state.after(step).is_some())
            .collect()
    }
}

/// Why a stop or resume is refused: the lease is in the wrong state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WrongState(pub String);

/// The lease as a stop or resume sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseNow {
    pub id: Uuid,
    pub state: LeaseState,
    /// When it was last suspended.
    pub suspended_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A stop is accepted until the lease is over; asking twice is harmless,
/// both name the same event.
pub fn stop(lease: LeaseNow) -> Result<(LeaseStopRequested, Uuid), WrongState> {
    if lease.state.is_final() {
        return Err(WrongState(format!(
            "lease {} is already {}",
            lease.id, lease.state
        )));
    }
    let event_id = derived_id(&["lease.stop_requested", &lease.id.to_string()]);
    Ok((LeaseStopRequested { lease_id: lease.id }, event_id))
}

/// A resume is accepted only for a suspended lease.
pub fn resume(lease: LeaseNow) -> Result<(LeaseResumeRequested, Uuid), WrongState> {
    if lease.state != LeaseState::Suspended {
        return Err(WrongState(format!(
            "lease {} is {}, not suspended",
            lease.id, lease.state
        )));
    }
    // One resume per suspension: the id is derived from the suspension.
    let suspended_at = lease
        .suspended_at
        .map(|t| t.to_rfc3339())
        .unwrap_or_default();
    let event_id = derived_id(&[
        "lease.resume_requested",
        &lease.id.to_string(),
        &suspended_at,
    ]);
    Ok((LeaseResumeRequested { lease_id: lease.id }, event_id))
}

#[cfg(test)]
mod tests;
