// A tenant's invoices, each downloadable as CSV.

import { useEffect, useState } from "../vendor/hooks.mjs";
import * as api from "../api.js";
import { t } from "../i18n.js";
import { Failed, html, useAnswer, useEvery } from "../ui.js";

export function Invoices({ tick }) {
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
