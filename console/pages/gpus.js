// The GPU catalogue: what may be rented, where, at what price.

import { useEffect, useState } from "../vendor/hooks.mjs";
import * as api from "../api.js";
import { t } from "../i18n.js";
import { Failed, html, useAnswer, useEvery } from "../ui.js";

export function Gpus({ tick }) {
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
