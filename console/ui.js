// What every page of the console shares: templates, answers that follow
// the event stream, a failure shown where it happened.

import { h } from "./vendor/preact.mjs";
import { useEffect, useState } from "./vendor/hooks.mjs";
import htm from "./vendor/htm.mjs";
import * as api from "./api.js";
import { t } from "./i18n.js";

export const html = htm.bind(h);

/// GETs `path` now and again whenever `tick` says a change came.
export function useAnswer(path, tick) {
  const [answer, setAnswer] = useState(null);
  useEffect(() => {
    let live = true;
    api.get(path).then((a) => live && setAnswer(a)).catch(() => live && setAnswer({ status: 0 }));
    return () => { live = false; };
  }, [path, tick]);
  return answer;
}

export function Failed({ answer }) {
  return html`<p class="error" role="alert">${(answer.body && answer.body.detail) || t("unreachable")}</p>`;
}

/// A counter that goes up every `ms`: for what changes without an event
/// (GPU readings).
export function useEvery(ms) {
  const [n, setN] = useState(0);
  useEffect(() => {
    const timer = setInterval(() => setN((x) => x + 1), ms);
    return () => clearInterval(timer);
  }, [ms]);
  return n;
}

export function Loading() {
  return html`<p class="loading">${t("loading")}</p>`;
}
