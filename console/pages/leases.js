// A tenant's leases, live, and a new one priced before it is asked for.

import { useEffect, useState } from "../vendor/hooks.mjs";
import * as api from "../api.js";
import { addWords, t } from "../i18n.js";
import { Failed, html, useAnswer, useEvery } from "../ui.js";

export function Leases({ tick }) {
  const answer = useAnswer("/v1/leases?limit=100", tick);
  if (!answer) return html`<p>${t("loading")}</p>`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const leases = answer.body.items || [];
  return html`<section aria-labelledby="leases-title">
    <h2 id="leases-title">${t("leases")} <span class="muted">(${t("live")})</span></h2>
    ${leases.length === 0 ? html`<p>${t("no_leases")}</p>` : html`<table id="lease-table">
      <thead><tr><th>${t("lease")}</th><th>${t("state")}</th><th>${t("model")}</th><th class="num">GPU</th><th>${t("node")}</th><th>${t("created")}</th></tr></thead>
      <tbody>${leases.map((l) => html`<tr data-lease=${l.id}>
        <td><a href=${"#/lease/" + l.id}><code>${l.id}</code></a></td><td class="state">${l.state}</td><td>${l.gpu_model}</td>
        <td class="num">${l.gpus ?? "–"}</td><td>${l.node_id || "–"}</td><td>${l.created_at}</td></tr>`)}</tbody>
    </table>`}
  </section>`;
}

addWords({
  en: {
    what_kind: "What to rent",
    kind_whole: "Whole GPUs",
    kind_share: "A share of one GPU",
    kind_mig: "A MIG slice",
    share_pct: "Compute share (%)",
    share_vram: "Memory of the share (GB)",
    mig_profile: "MIG profile",
    max_price: "Most you pay, CNY per GPU-hour (spot)",
    max_price_hint: "Spot now: {price}. Above your bid, the lease is warned and then preempted.",
    template: "Template",
    no_template: "None: my own image and command",
    dataset: "Dataset (read-only)",
    no_dataset: "None",
    dataset_path: "Seen at",
    workspace: "Workspace (kept across moves)",
    workspace_path: "Seen at",
    workspace_hint: "A name of yours; it is made on first use.",
  },
  zh: {
    what_kind: "租用方式",
    kind_whole: "整卡",
    kind_share: "单卡的一部分（算力切分）",
    kind_mig: "MIG 实例",
    share_pct: "算力份额 (%)",
    share_vram: "显存份额 (GB)",
    mig_profile: "MIG 规格",
    max_price: "最高出价，元/GPU·小时（竞价）",
    max_price_hint: "当前竞价：{price}。价格高于出价时，租约会先收到通知再被抢占。",
    template: "模板",
    no_template: "不用模板：自带镜像和命令",
    dataset: "数据集（只读）",
    no_dataset: "不挂载",
    dataset_path: "挂载路径",
    workspace: "工作区（迁移后保留）",
    workspace_path: "挂载路径",
    workspace_hint: "自定义名称；首次使用时创建。",
  },
});

/// What a new lease runs unless the tenant says otherwise.
const DEFAULT_IMAGE = "localhost/leasehold/base";
const DEFAULT_COMMAND = "tail -f /dev/null";

/// MIG profiles of the models that have them, offered as suggestions (the
/// API checks a profile against the model and names the field if not).
const MIG_PROFILES = {
  "A100-40GB": ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
  "A100-80GB": ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
  "H100-80GB": ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
};

/// What of the form a quote is for: a quote is sent with the lease only
/// when it was made for exactly what the form now asks.
function gpuAsk(form, model) {
  const ask = { gpu_model: model, tier: form.tier };
  if (form.kind === "share") ask.gpu_fraction = { milli: Math.round(Number(form.share_pct) * 10), vram_gb: Number(form.share_vram) };
  else if (form.kind === "mig") ask.mig_profile = form.mig_profile.trim();
  else ask.gpus = Number(form.gpus);
  return ask;
}

/// A lease to ask for, priced before it is: the quote is asked again at
/// each change of the form, and the lease is asked for on that quote when
/// it still matches the form.
export function NewLease({ tick }) {
  const catalogue = useAnswer("/v1/gpus", tick);
  const templates = useAnswer("/v1/templates", 0);
  const datasets = useAnswer("/v1/datasets", 0);
  const [form, setForm] = useState({
    model: "", kind: "whole", gpus: 1, share_pct: 25, share_vram: 10, mig_profile: "", tier: "basic",
    // A lease that runs something one can enter: the platform's base
    // image kept alive, until the tenant names its own.
    max_price: "", template: "", image: DEFAULT_IMAGE, command: DEFAULT_COMMAND, dataset: "", dataset_path: "/data",
    workspace: "", workspace_path: "/workspace", hours: 1,
  });
  const [quote, setQuote] = useState(null);
  const [error, setError] = useState("");
  const [sending, setSending] = useState(false);
  const offers = catalogue && catalogue.status === 200 ? catalogue.body.offers : [];
  const models = [...new Set(offers.map((o) => o.gpu_model))];
  const model = form.model || models[0] || "";
  const ask = gpuAsk(form, model);
  const askKey = JSON.stringify(ask);
  useEffect(() => {
    if (!model) return undefined;
    let live = true;
    setQuote(null);
    api.post("/v1/quotes", { ...ask, duration_seconds: Math.max(1, Math.round(Number(form.hours) * 3600)) }).then((a) => {
      if (!live) return;
      if (a.status === 201) { setQuote({ ...a.body, askKey }); setError(""); } else { setError((a.body && a.body.detail) || String(a.status)); }
    }).catch(() => live && setError(t("unreachable")));
    return () => { live = false; };
  }, [askKey, form.hours]);
  const set = (field) => (e) => setForm({ ...form, [field]: e.target.value });
  const spotNow = offers.filter((o) => o.gpu_model === model).map((o) => o.spot_cny_per_gpu_hour).filter(Boolean)[0];
  const templateList = templates && templates.status === 200 ? templates.body.templates || [] : [];
  const datasetList = datasets && datasets.status === 200 ? datasets.body.datasets || [] : [];
  const submit = async (e) => {
    e.preventDefault();
    if (sending) return;
    const body = { ...ask };
    if (quote && quote.askKey === askKey) body.quote_id = quote.quote_id;
    if (form.tier === "spot" && form.max_price.trim()) body.max_price_cny_per_gpu_hour = form.max_price.trim();
    const workload = {};
    if (form.template) body.template = form.template;
    else {
      if (form.image.trim()) workload.image = form.image.trim();
      if (form.command.trim()) workload.command = ["sh", "-c", form.command];
    }
    if (form.dataset) workload.datasets = [{ name: form.dataset, path: form.dataset_path }];
    if (form.workspace.trim()) workload.workspaces = [{ name: form.workspace.trim(), path: form.workspace_path }];
    if (Object.keys(workload).length > 0) {
      if (!workload.command && !form.template) workload.command = ["sh", "-c", DEFAULT_COMMAND];
      body.workload = workload;
    }
    setSending(true);
    try {
      const answer = await api.post("/v1/leases", body);
      if (answer.status === 202) location.hash = "#/lease/" + answer.body.id;
      else setError((answer.body && answer.body.detail) || String(answer.status));
    } catch (_) {
      setError(t("unreachable"));
    } finally {
      setSending(false);
    }
  };
  const kind = (value, word) => html`<label class="inline"><input type="radio" name="kind" id=${"kind-" + value} value=${value} checked=${form.kind === value} onChange=${set("kind")} /> ${t(word)}</label>`;
  return html`<form onSubmit=${submit} aria-labelledby="new-title" id="new-lease">
    <h2 id="new-title">${t("new_lease")}</h2>
    <label for="model">${t("model")}</label>
    <select id="model" value=${model} onChange=${set("model")}>${models.map((m) => html`<option value=${m}>${m}</option>`)}</select>
    <fieldset><legend>${t("what_kind")}</legend>
      ${kind("whole", "kind_whole")}${kind("share", "kind_share")}${kind("mig", "kind_mig")}
    </fieldset>
    ${form.kind === "whole" && html`<label for="gpus">${t("gpu_count")}</label>
      <input id="gpus" type="number" min="1" max="16" value=${form.gpus} onInput=${set("gpus")} />`}
    ${form.kind === "share" && html`<label for="share-pct">${t("share_pct")}</label>
      <input id="share-pct" type="number" min="0.1" max="100" step="0.1" value=${form.share_pct} onInput=${set("share_pct")} />
      <label for="share-vram">${t("share_vram")}</label>
      <input id="share-vram" type="number" min="1" value=${form.share_vram} onInput=${set("share_vram")} />`}
    ${form.kind === "mig" && html`<label for="mig-profile">${t("mig_profile")}</label>
      <input id="mig-profile" list="mig-profiles" value=${form.mig_profile} onInput=${set("mig_profile")} placeholder=${(MIG_PROFILES[model] || ["3g.20gb"])[0]} />
      <datalist id="mig-profiles">${(MIG_PROFILES[model] || []).map((p) => html`<option value=${p}></option>`)}</datalist>`}
    <label for="tier">${t("tier")}</label>
    <select id="tier" value=${form.tier} onChange=${set("tier")}>
      ${["basic", "performance", "spot"].map((tier) => html`<option value=${tier}>${tier}</option>`)}
    </select>
    ${form.tier === "spot" && html`<label for="max-price">${t("max_price")}</label>
      <input id="max-price" inputmode="decimal" value=${form.max_price} onInput=${set("max_price")} placeholder=${spotNow || ""} />
      <p class="muted">${t("max_price_hint", { price: spotNow || "–" })}</p>`}
    <label for="template">${t("template")}</label>
    <select id="template" value=${form.template} onChange=${set("template")}>
      <option value="">${t("no_template")}</option>
      ${templateList.map((x) => html`<option value=${x.name}>${x.name}${x.description ? " – " + x.description : ""}</option>`)}
    </select>
    ${!form.template && html`<label for="image">${t("image")}</label>
      <input id="image" value=${form.image} onInput=${set("image")} placeholder="localhost/leasehold/base" />
      <label for="command">${t("command")}</label>
      <input id="command" value=${form.command} onInput=${set("command")} />`}
    <label for="dataset">${t("dataset")}</label>
    <select id="dataset" value=${form.dataset} onChange=${set("dataset")}>
      <option value="">${t("no_dataset")}</option>
      ${datasetList.map((d) => html`<option value=${d.name}>${d.name}</option>`)}
    </select>
    ${form.dataset && html`<label for="dataset-path">${t("dataset_path")}</label>
      <input id="dataset-path" value=${form.dataset_path} onInput=${set("dataset_path")} />`}
    <label for="workspace">${t("workspace")}</label>
    <input id="workspace" value=${form.workspace} onInput=${set("workspace")} aria-describedby="workspace-hint" />
    <p class="muted" id="workspace-hint">${t("workspace_hint")}</p>
    ${form.workspace.trim() && html`<label for="workspace-path">${t("workspace_path")}</label>
      <input id="workspace-path" value=${form.workspace_path} onInput=${set("workspace_path")} />`}
    <label for="hours">${t("hours")}</label>
    <input id="hours" type="number" min="0.1" step="0.1" value=${form.hours} onInput=${set("hours")} />
    <p id="quote" aria-live="polite">${quote ? t("quoted", {
      amount: quote.amount, currency: quote.currency, hours: form.hours,
      unit: quote.unit_price_cny_per_gb_hour, version: quote.price_book_version,
    }) : ""} ${quote && quote.price_moves ? t("price_moves") : ""}</p>
    ${error && html`<p class="error" role="alert" id="new-error">${error}</p>`}
    <button type="submit" id="rent" disabled=${sending}>${t("rent")}</button>
  </form>`;
}
