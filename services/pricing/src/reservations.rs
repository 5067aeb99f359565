//! The reservation RPC: lists the reservations the charges fold holds, and
//! commits a new one (`reservation.committed`, which pricing alone writes:
//! it bills the commitment and decides which leases it covers).

use chrono::{DateTime, Utc};
use lh_bus::{Bus, BusError, Expect};
use lh_events::{subject, Actor, Envelope, EventData, ReservationCommitted};
use lh_rpc::reservation::{
    CommitReply, CommitRequest, ListRequest, Reservations, DEFAULT_TERM_DAYS, MAX_LEAD_DAYS,
    MAX_RESERVED_GPUS, MAX_TERM_DAYS,
};
use uuid::Uuid;

use crate::books::MAX_EFFECTIVE_FROM_AGE;
use crate::shelf::SharedPricingShelf;
use crate::SERVICE;

/// Longest zone name, in bytes.
pub const MAX_ZONE_BYTES: usize = 64;

pub fn list(shelf: &SharedPricingShelf, request: ListRequest) -> Reservations {
    let shelf = shelf.read().expect("shelf lock");
    Reservations {
        reservations: shelf
            .reservations
            .iter()
            .filter(|r| request.tenant_id.is_none_or(|t| t == r.tenant_id))
            .cloned()
            .collect(),
    }
}

/// Why a request is refused: the field at fault and what is wrong.
pub type Refusal = (&'static str, String);

fn refused(field: &'static str, detail: impl Into<String>) -> Refusal {
    (field, detail.into())
}

/// The reservation `request` asks for, or why not.
pub fn reservation(
    request: CommitRequest,
    id: Uuid,
    now: DateTime<Utc>,
) -> Result<ReservationCommitted, Refusal> {
    if lh_domain::catalog::vram_gb(&request.gpu_model).is_none() {
        return Err(refused("gpu_model", "not a GPU model of the catalog"));
    }
    let zone = request.zone.trim();
    if zone.is_empty() || zone.len() > MAX_ZONE_BYTES || subject::token(zone) != zone {
        return Err(refused(
            "zone",
            format!("a zone is 1 to {MAX_ZONE_BYTES} bytes without dots, wildcards or spaces"),
        ));
    }
    if !(1..=MAX_RESERVED_GPUS).contains(&request.gpus) {
        return Err(refused(
            "gpus",
            format!("a reservation is for 1 to {MAX_RESERVED_GPUS} GPUs"),
        ));
    }
    let term_days = request.term_days.unwrap_or(DEFAULT_TERM_DAYS);
    if !(1..=MAX_TERM_DAYS).contains(&term_days) {
        return Err(refused(
            "term_days",
            format!("a term is 1 to {MAX_TERM_DAYS} days"),
        ));
    }
    let starts_at = request.starts_at.unwrap_or(now);
    if starts_at < now - MAX_EFFECTIVE_FROM_AGE {
        return Err(refused(
            "starts_at",
            "a reservation cannot start in the past",
        ));
    }
    if starts_at > now + chrono::Duration::days(i64::from(MAX_LEAD_DAYS)) {
        return Err(refused(
            "starts_at",
            format!("a reservation starts within {MAX_LEAD_DAYS} days"),
        ));
    }
    Ok(ReservationCommitted {
        reservation_id: id,
        tenant_id: request.tenant_id,
        gpu_model: request.gpu_model,
        zone: zone.to_string(),
        gpus: request.gpus,
        starts_at,
        ends_at: starts_at + chrono::Duration::days(i64::from(term_days)),
        requested_by: request.requested_by,
    })
}

/// Commits a reservation when the request is valid.
pub async fn commit(
    bus: &Bus,
    request: CommitRequest,
    now: DateTime<Utc>,
) -> Result<CommitReply, String> {
    let reservation = match reservation(request, Uuid::now_v7(), now) {
        Ok(r) => r,
        Err((field, detail)) => {
            return Ok(CommitReply::Refused {
                field: field.into(),
                detail,
            })
        }
    };
    tracing::info!(reservation_id = %reservation.reservation_id, tenant_id = %reservation.tenant_id,
        requested_by = ?reservation.requested_by, "committing a reservation");
    let envelope = Envelope::new(
        Actor::Service(SERVICE.into()),
        now,
        EventData::ReservationCommitted(reservation.clone()),
    )
    .with_id(reservation.reservation_id);
    match bus.publish(&envelope, Expect::LastSubjectSequence(0)).await {
        Ok(_) => Ok(CommitReply::Committed { reservation }),
        Err(BusError::Conflict(e)) => Err(format!("reservation id taken: {e}")),
        Err(e) => {
            tracing::warn!(error = %e, "cannot commit a reservation");
            Err("the event log is out of reach; retry shortly".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_starts_from_now_to_its_lead_limit() {
        let now: DateTime<Utc> = "2026-12-04T00:00:00Z".parse().unwrap();
        let request = |starts_at: DateTime<Utc>| CommitRequest {
            tenant_id: Uuid::from_u128(1),
            gpu_model: lh_events::fixtures::MODEL.into(),
            zone: "z".into(),
            gpus: 1,
            term_days: None,
            starts_at: Some(starts_at),
            requested_by: None,
        };
        let limit = now + chrono::Duration::days(i64::from(MAX_LEAD_DAYS));
        assert!(reservation(request(limit), Uuid::from_u128(2), now).is_ok());
        let too_far = reservation(
            request(limit + chrono::Duration::seconds(1)),
            Uuid::from_u128(2),
            now,
        );
        assert_eq!(too_far.unwrap_err().0, "starts_at");
        let years = "9999-12-31T00:00:00Z".parse().unwrap();
        assert!(reservation(request(years), Uuid::from_u128(2), now).is_err());
    }
}
