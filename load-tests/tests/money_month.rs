//! The money benchmark's short version: a small month through the same
//! harness, so the benchmark cannot rot, and what it reports is checked.

use lh_load_tests::money_month::{run, MonthSpec};

#[test]
fn a_small_month_is_charged_whole_and_invoiced_to_the_cent() {
    let spec = MonthSpec {
        lease_events: 20_000,
        tenants: 20,
        seed: 7,
    };
    let outcome = run(&spec, |_| {});
    assert!(outcome.leases > 1_000, "{outcome:?}");
    assert!(outcome.spot_prices > 0, "{outcome:?}");
    assert_eq!(outcome.open_leases, 0, "every lease wholly charged");
    assert!(outcome.charges >= outcome.leases, "{outcome:?}");
    assert!(
        outcome.charges_on_second_book > 0 && outcome.charges_on_second_book < outcome.charges,
        "the mid-month book prices the leases started after it only: {outcome:?}"
    );
    assert_eq!(outcome.tenants_charged, 20);
    assert_eq!(outcome.invoices, 20, "one invoice per tenant and month");
    assert!(outcome.charged_cny > rust_decimal::Decimal::ZERO);
    assert_eq!(outcome.invoiced_cny, outcome.charged_cny);
    // What-if prices as billing does: on the book a charge used, the
    // same amount; on the mid-month book, another total.
    assert_eq!(outcome.what_if_same_book_mismatches, 0);
    assert_ne!(outcome.what_if_second_book_cny, outcome.charged_cny);
    // The same seed gives the same month.
    let again = run(&spec, |_| {});
    assert_eq!(again.charged_cny, outcome.charged_cny);
    assert_eq!(again.charges, outcome.charges);
}
