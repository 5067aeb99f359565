//! The flags of `lh report ...`: a week's cost, a day of the fleet. The
//! long help of `report daily` says what each part of the picture means.

use clap::{Args, Subcommand, ValueEnum};

/// `lh report ...`
#[derive(Debug, Clone, Subcommand)]
pub enum ReportCommand {
    /// Spend by tier in an ISO week, the same usage at the on-demand price,
    /// and the saving.
    Cost(ReportCost),
    /// One UTC day of the fleet as a picture and numbers (operator token).
    #[command(long_about = DAILY_LONG_ABOUT)]
    Daily(ReportDaily),
}

const DAILY_LONG_ABOUT: &str = "\
One UTC day of the fleet, written to --out as HTML (the picture inline and \
the numbers as tables), SVG or PNG, chosen by the file's extension. Reads \
the log through GET /v1/audit/events (the admin or auditor token) and the \
usage through GET /v1/usage.

What it shows (times are UTC; an hour is [hh:00, hh+1:00)):
  - VRAM heat map: one row per GPU, one cell per hour; a cell is the \
average VRAM used on the GPU in that hour (each lease's average, summed \
over the leases on it) as % of the GPU's memory; 0 where nothing was used.
  - Timeline: one bar per lease run per GPU, coloured by tenant or tier; \
a triangle where a spot lease was preempted, a diamond where a lease failed \
over.
  - Per model and zone: idle rate, the share of GPU-hours in which no lease \
held the GPU; utilisation, the average of the GPU's utilisation over the \
leased GPU-hours that had a figure.
  - Peak hours: the 3 hours with the most GPUs leased.
  - Queue wait: request to first start of the leases requested that day, \
mean and p95 against the 15 s target.
  - Availability: 1 - interrupted / (run + interrupted) lease-seconds, \
against 99.95 %. An interruption runs from a failover (a lost node or an \
unhealthy GPU; the move's billing end) to the lease's next start or its \
end. Drains, preemptions, suspensions and stops are not interruptions.

With --tenant only that tenant's leases and usage count; the heat map \
still has a row for every GPU.";

/// `lh report daily`
#[derive(Debug, Clone, Args)]
pub struct ReportDaily {
    /// The day, `YYYY-MM-DD` (UTC); yesterday by default.
    #[arg(long, value_name = "YYYY-MM-DD")]
    pub date: Option<chrono::NaiveDate>,
    /// Only this tenant's leases and usage (every GPU still shows).
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
    /// Where to write: `.html`, `.svg` or `.png`.
    #[arg(long, value_name = "FILE")]
    pub out: std::path::PathBuf,
    /// What colours the timeline's bars.
    #[arg(long = "colour-by", value_enum, default_value_t = ReportColourBy::Tenant)]
    pub colour_by: ReportColourBy,
}

/// What colours the bars of `lh report daily`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportColourBy {
    Tenant,
    Tier,
}

/// `lh report cost`
#[derive(Debug, Clone, Args)]
pub struct ReportCost {
    /// ISO week, `YYYY-Www` (`2026-W49`).
    #[arg(long, value_name = "YYYY-Www", value_parser = parse_week)]
    pub week: String,
    /// Whose (admin token only; default: your own).
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
    /// Print CSV instead of a table.
    #[arg(long)]
    pub csv: bool,
}

/// Accepts an ISO week, `YYYY-Www` with a week from 01 to 53.
fn parse_week(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let shape_ok = bytes.len() == 8
        && &bytes[4..6] == b"-W"
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[6..].iter().all(u8::is_ascii_digit);
    let week: u8 = if shape_ok {
        s[6..].parse().unwrap_or(0)
    } else {
        0
    };
    if !(1..=53).contains(&week) {
        return Err(format!(
            "expected an ISO week YYYY-Www (2026-W49), got `{s}`"
        ));
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::cli::Command;
    use crate::args::test_parse::parse;
    use clap::error::ErrorKind;

    #[test]
    fn report_cost_checks_the_week() {
        let cli = parse(&[
            "report", "cost", "--week", "2026-W49", "--tenant", "T", "--csv",
        ])
        .unwrap();
        let Command::Report(ReportCommand::Cost(r)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(
            (r.week.as_str(), r.tenant.as_deref(), r.csv),
            ("2026-W49", Some("T"), true)
        );
        for bad in [
            "2026-49",
            "2026-W54",
            "2026-W00",
            "2026-W4",
            "2026-w49",
            "２０２６-W49",
            "abc€49",
        ] {
            let e = parse(&["report", "cost", "--week", bad]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{bad}");
        }
    }

    #[test]
    fn report_daily_takes_a_day_a_file_and_a_colouring() {
        let cli = parse(&[
            "report",
            "daily",
            "--date",
            "2026-12-03",
            "--out",
            "day.png",
            "--colour-by",
            "tier",
        ])
        .unwrap();
        let Command::Report(ReportCommand::Daily(d)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(d.date, chrono::NaiveDate::from_ymd_opt(2026, 12, 3));
        assert_eq!(
            (d.out.to_str(), d.colour_by),
            (Some("day.png"), ReportColourBy::Tier)
        );
        let cli = parse(&["report", "daily", "--out", "day.html"]).unwrap();
        let Command::Report(ReportCommand::Daily(d)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!((d.date, d.colour_by), (None, ReportColourBy::Tenant));
        assert!(parse(&["report", "daily"]).is_err(), "--out is needed");
        for bad in ["2026-13-01", "03.12.2026", "yesterday"] {
            let e = parse(&["report", "daily", "--date", bad, "--out", "d.svg"]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{bad}");
        }
        assert!(parse(&["report", "daily", "--out", "d.svg", "--colour-by", "zone"]).is_err());
    }
}
