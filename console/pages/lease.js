// One lease: its state and timeline as they change, its GPUs' use as
// charts, what its workload wrote, a shell in the page, how to reach its
// web page and its SSH endpoint, a stop.

import { useEffect, useRef, useState } from "../vendor/hooks.mjs";
import * as api from "../api.js";
import { addWords, t } from "../i18n.js";
import { Failed, html, Loading, useAnswer, useEvery } from "../ui.js";
import { openShell, run } from "../shell.js";

addWords({
  en: {
    timeline: "Timeline",
    requested_at: "Asked for",
    placed_at: "Placed",
    started_at: "Running",
    suspended_at: "Suspended (idle)",
    preemption_at: "Preempted at",
    ended_at: "Ended",
    end_reason: "Why it ended",
    queued_because: "Waiting because",
    moved: "Moved to other GPUs",
    usage: "GPU use, last hour",
    no_usage: "No readings yet.",
    busy: "busy %",
    memory: "memory MiB",
    shell: "Shell",
    open_shell: "Open a shell",
    close_shell: "Close the shell",
    shell_hint: "A terminal inside the lease, as `lh lease shell` gives. Its input goes only to this lease.",
    shell_ended: "The shell ended with code {code}.",
    shell_refused: "The shell could not be opened: {error}. A lease takes a shell while it is running.",
    shell_running_only: "A shell opens while the lease is running.",
    shell_member: "Member",
    no_workload: "This lease runs no workload, so there is nothing to enter: ask for one with an image or a command.",
    web_page: "Its web page",
    web_page_hint: "A page the lease serves on a port (a notebook, a dashboard), at an address of its own.",
    web_port: "Port inside the lease",
    open_web: "Open the page",
    web_cli: "From a terminal instead:",
    web_refused: "The page could not be opened: {why}",
    ssh: "SSH",
    max: "max",
  },
  zh: {
    timeline: "时间线",
    requested_at: "提交",
    placed_at: "已分配",
    started_at: "开始运行",
    suspended_at: "因空闲挂起",
    preemption_at: "被抢占时间",
    ended_at: "结束",
    end_reason: "结束原因",
    queued_because: "等待原因",
    moved: "迁移到其他 GPU 的次数",
    usage: "GPU 使用情况（近一小时）",
    no_usage: "尚无读数。",
    busy: "利用率 %",
    memory: "显存 MiB",
    shell: "终端",
    open_shell: "打开终端",
    close_shell: "关闭终端",
    shell_hint: "租约内的终端，与 `lh lease shell` 相同。输入只发往此租约。",
    shell_ended: "终端已结束，退出码 {code}。",
    shell_refused: "无法打开终端：{error}。租约运行时才能打开终端。",
    shell_running_only: "租约运行时才能打开终端。",
    shell_member: "成员节点",
    no_workload: "此租约没有运行任何工作负载，因此无法进入：请在新建时指定镜像或命令。",
    web_page: "网页入口",
    web_page_hint: "租约在某个端口上提供的网页（如 Notebook、仪表盘），使用独立的地址打开。",
    web_port: "租约内的端口",
    open_web: "打开网页",
    web_cli: "也可以在终端中运行：",
    web_refused: "无法打开网页：{why}",
    ssh: "SSH",
    max: "最高",
  },
});

/// How often a running lease's logs are read again.
const LOGS_EVERY_MS = 3000;
/// How often anything is read again where nothing changes without an event.
const IDLE_EVERY_MS = 600000;
/// How often a running lease's GPU use is read again (readings come each
/// minute).
const USAGE_EVERY_MS = 30000;
/// Points drawn per series at most: an hour of minutes.
const MAX_CHART_POINTS = 120;
const CHART_WIDTH = 480;
const CHART_HEIGHT = 120;

/// One line chart: `values` from 0 to `top`, oldest first, as an SVG
/// polyline (markup, not style, so the page's policy allows it).
function Chart({ label, values, top, id }) {
  const shown = values.slice(-MAX_CHART_POINTS);
  const most = Math.max(top || 0, ...shown.filter((v) => v != null), 1);
  const step = shown.length > 1 ? CHART_WIDTH / (shown.length - 1) : 0;
  const points = shown
    .map((v, i) => (v == null ? null : `${(i * step).toFixed(1)},${(CHART_HEIGHT - (v / most) * CHART_HEIGHT).toFixed(1)}`))
    .filter(Boolean)
    .join(" ");
  const last = shown.filter((v) => v != null).pop();
  return html`<figure class="chart" id=${id}>
    <figcaption>${label}: <strong>${last == null ? "–" : Math.round(last)}</strong> <span class="muted">(${t("max")} ${Math.round(most)})</span></figcaption>
    <svg viewBox=${`0 0 ${CHART_WIDTH} ${CHART_HEIGHT}`} width=${CHART_WIDTH} height=${CHART_HEIGHT} role="img" aria-label=${label}>
      <rect x="0" y="0" width=${CHART_WIDTH} height=${CHART_HEIGHT} class="chart-frame" />
      <polyline points=${points} class="chart-line" />
    </svg>
  </figure>`;
}

function Usage({ id, running }) {
  const every = useEvery(running ? USAGE_EVERY_MS : IDLE_EVERY_MS);
  const answer = useAnswer(`/v1/leases/${id}/usage`, every);
  if (!answer) return html`<${Loading} />`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const series = answer.body.series || [];
  if (series.every((s) => s.points.length === 0)) return html`<p class="muted" id="no-usage">${t("no_usage")}</p>`;
  return html`<div class="charts">${series.map((s) => html`<div class="gpu-usage" data-gpu=${s.gpu_index}>
    <h4>GPU ${s.gpu_index} <span class="muted">${s.node_id}</span></h4>
    <${Chart} id=${`busy-${s.node_id}-${s.gpu_index}`} label=${t("busy")} top=${100} values=${s.points.map((p) => p.utilization_pct_avg)} />
    <${Chart} id=${`memory-${s.node_id}-${s.gpu_index}`} label=${t("memory")} values=${s.points.map((p) => p.memory_used_mib_max)} />
  </div>`)}</div>`;
}

function Timeline({ lease }) {
  const rows = [
    ["requested_at", lease.created_at],
    ["placed_at", lease.placed_at],
    ["started_at", lease.started_at],
    ["suspended_at", lease.suspended_at],
    ["preemption_at", lease.preemption_deadline],
    ["ended_at", lease.ended_at],
  ].filter(([, at]) => at);
  return html`<ol class="timeline" id="timeline">
    ${rows.map(([word, at]) => html`<li><time datetime=${at}>${new Date(at).toLocaleString()}</time> ${t(word)}</li>`)}
    ${lease.queued_reason && html`<li>${t("queued_because")}: ${lease.queued_reason}</li>`}
    ${lease.migrations > 0 && html`<li>${t("moved")}: ${lease.migrations} (${lease.last_migration_reason || "–"})</li>`}
    ${lease.end_reason && html`<li>${t("end_reason")}: ${lease.end_reason}${lease.failure ? ` (${lease.failure})` : ""}</li>`}
  </ol>`;
}

function Shell({ id, running, members }) {
  const [open, setOpen] = useState(false);
  const [ended, setEnded] = useState(null);
  const [node, setNode] = useState("");
  const screen = useRef(null);
  useEffect(() => {
    if (!open || !screen.current) return undefined;
    setEnded(null);
    let close = null;
    let gone = false;
    openShell(screen.current, id, (how) => { setEnded(how); }, node)
      .then((c) => { if (gone) c(); else close = c; })
      .catch((e) => setEnded({ error: String(e) }));
    return () => { gone = true; if (close) close(); };
  }, [open, id, node]);
  if (!running && !open) return html`<p class="muted">${t("shell_running_only")}</p>`;
  return html`<div>
    <p class="muted">${t("shell_hint")}</p>
    ${members.length > 1 && html`<p><label>${t("shell_member")} <select id="shell-node" value=${node}
      onChange=${(e) => setNode(e.target.value)}>
      ${members.map((m, rank) => html`<option value=${rank === 0 ? "" : m}>${rank}: ${m}</option>`)}
    </select></label></p>`}
    ${open
      ? html`<button class="plain" id="close-shell" onClick=${() => setOpen(false)}>${t("close_shell")}</button>`
      : html`<button id="open-shell" onClick=${() => setOpen(true)}>${t("open_shell")}</button>`}
    ${ended && html`<p id="shell-ended" class=${ended.error ? "error" : "muted"} role="status">${ended.error
      ? t("shell_refused", { error: ended.error })
      : t("shell_ended", { code: ended.code == null ? "–" : ended.code })}</p>`}
    ${open && html`<div class="terminal" id="terminal" ref=${screen}></div>`}
  </div>`;
}

/// Opens the page on `port` of lease `id` in a new tab: a one-time ticket
/// from the gateway, and the template's token read inside the lease where
/// its page needs one (as `lh lease open` does).
function WebPage({ id, templatePort }) {
  const [port, setPort] = useState(templatePort ? String(templatePort.port) : "8888");
  const [error, setError] = useState("");
  const open = async () => {
    setError("");
    // Opened now, within the click, so that no pop-up blocker stops it;
    // led to the page once the ticket is there.
    const tab = window.open("about:blank", "_blank");
    try {
      let path = "/";
      if (templatePort && templatePort.token_file && Number(port) === templatePort.port) {
        const read = await run(id, ["cat", templatePort.token_file]);
        if (read.code === 0 && read.stdout.trim()) path = "/?token=" + encodeURIComponent(read.stdout.trim());
      }
      const answer = await api.post(`/v1/leases/${id}/web`, { port: Number(port), path });
      if (answer.status !== 201) throw new Error((answer.body && answer.body.detail) || String(answer.status));
      if (tab) { tab.opener = null; tab.location = answer.body.url; } else location.assign(answer.body.url);
    } catch (e) {
      if (tab) tab.close();
      setError(t("web_refused", { why: e.message }));
    }
  };
  return html`<div class="web-page">
    <p class="muted">${t("web_page_hint")}</p>
    <label for="web-port">${t("web_port")}</label>
    <input id="web-port" type="number" min="1" max="65535" value=${port} onInput=${(e) => setPort(e.target.value)} />
    <button id="open-web" onClick=${open}>${t("open_web")}</button>
    ${error && html`<p class="error" role="alert" id="web-error">${error}</p>`}
    <p class="muted">${t("web_cli")} <code id="web-command">${templatePort ? `lh lease open ${id}` : `lh lease port-forward ${id} 0:${port}`}</code></p>
  </div>`;
}

/// The template's HTTP port, if the lease came from one that has one.
function webPort(lease, templates) {
  const name = lease.workload && lease.workload.template;
  if (!name || !templates || templates.status !== 200) return null;
  const template = (templates.body.templates || []).find((x) => x.name === name);
  return template && (template.ports || []).find((p) => p.protocol === "http");
}

export function LeasePage({ id, tick, role }) {
  const answer = useAnswer("/v1/leases/" + id, tick);
  // A running workload writes without an event: its logs are read again
  // every few seconds while it runs.
  const live = Boolean(answer && answer.status === 200 && answer.body.state === "running");
  const every = useEvery(live ? LOGS_EVERY_MS : IDLE_EVERY_MS);
  const logs = useAnswer("/v1/leases/" + id + "/logs", tick + every);
  const templates = useAnswer("/v1/templates", 0);
  if (!answer) return html`<${Loading} />`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const l = answer.body;
  const running = l.state === "running";
  const stop = async () => { await api.post("/v1/leases/" + id + "/stop"); };
  const text = logs && logs.status === 200 && logs.body && logs.body.data;
  const web = webPort(l, templates);
  return html`<section aria-labelledby="lease-title">
    <h2 id="lease-title">${t("lease")} <code>${l.id}</code></h2>
    <div class="columns">
      <table><tbody>
        <tr><th>${t("state")}</th><td id="lease-state">${l.state}</td></tr>
        <tr><th>${t("model")}</th><td>${l.gpu_model} × ${l.gpus ?? 1}${l.gpu_fraction ? ` (${l.gpu_fraction.milli / 10}%)` : ""}${l.mig_profile ? ` (MIG ${l.mig_profile})` : ""}</td></tr>
        <tr><th>${t("tier")}</th><td>${l.tier}</td></tr>
        ${l.members && l.members.length
          ? html`<tr><th>${t("members")}</th><td id="lease-members">${l.members.map((m, rank) => html`<div>${rank}: ${m.node_id} · GPU ${m.gpu_indices.join(", ")} · ${t(m.started ? "part_started" : "part_waiting")}</div>`)}</td></tr>`
          : html`<tr><th>${t("node")}</th><td>${l.node_id || "–"}${l.gpu_indices && l.gpu_indices.length ? ` · GPU ${l.gpu_indices.join(", ")}` : ""}</td></tr>`}
        ${l.ssh && html`<tr><th>${t("ssh")}</th><td><code id="ssh-command">${l.ssh.command}</code></td></tr>`}
      </tbody></table>
      <div>
        <h3>${t("timeline")}</h3>
        <${Timeline} lease=${l} />
      </div>
    </div>
    ${!["ended", "rejected"].includes(l.state) && html`<p><button id="stop" onClick=${stop}>${t("stop")}</button></p>`}
    ${role === "tenant" && running && l.workload && html`<h3>${t("web_page")}</h3><${WebPage} id=${l.id} templatePort=${web} />`}
    ${role === "tenant" && html`<h3>${t("shell")}</h3>${l.workload
      ? html`<${Shell} id=${l.id} running=${running} members=${(l.members || []).map((m) => m.node_id)} />`
      : html`<p class="muted" id="no-workload">${t("no_workload")}</p>`}`}
    <h3>${t("usage")}</h3>
    <${Usage} id=${l.id} running=${running} />
    <h3>${t("logs")}</h3>
    <pre id="lease-logs">${text || t("no_logs")}</pre>
  </section>`;
}
