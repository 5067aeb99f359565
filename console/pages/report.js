// The daily report: a day of the fleet drawn from the audit trail and
// the usage the gateway keeps. The same reads and the same arithmetic as
// `lh report daily` (cli/src/report: mod.rs reads, model.rs folds,
// engine.rs computes), so that the page and the file agree on a day
// (docs/adr/034); docs/operations.md says what each number counts.

import { useEffect, useState } from "../vendor/hooks.mjs";
import * as api from "../api.js";
import { addWords, t } from "../i18n.js";
import { html, refusal } from "../ui.js";

addWords({
  en: {
    op_report: "Daily report",
    op_report_date: "Day (UTC)",
    op_show: "Show",
    op_refresh: "Read again",
    op_report_hint: "Read from the audit trail as `lh report daily` reads it; every page read is itself recorded (audit.accessed).",
    op_reading: "Reading the trail: {what}, {events} events so far…",
    op_report_for: "{date} (UTC){sofar}",
    op_so_far: ", so far",
    op_gpus_n: "GPUs",
    op_leases_ran: "Leases that ran",
    op_leased_hours: "Leased GPU-hours",
    op_idle_rate: "Idle rate",
    op_utilisation_avg: "Utilisation",
    op_queue_wait: "Queue wait (p95 / mean)",
    op_still_waiting: "Still waiting",
    op_availability: "Availability",
    op_preemptions: "Preemptions",
    op_failovers: "Failovers",
    op_target: "target {target}",
    op_met: "met",
    op_missed: "missed",
    op_none: "none",
    op_heat_map: "VRAM heat map (average per hour, % of the GPU's memory)",
    op_gpu: "GPU",
    op_timeline: "Timeline (a bar per lease run per GPU)",
    op_colour_by: "Colour by",
    op_by_tier: "tier",
    op_by_tenant: "tenant",
    op_preempted_mark: "▲ preempted",
    op_failover_mark: "◆ failed over",
    op_by_model_zone: "By model and zone",
    op_gpu_hours: "GPU-hours",
    op_peak_hours: "Peak hours",
    op_gpus_leased: "{n} GPUs leased",
    op_interruptions: "Interruptions",
    op_from: "From",
    op_to: "To",
    op_reason: "Reason",
    op_no_gpus_day: "No node had registered by this day's end.",
    op_usage_missing: "The usage could not be read ({status}); the heat map and utilisation are empty.",
    op_too_many_events: "The day needs more than {max} events from the trail; use `lh report daily --tenant`.",
    op_too_many_gpus: "{n} GPUs are more than one report draws ({max}).",
    op_skipped_records: "{n} records the services stepped over were left out.",
    op_future_day: "That day has not begun.",
  },
  zh: {
    op_report: "日报",
    op_report_date: "日期 (UTC)",
    op_show: "查看",
    op_refresh: "重新读取",
    op_report_hint: "与 `lh report daily` 一样读取审计记录；每读一页都会被记录 (audit.accessed)。",
    op_reading: "正在读取审计记录：{what}，已读 {events} 条事件…",
    op_report_for: "{date} (UTC){sofar}",
    op_so_far: "，截至目前",
    op_gpus_n: "GPU 数",
    op_leases_ran: "运行过的租约",
    op_leased_hours: "已租 GPU·小时",
    op_idle_rate: "空闲率",
    op_utilisation_avg: "利用率",
    op_queue_wait: "排队等待 (p95 / 平均)",
    op_still_waiting: "仍在等待",
    op_availability: "可用性",
    op_preemptions: "抢占",
    op_failovers: "故障迁移",
    op_target: "目标 {target}",
    op_met: "达标",
    op_missed: "未达标",
    op_none: "无",
    op_heat_map: "显存热力图（每小时平均，占 GPU 显存的百分比）",
    op_gpu: "GPU",
    op_timeline: "时间线（每个租约在每块 GPU 上的运行为一条）",
    op_colour_by: "着色依据",
    op_by_tier: "计费档",
    op_by_tenant: "租户",
    op_preempted_mark: "▲ 被抢占",
    op_failover_mark: "◆ 故障迁移",
    op_by_model_zone: "按型号与可用区",
    op_gpu_hours: "GPU·小时",
    op_peak_hours: "高峰时段",
    op_gpus_leased: "已租 {n} 块 GPU",
    op_interruptions: "中断",
    op_from: "开始",
    op_to: "结束",
    op_reason: "原因",
    op_no_gpus_day: "当日结束前没有节点注册。",
    op_usage_missing: "无法读取用量（{status}）；热力图与利用率为空。",
    op_too_many_events: "当日所需审计事件超过 {max} 条；请使用 `lh report daily --tenant`。",
    op_too_many_gpus: "{n} 块 GPU 超过单份报告可绘制的上限（{max}）。",
    op_skipped_records: "已略去 {n} 条被服务跳过的记录。",
    op_future_day: "该日尚未开始。",
  },
});

const HOURS_PER_DAY = 24;
const MS_PER_HOUR = 3600 * 1000;
const MS_PER_DAY = HOURS_PER_DAY * MS_PER_HOUR;
/// How far before the day lease events are read, in days, for the leases
/// already running at 00:00.
const LOOKBACK_DAYS = 35;
/// Most events one report reads, all types together: a tab holds them all.
const MAX_REPORT_EVENTS = 200000;
/// Records asked per page of the trail: the gateway's most.
const TRAIL_PAGE_RECORDS = 1000;
/// Most GPUs one report draws, as the CLI's.
const MAX_REPORT_GPUS = 512;
const QUEUE_WAIT_TARGET_SECS = 15;
const AVAILABILITY_TARGET_PCT = 99.95;
const PEAK_HOURS = 3;
/// Shades of the heat map, as classes (no style attribute under the CSP).
const VRAM_SHADES = 10;

const NODE_EVENT_TYPES = ["node.registered", "node.restated"];
const LEASE_EVENT_TYPES = ["lease.requested", "lease.rejected", "lease.placed", "lease.started",
  "lease.migrated", "lease.suspended", "lease.ended", "lease.restated"];

const utcDay = (ms) => new Date(ms).toISOString().slice(0, 10);
const rfc3339 = (ms) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, "Z");

/// Every record of `type` in [from, to) in log order, page by page.
async function readType(type, from, to, events, counts, onProgress) {
  let after = 0;
  for (;;) {
    let path = `/v1/audit/events?type=${encodeURIComponent(type)}&to=${encodeURIComponent(to)}&after=${after}&limit=${TRAIL_PAGE_RECORDS}`;
    if (from) path += `&from=${encodeURIComponent(from)}`;
    const answer = await api.get(path);
    if (answer.status !== 200) throw new Error(refusal(answer));
    for (const record of answer.body.events || []) {
      // A record the services stepped over changed nothing.
      if (record.skip_reason == null && record.payload && record.payload.data) {
        events.push({ sequence: record.sequence, envelope: record.payload });
      } else {
        counts.skipped += 1;
      }
    }
    if (events.length > MAX_REPORT_EVENTS) throw new Error(t("op_too_many_events", { max: MAX_REPORT_EVENTS }));
    onProgress(type, events.length);
    const next = answer.body.next;
    if (next == null) return;
    if (next <= after) throw new Error(`${path}: the next page does not move forward`);
    after = next;
  }
}

/// The day's usage per lease, GPU and hour; node by node where the fleet's
/// day is more than one answer holds.
async function readUsage(start, end, nodes, warnings) {
  const base = `/v1/usage?from=${encodeURIComponent(rfc3339(start))}&to=${encodeURIComponent(rfc3339(end))}&step=3600`;
  const whole = await api.get(base);
  if (whole.status === 200) return [whole.body];
  if (!(whole.status === 422 && whole.body && whole.body.field === "step")) {
    warnings.push(t("op_usage_missing", { status: whole.status }));
    return [];
  }
  const answers = [];
  for (const node of nodes) {
    const one = await api.get(`${base}&node=${encodeURIComponent(node)}`);
    if (one.status === 200) answers.push(one.body);
    else warnings.push(`${node}: ${t("op_usage_missing", { status: one.status })}`);
  }
  return answers;
}

/// The log's events folded into the day's inventory, runs on GPUs, waits
/// and interruptions (model.rs).
function foldDay(start, asOf, events) {
  const end = start + MS_PER_DAY;
  const leases = new Map();
  const inventory = new Map();
  const runs = [];
  const interruptions = [];
  const lease = (id) => {
    if (!leases.has(id)) leases.set(id, { tenant: null, tier: null, requested: null, placement: null, running: null, firstStarted: null, interrupted: null, ended: false, rejected: false });
    return leases.get(id);
  };
  const clip = (s, e) => { const a = Math.max(s, start); const b = Math.min(e, end); return a < b ? [a, b] : null; };
  const closeRun = (id, at, how) => {
    const l = leases.get(id);
    if (!l || !l.running) return;
    const { since, node, gpus } = l.running;
    l.running = null;
    const span = clip(since, at);
    if (span) runs.push({ lease: id, tenant: l.tenant, tier: l.tier, node, gpus, start: span[0], end: span[1], endedBy: how === "open" || at >= end ? "open" : how });
  };
  const closeInterruption = (id, at) => {
    const l = leases.get(id);
    if (!l || !l.interrupted) return;
    const { since, reason } = l.interrupted;
    l.interrupted = null;
    const span = clip(since, at);
    if (span) interruptions.push({ lease: id, tenant: l.tenant, from: span[0], to: span[1], reason });
  };
  const event = (env) => {
    if (Date.parse(env.occurred_at) >= end) return;
    const d = env.data;
    const type = d.type || env.type;
    if (type.startsWith("lease.") && d.lease_id) {
      const l = lease(d.lease_id);
      if (!l.tenant) l.tenant = env.tenant_id || null;
    }
    switch (type) {
      case "node.registered":
        for (const key of [...inventory.keys()]) if (inventory.get(key).node === d.node_id) inventory.delete(key);
        for (const g of d.gpus || []) {
          inventory.set(`${d.node_id}\u0000${g.index}`, { node: d.node_id, index: g.index, uuid: g.uuid, model: g.model, zone: d.zone, memoryMib: g.vram_gb * 1024 });
        }
        break;
      case "node.restated":
        // A node or lease whose first events expired is known from its
        // restatement; one already known takes nothing from it.
        if (![...inventory.values()].some((g) => g.node === d.node_id)) for (const s of d.history || []) event(s.envelope);
        break;
      case "lease.restated": {
        const known = leases.get(d.lease_id);
        if (!(known && (known.requested != null || known.placement))) for (const s of d.history || []) event(s.envelope);
        break;
      }
      case "lease.requested": {
        const l = lease(d.lease_id);
        l.tenant = d.tenant_id;
        l.tier = d.tier;
        if (l.requested == null) l.requested = Date.parse(env.occurred_at);
        break;
      }
      case "lease.rejected":
        lease(d.lease_id).rejected = true;
        break;
      case "lease.placed":
        lease(d.lease_id).placement = { node: d.node_id, gpus: (d.gpus || []).map((g) => g.index) };
        break;
      case "lease.started": {
        const at = Date.parse(d.started_at);
        closeRun(d.lease_id, at, "moved");
        closeInterruption(d.lease_id, at);
        const l = lease(d.lease_id);
        const gpus = l.placement && l.placement.node === d.node_id ? l.placement.gpus : [];
        l.running = { since: at, node: d.node_id, gpus };
        if (l.firstStarted == null) l.firstStarted = at;
        break;
      }
      case "lease.migrated": {
        // Anything but a drain interrupts the lease (lh_domain::moves).
        const failure = !d.reason.endsWith(" drained");
        const at = Date.parse(d.billing_ends_at);
        closeRun(d.lease_id, at, failure ? "failed_over" : "moved");
        const l = lease(d.lease_id);
        if (failure && l.firstStarted != null && !l.interrupted) l.interrupted = { since: at, reason: d.reason };
        l.placement = d.to ? { node: d.to.node_id, gpus: (d.to.gpus || []).map((g) => g.index) } : null;
        break;
      }
      case "lease.suspended": {
        const at = Date.parse(d.suspended_at);
        closeRun(d.lease_id, at, "suspended");
        closeInterruption(d.lease_id, at);
        lease(d.lease_id).placement = null;
        break;
      }
      case "lease.ended": {
        const at = Date.parse(d.ended_at);
        closeRun(d.lease_id, at, d.reason === "preempted" ? "preempted" : "ended");
        closeInterruption(d.lease_id, at);
        lease(d.lease_id).ended = true;
        break;
      }
      default:
    }
  };
  events.sort((a, b) => a.sequence - b.sequence);
  for (const e of events) event(e.envelope);
  for (const id of leases.keys()) { closeRun(id, asOf, "open"); closeInterruption(id, asOf); }
  const waits = [];
  for (const [id, l] of leases) {
    if (l.requested == null || l.requested < start || l.requested >= end) continue;
    waits.push({ lease: id, requested: l.requested, firstRunning: l.firstStarted != null && l.firstStarted < end ? l.firstStarted : null, withdrawn: l.firstStarted == null && (l.rejected || l.ended) });
  }
  return { gpus: [...inventory.values()], runs, waits, interruptions };
}

/// Nearest rank: the ⌈p·n⌉-th smallest.
function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  return sorted[Math.min(sorted.length, Math.max(1, Math.ceil(p * sorted.length))) - 1];
}

/// The day's numbers (engine.rs).
function computeDay(start, asOf, day, usage) {
  const end = start + MS_PER_DAY;
  const hoursKnown = Math.max(0, Math.min(HOURS_PER_DAY, Math.ceil((Math.min(asOf, end) - start) / MS_PER_HOUR)));
  const rows = day.gpus
    .map((g) => ({ ...g, vram: new Array(HOURS_PER_DAY).fill(0), leased: new Array(HOURS_PER_DAY).fill(false) }))
    .sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : a.index - b.index));
  const rowOf = new Map(rows.map((r, i) => [`${r.node}\u0000${r.index}`, i]));
  const bars = [];
  for (const run of day.runs) {
    for (const idx of run.gpus) {
      const row = rowOf.get(`${run.node}\u0000${idx}`);
      if (row === undefined) continue;
      const first = Math.floor((run.start - start) / MS_PER_HOUR);
      const last = Math.ceil((run.end - start) / MS_PER_HOUR);
      for (let h = Math.max(0, first); h < Math.min(HOURS_PER_DAY, last); h++) rows[row].leased[h] = true;
      bars.push({ row, lease: run.lease, tenant: run.tenant, tier: run.tier, startH: (run.start - start) / MS_PER_HOUR, endH: (run.end - start) / MS_PER_HOUR, mark: run.endedBy === "preempted" || run.endedBy === "failed_over" ? run.endedBy : null });
    }
  }
  // Utilisation is the device's: leases sharing a GPU see the same
  // figure, so an hour takes the highest, not the sum.
  const utilisation = new Map();
  for (const answer of usage) {
    for (const s of answer.series || []) {
      const row = rowOf.get(`${s.node_id}\u0000${s.gpu_index}`);
      if (row === undefined) continue;
      for (const p of s.points || []) {
        const ms = Date.parse(p.at) - start;
        if (ms < 0 || ms >= MS_PER_DAY || ms % MS_PER_HOUR !== 0) continue;
        const hour = ms / MS_PER_HOUR;
        const share = Math.min(p.minutes, 60) / 60;
        rows[row].vram[hour] += (p.memory_used_mib_avg * share * 100) / Math.max(1, rows[row].memoryMib);
        if (p.utilization_pct_avg != null) {
          const k = `${row}:${hour}`;
          utilisation.set(k, Math.max(utilisation.get(k) ?? p.utilization_pct_avg, p.utilization_pct_avg));
        }
      }
    }
  }
  const groups = new Map();
  rows.forEach((r, i) => {
    const k = `${r.model}\u0000${r.zone}`;
    if (!groups.has(k)) groups.set(k, { model: r.model, zone: r.zone, gpus: 0, hours: 0, leased: 0, sum: 0, n: 0 });
    const g = groups.get(k);
    g.gpus += 1;
    for (let h = 0; h < hoursKnown; h++) {
      g.hours += 1;
      if (!r.leased[h]) continue;
      g.leased += 1;
      const u = utilisation.get(`${i}:${h}`);
      if (u !== undefined) { g.sum += u; g.n += 1; }
    }
  });
  const byModelZone = [...groups.values()]
    .sort((a, b) => (a.model + "\u0000" + a.zone < b.model + "\u0000" + b.zone ? -1 : 1))
    .map((g) => ({ ...g, idle: g.hours === 0 ? 0 : (g.hours - g.leased) / g.hours, util: g.n > 0 ? g.sum / g.n : null }));
  const peaks = [...Array(HOURS_PER_DAY).keys()]
    .map((h) => ({ hour: h, gpus: rows.filter((r) => r.leased[h]).length }))
    .filter((p) => p.gpus > 0)
    .sort((a, b) => b.gpus - a.gpus || a.hour - b.hour)
    .slice(0, PEAK_HOURS);
  const waits = day.waits.filter((w) => w.firstRunning != null).map((w) => Math.max(0, (w.firstRunning - w.requested) / 1000)).sort((a, b) => a - b);
  const queue = {
    started: waits.length,
    stillWaiting: day.waits.filter((w) => w.firstRunning == null && !w.withdrawn).length,
    mean: waits.length ? waits.reduce((a, b) => a + b, 0) / waits.length : null,
    p95: percentile(waits, 0.95),
  };
  // A lease on several GPUs runs once: its seconds count per lease, its
  // runs' overlaps merged.
  const perLease = new Map();
  for (const run of day.runs) {
    if (!perLease.has(run.lease)) perLease.set(run.lease, []);
    perLease.get(run.lease).push([Math.max(run.start, start), Math.min(run.end, end)]);
  }
  let runningSecs = 0;
  for (const spans of perLease.values()) {
    spans.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    let covered = null;
    for (const [s, e] of spans) {
      if (covered && s <= covered[1]) covered[1] = Math.max(covered[1], e);
      else { if (covered) runningSecs += Math.floor((covered[1] - covered[0]) / 1000); covered = [s, e]; }
    }
    if (covered) runningSecs += Math.floor((covered[1] - covered[0]) / 1000);
  }
  const downtimeSecs = day.interruptions.reduce((sum, i) => sum + Math.max(0, Math.floor((Math.min(i.to, end) - Math.max(i.from, start)) / 1000)), 0);
  const expected = runningSecs + downtimeSecs;
  const ranWith = (how) => new Set(day.runs.filter((r) => r.endedBy === how).map((r) => r.lease)).size;
  return {
    rows, bars, byModelZone, peaks, queue,
    availability: { pct: expected > 0 ? 100 * (1 - downtimeSecs / expected) : null, downtimeSecs, count: day.interruptions.length },
    interruptions: [...day.interruptions].sort((a, b) => a.from - b.from),
    leases: new Set(day.runs.map((r) => r.lease)).size,
    preemptions: ranWith("preempted"),
    failovers: day.runs.filter((r) => r.endedBy === "failed_over").length,
    gpuHours: rows.length * hoursKnown,
    leasedGpuHours: rows.reduce((n, r) => n + r.leased.filter(Boolean).length, 0),
  };
}

/// Reads the day and computes it; `onProgress(type, events)` while it reads.
async function readDay(date, onProgress) {
  const start = Date.parse(date + "T00:00:00Z");
  const end = start + MS_PER_DAY;
  const asOf = Math.min(Math.max(Date.now(), start), end);
  const events = [];
  const counts = { skipped: 0 };
  const to = rfc3339(end);
  const lookback = rfc3339(start - LOOKBACK_DAYS * MS_PER_DAY);
  for (const type of NODE_EVENT_TYPES) await readType(type, null, to, events, counts, onProgress);
  for (const type of LEASE_EVENT_TYPES) await readType(type, lookback, to, events, counts, onProgress);
  const day = foldDay(start, asOf, events);
  if (day.gpus.length > MAX_REPORT_GPUS) throw new Error(t("op_too_many_gpus", { n: day.gpus.length, max: MAX_REPORT_GPUS }));
  const warnings = [];
  onProgress("usage", events.length);
  const usage = await readUsage(start, end, [...new Set(day.gpus.map((g) => g.node))], warnings);
  if (counts.skipped > 0) warnings.push(t("op_skipped_records", { n: counts.skipped }));
  return { date, start, soFar: asOf < end, report: computeDay(start, asOf, day, usage), warnings };
}

const pct = (v, digits = 1) => (v == null ? "–" : `${v.toFixed(digits)}%`);
const secs = (v) => (v == null ? "–" : `${v.toFixed(1)} s`);
const clock = (ms) => new Date(ms).toISOString().slice(11, 19);
const hh = (h) => String(h).padStart(2, "0") + ":00";
/// `hh:mm:ss` of an hour of the day, 24:00:00 at its end.
const hourClock = (h) => (h >= HOURS_PER_DAY ? "24:00:00" : clock(h * MS_PER_HOUR));

/// Colours of the bars: by tier, a fixed one each; by tenant, one of a
/// palette in the order the tenants first appear.
const TIER_COLOURS = { basic: "#1f5fbf", performance: "#7b3fb0", spot: "#c77700", reserved: "#1e7d32" };
const PALETTE = ["#1f5fbf", "#c77700", "#1e7d32", "#7b3fb0", "#b3261e", "#00838f", "#6d4c41", "#ad1457", "#558b2f", "#37474f"];

export function DailyReport({ id }) {
  const today = utcDay(Date.now());
  const date = /^\d{4}-\d{2}-\d{2}$/.test(id || "") ? id : today;
  const [chosen, setChosen] = useState(date);
  const [again, setAgain] = useState(0);
  const [state, setState] = useState(null);
  const [colourBy, setColourBy] = useState("tier");
  useEffect(() => setChosen(date), [date]);
  // Read once per day asked and per "read again": not on every change of
  // the event stream, since each page read leaves a record in the trail.
  useEffect(() => {
    if (date > today) { setState({ error: t("op_future_day") }); return undefined; }
    let live = true;
    setState({ reading: { what: NODE_EVENT_TYPES[0], events: 0 } });
    readDay(date, (what, events) => live && setState({ reading: { what, events } }))
      .then((day) => live && setState({ day }))
      .catch((e) => live && setState({ error: String(e.message || e) }));
    return () => { live = false; };
  }, [date, again]);
  const show = (e) => {
    e.preventDefault();
    if (/^\d{4}-\d{2}-\d{2}$/.test(chosen)) location.hash = "#/report/" + chosen;
  };
  return html`<section aria-labelledby="report-title">
    <h2 id="report-title">${t("op_report")}</h2>
    <form class="inline" onSubmit=${show} id="report-form">
      <label for="report-date">${t("op_report_date")}</label>
      <input id="report-date" type="date" max=${today} value=${chosen} onInput=${(e) => setChosen(e.target.value)} />
      <button type="submit" id="report-show">${t("op_show")}</button>
      <button type="button" class="plain" id="report-again" onClick=${() => setAgain((n) => n + 1)}>${t("op_refresh")}</button>
    </form>
    <p class="muted">${t("op_report_hint")}</p>
    ${!state ? "" : state.error ? html`<p class="error" role="alert" id="report-error">${state.error}</p>`
      : state.reading ? html`<p aria-live="polite" id="report-reading">${t("op_reading", state.reading)}</p>`
      : html`<${Day} day=${state.day} colourBy=${colourBy} onColourBy=${setColourBy} />`}
  </section>`;
}

function Day({ day, colourBy, onColourBy }) {
  const r = day.report;
  const verdict = (ok) => (ok == null ? "" : ok ? ` (${t("op_met")})` : ` (${t("op_missed")})`);
  const waitOk = r.queue.p95 == null ? null : r.queue.p95 <= QUEUE_WAIT_TARGET_SECS;
  const availOk = r.availability.pct == null ? null : r.availability.pct >= AVAILABILITY_TARGET_PCT;
  const idle = r.gpuHours === 0 ? null : (100 * (r.gpuHours - r.leasedGpuHours)) / r.gpuHours;
  const stat = (id, label, value) => html`<div><dt>${label}</dt><dd id=${id}>${value}</dd></div>`;
  return html`<div id="report-day" data-date=${day.date}>
    <h3 id="report-day-title">${t("op_report_for", { date: day.date, sofar: day.soFar ? t("op_so_far") : "" })}</h3>
    ${day.warnings.map((w) => html`<p class="error" role="alert">${w}</p>`)}
    <dl id="report-summary" class="stats">
      ${stat("report-gpus", t("op_gpus_n"), r.rows.length)}
      ${stat("report-leases", t("op_leases_ran"), r.leases)}
      ${stat("report-leased-hours", t("op_leased_hours"), `${r.leasedGpuHours} / ${r.gpuHours}`)}
      ${stat("report-idle", t("op_idle_rate"), pct(idle))}
      ${stat("report-wait", t("op_queue_wait"), `${secs(r.queue.p95)} / ${secs(r.queue.mean)} · ${t("op_target", { target: QUEUE_WAIT_TARGET_SECS + " s" })}${verdict(waitOk)}`)}
      ${stat("report-waiting", t("op_still_waiting"), r.queue.stillWaiting)}
      ${stat("report-availability", t("op_availability"), `${pct(r.availability.pct, 3)} · ${t("op_target", { target: AVAILABILITY_TARGET_PCT + "%" })}${verdict(availOk)}`)}
      ${stat("report-preemptions", t("op_preemptions"), r.preemptions)}
      ${stat("report-failovers", t("op_failovers"), r.failovers)}
    </dl>
    ${r.rows.length === 0 ? html`<p id="report-no-gpus">${t("op_no_gpus_day")}</p>` : html`
      <${Heat} rows=${r.rows} />
      <${Timeline} report=${r} colourBy=${colourBy} onColourBy=${onColourBy} />
      <${ModelZones} groups=${r.byModelZone} />`}
    <h4 id="peaks-title">${t("op_peak_hours")}</h4>
    ${r.peaks.length === 0 ? html`<p>${t("op_none")}</p>` : html`<ol id="report-peaks">${r.peaks.map((p) =>
      html`<li>${hh(p.hour)}–${hh(p.hour + 1)} · ${t("op_gpus_leased", { n: p.gpus })}</li>`)}</ol>`}
    ${r.interruptions.length > 0 && html`<h4 id="interruptions-title">${t("op_interruptions")}</h4>
      <table id="report-interruptions"><thead><tr><th>${t("lease")}</th><th>${t("op_from")}</th><th>${t("op_to")}</th><th>${t("op_reason")}</th></tr></thead>
      <tbody>${r.interruptions.map((i) => html`<tr><td><code>${i.lease}</code></td><td>${clock(i.from)}</td><td>${clock(i.to)}</td><td>${i.reason}</td></tr>`)}</tbody></table>`}
  </div>`;
}

function Heat({ rows }) {
  const hours = [...Array(HOURS_PER_DAY).keys()];
  return html`<h4 id="heat-title">${t("op_heat_map")}</h4>
    <div class="scroll"><table id="report-heat" class="day-heat" aria-labelledby="heat-title">
      <thead><tr><th>${t("op_gpu")}</th>${hours.map((h) => html`<th class="hour">${String(h).padStart(2, "0")}</th>`)}</tr></thead>
      <tbody>${rows.map((r) => html`<tr data-gpu=${r.node + "/" + r.index}>
        <th scope="row">${r.node}/${r.index} <span class="muted">${r.model}</span></th>
        ${hours.map((h) => {
          const v = r.vram[h];
          const label = `${r.node}/${r.index} ${hh(h)} · VRAM ${v.toFixed(0)}%${r.leased[h] ? " · " + t("held") : ""}`;
          return html`<td class=${"vram-" + Math.min(VRAM_SHADES, Math.round(v / VRAM_SHADES)) + (r.leased[h] ? " leased" : "")}
            title=${label} aria-label=${label}></td>`;
        })}</tr>`)}</tbody>
    </table></div>`;
}

function Timeline({ report, colourBy, onColourBy }) {
  const labelW = 150;
  const width = 960;
  const rowH = 14;
  const x = (hour) => labelW + (hour / HOURS_PER_DAY) * (width - labelW);
  const tenants = [];
  for (const b of report.bars) if (b.tenant && !tenants.includes(b.tenant)) tenants.push(b.tenant);
  const colour = (b) => (colourBy === "tenant"
    ? (b.tenant ? PALETTE[tenants.indexOf(b.tenant) % PALETTE.length] : "#5b6577")
    : TIER_COLOURS[b.tier] || "#5b6577");
  const height = report.rows.length * rowH + 20;
  const legend = colourBy === "tenant"
    ? tenants.map((tenant) => [tenant, PALETTE[tenants.indexOf(tenant) % PALETTE.length]])
    : Object.entries(TIER_COLOURS);
  return html`<h4 id="timeline-title">${t("op_timeline")}</h4>
    <p class="inline">
      <label for="report-colour">${t("op_colour_by")}</label>
      <select id="report-colour" value=${colourBy} onChange=${(e) => onColourBy(e.target.value)}>
        <option value="tier">${t("op_by_tier")}</option><option value="tenant">${t("op_by_tenant")}</option>
      </select>
    </p>
    <div class="scroll"><svg id="report-timeline" role="img" aria-labelledby="timeline-title" width=${width} height=${height}
        viewBox=${`0 0 ${width} ${height}`}>
      ${[...Array(HOURS_PER_DAY + 1).keys()].map((h) => html`<line x1=${x(h)} x2=${x(h)} y1="0" y2=${height - 16} class="grid" />
        ${h % 3 === 0 && h < HOURS_PER_DAY ? html`<text x=${x(h) + 2} y=${height - 4} class="axis">${hh(h)}</text>` : ""}`)}
      ${report.rows.map((r, i) => html`<text x="0" y=${i * rowH + 11} class="axis">${r.node}/${r.index}</text>`)}
      ${report.bars.map((b) => {
        const y = b.row * rowH + 2;
        const x0 = x(b.startH);
        const x1 = Math.max(x0 + 1, x(b.endH));
        return html`<g class="bar" data-lease=${b.lease}>
          <rect x=${x0} y=${y} width=${x1 - x0} height=${rowH - 4} fill=${colour(b)}>
            <title>${b.lease} · ${b.tier || "–"} · ${hourClock(b.startH)}–${hourClock(b.endH)}</title>
          </rect>
          ${b.mark === "preempted" && html`<polygon points=${`${x1},${y} ${x1 + 6},${y + rowH - 4} ${x1 - 6},${y + rowH - 4}`} fill="#000" />`}
          ${b.mark === "failed_over" && html`<polygon points=${`${x1},${y - 1} ${x1 + 5},${y + (rowH - 4) / 2} ${x1},${y + rowH - 3} ${x1 - 5},${y + (rowH - 4) / 2}`} fill="#1f5fbf" />`}
        </g>`;
      })}
    </svg></div>
    <ul class="legend" id="report-legend">
      ${legend.map(([name, fill]) => html`<li><svg width="12" height="12" aria-hidden="true"><rect width="12" height="12" fill=${fill} /></svg> ${name}</li>`)}
      <li>${t("op_preempted_mark")}</li><li>${t("op_failover_mark")}</li>
    </ul>`;
}

function ModelZones({ groups }) {
  return html`<h4 id="models-title">${t("op_by_model_zone")}</h4>
    <table id="report-models" aria-labelledby="models-title">
      <thead><tr><th>${t("model")}</th><th>${t("zone")}</th><th class="num">${t("op_gpus_n")}</th><th class="num">${t("op_gpu_hours")}</th>
        <th class="num">${t("op_leased_hours")}</th><th class="num">${t("op_idle_rate")}</th><th class="num">${t("op_utilisation_avg")}</th></tr></thead>
      <tbody>${groups.map((g) => html`<tr data-group=${g.model + "/" + g.zone}>
        <td>${g.model}</td><td>${g.zone}</td><td class="num">${g.gpus}</td><td class="num">${g.hours}</td>
        <td class="num">${g.leased}</td><td class="num">${pct(g.idle * 100)}</td><td class="num">${pct(g.util)}</td></tr>`)}</tbody>
    </table>`;
}
