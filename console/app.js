// The Leasehold console: pages over the gateway's API on the same origin.
// Preact with htm (console/vendor, see scripts/console-vendor.sh); the
// route is the URL's fragment (#/gpus), so the gateway serves one page.
// Each page names who may see it; the API refuses the rest anyway.

import { render } from "./vendor/preact.mjs";
import { useEffect, useState } from "./vendor/hooks.mjs";
import * as api from "./api.js";
import * as oidc from "./oidc.js";
import { choose, language, LANGUAGES, t } from "./i18n.js";
import { html } from "./ui.js";
import { Gpus } from "./pages/gpus.js";
import { Leases, NewLease } from "./pages/leases.js";
import { LeasePage } from "./pages/lease.js";
import { Invoices } from "./pages/invoices.js";
import { Fleet } from "./pages/fleet.js";
import { Prices, Tenants } from "./pages/operator.js";
import { DailyReport } from "./pages/report.js";
import { Audit } from "./pages/audit.js";
import { Account, Data, Keys } from "./pages/account.js";

const TENANT = "tenant";
const ADMIN = "admin";
const AUDITOR = "auditor";

/// Every page: its name in the fragment, its word in the menu (none: not
/// in the menu), who sees it. The first a caller may see is its home.
const PAGES = [
  { name: "gpus", label: "gpus", page: Gpus, for: [TENANT, ADMIN, AUDITOR] },
  { name: "new", label: "new_lease", page: NewLease, for: [TENANT] },
  { name: "leases", label: "leases", page: Leases, for: [TENANT, ADMIN] },
  { name: "lease", page: LeasePage, for: [TENANT, ADMIN] },
  { name: "invoices", label: "invoices", page: Invoices, for: [TENANT] },
  { name: "fleet", label: "fleet", page: Fleet, for: [ADMIN] },
  { name: "tenants", label: "op_tenants", page: Tenants, for: [ADMIN, AUDITOR] },
  { name: "prices", label: "op_prices", page: Prices, for: [ADMIN, AUDITOR] },
  { name: "report", label: "op_report", page: DailyReport, for: [ADMIN, AUDITOR] },
  { name: "account", label: "account", page: Account, for: [TENANT] },
  { name: "keys", label: "acct_keys", page: Keys, for: [TENANT] },
  { name: "data", label: "acct_data", page: Data, for: [TENANT] },
  { name: "audit", label: "audit", page: Audit, for: [AUDITOR, ADMIN] },
];

/// Who a caller is, as the console sorts pages: `tenant`, `admin` or
/// `auditor`, from `GET /v1/whoami`.
function roleOf(whoami) {
  return whoami.kind === "tenant" ? TENANT : whoami.role === "admin" ? ADMIN : AUDITOR;
}

/// The console's role for what `POST /v1/oidc/token` says the token is.
const ROLE_SIGNED_IN = { admin: ADMIN, auditor: AUDITOR, tenant: TENANT };

/// The page the fragment names, and the id in it: `#/lease/<id>`.
/// An id that is not one (a lease's or a tenant's id, a date) is no id:
/// pages put ids into the API's paths.
function route() {
  const [name, id] = (location.hash || "#/gpus").slice(2).split("/");
  return { name, id: id && /^[A-Za-z0-9._-]{1,64}$/.test(id) && !id.startsWith(".") ? id : undefined };
}

function SignIn({ onSignedIn }) {
  const [error, setError] = useState("");
  const [issuer, setIssuer] = useState(null);
  const [finishing, setFinishing] = useState(oidc.returning());
  useEffect(() => {
    oidc.offered().then(setIssuer);
    if (!oidc.returning()) return;
    oidc.finish()
      .then((signed) => { api.remember(signed.token); onSignedIn(ROLE_SIGNED_IN[signed.role]); })
      .catch((e) => { setFinishing(false); setError(t("oidc_refused", { why: e.message })); });
  }, []);
  const submit = async (e) => {
    e.preventDefault();
    const value = e.target.elements.key.value.trim();
    try {
      const answer = await api.get("/v1/whoami", value);
      if (answer.status === 401 || answer.status === 403) return setError(t("bad_key"));
      if (answer.status !== 200) return setError(t("unreachable"));
      api.remember(value);
      onSignedIn(roleOf(answer.body));
    } catch (_) {
      setError(t("unreachable"));
    }
  };
  if (finishing) return html`<p class="signin loading" id="oidc-finishing">${t("loading")}</p>`;
  return html`<form class="signin" onSubmit=${submit} aria-labelledby="signin-title">
    <h2 id="signin-title">${t("sign_in")}</h2>
    <label for="key">${t("api_key")}</label>
    <input id="key" name="key" type="password" autocomplete="off" required autofocus />
    <p class="muted">${t("api_key_hint")}</p>
    ${error && html`<p class="error" role="alert" id="signin-error">${error}</p>`}
    <button type="submit" id="signin">${t("sign_in")}</button>
    ${issuer && html`<p class="or">${t("or")}</p>
      <button type="button" class="plain" id="oidc-sign-in" onClick=${() => oidc.start(issuer)}>${t(issuer.tenants ? "oidc_sign_in_all" : "oidc_sign_in")}</button>`}
  </form>`;
}

function Header({ page, role, onSignOut, onLanguage }) {
  const shown = PAGES.filter((p) => p.label && p.for.includes(role));
  return html`<header>
    <h1>${t("title")}</h1>
    <nav aria-label="main">${shown.map((p) => html`<a href=${"#/" + p.name} aria-current=${page === p.name ? "page" : null} id=${"nav-" + p.name}>${t(p.label)}</a>`)}</nav>
    <span class="muted" id="role">${t("role_" + role)}</span>
    <label class="muted" for="language">${t("language")}</label>
    <select id="language" value=${language()} onChange=${(e) => onLanguage(e.target.value)}>
      ${LANGUAGES.map(([code, name]) => html`<option value=${code}>${name}</option>`)}
    </select>
    <button class="plain" id="signout" onClick=${onSignOut}>${t("sign_out")}</button>
  </header>`;
}

function NotHere() {
  return html`<section><h2 id="not-here">${t("not_here")}</h2><p><a href="#/gpus">${t("gpus")}</a></p></section>`;
}

const ROLE = "leasehold.role";

function App() {
  const [role, setRole] = useState(api.key() ? sessionStorage.getItem(ROLE) : null);
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
    if (!role) return undefined;
    return api.follow(() => setTick((n) => n + 1));
  }, [role]);
  useEffect(() => {
    const refused = () => { api.forget(); sessionStorage.removeItem(ROLE); setRole(null); };
    addEventListener(api.REFUSED, refused);
    return () => removeEventListener(api.REFUSED, refused);
  }, []);
  if (!role) {
    return html`<${SignIn} onSignedIn=${(r) => { sessionStorage.setItem(ROLE, r); setRole(r); }} />`;
  }
  const signOut = () => { api.forget(); sessionStorage.removeItem(ROLE); setRole(null); };
  const onLanguage = (lang) => { choose(lang); setLang(lang); };
  const found = PAGES.find((p) => p.name === page.name);
  const Page = !found ? Gpus : found.for.includes(role) ? found.page : NotHere;
  return html`<${Header} page=${page.name} role=${role} onSignOut=${signOut} onLanguage=${onLanguage} />
    <main id="main"><${Page} id=${page.id} tick=${tick} role=${role} /></main>`;
}

render(html`<${App} />`, document.getElementById("app"));
