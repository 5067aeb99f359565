// The fleet as operators see it: each node's GPUs as a heat map, and the
// drain and uncordon that take a node out of placement and back.

import { useState } from "../vendor/hooks.mjs";
import * as api from "../api.js";
import { addWords, t } from "../i18n.js";
import { Failed, html, useAnswer, useEvery } from "../ui.js";

addWords({
  en: {
    fleet_drain: "Drain",
    fleet_uncordon: "Uncordon",
    fleet_drain_mode: "Running leases",
    fleet_drain_finish: "finish where they are",
    fleet_drain_move: "move to other nodes",
    fleet_utilisation: "utilisation",
    fleet_memory_used: "memory",
    fleet_temperature: "temperature",
    fleet_no_reading: "no reading",
    fleet_heat_legend: "Cells are coloured by each GPU's utilisation at its node's last heartbeat; grey where there is no reading.",
    fleet_drain_asked: "Drain of {node} asked; it shows once the scheduler has it.",
    fleet_uncordon_asked: "Uncordon of {node} asked; it shows once the scheduler has it.",
  },
  zh: {
    fleet_drain: "排空",
    fleet_uncordon: "恢复调度",
    fleet_drain_mode: "运行中的租约",
    fleet_drain_finish: "在原节点运行至结束",
    fleet_drain_move: "迁移到其他节点",
    fleet_utilisation: "利用率",
    fleet_memory_used: "显存",
    fleet_temperature: "温度",
    fleet_no_reading: "无读数",
    fleet_heat_legend: "单元格颜色表示各 GPU 在其节点最近一次心跳时的利用率；无读数者为灰色。",
    fleet_drain_asked: "已请求排空 {node}；调度器处理后即显示。",
    fleet_uncordon_asked: "已请求恢复 {node} 的调度；调度器处理后即显示。",
  },
});

/// Utilisation in steps of a tenth, for the cell's colour class: the CSP
/// allows no style attribute, so the shades are classes in style.css.
const SHADES = 10;

/// One GPU: its colour says its utilisation where its node read one (else
/// whether it is held), a frame that it is held, red or amber that it is
/// not healthy; its label says everything the node read.
function Cell({ g }) {
  const reading = g.utilization_pct != null;
  const kind = [
    g.used_milli > 0 ? "held" : "free",
    reading ? "busy-" + Math.min(SHADES, Math.round(g.utilization_pct / SHADES)) : "",
    g.health !== "healthy" ? g.health : "",
  ].filter(Boolean).join(" ");
  const memory = g.memory_used_mib != null
    ? `${(g.memory_used_mib / 1024).toFixed(1)}/${g.vram_gb} GB` : t("fleet_no_reading");
  const label = [
    `GPU ${g.index} ${g.model}`,
    g.health,
    `${t("held")} ${(g.used_milli / 10).toFixed(0)}%`,
    `${t("fleet_utilisation")} ${reading ? g.utilization_pct + "%" : t("fleet_no_reading")}`,
    `${t("fleet_memory_used")} ${memory}`,
    `${t("fleet_temperature")} ${g.temperature_c != null ? g.temperature_c + "°C" : t("fleet_no_reading")}`,
  ].join(" · ");
  return html`<div class=${"cell " + kind} title=${label} aria-label=${label} role="img"
    data-gpu=${g.index}>${g.index}${reading ? html`<small>${g.utilization_pct}%</small>` : ""}</div>`;
}

/// A node's drain (with how its leases leave) and uncordon.
function NodeControls({ node, onDone }) {
  const [mode, setMode] = useState("finish");
  const [busy, setBusy] = useState(false);
  const [said, setSaid] = useState(null);
  const act = async (what, body) => {
    setBusy(true);
    try {
      const answer = await api.post(`/v1/nodes/${encodeURIComponent(node.id)}/${what}`, body);
      setSaid(answer.status === 202
        ? { ok: true, text: t("fleet_" + what + "_asked", { node: node.id }) }
        : { ok: false, text: (answer.body && answer.body.detail) || String(answer.status) });
    } catch (_) {
      setSaid({ ok: false, text: t("unreachable") });
    }
    setBusy(false);
    onDone();
  };
  const id = node.id;
  return html`<div class="controls">
    <label for=${"drain-mode-" + id}>${t("fleet_drain_mode")}</label>
    <select id=${"drain-mode-" + id} value=${mode} onChange=${(e) => setMode(e.target.value)}>
      <option value="finish">${t("fleet_drain_finish")}</option>
      <option value="move">${t("fleet_drain_move")}</option>
    </select>
    <button id=${"drain-" + id} disabled=${busy || node.state === "draining"}
      onClick=${() => act("drain", { mode })}>${t("fleet_drain")}</button>
    <button class="plain" id=${"uncordon-" + id} disabled=${busy || node.state !== "draining"}
      onClick=${() => act("uncordon")}>${t("fleet_uncordon")}</button>
    ${said && (said.ok
      ? html`<span class="muted" role="status">${said.text}</span>`
      : html`<span class="error" role="alert">${said.text}</span>`)}
  </div>`;
}

export function Fleet({ tick }) {
  const every = useEvery(5000);
  // A command's own answer says nothing of the node's state: the scheduler
  // folds it; reading again at once and on every change shows it soonest.
  const [asked, setAsked] = useState(0);
  const answer = useAnswer("/v1/nodes", tick + every + asked);
  if (!answer) return html`<p>${t("loading")}</p>`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const reread = () => setAsked((n) => n + 1);
  return html`<section aria-labelledby="fleet-title">
    <h2 id="fleet-title">${t("fleet")}</h2>
    <p class="muted" id="heat-legend">${t("fleet_heat_legend")}</p>
    ${(answer.body.nodes || []).map((n) => html`<div class="node" data-node=${n.id} key=${n.id}>
      <h3 id=${"node-" + n.id}>${n.id} <span class="muted">${n.zone} · <span class="node-state">${n.state}${n.drain_mode ? " (" + n.drain_mode + ")" : ""}</span> · ${t("heartbeat")} ${n.last_heartbeat_at || "–"}</span></h3>
      <${NodeControls} node=${n} onDone=${reread} />
      <div class="heat" aria-labelledby=${"node-" + n.id}>${n.gpus.map((g) => html`<${Cell} g=${g} key=${g.index} />`)}</div>
    </div>`)}
  </section>`;
}
