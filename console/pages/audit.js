// The auditor's page: whether the log's hash chain holds, and the trail
// itself, filtered, paged and exported whole. Every read of the trail by
// an operator is itself recorded (audit.accessed), so nothing here reads
// it again on its own: only the auditor's own asking does.

import { useEffect, useRef, useState } from "../vendor/hooks.mjs";
import * as api from "../api.js";
import { addWords, t } from "../i18n.js";
import { Failed, html } from "../ui.js";

addWords({
  en: {
    audit: "Audit",
    audit_verify_title: "Chain verification",
    audit_verified: "Verified: the hash chain holds up to sequence {sequence}.",
    audit_broken: "NOT verified: the chain breaks at sequence {at}.",
    audit_unverifiable: "NOT verified: {why}",
    audit_bad_checkpoint: "NOT verified: checkpoint for sequence {at} does not hold ({why}).",
    audit_not_ok: "NOT verified.",
    audit_verifying: "Verifying…",
    audit_reverify: "Re-verify",
    audit_reverify_full: "Re-verify from the start",
    audit_full_hint: "From the start replays the whole log; it may take minutes.",
    audit_events_chained: "Events chained",
    audit_head: "Chain head",
    audit_checked_from: "Checked from sequence",
    audit_checked_this_run: "Events checked by this run",
    audit_checkpoints: "Signed checkpoints verified",
    audit_of: "{ok} of {all}",
    audit_verified_to: "Verified up to sequence",
    audit_last_checkpoint: "Resumed from the verified checkpoint",
    audit_anchor: "Anchor (oldest events expired)",
    audit_first_bad: "First checkpoint that does not hold",
    audit_run: "Verification run",
    audit_at_sequence: "sequence {sequence}, {events} events, head {head}",
    audit_none: "none",
    audit_trail_title: "Audit trail",
    audit_tenant: "Tenant id",
    audit_actor: "Actor",
    audit_actor_hint: "tenant:<id>, admin:<name>, auditor:<name>, service:<name>, node:<id>",
    audit_type: "Event type",
    audit_from: "From (RFC 3339, UTC)",
    audit_to: "Before (RFC 3339, UTC)",
    audit_filter: "Filter",
    audit_clear: "Clear",
    audit_seq: "Seq",
    audit_time: "Time",
    audit_object: "Object",
    audit_outcome: "Outcome",
    audit_payload: "Event",
    audit_no_records: "No records match.",
    audit_shown: "{count} records shown, oldest first.",
    audit_more: "More",
    audit_export_title: "Export",
    audit_export_hint: "Every record that matches the filters above, read {page} at a time, at most {max}.",
    audit_format: "Format",
    audit_export: "Export",
    audit_cancel: "Cancel",
    audit_exporting: "Exporting… {count} records read.",
    audit_exported: "Exported {count} records to {name}.",
    audit_truncated: "Stopped at {max} records: the file holds only the first ones. Narrow the filters, or use `lh audit export`.",
    audit_cancelled: "Export cancelled after {count} records; nothing saved.",
  },
  zh: {
    audit: "审计",
    audit_verify_title: "哈希链校验",
    audit_verified: "已校验：哈希链完整，直至序号 {sequence}。",
    audit_broken: "未通过校验：哈希链在序号 {at} 处断开。",
    audit_unverifiable: "未通过校验：{why}",
    audit_bad_checkpoint: "未通过校验：序号 {at} 的检查点不成立（{why}）。",
    audit_not_ok: "未通过校验。",
    audit_verifying: "校验中…",
    audit_reverify: "重新校验",
    audit_reverify_full: "从头重新校验",
    audit_full_hint: "从头校验会重放整个日志，可能需要数分钟。",
    audit_events_chained: "已链接事件数",
    audit_head: "链头",
    audit_checked_from: "校验起始序号",
    audit_checked_this_run: "本次校验的事件数",
    audit_checkpoints: "已验证的签名检查点",
    audit_of: "{ok} / {all}",
    audit_verified_to: "已校验至序号",
    audit_last_checkpoint: "本次从已验证的检查点续验",
    audit_anchor: "锚点（更早的事件已过期）",
    audit_first_bad: "首个不成立的检查点",
    audit_run: "校验轮次",
    audit_at_sequence: "序号 {sequence}，{events} 个事件，链头 {head}",
    audit_none: "无",
    audit_trail_title: "审计记录",
    audit_tenant: "租户 ID",
    audit_actor: "操作者",
    audit_actor_hint: "tenant:<id>、admin:<名称>、auditor:<名称>、service:<名称>、node:<id>",
    audit_type: "事件类型",
    audit_from: "起始时间（RFC 3339，UTC）",
    audit_to: "截止时间（RFC 3339，UTC，不含）",
    audit_filter: "筛选",
    audit_clear: "清除",
    audit_seq: "序号",
    audit_time: "时间",
    audit_object: "对象",
    audit_outcome: "结果",
    audit_payload: "事件",
    audit_no_records: "没有符合条件的记录。",
    audit_shown: "已显示 {count} 条记录，按时间先后排列。",
    audit_more: "更多",
    audit_export_title: "导出",
    audit_export_hint: "导出符合上述筛选条件的全部记录，每次读取 {page} 条，最多 {max} 条。",
    audit_format: "格式",
    audit_export: "导出",
    audit_cancel: "取消",
    audit_exporting: "导出中… 已读取 {count} 条记录。",
    audit_exported: "已导出 {count} 条记录到 {name}。",
    audit_truncated: "已在 {max} 条处停止：文件只包含最早的记录。请缩小筛选范围，或使用 `lh audit export`。",
    audit_cancelled: "导出已在 {count} 条记录后取消，未保存任何文件。",
  },
});

/// Records on screen per page: the API's default page.
const SHOWN_PAGE_RECORDS = 100;
/// Records per page of an export: the most one page of the API holds.
const EXPORT_PAGE_RECORDS = 1000;
/// Most records one export holds: the browser keeps them all in memory
/// until the file is saved; a larger trail goes out with `lh audit export`.
const MAX_EXPORT_RECORDS = 200000;
/// The API's filters, named as its query names them.
const FILTERS = ["tenant_id", "actor", "type", "from", "to"];
const NO_FILTERS = Object.fromEntries(FILTERS.map((f) => [f, ""]));
/// Columns of a CSV export: `lh audit export --format csv`'s, then the event.
const CSV_COLUMNS = ["sequence", "occurred_at", "actor", "event_type", "object", "outcome", "tenant_id", "subject"];

/// The path of one page of records matching `filters`.
function pagePath(filters, after, limit) {
  const q = new URLSearchParams();
  for (const name of FILTERS) {
    const value = (filters[name] || "").trim();
    if (value) q.set(name, value);
  }
  if (after) q.set("after", String(after));
  q.set("limit", String(limit));
  return "/v1/audit/events?" + q.toString();
}

/// What went wrong with an answer, in the API's words where it gave some.
function problem(answer) {
  return (answer.body && answer.body.detail) || `${t("unreachable")} (${answer.status})`;
}

/// One CSV cell: quoted where it must be, and never run as a spreadsheet
/// formula (a leading = + - @ is quoted away, as the CLI does).
function csvCell(value) {
  let text = value == null ? "" : typeof value === "object" ? JSON.stringify(value) : String(value);
  const number = text !== "" && Number.isFinite(Number(text));
  if (!number && /^[=+\-@\t\r]/.test(text)) text = "'" + text;
  return /[",\n\r]/.test(text) ? '"' + text.replaceAll('"', '""') + '"' : text;
}

/// The members of the JSON object (or the elements of the array) `text`
/// is, each as the gateway wrote it: `[key, text]` pairs, the key null for
/// an array's elements. Parsed and written again, a record would not be
/// the API's: 50.0 comes back as 50.
export function rawParts(text) {
  const parts = [];
  let depth = 0;
  let inString = false;
  let escaped = false;
  let object = false;
  let key = null;
  let keyFrom = -1;
  let from = -1;
  const close = (i) => {
    const raw = from >= 0 ? text.slice(from, i).trim() : "";
    if (raw) parts.push([key, raw]);
    from = -1;
    key = null;
  };
  for (let i = 0; i < text.length; i += 1) {
    const c = text[i];
    if (inString) {
      if (escaped) escaped = false;
      else if (c === "\\") escaped = true;
      else if (c === '"') inString = false;
      continue;
    }
    if (c === '"') {
      inString = true;
    } else if (depth === 1 && c === ",") {
      close(i);
      if (object) keyFrom = i + 1;
      else from = i + 1;
    } else if (depth === 1 && c === ":" && object) {
      key = JSON.parse(text.slice(keyFrom, i));
      from = i + 1;
    } else if (c === "{" || c === "[") {
      depth += 1;
      if (depth === 1) {
        object = c === "{";
        if (object) keyFrom = i + 1;
        else from = i + 1;
      }
    } else if (c === "}" || c === "]") {
      if (depth === 1) close(i);
      depth -= 1;
    }
  }
  return parts;
}

/// A page's records, each parsed and as written; refused where the two
/// readings do not agree on how many there are.
function pageRecords(text) {
  const page = JSON.parse(text);
  const events = new Map(rawParts(text)).get("events") || "[]";
  const raw = rawParts(events).map(([, r]) => r);
  if (raw.length !== page.events.length) throw new Error("the page's records cannot be told apart");
  return { page, records: page.events.map((parsed, i) => ({ parsed, raw: raw[i] })) };
}

/// A CSV export: the columns, then the event as it was written.
function asCsv(records) {
  const rows = [CSV_COLUMNS.concat("payload").join(",")];
  for (const { parsed, raw } of records) {
    const payload = new Map(rawParts(raw)).get("payload") || "";
    rows.push(CSV_COLUMNS.map((c) => csvCell(parsed[c])).concat(csvCell(payload)).join(","));
  }
  return rows.join("\n") + "\n";
}

/// One line per record, each the API's record as it came.
function asJsonLines(records) {
  return records.map(({ raw }) => raw + "\n").join("");
}

function Verification({ role }) {
  const [answer, setAnswer] = useState(null);
  const [busy, setBusy] = useState(false);
  const run = async (full) => {
    setBusy(true);
    try {
      setAnswer(await api.get("/v1/audit/verify" + (full ? "?full=true" : "")));
    } catch (_) {
      setAnswer({ status: 0 });
    }
    setBusy(false);
  };
  useEffect(() => { run(false); }, []);
  const r = answer && answer.status === 200 ? answer.body : null;
  const at = (c) => (c ? t("audit_at_sequence", { sequence: c.sequence, events: c.events, head: c.head.slice(0, 16) + "…" }) : t("audit_none"));
  let status = "";
  if (r && r.ok) status = t("audit_verified", { sequence: r.sequence });
  else if (r && r.problem) status = t("audit_unverifiable", { why: r.problem });
  else if (r && r.first_mismatch != null) status = t("audit_broken", { at: r.first_mismatch });
  else if (r && r.first_bad_checkpoint) status = t("audit_bad_checkpoint", { at: r.first_bad_checkpoint.sequence, why: r.first_bad_checkpoint.reason });
  else if (r) status = t("audit_not_ok");
  return html`<section aria-labelledby="verify-title" class="panel" aria-busy=${busy ? "true" : "false"}>
    <h2 id="verify-title">${t("audit_verify_title")}</h2>
    ${!answer && html`<p>${t("audit_verifying")}</p>`}
    ${answer && !r && html`<${Failed} answer=${answer} />`}
    ${r && html`<p id="verify-status" class=${"verdict " + (r.ok ? "good" : "bad")} role=${r.ok ? "status" : "alert"}>${status}</p>
      <table id="verify-report"><tbody>
        <tr><th>${t("audit_verified_to")}</th><td id="verify-sequence" class="num">${r.sequence}</td></tr>
        <tr><th>${t("audit_events_chained")}</th><td class="num">${r.events}</td></tr>
        <tr><th>${t("audit_head")}</th><td><code class="wrap">${r.head}</code></td></tr>
        <tr><th>${t("audit_checked_from")}</th><td class="num">${r.checked_from}</td></tr>
        <tr><th>${t("audit_checked_this_run")}</th><td class="num">${r.events_checked_this_run}</td></tr>
        <tr><th>${t("audit_checkpoints")}</th><td id="verify-checkpoints">${t("audit_of", { ok: r.checkpoints_verified, all: r.checkpoints })}</td></tr>
        <tr><th>${t("audit_last_checkpoint")}</th><td id="verify-last-checkpoint">${at(r.resumed_from)}</td></tr>
        ${r.anchor && html`<tr><th>${t("audit_anchor")}</th><td>${at(r.anchor)}</td></tr>`}
        ${r.first_bad_checkpoint && html`<tr><th>${t("audit_first_bad")}</th><td>${r.first_bad_checkpoint.sequence} (${r.first_bad_checkpoint.reason})</td></tr>`}
        <tr><th>${t("audit_run")}</th><td class="num">${r.run}</td></tr>
      </tbody></table>`}
    <p class="actions">
      <button type="button" id="reverify" disabled=${busy} onClick=${() => run(false)}>${busy ? t("audit_verifying") : t("audit_reverify")}</button>
      ${role === "admin" && html`<button type="button" class="plain" id="reverify-full" disabled=${busy} onClick=${() => run(true)}>${t("audit_reverify_full")}</button>
        <span class="muted">${t("audit_full_hint")}</span>`}
    </p>
  </section>`;
}

function Record({ r }) {
  return html`<tr data-seq=${r.sequence}>
    <td class="num">${r.sequence}</td><td>${r.occurred_at || "–"}</td><td>${r.actor || "–"}</td>
    <td class="type">${r.event_type || r.skip_reason || "–"}</td><td><code>${r.object || "–"}</code></td>
    <td>${r.outcome || "–"}</td><td><code>${r.tenant_id || "–"}</code></td>
    <td><details><summary>${t("audit_payload")}</summary><pre class="payload">${JSON.stringify(r.payload, null, 2)}</pre></details></td>
  </tr>`;
}

function Trail() {
  const [form, setForm] = useState(NO_FILTERS);
  const [shown, setShown] = useState(null);
  const [error, setError] = useState("");
  const [busy, setBusy] = useState(false);
  const [format, setFormat] = useState("jsonl");
  const [progress, setProgress] = useState(null);
  const cancelled = useRef(false);

  const read = async (filters, after, before) => {
    setBusy(true);
    try {
      const answer = await api.get(pagePath(filters, after, SHOWN_PAGE_RECORDS));
      if (answer.status !== 200) setError(problem(answer));
      else {
        setError("");
        setShown({ filters, records: before.concat(answer.body.events), next: answer.body.next });
      }
    } catch (_) {
      setError(t("unreachable"));
    }
    setBusy(false);
  };
  useEffect(() => { read(NO_FILTERS, 0, []); }, []);

  const exportAll = async () => {
    const filters = { ...form };
    const records = [];
    let after = 0;
    let truncated = false;
    cancelled.current = false;
    setProgress({ count: 0, running: true });
    try {
      for (;;) {
        const limit = Math.min(EXPORT_PAGE_RECORDS, MAX_EXPORT_RECORDS - records.length);
        const answer = await api.getText(pagePath(filters, after, limit));
        if (answer.status !== 200) {
          let body = null;
          try { body = JSON.parse(answer.text); } catch (_) { /* not JSON */ }
          throw new Error(problem({ status: answer.status, body }));
        }
        const { page, records: read } = pageRecords(answer.text);
        records.push(...read);
        setProgress({ count: records.length, running: true });
        if (cancelled.current) {
          setProgress({ count: records.length, cancelled: true });
          return;
        }
        if (page.next == null) break;
        if (records.length >= MAX_EXPORT_RECORDS) {
          truncated = true;
          break;
        }
        after = page.next;
      }
    } catch (e) {
      setProgress(null);
      setError(e.message || t("unreachable"));
      return;
    }
    const stamp = new Date().toISOString().replace(/[-:]|\.\d+/g, "");
    const name = `audit-trail-${stamp}${truncated ? "-partial" : ""}.${format}`;
    const blob = format === "csv"
      ? new Blob([asCsv(records)], { type: "text/csv;charset=utf-8" })
      : new Blob([asJsonLines(records)], { type: "application/jsonl" });
    api.saveBlob(blob, name);
    setProgress({ count: records.length, name, truncated });
  };

  const set = (field) => (e) => setForm({ ...form, [field]: e.target.value });
  const submit = (e) => {
    e.preventDefault();
    read({ ...form }, 0, []);
  };
  const clear = () => {
    setForm(NO_FILTERS);
    read(NO_FILTERS, 0, []);
  };
  const field = (name, id, label, hint) => html`<div class="field">
    <label for=${id}>${t(label)}</label>
    <input id=${id} name=${name} value=${form[name]} onInput=${set(name)} autocomplete="off"
      placeholder=${hint || ""} aria-describedby=${hint ? id + "-hint" : null} />
    ${hint && html`<span class="muted hint" id=${id + "-hint"}>${hint}</span>`}
  </div>`;
  const records = shown ? shown.records : [];
  return html`<section aria-labelledby="trail-title">
    <h2 id="trail-title">${t("audit_trail_title")}</h2>
    <form id="audit-filters" class="filters" onSubmit=${submit}>
      ${field("tenant_id", "audit-tenant", "audit_tenant")}
      ${field("actor", "audit-actor", "audit_actor", t("audit_actor_hint"))}
      ${field("type", "audit-type", "audit_type", "lease.placed")}
      ${field("from", "audit-from", "audit_from", "2026-12-01T00:00:00Z")}
      ${field("to", "audit-to", "audit_to", "2027-01-01T00:00:00Z")}
      <div class="field actions">
        <button type="submit" id="audit-filter" disabled=${busy}>${t("audit_filter")}</button>
        <button type="button" class="plain" id="audit-clear" onClick=${clear}>${t("audit_clear")}</button>
      </div>
    </form>
    ${error && html`<p class="error" role="alert" id="audit-error">${error}</p>`}

    <div class="panel" aria-labelledby="export-title" role="group">
      <h3 id="export-title">${t("audit_export_title")}</h3>
      <p class="muted">${t("audit_export_hint", { page: EXPORT_PAGE_RECORDS, max: MAX_EXPORT_RECORDS })}</p>
      <label for="export-format">${t("audit_format")}</label>
      <select id="export-format" value=${format} onChange=${(e) => setFormat(e.target.value)}>
        <option value="jsonl">JSON Lines</option>
        <option value="csv">CSV</option>
      </select>
      <button type="button" id="audit-export" disabled=${progress && progress.running} onClick=${exportAll}>${t("audit_export")}</button>
      ${progress && progress.running && html`<button type="button" class="plain" id="export-cancel" onClick=${() => { cancelled.current = true; }}>${t("audit_cancel")}</button>`}
      <p id="export-progress" aria-live="polite">${progress && (progress.running ? t("audit_exporting", { count: progress.count })
        : progress.cancelled ? t("audit_cancelled", { count: progress.count })
        : t("audit_exported", { count: progress.count, name: progress.name }))}</p>
      ${progress && progress.truncated && html`<p class="error" role="alert" id="export-truncated">${t("audit_truncated", { max: MAX_EXPORT_RECORDS })}</p>`}
    </div>

    ${shown && (records.length === 0 ? html`<p id="audit-empty">${t("audit_no_records")}</p>` : html`<table id="audit-table">
      <thead><tr><th class="num">${t("audit_seq")}</th><th>${t("audit_time")}</th><th>${t("audit_actor")}</th><th>${t("audit_type")}</th>
        <th>${t("audit_object")}</th><th>${t("audit_outcome")}</th><th>${t("audit_tenant")}</th><th>${t("audit_payload")}</th></tr></thead>
      <tbody>${records.map((r) => html`<${Record} key=${r.sequence} r=${r} />`)}</tbody>
    </table>`)}
    ${shown && html`<p class="actions"><span id="audit-count">${t("audit_shown", { count: records.length })}</span>
      ${shown.next != null && html` <button type="button" class="plain" id="audit-more" disabled=${busy}
        onClick=${() => read(shown.filters, shown.next, records)}>${t("audit_more")}</button>`}</p>`}
  </section>`;
}

/// The auditor's page (admins see it too): the chain's verification first,
/// then the trail.
export function Audit({ role }) {
  return html`<div id="audit-page">
    <${Verification} role=${role} />
    <${Trail} />
  </div>`;
}
