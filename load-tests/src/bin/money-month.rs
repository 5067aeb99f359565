//! A month of lease events priced into invoices by pricing's own charges
//! fold and ledger, in one process without servers (see
//! `lh_load_tests::money_month` for the generated month). Prints events/s,
//! the process's peak memory, charges and invoices.
//!
//! `cargo run --release -p lh-load-tests --bin money-month -- --events 1000000`

use std::time::Instant;

use clap::Parser;
use lh_load_tests::money_month::{run, MonthSpec, MAX_LEASE_EVENTS};

#[derive(Parser)]
struct Args {
    /// Lease events to generate and price (at most 20,000,000).
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Tenants the leases are spread over.
    #[arg(long, default_value_t = 500)]
    tenants: u32,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// VmHWM (peak resident memory) of this process, kB.
fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.events <= MAX_LEASE_EVENTS,
        "--events: at most {MAX_LEASE_EVENTS}"
    );
    let spec = MonthSpec {
        lease_events: args.events,
        tenants: args.tenants,
        seed: args.seed,
    };
    let t = Instant::now();
    let outcome = run(&spec, |n| eprintln!("{n} lease events read"));
    let seconds = t.elapsed().as_secs_f64();
    println!(
        "lease_events={} leases={} spot_prices={} seconds={seconds:.1} events_per_s={:.0}",
        outcome.lease_events,
        outcome.leases,
        outcome.spot_prices,
        outcome.lease_events as f64 / seconds
    );
    println!(
        "charges={} on_second_book={} invoices={} tenants_charged={} open_leases={}",
        outcome.charges,
        outcome.charges_on_second_book,
        outcome.invoices,
        outcome.tenants_charged,
        outcome.open_leases
    );
    println!(
        "charged_cny={} invoiced_cny={} peak_rss_mb={:.1}",
        outcome.charged_cny,
        outcome.invoiced_cny,
        peak_rss_kb().unwrap_or(0) as f64 / 1024.0
    );
    println!(
        "what_if_same_book_mismatches={} what_if_second_book_cny={} what_if_seconds={:.2}",
        outcome.what_if_same_book_mismatches,
        outcome.what_if_second_book_cny,
        outcome.what_if_seconds
    );
    anyhow::ensure!(
        outcome.charged_cny == outcome.invoiced_cny
            && outcome.open_leases == 0
            && outcome.what_if_same_book_mismatches == 0,
        "the invoices do not add up to the charges, leases were left uncharged, or what-if priced a charge unlike billing"
    );
    Ok(())
}
