//! Tests of the ledger: issuing, parts, notes, credits and snapshots.

use chrono::{DateTime, Utc};
use lh_bus::Expect;
use lh_events::{Actor, Envelope, EventData, InvoiceIssued, InvoiceNoteIssued, NoteKind};
use lh_rpc::invoice_document::{money, Credit, InvoiceDocument, Line};
use lh_service::decider::Decider;
use rust_decimal::Decimal;
use uuid::Uuid;

use super::decider::*;
use super::fold::*;
use super::issue::*;
use super::sla::*;
use lh_events::{ChargeAccrued, DocumentLine, Tier};

const TENANT: Uuid = Uuid::from_u128(1);
const LEASE: Uuid = Uuid::from_u128(2);

fn at(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn charge(n: u128, from: &str, seconds: i64, amount: &str) -> Envelope {
    let from = at(from);
    envelope(
        from,
        Uuid::from_u128(100 + n),
        EventData::ChargeAccrued(ChargeAccrued {
            charge_id: Uuid::from_u128(100 + n),
            tenant_id: TENANT,
            lease_id: LEASE,
            period: period_of(from),
            tier: Tier::Basic,
            gpus: 1,
            vram_gb: 80,
            from,
            to: from + chrono::Duration::seconds(seconds),
            billed_seconds: seconds as u64,
            unit_price_cny_per_gb_hour: "0.5".parse().unwrap(),
            amount: amount.parse().unwrap(),
            currency: "CNY".into(),
            price_book_version: 1,
            age_seconds: None,
            priced_gb_seconds: None,
            reservation_id: None,
        }),
    )
}

/// Appends what the ledger decides, as the loop would, at `next` on.
fn store(ledger: &mut Ledger, next: &mut u64, now: DateTime<Utc>) -> Vec<Envelope> {
    let mut out = Vec::new();
    for batch in ledger.decide(now) {
        for (env, expect) in batch {
            if let (
                EventData::InvoiceIssued(_) | EventData::InvoiceNoteIssued(_),
                Expect::LastSubjectSequence(s),
            ) = (&env.data, expect)
            {
                assert!(s <= ledger.ledger_sequence);
            }
            *next += 1;
            ledger.apply(*next, &env);
            out.push(env);
        }
    }
    out
}

/// The one invoice among `out`.
fn only_invoice(out: &[Envelope]) -> &InvoiceIssued {
    match out {
        [Envelope {
            data: EventData::InvoiceIssued(invoice),
            ..
        }] => invoice,
        other => panic!("{other:?}"),
    }
}

/// The one note among `out`.
fn only_note(out: &[Envelope]) -> &InvoiceNoteIssued {
    match out {
        [Envelope {
            data: EventData::InvoiceNoteIssued(note),
            ..
        }] => note,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_month_is_issued_after_its_grace_and_late_charges_go_on_a_note() {
    let mut ledger = Ledger::new(chrono::Duration::hours(1));
    ledger.apply_stored(
        1,
        Utc::now(),
        &charge(1, "2026-11-03T01:00:00Z", 3600, "40.00"),
    );
    ledger.apply_stored(
        2,
        Utc::now(),
        &charge(2, "2026-11-30T23:00:00Z", 3600, "40.00"),
    );
    let mut next = 2;
    assert!(store(&mut ledger, &mut next, at("2026-12-01T00:59:59Z")).is_empty());
    let issued = store(&mut ledger, &mut next, at("2026-12-01T01:00:00Z"));
    let invoice = only_invoice(&issued);
    assert_eq!(
        (invoice.number, invoice.total.to_string()),
        (1, "80.00".into())
    );
    assert_eq!(invoice.lines.len(), 1);
    assert_eq!(invoice.lines[0].charges, 2);
    assert!(InvoiceDocument::from_invoice(invoice).verify());
    // Nothing more to do, however often it is asked.
    assert!(store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z")).is_empty());
    // A correction arrives: a note, the invoice untouched.
    next += 1;
    ledger.apply_stored(
        next,
        Utc::now(),
        &charge(3, "2026-11-30T23:00:00Z", 0, "-5.00"),
    );
    let notes = store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z"));
    let note = only_note(&notes);
    assert_eq!(
        (note.number, note.kind, note.invoice_number),
        (1, NoteKind::Credit, 1)
    );
    assert_eq!(note.total.to_string(), "-5.00");
    assert_eq!(
        note.charges_after_sequence,
        invoice.charges_through_sequence
    );
    assert!(InvoiceDocument::from_note(note).verify());
    assert!(store(&mut ledger, &mut next, at("2026-12-03T00:00:00Z")).is_empty());
}

#[test]
fn a_charge_stored_while_the_invoice_was_decided_is_not_lost() {
    // Another replica issued through sequence 1; a charge stored at 2
    // came before its invoice (at 3) in the log.
    let mut other = Ledger::new(chrono::Duration::zero());
    other.apply_stored(
        1,
        Utc::now(),
        &charge(1, "2026-11-03T01:00:00Z", 3600, "1.00"),
    );
    let issued = other
        .decide(at("2026-12-01T00:00:00Z"))
        .remove(0)
        .remove(0)
        .0;
    let mut ledger = Ledger::new(chrono::Duration::zero());
    ledger.apply_stored(
        1,
        Utc::now(),
        &charge(1, "2026-11-03T01:00:00Z", 3600, "1.00"),
    );
    ledger.apply_stored(
        2,
        Utc::now(),
        &charge(2, "2026-11-03T02:00:00Z", 3600, "2.00"),
    );
    ledger.apply_stored(3, Utc::now(), &issued);
    let mut next = 3;
    let notes = store(&mut ledger, &mut next, at("2026-12-01T00:00:01Z"));
    let note = only_note(&notes);
    assert_eq!(
        (note.total.to_string(), note.kind),
        ("2.00".into(), NoteKind::Debit)
    );
    assert_eq!(
        (note.charges_after_sequence, note.charges_through_sequence),
        (1, 3)
    );
}

#[test]
fn numbers_follow_each_other_without_gaps() {
    let mut ledger = Ledger::new(chrono::Duration::zero());
    let mut next = 0;
    for (n, month) in ["2026-09", "2026-10", "2026-11"].iter().enumerate() {
        next += 1;
        let from = format!("{month}-02T00:00:00Z");
        ledger.apply_stored(next, Utc::now(), &charge(n as u128, &from, 60, "1.00"));
    }
    let issued = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    let numbers: Vec<u64> = issued
        .iter()
        .map(|e| match &e.data {
            EventData::InvoiceIssued(i) => i.number,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(numbers, [1, 2, 3]);
}

fn lease_event(data: EventData) -> Envelope {
    Envelope::new(Actor::Admin, Utc::now(), data)
}

/// A lease billed 100 hours in November and moved for `reason`, down
/// for 1 hour.
fn interrupted(reason: &str) -> Ledger {
    let mut ledger = Ledger::new(chrono::Duration::zero());
    let request = lh_events::fixtures::whole_request(LEASE, TENANT, 1, lh_events::fixtures::MODEL);
    let migrated = lh_events::LeaseMigrated {
        lease_id: LEASE,
        reason: reason.into(),
        from_node_id: "n1".into(),
        from_gpu_indices: vec![0],
        billing_ends_at: at("2026-11-10T00:00:00Z"),
        to: None,
    };
    let started = lh_events::fixtures::started(LEASE, "n2", at("2026-11-10T01:00:00Z"));
    for (sequence, event) in [
        lease_event(EventData::LeaseRequested(request)),
        charge(1, "2026-11-02T00:00:00Z", 360_000, "100.00"),
        lease_event(EventData::LeaseMigrated(migrated)),
        lease_event(EventData::LeaseStarted(started)),
    ]
    .iter()
    .enumerate()
    {
        ledger.apply_stored(sequence as u64 + 1, Utc::now(), event);
    }
    ledger
}

#[test]
fn a_drain_is_no_failure() {
    let mut ledger = interrupted(&lh_domain::moves::node_drained("n1"));
    let mut next = 4;
    let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    assert!(matches!(
        &out[..],
        [Envelope {
            data: EventData::InvoiceIssued(_),
            ..
        }]
    ));
    // A node that happens to be named so is still lost.
    let mut ledger = interrupted("node drained lost");
    let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    assert!(
        matches!(&out[0].data, EventData::CreditGranted(_)),
        "{out:?}"
    );
}

#[test]
fn a_lost_node_below_the_sla_earns_a_credit_on_the_next_invoice() {
    // 100 hours billed, 1 hour down: 99.0099 % available.
    let mut ledger = interrupted("node n1 lost");
    let mut next = 4;
    let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    let EventData::CreditGranted(credit) = &out[0].data else {
        panic!("{out:?}");
    };
    assert_eq!(
        (credit.downtime_seconds, credit.lease_seconds),
        (3600, 363_600)
    );
    assert_eq!(credit.availability_percent.to_string(), "99.0099");
    assert_eq!(credit.share_percent, Decimal::from(10));
    assert_eq!(credit.amount.to_string(), "-10.00");
    assert_eq!(credit.applies_to_period, "2026-12");
    assert!(matches!(&out[1].data, EventData::InvoiceIssued(i) if i.credits.is_empty()));
    // December's invoice deducts it.
    next += 1;
    ledger.apply_stored(
        next,
        Utc::now(),
        &charge(9, "2026-12-02T00:00:00Z", 3600, "1.00"),
    );
    let out = store(&mut ledger, &mut next, at("2027-01-01T00:00:00Z"));
    let dec = only_invoice(&out);
    assert_eq!(dec.credits.len(), 1);
    assert_eq!(dec.total.to_string(), "-9.00");
    assert!(store(&mut ledger, &mut next, at("2027-02-01T00:00:00Z")).is_empty());
}

#[test]
fn a_gang_is_down_until_its_last_member_starts_again() {
    // A gang of two down at 00:00 (a member's node lost), placed again on
    // n2 and n3: n2 starts at 03:00, n3 at 01:00, in that order on the
    // log. Down 3 hours, not 1.
    let mut ledger = Ledger::new(chrono::Duration::zero());
    let request = lh_events::fixtures::whole_request(LEASE, TENANT, 16, lh_events::fixtures::MODEL);
    let migrated = lh_events::LeaseMigrated {
        lease_id: LEASE,
        reason: "node n1 lost".into(),
        from_node_id: "n1".into(),
        from_gpu_indices: vec![0],
        billing_ends_at: at("2026-11-10T00:00:00Z"),
        to: None,
    };
    let all = [0, 1, 2, 3, 4, 5, 6, 7];
    let mut placed =
        lh_events::fixtures::placed(LEASE, "n2", "z", lh_events::fixtures::MODEL, 40, &all);
    placed.members = ["n2", "n3"]
        .into_iter()
        .map(|n| lh_events::LeaseMember {
            node_id: n.to_string(),
            zone: "z".into(),
            address: format!("{n}.example"),
            gpus: placed.gpus.clone(),
        })
        .collect();
    for (sequence, event) in [
        lease_event(EventData::LeaseRequested(request)),
        charge(1, "2026-11-02T00:00:00Z", 360_000, "100.00"),
        lease_event(EventData::LeaseMigrated(migrated)),
        lease_event(EventData::LeasePlaced(placed)),
        lease_event(EventData::LeaseStarted(lh_events::fixtures::started(
            LEASE,
            "n2",
            at("2026-11-10T03:00:00Z"),
        ))),
        lease_event(EventData::LeaseStarted(lh_events::fixtures::started(
            LEASE,
            "n3",
            at("2026-11-10T01:00:00Z"),
        ))),
    ]
    .iter()
    .enumerate()
    {
        ledger.apply_stored(sequence as u64 + 1, Utc::now(), event);
    }
    let mut next = 6;
    let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    let EventData::CreditGranted(credit) = &out[0].data else {
        panic!("{out:?}");
    };
    assert_eq!(credit.downtime_seconds, 3 * 3600, "{credit:?}");
    assert_eq!(credit.affected_charges.to_string(), "100.00");
}

fn per_lease_of(ledger: &Ledger, period: &str) -> usize {
    ledger.months[&(TENANT, period.to_string())].per_lease.len()
}

#[test]
fn a_month_lets_go_of_its_leases_once_its_credit_is_settled() {
    let mut ledger = interrupted("node n1 lost");
    let mut next = 4;
    // Issued and credited in one pass; the per-lease sums stay until the
    // credit is on the log.
    let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(per_lease_of(&ledger, "2026-11"), 1);
    assert!(store(&mut ledger, &mut next, at("2026-12-01T00:00:01Z")).is_empty());
    assert_eq!(per_lease_of(&ledger, "2026-11"), 0);

    // A lease down since before a month's end holds that month: its
    // downtime may still grow and earn a credit.
    let mut ledger = Ledger::new(chrono::Duration::zero());
    let request = lh_events::fixtures::whole_request(LEASE, TENANT, 1, lh_events::fixtures::MODEL);
    let migrated = lh_events::LeaseMigrated {
        lease_id: LEASE,
        reason: "node n1 lost".into(),
        from_node_id: "n1".into(),
        from_gpu_indices: vec![0],
        billing_ends_at: at("2026-11-30T23:00:00Z"),
        to: None,
    };
    for (sequence, event) in [
        lease_event(EventData::LeaseRequested(request)),
        charge(1, "2026-11-02T00:00:00Z", 360_000, "100.00"),
        lease_event(EventData::LeaseMigrated(migrated)),
    ]
    .iter()
    .enumerate()
    {
        ledger.apply_stored(sequence as u64 + 1, Utc::now(), event);
    }
    let mut next = 3;
    // 1 hour down of 101 by the month's end: a credit at once, and the
    // lease still down holds the month.
    let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    assert!(
        matches!(&out[0].data, EventData::CreditGranted(_)),
        "{out:?}"
    );
    store(&mut ledger, &mut next, at("2026-12-01T00:00:01Z"));
    assert_eq!(per_lease_of(&ledger, "2026-11"), 1);
    // Running again: nothing more can land in November.
    next += 1;
    let started = lh_events::fixtures::started(LEASE, "n2", at("2026-12-01T02:00:00Z"));
    ledger.apply_stored(
        next,
        Utc::now(),
        &lease_event(EventData::LeaseStarted(started)),
    );
    store(&mut ledger, &mut next, at("2026-12-01T03:00:00Z"));
    assert_eq!(per_lease_of(&ledger, "2026-11"), 0);
}

#[test]
fn a_gpu_turned_unhealthy_interrupts_its_lease_like_a_lost_node() {
    // What the scheduler writes when a lease's GPU fails (an XID 79, a
    // failed self-test): the lease is moved, down until it runs again.
    let mut ledger = interrupted(&lh_domain::moves::gpu_unhealthy(0, "n1"));
    let mut next = 4;
    let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    let EventData::CreditGranted(credit) = &out[0].data else {
        panic!("{out:?}");
    };
    assert_eq!(credit.downtime_seconds, 3600);
    assert_eq!(credit.amount.to_string(), "-10.00");
}

#[test]
fn a_reservations_commitment_does_not_dilute_the_availability() {
    let mut ledger = interrupted(&lh_domain::moves::node_lost("n1"));
    let reservation = Uuid::from_u128(50);
    let mut commitment = charge(7, "2026-11-01T00:00:00Z", 10_000_000, "500.00");
    if let EventData::ChargeAccrued(c) = &mut commitment.data {
        (c.lease_id, c.reservation_id, c.tier) = (reservation, Some(reservation), Tier::Reserved);
    }
    ledger.apply_stored(5, Utc::now(), &commitment);
    let mut next = 5;
    let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    let EventData::CreditGranted(credit) = &out[0].data else {
        panic!("{out:?}");
    };
    assert_eq!(credit.availability_percent.to_string(), "99.0099");
    assert_eq!(credit.amount.to_string(), "-10.00");
    // It is on the invoice all the same.
    let EventData::InvoiceIssued(invoice) = &out[1].data else {
        panic!("{out:?}");
    };
    assert_eq!(invoice.total.to_string(), "600.00");
}

#[test]
fn issued_months_older_than_what_the_log_holds_are_forgotten() {
    let mut ledger = interrupted(&lh_domain::moves::node_lost("n1"));
    let mut next = 4;
    let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(ledger.months.contains_key(&(TENANT, "2026-11".into())));
    // December's invoice deducts the credit; 13 months on, November
    // and its downtime are gone, and nothing is issued again.
    assert_eq!(oldest_kept(at("2027-12-15T00:00:00Z")), "2026-11");
    assert!(store(&mut ledger, &mut next, at("2027-12-15T00:00:00Z")).len() == 1);
    assert!(store(&mut ledger, &mut next, at("2028-01-01T00:00:00Z")).is_empty());
    assert!(!ledger.months.contains_key(&(TENANT, "2026-11".into())));
    assert!(ledger.downtime.is_empty() && ledger.credited.is_empty());
    assert_eq!(ledger.last_invoice_number, 2);
}

#[test]
fn the_credit_bands() {
    let p = |s: &str| share_percent(s.parse().unwrap()).map(|d| d.to_string());
    assert_eq!(p("99.95"), None);
    assert_eq!(p("99.9499"), Some("10".into()));
    assert_eq!(p("99.0"), Some("10".into()));
    assert_eq!(p("98.9999"), Some("30".into()));
    assert_eq!(p("94.9"), Some("100".into()));
    assert_eq!(next_period("2026-12").as_deref(), Some("2027-01"));
    assert_eq!(
        split_by_month(
            LEASE,
            at("2026-11-30T23:00:00Z"),
            at("2026-12-01T01:00:00Z")
        )
        .len(),
        2
    );
}

/// A charge of an hour on lease `lease`.
fn lease_charge(n: u128, lease: u128, from: &str, amount: &str) -> Envelope {
    let mut envelope = charge(n, from, 3600, amount);
    if let EventData::ChargeAccrued(c) = &mut envelope.data {
        c.lease_id = Uuid::from_u128(1_000_000 + lease);
    }
    envelope
}

/// A ledger that read one charge of each of `leases` leases in
/// November (1.00 each, but 2.50 for every seventh lease), through
/// sequence `leases`; and their sum.
fn busy_november(leases: u128) -> (Ledger, Decimal) {
    let mut ledger = Ledger::new(chrono::Duration::zero());
    let mut sum = Decimal::ZERO;
    for n in 0..leases {
        let amount = if n % 7 == 0 { "2.50" } else { "1.00" };
        sum += amount.parse::<Decimal>().unwrap();
        let from = format!("2026-11-{:02}T{:02}:00:00Z", 1 + n % 28, n % 24);
        ledger.apply_stored(n as u64 + 1, Utc::now(), &lease_charge(n, n, &from, amount));
    }
    (ledger, sum)
}

fn invoices_of(out: &[Envelope]) -> Vec<&InvoiceIssued> {
    out.iter()
        .map(|e| match &e.data {
            EventData::InvoiceIssued(i) => i,
            other => panic!("{other:?}"),
        })
        .collect()
}

fn notes_of(out: &[Envelope]) -> Vec<&InvoiceNoteIssued> {
    out.iter()
        .map(|e| match &e.data {
            EventData::InvoiceNoteIssued(n) => n,
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn a_month_with_more_lines_than_one_event_holds_is_issued_in_parts() {
    let (mut ledger, sum) = busy_november(4_500);
    let credit = Credit {
        credit_id: Uuid::from_u128(77),
        period: "2026-10".into(),
        amount: "-3.00".parse().unwrap(),
    };
    ledger
        .pending_credits
        .insert((TENANT, "2026-11".into()), vec![credit.clone()]);
    let mut next = 4_500;
    let out = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    let parts = invoices_of(&out);
    let shape: Vec<_> = parts
        .iter()
        .map(|p| (p.number, p.part, p.parts, p.lines.len(), p.credits.len()))
        .collect();
    assert_eq!(
        shape,
        [(1, 1, 3, 2000, 0), (2, 2, 3, 2000, 0), (3, 3, 3, 500, 1)]
    );
    let first = lh_rpc::invoice_document::invoice_id(TENANT, "2026-11");
    assert_eq!(parts[0].invoice_id, first);
    assert_eq!(parts[0].first_part_id, None);
    for p in &parts[1..] {
        assert_eq!(p.first_part_id, Some(first));
        assert_ne!(p.invoice_id, first);
    }
    // One issue: the same charges read, at the same instant.
    assert!(parts
        .iter()
        .all(|p| p.charges_through_sequence == 4_500 && p.issued_at == parts[0].issued_at));
    // Each part's total is its own; together they are the month's.
    let total: Decimal = parts.iter().map(|p| p.total).sum();
    assert_eq!(total, sum + credit.amount);
    for p in &parts {
        let document = InvoiceDocument::from_invoice(p);
        assert!(document.verify(), "{:?}", document.number);
        assert_eq!(
            p.total,
            money(
                p.lines.iter().map(|l| l.amount).sum::<Decimal>()
                    + p.credits.iter().map(|c| c.amount).sum::<Decimal>()
            )
        );
    }
    assert_eq!(
        InvoiceDocument::from_invoice(parts[1])
            .shown_number()
            .as_deref(),
        Some("INV-000002 (part 2 of 3)")
    );
    // The lines in the order one document would have them.
    let whole = Ledger::lines_of(&busy_november(4_500).0.months[&(TENANT, "2026-11".into())].open);
    let split: Vec<Line> = parts.iter().flat_map(|p| p.lines.iter().cloned()).collect();
    assert_eq!(split, whole);
    assert_eq!(
        ledger.months[&(TENANT, "2026-11".into())].issued,
        Some((first, 1))
    );
    assert!(ledger.pending_credits.is_empty());
    assert!(store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z")).is_empty());
    // A late charge: a note of the first part.
    next += 1;
    ledger.apply_stored(
        next,
        Utc::now(),
        &lease_charge(9_000, 1, "2026-11-30T00:00:00Z", "4.00"),
    );
    let notes = store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z"));
    let note = only_note(&notes);
    assert_eq!((note.invoice_id, note.invoice_number), (first, 1));
    assert_eq!((note.part, note.parts), (1, 1));
}

#[test]
fn a_half_issued_invoice_is_completed_with_the_parts_it_lacks() {
    let (mut ledger, _) = busy_november(4_500);
    let now = at("2026-12-01T00:00:00Z");
    let decided: Vec<Envelope> = ledger
        .decide(now)
        .into_iter()
        .flatten()
        .map(|(e, _)| e)
        .collect();
    assert_eq!(decided.len(), 3);
    // Stored: the first part, and a charge after it; then a restart.
    let (mut restarted, _) = busy_november(4_500);
    restarted.apply_stored(4_501, Utc::now(), &decided[0]);
    restarted.apply_stored(
        4_502,
        Utc::now(),
        &lease_charge(9_000, 1, "2026-11-30T00:00:00Z", "4.00"),
    );
    let mut next = 4_502;
    let later = at("2026-12-01T05:00:00Z");
    let mut out = store(&mut restarted, &mut next, later);
    // The two missing parts as they were decided (ids, numbers,
    // lines, hashes)...
    assert_eq!(out.len(), 2);
    for (again, first) in out.iter().zip(&decided[1..]) {
        assert_eq!(again.id, first.id);
        assert!(again.data == first.data, "part {:?} differs", again.id);
    }
    // ...then, the invoice whole, the late charge's note.
    out.extend(store(&mut restarted, &mut next, later));
    let note = only_note(&out[2..]);
    assert_eq!(note.charges_after_sequence, 4_500);
    assert_eq!(note.total.to_string(), "4.00");
    assert!(store(&mut restarted, &mut next, later).is_empty());
    // A fold of the whole log decides nothing more.
    let (mut refolded, _) = busy_november(4_500);
    let mut sequence = 4_500;
    for event in decided[..1]
        .iter()
        .chain(std::iter::once(&lease_charge(
            9_000,
            1,
            "2026-11-30T00:00:00Z",
            "4.00",
        )))
        .chain(&out)
    {
        sequence += 1;
        refolded.apply_stored(sequence, Utc::now(), event);
    }
    assert!(refolded.decide(later).is_empty());
    assert_eq!(refolded.last_invoice_number, 3);
    assert_eq!(refolded.last_note_number, 1);
}

/// A ledger taken back from its snapshot, as stored and read again,
/// under a grace of its own.
fn restarted_from_snapshot(ledger: &Ledger, grace: chrono::Duration) -> Ledger {
    let stored = serde_json::to_vec(&ledger.snapshot().expect("a snapshot")).unwrap();
    let mut restarted = Ledger::new(grace);
    assert!(restarted
        .restore(&serde_json::from_slice::<Box<serde_json::value::RawValue>>(&stored).unwrap()));
    restarted
}

fn decided(out: &[Envelope]) -> Vec<(Uuid, &EventData)> {
    out.iter().map(|e| (e.id, &e.data)).collect()
}

#[test]
fn a_ledger_started_from_its_snapshot_decides_what_the_fold_decides() {
    // A lost node's downtime, a month to issue and a credit to grant.
    let mut folded = interrupted("node n1 lost");
    let mut restarted = restarted_from_snapshot(&folded, chrono::Duration::zero());
    let (mut next_folded, mut next_restarted) = (4, 4);
    let now = at("2026-12-01T00:00:00Z");
    let out = store(&mut folded, &mut next_folded, now);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(
        decided(&out),
        decided(&store(&mut restarted, &mut next_restarted, now))
    );
    // The credit waits in both for December's invoice.
    let december = charge(9, "2026-12-02T00:00:00Z", 3600, "1.00");
    for (ledger, next) in [
        (&mut folded, &mut next_folded),
        (&mut restarted, &mut next_restarted),
    ] {
        *next += 1;
        ledger.apply_stored(*next, Utc::now(), &december);
    }
    let restarted = &mut restarted_from_snapshot(&restarted, chrono::Duration::zero());
    // Read twice (a replay after a restatement): counted once by both.
    for (ledger, next) in [
        (&mut folded, &mut next_folded),
        (&mut *restarted, &mut next_restarted),
    ] {
        *next += 1;
        ledger.apply_stored(*next, Utc::now(), &december);
    }
    let later = at("2027-01-01T00:00:00Z");
    let out = store(&mut folded, &mut next_folded, later);
    assert_eq!(only_invoice(&out).total.to_string(), "-9.00");
    assert_eq!(
        decided(&out),
        decided(&store(restarted, &mut next_restarted, later))
    );
}

#[test]
fn a_snapshot_taken_mid_way_through_a_document_in_parts_completes_it_alike() {
    let (mut ledger, _) = busy_november(4_500);
    let now = at("2026-12-01T00:00:00Z");
    let parts: Vec<Envelope> = ledger
        .decide(now)
        .into_iter()
        .flatten()
        .map(|(e, _)| e)
        .collect();
    assert_eq!(parts.len(), 3);
    // The first part is stored, then the replica stops.
    ledger.apply_stored(4_501, Utc::now(), &parts[0]);
    let mut restarted = restarted_from_snapshot(&ledger, chrono::Duration::zero());
    let (mut a, mut b) = (4_501, 4_501);
    let out = store(&mut restarted, &mut b, now);
    assert_eq!(decided(&out), decided(&parts[1..]));
    assert_eq!(decided(&out), decided(&store(&mut ledger, &mut a, now)));
    assert_eq!(
        (restarted.last_invoice_number, restarted.read_through),
        (ledger.last_invoice_number, ledger.read_through)
    );
}

#[test]
fn the_grace_is_the_replicas_own_not_the_snapshots() {
    let mut ledger = Ledger::new(chrono::Duration::zero());
    ledger.apply_stored(
        1,
        Utc::now(),
        &charge(1, "2026-11-03T01:00:00Z", 3600, "40.00"),
    );
    let mut restarted = restarted_from_snapshot(&ledger, chrono::Duration::days(2));
    let mut next = 1;
    let now = at("2026-12-01T12:00:00Z");
    assert_eq!(store(&mut ledger, &mut next, now).len(), 1);
    assert!(store(&mut restarted, &mut next, now).is_empty());
    assert_eq!(
        store(&mut restarted, &mut next, at("2026-12-03T00:00:00Z")).len(),
        1
    );
}

#[test]
fn a_snapshot_of_another_shape_is_refused() {
    let mut ledger = Ledger::new(chrono::Duration::zero());
    let other = serde_json::json!({"months": {"not": "pairs"}});
    assert!(!ledger.restore(&serde_json::value::to_raw_value(&other).unwrap()));
    assert!(ledger.months.is_empty());
}

#[test]
fn a_note_with_more_lines_than_one_event_holds_is_issued_in_parts() {
    let mut ledger = Ledger::new(chrono::Duration::zero());
    ledger.apply_stored(
        1,
        Utc::now(),
        &charge(1, "2026-11-03T01:00:00Z", 3600, "1.00"),
    );
    let mut next = 1;
    let invoice = store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z"));
    let invoice = only_invoice(&invoice).clone();
    for n in 0..2_500u128 {
        next += 1;
        ledger.apply_stored(
            next,
            Utc::now(),
            &lease_charge(10 + n, n, "2026-11-20T00:00:00Z", "-0.10"),
        );
    }
    let through = next;
    // Stored: the first part only; then a restart completes the note.
    let decided: Vec<Envelope> = ledger
        .decide(at("2026-12-02T00:00:00Z"))
        .into_iter()
        .flatten()
        .map(|(e, _)| e)
        .collect();
    let notes = notes_of(&decided);
    let shape: Vec<_> = notes
        .iter()
        .map(|n| (n.number, n.part, n.parts, n.lines.len(), n.kind))
        .collect();
    assert_eq!(
        shape,
        [
            (1, 1, 2, 2000, NoteKind::Credit),
            (2, 2, 2, 500, NoteKind::Credit)
        ]
    );
    for n in &notes {
        assert_eq!((n.invoice_id, n.invoice_number), (invoice.invoice_id, 1));
        assert_eq!(
            (n.charges_after_sequence, n.charges_through_sequence),
            (1, through)
        );
        assert!(InvoiceDocument::from_note(n).verify());
    }
    assert_eq!(notes[1].first_part_id, Some(notes[0].note_id));
    let total: Decimal = notes.iter().map(|n| n.total).sum();
    assert_eq!(total.to_string(), "-250.00");
    next += 1;
    ledger.apply_stored(next, Utc::now(), &decided[0]);
    let out = store(&mut ledger, &mut next, at("2026-12-03T00:00:00Z"));
    assert_eq!(out.len(), 1);
    assert!(out[0].data == decided[1].data);
    assert!(store(&mut ledger, &mut next, at("2026-12-03T00:00:00Z")).is_empty());
}

/// An hour of a lease a reservation covered: 0.00.
fn covered(n: u128, from: &str) -> Envelope {
    let mut envelope = charge(n, from, 3600, "0.00");
    if let EventData::ChargeAccrued(c) = &mut envelope.data {
        (c.tier, c.reservation_id) = (Tier::Reserved, Some(Uuid::from_u128(50)));
    }
    envelope
}

#[test]
fn covered_hours_after_the_invoice_make_no_note_by_themselves() {
    let mut log = vec![charge(1, "2026-11-03T01:00:00Z", 3600, "1.00")];
    let mut ledger = Ledger::new(chrono::Duration::zero());
    ledger.apply_stored(1, Utc::now(), &log[0]);
    let mut next = 1;
    log.extend(store(&mut ledger, &mut next, at("2026-12-01T00:00:00Z")));
    assert_eq!(log.len(), 2);
    for (n, from) in [(2, "2026-11-30T22:00:00Z"), (3, "2026-11-30T23:00:00Z")] {
        next += 1;
        log.push(covered(n, from));
        ledger.apply_stored(next, Utc::now(), &covered(n, from));
    }
    assert!(store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z")).is_empty());
    // Refolded from the log after a restart: still none.
    let refold = |log: &[Envelope]| {
        let mut ledger = Ledger::new(chrono::Duration::zero());
        for (i, e) in log.iter().enumerate() {
            ledger.apply_stored(i as u64 + 1, Utc::now(), e);
        }
        ledger
    };
    assert!(refold(&log).decide(at("2026-12-02T00:00:00Z")).is_empty());
    // A charge that costs something: its note carries the covered
    // hours too.
    next += 1;
    let late = charge(4, "2026-11-30T21:00:00Z", 3600, "2.00");
    log.push(late.clone());
    ledger.apply_stored(next, Utc::now(), &late);
    let out = store(&mut ledger, &mut next, at("2026-12-02T00:00:00Z"));
    let note = only_note(&out);
    assert_eq!(note.total.to_string(), "2.00");
    assert_eq!(note.charges_after_sequence, 1);
    let charges: u64 = note.lines.iter().map(|l| l.charges).sum();
    assert_eq!(charges, 3);
    assert!(note
        .lines
        .iter()
        .any(|l| l.tier == "reserved" && l.amount.is_zero()));
    log.extend(out);
    assert!(refold(&log).decide(at("2026-12-03T00:00:00Z")).is_empty());
    // Covered hours left open do not keep a month from being forgotten.
    next += 1;
    ledger.apply_stored(next, Utc::now(), &covered(5, "2026-11-30T20:00:00Z"));
    assert!(store(&mut ledger, &mut next, at("2028-01-01T00:00:00Z")).is_empty());
    assert!(!ledger.months.contains_key(&(TENANT, "2026-11".into())));
}

#[test]
fn a_full_part_of_the_longest_lines_fits_in_one_message() {
    // The broker's limit, as deployed and as the tests run it.
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let max_payload = ["deploy/nats/nats.conf", "dev/nats.conf"]
        .iter()
        .map(|file| {
            let conf = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
            conf.lines()
                .find_map(|l| l.trim().strip_prefix("max_payload:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or_else(|| panic!("no max_payload in {file}"))
        })
        .min()
        .unwrap();
    let instant = at("2026-11-30T23:59:59.999999Z");
    let line = DocumentLine {
        lease_id: Uuid::from_u128(u128::MAX),
        tier: Tier::Performance.as_str().into(),
        price_book_version: u32::MAX,
        charges: u64::MAX,
        billed_seconds: u64::MAX,
        from: instant,
        to: instant,
        amount: "-99999999999.99".parse().unwrap(),
    };
    let invoice = InvoiceIssued {
        invoice_id: Uuid::from_u128(u128::MAX),
        number: u64::MAX,
        tenant_id: Uuid::from_u128(u128::MAX),
        period: "2026-11".into(),
        currency: "CNY".into(),
        issued_at: instant,
        charges_through_sequence: u64::MAX,
        lines: vec![line; MAX_LINES_PER_DOCUMENT],
        credits: Vec::new(),
        total: "-99999999999.99".parse().unwrap(),
        content_hash: "f".repeat(64),
        part: MAX_PARTS_PER_DOCUMENT as u32,
        parts: MAX_PARTS_PER_DOCUMENT as u32,
        first_part_id: Some(Uuid::from_u128(u128::MAX)),
    };
    let bytes = envelope(
        instant,
        Uuid::from_u128(1),
        EventData::InvoiceIssued(invoice),
    )
    .to_json()
    .len();
    // A margin for the headers and what an envelope may gain.
    assert!(bytes * 4 < max_payload * 3, "{bytes} of {max_payload}");
}

#[test]
fn storage_charges_are_a_line_of_their_own_in_the_invoice_total() {
    let mut ledger = Ledger::new(chrono::Duration::hours(1));
    ledger.apply_stored(
        1,
        Utc::now(),
        &charge(1, "2026-11-03T01:00:00Z", 3600, "40.00"),
    );
    let storage = |n: u128, from: &str, amount: &str| {
        let from = at(from);
        envelope(
            from,
            Uuid::from_u128(200 + n),
            EventData::StorageChargeAccrued(lh_events::StorageChargeAccrued {
                charge_id: Uuid::from_u128(200 + n),
                tenant_id: TENANT,
                storage_id: lh_events::storage_id(TENANT),
                period: period_of(from),
                from,
                to: from + chrono::Duration::hours(1),
                bytes: 5_000_000_000,
                billed_seconds: 3600,
                price_cny_per_gb_month: "0.12".parse().unwrap(),
                amount: amount.parse().unwrap(),
                currency: "CNY".into(),
                price_book_version: 1,
                priced_byte_seconds: Decimal::ZERO,
            }),
        )
    };
    ledger.apply_stored(2, Utc::now(), &storage(1, "2026-11-03T01:00:00Z", "0.01"));
    ledger.apply_stored(3, Utc::now(), &storage(2, "2026-11-03T02:00:00Z", "0.00"));
    // Read twice: counted once.
    ledger.apply_stored(4, Utc::now(), &storage(2, "2026-11-03T02:00:00Z", "0.00"));
    ledger.apply_stored(5, Utc::now(), &storage(3, "2026-11-04T02:00:00Z", "0.01"));
    let mut next = 5;
    let issued = store(&mut ledger, &mut next, at("2026-12-01T01:00:00Z"));
    let invoice = only_invoice(&issued);
    assert_eq!(invoice.lines.len(), 2, "{:?}", invoice.lines);
    let line = invoice
        .lines
        .iter()
        .find(|l| l.tier == "storage")
        .expect("a storage line");
    assert_eq!(line.lease_id, lh_events::storage_id(TENANT));
    assert_eq!((line.charges, line.billed_seconds), (3, 3 * 3600));
    assert_eq!(line.amount.to_string(), "0.02");
    assert_eq!(invoice.total.to_string(), "40.02");
    assert!(InvoiceDocument::from_invoice(invoice).verify());
}
