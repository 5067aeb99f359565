// The operator's pages: the tenants (suspension, quota, API keys) and the
// prices (price books, a new version, spot prices now); the daily report
// is report.js.

import { useState } from "../vendor/hooks.mjs";
import * as api from "../api.js";
import { addWords, t } from "../i18n.js";
import { Failed, html, refusal, useAnswer, useEvery } from "../ui.js";

addWords({
  en: {
    op_tenants: "Tenants",
    op_prices: "Prices",
    op_name: "Name",
    op_tenant: "Tenant",
    op_suspended: "Suspended",
    op_active: "Active",
    op_erased: "Erased",
    op_max_gpus: "Max GPUs",
    op_max_vram_gb: "Max VRAM (GB)",
    op_max_storage_gb: "Max storage (GB)",
    op_weight: "Weight",
    op_actions: "Actions",
    op_suspend: "Suspend",
    op_resume: "Resume",
    op_manage: "Quota and keys",
    op_no_tenants: "No tenants yet.",
    op_first_page: "First page",
    op_next_page: "Next page",
    op_unlimited_hint: "Leave a limit empty for none.",
    op_quota: "Quota",
    op_save_quota: "Save quota",
    op_quota_saved: "Quota saved.",
    op_api_keys: "API keys",
    op_key_id: "Key",
    op_prefix: "Prefix",
    op_expires: "Expires",
    op_revoked: "Revoked",
    op_issue_key: "Issue a key",
    op_revoke: "Revoke",
    op_no_keys: "No keys.",
    op_issued_key: "New key {id}, shown only this once; copy it now:",
    op_back_to_tenants: "All tenants",
    op_price_books: "Price books",
    op_version: "Version",
    op_effective_from: "In force from",
    op_tiers: "Tiers (CNY per GB-hour)",
    op_storage_price: "Storage (CNY per GB-month)",
    op_in_force: "in force",
    op_new_book: "Publish a new version",
    op_new_book_hint: "Prices are CNY per GB of VRAM per hour. A tier whose price is left as it is keeps its charge model; a changed price makes it flat (spot keeps following the market, the price is its fallback).",
    op_effective_hint: "In force from (empty: now)",
    op_publish: "Publish",
    op_published: "Version {version} published, in force from {from}.",
    op_spot_prices: "Spot prices now",
    op_price: "CNY per GB-hour",
    op_market_use: "GPUs held",
    op_since: "Since",
    op_no_spot: "No spot market has a price yet.",
  },
  zh: {
    op_tenants: "租户",
    op_prices: "价格",
    op_name: "名称",
    op_tenant: "租户",
    op_suspended: "已暂停",
    op_active: "正常",
    op_erased: "已擦除",
    op_max_gpus: "GPU 上限",
    op_max_vram_gb: "显存上限 (GB)",
    op_max_storage_gb: "存储上限 (GB)",
    op_weight: "权重",
    op_actions: "操作",
    op_suspend: "暂停",
    op_resume: "恢复",
    op_manage: "配额与密钥",
    op_no_tenants: "还没有租户。",
    op_first_page: "第一页",
    op_next_page: "下一页",
    op_unlimited_hint: "上限留空表示不限。",
    op_quota: "配额",
    op_save_quota: "保存配额",
    op_quota_saved: "配额已保存。",
    op_api_keys: "API 密钥",
    op_key_id: "密钥",
    op_prefix: "前缀",
    op_expires: "过期时间",
    op_revoked: "已吊销",
    op_issue_key: "签发密钥",
    op_revoke: "吊销",
    op_no_keys: "没有密钥。",
    op_issued_key: "新密钥 {id}，仅显示这一次，请立即复制：",
    op_back_to_tenants: "全部租户",
    op_price_books: "价目表",
    op_version: "版本",
    op_effective_from: "生效时间",
    op_tiers: "计费档（元/GB·小时）",
    op_storage_price: "存储（元/GB·月）",
    op_in_force: "生效中",
    op_new_book: "发布新版本",
    op_new_book_hint: "价格单位为每 GB 显存每小时的人民币。价格未改的计费档沿用原计费模型；改了价格的计费档改为固定价（竞价仍随市场，此价为其后备价）。",
    op_effective_hint: "生效时间（留空：立即）",
    op_publish: "发布",
    op_published: "版本 {version} 已发布，自 {from} 起生效。",
    op_spot_prices: "当前竞价",
    op_price: "元/GB·小时",
    op_market_use: "已占用 GPU",
    op_since: "起始",
    op_no_spot: "竞价市场尚无价格。",
  },
});


function Said({ said, id }) {
  if (!said) return null;
  return said.ok
    ? html`<p class="muted" role="status" id=${id}>${said.text}</p>`
    : html`<p class="error" role="alert" id=${id}>${said.text}</p>`;
}

// ——— Tenants ———

/// Tenants a page shows.
const TENANTS_PER_PAGE = 50;

export function Tenants({ id, role }) {
  return id ? html`<${TenantPage} id=${id} role=${role} />` : html`<${TenantList} role=${role} />`;
}

function TenantList({ role }) {
  // The cursors of the pages before this one, to page back to the first.
  const [cursors, setCursors] = useState([]);
  const [changed, setChanged] = useState(0);
  const [said, setSaid] = useState(null);
  const after = cursors[cursors.length - 1];
  // Tenants are not on the event stream: the page reads again after its
  // own changes only.
  const answer = useAnswer(`/v1/tenants?limit=${TENANTS_PER_PAGE}` + (after ? `&after=${after}` : ""), changed);
  if (!answer) return html`<p>${t("loading")}</p>`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const tenants = answer.body.items || [];
  const admin = role === "admin";
  const toggle = async (tenant) => {
    const what = tenant.suspended ? "resume" : "suspend";
    const answer = await api.post(`/v1/tenants/${tenant.id}/${what}`, tenant.suspended ? undefined : {});
    setSaid(answer.status === 202 ? null : { ok: false, text: refusal(answer) });
    setChanged((n) => n + 1);
  };
  return html`<section aria-labelledby="tenants-title">
    <h2 id="tenants-title">${t("op_tenants")}</h2>
    <${Said} said=${said} id="tenants-error" />
    ${tenants.length === 0 ? html`<p>${t("op_no_tenants")}</p>` : html`<table id="tenant-table">
      <thead><tr><th>${t("op_name")}</th><th>${t("op_tenant")}</th><th>${t("state")}</th><th class="num">${t("op_max_gpus")}</th>
        <th class="num">${t("op_max_vram_gb")}</th><th class="num">${t("op_max_storage_gb")}</th><th class="num">${t("op_weight")}</th>
        <th>${t("created")}</th><th>${t("op_actions")}</th></tr></thead>
      <tbody>${tenants.map((x) => html`<tr data-tenant=${x.id} key=${x.id}>
        <td>${x.name}</td><td><code>${x.id}</code></td>
        <td class="tenant-state">${x.erased ? t("op_erased") : x.suspended ? t("op_suspended") : t("op_active")}</td>
        <td class="num">${x.max_gpus}</td><td class="num">${x.max_vram_gb ?? "–"}</td>
        <td class="num">${x.max_storage_gb ?? "–"}</td><td class="num">${x.weight}</td><td>${x.created_at}</td>
        <td class="actions">
          ${admin && !x.erased && html`<button class="plain" id=${(x.suspended ? "resume-" : "suspend-") + x.id}
            onClick=${() => toggle(x)}>${x.suspended ? t("op_resume") : t("op_suspend")}</button>`}
          <a href=${"#/tenants/" + x.id} id=${"manage-" + x.id}>${t("op_manage")}</a>
        </td></tr>`)}</tbody>
    </table>`}
    <p class="pager">
      ${cursors.length > 0 && html`<button class="plain" id="tenants-first" onClick=${() => setCursors([])}>${t("op_first_page")}</button>`}
      ${answer.body.next_after && html`<button class="plain" id="tenants-next"
        onClick=${() => setCursors([...cursors, answer.body.next_after])}>${t("op_next_page")}</button>`}
    </p>
  </section>`;
}

/// One tenant: its quota, as a form, and its API keys.
function TenantPage({ id, role }) {
  const [changed, setChanged] = useState(0);
  const answer = useAnswer("/v1/tenants/" + encodeURIComponent(id), changed);
  if (!answer) return html`<p>${t("loading")}</p>`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const x = answer.body;
  const admin = role === "admin" && !x.erased;
  return html`<section aria-labelledby="tenant-title">
    <p><a href="#/tenants" id="back-to-tenants">${t("op_back_to_tenants")}</a></p>
    <h2 id="tenant-title">${x.name} <code>${x.id}</code></h2>
    <p><span id="tenant-state">${x.erased ? t("op_erased") : x.suspended ? t("op_suspended") : t("op_active")}</span>
      ${x.suspended_reason ? html` <span class="muted" id="tenant-reason">(${x.suspended_reason})</span>` : ""}</p>
    <${QuotaForm} tenant=${x} admin=${admin} onSaved=${() => setChanged((n) => n + 1)} />
    <${Keys} tenant=${x} admin=${admin} />
  </section>`;
}

function QuotaForm({ tenant, admin, onSaved }) {
  const blank = (v) => (v == null ? "" : String(v));
  const [form, setForm] = useState({
    max_gpus: String(tenant.max_gpus), max_vram_gb: blank(tenant.max_vram_gb),
    max_storage_gb: blank(tenant.max_storage_gb), weight: String(tenant.weight),
  });
  const [said, setSaid] = useState(null);
  const set = (field) => (e) => setForm({ ...form, [field]: e.target.value });
  const limit = (v) => (v.trim() === "" ? undefined : Number(v));
  const submit = async (e) => {
    e.preventDefault();
    const quota = { max_gpus: Number(form.max_gpus) };
    if (limit(form.max_vram_gb) !== undefined) quota.max_vram_gb = limit(form.max_vram_gb);
    if (limit(form.max_storage_gb) !== undefined) quota.max_storage_gb = limit(form.max_storage_gb);
    try {
      const answer = await api.send("PUT", `/v1/tenants/${tenant.id}/quota`, { quota, weight: Number(form.weight) });
      setSaid(answer.status === 200 ? { ok: true, text: t("op_quota_saved") } : { ok: false, text: refusal(answer) });
      if (answer.status === 200) onSaved();
    } catch (_) {
      setSaid({ ok: false, text: t("unreachable") });
    }
  };
  const field = (name) => html`<label for=${"quota-" + name.replace(/_/g, "-")}>${t("op_" + name)}</label>
    <input id=${"quota-" + name.replace(/_/g, "-")} type="number" min="0" value=${form[name]}
      onInput=${set(name)} disabled=${!admin} />`;
  return html`<form id="quota-form" onSubmit=${submit} aria-labelledby="quota-title">
    <h3 id="quota-title">${t("op_quota")}</h3>
    <div class="fields">
      ${field("max_gpus")}${field("max_vram_gb")}${field("max_storage_gb")}${field("weight")}
    </div>
    <p class="muted">${t("op_unlimited_hint")}</p>
    <${Said} said=${said} id="quota-said" />
    ${admin && html`<button type="submit" id="quota-save">${t("op_save_quota")}</button>`}
  </form>`;
}

function Keys({ tenant, admin }) {
  const [changed, setChanged] = useState(0);
  const [issued, setIssued] = useState(null);
  const [said, setSaid] = useState(null);
  const answer = useAnswer(`/v1/tenants/${tenant.id}/keys`, changed);
  const issue = async () => {
    const a = await api.post(`/v1/tenants/${tenant.id}/keys`, {});
    if (a.status === 201) { setIssued(a.body); setSaid(null); } else setSaid({ ok: false, text: refusal(a) });
    setChanged((n) => n + 1);
  };
  const revoke = async (key) => {
    const a = await api.send("DELETE", `/v1/tenants/${tenant.id}/keys/${key.key_id}`);
    setSaid(a.status === 200 ? null : { ok: false, text: refusal(a) });
    setChanged((n) => n + 1);
  };
  // A tenant with no key at all reads as not found.
  const keys = answer && answer.status === 200 ? answer.body.items || [] : [];
  return html`<section aria-labelledby="keys-title">
    <h3 id="keys-title">${t("op_api_keys")}</h3>
    ${!answer ? html`<p>${t("loading")}</p>` : answer.status !== 200 && answer.status !== 404 ? html`<${Failed} answer=${answer} />`
      : keys.length === 0 ? html`<p>${t("op_no_keys")}</p>` : html`<table id="key-table">
      <thead><tr><th>${t("op_key_id")}</th><th>${t("op_prefix")}</th><th>${t("state")}</th><th>${t("created")}</th>
        <th>${t("op_expires")}</th><th>${t("op_revoked")}</th><th></th></tr></thead>
      <tbody>${keys.map((k) => html`<tr data-key=${k.key_id} key=${k.key_id}>
        <td>${k.key_id}</td><td><code>${k.prefix}</code></td><td class="key-state">${k.state}</td><td>${k.created_at}</td>
        <td>${k.expires_at || "–"}</td><td>${k.revoked_at || "–"}</td>
        <td>${admin && k.state === "active" && html`<button class="plain" id=${"revoke-key-" + k.key_id}
          onClick=${() => revoke(k)}>${t("op_revoke")}</button>`}</td></tr>`)}</tbody>
    </table>`}
    ${issued && html`<p id="issued-key" role="status">${t("op_issued_key", { id: issued.key_id })} <code>${issued.api_key}</code></p>`}
    <${Said} said=${said} id="keys-said" />
    ${admin && html`<p><button id="issue-key" onClick=${issue}>${t("op_issue_key")}</button></p>`}
  </section>`;
}

// ——— Prices ———

/// The version in force at `now`: the newest by (effective_from, version)
/// of those that have begun, as the gateway's catalogue chooses.
function inForce(books, now) {
  return books
    .filter((b) => Date.parse(b.effective_from) <= now)
    .reduce((best, b) => (!best || Date.parse(b.effective_from) > Date.parse(best.effective_from)
      || (b.effective_from === best.effective_from && b.version > best.version) ? b : best), null);
}

function tierText(tier) {
  const kind = tier.model ? tier.model.kind : "flat";
  return `${tier.tier} ${tier.price_cny_per_gb_hour} (${kind})`;
}

export function Prices({ tick, role }) {
  const [changed, setChanged] = useState(0);
  // Said here, not in the form: a new version makes a new form, from it.
  const [published, setPublished] = useState(null);
  const every = useEvery(30000);
  const books = useAnswer("/v1/price-books", changed);
  const spot = useAnswer("/v1/spot/prices?history=0", tick + every);
  return html`<section aria-labelledby="prices-title">
    <h2 id="prices-title">${t("op_prices")}</h2>
    <h3 id="books-title">${t("op_price_books")}</h3>
    ${!books ? html`<p>${t("loading")}</p>` : books.status !== 200 ? html`<${Failed} answer=${books} />`
      : html`<${Books} books=${books.body.books || []} admin=${role === "admin"}
        onPublished=${(text) => { setPublished({ ok: true, text }); setChanged((n) => n + 1); }} />`}
    <${Said} said=${published} id="book-published" />
    <h3 id="spot-title">${t("op_spot_prices")}</h3>
    ${!spot ? html`<p>${t("loading")}</p>` : spot.status !== 200 ? html`<${Failed} answer=${spot} />`
      : html`<${Spot} markets=${spot.body.markets || []} />`}
  </section>`;
}

function Books({ books, admin, onPublished }) {
  const now = Date.now();
  const current = inForce(books, now);
  const sorted = [...books].sort((a, b) => b.version - a.version);
  return html`<table id="price-books" aria-labelledby="books-title">
      <thead><tr><th class="num">${t("op_version")}</th><th>${t("op_effective_from")}</th><th>${t("op_tiers")}</th>
        <th class="num">${t("op_storage_price")}</th><th></th></tr></thead>
      <tbody>${sorted.map((b) => html`<tr data-version=${b.version} key=${b.version}>
        <td class="num">${b.version}</td><td>${b.effective_from}</td>
        <td>${b.tiers.map((tier) => html`<span class="tier">${tierText(tier)}</span>`)}</td>
        <td class="num">${b.storage_cny_per_gb_month ?? "–"}</td>
        <td>${current && current.version === b.version ? html`<strong class="in-force">${t("op_in_force")}</strong>` : ""}</td></tr>`)}</tbody>
    </table>
    ${admin && current && html`<${NewBook} base=${current} next=${Math.max(0, ...books.map((b) => b.version)) + 1}
      onPublished=${onPublished} key=${"after-" + sorted[0].version} />`}`;
}

/// A new version from the one in force: each tier's price, the version
/// number and when it begins.
function NewBook({ base, next, onPublished }) {
  const [form, setForm] = useState(() => {
    const prices = {};
    for (const tier of base.tiers) prices[tier.tier] = String(tier.price_cny_per_gb_hour);
    return { version: String(next), effective: "", prices };
  });
  const [said, setSaid] = useState(null);
  const submit = async (e) => {
    e.preventDefault();
    const tiers = base.tiers.map((tier) => {
      const price = form.prices[tier.tier].trim();
      const kept = price === String(tier.price_cny_per_gb_hour);
      const market = tier.model && tier.model.kind === "market";
      const priced = { tier: tier.tier, price_cny_per_gb_hour: price };
      if (kept && tier.model) priced.model = tier.model;
      else if (market) priced.model = { kind: "market" };
      return priced;
    });
    const body = { version: Number(form.version), tiers };
    if (base.storage_cny_per_gb_month != null) body.storage_cny_per_gb_month = base.storage_cny_per_gb_month;
    if (form.effective) body.effective_from = new Date(form.effective).toISOString();
    try {
      const answer = await api.post("/v1/price-books", body);
      if (answer.status === 201) {
        setSaid(null);
        onPublished(t("op_published", { version: answer.body.version, from: answer.body.effective_from }));
      } else {
        setSaid({ ok: false, text: refusal(answer) });
      }
    } catch (_) {
      setSaid({ ok: false, text: t("unreachable") });
    }
  };
  return html`<form id="new-book" onSubmit=${submit} aria-labelledby="new-book-title">
    <h4 id="new-book-title">${t("op_new_book")}</h4>
    <p class="muted">${t("op_new_book_hint")}</p>
    <div class="fields">
      <label for="book-version">${t("op_version")}</label>
      <input id="book-version" type="number" min="1" value=${form.version}
        onInput=${(e) => setForm({ ...form, version: e.target.value })} />
      <label for="book-effective">${t("op_effective_hint")}</label>
      <input id="book-effective" type="datetime-local" value=${form.effective}
        onInput=${(e) => setForm({ ...form, effective: e.target.value })} />
      ${base.tiers.map((tier) => html`<label for=${"book-price-" + tier.tier}>${tier.tier}</label>
        <input id=${"book-price-" + tier.tier} inputmode="decimal" value=${form.prices[tier.tier]}
          onInput=${(e) => setForm({ ...form, prices: { ...form.prices, [tier.tier]: e.target.value } })} />`)}
    </div>
    <${Said} said=${said} id="book-said" />
    <button type="submit" id="publish-book">${t("op_publish")}</button>
  </form>`;
}

function Spot({ markets }) {
  if (markets.length === 0) return html`<p>${t("op_no_spot")}</p>`;
  return html`<table id="spot-prices" aria-labelledby="spot-title">
    <thead><tr><th>${t("zone")}</th><th>${t("model")}</th><th class="num">${t("op_price")}</th>
      <th class="num">${t("op_market_use")}</th><th>${t("op_since")}</th></tr></thead>
    <tbody>${markets.map((m) => html`<tr data-market=${m.zone + "/" + m.gpu_model} key=${m.zone + "/" + m.gpu_model}>
      <td>${m.zone}</td><td>${m.gpu_model}</td><td class="num">${m.current.price_cny_per_gb_hour}</td>
      <td class="num">${m.gpus_used}/${m.gpus_total} (${(Number(m.current.utilisation) * 100).toFixed(0)}%)</td>
      <td>${m.current.at}</td></tr>`)}</tbody>
  </table>`;
}
