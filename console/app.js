// The Leasehold console: pages over the gateway's API on the same origin.
// Preact with htm (console/vendor, see scripts/console-vendor.sh); the
// route is the URL's fragment (#/gpus), so the gateway serves one page.

import { h, render } from "./vendor/preact.mjs";
import { useEffect, useState } from "./vendor/hooks.mjs";
import htm from "./vendor/htm.mjs";
import * as api from "./api.js";
import { choose, language, LANGUAGES, t } from "./i18n.js";

const html = htm.bind(h);

/// The page the fragment names.
function route() {
  const name = (location.hash || "#/gpus").slice(2);
  return ["gpus", "leases", "fleet"].includes(name) ? name : "gpus";
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
  const link = (name) => html`<a href=${"#/" + name} aria-current=${page === name ? "page" : null} id=${"nav-" + name}>${t(name)}</a>`;
  return html`<header>
    <h1>${t("title")}</h1>
    <nav aria-label="main">${link("gpus")}${link("leases")}${operator && link("fleet")}</nav>
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
        <td><code>${l.id}</code></td><td class="state">${l.state}</td><td>${l.gpu_model}</td>
        <td class="num">${l.gpus ?? "–"}</td><td>${l.node_id || "–"}</td><td>${l.created_at}</td></tr>`)}</tbody>
    </table>`}
  </section>`;
}

function Fleet({ tick }) {
  const answer = useAnswer("/v1/nodes", tick);
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
  const Page = page === "leases" ? Leases : page === "fleet" && operator ? Fleet : Gpus;
  return html`<${Header} page=${page} operator=${operator} onSignOut=${signOut} onLanguage=${onLanguage} />
    <main id="main"><${Page} tick=${tick} /></main>`;
}

render(html`<${App} />`, document.getElementById("app"));
