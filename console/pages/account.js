// A tenant's own account: its balance and what its running leases burn,
// its API and SSH keys, and its data (datasets, workspaces, the storage
// they take). The tenant's id comes from GET /v1/whoami, asked here again
// rather than kept at sign-in: it is the key's answer, now.

import { useEffect, useState } from "../vendor/hooks.mjs";
import * as api from "../api.js";
import { addWords, t } from "../i18n.js";
import { Failed, html, Loading, useAnswer, useEvery } from "../ui.js";

addWords({
  en: {
    account: "Account",
    acct_keys: "Keys",
    acct_data: "Data",
    acct_balance_title: "Balance and burn rate",
    acct_balance: "Balance",
    acct_postpaid: "Postpaid: what your leases use is invoiced monthly; there is no prepaid balance to run out.",
    acct_state: "State",
    acct_state_ok: "sufficient",
    acct_state_low: "low: top up soon",
    acct_state_exhausted: "exhausted: leases stopped, new ones refused",
    acct_topped_up: "Topped up",
    acct_charged: "Charged",
    acct_credited: "SLA credits",
    acct_unbilled: "Used, not yet charged",
    acct_burn_rate: "Burn rate",
    acct_per_hour: "{amount} CNY/h",
    acct_hours_left: "Time left at this rate",
    acct_hours: "{hours} h",
    acct_nothing_runs: "nothing running",
    acct_running: "Leases running",
    acct_api_keys: "API keys",
    acct_prefix: "Key",
    acct_created: "Created",
    acct_expires: "Expires",
    acct_never: "never",
    acct_this_console: "this console's",
    acct_issue: "Issue a key",
    acct_expires_on: "Expires on (optional, UTC)",
    acct_new_key: "Your new key:",
    acct_new_key_hint: "Copy it now: it is shown once and only its hash is kept.",
    acct_copy: "Copy",
    acct_copied: "Copied.",
    acct_done: "Done",
    acct_revoke: "Revoke",
    acct_revoke_own: "Revoke the key this console uses? You are signed out at the next call.",
    acct_really: "Really?",
    acct_confirm: "Confirm",
    acct_cancel: "Cancel",
    acct_no_keys: "No keys.",
    acct_ssh_keys: "SSH keys",
    acct_ssh_hint: "A key here lets its holder in to your running leases: ssh -p 2222 <lease id>@<gateway>.",
    acct_name: "Name",
    acct_fingerprint: "Fingerprint",
    acct_public_key: "Public key (one line of a .pub file)",
    acct_add_key: "Add key",
    acct_remove: "Remove",
    acct_no_ssh_keys: "No SSH keys yet.",
    acct_storage: "Storage",
    acct_used: "Used",
    acct_quota: "Quota",
    acct_no_quota: "no quota",
    acct_measured: "Measured",
    acct_not_measured: "not measured yet",
    acct_writes_stopped: "Writes are stopped: your bucket is over its storage quota. Remove datasets or workspaces, or ask for a larger quota.",
    acct_datasets: "Datasets",
    acct_versions: "Versions",
    acct_newest: "Newest version",
    acct_size: "Size",
    acct_files: "Files",
    acct_no_datasets: "No datasets yet.",
    acct_add_dataset: "A dataset goes up with the CLI, which sends only the chunks your bucket lacks and resumes where it stopped:",
    acct_manifest: "Manifest",
    acct_manifest_summary: "{files} files, {dirs} directories, {links} links, {size} in all.",
    acct_and_more: "… and {count} more",
    acct_remove_all: "Remove all versions",
    acct_workspaces: "Workspaces",
    acct_synced: "Last synced",
    acct_held_by: "Held by lease",
    acct_snapshots: "Snapshots",
    acct_snapshot: "Snapshot now",
    acct_restore: "Restore",
    acct_restore_from: "Snapshot to restore",
    acct_no_workspaces: "No workspaces yet: a lease that names one creates it.",
    acct_held_note: "held: stop the lease first",
  },
  zh: {
    account: "账户",
    acct_keys: "密钥",
    acct_data: "数据",
    acct_balance_title: "余额与消耗速率",
    acct_balance: "余额",
    acct_postpaid: "后付费：租约用量按月出账，没有会耗尽的预付余额。",
    acct_state: "状态",
    acct_state_ok: "充足",
    acct_state_low: "偏低：请尽快充值",
    acct_state_exhausted: "已耗尽：租约已停止，新租约被拒绝",
    acct_topped_up: "已充值",
    acct_charged: "已扣费",
    acct_credited: "SLA 补偿",
    acct_unbilled: "已用未扣费",
    acct_burn_rate: "消耗速率",
    acct_per_hour: "{amount} 元/小时",
    acct_hours_left: "按此速率剩余时间",
    acct_hours: "{hours} 小时",
    acct_nothing_runs: "没有运行中的租约",
    acct_running: "运行中的租约",
    acct_api_keys: "API 密钥",
    acct_prefix: "密钥",
    acct_created: "创建时间",
    acct_expires: "过期时间",
    acct_never: "永不",
    acct_this_console: "本控制台正在使用",
    acct_issue: "签发密钥",
    acct_expires_on: "过期日期（可选，UTC）",
    acct_new_key: "新密钥：",
    acct_new_key_hint: "请立即复制：密钥只显示一次，平台仅保存其哈希。",
    acct_copy: "复制",
    acct_copied: "已复制。",
    acct_done: "完成",
    acct_revoke: "吊销",
    acct_revoke_own: "要吊销本控制台正在使用的密钥吗？下一次请求时您将被登出。",
    acct_really: "确定吗？",
    acct_confirm: "确认",
    acct_cancel: "取消",
    acct_no_keys: "没有密钥。",
    acct_ssh_keys: "SSH 密钥",
    acct_ssh_hint: "持有此处密钥的人可进入您运行中的租约：ssh -p 2222 <租约 ID>@<网关>。",
    acct_name: "名称",
    acct_fingerprint: "指纹",
    acct_public_key: "公钥（.pub 文件中的一行）",
    acct_add_key: "添加密钥",
    acct_remove: "删除",
    acct_no_ssh_keys: "还没有 SSH 密钥。",
    acct_storage: "存储",
    acct_used: "已用",
    acct_quota: "配额",
    acct_no_quota: "无配额",
    acct_measured: "测量时间",
    acct_not_measured: "尚未测量",
    acct_writes_stopped: "写入已停止：存储桶超出配额。请删除数据集或工作区，或申请更大配额。",
    acct_datasets: "数据集",
    acct_versions: "版本",
    acct_newest: "最新版本",
    acct_size: "大小",
    acct_files: "文件数",
    acct_no_datasets: "还没有数据集。",
    acct_add_dataset: "数据集通过命令行上传，只发送存储桶中缺少的分块，中断后可续传：",
    acct_manifest: "清单",
    acct_manifest_summary: "{files} 个文件，{dirs} 个目录，{links} 个链接，共 {size}。",
    acct_and_more: "… 另有 {count} 项",
    acct_remove_all: "删除全部版本",
    acct_workspaces: "工作区",
    acct_synced: "最近同步",
    acct_held_by: "占用租约",
    acct_snapshots: "快照",
    acct_snapshot: "立即快照",
    acct_restore: "恢复",
    acct_restore_from: "要恢复的快照",
    acct_no_workspaces: "还没有工作区：声明工作区的租约会创建它。",
    acct_held_note: "已占用：请先停止租约",
  },
});

/// How often the balance is read again: pricing reckons it on its own
/// passes, which send no change down the event stream.
const BALANCE_REFRESH_MS = 10000;
/// Leases read to count the running ones: the API's largest page.
const LEASES_PAGE = 500;
/// Paths of a manifest listed under its summary.
const MAX_MANIFEST_PATHS_SHOWN = 20;

function problem(answer) {
  return (answer.body && answer.body.detail) || `${t("unreachable")} (${answer.status})`;
}

/// Bytes for people: 1024-based, one decimal past KiB.
export function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let value = Number(n) || 0;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

/// The caller's tenant id, from the key's own answer; null until known.
function useTenantId() {
  const me = useAnswer("/v1/whoami", 0);
  return me && me.status === 200 ? me.body.tenant_id : null;
}

/// A button that asks once more before it acts: removals, restores and
/// revocations cannot be undone. `cls` tells the buttons of a row apart.
function Confirmed({ label, warning, onConfirm, cls }) {
  const [asking, setAsking] = useState(false);
  if (!asking) {
    return html`<button type="button" class=${"plain " + cls} onClick=${() => setAsking(true)}>${label}</button>`;
  }
  return html`<span class="confirming" role="group">
    <span class="muted">${warning || t("acct_really")}</span>
    <button type="button" class="danger confirm" onClick=${async () => { setAsking(false); await onConfirm(); }}>${t("acct_confirm")}</button>
    <button type="button" class="plain cancel" onClick=${() => setAsking(false)}>${t("acct_cancel")}</button>
  </span>`;
}

// ---- Account: balance and burn rate ----

/// The burn rate is pricing's own (GET /v1/tenants/{id}/balance,
/// `burn_rate_cny_per_hour`): what the tenant's running leases accrue per
/// hour now, each at its own price book, tier, share and spot price. A
/// lease carries no price, and charges lag their use by up to an hour, so
/// neither would give the rate of now. A postpaid tenant has no balance
/// and no hours left, but its burn rate and what is not yet charged.
function BalancePanel({ tenant, tick }) {
  const every = useEvery(BALANCE_REFRESH_MS);
  const answer = useAnswer(`/v1/tenants/${tenant}/balance`, tick + every);
  const leases = useAnswer(`/v1/leases?limit=${LEASES_PAGE}`, tick);
  if (!answer) return html`<${Loading} />`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const b = answer.body;
  const running = leases && leases.status === 200 ? leases.body.items.filter((l) => l.state === "running").length : null;
  const hoursLeft = b.covers_seconds != null ? (b.covers_seconds / 3600).toFixed(1) : null;
  return html`<div>
    ${!b.prepaid && html`<p id="postpaid">${t("acct_postpaid")}</p>`}
    <table id="balance-table"><tbody>
      ${b.prepaid && html`
        <tr><th>${t("acct_balance")}</th><td id="balance" class="num big">${b.balance} CNY</td></tr>
        <tr><th>${t("acct_state")}</th><td id="balance-state" class=${"state-" + b.state} role=${b.state === "ok" ? null : "alert"}>${t("acct_state_" + b.state)}</td></tr>
        <tr><th>${t("acct_burn_rate")}</th><td id="burn-rate" class="num">${t("acct_per_hour", { amount: b.burn_rate_cny_per_hour })}</td></tr>
        <tr><th>${t("acct_hours_left")}</th><td id="hours-left" class="num">${hoursLeft != null ? t("acct_hours", { hours: hoursLeft }) : t("acct_nothing_runs")}</td></tr>
        <tr><th>${t("acct_topped_up")}</th><td class="num">${b.topped_up} CNY</td></tr>
        <tr><th>${t("acct_charged")}</th><td class="num">${b.charged} CNY</td></tr>
        <tr><th>${t("acct_credited")}</th><td class="num">${b.credited} CNY</td></tr>
        <tr><th>${t("acct_unbilled")}</th><td class="num">${b.unbilled} CNY</td></tr>`}
      ${!b.prepaid && html`<tr><th>${t("acct_burn_rate")}</th><td id="burn-rate" class="num">${t("acct_per_hour", { amount: b.burn_rate_cny_per_hour })}</td></tr>
        <tr><th>${t("acct_unbilled")}</th><td class="num">${b.unbilled} CNY</td></tr>`}
      <tr><th>${t("acct_running")}</th><td id="running-leases" class="num">${running == null ? "–" : running}</td></tr>
    </tbody></table>
  </div>`;
}

export function Account({ tick }) {
  const tenant = useTenantId();
  return html`<section aria-labelledby="account-title" id="account-page">
    <h2 id="account-title">${t("acct_balance_title")}</h2>
    ${tenant ? html`<${BalancePanel} tenant=${tenant} tick=${tick} />` : html`<${Loading} />`}
  </section>`;
}

// ---- Keys: API keys and SSH keys ----

function ApiKeys({ tenant }) {
  const [version, setVersion] = useState(0);
  const answer = useAnswer(`/v1/tenants/${tenant}/keys`, version);
  const [expires, setExpires] = useState("");
  const [issued, setIssued] = useState(null);
  const [copied, setCopied] = useState(false);
  const [error, setError] = useState("");
  const issue = async (e) => {
    e.preventDefault();
    const body = expires ? { expires_at: `${expires}T00:00:00Z` } : {};
    const a = await api.post(`/v1/tenants/${tenant}/keys`, body);
    if (a.status === 201) {
      setIssued(a.body);
      setCopied(false);
      setError("");
      setExpires("");
    } else setError(problem(a));
    setVersion((v) => v + 1);
  };
  const revoke = async (k) => {
    const a = await api.del(`/v1/tenants/${tenant}/keys/${k.key_id}`);
    setError(a.status === 200 ? "" : problem(a));
    setVersion((v) => v + 1);
  };
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(issued.api_key);
      setCopied(true);
    } catch (_) { /* the key stays selectable */ }
  };
  const mine = api.key() || "";
  const keys = answer && answer.status === 200 ? answer.body.items : [];
  return html`<section aria-labelledby="api-keys-title" id="api-keys">
    <h2 id="api-keys-title">${t("acct_api_keys")}</h2>
    ${answer && answer.status !== 200 && html`<${Failed} answer=${answer} />`}
    ${error && html`<p class="error" role="alert" id="api-key-error">${error}</p>`}
    ${issued && html`<div class="panel secret" role="status">
      <p>${t("acct_new_key")} <code id="new-api-key" class="wrap">${issued.api_key}</code></p>
      <p class="muted">${t("acct_new_key_hint")}</p>
      <button type="button" class="plain" id="copy-api-key" onClick=${copy}>${t("acct_copy")}</button>
      ${copied && html`<span class="muted"> ${t("acct_copied")}</span>`}
      <button type="button" class="plain" id="new-api-key-done" onClick=${() => setIssued(null)}>${t("acct_done")}</button>
    </div>`}
    ${answer && answer.status === 200 && (keys.length === 0 ? html`<p>${t("acct_no_keys")}</p>` : html`<table id="api-key-table">
      <thead><tr><th>${t("acct_prefix")}</th><th>${t("acct_created")}</th><th>${t("acct_expires")}</th><th>${t("status")}</th><th></th></tr></thead>
      <tbody>${keys.map((k) => html`<tr data-key-id=${k.key_id} data-prefix=${k.prefix}>
        <td><code>${k.prefix}…</code>${mine.startsWith(k.prefix) && k.state === "active" ? html` <span class="muted">(${t("acct_this_console")})</span>` : ""}</td>
        <td>${k.created_at}</td><td>${k.expires_at || t("acct_never")}</td><td class="state">${k.state}</td>
        <td>${k.state === "active" && html`<${Confirmed} label=${t("acct_revoke")} cls="revoke"
          warning=${mine.startsWith(k.prefix) ? t("acct_revoke_own") : null} onConfirm=${() => revoke(k)} />`}</td>
      </tr>`)}</tbody>
    </table>`)}
    <form id="issue-key-form" class="inline" onSubmit=${issue}>
      <label for="key-expires">${t("acct_expires_on")}</label>
      <input id="key-expires" type="date" value=${expires} onInput=${(e) => setExpires(e.target.value)} />
      <button type="submit" id="issue-key">${t("acct_issue")}</button>
    </form>
  </section>`;
}

function SshKeys() {
  const [version, setVersion] = useState(0);
  const answer = useAnswer("/v1/ssh-keys", version);
  const [form, setForm] = useState({ name: "", public_key: "" });
  const [error, setError] = useState("");
  const add = async (e) => {
    e.preventDefault();
    const a = await api.post("/v1/ssh-keys", { name: form.name.trim(), public_key: form.public_key.trim() });
    if (a.status === 201) {
      setForm({ name: "", public_key: "" });
      setError("");
    } else setError(problem(a));
    setVersion((v) => v + 1);
  };
  const remove = async (k) => {
    const a = await api.del(`/v1/ssh-keys/${k.id}`);
    setError(a.status === 204 ? "" : problem(a));
    setVersion((v) => v + 1);
  };
  const keys = answer && answer.status === 200 ? answer.body.ssh_keys : [];
  return html`<section aria-labelledby="ssh-keys-title" id="ssh-keys">
    <h2 id="ssh-keys-title">${t("acct_ssh_keys")}</h2>
    <p class="muted">${t("acct_ssh_hint")}</p>
    ${answer && answer.status !== 200 && html`<${Failed} answer=${answer} />`}
    ${error && html`<p class="error" role="alert" id="ssh-error">${error}</p>`}
    ${answer && answer.status === 200 && (keys.length === 0 ? html`<p id="ssh-empty">${t("acct_no_ssh_keys")}</p>` : html`<table id="ssh-key-table">
      <thead><tr><th>${t("acct_name")}</th><th>${t("acct_fingerprint")}</th><th>${t("acct_created")}</th><th></th></tr></thead>
      <tbody>${keys.map((k) => html`<tr data-ssh-key=${k.id} data-name=${k.name}>
        <td>${k.name}</td><td><code>${k.fingerprint}</code></td><td>${k.created_at}</td>
        <td><${Confirmed} label=${t("acct_remove")} cls="remove" onConfirm=${() => remove(k)} /></td>
      </tr>`)}</tbody>
    </table>`)}
    <form id="ssh-add-form" onSubmit=${add}>
      <label for="ssh-name">${t("acct_name")}</label>
      <input id="ssh-name" required maxlength="64" value=${form.name} onInput=${(e) => setForm({ ...form, name: e.target.value })} />
      <label for="ssh-public-key">${t("acct_public_key")}</label>
      <textarea id="ssh-public-key" required rows="3" spellcheck="false" value=${form.public_key}
        onInput=${(e) => setForm({ ...form, public_key: e.target.value })} placeholder="ssh-ed25519 AAAA… you@laptop"></textarea>
      <button type="submit" id="ssh-add">${t("acct_add_key")}</button>
    </form>
  </section>`;
}

export function Keys() {
  const tenant = useTenantId();
  return html`<div id="keys-page">
    ${tenant ? html`<${ApiKeys} tenant=${tenant} />` : html`<${Loading} />`}
    <${SshKeys} />
  </div>`;
}

// ---- Data: storage, datasets, workspaces ----

function Storage({ answer }) {
  if (!answer) return html`<${Loading} />`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const s = answer.body;
  return html`<div>
    ${s.writes_stopped && html`<p class="error" role="alert" id="writes-stopped">${t("acct_writes_stopped")}</p>`}
    <table id="storage-table"><tbody>
      <tr><th>${t("acct_used")}</th><td id="storage-used" class="num" data-bytes=${s.bytes}>${bytes(s.bytes)}</td></tr>
      <tr><th>${t("acct_quota")}</th><td id="storage-quota" class="num">${s.max_storage_gb != null ? `${s.max_storage_gb} GB` : t("acct_no_quota")}</td></tr>
      <tr><th>${t("acct_measured")}</th><td>${s.measured_at || t("acct_not_measured")}</td></tr>
    </tbody></table>
  </div>`;
}

/// What a version's manifest holds, counted, and its first paths.
function Manifest({ name, version }) {
  const answer = useAnswer(`/v1/datasets/${encodeURIComponent(name)}/versions/${encodeURIComponent(version)}/manifest`, 0);
  if (!answer) return html`<${Loading} />`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const files = answer.body.files || [];
  const count = { files: 0, dirs: 0, links: 0, size: 0 };
  for (const f of files) {
    if (f.kind === "dir") count.dirs += 1;
    else if (f.kind && f.kind.file) { count.files += 1; count.size += f.kind.file.bytes; }
    else count.links += 1;
  }
  const shown = files.slice(0, MAX_MANIFEST_PATHS_SHOWN);
  return html`<div class="manifest" data-manifest=${version}>
    <p class="manifest-summary">${t("acct_manifest_summary", { ...count, size: bytes(count.size) })}</p>
    <ul>${shown.map((f) => html`<li><code>${f.path}${f.kind === "dir" ? "/" : ""}</code></li>`)}</ul>
    ${files.length > shown.length && html`<p class="muted">${t("acct_and_more", { count: files.length - shown.length })}</p>`}
  </div>`;
}

function Dataset({ d, onChange, setError }) {
  const [open, setOpen] = useState(false);
  const [manifest, setManifest] = useState(null);
  const newest = d.versions[0];
  const remove = async (version) => {
    const q = version ? `?version=${encodeURIComponent(version)}` : "";
    const a = await api.del(`/v1/datasets/${encodeURIComponent(d.name)}${q}`);
    setError(a.status === 204 ? "" : problem(a));
    onChange();
  };
  return html`<tr data-dataset=${d.name}>
      <td>${d.name}</td><td class="num versions-count">${d.versions.length}</td>
      <td><code title=${newest.version}>${newest.version.slice(0, 12)}</code></td>
      <td class="num">${bytes(newest.bytes)}</td><td class="num">${newest.files}</td><td>${newest.created_at}</td>
      <td class="actions">
        <button type="button" class="plain versions" aria-expanded=${open ? "true" : "false"} onClick=${() => setOpen(!open)}>${t("acct_versions")}</button>
        <${Confirmed} label=${t("acct_remove_all")} cls="remove" onConfirm=${() => remove(null)} />
      </td>
    </tr>
    ${open && html`<tr class="detail" data-dataset-versions=${d.name}><td colspan="7">
      <table class="versions"><tbody>${d.versions.map((v) => html`<tr data-version=${v.version}>
        <td><code class="wrap">${v.version}</code></td><td class="num">${bytes(v.bytes)}</td><td class="num">${v.files}</td><td>${v.created_at}</td>
        <td class="actions">
          <button type="button" class="plain manifest-button" aria-expanded=${manifest === v.version ? "true" : "false"}
            onClick=${() => setManifest(manifest === v.version ? null : v.version)}>${t("acct_manifest")}</button>
          <${Confirmed} label=${t("acct_remove")} cls="remove-version" onConfirm=${() => remove(v.version)} />
        </td></tr>
        ${manifest === v.version && html`<tr><td colspan="5"><${Manifest} name=${d.name} version=${v.version} /></td></tr>`}`)}
      </tbody></table>
    </td></tr>`}`;
}

function Workspace({ w, onChange, setError }) {
  const [picked, setFrom] = useState("");
  // The newest snapshot until another is picked, one taken since included.
  const from = picked || (w.snapshots.length ? w.snapshots[0].date : "");
  const act = async (call, ok) => {
    const a = await call();
    setError(ok.includes(a.status) ? "" : problem(a));
    onChange();
  };
  const path = `/v1/workspaces/${encodeURIComponent(w.name)}`;
  const held = w.held_by != null;
  const pick = `restore-${w.name}`;
  return html`<tr data-workspace=${w.name}>
    <td>${w.name}</td><td class="num">${bytes(w.bytes)}</td><td class="num">${w.files}</td><td>${w.synced_at}</td>
    <td>${held ? html`<a href=${"#/lease/" + w.held_by}><code>${w.held_by}</code></a>` : "–"}</td>
    <td class="num snapshots-count">${w.snapshots.length}</td>
    <td class="actions">
      <button type="button" class="plain snapshot" onClick=${() => act(() => api.post(path + "/snapshots"), [200, 201])}>${t("acct_snapshot")}</button>
      ${w.snapshots.length > 0 && html`<label class="sr-only" for=${pick}>${t("acct_restore_from")}</label>
        <select id=${pick} class="restore-from" value=${from} disabled=${held} onChange=${(e) => setFrom(e.target.value)}>
          ${w.snapshots.map((s) => html`<option value=${s.date}>${s.date}</option>`)}
        </select>
        ${!held && html`<${Confirmed} label=${t("acct_restore")} cls="restore"
          onConfirm=${() => act(() => api.post(path + "/restore", { snapshot: from }), [200])} />`}`}
      ${held ? html`<span class="muted">${t("acct_held_note")}</span>`
        : html`<${Confirmed} label=${t("acct_remove")} cls="remove" onConfirm=${() => act(() => api.del(path), [204])} />`}
    </td>
  </tr>`;
}

export function Data({ tick }) {
  const [version, setVersion] = useState(0);
  const [error, setError] = useState("");
  const storage = useAnswer("/v1/storage", tick + version);
  const datasets = useAnswer("/v1/datasets", tick + version);
  const workspaces = useAnswer("/v1/workspaces", tick + version);
  const changed = () => setVersion((v) => v + 1);
  const list = (answer, field) => (answer && answer.status === 200 ? answer.body[field] : []);
  const ds = list(datasets, "datasets");
  const ws = list(workspaces, "workspaces");
  return html`<div id="data-page">
    <section aria-labelledby="storage-title">
      <h2 id="storage-title">${t("acct_storage")}</h2>
      <${Storage} answer=${storage} />
    </section>
    ${error && html`<p class="error" role="alert" id="data-error">${error}</p>`}
    <section aria-labelledby="datasets-title">
      <h2 id="datasets-title">${t("acct_datasets")}</h2>
      ${datasets && datasets.status !== 200 && html`<${Failed} answer=${datasets} />`}
      ${datasets && datasets.status === 200 && (ds.length === 0 ? html`<p id="datasets-empty">${t("acct_no_datasets")}</p>` : html`<table id="dataset-table">
        <thead><tr><th>${t("acct_name")}</th><th class="num">${t("acct_versions")}</th><th>${t("acct_newest")}</th>
          <th class="num">${t("acct_size")}</th><th class="num">${t("acct_files")}</th><th>${t("acct_created")}</th><th></th></tr></thead>
        <tbody>${ds.map((d) => html`<${Dataset} key=${d.name} d=${d} onChange=${changed} setError=${setError} />`)}</tbody>
      </table>`)}
      <p>${t("acct_add_dataset")}</p>
      <pre id="add-dataset-command"><code>lh data put ./my-data --name my-data</code></pre>
    </section>
    <section aria-labelledby="workspaces-title">
      <h2 id="workspaces-title">${t("acct_workspaces")}</h2>
      ${workspaces && workspaces.status !== 200 && html`<${Failed} answer=${workspaces} />`}
      ${workspaces && workspaces.status === 200 && (ws.length === 0 ? html`<p id="workspaces-empty">${t("acct_no_workspaces")}</p>` : html`<table id="workspace-table">
        <thead><tr><th>${t("acct_name")}</th><th class="num">${t("acct_size")}</th><th class="num">${t("acct_files")}</th>
          <th>${t("acct_synced")}</th><th>${t("acct_held_by")}</th><th class="num">${t("acct_snapshots")}</th><th></th></tr></thead>
        <tbody>${ws.map((w) => html`<${Workspace} key=${w.name} w=${w} onChange=${changed} setError=${setError} />`)}</tbody>
      </table>`)}
    </section>
  </div>`;
}
