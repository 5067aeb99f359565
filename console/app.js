// The Leasehold console: pages over the gateway's API on the same origin.
// Preact with htm (console/vendor, see scripts/console-vendor.sh); the
// route is the URL's fragment (#/gpus), so the gateway serves one page.

import { h, render } from "./vendor/preact.mjs";
import { useEffect, useState } from "./vendor/hooks.mjs";
import htm from "./vendor/htm.mjs";
import * as api from "./api.js";
import { choose, language, LANGUAGES, t } from "./i18n.js";

const html = htm.bind(h);

/// The page the fragment names, and the id in it: `#/lease/<id>`.
function route() {
  const [name, id] = (location.hash || "#/gpus").slice(2).split("/");
  const known = ["gpus", "new", "leases", "lease", "invoices", "fleet"];
  return { name: known.includes(name) ? name : "gpus", id };
}

function SignIn({ onSignedIn }) {
  const [error, setError] = useState("");
  const submit = async (e) => {
    e.preventDefault();
    const value = e.target.elements.key.value.trim();
    try {
      const answer = await api.get("/v1/gpus", value);
      if (answer.status === 401 || answer.status === 403) return setError(t("bad_key"));
      if (answer.status >= 500 && answer.status !== 503) return setError(t("unreachable"));
      // Operators may read the fleet; tenants may not.
      const fleet = await api.get("/v1/nodes", value);
      api.remember(value);
      onSignedIn(fleet.status === 200);
    } catch (_) {
      setError(t("unreachable"));
    }
  };
  return html`<form class="signin" onSubmit=${submit} aria-labelledby="signin-title">
    <h2 id="signin-title">${t("sign_in")}</h2>
    <label for="key">${t("api_key")}</label>
    <input id="key" name="key" type="password" autocomplete="off" required autofocus />
    <p class="muted">${t("api_key_hint")}</p>
    ${error && html`<p class="error" role="alert" id="signin-error">${error}</p>`}
    <button type="submit" id="signin">${t("sign_in")}</button>
  </form>`;
}

function Header({ page, operator, onSignOut, onLanguage }) {
  const label = { new: "new_lease" };
  const link = (name) => html`<a href=${"#/" + name} aria-current=${page === name ? "page" : null} id=${"nav-" + name}>${t(label[name] || name)}</a>`;
  return html`<header>
    <h1>${t("title")}</h1>
    <nav aria-label="main">${link("gpus")}${!operator && link("new")}${link("leases")}${!operator && link("invoices")}${operator && link("fleet")}</nav>
    <label class="muted" for="language">${t("language")}</label>
    <select id="language" value=${language()} onChange=${(e) => onLanguage(e.target.value)}>
      ${LANGUAGES.map(([code, name]) => html`<option value=${code}>${name}</option>`)}
    </select>
    <button class="plain" id="signout" onClick=${onSignOut}>${t("sign_out")}</button>
  </header>`;
}

/// GETs `path` now and again whenever `follows` says a change came.
function useAnswer(path, tick) {
  const [answer, setAnswer] = useState(null);
  useEffect(() => {
    let live = true;
    api.get(path).then((a) => live && setAnswer(a)).catch(() => live && setAnswer({ status: 0 }));
    return () => { live = false; };
  }, [path, tick]);
  return answer;
}

function Failed({ answer }) {
  return html`<p class="error" role="alert">${(answer.body && answer.body.detail) || t("unreachable")}</p>`;
}

function Gpus({ tick }) {
  const answer = useAnswer("/v1/gpus", tick);
  if (!answer) return html`<p>${t("loading")}</p>`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const offers = answer.body.offers || [];
  const price = (o, tier) => (o.prices.find((p) => p.tier === tier) || {}).cny_per_gpu_hour || "–";
  return html`<section aria-labelledby="gpus-title">
    <h2 id="gpus-title">${t("gpus")}</h2>
    ${offers.length === 0 ? html`<p>${t("no_gpus")}</p>` : html`<table id="gpu-table">
      <thead><tr><th>${t("model")}</th><th class="num">${t("memory_gb")}</th><th>${t("zone")}</th>
        <th class="num">${t("free")}</th><th class="num">${t("in_shares")}</th><th class="num">${t("mig")}</th>
        <th class="num">${t("basic")}</th><th class="num">${t("performance")}</th><th class="num">${t("spot_now")}</th></tr></thead>
      <tbody>${offers.map((o) => html`<tr>
        <td>${o.gpu_model}</td><td class="num">${o.vram_gb}</td><td>${o.zone}</td>
        <td class="num">${o.gpus_free}/${o.gpus_total}</td><td class="num">${(o.free_milli / 1000).toFixed(2)}</td>
        <td class="num">${o.mig_gpus}</td><td class="num">${price(o, "basic")}</td><td class="num">${price(o, "performance")}</td>
        <td class="num">${o.spot_cny_per_gpu_hour || price(o, "spot")}</td></tr>`)}</tbody>
    </table>`}
    <p class="muted">${t("as_of")} ${answer.body.as_of || "–"}</p>
  </section>`;
}

function Leases({ tick }) {
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

/// A lease to ask for, priced before it is: the quote is asked again at
/// each change of the form, and the lease is asked for on that quote.
function NewLease({ tick }) {
  const catalogue = useAnswer("/v1/gpus", tick);
  const [form, setForm] = useState({ model: "", gpus: 1, tier: "basic", image: "", command: "", hours: 1 });
  const [quote, setQuote] = useState(null);
  const [error, setError] = useState("");
  const models = catalogue && catalogue.status === 200
    ? [...new Set(catalogue.body.offers.map((o) => o.gpu_model))] : [];
  const model = form.model || models[0] || "";
  useEffect(() => {
    if (!model) return undefined;
    let live = true;
    const asked = { gpus: Number(form.gpus), gpu_model: model, tier: form.tier, duration_seconds: Math.round(Number(form.hours) * 3600) };
    api.post("/v1/quotes", asked).then((a) => {
      if (!live) return;
      if (a.status === 201) { setQuote(a.body); setError(""); } else { setQuote(null); setError((a.body && a.body.detail) || String(a.status)); }
    });
    return () => { live = false; };
  }, [model, form.gpus, form.tier, form.hours]);
  const set = (field) => (e) => setForm({ ...form, [field]: e.target.value });
  const submit = async (e) => {
    e.preventDefault();
    const body = { gpus: Number(form.gpus), gpu_model: model, tier: form.tier };
    if (quote) body.quote_id = quote.quote_id;
    if (form.image) {
      body.workload = { image: form.image };
      if (form.command) body.workload.command = ["sh", "-c", form.command];
    }
    const answer = await api.post("/v1/leases", body);
    if (answer.status === 202) location.hash = "#/lease/" + answer.body.id;
    else setError((answer.body && answer.body.detail) || String(answer.status));
  };
  return html`<form onSubmit=${submit} aria-labelledby="new-title" id="new-lease">
    <h2 id="new-title">${t("new_lease")}</h2>
    <label for="model">${t("model")}</label>
    <select id="model" value=${model} onChange=${set("model")}>${models.map((m) => html`<option value=${m}>${m}</option>`)}</select>
    <label for="gpus">${t("gpu_count")}</label>
    <input id="gpus" type="number" min="1" max="16" value=${form.gpus} onInput=${set("gpus")} />
    <label for="tier">${t("tier")}</label>
    <select id="tier" value=${form.tier} onChange=${set("tier")}>
      ${["basic", "performance", "spot"].map((tier) => html`<option value=${tier}>${tier}</option>`)}
    </select>
    <label for="image">${t("image")}</label>
    <input id="image" value=${form.image} onInput=${set("image")} placeholder="localhost/leasehold/base" />
    <label for="command">${t("command")}</label>
    <input id="command" value=${form.command} onInput=${set("command")} />
    <label for="hours">${t("hours")}</label>
    <input id="hours" type="number" min="0.1" step="0.1" value=${form.hours} onInput=${set("hours")} />
    <p id="quote" aria-live="polite">${quote ? t("quoted", {
      amount: quote.amount, currency: quote.currency, hours: form.hours,
      unit: quote.unit_price_cny_per_gb_hour, version: quote.price_book_version,
    }) : ""} ${quote && quote.price_moves ? t("price_moves") : ""}</p>
    ${error && html`<p class="error" role="alert" id="new-error">${error}</p>`}
    <button type="submit" id="rent">${t("rent")}</button>
  </form>`;
}

/// One lease: its state as it changes, what its workload wrote, a stop.
function LeasePage({ id, tick }) {
  const answer = useAnswer("/v1/leases/" + id, tick);
  const logs = useAnswer("/v1/leases/" + id + "/logs", tick);
  if (!answer) return html`<p>${t("loading")}</p>`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const l = answer.body;
  const stop = async () => { await api.post("/v1/leases/" + id + "/stop"); };
  const text = logs && logs.status === 200 && logs.body && logs.body.data;
  return html`<section aria-labelledby="lease-title">
    <h2 id="lease-title">${t("lease")} <code>${l.id}</code></h2>
    <table><tbody>
      <tr><th>${t("state")}</th><td id="lease-state">${l.state}</td></tr>
      <tr><th>${t("model")}</th><td>${l.gpu_model} × ${l.gpus ?? 1}</td></tr>
      <tr><th>${t("tier")}</th><td>${l.tier}</td></tr>
      <tr><th>${t("node")}</th><td>${l.node_id || "–"}</td></tr>
      <tr><th>${t("created")}</th><td>${l.created_at}</td></tr>
    </tbody></table>
    ${!["ended", "rejected"].includes(l.state) && html`<p><button id="stop" onClick=${stop}>${t("stop")}</button></p>`}
    <h3>${t("logs")}</h3>
    <pre id="lease-logs">${text || t("no_logs")}</pre>
  </section>`;
}

function Invoices({ tick }) {
  const answer = useAnswer("/v1/invoices", tick);
  const [error, setError] = useState("");
  if (!answer) return html`<p>${t("loading")}</p>`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const invoices = answer.body.invoices || [];
  const csv = (i) => api.download("/v1/invoices/" + i.id + "/csv", (i.number || i.id) + ".csv").catch((e) => setError(String(e)));
  return html`<section aria-labelledby="invoices-title">
    <h2 id="invoices-title">${t("invoices")}</h2>
    ${error && html`<p class="error" role="alert">${error}</p>`}
    ${invoices.length === 0 ? html`<p>${t("no_invoices")}</p>` : html`<table id="invoice-table">
      <thead><tr><th>${t("period")}</th><th>${t("status")}</th><th class="num">${t("total")}</th><th></th></tr></thead>
      <tbody>${invoices.map((i) => html`<tr data-invoice=${i.id}>
        <td>${i.period}</td><td>${i.status}</td><td class="num">${i.total} ${i.currency || ""}</td>
        <td><button class="plain csv" onClick=${() => csv(i)}>${t("csv")}</button></td></tr>`)}</tbody>
    </table>`}
  </section>`;
}

/// A counter that goes up every `ms`: for what changes without an event
/// (GPU readings).
function useEvery(ms) {
  const [n, setN] = useState(0);
  useEffect(() => {
    const timer = setInterval(() => setN((x) => x + 1), ms);
    return () => clearInterval(timer);
  }, [ms]);
  return n;
}

function Fleet({ tick }) {
  const every = useEvery(5000);
  const answer = useAnswer("/v1/nodes", tick + every);
  if (!answer) return html`<p>${t("loading")}</p>`;
  if (answer.status !== 200) return html`<${Failed} answer=${answer} />`;
  const cell = (g) => {
    const kind = g.health !== "healthy" ? g.health : g.used_milli > 0 ? "held" : "free";
    const title = `GPU ${g.index} ${g.model} · ${g.health} · ${t("held")} ${(g.used_milli / 10).toFixed(0)}%` +
      (g.utilization_pct != null ? ` · ${g.utilization_pct}%` : "") +
      (g.temperature_c != null ? ` · ${g.temperature_c}°C` : "");
    return html`<div class=${"cell " + kind} title=${title} aria-label=${title} role="img">${g.index}</div>`;
  };
  return html`<section aria-labelledby="fleet-title">
    <h2 id="fleet-title">${t("fleet")}</h2>
    ${(answer.body.nodes || []).map((n) => html`<div class="node" data-node=${n.id}>
      <h3>${n.id} <span class="muted">${n.zone} · <span class="node-state">${n.state}${n.drain_mode ? " (" + n.drain_mode + ")" : ""}</span> · ${t("heartbeat")} ${n.last_heartbeat_at || "–"}</span></h3>
      <div class="heat">${n.gpus.map(cell)}</div>
    </div>`)}
  </section>`;
}

function App() {
  const [signedIn, setSignedIn] = useState(Boolean(api.key()));
  const [operator, setOperator] = useState(sessionStorage.getItem("leasehold.operator") === "1");
  const [page, setPage] = useState(route());
  const [tick, setTick] = useState(0);
  const [, setLang] = useState(language());
  useEffect(() => {
    const onHash = () => setPage(route());
    addEventListener("hashchange", onHash);
    return () => removeEventListener("hashchange", onHash);
  }, []);
  useEffect(() => {
    document.documentElement.lang = language() === "zh" ? "zh-CN" : "en";
    document.title = t("title");
  });
  useEffect(() => {
    if (!signedIn) return undefined;
    return api.follow(() => setTick((n) => n + 1));
  }, [signedIn]);
  if (!signedIn) {
    return html`<${SignIn} onSignedIn=${(isOperator) => {
      sessionStorage.setItem("leasehold.operator", isOperator ? "1" : "0");
      setOperator(isOperator);
      setSignedIn(true);
    }} />`;
  }
  const signOut = () => { api.forget(); sessionStorage.removeItem("leasehold.operator"); setSignedIn(false); };
  const onLanguage = (lang) => { choose(lang); setLang(lang); };
  const pages = { leases: Leases, new: NewLease, lease: LeasePage, invoices: Invoices, fleet: operator ? Fleet : Gpus };
  const Page = pages[page.name] || Gpus;
  return html`<${Header} page=${page.name} operator=${operator} onSignOut=${signOut} onLanguage=${onLanguage} />
    <main id="main"><${Page} id=${page.id} tick=${tick} /></main>`;
}

render(html`<${App} />`, document.getElementById("app"));
