//! `lh report daily` on a generated day: 4 GPUs of 2 models in 2 zones, 13
//! leases (one preempted, one failed over with a 90 s gap, one rejected,
//! one still waiting), known VRAM and utilisation per hour. The numbers are
//! checked against hand-counted values, and the drawings by what they
//! show: cells, bars, marks and totals.

use chrono::{DateTime, Duration, NaiveDate, TimeZone as _, Utc};
use lh_cli::report::engine::MarkKind;
use lh_cli::report::model::day_start;
use lh_cli::report::render::{
    self, heat_colour, ColourBy, Geometry, FAILOVER_MARK, HEAT_BOTTOM, HEAT_TOP, PREEMPTION_MARK,
    TENANT_PALETTE,
};
use lh_cli::report::{DailyReport, DayInput, LoggedEvent};
use lh_events::fixtures;
use lh_events::{
    Actor, EndReason, Envelope, EventData, LeaseMigrated, LeasePreemptionNoticed, LeaseRejected,
    LeaseSuspended, PreemptionReason, Relocation, Tier,
};
use serde_json::json;
use uuid::Uuid;

const T1: Uuid = Uuid::from_u128(1);
const T2: Uuid = Uuid::from_u128(2);

fn date() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 12, 3).unwrap()
}

/// `hh:mm:ss` on the report's day (hours may run past 24 or below 0).
fn at(h: i64, m: i64, s: i64) -> DateTime<Utc> {
    day_start(date()) + Duration::seconds(h * 3600 + m * 60 + s)
}

fn lease(n: u128) -> Uuid {
    Uuid::from_u128(0x1000 + n)
}

struct Log {
    events: Vec<LoggedEvent>,
}

impl Log {
    fn push(&mut self, when: DateTime<Utc>, data: EventData) {
        let envelope = Envelope::new(Actor::Admin, when, data);
        let sequence = self.events.len() as u64 + 1;
        self.events.push(LoggedEvent { sequence, envelope });
    }

    fn request(&mut self, id: Uuid, tenant: Uuid, tier: Tier, gpus: u32, when: DateTime<Utc>) {
        let mut r = fixtures::whole_request(id, tenant, gpus, "A100-40GB");
        r.tier = tier;
        self.push(when, EventData::LeaseRequested(r));
    }

    fn run(
        &mut self,
        id: Uuid,
        node: &str,
        gpus: &[u32],
        placed: DateTime<Utc>,
        started: DateTime<Utc>,
    ) {
        let (zone, model) = zone_model(node);
        self.push(
            placed,
            EventData::LeasePlaced(fixtures::placed(id, node, zone, model, 40, gpus)),
        );
        self.push(
            started,
            EventData::LeaseStarted(fixtures::started(id, node, started)),
        );
    }

    fn end(&mut self, id: Uuid, node: &str, when: DateTime<Utc>, reason: EndReason) {
        self.push(
            when,
            EventData::LeaseEnded(fixtures::ended(id, node, when, reason)),
        );
    }

    /// Requested, placed at once and started `wait_s` later; ended at `end`.
    #[allow(clippy::too_many_arguments)]
    fn whole(
        &mut self,
        id: Uuid,
        tenant: Uuid,
        tier: Tier,
        node: &str,
        gpus: &[u32],
        requested: DateTime<Utc>,
        wait_s: i64,
        end: Option<DateTime<Utc>>,
    ) {
        self.request(id, tenant, tier, gpus.len() as u32, requested);
        self.run(
            id,
            node,
            gpus,
            requested,
            requested + Duration::seconds(wait_s),
        );
        if let Some(end) = end {
            self.end(id, node, end, EndReason::Stopped);
        }
    }
}

fn zone_model(node: &str) -> (&'static str, &'static str) {
    if node == "n-a" {
        ("z1", "A100-40GB")
    } else {
        ("z2", "H100-80GB")
    }
}

/// The generated day's log.
fn log() -> Vec<LoggedEvent> {
    let mut log = Log { events: Vec::new() };
    let before = at(-30 * 24, 0, 0);
    log.push(
        before,
        EventData::NodeRegistered(fixtures::node("n-a", "z1", 2, "A100-40GB", 40)),
    );
    log.push(
        before,
        EventData::NodeRegistered(fixtures::node("n-b", "z2", 2, "H100-80GB", 80)),
    );
    // L1 runs from the day before until 02:00.
    log.whole(
        lease(1),
        T1,
        Tier::Basic,
        "n-a",
        &[0],
        at(-2, 0, 0),
        10,
        Some(at(2, 0, 0)),
    );
    log.whole(
        lease(2),
        T1,
        Tier::Basic,
        "n-a",
        &[0],
        at(3, 0, 0),
        10,
        Some(at(6, 0, 0)),
    );
    // L3, spot, preempted at 04:30.
    log.whole(lease(3), T2, Tier::Spot, "n-a", &[1], at(1, 0, 0), 5, None);
    log.push(
        at(4, 28, 0),
        EventData::LeasePreemptionNoticed(LeasePreemptionNoticed {
            lease_id: lease(3),
            node_id: "n-a".into(),
            preempted_for: Uuid::nil(),
            deadline: at(4, 30, 0),
            reason: PreemptionReason::Capacity,
        }),
    );
    log.end(lease(3), "n-a", at(4, 30, 0), EndReason::Preempted);
    // L4 on both GPUs of n-b.
    log.whole(
        lease(4),
        T2,
        Tier::Basic,
        "n-b",
        &[0, 1],
        at(8, 0, 0),
        20,
        Some(at(10, 0, 0)),
    );
    // L5 fails over from n-b/0 to n-a/1 at 14:00, running again 90 s later.
    log.whole(
        lease(5),
        T1,
        Tier::Performance,
        "n-b",
        &[0],
        at(12, 0, 0),
        30,
        None,
    );
    let to = fixtures::placed(lease(5), "n-a", "z1", "A100-40GB", 40, &[1]);
    log.push(
        at(14, 0, 5),
        EventData::LeaseMigrated(LeaseMigrated {
            lease_id: lease(5),
            reason: lh_domain::moves::node_lost("n-b"),
            from_node_id: "n-b".into(),
            from_gpu_indices: vec![0],
            billing_ends_at: at(14, 0, 0),
            to: Some(Relocation {
                node_id: to.node_id,
                zone: to.zone,
                vram_gb_per_gpu: 40,
                gpus: to.gpus,
                decision: to.decision,
            }),
        }),
    );
    log.push(
        at(14, 1, 30),
        EventData::LeaseStarted(fixtures::started(lease(5), "n-a", at(14, 1, 30))),
    );
    log.end(lease(5), "n-a", at(16, 0, 0), EndReason::Stopped);
    // L6 still runs at midnight.
    log.whole(
        lease(6),
        T2,
        Tier::Basic,
        "n-a",
        &[0],
        at(18, 0, 0),
        1,
        None,
    );
    log.whole(
        lease(7),
        T1,
        Tier::Spot,
        "n-b",
        &[1],
        at(20, 0, 0),
        2,
        Some(at(21, 0, 0)),
    );
    // L8 is rejected, L9 still waits at midnight.
    log.request(lease(8), T1, Tier::Basic, 1, at(22, 0, 0));
    log.push(
        at(22, 0, 1),
        EventData::LeaseRejected(LeaseRejected {
            lease_id: lease(8),
            reason: "no such model".into(),
            field: Some("gpu_model".into()),
        }),
    );
    log.request(lease(9), T2, Tier::Basic, 1, at(23, 30, 0));
    // L10 is suspended by its idle policy at 17:00.
    log.whole(
        lease(10),
        T1,
        Tier::Basic,
        "n-b",
        &[0],
        at(16, 0, 0),
        3,
        None,
    );
    log.push(
        at(17, 0, 0),
        EventData::LeaseSuspended(LeaseSuspended {
            lease_id: lease(10),
            node_id: "n-b".into(),
            gpu_indices: vec![0],
            suspended_at: at(17, 0, 0),
            reason: "idle".into(),
        }),
    );
    log.whole(
        lease(11),
        T2,
        Tier::Basic,
        "n-a",
        &[1],
        at(5, 0, 0),
        4,
        Some(at(6, 30, 0)),
    );
    log.whole(
        lease(12),
        T1,
        Tier::Basic,
        "n-b",
        &[1],
        at(11, 0, 0),
        6,
        Some(at(11, 30, 0)),
    );
    log.whole(
        lease(13),
        T2,
        Tier::Basic,
        "n-b",
        &[0],
        at(4, 0, 0),
        7,
        Some(at(5, 0, 0)),
    );
    // Events after the day are left out.
    log.end(lease(6), "n-a", at(25, 0, 0), EndReason::Stopped);
    log.events
}

fn point(hour: u32, memory_mib: f64, utilisation: Option<f64>) -> serde_json::Value {
    point_over(hour, memory_mib, utilisation, 60)
}

/// A point whose samples came in `minutes` of the hour.
fn point_over(
    hour: u32,
    memory_mib: f64,
    utilisation: Option<f64>,
    minutes: u32,
) -> serde_json::Value {
    json!({
        "at": (at(i64::from(hour), 0, 0)).to_rfc3339(),
        "samples": 12 * minutes,
        "minutes": minutes,
        "utilization_pct_avg": utilisation,
        "memory_used_mib_avg": memory_mib,
        "memory_used_mib_max": memory_mib as u64,
        "temperature_c_max": null,
        "power_w_avg": null,
    })
}

fn series(
    lease_id: Uuid,
    tenant: Uuid,
    node: &str,
    gpu: u32,
    points: Vec<serde_json::Value>,
) -> serde_json::Value {
    json!({
        "lease_id": lease_id, "tenant_id": tenant, "node_id": node,
        "gpu_index": gpu, "gpu_uuid": format!("GPU-{node}-{gpu}"), "points": points,
    })
}

/// The usage API's answer for the day (`step=3600`).
fn usage() -> serde_json::Value {
    json!({
        "from": at(0, 0, 0).to_rfc3339(), "to": at(24, 0, 0).to_rfc3339(), "step_seconds": 3600,
        "series": [
            // n-a/0 (40 GiB): 100 % at 00h, 50 % at 01h.
            series(lease(1), T1, "n-a", 0, vec![point(0, 40960.0, Some(80.0)), point(1, 20480.0, Some(60.0))]),
            // n-a/1: 25 % at 02h, from a lease that held 40 GiB for a
            // quarter of the hour.
            series(lease(3), T2, "n-a", 1, vec![point_over(2, 40960.0, Some(40.0), 15)]),
            // n-b/1 (80 GiB): two leases' halves make 100 % at 20h; the
            // device's utilisation is the highest either saw.
            series(lease(7), T1, "n-b", 1, vec![point(20, 40960.0, Some(70.0))]),
            series(lease(99), T2, "n-b", 1, vec![point(20, 40960.0, Some(90.0))]),
            // An hour no lease held: not in the utilisation.
            series(lease(98), T2, "n-b", 0, vec![point(22, 0.0, Some(50.0))]),
        ]
    })
}

fn input(tenant: Option<Uuid>) -> DayInput {
    let mut input = DayInput::from_events(date(), tenant, log());
    let usage = serde_json::from_value(usage()).expect("a usage report");
    assert_eq!(input.add_usage(&usage), 0);
    input
}

#[test]
fn the_numbers_of_a_generated_day() {
    let report = DailyReport::compute(&input(None));
    assert_eq!(report.gpus.len(), 4);
    let labels: Vec<String> = report.gpus.iter().map(|g| g.label()).collect();
    assert_eq!(labels, ["n-a/0", "n-a/1", "n-b/0", "n-b/1"]);
    assert_eq!(report.gpus[2].memory_mib, 80 * 1024);

    // Leased hours per GPU, counted by hand.
    let leased: Vec<usize> = report
        .gpus
        .iter()
        .map(|g| g.leased.iter().filter(|l| **l).count())
        .collect();
    assert_eq!(leased, [11, 8, 6, 4]);
    assert_eq!((report.gpu_hours, report.leased_gpu_hours), (96, 29));

    let groups: Vec<(&str, &str, usize, u32, u32)> = report
        .by_model_zone
        .iter()
        .map(|m| {
            (
                m.model.as_str(),
                m.zone.as_str(),
                m.gpus,
                m.gpu_hours,
                m.leased_gpu_hours,
            )
        })
        .collect();
    assert_eq!(
        groups,
        [
            ("A100-40GB", "z1", 2, 48, 19),
            ("H100-80GB", "z2", 2, 48, 10)
        ]
    );
    assert_eq!(report.by_model_zone[0].idle_rate, 29.0 / 48.0);
    assert_eq!(report.by_model_zone[1].idle_rate, 38.0 / 48.0);
    assert_eq!(report.by_model_zone[0].utilisation_pct, Some(60.0));
    assert_eq!(report.by_model_zone[1].utilisation_pct, Some(90.0));

    let peaks: Vec<(u32, usize)> = report
        .peak_hours
        .iter()
        .map(|p| (p.hour, p.gpus_leased))
        .collect();
    assert_eq!(peaks, [(4, 3), (1, 2), (3, 2)]);

    let q = &report.queue_wait;
    assert_eq!((q.started, q.still_waiting), (10, 1));
    assert_eq!(q.mean_secs, Some(8.8));
    assert_eq!(q.p95_secs, Some(30.0));
    assert_eq!(q.meets_target(), Some(false));

    let a = &report.availability;
    assert_eq!(a.running_secs, 91_622);
    assert_eq!(a.downtime_secs, 90);
    assert_eq!(a.expected_secs, 91_712);
    assert_eq!(a.pct, Some(100.0 * (1.0 - 90.0 / 91_712.0)));
    assert_eq!(a.interruptions, 1);
    assert_eq!(a.meets_target(), Some(false));

    assert_eq!(
        (report.leases, report.preemptions, report.failovers),
        (11, 1, 1)
    );
    assert_eq!(report.bars.len(), 13);
    let marks: Vec<(usize, MarkKind)> = report
        .bars
        .iter()
        .filter_map(|b| Some((b.row, b.mark?)))
        .collect();
    assert_eq!(marks, [(1, MarkKind::Preempted), (2, MarkKind::FailedOver)]);

    // The heat map: the cells with usage, everything else empty.
    assert_eq!(report.gpus[0].vram_pct[0], 100.0);
    assert_eq!(report.gpus[0].vram_pct[1], 50.0);
    assert_eq!(report.gpus[1].vram_pct[2], 25.0);
    assert_eq!(report.gpus[3].vram_pct[20], 100.0);
    let used = report
        .gpus
        .iter()
        .flat_map(|g| g.vram_pct.iter())
        .filter(|p| **p > 0.0)
        .count();
    assert_eq!(used, 4);
}

#[test]
fn one_tenant_keeps_every_gpu_and_only_its_leases() {
    let report = DailyReport::compute(&input(Some(T1)));
    assert_eq!(report.gpus.len(), 4, "every GPU still shows");
    // L1, L2, L5 (twice), L7, L10, L12.
    assert_eq!(report.bars.len(), 7);
    assert!(report.bars.iter().all(|b| b.tenant_id == Some(T1)));
    assert_eq!(report.queue_wait.started, 5);
    assert_eq!(report.queue_wait.still_waiting, 0);
    assert_eq!(report.availability.downtime_secs, 90);
    assert_eq!(
        report.gpus[3].vram_pct[20], 50.0,
        "only its own lease's VRAM"
    );
    assert_eq!(report.gpus[1].vram_pct[2], 0.0);
}

/// `<tag attr="v" .../>` elements of an SVG, as attribute lists.
fn elements(svg: &str, tag: &str) -> Vec<Vec<(String, String)>> {
    let open = format!("<{tag} ");
    svg.match_indices(&open)
        .map(|(start, _)| {
            let rest = &svg[start + open.len()..];
            let end = rest.find('>').unwrap();
            let mut attrs = Vec::new();
            let mut text = &rest[..end];
            while let Some(eq) = text.find("=\"") {
                let name = text[..eq].trim().to_string();
                let value_end = text[eq + 2..].find('"').unwrap();
                attrs.push((name, text[eq + 2..eq + 2 + value_end].to_string()));
                text = &text[eq + 2 + value_end + 1..];
            }
            attrs
        })
        .collect()
}

fn attr<'a>(element: &'a [(String, String)], name: &str) -> &'a str {
    element
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} in {element:?}"))
}

fn hex(c: plotters::style::RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// A rect's box (left, top, right, bottom), in pixels.
fn rect_box(r: &[(String, String)]) -> (f64, f64, f64, f64) {
    let n = |k| attr(r, k).parse::<f64>().unwrap();
    let (x, y) = (n("x"), n("y"));
    (x, y, x + n("width"), y + n("height"))
}

fn inside(b: (f64, f64, f64, f64), area: (i32, i32, i32, i32)) -> bool {
    let slack = 1.0;
    b.0 >= f64::from(area.0) - slack
        && b.1 >= f64::from(area.1) - slack
        && b.2 <= f64::from(area.2) + slack
        && b.3 <= f64::from(area.3) + slack
}

fn polygon_centre(p: &[(String, String)]) -> (f64, f64) {
    let points: Vec<(f64, f64)> = attr(p, "points")
        .split_whitespace()
        .map(|xy| {
            let (x, y) = xy.split_once(',').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect();
    let n = points.len() as f64;
    (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    )
}

#[test]
fn the_svg_shows_the_cells_bars_and_marks() {
    let report = DailyReport::compute(&input(None));
    let (svg, g): (String, Geometry) = render::svg(&report, ColourBy::Tenant).unwrap();
    let rects = elements(&svg, "rect");

    // 4 × 24 heat-map cells, each where its GPU and hour are, in the
    // colour of its VRAM.
    let cells: Vec<_> = rects
        .iter()
        .filter(|r| inside(rect_box(r), g.heat))
        .collect();
    assert_eq!(cells.len(), 4 * 24);
    let cell_w = f64::from(g.heat.2 - g.heat.0) / 24.0;
    let cell_h = f64::from(g.heat.3 - g.heat.1) / 4.0;
    let mut seen = std::collections::BTreeSet::new();
    for cell in &cells {
        let (l, t, _, _) = rect_box(cell);
        let hour = ((l - f64::from(g.heat.0)) / cell_w).round() as usize;
        let row = ((t - f64::from(g.heat.1)) / cell_h).round() as usize;
        assert!(seen.insert((row, hour)), "two cells at {row}, {hour}");
        let expected = match (row, hour) {
            (0, 0) | (3, 20) => hex(HEAT_TOP),
            (0, 1) => hex(heat_colour(50.0)),
            (1, 2) => hex(heat_colour(25.0)),
            _ => hex(HEAT_BOTTOM),
        };
        assert_eq!(
            attr(cell, "fill"),
            expected,
            "cell of GPU row {row}, hour {hour}"
        );
    }
    assert_ne!(hex(heat_colour(50.0)), hex(HEAT_BOTTOM));

    // One bar per lease run per GPU, in its tenant's colour (T1 first).
    let bars: Vec<_> = rects
        .iter()
        .filter(|r| inside(rect_box(r), g.timeline))
        .collect();
    assert_eq!(bars.len(), 13);
    let hour_w = f64::from(g.timeline.2 - g.timeline.0) / 24.0;
    let row_h = f64::from(g.timeline.3 - g.timeline.1) / 4.0;
    let mut per_row = [0; 4];
    for bar in &bars {
        let (l, t, r, _) = rect_box(bar);
        let row = ((t - f64::from(g.timeline.1)) / row_h).floor() as usize;
        per_row[row] += 1;
        let (start_h, end_h) = (
            (l - f64::from(g.timeline.0)) / hour_w,
            (r - f64::from(g.timeline.0)) / hour_w,
        );
        let drawn = report
            .bars
            .iter()
            .find(|b| {
                b.row == row
                    && (b.start_h - start_h).abs() * hour_w < 2.5
                    && (b.end_h - end_h).abs() * hour_w < 2.5
            })
            .unwrap_or_else(|| panic!("a bar on row {row} from {start_h:.2} h to {end_h:.2} h"));
        let colour = if drawn.tenant_id == Some(T1) {
            TENANT_PALETTE[0]
        } else {
            TENANT_PALETTE[1]
        };
        assert_eq!(attr(bar, "fill"), hex(colour));
    }
    assert_eq!(per_row, [3, 3, 4, 3]);

    // The preemption at 04:30 on n-a/1 and the failover at 14:00 on n-b/0.
    let polygons = elements(&svg, "polygon");
    let marks = |colour| -> Vec<(f64, f64)> {
        polygons
            .iter()
            .filter(|p| attr(p, "fill") == hex(colour))
            .map(|p| polygon_centre(p))
            .filter(|c| {
                c.0 >= f64::from(g.timeline.0)
                    && c.0 <= f64::from(g.timeline.2)
                    && c.1 >= f64::from(g.timeline.1)
                    && c.1 <= f64::from(g.timeline.3)
            })
            .collect()
    };
    let preempted = marks(PREEMPTION_MARK);
    assert_eq!(preempted.len(), 1);
    assert!(((preempted[0].0 - f64::from(g.timeline.0)) / hour_w - 4.5).abs() < 0.05);
    assert_eq!(
        ((preempted[0].1 - f64::from(g.timeline.1)) / row_h) as usize,
        1
    );
    let failed_over = marks(FAILOVER_MARK);
    assert_eq!(failed_over.len(), 1);
    assert!(((failed_over[0].0 - f64::from(g.timeline.0)) / hour_w - 14.0).abs() < 0.05);
    assert_eq!(
        ((failed_over[0].1 - f64::from(g.timeline.1)) / row_h) as usize,
        2
    );

    // Coloured by tier instead: the spot bars take the spot colour.
    let (by_tier, g) = render::svg(&report, ColourBy::Tier).unwrap();
    let spot = elements(&by_tier, "rect")
        .into_iter()
        .filter(|r| inside(rect_box(r), g.timeline))
        .filter(|r| attr(r, "fill") == hex(render::tier_colour(Some(Tier::Spot))))
        .count();
    assert_eq!(spot, 2, "L3 and L7");
}

#[test]
fn the_html_shows_the_totals() {
    let report = DailyReport::compute(&input(None));
    let html = render::html(&report, ColourBy::Tenant).unwrap();
    for row in [
        "<tr><th>GPUs</th><td>4</td></tr>",
        "<tr><th>GPU-hours</th><td>96</td></tr>",
        "<tr><th>Leased GPU-hours</th><td>29</td></tr>",
        "<tr><th>Leases that ran</th><td>11</td></tr>",
        "<tr><th>Preempted leases</th><td>1</td></tr>",
        "<tr><th>Failovers</th><td>1</td></tr>",
        "<tr><th>Queue wait mean</th><td>8.8 s</td></tr>",
        "<tr><th>Queue wait p95 (target 15 s)</th><td>30.0 s (missed)</td></tr>",
        "<tr><th>Availability (target 99.95 %)</th><td>99.902 % (missed)</td></tr>",
        "<tr><td>A100-40GB</td><td>z1</td><td>2</td><td>48</td><td>19</td><td>60.4 %</td><td>60.0 %</td></tr>",
        "<tr><td>04:00–05:00</td><td>3</td></tr>",
        "<tr><th>Lease-seconds interrupted</th><td>90</td></tr>",
        "<td>14:00:00</td><td>14:01:30</td><td>90</td><td>node n-b lost</td></tr>",
    ] {
        assert!(html.contains(row), "missing {row}");
    }
    assert_eq!(html.matches("<svg").count(), 1, "the picture is inline");
    assert!(html.contains("UTC"));
}

#[test]
fn the_png_decodes_to_the_picture() {
    let report = DailyReport::compute(&input(None));
    let (bytes, g) = render::png(&report, ColourBy::Tenant).unwrap();
    // To look at the generated day: LH_REPORT_SAMPLE_DIR=/tmp cargo test ...
    if let Ok(dir) = std::env::var("LH_REPORT_SAMPLE_DIR") {
        let dir = std::path::Path::new(&dir);
        std::fs::write(dir.join("report-daily.png"), &bytes).unwrap();
        let html = render::html(&report, ColourBy::Tenant).unwrap();
        std::fs::write(dir.join("report-daily.html"), html).unwrap();
    }
    let decoder = png::Decoder::new(bytes.as_slice());
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((info.width, info.height), render::picture_size(&report));
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let pixel = |x: i32, y: i32| {
        let i = (y as usize * info.width as usize + x as usize) * 3;
        (pixels[i], pixels[i + 1], pixels[i + 2])
    };
    // The full cell (n-a/0 at 00h) and an empty one, at their centres.
    let cell_w = f64::from(g.heat.2 - g.heat.0) / 24.0;
    let cell_h = f64::from(g.heat.3 - g.heat.1) / 4.0;
    let centre = |row: f64, hour: f64| {
        (
            g.heat.0 + ((hour + 0.5) * cell_w) as i32,
            g.heat.1 + ((row + 0.5) * cell_h) as i32,
        )
    };
    let (x, y) = centre(0.0, 0.0);
    assert_eq!(pixel(x, y), (HEAT_TOP.0, HEAT_TOP.1, HEAT_TOP.2));
    let (x, y) = centre(2.0, 5.0);
    assert_eq!(pixel(x, y), (HEAT_BOTTOM.0, HEAT_BOTTOM.1, HEAT_BOTTOM.2));
    // The title was drawn: dark pixels in the header.
    let dark = (0..60)
        .flat_map(|y| (0..600).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            let (r, g, b) = pixel(x, y);
            u32::from(r) + u32::from(g) + u32::from(b) < 200
        })
        .count();
    assert!(dark > 200, "only {dark} dark pixels in the header");
}

#[test]
fn the_output_kind_follows_the_extension() {
    use lh_cli::report::OutputKind;
    use std::path::Path;
    assert_eq!(
        OutputKind::of(Path::new("r.html")).unwrap(),
        OutputKind::Html
    );
    assert_eq!(OutputKind::of(Path::new("r.SVG")).unwrap(), OutputKind::Svg);
    assert_eq!(OutputKind::of(Path::new("r.png")).unwrap(), OutputKind::Png);
    assert!(OutputKind::of(Path::new("r.pdf")).is_err());
    assert!(OutputKind::of(Path::new("report")).is_err());
}

#[test]
fn a_lease_running_at_midnight_starts_its_bar_at_zero() {
    let report = DailyReport::compute(&input(None));
    let first = report.bars.iter().find(|b| b.lease_id == lease(1)).unwrap();
    assert_eq!((first.start_h, first.end_h), (0.0, 2.0));
    let open = report.bars.iter().find(|b| b.lease_id == lease(6)).unwrap();
    assert_eq!(open.end_h, 24.0);
    let _ = Utc.timestamp_opt(0, 0);
}

#[test]
fn a_drain_is_no_interruption_and_a_restated_node_is_known() {
    use lh_events::{NodeRestated, StatedEvent};
    let mut log = Log { events: Vec::new() };
    // n-a's registration expired; its restatement carries it.
    let registration = Envelope::new(
        Actor::Admin,
        at(-400 * 24, 0, 0),
        EventData::NodeRegistered(fixtures::node("n-a", "z1", 2, "A100-40GB", 40)),
    );
    log.push(
        at(-30 * 24, 0, 0),
        EventData::NodeRestated(NodeRestated {
            node_id: "n-a".into(),
            history: vec![StatedEvent {
                sequence: 1,
                stored_at: registration.occurred_at,
                envelope: Box::new(registration),
            }],
        }),
    );
    log.whole(lease(1), T1, Tier::Basic, "n-a", &[0], at(1, 0, 0), 0, None);
    let to = fixtures::placed(lease(1), "n-a", "z1", "A100-40GB", 40, &[1]);
    log.push(
        at(2, 0, 0),
        EventData::LeaseMigrated(LeaseMigrated {
            lease_id: lease(1),
            reason: lh_domain::moves::node_drained("n-a"),
            from_node_id: "n-a".into(),
            from_gpu_indices: vec![0],
            billing_ends_at: at(2, 0, 0),
            to: Some(Relocation {
                node_id: to.node_id,
                zone: to.zone,
                vram_gb_per_gpu: 40,
                gpus: to.gpus,
                decision: to.decision,
            }),
        }),
    );
    log.push(
        at(2, 10, 0),
        EventData::LeaseStarted(fixtures::started(lease(1), "n-a", at(2, 10, 0))),
    );
    log.end(lease(1), "n-a", at(3, 0, 0), EndReason::Completed);
    let input = DayInput::from_events(date(), None, log.events);
    assert_eq!(input.gpus.len(), 2, "known from the restatement");
    assert!(input.interruptions.is_empty(), "a drain is planned");
    let report = DailyReport::compute(&input);
    assert_eq!(report.bars.len(), 2);
    assert!(report.bars.iter().all(|b| b.mark.is_none()));
    assert_eq!(report.availability.running_secs, 3600 + 50 * 60);
    assert_eq!(report.availability.pct, Some(100.0));
    assert_eq!(report.failovers, 0);
}

#[test]
fn today_counts_only_the_hours_begun() {
    let as_of = at(6, 30, 0);
    let events: Vec<LoggedEvent> = log()
        .into_iter()
        .filter(|e| e.envelope.occurred_at < as_of)
        .collect();
    let input = DayInput::from_events_as_of(date(), None, as_of, events);
    let report = DailyReport::compute(&input);
    assert_eq!(report.gpu_hours, 4 * 7);
    // L11 (05:00:04 on n-a/1) still runs at 06:30 and ends there.
    let open = report
        .bars
        .iter()
        .find(|b| b.lease_id == lease(11))
        .unwrap();
    assert_eq!(open.end_h, 6.5);
}
