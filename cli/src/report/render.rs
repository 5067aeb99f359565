//! Drawing a [`DailyReport`]: one picture (header, VRAM heat map, task
//! timeline, legend) drawn with plotters as SVG or PNG, and an HTML page
//! with that SVG inline and the numbers as tables.
//!
//! Plotters writes no ids or classes on what it draws, so what a test (or
//! a person) looks for is told apart by where and in which colour it is:
//! [`Geometry`] gives the pixel boxes of the two charts' plotting areas,
//! heat-map cells take [`heat_colour`], bars their tenant's or tier's
//! colour, and the marks [`PREEMPTION_MARK`] and [`FAILOVER_MARK`], which
//! no other element uses.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use lh_events::Tier;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use uuid::Uuid;

use super::engine::{Bar, DailyReport, MarkKind};
use super::glyph::GlyphBitmap;
use super::model::HOURS_PER_DAY;

/// Width of the picture, in pixels.
pub const WIDTH_PX: u32 = 1280;
/// Most GPUs one report draws (each is a row of both charts).
pub const MAX_REPORT_GPUS: usize = 512;
/// Tenants (or tiers) the legend names; the rest are counted.
pub const MAX_LEGEND_ENTRIES: usize = 12;
/// Interruptions the HTML page lists one by one.
pub const MAX_LISTED_INTERRUPTIONS: usize = 100;

const HEADER_PX: u32 = 64;
const CAPTION_PX: u32 = 28;
const HOUR_LABELS_PX: u32 = 22;
const LEGEND_PX: u32 = 96;
const LABEL_AREA_PX: u32 = 190;
const RIGHT_MARGIN_PX: u32 = 24;
const FONT: &str = "sans-serif";

/// Colour of an empty heat-map cell (0 % of the GPU's memory).
pub const HEAT_BOTTOM: RGBColor = RGBColor(0xff, 0xf7, 0xec);
/// Colour of a full one (100 % or more).
pub const HEAT_TOP: RGBColor = RGBColor(0x7f, 0x00, 0x00);
const HEAT_STOPS: [RGBColor; 5] = [
    HEAT_BOTTOM,
    RGBColor(0xfd, 0xd4, 0x9e),
    RGBColor(0xfc, 0x8d, 0x59),
    RGBColor(0xd7, 0x30, 0x1f),
    HEAT_TOP,
];
/// The mark where a spot lease was preempted (a triangle on the bar's end).
pub const PREEMPTION_MARK: RGBColor = RGBColor(0x00, 0x00, 0x00);
/// The mark where a lease failed over (a diamond at the bar's end).
pub const FAILOVER_MARK: RGBColor = RGBColor(0x00, 0x50, 0xff);
/// Bars of leases whose tenant or tier is not known.
pub const UNKNOWN_COLOUR: RGBColor = RGBColor(0xba, 0xb0, 0xac);
/// Tenants' colours, given in the order of their ids.
pub const TENANT_PALETTE: [RGBColor; 9] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xe1, 0x57, 0x59),
];
const GRID: RGBColor = RGBColor(0xe4, 0xe4, 0xe4);

/// What colours the timeline's bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColourBy {
    #[default]
    Tenant,
    Tier,
}

/// A heat-map cell's colour: the scale from [`HEAT_BOTTOM`] (0 %) to
/// [`HEAT_TOP`] (100 % and over), linear between five stops.
pub fn heat_colour(pct: f64) -> RGBColor {
    let t = if pct.is_finite() {
        (pct / 100.0).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let span = (HEAT_STOPS.len() - 1) as f64;
    let i = ((t * span).floor() as usize).min(HEAT_STOPS.len() - 2);
    let f = t * span - i as f64;
    let (a, b) = (HEAT_STOPS[i], HEAT_STOPS[i + 1]);
    let mix = |x: u8, y: u8| (f64::from(x) + (f64::from(y) - f64::from(x)) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// The colour of a tier's bars.
pub fn tier_colour(tier: Option<Tier>) -> RGBColor {
    match tier {
        Some(Tier::Basic) => TENANT_PALETTE[0],
        Some(Tier::Spot) => TENANT_PALETTE[1],
        Some(Tier::Performance) => TENANT_PALETTE[2],
        Some(Tier::Reserved) => TENANT_PALETTE[3],
        None => UNKNOWN_COLOUR,
    }
}

fn tier_name(tier: Option<Tier>) -> &'static str {
    tier.map_or("unknown", Tier::as_str)
}

/// Tenants in the order of their ids, each with its colour.
pub fn tenant_colours(report: &DailyReport) -> BTreeMap<Uuid, RGBColor> {
    let tenants: std::collections::BTreeSet<Uuid> =
        report.bars.iter().filter_map(|b| b.tenant_id).collect();
    tenants
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, TENANT_PALETTE[i % TENANT_PALETTE.len()]))
        .collect()
}

/// The colour a bar is drawn in.
pub fn bar_colour(bar: &Bar, by: ColourBy, tenants: &BTreeMap<Uuid, RGBColor>) -> RGBColor {
    match by {
        ColourBy::Tier => tier_colour(bar.tier),
        ColourBy::Tenant => bar
            .tenant_id
            .and_then(|t| tenants.get(&t).copied())
            .unwrap_or(UNKNOWN_COLOUR),
    }
}

/// A pixel box: left, top, right, bottom.
pub type PixelBox = (i32, i32, i32, i32);

/// Where the charts were drawn, in pixels of the picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub width: u32,
    pub height: u32,
    /// The heat map's cells: 24 columns × one row per GPU.
    pub heat: PixelBox,
    /// The timeline's bars: 24 hours wide, one row per GPU.
    pub timeline: PixelBox,
}

fn row_px(gpus: usize) -> u32 {
    match gpus {
        0..=30 => 18,
        31..=90 => 10,
        _ => 6,
    }
}

/// The picture's size for a report.
pub fn picture_size(report: &DailyReport) -> (u32, u32) {
    let rows = report.gpus.len().max(1) as u32;
    let chart = CAPTION_PX + rows * row_px(report.gpus.len()) + HOUR_LABELS_PX + 8;
    (WIDTH_PX, HEADER_PX + 2 * chart + LEGEND_PX)
}

fn pos(h: HPos, v: VPos) -> Pos {
    Pos::new(h, v)
}

/// A tenant as the legend names it: the end of its id, which is random in
/// a UUIDv7 (its start is the time it was made, shared by neighbours).
/// The HTML page lists the whole ids.
pub fn short(id: &Uuid) -> String {
    let text = id.simple().to_string();
    format!("…{}", &text[text.len() - 12..])
}

type DrawResult<T, DB> = Result<T, DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    report: &DailyReport,
    by: ColourBy,
) -> DrawResult<Geometry, DB> {
    let (width, height) = root.dim_in_pixel();
    root.fill(&WHITE)?;
    let n = report.gpus.len().max(1);
    let row_h = row_px(report.gpus.len());
    let chart_h = CAPTION_PX + n as u32 * row_h + HOUR_LABELS_PX + 8;
    let (header, rest) = root.split_vertically(HEADER_PX);
    let (heat_area, rest) = rest.split_vertically(chart_h);
    let (timeline_area, legend) = rest.split_vertically(chart_h);

    let title = match report.tenant {
        Some(t) => format!("Leasehold daily report, {} (UTC), tenant {t}", report.date),
        None => format!("Leasehold daily report, {} (UTC), all tenants", report.date),
    };
    header.draw(&Text::new(
        title,
        (12, 10),
        (FONT, 20).into_font().color(&BLACK),
    ))?;
    let a = &report.availability;
    let q = &report.queue_wait;
    let summary = format!(
        "{} GPUs, {} of {} GPU-hours leased, {} leases ran, preempted: {}, failed over: {}; \
         queue wait p95 {} (target {} s); availability {} (target {} %)",
        report.gpus.len(),
        report.leased_gpu_hours,
        report.gpu_hours,
        report.leases,
        report.preemptions,
        report.failovers,
        q.p95_secs.map_or("n/a".into(), |p| format!("{p:.1} s")),
        q.target_secs,
        a.pct.map_or("n/a".into(), |p| format!("{p:.3} %")),
        a.target_pct,
    );
    header.draw(&Text::new(
        summary,
        (12, 38),
        (FONT, 13).into_font().color(&BLACK),
    ))?;

    let rows = n as f64;
    let y_of = |row: usize| rows - row as f64; // row 0 at the top
    let label_style = (FONT, 11).into_font().color(&BLACK);
    let every = (12 / row_h as usize).max(1);

    // Heat map.
    let mut heat = ChartBuilder::on(&heat_area)
        .caption(
            "VRAM used per GPU and hour, % of the GPU's memory (UTC hours)",
            (FONT, 15),
        )
        .margin_right(RIGHT_MARGIN_PX)
        .x_label_area_size(HOUR_LABELS_PX)
        .y_label_area_size(LABEL_AREA_PX)
        .build_cartesian_2d(0f64..f64::from(HOURS_PER_DAY), 0f64..rows)?;
    heat.draw_series(report.gpus.iter().enumerate().flat_map(|(row, gpu)| {
        (0..HOURS_PER_DAY as usize).map(move |h| {
            Rectangle::new(
                [(h as f64, y_of(row) - 1.0), (h as f64 + 1.0, y_of(row))],
                heat_colour(gpu.vram_pct[h]).filled(),
            )
        })
    }))?;
    let heat_box = plotting_box(&heat);

    // Timeline.
    let mut timeline = ChartBuilder::on(&timeline_area)
        .caption(
            match by {
                ColourBy::Tenant => "Leases per GPU (UTC hours), coloured by tenant",
                ColourBy::Tier => "Leases per GPU (UTC hours), coloured by tier",
            },
            (FONT, 15),
        )
        .margin_right(RIGHT_MARGIN_PX)
        .x_label_area_size(HOUR_LABELS_PX)
        .y_label_area_size(LABEL_AREA_PX)
        .build_cartesian_2d(0f64..f64::from(HOURS_PER_DAY), 0f64..rows)?;
    timeline.draw_series((0..=HOURS_PER_DAY).map(|h| {
        PathElement::new(
            vec![(f64::from(h), 0.0), (f64::from(h), rows)],
            GRID.stroke_width(1),
        )
    }))?;
    let tenants = tenant_colours(report);
    let pad = 0.15;
    timeline.draw_series(report.bars.iter().map(|b| {
        Rectangle::new(
            [
                (b.start_h, y_of(b.row) - 1.0 + pad),
                (b.end_h, y_of(b.row) - pad),
            ],
            bar_colour(b, by, &tenants).filled(),
        )
    }))?;
    let mark = (row_h as i32 / 2).clamp(3, 7);
    timeline.draw_series(report.bars.iter().filter_map(|b| {
        let at = (b.end_h, y_of(b.row) - 0.5);
        match b.mark? {
            MarkKind::Preempted => Some(
                EmptyElement::at(at)
                    + Polygon::new(
                        vec![(-mark, -mark), (mark, -mark), (0, mark)],
                        PREEMPTION_MARK.filled(),
                    ),
            ),
            MarkKind::FailedOver => Some(
                EmptyElement::at(at)
                    + Polygon::new(
                        vec![(0, -mark), (mark, 0), (0, mark), (-mark, 0)],
                        FAILOVER_MARK.filled(),
                    ),
            ),
        }
    }))?;
    let timeline_box = plotting_box(&timeline);

    // Row and hour labels, drawn where the charts put their rows.
    for (chart_box, area) in [(heat_box, &heat_area), (timeline_box, &timeline_area)] {
        let (ox, oy) = area.get_base_pixel();
        let (left, top, right, bottom) = chart_box;
        let row_px = (bottom - top) as f64 / rows;
        for (row, gpu) in report.gpus.iter().enumerate() {
            if row % every != 0 {
                continue;
            }
            let y = top + ((row as f64 + 0.5) * row_px) as i32 - oy;
            let label = format!("{} {}", gpu.label(), gpu.model);
            area.draw(&Text::new(
                label,
                (left - ox - 6, y),
                label_style.pos(pos(HPos::Right, VPos::Center)),
            ))?;
        }
        let hour_px = (right - left) as f64 / f64::from(HOURS_PER_DAY);
        for h in (0..=HOURS_PER_DAY).step_by(2) {
            area.draw(&Text::new(
                format!("{h:02}"),
                (left - ox + (f64::from(h) * hour_px) as i32, bottom - oy + 4),
                label_style.pos(pos(HPos::Center, VPos::Top)),
            ))?;
        }
    }

    // Legend: the heat scale, then the bars' colours, then the marks.
    let swatch = 14;
    let mut x = 12;
    legend.draw(&Text::new(
        "VRAM",
        (x, 10),
        label_style.pos(pos(HPos::Left, VPos::Top)),
    ))?;
    x += 40;
    for step in 0..=10 {
        let pct = f64::from(step) * 10.0;
        legend.draw(&Rectangle::new(
            [(x, 8), (x + swatch * 2, 8 + swatch)],
            heat_colour(pct).filled(),
        ))?;
        if step % 5 == 0 {
            legend.draw(&Text::new(
                format!("{pct:.0}%"),
                (x, 8 + swatch + 4),
                label_style.pos(pos(HPos::Left, VPos::Top)),
            ))?;
        }
        x += swatch * 2;
    }
    x += 24;
    let entries: Vec<(String, RGBColor)> = match by {
        ColourBy::Tenant => tenants
            .iter()
            .map(|(t, c)| (format!("tenant {}", short(t)), *c))
            .collect(),
        ColourBy::Tier => {
            let mut tiers: Vec<Option<Tier>> = report.bars.iter().map(|b| b.tier).collect();
            tiers.sort_by_key(|t| tier_name(*t));
            tiers.dedup();
            tiers
                .into_iter()
                .map(|t| (tier_name(t).to_string(), tier_colour(t)))
                .collect()
        }
    };
    let (mut lx, mut ly) = (x, 8);
    for (i, (name, colour)) in entries.iter().enumerate() {
        if i == MAX_LEGEND_ENTRIES {
            legend.draw(&Text::new(
                format!("and {} more", entries.len() - MAX_LEGEND_ENTRIES),
                (lx, ly),
                label_style.pos(pos(HPos::Left, VPos::Top)),
            ))?;
            break;
        }
        legend.draw(&Rectangle::new(
            [(lx, ly), (lx + swatch, ly + swatch)],
            colour.filled(),
        ))?;
        legend.draw(&Text::new(
            name.clone(),
            (lx + swatch + 4, ly + 1),
            label_style.pos(pos(HPos::Left, VPos::Top)),
        ))?;
        lx += 150;
        if lx + 150 > width as i32 - 200 {
            lx = x;
            ly += swatch + 8;
        }
    }
    let mx = width as i32 - 190;
    legend.draw(
        &(EmptyElement::at((mx + 7, 22))
            + Polygon::new(vec![(-5, -10), (5, -10), (0, 0)], PREEMPTION_MARK.filled())),
    )?;
    legend.draw(&Text::new(
        "preempted",
        (mx + 18, 12),
        label_style.pos(pos(HPos::Left, VPos::Top)),
    ))?;
    legend.draw(
        &(EmptyElement::at((mx + 7, 44))
            + Polygon::new(
                vec![(0, -5), (5, 0), (0, 5), (-5, 0)],
                FAILOVER_MARK.filled(),
            )),
    )?;
    legend.draw(&Text::new(
        "failed over",
        (mx + 18, 38),
        label_style.pos(pos(HPos::Left, VPos::Top)),
    ))?;
    root.present()?;
    Ok(Geometry {
        width,
        height,
        heat: heat_box,
        timeline: timeline_box,
    })
}

fn plotting_box<DB: DrawingBackend, CT: plotters::coord::CoordTranslate>(
    chart: &ChartContext<'_, DB, CT>,
) -> PixelBox {
    let (x, y) = chart.plotting_area().get_pixel_range();
    (x.start, y.start, x.end, y.end)
}

/// The picture as an SVG document, and where its charts are.
pub fn svg(report: &DailyReport, by: ColourBy) -> anyhow::Result<(String, Geometry)> {
    let size = picture_size(report);
    let mut text = String::new();
    let geometry = {
        let root = SVGBackend::with_string(&mut text, size).into_drawing_area();
        draw(root, report, by).map_err(|e| anyhow::anyhow!("cannot draw the SVG: {e}"))?
    };
    Ok((text, geometry))
}

/// The picture as a PNG file's bytes, and where its charts are.
pub fn png(report: &DailyReport, by: ColourBy) -> anyhow::Result<(Vec<u8>, Geometry)> {
    let (w, h) = picture_size(report);
    let mut pixels = vec![0u8; w as usize * h as usize * 3];
    let geometry = {
        let root = GlyphBitmap::with_buffer(&mut pixels, (w, h)).into_drawing_area();
        draw(root, report, by).map_err(|e| anyhow::anyhow!("cannot draw the PNG: {e}"))?
    };
    let mut bytes = Vec::new();
    {
        let mut encoder = ::png::Encoder::new(&mut bytes, w, h);
        encoder.set_color(::png::ColorType::Rgb);
        encoder.set_depth(::png::BitDepth::Eight);
        let mut writer = encoder.write_header()?;
        writer.write_image_data(&pixels)?;
    }
    Ok((bytes, geometry))
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn pct_or_na(value: Option<f64>, places: usize) -> String {
    value.map_or("n/a".into(), |v| format!("{v:.places$} %"))
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "missed",
        None => "n/a",
    }
}

/// The report as one HTML page: the totals, the picture (inline SVG) and
/// the tables, with what each number means.
pub fn html(report: &DailyReport, by: ColourBy) -> anyhow::Result<String> {
    let (picture, _) = svg(report, by)?;
    let picture = picture
        .find("<svg")
        .map_or(picture.as_str(), |at| &picture[at..]);
    let a = &report.availability;
    let q = &report.queue_wait;
    let mut page = String::new();
    let scope = match report.tenant {
        Some(t) => format!("tenant {t}"),
        None => "all tenants".into(),
    };
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Leasehold daily report {date}</title>\n<style>\
         body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse;margin:.5em 0 1.5em}}\
         td,th{{border:1px solid #ccc;padding:.2em .6em;text-align:right}}th{{background:#f4f4f4}}\
         td:first-child,th:first-child{{text-align:left}}</style></head><body>\n\
         <h1>Leasehold daily report, {date} (UTC)</h1>\n<p>{scope}. All times are UTC.</p>\n",
        date = report.date,
        scope = escape(&scope),
    );
    let _ = write!(
        page,
        "<h2>Totals</h2>\n<table id=\"totals\">\
         <tr><th>GPUs</th><td>{}</td></tr>\
         <tr><th>GPU-hours</th><td>{}</td></tr>\
         <tr><th>Leased GPU-hours</th><td>{}</td></tr>\
         <tr><th>Leases that ran</th><td>{}</td></tr>\
         <tr><th>Preempted leases</th><td>{}</td></tr>\
         <tr><th>Failovers</th><td>{}</td></tr>\
         <tr><th>Queue wait mean</th><td>{}</td></tr>\
         <tr><th>Queue wait p95 (target {} s)</th><td>{} ({})</td></tr>\
         <tr><th>Availability (target {} %)</th><td>{} ({})</td></tr>\
         </table>\n",
        report.gpus.len(),
        report.gpu_hours,
        report.leased_gpu_hours,
        report.leases,
        report.preemptions,
        report.failovers,
        q.mean_secs.map_or("n/a".into(), |m| format!("{m:.1} s")),
        q.target_secs,
        q.p95_secs.map_or("n/a".into(), |p| format!("{p:.1} s")),
        verdict(q.meets_target()),
        a.target_pct,
        pct_or_na(a.pct, 3),
        verdict(a.meets_target()),
    );
    let _ = writeln!(page, "<div class=\"picture\">{picture}</div>");
    page.push_str(
        "<h2>Idle rate and utilisation per model and zone</h2>\n<table id=\"models\">\
         <tr><th>Model</th><th>Zone</th><th>GPUs</th><th>GPU-hours</th>\
         <th>Leased GPU-hours</th><th>Idle rate</th><th>Utilisation</th></tr>",
    );
    for m in &report.by_model_zone {
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1} %</td><td>{}</td></tr>",
            escape(&m.model),
            escape(&m.zone),
            m.gpus,
            m.gpu_hours,
            m.leased_gpu_hours,
            m.idle_rate * 100.0,
            pct_or_na(m.utilisation_pct, 1),
        );
    }
    page.push_str("</table>\n<h2>Peak hours</h2>\n<table id=\"peaks\"><tr><th>Hour (UTC)</th><th>GPUs leased</th></tr>");
    for p in &report.peak_hours {
        let _ = write!(
            page,
            "<tr><td>{:02}:00–{:02}:00</td><td>{}</td></tr>",
            p.hour,
            p.hour + 1,
            p.gpus_leased
        );
    }
    let _ = write!(
        page,
        "</table>\n<h2>Queue wait</h2>\n<table id=\"wait\">\
         <tr><th>Leases requested and started</th><td>{}</td></tr>\
         <tr><th>Still waiting at 24:00</th><td>{}</td></tr>\
         <tr><th>Mean</th><td>{}</td></tr><tr><th>p95</th><td>{}</td></tr>\
         <tr><th>Target (p95)</th><td>{} s, {}</td></tr></table>\n",
        q.started,
        q.still_waiting,
        q.mean_secs.map_or("n/a".into(), |m| format!("{m:.1} s")),
        q.p95_secs.map_or("n/a".into(), |p| format!("{p:.1} s")),
        q.target_secs,
        verdict(q.meets_target()),
    );
    let _ = write!(
        page,
        "<h2>Availability</h2>\n<table id=\"availability\">\
         <tr><th>Lease-seconds run</th><td>{}</td></tr>\
         <tr><th>Lease-seconds interrupted</th><td>{}</td></tr>\
         <tr><th>Lease-seconds that should have run</th><td>{}</td></tr>\
         <tr><th>Availability</th><td>{}</td></tr>\
         <tr><th>Target</th><td>{} %, {}</td></tr>\
         <tr><th>Interruptions</th><td>{}</td></tr></table>\n",
        a.running_secs,
        a.downtime_secs,
        a.expected_secs,
        pct_or_na(a.pct, 3),
        a.target_pct,
        verdict(a.meets_target()),
        a.interruptions,
    );
    if !report.interruptions.is_empty() {
        page.push_str(
            "<h2>Interruptions</h2>\n<table id=\"interruptions\"><tr><th>Lease</th><th>Tenant</th>\
             <th>From</th><th>To</th><th>Seconds</th><th>Why</th></tr>",
        );
        for i in report.interruptions.iter().take(MAX_LISTED_INTERRUPTIONS) {
            let _ = write!(
                page,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                i.lease_id,
                i.tenant_id.map_or("?".into(), |t| t.to_string()),
                i.from.format("%H:%M:%S"),
                i.to.format("%H:%M:%S"),
                (i.to - i.from).num_seconds(),
                escape(&i.reason),
            );
        }
        page.push_str("</table>\n");
        if report.interruptions.len() > MAX_LISTED_INTERRUPTIONS {
            let _ = writeln!(
                page,
                "<p>and {} more (<code>--json</code> lists them all).</p>",
                report.interruptions.len() - MAX_LISTED_INTERRUPTIONS
            );
        }
    }
    let tenants = tenant_colours(report);
    if by == ColourBy::Tenant && !tenants.is_empty() {
        page.push_str(
            "<h2>Tenants</h2>\n<table id=\"tenants\"><tr><th>Colour</th><th>Tenant</th><th>Bars</th></tr>",
        );
        for (tenant, colour) in &tenants {
            let bars = report
                .bars
                .iter()
                .filter(|b| b.tenant_id == Some(*tenant))
                .count();
            let _ = write!(
                page,
                "<tr><td style=\"background:#{:02x}{:02x}{:02x}\">{}</td><td>{tenant}</td><td>{bars}</td></tr>",
                colour.0,
                colour.1,
                colour.2,
                escape(&short(tenant)),
            );
        }
        page.push_str("</table>\n");
    }
    page.push_str(DEFINITIONS_HTML);
    page.push_str("</body></html>\n");
    Ok(page)
}

const DEFINITIONS_HTML: &str = "<h2>What the numbers mean</h2>\n<ul>\
<li>Times are UTC; an hour is [hh:00, hh+1:00).</li>\
<li>VRAM cell: the average VRAM used on the GPU in that hour (each lease's average over its samples, \
summed over the leases on the GPU), as % of the GPU's memory; 0 where nothing was used.</li>\
<li>A GPU-hour is leased when a lease held the GPU at any time in it. Idle rate: the share of \
GPU-hours not leased. Utilisation: the average of the GPU's utilisation over the leased GPU-hours \
that had a figure.</li>\
<li>Peak hours: the 3 hours with the most GPUs leased.</li>\
<li>Queue wait: from a lease's request to its first start, for leases requested this day that \
started by its end.</li>\
<li>Availability: 1 − interrupted ÷ (run + interrupted) lease-seconds. An interruption runs from \
a failover (a lost node, an unhealthy GPU: the move's billing end) to the lease's next start or its \
end; drains, preemptions, suspensions and the tenant's own stops are not interruptions.</li>\
</ul>\n";
